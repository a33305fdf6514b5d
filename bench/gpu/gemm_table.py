"""Measure GEMM throughput on the local GPU for the shapes transformer layers produce.

    python3 bench/gpu/gemm_table.py OUT.csv

Run on a GPU machine (it needs PyTorch with CUDA). For each (M, N, K) and dtype (bf16 through
torch.matmul, fp8 e4m3 through torch._scaled_mm with per-tensor scales) it times the median of
repeated products with CUDA events after a warm-up, on random data, rotating between input
sets larger than L2 so that the cache is not measured. Writes one CSV row per measurement.
The planner uses the table (planner/data/) to set the shape of its GEMM-efficiency curve.
"""
from __future__ import annotations

import csv
import statistics
import sys

import torch

M_VALUES = (1024, 2048, 4096, 8192, 16384)
N_VALUES = (128, 256, 512, 1024, 2048, 3072, 4096, 6144, 8192, 12288, 16384)
K_VALUES = (1024, 2048, 4096, 8192, 16384)
REPEATS = 15


def time_ms(fn, sets) -> float:
    for i in range(3):
        fn(*sets[i % len(sets)])
    torch.cuda.synchronize()
    times = []
    for r in range(REPEATS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        args = sets[r % len(sets)]
        start.record()
        fn(*args)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def inputs(m, n, k, dtype, count):
    sets = []
    for _ in range(count):
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        if dtype == "fp8":
            a, b = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn)
        sets.append((a, b))
    return sets


def main() -> None:
    out = sys.argv[1]
    props = torch.cuda.get_device_properties(0)
    one = torch.ones((), device="cuda", dtype=torch.float32)
    ops = {
        "bf16": lambda a, b: torch.matmul(a, b.t()),
        "fp8": lambda a, b: torch._scaled_mm(a, b.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16),
    }
    rows = []
    for dtype, op in ops.items():
        for m in M_VALUES:
            for n in N_VALUES:
                for k in K_VALUES:
                    bytes_per_set = (m * k + n * k) * (1 if dtype == "fp8" else 2)
                    count = max(2, min(8, int(200e6 // bytes_per_set) + 1))
                    sets = inputs(m, n, k, dtype, count)
                    ms = time_ms(op, sets)
                    tflops = 2 * m * n * k / (ms * 1e-3) / 1e12
                    rows.append({"gpu": props.name, "dtype": dtype, "m": m, "n": n, "k": k,
                                 "median_ms": round(ms, 5), "tflops": round(tflops, 1)})
                    del sets
        torch.cuda.empty_cache()
    with open(out, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    for dtype in ops:
        best = max(r["tflops"] for r in rows if r["dtype"] == dtype)
        print(f"{dtype}: {len([r for r in rows if r['dtype'] == dtype])} shapes, best {best} TFLOP/s")


if __name__ == "__main__":
    main()
