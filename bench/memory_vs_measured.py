"""Predicted peak HBM per GPU against the memory the published runs report.

    PYTHONPATH=. python bench/memory_vs_measured.py

Only fsdp_moe_runs.yaml records carry a measured memory (`measured.memory_gib`: torchtitan's
tables and community runs, "max over ranks"). What they measure is the PyTorch caching allocator's
peak (reserved, on some rows stated as such), which includes fragmentation and cached blocks the
model does not count, and runs tuned to the longest sequence that fits report close to the whole
HBM. Two sources disagree by 60 % on the same configuration (Llama-3 8B, FSDP, micro-batch 2,
selective AC, compile, Float8: 77 GiB on 8 GPUs in torchtitan's table, 48 GiB on 32 GPUs in a
community run). So this is a check of the memory model's order of magnitude on torch stacks, not a
calibration: nothing is fitted to it. The Megatron memory model itself is checked against
Korthikanti et al. 2022 (tests/test_memory*.py).
"""
from __future__ import annotations

import statistics

import yaml

from hardware.spec import GIB
from planner.analytical import estimate
from planner.calibration import load_reference
from planner.reference import REFERENCE_DIR


def measured_memory_gib() -> dict[str, float]:
    doc = yaml.safe_load((REFERENCE_DIR / "fsdp_moe_runs.yaml").read_text())
    return {r["id"]: float(r["measured"]["memory_gib"]) for r in doc["records"]
            if (r.get("measured") or {}).get("memory_gib") is not None}


def rows() -> list[tuple]:
    measured = measured_memory_gib()
    cases, _ = load_reference()
    out = []
    for c in cases:
        if c.id in measured:
            e = estimate(c.model, c.system, c.plan, c.job)
            out.append((c, measured[c.id], e.hbm_bytes / GIB, e.hbm_capacity_bytes / GIB))
    return out


def main() -> None:
    errs = []
    for c, meas, pred, cap in rows():
        err = pred / meas - 1
        errs.append(err)
        print(f"{c.id[:66]:66s} {c.plan.short()[:42]:42s} measured {meas:6.1f} predicted {pred:6.1f} "
              f"GiB ({err:+6.1%}; HBM usable {cap:.0f})")
    print(f"{len(errs)} rows: mean |err| {statistics.mean(map(abs, errs)):.1%}, mean {statistics.mean(errs):+.1%}, "
          f"{sum(e < 0 for e in errs)} predicted below the measurement")


if __name__ == "__main__":
    main()
