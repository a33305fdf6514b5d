"""Measure attention and element-wise kernels on the local GPU (companion to gemm_table.py).

    python3 bench/gpu/kernels_table.py OUT_DIR

attention.csv: causal scaled-dot-product attention (PyTorch SDPA, flash and cuDNN backends, bf16), forward
and forward+backward, for sequence lengths, head counts and head dims of LLM training.
FLOPs counted as the planner does (4·b·s²·h forward for the full score matrix; a causal kernel
does half); the planner's attention ceiling = 3 · 0.5 · flops_fwd / (peak · t_fwd+bwd).
elementwise.csv: LayerNorm, GeLU and residual-add forward+backward on [tokens, hidden] bf16
tensors, with the fewest bytes each must move, to give the achieved fraction of HBM bandwidth.
Timing: CUDA events, median of repeats after warm-up, random data.
"""
from __future__ import annotations

import csv
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

REPEATS = 15


def median_ms(fn, repeats: int = REPEATS) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b))
    return statistics.median(out)


BACKENDS = {"flash": "FLASH_ATTENTION", "cudnn": "CUDNN_ATTENTION"}


def attention_rows():
    rows = []
    for backend, attr in BACKENDS.items():
        try:
            rows += attention_rows_for(getattr(torch.nn.attention.SDPBackend, attr), backend)
        except RuntimeError as exc:  # backend not available in this build
            print(f"{backend}: {exc}")
    return rows


def attention_rows_for(sdp_backend, backend):
    rows = []
    for seq in (2048, 4096, 8192):
        for heads, head_dim in ((16, 128), (32, 128), (64, 128), (48, 128), (96, 128), (24, 96)):
            batch = max(1, 16384 // seq)
            q, k, v = (torch.randn(batch, heads, seq, head_dim, device="cuda", dtype=torch.bfloat16,
                                   requires_grad=True) for _ in range(3))
            grad = torch.randn(batch, heads, seq, head_dim, device="cuda", dtype=torch.bfloat16)
            with torch.nn.attention.sdpa_kernel(sdp_backend):
                fwd = median_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))

                def fwd_bwd():
                    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                    out.backward(grad)
                both = median_ms(fwd_bwd)
            hidden = heads * head_dim
            flops_fwd_full = 4.0 * batch * seq * seq * hidden
            rows.append({"backend": backend, "seq": seq, "heads": heads, "head_dim": head_dim, "batch": batch,
                         "fwd_ms": round(fwd, 4), "fwd_bwd_ms": round(both, 4),
                         "fwd_causal_tflops": round(0.5 * flops_fwd_full / (fwd * 1e-3) / 1e12, 1),
                         "planner_equiv_tflops": round(3 * 0.5 * flops_fwd_full / (both * 1e-3) / 1e12, 1)})
    return rows


def elementwise_rows():
    rows = []
    for tokens, hidden in ((8192, 4096), (8192, 8192), (16384, 12288), (4096, 16384)):
        x = torch.randn(tokens, hidden, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        r = torch.randn(tokens, hidden, device="cuda", dtype=torch.bfloat16)
        g = torch.randn(tokens, hidden, device="cuda", dtype=torch.bfloat16)
        ln = torch.nn.LayerNorm(hidden, device="cuda", dtype=torch.bfloat16)
        elems = tokens * hidden
        cases = {
            # fewest bytes: fwd reads x, writes y; bwd reads x, dy, writes dx (2 B each)
            "layernorm": (lambda: ln(x).backward(g), 5 * 2 * elems),
            "gelu": (lambda: F.gelu(x).backward(g), 5 * 2 * elems),
            # fwd reads two, writes one; bwd passes dy through (read, write)
            "residual_add": (lambda: (x + r).backward(g), 5 * 2 * elems),
        }
        for name, (fn, nbytes) in cases.items():
            ms = median_ms(fn)
            rows.append({"kernel": name, "tokens": tokens, "hidden": hidden, "fwd_bwd_ms": round(ms, 4),
                         "min_bytes": nbytes, "achieved_gb_per_s": round(nbytes / (ms * 1e-3) / 1e9, 1)})
            x.grad = None
    return rows


def failure(exc: Exception, *fields: str) -> dict:
    """The cells of a measurement that failed (a shape or kernel this build lacks): its fields
    empty and the error in one line (an exception without a message: its type alone)."""
    first_line = (str(exc).splitlines() or [""])[0][:120]
    return {**{f: "" for f in fields}, "error": f"{type(exc).__name__}: {first_line}"}


def write_csv(path, rows: list[dict]) -> None:
    """The rows as a CSV with the first row's keys as its header (the bench/gpu tables' format)."""
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def main() -> None:
    out = Path(sys.argv[1])
    for name, rows in (("attention.csv", attention_rows()), ("elementwise.csv", elementwise_rows())):
        write_csv(out / name, rows)
        print(name)
        for r in rows:
            print("  ", r)


if __name__ == "__main__":
    main()
