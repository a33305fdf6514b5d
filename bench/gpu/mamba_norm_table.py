"""Measure the Mamba-2 mixer's gated RMSNorm and its layout copies on the local GPU.

    PYTHONPATH=VENDOR python3 bench/gpu/mamba_norm_table.py OUT.csv

VENDOR as for ssd_scan_table.py (mamba_ssm's Triton files). gated_rmsnorm: mamba_ssm's Triton
`rmsnorm_fn` as Megatron-Core's MambaMixer calls it (z gate, norm after the gate is applied:
norm_before_gate False, group size d_inner / groups); layout_copy: `.transpose(0, 1).contiguous()`
of an in_proj-wide bf16 tensor, one of the copies MambaMixer._ssm_training makes. Nemotron 3 Nano
(d_inner 4096) and Super (8192), 8 groups, at tp 1/2/4, 8192 and 16384 tokens. Kernel device time
(torch.profiler, mean of 5 calls) forward and forward + backward, and the bytes the planner counts
forward (hybrid.GATED_NORM_BYTES, TRANSPOSE_BYTES per element).
"""
from __future__ import annotations

import sys

import torch

from kernels_table import failure, write_csv  # same folder
from mamba_ssm.ops.triton.layernorm_gated import rmsnorm_fn
from ssd_scan_table import gpu_ms  # same folder: kernel device time by torch.profiler

MODELS = {"nemotron-3-nano": 4096, "nemotron-3-super": 8192}
GROUPS, SEQ = 8, 4096


def main() -> None:
    rows = []
    for model, d_total in MODELS.items():
        for tp in (1, 2, 4):
            d, groups = d_total // tp, GROUPS // tp
            for batch in (2, 4):
                tokens = batch * SEQ
                x = torch.randn(tokens, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                z = torch.randn(tokens, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                w = torch.ones(d, device="cuda", dtype=torch.float32, requires_grad=True)
                grad = torch.randn(tokens, d, device="cuda", dtype=torch.bfloat16)
                seq_first = torch.randn(SEQ, batch, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                grad_t = torch.randn(batch, SEQ, d, device="cuda", dtype=torch.bfloat16)

                def norm():
                    return rmsnorm_fn(x, w, None, z=z, eps=1e-5, group_size=d // groups, norm_before_gate=False)

                def copy():
                    return seq_first.transpose(0, 1).contiguous()
                for kernel, fwd, g, planner_bytes in (("gated_rmsnorm", norm, grad, 6.0), ("layout_copy", copy, grad_t, 4.0)):
                    row = {"model": model, "kernel": kernel, "tp": tp, "width": d, "tokens": tokens,
                           "planner_bytes_per_element": planner_bytes}
                    try:
                        f = gpu_ms(fwd)
                        fb = gpu_ms(lambda fwd=fwd, g=g: fwd().backward(g))
                        row.update(fwd_gpu_ms=round(f, 4), fwd_bwd_gpu_ms=round(fb, 4),
                                   fwd_gb_per_s_of_planner_bytes=round(planner_bytes * tokens * d / (f * 1e-3) / 1e9, 1),
                                   error="")
                    except Exception as exc:
                        row.update(failure(exc, "fwd_gpu_ms", "fwd_bwd_gpu_ms", "fwd_gb_per_s_of_planner_bytes"))
                    rows.append(row)
                    print(row, flush=True)
    write_csv(sys.argv[1], rows)


if __name__ == "__main__":
    main()
