"""Every preset model × system: `planner plan`'s best plan (bf16, fp16, and fp8 where the GPU has it)
-> `planner megatron`'s launch -> Megatron-LM's own parser (megatron-core 0.19.2 on CPU) -> back
to a Plan and a model, which must equal the original (issue 11, "Done when").

    python bench/megatron_roundtrip.py [--models a,b] [--systems x,y] [--gpus N] [--batch B]

Prints one line per case and a summary; exit 1 if any launch is refused by Megatron or parses
back to a different plan. Needs the checker's environment (../shared/tools/megatron_check/setup.sh).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hardware import load_system  # noqa: E402
from hardware.load import system_preset_names  # noqa: E402
from planner import megatron as mg  # noqa: E402
from planner.model import load_model, model_preset_names  # noqa: E402
from planner.plan import JobSpec  # noqa: E402
from planner.search import plan as search  # noqa: E402
from tests.megatron_parser import (  # noqa: E402
    canonical,
    dtype_from_megatron,
    find_or_build_parser,
    model_from_megatron,
    model_shape,
    plan_from_megatron,
)

DATA_ARGS = ["--mock-data", "--tokenizer-type", "NullTokenizer", "--train-iters", "10", "--lr", "1e-4"]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default=",".join(model_preset_names()))
    ap.add_argument("--systems", default=",".join(system_preset_names()))
    ap.add_argument("--gpus", type=int, default=None, help="default: each system preset's count")
    ap.add_argument("--batch", type=int, default=1536)
    ap.add_argument("--dtypes", default="bf16,fp16,fp8", help="fp8 only where the GPU has it (sm_90+)")
    args = ap.parse_args()
    cases, labels, t0 = [], [], time.perf_counter()
    for model_name in args.models.split(","):
        model = load_model(model_name)
        for system_name in args.systems.split(","):
            system = load_system(system_name, args.gpus)
            arch = mg.gpu_arch_major(system)
            for dtype in args.dtypes.split(","):
                if arch < mg.expressible.PRECISION_MIN_ARCH[dtype]:
                    continue
                job = JobSpec(global_batch=args.batch, max_global_batch=max(3072, args.batch), dtype=dtype)
                best = search(model, system, job, top_k=1).best
                label = f"{model_name} {system_name} {dtype}"
                if best is None:
                    print(f"{label}: no plan fits (skipped)")
                    continue
                refused = mg.launch_refusals(best.plan, model, job, system)
                if refused:
                    print(f"{label}: REFUSED by planner megatron: {'; '.join(refused)}")
                    continue
                launch = mg.megatron_args(best.plan, model, job, system, save_interval=100)
                cases.append({"argv": launch.argv() + DATA_ARGS, "world_size": launch.world_size,
                              "env": launch.env, "arch": arch})
                labels.append((label, model, best.plan, dtype))
    print(f"{len(cases)} launches built in {time.perf_counter() - t0:.1f} s; parsing with Megatron ...")
    t1 = time.perf_counter()
    results = find_or_build_parser().parse_many(cases) if cases else []
    bad = 0
    for (label, model, plan, dtype), res in zip(labels, results):
        if not res["ok"]:
            verdict = f"MEGATRON REFUSES: {res['error']}"
        else:
            back, back_dtype = plan_from_megatron(res["ns"], res["cfg"], model), dtype_from_megatron(res["ns"])
            built, want = model_shape(model_from_megatron(res["ns"], res["cfg"])), model_shape(model)
            # the same launch either way: an explicit layout equal to the default split reads back as none
            same = back == canonical(plan, model.layers) and back_dtype == dtype and built == want
            diff = [f"{k} {built[k]} != {want[k]}" for k in want if built[k] != want[k]]
            verdict = "ok" if same else f"DIFFERS: {back.short()} {back_dtype} {'; '.join(diff)}"
        bad += verdict != "ok"
        print(f"{label}: {plan.short()}: {verdict}")
    print(f"{len(results) - bad}/{len(results)} launches parse back to their plan and model "
          f"(Megatron parser {time.perf_counter() - t1:.1f} s)")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
