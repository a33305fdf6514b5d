"""Measure a torchtitan Llama-3 8B block under float8 tensorwise training on the local GPU.

    python3 bench/gpu/float8_block_table.py OUT_DIR [--quick]

Why: the two torchtitan Llama-3.1 8B runs on H200 (Trainy, FSDP 32 / 64, local batch 2, seq
8192, float8 tensorwise, compiled, per-op selective checkpointing) are predicted 20 % slow while
the same recipe on the Grand Teton H100 is within 8 %. tp_rank_layer_table.py measured the bf16
block on an H200; this measures the float8 one, so that the planner's per-layer compute on an
H200 can be set against what one GPU does in a layer.

The block is tp_rank_layer_table.Block (torchtitan @820504e's TransformerBlock at TP 1) with its
seven linears in float8 as torchao's tensorwise recipe runs them (Float8LinearConfig default):
dynamic per-tensor scales (amax of the whole tensor, scale = e4m3/e5m2 max / amax), input and
weight in e4m3, output gradient in e5m2, three torch._scaled_mm products (forward x·Wᵀ,
input-gradient dy·W, weight-gradient dyᵀ·x) with bf16 outputs; the high-precision input and
weight are what the backward keeps and casts again (torchao's default, and
--float8.force_recompute_fp8_weight_in_bwd). The casts, amaxes and transposes are written as
tensor ops, so torch.compile fuses them as it does torchao's.

Rows (float8_block.csv), forward+backward of one block, eager and compiled, with no activation
checkpointing, torchtitan's per-op selective policy (the mm outputs but every second one, the
_scaled_mm outputs, SDPA's outputs and max) and full; the bf16 block compiled under the same
policies alongside, so that the ratio is taken on one machine. Timing: CUDA events, median of
REPEATS after 3 warm-ups, random data. Rows are written as they are taken; a failing variant is
recorded with its error, not fatal.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

import tp_rank_layer_table as layer  # same folder: the block, timing, SAC policy

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
COMPILE_DEADLINE_S = 300
CONFIG = ("llama3-8b", 1, 2)  # model, tp, local batch: the Trainy H200 runs


def cast(t: torch.Tensor, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """t in `dtype` with one dynamic per-tensor scale, and the inverse scale _scaled_mm takes."""
    amax = t.abs().max().float().clamp(min=1e-12)
    scale = torch.finfo(dtype).max / amax
    return (t.float() * scale).clamp(torch.finfo(dtype).min, torch.finfo(dtype).max).to(dtype), scale.reciprocal()


def column_major(t: torch.Tensor) -> torch.Tensor:
    """The same matrix laid out column-major (what _scaled_mm wants for its second operand)."""
    return t.t().contiguous().t()


class Float8Matmul(torch.autograd.Function):
    """y = x·Wᵀ with the three products in float8 (torchao tensorwise)."""

    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        xq, xs = cast(x, E4M3)
        wq, ws = cast(w, E4M3)
        return torch._scaled_mm(xq, wq.t(), scale_a=xs, scale_b=ws, out_dtype=torch.bfloat16)

    @staticmethod
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        dyq, dys = cast(dy, E5M2)
        wq, ws = cast(w, E4M3)
        dx = torch._scaled_mm(dyq, column_major(wq), scale_a=dys, scale_b=ws, out_dtype=torch.bfloat16)
        dyq_t, _ = cast(dy.t().contiguous(), E5M2)
        xq, xs = cast(x, E4M3)
        dw = torch._scaled_mm(dyq_t, column_major(xq), scale_a=dys, scale_b=xs, out_dtype=torch.bfloat16)
        return dx, dw


class Float8Linear(torch.nn.Module):
    def __init__(self, linear: torch.nn.Linear):
        super().__init__()
        self.weight = linear.weight

    def forward(self, x):
        return Float8Matmul.apply(x.reshape(-1, x.shape[-1]), self.weight).view(*x.shape[:-1], -1)


def float8_block(dims) -> torch.nn.Module:
    block = layer.Block(*dims, 1)
    for name in list(block.lin):
        block.lin[name] = Float8Linear(block.lin[name])
    return block


def op_sac_context():
    """torchtitan's per-op policy with _scaled_mm saved too (its _save_list since float8 AC)."""
    return layer.op_sac_context(extra_saved=(torch.ops.aten._scaled_mm.default,))


def checkpointed(block, ac):
    from torch.utils.checkpoint import checkpoint
    if ac == "none":
        return block
    context = {} if ac == "full" else {"context_fn": op_sac_context}
    return lambda x, cis: checkpoint(block, x, cis, use_reentrant=False, preserve_rng_state=False, **context)


def rows(quick: bool, deadline: float):
    model, tp, local_batch = CONFIG
    dims = (layer.QUICK_MODELS if quick else layer.MODELS)[model]
    seq = layer.QUICK_SEQ if quick else layer.SEQ
    cis = layer.rope_cis(seq)
    variants = [("float8", ac, compiled) for compiled in (False, True) for ac in ("none", "op_sac", "full")]
    variants += [("bf16", ac, True) for ac in ("none", "op_sac")]
    for dtype, ac, compiled in variants:
        cfg = {"model": model, "tp": tp, "local_batch": local_batch, "seq": seq}
        op = f"{'compiled' if compiled else 'eager'}_{ac}"
        if compiled and time.monotonic() > deadline:
            yield {**layer.failure(cfg, "block", op, RuntimeError("skipped: run deadline"), dtype)}
            continue
        block = float8_block(dims) if dtype == "float8" else layer.Block(*dims, 1)
        run = checkpointed(block, ac)
        if compiled:
            run = torch.compile(run)
        x = torch.randn(local_batch, seq, dims[0], device=layer.DEVICE, dtype=torch.bfloat16, requires_grad=True)
        for row in layer.fwd_and_bwd(cfg, "block", op, lambda: (lambda t: run(t, cis), [x]), 0,
                                     f"{local_batch}x{seq}x{dims[0]}", passes=("fwd_bwd",)):
            yield {**row, "dtype": dtype}
        del block, run, x
        if layer.CUDA:
            torch.cuda.empty_cache()


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    quick = "--quick" in sys.argv
    deadline = time.monotonic() + COMPILE_DEADLINE_S
    layer.stream_csv(out / "float8_block.csv", rows(quick, deadline))

if __name__ == "__main__":
    main()
