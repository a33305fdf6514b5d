"""Fit the kernel-efficiency curves to tables measured on a GPU (bench/gpu/*.py -> planner/data/).

    python bench/kernel_fit.py planner/data/h100_gemm.csv planner/data/h100_attention.csv
    python bench/kernel_fit.py --moe planner/data/h100_grouped_gemm.csv planner/data/h100_moe_kernels.csv

Model (hardware/spec.py ComputeEfficiency): time = 2mnk / (peak · e_max · d/(d + d_half)) + 5 µs launch,
d = min(m, n, k). Grid search on mean |log(predicted/measured)|. The half-efficiency dimension
d_half is a property of the GEMM kernels and goes into the accelerator preset as measured;
e_max is printed for comparison only (the in-training ceiling is fitted end to end by
bench/calibrate.py, since training loses more than a lone GEMM does).

Attention (cuDNN fused attention, as Transformer Engine uses; head_dim 128): the planner's
equivalent throughput 3·(causal forward FLOPs)/t(fwd+bwd) follows attention_max · s/(s + s_half).
The same curve for PyTorch's flash backend (FlashAttention-2, what torchtitan and llm-foundry run)
is the reference of planner/fit.py's FlashAttention-2 fit.

MoE (--moe, tables of bench/gpu/moe_kernels_table.py): the same curve fitted to the routed
experts' grouped GEMM (torch._grouped_mm, one kernel for all local experts: what torchtitan runs),
and the planner's per-expert form for one GEMM launched per expert (what Transformer Engine's
GroupedLinear runs): time = max(GPU time on the curve, experts x host_us), fitted for e_max and
host_us with the GEMM table's half dims, against the host time measured directly. The router and
permutation rows are compared with the bytes planner.analytical.time counts for them.
"""
from __future__ import annotations

import csv
import sys

import numpy as np

PEAK_FLOPS = {"bf16": 989.4e12, "fp8": 1978.9e12}  # H100 SXM datasheet, dense


# Products shorter than this are dominated by launch and event-timing overhead, which the
# planner models separately (layer_overhead_us); the curve is fitted on the rest.
MIN_TIME_MS = 0.1
LAUNCH_S = 5e-6


def fit(rows: list[dict], dtype: str) -> tuple[float, float, float, float]:
    sel = [r for r in rows if r["dtype"] == dtype and float(r["median_ms"]) >= MIN_TIME_MS]
    m, n, k = (np.array([float(r[c]) for r in sel]) for c in ("m", "n", "k"))
    t = np.array([float(r["median_ms"]) for r in sel]) * 1e-3
    flops, d = 2 * m * n * k, np.minimum(np.minimum(m, n), k)
    best = (np.inf, 0.0, 0.0, 0.0)
    for e in np.arange(0.50, 0.90, 0.005):
        for half in np.arange(0, 1000, 10):
            for launch in (LAUNCH_S,):
                pred = flops / (PEAK_FLOPS[dtype] * e * d / (d + half)) + launch
                err = float(np.mean(np.abs(np.log(pred / t))))
                if err < best[0]:
                    best = (err, float(e), float(half), float(launch))
    return best


def fit_attention(rows: list[dict], peak: float = PEAK_FLOPS["bf16"], backend: str = "cudnn") -> tuple[float, float, float]:
    """(mean |log error|, ceiling, half-efficiency sequence) of one backend's rows: "cudnn" (what
    Transformer Engine runs) or "flash" (PyTorch SDPA's FlashAttention-2, what the torch stacks run)."""
    sel = [r for r in rows if r["backend"] == backend and r["head_dim"] == "128"]
    s = np.array([float(r["seq"]) for r in sel])
    eff = np.array([float(r["planner_equiv_tflops"]) for r in sel]) * 1e12 / peak
    best = (np.inf, 0.0, 0.0)
    for a in np.arange(0.2, 0.9, 0.002):
        for half in np.arange(0, 8000, 10):
            err = float(np.mean(np.abs(np.log(a * s / (s + half) / eff))))
            if err < best[0]:
                best = (err, float(a), float(half))
    return best


def expert_arrays(rows: list[dict], variant: str):
    """(experts, rows per expert, n, k, measured s) of one variant of the grouped-GEMM table."""
    sel = [r for r in rows if r["variant"] == variant and r["median_ms"]]
    E, R, n, k = (np.array([float(r[c]) for r in sel]) for c in ("experts", "rows_per_expert", "n", "k"))
    return E, R, n, k, np.array([float(r["median_ms"]) for r in sel]) * 1e-3


def fit_expert_loop(rows: list[dict], variant: str, dtype: str, half: float) -> tuple[float, float, float]:
    """(mean |log error|, e_max, host us per GEMM) of time = max(curve, experts x host)."""
    E, R, n, k, t = expert_arrays(rows, variant)
    curve = 2 * E * R * n * k / (PEAK_FLOPS[dtype] * np.minimum(np.minimum(R, n), k)
                                 / (np.minimum(np.minimum(R, n), k) + half))
    e = np.arange(0.40, 0.95, 0.005)[:, None, None]
    host = np.arange(0.0, 150.0, 1.0)[None, :, None]
    err = np.mean(np.abs(np.log(np.maximum(curve / e, E * host * 1e-6) / t)), axis=-1)
    i, j = np.unravel_index(np.argmin(err), err.shape)
    return float(err[i, j]), float(e[i, 0, 0]), float(host[0, j, 0])


def moe_main(grouped_csv: str, kernels_csv: str) -> None:
    rows = list(csv.DictReader(open(grouped_csv)))
    for variant, dtype, mult in (("grouped", "bf16", 1), ("grouped_fwd_bwd", "bf16", 3), ("grouped_fp8", "fp8", 1)):
        E, R, n, k, t = expert_arrays(rows, variant)
        t = t / mult  # forward + backward: 3x the forward FLOPs
        d = np.minimum(np.minimum(R, n), k)  # the curve's d: the per-expert smallest dimension
        best = (np.inf, 0.0, 0.0)
        for e in np.arange(0.4, 0.95, 0.005):
            for half in np.arange(0, 1500, 10):
                err = float(np.mean(np.abs(np.log((2 * E * R * n * k / (PEAK_FLOPS[dtype] * e * d / (d + half)) + LAUNCH_S) / t))))
                if err < best[0]:
                    best = (err, float(e), float(half))
        print(f"{variant} ({dtype}, one kernel for all experts): e_max {best[1]:.3f}, half-efficiency rows "
              f"{best[2]:.0f} (mean |log error| {best[0]:.3f}, {len(t)} shapes)")
    for variant, dtype, half in (("loop", "bf16", 140.0), ("loop_fp8", "fp8", 170.0), ("loop_fp8_quant", "fp8", 170.0)):
        err, e, host = fit_expert_loop(rows, variant, dtype, half)
        measured = np.array([float(r["host_us_per_gemm"]) for r in rows if r["variant"] == variant and r["host_us_per_gemm"]])
        p10, p50, p90 = np.percentile(measured, (10, 50, 90))
        print(f"{variant} (one GEMM per expert, half dim {half:.0f}): e_max {e:.3f}, host {host:.0f} us per GEMM "
              f"(mean |log error| {err:.3f}); host issue time measured directly: median {p50:.0f} us, "
              f"p10-p90 {p10:.0f}-{p90:.0f}")
    krows = list(csv.DictReader(open(kernels_csv)))
    for kernel in ("router_softmax_topk", "permute", "unpermute"):
        rates = np.array([float(r["rate"]) for r in krows if r["kernel"] == kernel and r["rate"]])
        print(f"{kernel}: {rates.min():.0f}-{rates.max():.0f} GB/s over the bytes the planner counts "
              f"(median {np.median(rates):.0f})")


def main() -> None:
    if sys.argv[1] == "--moe":
        moe_main(sys.argv[2], sys.argv[3])
        return
    if len(sys.argv) > 2:
        attention_rows = list(csv.DictReader(open(sys.argv[2])))
        err, a, half = fit_attention(attention_rows)
        print(f"attention: attention_max {a:.3f}, attention_half_seq {half:.0f} (mean |log error| {err:.3f})")
        err, a, half = fit_attention(attention_rows, backend="flash")
        print(f"FlashAttention-2 (lone kernel): {a:.3f}, half-efficiency sequence {half:.0f} "
              f"(mean |log error| {err:.3f}); planner/fit.py FA2_MEASURED_H100, FA2_HALF_SEQ_MEASURED")
    rows = list(csv.DictReader(open(sys.argv[1])))
    for dtype in ("bf16", "fp8"):
        err, e, half, launch = fit(rows, dtype)
        print(f"{dtype}: e_max {e:.3f}, half-efficiency dim {half:.0f}, launch {launch * 1e6:.1f} us "
              f"(mean |log error| {err:.3f} over the shapes taking >= {MIN_TIME_MS} ms)")


if __name__ == "__main__":
    main()
