"""Throughput of the vectorised exact model: plans per second on one core.

    OMP_NUM_THREADS=1 python bench/estimate_speed.py [--plans 200000]

Goal (issue 2): >= 100,000 plans/s.
"""
from __future__ import annotations

import argparse
import os
import time

import numpy as np

from hardware import load_system
from planner.analytical import PlanArrays, estimate_many
from planner.analytical.layer_kinds import lead_layers
from planner.model import load_model
from planner.plan import JobSpec


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--plans", type=int, default=200_000)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    n = args.plans
    for preset, system in (("gpt3-175b", "a100-80g"), ("llama3-70b", "h100-offload-1tib"), ("mixtral-8x7b", "gh200")):
        model, sysm = load_model(preset), load_system(system, 4096)
        pick = lambda *v: rng.choice(v, n)  # noqa: E731
        dp = pick(1, 2, 4, 8, 16, 32)
        mb = pick(1, 2, 4)
        cols = dict(tp=pick(1, 2, 4, 8), pp=pick(1, 2, 4, 8, 16), dp=dp, cp=pick(1, 2), micro_batch=mb,
                    global_batch=mb * dp * pick(8, 16, 32), vpp=pick(1, 2, 3), sequence_parallel=pick(0, 1),
                    recompute=pick(0, 1, 2), zero_stage=pick(0, 1, 3), offload_optimizer=pick(0.0, 0.5, 1.0),
                    offload_activations=pick(0.0, 0.5), tp_comm_overlap=pick(0, 1))
        P = PlanArrays.from_columns(n, model.layers, lead_layers(model), **cols)
        best = float("inf")
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            estimate_many(model, sysm, JobSpec(), P)
            best = min(best, time.perf_counter() - t0)
        print(f"{preset:14s} on {system:18s}: {n:,} plans in {best:.3f} s = {n / best:,.0f} plans/s "
              f"(OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')})")


if __name__ == "__main__":
    main()
