"""Fit the few compute-efficiency parameters of each accelerator to the published runs.

    python bench/calibrate.py [--reference PATH ...] [--write]

The fit itself is planner/fit.py (also used by `planner validate --lofo`): per fit group, mean
|log(predicted/measured)| step time over the Megatron-stack rows, coordinate descent over named
physical parameters within physical bounds, no per-row factors. `--write` stores the result in
hardware/presets/accelerators/<name>.yaml for every accelerator of the group; the accuracy
table is `planner validate`.
"""
from __future__ import annotations

import argparse
import re
import time
from pathlib import Path

from hardware.load import load_accelerator
from planner import fit
from planner.calibration import load_reference

# Fit group -> preset files that take its parameters (the first is the group's own accelerator).
ACCELERATOR_FILES = {"A100-SXM4-80GB": ["a100-sxm4-80gb", "a100-sxm4-40gb", "a800-sxm4-80gb"],
                     "H100-SXM5-80GB": ["h100-sxm5-80gb", "h200-141gb", "gh200-96gb", "h100-gt-96gb",
                                        "h800-sxm5-80gb"],
                     "B200-180GB": ["b200-180gb", "b300-288gb"],
                     "GB200-186GB": ["gb200-186gb", "gb300-288gb"],
                     "V100-SXM3-32GB": ["v100-sxm3-32gb"]}
INTEGER_PARAMS = ("matmul_half_dim", "matmul_half_dim_fp8", "attention_half_seq", "attention_half_seq_fa2",
                  "layer_overhead_us")



# Fields each preset keeps as its own (measured or fitted per accelerator, not per fit group).
PER_ACCELERATOR = ("attention_max_fa2", "attention_half_seq_fa2", "attention_max_triton", "sustained_clock_fraction",
                  "compute_rate_vs_fit_group", "matmul_max_torch")


def write(group: str, params: dict, torch_stack: dict[str, dict]) -> None:
    """The group's fitted parameters into every preset of the group; each preset keeps its own
    PER_ACCELERATOR fields, updated with what the torch-stack fit gave for that accelerator."""
    current = load_accelerator(ACCELERATOR_FILES[group][0]).efficiency.model_dump(exclude_none=True)
    shared = {k: v for k, v in {**current, **params}.items() if k not in PER_ACCELERATOR}
    for stem in ACCELERATOR_FILES[group]:
        acc = load_accelerator(stem)
        own = {k: v for k, v in acc.efficiency.model_dump(exclude_none=True).items() if k in PER_ACCELERATOR}
        own.update(torch_stack.get(acc.name, {}))
        for default_one in ("sustained_clock_fraction", "compute_rate_vs_fit_group"):
            if own.get(default_one) == 1.0:
                del own[default_one]  # the default: no power cap, the fit group's own rate
        merged = {**shared, **own}
        inner = ", ".join(f"{k}: {round(v) if k in INTEGER_PARAMS else round(v, 3)}" for k, v in merged.items())
        path = Path(__file__).resolve().parents[1] / "hardware/presets/accelerators" / f"{stem}.yaml"
        text = re.sub(r"^efficiency: \{.*\}$", f"efficiency: {{{inner}}}", path.read_text(), flags=re.M)
        path.write_text(text)
        print(f"wrote {path}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reference", nargs="*", default=None, help="reference YAML files (default: the packaged three)")
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    cases, _ = load_reference(args.reference or None)
    t0 = time.perf_counter()
    prepared = fit.prepare(cases)
    groups = fit.fit_groups(prepared)
    hardware = {g: v[0] for g, v in groups.items()}
    # then the PyTorch-native stacks' own parameters, on their rows, on top of the hardware fit
    torch_stack = fit.fit_torch_stack(prepared, hardware)
    for group, (params, score, n) in groups.items():
        shown = {k: round(v, 3) for k, v in params.items()}
        print(f"{group}: {n} rows, mean |log err| {score:.4f}: {shown}")
        if args.write and params:
            write(group, params, torch_stack)
    print("torch stacks (torchtitan, llm-foundry rows):",
          {acc: {k: round(v, 3) for k, v in p.items()} for acc, p in torch_stack.items()})
    print(f"fitted in {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
