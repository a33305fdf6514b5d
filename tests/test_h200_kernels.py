"""Kernels measured on an H200 (planner/data/h200_*.csv, 2026-11-28; bench/gpu/gemm_table.py,
kernels_table.py, float8_block_table.py) against what the planner assumes of that GPU: the H100's
compute with 4.8 TB/s of HBM (hardware/presets/accelerators/h200-141gb.yaml), and against the
planner's float8 costing of torchtitan's block (the Trainy H200 runs' recipe)."""
import csv
import statistics
from pathlib import Path

import pytest

from hardware import load_system
from hardware.load import load_accelerator
from planner.analytical import PlanArrays
from planner.analytical import time as tm
from planner.model import load_model
from planner.plan import JobSpec, Plan

DATA = Path(__file__).resolve().parents[1] / "planner" / "data"


def _rows(name):
    return list(csv.DictReader(open(DATA / name)))


def _by(rows, keys, value):
    return {tuple(r[k] for k in keys): float(r[value]) for r in rows}


@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
def test_h200_gemms_run_at_the_h100s_rate(dtype):
    """Same SM, same clock, same power limit: on the compute-bound shapes (every dimension
    >= 4096) the H200's GEMMs run within 7 % of the H100's, shape by shape at the median (the
    H200 hit its 700 W cap there, h200_power_clock_log.csv). The small, memory-bound shapes run
    faster (more HBM bandwidth), which the planner's GEMM curve does not model (the H200 preset
    takes the H100's curve)."""
    keys = ("dtype", "m", "n", "k")
    h100, h200 = _by(_rows("h100_gemm.csv"), keys, "tflops"), _by(_rows("h200_gemm.csv"), keys, "tflops")
    big = [h200[k] / h100[k] for k in h200 if k[0] == dtype and k in h100 and min(map(int, k[1:])) >= 4096]
    assert len(big) >= 30
    assert 0.93 <= statistics.median(big) <= 1.07, statistics.median(big)


@pytest.mark.parametrize("backend", ["flash", "cudnn"])
def test_h200_attention_runs_at_the_h100s_rate(backend):
    """Causal SDPA forward+backward, FlashAttention-2 and cuDNN, at the same shapes: the H200 is
    within 12 % of the H100 at every shape (median 1.03 and 1.04x, at most 1.11x), as the
    preset assumes."""
    keys = ("backend", "seq", "heads", "head_dim", "batch")
    h100 = _by(_rows("h100_attention.csv"), keys, "fwd_bwd_ms")
    h200 = _by(_rows("h200_attention.csv"), keys, "fwd_bwd_ms")
    speedups = [h100[k] / h200[k] for k in h200 if k[0] == backend and k in h100]
    assert len(speedups) == 18
    assert all(0.95 <= s <= 1.12 for s in speedups), speedups


def test_h200_streaming_kernels_scale_with_the_datasheet_bandwidth():
    """A residual add streams (2 reads, 1 write, nothing to compute): the H200 moves 1.42-1.45x
    the H100's bytes per second at the same shapes, the datasheets' 4.8 / 3.35 TB/s = 1.43 within
    6 %, so the preset's HBM efficiency (a fraction of the datasheet rate) carries over."""
    keys = ("kernel", "tokens", "hidden")
    h100 = _by(_rows("h100_elementwise.csv"), keys, "achieved_gb_per_s")
    h200 = _by(_rows("h200_elementwise.csv"), keys, "achieved_gb_per_s")
    datasheet = (load_accelerator("h200-141gb").hbm_bandwidth_gb_per_s
                 / load_accelerator("h100-sxm5-80gb").hbm_bandwidth_gb_per_s)
    ratios = [h200[k] / h100[k] for k in h200 if k[0] == "residual_add"]
    assert len(ratios) == 4
    assert all(abs(r / datasheet - 1) <= 0.06 for r in ratios), (ratios, datasheet)


def _float8_block_ms(dtype, op):
    (row,) = [r for r in _rows("h200_float8_block.csv") if (r["dtype"], r["op"]) == (dtype, op)]
    return float(row["median_ms"])


def _planner_layer_s(dtype):
    """The planner's forward+backward compute of one Llama-3 8B layer on one H200, torchtitan's
    compiled kernels, local batch 2 at seq 8192 (the Trainy rows' shape), no recompute."""
    model, system = load_model("llama3-8b"), load_system("h200", 8)
    job = JobSpec(global_batch=16, kernels="torch-compile", dtype=dtype)
    P = PlanArrays.from_plans([Plan(tp=1, dp=8, micro_batch=2, global_batch=16)], model.layers, 0)
    layer = tm.layer_compute_fwd_s(model, system, job, P)
    return float((1 + tm.BACKWARD_FACTOR) * (layer["gemm"] + layer["attention"] + layer["elementwise"])[0])


def test_float8_speedup_of_the_compiled_block_is_what_the_planner_costs():
    """torchao's tensorwise float8 (dynamic per-tensor scales, three _scaled_mm per linear, casts
    fused by torch.compile) takes the compiled 8B block from 47.7 to 37.2 ms on an H200 (0.78x).
    The planner's fp8-cs layer under torch.compile over its bf16 layer: the same ratio within
    0.03 (0.780 both: the fp8 GEMMs' saving less the casts' streaming at 4 bytes per element,
    kernels.quantise_bytes_per_element). The casts left out the ratio is 0.753; costed at
    Transformer Engine's unfused 6 bytes, 0.793. (Uncompiled, the same casts run as six separate
    kernels each: the eager float8 block, 74.4 ms, is slower than the eager bf16 one.)"""
    measured = _float8_block_ms("float8", "compiled_none") / _float8_block_ms("bf16", "compiled_none")
    planned = _planner_layer_s("fp8-cs") / _planner_layer_s("bf16")
    assert abs(planned - measured) <= 0.03, (planned, measured)


@pytest.mark.parametrize("dtype,measured_dtype", [("bf16", "bf16"), ("fp8-cs", "float8")])
def test_planner_layer_is_no_faster_than_the_block_measured_alone(dtype, measured_dtype):
    """An in-training layer cannot beat the same block alone on the same GPU. The planner's
    compiled layer is 1.24x the lone block in both precisions: its FlashAttention-2 in-training
    ceiling (fitted on the torch and TE-with-flash-attn rows) is 1.7x the lone kernel's time
    here, its GEMMs 1.1x, its element-wise costs about equal. That 24 % is most of the Trainy
    H200 runs' +20 % (their FA2 kernels run near the lone rate); what the fit would need to
    tell that apart is in README 'What is left'."""
    ratio = _planner_layer_s(dtype) / (_float8_block_ms(measured_dtype, "compiled_none") * 1e-3)
    assert 1.0 <= ratio <= 1.35, ratio


def _blocks_touched(seq: int, window: int | None, block: int = 128) -> float:
    """Share of the (seq/block)² key/query blocks a causal mask, or a causal window of `window`
    tokens (a multiple of the block), touches: query block i reaches blocks i - window/block .. i."""
    n = seq // block
    reach = n if window is None else window // block + 1
    return sum(min(i + 1, reach) for i in range(n)) / n**2


def test_sliding_window_block_density_is_the_blocks_the_window_touches():
    """flex_attention's block mask (h200_sliding_window.csv) against the hand count: causal
    n(n+1)/2 of n² blocks, a 128-token window 2n - 1, a 1024-token window 9 per query block."""
    rows = [r for r in _rows("h200_sliding_window.csv") if r["kernel"] == "flex_attention"]
    assert len(rows) == 6
    for r in rows:
        window = None if r["mask"] == "causal" else int(r["mask"].removeprefix("window"))
        assert float(r["block_density"]) == pytest.approx(_blocks_touched(int(r["seq"]), window), abs=1e-4), r


def test_sliding_window_time_follows_the_blocks_with_a_per_block_overhead():
    """A window's forward+backward over the causal one's lies between its block-density ratio
    and 2.1x it (0.235x and 0.122x measured for 128 tokens against 0.119 and 0.061): the saving a
    window-skipping kernel gives, which a costing of GPT-OSS's sliding layers would take."""
    rows = {(int(r["seq"]), r["mask"]): float(r["fwd_bwd_ms"]) for r in _rows("h200_sliding_window.csv")
            if r["kernel"] == "flex_attention"}
    for seq in (4096, 8192):
        for window in (128, 1024):
            density = _blocks_touched(seq, window) / _blocks_touched(seq, None)
            ratio = rows[(seq, f"window{window}")] / rows[(seq, "causal")]
            assert density <= ratio <= 2.1 * density, (seq, window, ratio, density)
