"""Measure causal attention at head widths other than 128 on the local GPU (companion to kernels_table.py).

    python3 bench/gpu/attention_head_dims.py OUT.csv

For each SDPA backend (cuDNN fused attention, what Transformer Engine runs; FlashAttention-2) and
(query/key width, value width) — 64, 96, 128, 192 and 256 wide, and MLA's 192-wide queries and keys
with 128-wide values (DeepSeek-V3, Kimi K2) — it times forward and forward+backward, 32 heads,
16384 tokens per call (batch = 16384 / seq). FLOPs: causal half of 2·s²·(d_qk + d_v) per head
forward; the planner's equivalent throughput counts the backward as twice the forward.
`ratio_vs_128` divides that throughput by the 128/128 row's of the same backend and sequence.
Timing: CUDA events, median of 15 after 3 warm-ups, random data. A failing shape (a width a
backend lacks) is recorded with its error.
"""
from __future__ import annotations

import sys

import torch
import torch.nn.functional as F

from kernels_table import failure, median_ms, write_csv  # same folder: CUDA events, median of 15 after 3 warm-ups

WIDTHS = ((128, 128), (64, 64), (96, 96), (192, 192), (192, 128), (256, 256))
BACKENDS = {"cudnn": "CUDNN_ATTENTION", "flash": "FLASH_ATTENTION"}
HEADS = 32


def main() -> None:
    rows = []
    for backend, attr in BACKENDS.items():
        sdp = getattr(torch.nn.attention.SDPBackend, attr)
        for seq in (4096, 8192):
            batch = max(1, 16384 // seq)
            base = None
            for d_qk, d_v in WIDTHS:
                row = {"backend": backend, "seq": seq, "heads": HEADS, "d_qk": d_qk, "d_v": d_v, "batch": batch}
                try:
                    q, k = (torch.randn(batch, HEADS, seq, d_qk, device="cuda", dtype=torch.bfloat16,
                                        requires_grad=True) for _ in range(2))
                    v = torch.randn(batch, HEADS, seq, d_v, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                    grad = torch.randn(batch, HEADS, seq, d_v, device="cuda", dtype=torch.bfloat16)
                    with torch.nn.attention.sdpa_kernel(sdp):
                        fwd = median_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))

                        def fwd_bwd():
                            F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(grad)
                        both = median_ms(fwd_bwd)
                    flops_fwd = 0.5 * 2.0 * batch * HEADS * seq * seq * (d_qk + d_v)
                    equiv = 3 * flops_fwd / (both * 1e-3) / 1e12
                    if (d_qk, d_v) == (128, 128):
                        base = equiv
                    row.update(fwd_ms=round(fwd, 4), fwd_bwd_ms=round(both, 4),
                               fwd_causal_tflops=round(flops_fwd / (fwd * 1e-3) / 1e12, 1),
                               planner_equiv_tflops=round(equiv, 1),
                               ratio_vs_128=round(equiv / base, 3) if base else "", error="")
                except Exception as exc:  # a width this backend does not support
                    row.update(failure(exc, "fwd_ms", "fwd_bwd_ms", "fwd_causal_tflops", "planner_equiv_tflops",
                                       "ratio_vs_128"))
                rows.append(row)
                print(row, flush=True)
    write_csv(sys.argv[1], rows)


if __name__ == "__main__":
    main()
