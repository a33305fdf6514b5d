"""Where the per-stage refinement does not reach: pipelined layouts that win only at an uneven split
but rank below the first STAGE_REFINE_TOP at Megatron's default split (a benchmark, not a test).

The search refines the stage split of its first few plans only (planner.search.refine_stages,
docs/design.md step 5). An independent brute force (2026-11-28, ninth session: its own enumerator
over the model's estimate, each rank's layers spread over its chunks) found that limit costing
3-15 % on four small models with the pipeline size pinned: a small model with a large vocabulary
has a heavy LM head (and embedding), so the best split gives the first and last ranks fewer
layers, and the layouts that gain most from that rank low at the default split. The plans below
are what it found; each is re-estimated here with the exact model and set against what `planner
plan` returns for the same job. Nothing else in the 45 audited jobs (none unpinned) gained.

    PYTHONPATH=. python bench/stage_refine_coverage.py
"""
from __future__ import annotations

from hardware import load_system
from planner.analytical import estimate
from planner.model import load_model
from planner.plan import JobSpec, Plan
from planner.search import plan

COMMON = {"ep": 1, "cp": 1, "recompute": "none", "dp_comm_overlap": True}
# (label, model, system, GPUs, global batch, pins, the audit's plan)
CASES = [
    ("llama3.2-1b --pp 4", "llama3.2-1b", "a100-40g", 8, 64, {"pp": 4},
     dict(COMMON, tp=1, pp=4, dp=1, cp=2, vpp=2, micro_batch=1, zero_stage=1, stage_layers=[1, 1, 1, 1, 1, 5, 5, 1])),
    ("qwen3-1.7b --pp 4", "qwen3-1.7b", "a100-40g", 8, 128, {"pp": 4},
     dict(COMMON, tp=1, pp=4, dp=2, vpp=2, micro_batch=1, zero_stage=1, stage_layers=[3, 5, 5, 1, 3, 5, 5, 1])),
    ("llama3-8b --pp 4", "llama3-8b", "a100-40g", 8, 64, {"pp": 4},
     dict(COMMON, tp=2, pp=4, dp=1, vpp=7, micro_batch=1, zero_stage=2, sequence_parallel=True, tp_comm_overlap=True,
          stage_layers=[1] * 22 + [2, 1, 1, 2, 2, 2])),
    ("qwen3-4b --pp 4", "qwen3-4b", "h100-sxm", 16, 128, {"pp": 4},
     dict(COMMON, tp=1, pp=4, dp=4, vpp=6, micro_batch=2, zero_stage=1,
          stage_layers=[1] * 8 + [2, 2, 2, 1] * 4)),
]


def main() -> None:
    print(f"{'job':22s} {'planner s':>10s} {'audit plan s':>12s} {'gap':>7s}  planner's plan")
    for label, m, s, gpus, batch, pins, fields in CASES:
        model, system = load_model(m), load_system(s, gpus)
        job = JobSpec(global_batch=batch, pins=pins)
        best = plan(model, system, job, top_k=1).best
        theirs = estimate(model, system, Plan(global_batch=batch, **fields), job)
        assert theirs.feasible, label
        print(f"{label:22s} {best.objective:10.4f} {theirs.step_time_s:12.4f} "
              f"{best.objective / theirs.step_time_s - 1:+7.1%}  {best.plan.short()}")


if __name__ == "__main__":
    main()
