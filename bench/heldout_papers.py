"""Held-out check: training runs published in papers and project reports
(bench/data/paper_runs.yaml: MT-NLG 530B, BLOOM-176B, Nemotron-4 340B and 15B, Llama 3 405B,
DeepSeek-V3, IBM/PyTorch's FSDP benchmarks of Llama-2-shaped models, and Korthikanti et al.'s
full-vs-selective recompute ratio). None is in ../shared/reference and nothing is fitted to them.

Each run pins what its paper states (tp, pp, cp, ep, batch, precision; the era's software where it
predates FlashAttention and sequence parallelism) and lets `planner.plan` choose what the paper
leaves out (micro-batch, virtual stages, recompute, optimizer sharding): the prediction is the
planner's best plan inside the published layout, which is what a tuned run of it should approach.
A published time is compared as is; a published throughput is turned into a step time with the
FLOPs convention the row names, or directly from tokens/s per GPU (see the data file). A row may
name its system as a file under bench/data/systems/ (a cluster whose network the presets do not
describe), extra JobSpec fields (`job`: the kernel stack of a PyTorch run), and plan fields the
search does not choose (`plan_fields`: PyTorch FSDP's dp_impl, its 16-bit gradient reduce).

    PYTHONPATH=. python bench/heldout_papers.py [--json PATH]
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import yaml

from hardware.load import load_system
from planner.analytical.estimate import estimate
from planner.model import ModelSpec, load_model
from planner.plan import JobSpec
from planner.recommend import recommend
from planner.search import plan

DATA = Path(__file__).resolve().parent / "data" / "paper_runs.yaml"
# Software before FlashAttention (mid 2022): Megatron / DeepSpeed overlapped neither TP nor DP
# communication yet (Transformer Engine's TP overlap and Megatron's --overlap-grad-reduce came in
# 2023); before sequence parallelism and selective recompute (Korthikanti et al. 2022) a run
# recomputed every layer in full.
NO_OVERLAP = {"tp_comm_overlap": False, "dp_comm_overlap": False}
ERA_PINS = {"2021": {**NO_OVERLAP, "sequence_parallel": False, "recompute": "full"},
            "2022": NO_OVERLAP}


def load_runs(path: Path = DATA) -> dict:
    return yaml.safe_load(path.read_text())


def run_model(run: dict, inline: dict) -> ModelSpec:
    overrides = {"seq_length": run.get("seq_length")}
    if run["model"] in inline:
        return ModelSpec.model_validate({**inline[run["model"]], **{k: v for k, v in overrides.items() if v}})
    return load_model(run["model"], overrides)


def palm_flops_per_token(params: float, layers: int, hidden: int, seq: int) -> float:
    """6N + 12·L·H·Q·T (Chowdhery et al. 2022, PaLM, App. B; H·Q = the model width)."""
    return 6.0 * params + 12.0 * layers * hidden * seq


def megatron_eq3_flops(gbs: int, seq: int, layers: int, hidden: int, vocab: int) -> float:
    """Hardware FLOPs per step with full recompute: 96·B·s·l·h²·(1 + s/6h + V/16lh)
    (Narayanan et al. SC'21, eq. 3)."""
    return 96.0 * gbs * seq * layers * hidden**2 * (1 + seq / (6 * hidden) + vocab / (16 * layers * hidden))


def measured_step_s(run: dict, model: ModelSpec) -> tuple[float, str]:
    if "step_time_s" in run:
        return float(run["step_time_s"]), "published iteration time"
    tokens = run["global_batch"] * model.seq_length
    if "tokens_per_s_per_gpu" in run:
        return tokens / (run["tokens_per_s_per_gpu"] * run["gpus"]), "global batch x seq / (tokens/s per GPU x GPUs)"
    if "gpu_hours_per_trillion_tokens" in run:
        return (tokens * run["gpu_hours_per_trillion_tokens"] * 3600.0 / 1e12 / run["gpus"],
                "tokens x GPU-hours per trillion tokens / GPUs")
    flops = tokens * palm_flops_per_token(405e9, model.layers, model.hidden, model.seq_length)
    return flops / (run["published_tflops_per_gpu"] * 1e12 * run["gpus"]), "PaLM-convention FLOPs / TFLOP/s"


def job_of(run: dict, pins: dict) -> JobSpec:
    return JobSpec(global_batch=run["global_batch"], max_global_batch=max(3072, run["global_batch"]),
                   dtype=run["dtype"], adam_moments=run.get("adam_moments", "fp32"), pins=pins,
                   moe_dispatcher=run.get("moe_dispatcher", "alltoall"), flash_attention=not run.get("era"),
                   **run.get("job", {}))


def system_of(run: dict):
    """The run's system: a preset name, or a system file next to the data file (bench/data/systems/)."""
    ref = run["system"]
    return load_system(str(DATA.parent / ref) if ref.endswith(".yaml") else ref, run["gpus"])


def recommended(run: dict, model: ModelSpec):
    """What `planner plan` recommends for the job with only the era's software pinned (the claim
    bar: a recommendation predicted more than 15 % faster than the measured run is a claim)."""
    system = system_of(run)
    return recommend(model, system, job_of(run, dict(ERA_PINS.get(str(run.get("era", "")), {}))), top_k=1,
                     offload_gain=False).best


def best_in_layout(run: dict, model: ModelSpec, extra_pins: dict | None = None):
    """The estimate of the planner's fastest plan inside the run's published layout (None if none fits)."""
    system = system_of(run)
    pins = {**run.get("pinned", {}), **ERA_PINS.get(str(run.get("era", "")), {}), **(extra_pins or {})}
    job = job_of(run, pins)
    restrict = {"vpp": lambda v: v > 1} if run.get("interleaved") else None
    best = plan(model, system, job, top_k=1, restrict=restrict).best
    if best is None:
        return None
    # plan fields the search does not choose, as the run states them (a PyTorch FSDP run's
    # dp_impl, its 16-bit gradient reduce): set on the best plan inside the layout and re-costed
    update = dict(run.get("plan_fields", {}))
    if best.plan.recompute == "full" and (run.get("era") or run.get("recompute_every_layer")):
        # before Korthikanti et al. 2022, full recompute meant every layer (Megatron
        # --checkpoint-activations, DeepSpeed activation checkpointing), as a run that says it
        # checkpoints every block does: the search may keep some
        update.update(recompute_num_layers=None, stage_recompute_layers=None)
    if not update:
        return best.estimate
    return estimate(model, system, best.plan.model_copy(update=update), job)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path, help="write the rows here")
    ap.add_argument("--free", action="store_true",
                    help="also run `planner plan` on each job with no layout pinned (the 15 %% claim bar)")
    args = ap.parse_args()
    data = load_runs()
    inline = data.get("models", {})
    rows = []
    print(f"{'run':32s} {'measured s':>10s} {'predicted s':>11s} {'error':>7s}  plan chosen inside the published layout")
    for run in data["runs"]:
        model = run_model(run, inline)
        measured, how = measured_step_s(run, model)
        best = best_in_layout(run, model)
        if best is None:
            print(f"{run['id']:32s} {measured:10.2f} {'no fit':>11s}")
            rows.append({"id": run["id"], "measured_s": measured, "predicted_s": None, "how": how})
            continue
        pred = best.step_time_s
        err = pred / measured - 1.0
        note = " (convention-sensitive)" if run.get("convention_sensitive") else \
            f" (not expressible: {run['not_expressible']})" if run.get("not_expressible") else ""
        print(f"{run['id']:32s} {measured:10.2f} {pred:11.2f} {err:+7.1%}  {best.plan.short()}{note}")
        if args.free:
            rec = recommended(run, model)
            print(f"{'':32s} {'':10s} {rec.estimate.step_time_s:11.2f} {rec.estimate.step_time_s / measured:6.2f}x  "
                  f"planner plan, no layout pinned: {rec.plan.short()}")
        rows.append({"id": run["id"], "measured_s": measured, "predicted_s": pred, "error": err, "how": how,
                     "plan": best.plan.short(), "framework": run.get("framework"),
                     "excluded": bool(run.get("convention_sensitive") or run.get("not_expressible"))})
    for ratio in data.get("ratios", []):
        model = run_model(ratio, inline)
        num = best_in_layout(ratio, model, ratio["numerator"])
        den = best_in_layout(ratio, model, ratio["denominator"])
        measured = ratio["published_mfu_denominator"] / ratio["published_mfu_numerator"]
        pred = num.step_time_s / den.step_time_s
        print(f"{ratio['id']:32s} {measured:10.3f} {pred:11.3f} {pred / measured - 1:+7.1%}  "
              f"{num.plan.short()}  /  {den.plan.short()}")
        rows.append({"id": ratio["id"], "measured_ratio": measured, "predicted_ratio": pred,
                     "error": pred / measured - 1.0})
    timed = [r for r in rows if r.get("predicted_s")]
    kept = [r for r in timed if not r["excluded"]]
    for label, group in (("all step-time rows", timed), ("without the 128K, DualPipe and HSDP rows", kept)):
        print(f"{label}: mean |error| {statistics.mean(abs(r['error']) for r in group):.1%} over {len(group)}, "
              f"signed mean {statistics.mean(r['error'] for r in group):+.1%}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
