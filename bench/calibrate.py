"""Fit the few compute-efficiency parameters of each accelerator to the published runs.

    python bench/calibrate.py [--reference PATH] [--write]

Minimises the mean |log(predicted/measured)| step time over the reference rows of each
accelerator by coordinate descent (golden-section per parameter, a few sweeps). Only physical
parameters are fitted (GEMM ceiling bf16/fp8, GEMM half-efficiency dimension, attention-kernel
ceiling, HBM efficiency of element-wise work); no per-row factors. `--write` stores the result
in hardware/presets/accelerators/<name>.yaml; the accuracy table is `planner validate`.
"""
from __future__ import annotations

import argparse
import math
import re
import time
from pathlib import Path

from hardware.load import load_accelerator
from planner.calibration import DEFAULT_REFERENCE, accuracy_rows, load_reference, log_error

BOUNDS = {"matmul_max": (0.4, 0.98), "matmul_max_fp8": (0.2, 0.98), "matmul_half_dim": (0.0, 1024.0),
          "attention_max": (0.15, 0.95), "hbm_efficiency": (0.2, 1.0), "layer_overhead_us": (0.0, 2000.0)}
# Accelerator fitted -> preset files that take its parameters (H200 and GH200 share H100's SM).
ACCELERATOR_FILES = {"A100-SXM4-80GB": ["a100-sxm4-80gb"],
                     "H100-SXM5-80GB": ["h100-sxm5-80gb", "h200-141gb", "gh200-96gb", "b200-180gb"]}


def objective(cases, system, params) -> float:
    acc = system.accelerator
    eff = acc.efficiency.model_copy(update=params)
    trial = system.model_copy(update={"accelerator": acc.model_copy(update={"efficiency": eff})})
    return log_error(accuracy_rows(cases, {acc.name: trial}))


def golden(f, lo, hi, x0, iters=14):
    g = (math.sqrt(5) - 1) / 2
    a, b = lo, hi
    c, d = b - g * (b - a), a + g * (b - a)
    fc, fd = f(c), f(d)
    for _ in range(iters):
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - g * (b - a)
            fc = f(c)
        else:
            a, c, fc = c, d, fd
            d = a + g * (b - a)
            fd = f(d)
    best = c if fc < fd else d
    return (best, min(fc, fd)) if min(fc, fd) < f(x0) else (x0, f(x0))


# Kernel parameters measured on the GPU itself (bench/gpu/*.py -> bench/kernel_fit.py) are kept;
# only the in-training GEMM ceilings, element-wise efficiency and overheads are fitted end to end.
MEASURED = {"H100-SXM5-80GB": ("matmul_half_dim", "matmul_half_dim_fp8", "attention_max", "attention_half_seq")}


def fit(cases, sweeps=3):
    system = cases[0].system
    fixed = MEASURED.get(system.accelerator.name, ())
    names = [n for n in BOUNDS if n not in fixed
             and (n != "matmul_max_fp8" or any(c.job.dtype == "fp8" for c in cases))]
    params = {n: getattr(system.accelerator.efficiency, n) or 0.5 for n in names}
    for _ in range(sweeps):
        for n in names:
            def f(x, n=n):
                return objective(cases, system, {**params, n: x})
            params[n], score = golden(f, *BOUNDS[n], params[n])
        print(f"  sweep: {score:.4f} {params}")
    return params, score


def write(accel_name: str, params: dict) -> None:
    current = load_accelerator(ACCELERATOR_FILES[accel_name][0]).efficiency.model_dump(exclude_none=True)
    params = {**current, **params}
    inner = ", ".join(f"{k}: {round(v, 3) if k not in ('matmul_half_dim', 'matmul_half_dim_fp8', 'attention_half_seq', 'layer_overhead_us') else round(v)}"
                      for k, v in params.items())
    for stem in ACCELERATOR_FILES[accel_name]:
        path = Path(__file__).resolve().parents[1] / "hardware/presets/accelerators" / f"{stem}.yaml"
        text = re.sub(r"^efficiency: \{.*\}$", f"efficiency: {{{inner}}}", path.read_text(), flags=re.M)
        path.write_text(text)
        print(f"wrote {path}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reference", default=str(DEFAULT_REFERENCE))
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    cases, _ = load_reference(args.reference)
    for accel in ACCELERATOR_FILES:
        group = [c for c in cases if c.system.accelerator.name == accel and c.fit]
        t0 = time.perf_counter()
        params, score = fit(group)
        print(f"{accel}: {len(group)} rows, mean |log err| {score:.4f} in {time.perf_counter() - t0:.0f} s")
        if args.write:
            write(accel, params)


if __name__ == "__main__":
    main()
