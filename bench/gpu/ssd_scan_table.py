"""Measure Mamba-2's chunked SSD scan (mamba_ssm's Triton kernels) on the local GPU.

    PYTHONPATH=VENDOR python3 bench/gpu/ssd_scan_table.py OUT.csv

VENDOR holds mamba_ssm's pure-Python/Triton files (state-spaces/mamba, mamba_ssm/ops/triton/ssd_*.py,
layernorm_gated.py, k_activations.py, softplus.py, utils/torch.py, utils/determinism.py, with empty
package __init__ files), so that no CUDA extension is needed: the scan is what Megatron-Core's
MambaMixer runs (mamba_chunk_scan_combined), bf16 inputs, fp32 dt/A, dt softplus with a bias, D skip,
no z gate (the gated norm is a separate kernel). Shapes: the Mamba-2 mixers of Nemotron 3 Nano (64
heads) and Super (128 heads) — head dim 64, state 128, 8 groups, chunk 128 — at tensor-parallel
1, 2 and 4 (heads and groups split), 4096 tokens per sequence, 1-4 sequences. Forward and
forward + backward. Two times each: `*_ms`, CUDA events around the call, median of 10 after 3
warm-ups (the first calls autotune), which includes the GPU waiting on Python launching the ~6
forward / ~15 backward Triton kernels; and `*_gpu_ms`, the sum of the kernels' own device time
from torch.profiler (mean of 5 calls), the GPU work alone, what a CUDA graph of the mixer (the
Nemotron 3 recipes capture "mamba") leaves.
"""
from __future__ import annotations

import sys

import torch

from kernels_table import failure, median_ms, write_csv  # same folder: CUDA events after 3 warm-ups
from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined

REPEATS = 10
MODELS = {"nemotron-3-nano": 64, "nemotron-3-super": 128}
HEAD_DIM, STATE, GROUPS, CHUNK, SEQ = 64, 128, 8, 128, 4096


def gpu_ms(fn) -> float:
    """Mean device time of the kernels one call launches (torch.profiler, 5 calls)."""
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
    return sum(e.self_device_time_total for e in prof.key_averages()) / 5 / 1e3


def main() -> None:
    rows = []
    for model, heads_total in MODELS.items():
        for tp in (1, 2, 4):
            heads, groups = heads_total // tp, GROUPS // tp
            for batch in (1, 2, 4):
                dev, bf = "cuda", torch.bfloat16
                x = torch.randn(batch, SEQ, heads, HEAD_DIM, device=dev, dtype=bf, requires_grad=True)
                dt = torch.randn(batch, SEQ, heads, device=dev, dtype=bf, requires_grad=True)
                A = (-torch.rand(heads, device=dev, dtype=torch.float32) * 4 - 1).requires_grad_(True)
                B = torch.randn(batch, SEQ, groups, STATE, device=dev, dtype=bf, requires_grad=True)
                C = torch.randn(batch, SEQ, groups, STATE, device=dev, dtype=bf, requires_grad=True)
                D = torch.randn(heads, device=dev, dtype=torch.float32, requires_grad=True)
                dt_bias = torch.randn(heads, device=dev, dtype=torch.float32, requires_grad=True)
                grad = torch.randn(batch, SEQ, heads, HEAD_DIM, device=dev, dtype=bf)

                def fwd():
                    return mamba_chunk_scan_combined(x, dt, A, B, C, CHUNK, D=D, dt_bias=dt_bias, dt_softplus=True)

                def fwd_bwd():
                    fwd().backward(grad)
                row = {"model": model, "tp": tp, "heads": heads, "groups": groups, "head_dim": HEAD_DIM,
                       "state": STATE, "chunk": CHUNK, "batch": batch, "seq": SEQ}
                try:
                    row.update(fwd_ms=round(median_ms(fwd, REPEATS), 4),
                               fwd_bwd_ms=round(median_ms(fwd_bwd, REPEATS), 4),
                               fwd_gpu_ms=round(gpu_ms(fwd), 4), fwd_bwd_gpu_ms=round(gpu_ms(fwd_bwd), 4), error="")
                except Exception as exc:
                    row.update(failure(exc, "fwd_ms", "fwd_bwd_ms", "fwd_gpu_ms", "fwd_bwd_gpu_ms"))
                rows.append(row)
                print(row, flush=True)
    write_csv(sys.argv[1], rows)


if __name__ == "__main__":
    main()
