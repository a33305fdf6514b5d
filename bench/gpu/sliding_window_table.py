"""Measure sliding-window against full causal attention on the local GPU (GPT-OSS's shapes).

    python3 bench/gpu/sliding_window_table.py OUT_DIR [--quick]

Why: the planner costs a sliding-window layer (GPT-OSS: every other layer, a 128-token window;
Mistral, Gemma) as full causal attention (planner/hf_config.py says so). What a window saves
depends on the kernel skipping the blocks the window masks, at its block granularity. This
times both masks with the same kernel, PyTorch's flex_attention (compiled; it skips fully masked
blocks of its block mask, 128 x 128), so that the ratio is the window's and not a kernel's:
GPT-OSS-120B's attention (64 query heads, 8 key/value heads, head dim 64), sequence 4096 and
8192, 16,384 tokens per call, windows 128 and 1024, forward and forward+backward, bf16. The
causal SDPA rows (cuDNN and flash backends, same shapes, key/value heads repeated) place
flex_attention against the kernels the planner's attention curve was fitted on.
Timing: CUDA events, median of 10 after 3 warm-ups (tp_rank_layer_table.median_ms), random data. A failing row is recorded
with its error, not fatal.
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn.functional as F

import tp_rank_layer_table as layer  # same folder: the timing (median of 10 after 3 warm-ups)

CUDA, DEVICE = layer.CUDA, layer.DEVICE
HEADS, KV_HEADS, HEAD_DIM = 64, 8, 64  # GPT-OSS-120B (Hugging Face config.json)
TOKENS = 16384
SEQS = (4096, 8192)
WINDOWS = (128, 1024)


def qkv(batch, seq, heads_kv, grad=True):
    def t(h):
        return torch.randn(batch, h, seq, HEAD_DIM, device=DEVICE, dtype=torch.bfloat16, requires_grad=grad)
    return t(HEADS), t(heads_kv), t(heads_kv)


def timed(fn, leaves):
    """(forward ms, forward+backward ms) of out = fn(*leaves), as tp_rank_layer_table times them."""
    got = {r["pass"]: r for r in layer.fwd_and_bwd({}, "attn", "", lambda: (fn, leaves), 0, "")}
    if "fwd_bwd" not in got:
        raise RuntimeError(next(iter(got.values()))["error"])
    return got["fwd"]["median_ms"], got["fwd_bwd"]["median_ms"]


def rows(quick: bool):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    flex = torch.compile(flex_attention)
    seqs, tokens = ((256, 512), 1024) if quick else (SEQS, TOKENS)
    windows = (32, 64) if quick else WINDOWS
    for seq in seqs:
        batch = tokens // seq
        cfg = {"seq": seq, "batch": batch, "heads": HEADS, "kv_heads": KV_HEADS, "head_dim": HEAD_DIM}
        masks = [("causal", None)] + [(f"window{w}", w) for w in windows]
        for name, window in masks:
            def rule(b, h, q, k, window=window):
                return (q >= k) if window is None else (q >= k) & (q - k < window)
            try:
                block = create_block_mask(rule, None, None, seq, seq, device=DEVICE)
                leaves = list(qkv(batch, seq, KV_HEADS))
                f_ms, fb_ms = timed(lambda q, k, v, block=block: flex(q, k, v, block_mask=block, enable_gqa=True),
                                    leaves)
                yield {**cfg, "kernel": "flex_attention", "mask": name, "fwd_ms": round(f_ms, 4),
                       "fwd_bwd_ms": round(fb_ms, 4), "block_density": round(float(block.sparsity()) / -100 + 1, 4)
                       if hasattr(block, "sparsity") else "", "error": ""}
            except Exception as exc:  # noqa: BLE001 - a measurement row, recorded with its error
                yield {**cfg, "kernel": "flex_attention", "mask": name, "fwd_ms": "", "fwd_bwd_ms": "",
                       "block_density": "", "error": f"{type(exc).__name__}: {str(exc)[:200]}"}
        for backend in ("cudnn", "flash"):
            sdpa_backend = {"cudnn": torch.nn.attention.SDPBackend.CUDNN_ATTENTION,
                            "flash": torch.nn.attention.SDPBackend.FLASH_ATTENTION}[backend]
            try:
                leaves = list(qkv(batch, seq, HEADS))  # key/value heads repeated: SDPA's fused kernels

                def sdpa(q, k, v, sdpa_backend=sdpa_backend):
                    with torch.nn.attention.sdpa_kernel([sdpa_backend]):
                        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
                f_ms, fb_ms = timed(sdpa, leaves)
                yield {**cfg, "kernel": f"sdpa_{backend}", "mask": "causal", "fwd_ms": round(f_ms, 4),
                       "fwd_bwd_ms": round(fb_ms, 4), "block_density": "", "error": ""}
            except Exception as exc:  # noqa: BLE001
                yield {**cfg, "kernel": f"sdpa_{backend}", "mask": "causal", "fwd_ms": "", "fwd_bwd_ms": "",
                       "block_density": "", "error": f"{type(exc).__name__}: {str(exc)[:200]}"}
        if CUDA:
            torch.cuda.empty_cache()


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    quick = "--quick" in sys.argv
    layer.stream_csv(out / "sliding_window.csv", rows(quick))

if __name__ == "__main__":
    main()
