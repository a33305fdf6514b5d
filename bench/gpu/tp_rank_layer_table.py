"""Measure one tensor-parallel rank's share of a torchtitan Llama-3 block on the local GPU.

    python3 bench/gpu/tp_rank_layer_table.py OUT_DIR [--quick] [--ac]

Why: the torchtitan async-TP page's Llama-3 8B runs at TP 8 (local batch 12, seq 8192) are
predicted 17-19 % fast while the same model at TP 1 is within 1 %, and the vanilla-to-async TP
difference is predicted right, so the miss is in what one rank computes. This measures that
compute at the shapes each rank sees, kernel by kernel, as torchtitan @820504e writes the block
(torchtitan/models/llama3/model.py): separate wq / wk / wv / wo and w1 / w3 / w2 linears, RoPE as
a complex multiply in fp32 (apply_rotary_emb), K/V repeated to the query heads (repeat_kv),
causal SDPA with FLASH_ATTENTION first (models/attention.py on Hopper), nn.RMSNorm, SiLU·mul.

Per config (model, tp, tokens per rank = local batch · seq), rows of tp_rank_layer.csv:
  gemm     each linear's forward (x·Wᵀ), input-gradient (dy·W) and weight-gradient (dyᵀ·x)
           products, bf16 torch.matmul with autograd's operand layouts, and the same three as
           e4m3 torch._scaled_mm with per-tensor scales (torchao's tensorwise recipe; the casts
           and transposes it does around them are not timed);
  attn     SDPA on the rank's heads (heads/tp, head dim 128), forward and forward+backward;
  elem     RMSNorm on the rank's sequence shard (tokens/tp rows: torchtitan's SequenceParallel),
           RoPE + repeat_kv, SiLU·mul: forward and forward+backward;
  block    the whole block with the rank's shapes (norms over all tokens: no sequence
           parallelism, no communication), forward and forward+backward, eager, then under
           torch.compile as torchtitan compiles each block; compile is skipped once the
           run's deadline nears.
--ac measures only the block, forward+backward, under torchtitan's activation checkpointing
(parallelize_llama.py @820504e): none, per-op selective (its _save_list policy: keep every mm
output except every second one, the SDPA outputs and max; recompute the rest) and full; eager,
then compiled (none and per-op SAC; forward+backward only), into tp_rank_block_ac.csv.
Timing: CUDA events, median of REPEATS after 3 warm-ups, random data, bf16. Two input sets
alternate for the GEMMs (each set is far above the 50 MB L2). Rows are written as they are
taken; a failing op is recorded with its error, not fatal.
"""
from __future__ import annotations

import csv
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import kernels_table  # same folder: the failed-measurement cells

REPEATS = 10
CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
SEQ = 8192
HEAD_DIM = 128
# model: (hidden, heads, kv heads, ffn) as torchtitan's llama3_configs set them
MODELS = {"llama3-8b": (4096, 32, 8, 14336), "llama3-70b": (8192, 64, 8, 28672)}
# (model, tp, local batch): the torchtitan records' layouts. 8B TP 1 local batch 2 (the FSDP 8 / 128
# rows, within 1 %), 8B TP 8 local batch 12 (the async-TP page, 17-19 % fast), 70B TP 8 local
# batch 16 (the async-TP page and the Dec-2024 table, -1 to -9 %)
CONFIGS = (("llama3-8b", 1, 2), ("llama3-8b", 8, 12), ("llama3-70b", 8, 16))
# --quick: the same code on shapes a CPU runs in seconds (checks the script, measures nothing)
QUICK_MODELS = {"llama3-8b": (256, 8, 8, 512), "llama3-70b": (512, 16, 8, 1024)}
QUICK_SEQ = 128
COMPILE_DEADLINE_S = 330


def sync():
    if CUDA:
        torch.cuda.synchronize()


def median_ms(fn, arg_sets=None) -> float:
    arg_sets = arg_sets or [()]
    for i in range(3):
        fn(*arg_sets[i % len(arg_sets)])
    sync()
    out = []
    for r in range(REPEATS):
        args = arg_sets[r % len(arg_sets)]
        if CUDA:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn(*args)
            b.record()
            b.synchronize()
            out.append(a.elapsed_time(b))
        else:
            t0 = time.perf_counter()
            fn(*args)
            out.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(out)


def rand(*shape, dtype=torch.bfloat16):
    return torch.randn(*shape, device=DEVICE, dtype=dtype)


def linears(hidden, heads, kv_heads, ffn, tp):
    """(name, in width K, out width N) of one rank's linears (column-parallel split the output,
    row-parallel the input)."""
    q, kv = heads // tp * HEAD_DIM, kv_heads // tp * HEAD_DIM
    return (("wq", hidden, q), ("wk", hidden, kv), ("wv", hidden, kv), ("wo", q, hidden),
            ("w1", hidden, ffn // tp), ("w3", hidden, ffn // tp), ("w2", ffn // tp, hidden))


def gemm_rows(cfg, tokens, dims, tp):
    rows = []
    one = torch.ones((), device=DEVICE, dtype=torch.float32)
    for name, k, n in linears(*dims, tp):
        sets = [(rand(tokens, k), rand(n, k), rand(tokens, n)) for _ in range(2)]
        bf16 = {
            "fwd": (lambda x, w, dy: x @ w.t(), 2 * tokens * n * k),
            "dgrad": (lambda x, w, dy: dy @ w, 2 * tokens * n * k),
            "wgrad": (lambda x, w, dy: dy.t() @ x, 2 * tokens * n * k),
        }
        for product, (fn, flop) in bf16.items():
            rows.append(measure(cfg, "gemm", name, "bf16", fn, sets, flop, f"{tokens}x{n}x{k}", product))
        # e4m3 operands laid out as _scaled_mm needs (a row-major, b column-major), as torchao
        # prepares them; the casts and transposes are not timed
        f8 = torch.float8_e4m3fn
        try:
            f8_sets = [(x.to(f8), w.to(f8), w.t().contiguous().to(f8), dy.to(f8), dy.t().contiguous().to(f8),
                        x.t().contiguous().to(f8)) for x, w, dy in sets]
        except (RuntimeError, TypeError) as exc:
            rows.append(failure(cfg, "gemm", f"{name}.fp8", exc))
            continue
        fp8 = {
            "fwd": lambda x, w, wt, dy, dyt, xt: torch._scaled_mm(x, w.t(), scale_a=one, scale_b=one,
                                                                   out_dtype=torch.bfloat16),
            "dgrad": lambda x, w, wt, dy, dyt, xt: torch._scaled_mm(dy, wt.t(), scale_a=one, scale_b=one,
                                                                     out_dtype=torch.bfloat16),
            "wgrad": lambda x, w, wt, dy, dyt, xt: torch._scaled_mm(dyt, xt.t(), scale_a=one, scale_b=one,
                                                                     out_dtype=torch.bfloat16),
        }
        for product, fn in fp8.items():
            rows.append(measure(cfg, "gemm", name, "fp8", fn, f8_sets, 2 * tokens * n * k, f"{tokens}x{n}x{k}",
                                product))
        del sets, f8_sets
    return rows


def measure(cfg, kind, op, dtype, fn, arg_sets, flop, shape, pass_):
    try:
        with torch.no_grad():
            ms = median_ms(fn, arg_sets)
    except (RuntimeError, TypeError, NotImplementedError) as exc:
        return failure(cfg, kind, op, exc, dtype)
    return {**cfg, "kind": kind, "op": op, "dtype": dtype, "pass": pass_, "shape": shape, "median_ms": round(ms, 4),
            "tflops": round(flop / (ms * 1e-3) / 1e12, 1) if flop else "", "error": ""}


def failure(cfg, kind, op, exc, dtype="bf16"):
    """A row whose measurement failed: its identity, empty cells, the error (kernels_table.failure)."""
    return {**cfg, "kind": kind, "op": op, "dtype": dtype,
            **kernels_table.failure(exc, "pass", "shape", "median_ms", "tflops")}


def fwd_and_bwd(cfg, kind, op, make, flop_fwd, shape, passes=("fwd", "fwd_bwd")):
    """Rows for forward and forward+backward of out = f(*leaves); `make` returns (f, leaves)."""
    rows = []
    try:
        f, leaves = make()
        grad = None

        def fwd():
            with torch.no_grad():
                f(*leaves)

        def both():
            nonlocal grad
            out = f(*leaves)
            if grad is None:
                grad = torch.randn_like(out)
            out.backward(grad)
            for leaf in leaves:
                leaf.grad = None
        for pass_, fn, flop in (("fwd", fwd, flop_fwd), ("fwd_bwd", both, 3 * flop_fwd)):
            if pass_ not in passes:
                continue
            ms = median_ms(fn)
            rows.append({**cfg, "kind": kind, "op": op, "dtype": "bf16", "pass": pass_, "shape": shape,
                         "median_ms": round(ms, 4), "tflops": round(flop / (ms * 1e-3) / 1e12, 1) if flop else "",
                         "error": ""})
    except (RuntimeError, TypeError, NotImplementedError, AssertionError) as exc:
        rows.append(failure(cfg, kind, op, exc))
    return rows


def rope_cis(seq):
    freqs = 1.0 / (10000.0 ** (torch.arange(0, HEAD_DIM, 2, device=DEVICE).float() / HEAD_DIM))
    angles = torch.outer(torch.arange(seq, device=DEVICE).float(), freqs)
    return torch.polar(torch.ones_like(angles), angles)


def rotary(xq, xk, cis):
    """torchtitan's apply_rotary_emb: view pairs as complex64, multiply, back to bf16."""
    shape = (1, cis.shape[0], 1, cis.shape[1])
    cis = cis.view(*shape)
    q = torch.view_as_real(torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2)) * cis).flatten(3)
    k = torch.view_as_real(torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2)) * cis).flatten(3)
    return q.type_as(xq), k.type_as(xk)


def repeat_kv(x, n_rep):
    b, s, h, d = x.shape
    return x if n_rep == 1 else x[:, :, :, None, :].expand(b, s, h, n_rep, d).reshape(b, s, h * n_rep, d)


def sdpa(q, k, v):
    backends = [torch.nn.attention.SDPBackend.FLASH_ATTENTION, torch.nn.attention.SDPBackend.EFFICIENT_ATTENTION,
                torch.nn.attention.SDPBackend.MATH]
    with torch.nn.attention.sdpa_kernel(backends, set_priority=True):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


class Block(torch.nn.Module):
    """One rank's share of torchtitan's TransformerBlock (no communication)."""

    def __init__(self, hidden, heads, kv_heads, ffn, tp):
        super().__init__()
        self.heads, self.kv = heads // tp, kv_heads // tp
        lin = {name: torch.nn.Linear(k, n, bias=False, device=DEVICE, dtype=torch.bfloat16)
               for name, k, n in linears(hidden, heads, kv_heads, ffn, tp)}
        self.lin = torch.nn.ModuleDict(lin)
        self.attention_norm = torch.nn.RMSNorm(hidden, eps=1e-5, device=DEVICE, dtype=torch.bfloat16)
        self.ffn_norm = torch.nn.RMSNorm(hidden, eps=1e-5, device=DEVICE, dtype=torch.bfloat16)

    def forward(self, x, cis):
        b, s, _ = x.shape
        a = self.attention_norm(x)
        q = self.lin["wq"](a).view(b, s, self.heads, HEAD_DIM)
        k = self.lin["wk"](a).view(b, s, self.kv, HEAD_DIM)
        v = self.lin["wv"](a).view(b, s, self.kv, HEAD_DIM)
        q, k = rotary(q, k, cis)
        k, v = repeat_kv(k, self.heads // self.kv), repeat_kv(v, self.heads // self.kv)
        o = sdpa(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)).transpose(1, 2).contiguous()
        h = x + self.lin["wo"](o.view(b, s, -1))
        f = self.ffn_norm(h)
        return h + self.lin["w2"](F.silu(self.lin["w1"](f)) * self.lin["w3"](f))


def config_rows(model, tp, local_batch, quick):
    hidden, heads, kv_heads, ffn = (QUICK_MODELS if quick else MODELS)[model]
    seq = QUICK_SEQ if quick else SEQ
    tokens = local_batch * seq
    cfg = {"model": model, "tp": tp, "local_batch": local_batch, "seq": seq}
    dims = (hidden, heads, kv_heads, ffn)
    rows = gemm_rows(cfg, tokens, dims, tp)
    hq, hkv = heads // tp, kv_heads // tp
    attn_flop = 2.0 * local_batch * seq * seq * hq * HEAD_DIM  # causal half of 4·b·s²·h·d
    rows += fwd_and_bwd(cfg, "attn", "sdpa", lambda: (sdpa, [
        torch.randn(local_batch, hq, seq, HEAD_DIM, device=DEVICE, dtype=torch.bfloat16, requires_grad=True)
        for _ in range(3)]), attn_flop, f"{local_batch}x{hq}x{seq}x{HEAD_DIM}")
    norm = torch.nn.RMSNorm(hidden, eps=1e-5, device=DEVICE, dtype=torch.bfloat16)
    leaf = lambda *s: torch.randn(*s, device=DEVICE, dtype=torch.bfloat16, requires_grad=True)  # noqa: E731
    rows += fwd_and_bwd(cfg, "elem", "rmsnorm_seq_shard", lambda: (norm, [leaf(tokens // tp, hidden)]), 0,
                        f"{tokens // tp}x{hidden}")
    cis = rope_cis(seq)

    def rope_and_repeat(q, k):
        q2, k2 = rotary(q, k, cis)
        return torch.cat([q2, repeat_kv(k2, hq // hkv)], dim=2)
    rows += fwd_and_bwd(cfg, "elem", "rope_repeat_kv", lambda: (rope_and_repeat, [
        leaf(local_batch, seq, hq, HEAD_DIM), leaf(local_batch, seq, hkv, HEAD_DIM)]), 0,
        f"{local_batch}x{seq}x{hq}+{hkv}x{HEAD_DIM}")
    rows += fwd_and_bwd(cfg, "elem", "silu_mul", lambda: (lambda a, b: F.silu(a) * b, [
        leaf(tokens, ffn // tp), leaf(tokens, ffn // tp)]), 0, f"{tokens}x{ffn // tp}")
    block = Block(hidden, heads, kv_heads, ffn, tp)
    rows += block_rows(cfg, block, cis, local_batch, seq, hidden, "eager", gemm_and_attn_flop(dims, tp, tokens, seq))
    del block
    if CUDA:
        torch.cuda.empty_cache()
    return rows


def gemm_and_attn_flop(dims, tp, tokens, seq):
    hq = dims[1] // tp
    return 2.0 * tokens * sum(k * n for _, k, n in linears(*dims, tp)) + 2.0 * tokens * seq * hq * HEAD_DIM


SAVE_LIST = None  # built lazily: torch.ops lookups need the build's op registry


def op_sac_context(extra_saved=()):
    """torchtitan's per-op SAC policy (_apply_ac_to_transformer_block, selective_ac_option "op");
    `extra_saved`: more ops it always keeps (float8_block_table.py adds _scaled_mm)."""
    from collections import defaultdict

    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts
    global SAVE_LIST
    if SAVE_LIST is None:
        SAVE_LIST = {torch.ops.aten.mm.default, torch.ops.aten._scaled_dot_product_efficient_attention.default,
                     torch.ops.aten._scaled_dot_product_flash_attention.default, torch.ops.aten.max.default}
    save = SAVE_LIST | set(extra_saved)
    meta = defaultdict(int)

    def policy(ctx, func, *args, **kwargs):
        key = "recompute_mm" if ctx.is_recompute else "forward_mm"
        if func == torch.ops.aten.mm.default:
            meta[key] += 1
        keep = func in save and not (func == torch.ops.aten.mm.default and meta[key] % 2 == 0)
        return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE
    return create_selective_checkpoint_contexts(policy)


def checkpointed(block, ac):
    """block's forward under activation checkpointing `ac` ("none", "op_sac", "full")."""
    from torch.utils.checkpoint import checkpoint
    if ac == "none":
        return block
    if ac == "full":
        return lambda x, cis: checkpoint(block, x, cis, use_reentrant=False, preserve_rng_state=False)
    return lambda x, cis: checkpoint(block, x, cis, use_reentrant=False, preserve_rng_state=False,
                                     context_fn=op_sac_context)


def ac_rows(model, tp, local_batch, quick, deadline):
    """The block forward+backward under each activation checkpointing, eager then compiled."""
    hidden, heads, kv_heads, ffn = (QUICK_MODELS if quick else MODELS)[model]
    seq = QUICK_SEQ if quick else SEQ
    cis = rope_cis(seq)
    rows = []
    for compiled in (False, True):
        for ac in ("none", "op_sac") if compiled else ("none", "op_sac", "full"):
            cfg = {"model": model, "tp": tp, "local_batch": local_batch, "seq": seq}
            op = f"{'compiled' if compiled else 'eager'}_{ac}"
            if compiled and time.monotonic() > deadline:
                rows.append(failure(cfg, "block", op, RuntimeError("skipped: run deadline")))
                continue
            block = Block(hidden, heads, kv_heads, ffn, tp)
            run = checkpointed(block, ac)
            if compiled:
                run = torch.compile(run)
            x = torch.randn(local_batch, seq, hidden, device=DEVICE, dtype=torch.bfloat16, requires_grad=True)
            rows += [r for r in fwd_and_bwd(cfg, "block", op, lambda: (lambda t: run(t, cis), [x]), 0,
                                            f"{local_batch}x{seq}x{hidden}", passes=("fwd_bwd",))]
            del block, run, x
            if CUDA:
                torch.cuda.empty_cache()
    return rows


def block_rows(cfg, block, cis, local_batch, seq, hidden, mode, flop):
    leaf = torch.randn(local_batch, seq, hidden, device=DEVICE, dtype=torch.bfloat16, requires_grad=True)
    run = torch.compile(block) if mode == "compiled" else block
    return fwd_and_bwd(cfg, "block", mode, lambda: (lambda t: run(t, cis), [leaf]), flop,
                       f"{local_batch}x{seq}x{hidden}")


def compiled_rows(model, tp, local_batch, quick):
    """The block under torch.compile (taken after every eager row: compiling is slow)."""
    hidden, heads, kv_heads, ffn = (QUICK_MODELS if quick else MODELS)[model]
    seq = QUICK_SEQ if quick else SEQ
    cfg = {"model": model, "tp": tp, "local_batch": local_batch, "seq": seq}
    block = Block(hidden, heads, kv_heads, ffn, tp)
    rows = block_rows(cfg, block, rope_cis(seq), local_batch, seq, hidden, "compiled",
                      gemm_and_attn_flop((hidden, heads, kv_heads, ffn), tp, local_batch * seq, seq))
    del block
    if CUDA:
        torch.cuda.empty_cache()
    return rows


def stream_csv(path: Path, rows) -> None:
    """Say the GPU, then write `rows` (dicts) to `path` as each is taken, echoing it: a run cut
    short keeps what it measured."""
    if CUDA:
        props = torch.cuda.get_device_properties(0)
        print(f"{props.name}, {props.multi_processor_count} SMs, torch {torch.__version__}", flush=True)
    with open(path, "w", newline="") as fh:
        writer = None
        for row in rows:
            if writer is None:
                writer = csv.DictWriter(fh, fieldnames=list(row))
                writer.writeheader()
            writer.writerow(row)
            fh.flush()
            print(",".join(str(v) for v in row.values()), flush=True)


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    quick = "--quick" in sys.argv
    deadline = time.monotonic() + COMPILE_DEADLINE_S
    ac = "--ac" in sys.argv
    path = out / ("tp_rank_block_ac.csv" if ac else "tp_rank_layer.csv")
    if CUDA:
        props = torch.cuda.get_device_properties(0)
        print(f"{props.name}, {props.multi_processor_count} SMs, torch {torch.__version__}", flush=True)
    fields = None
    with open(path, "w", newline="") as fh:
        def measured():
            if ac:
                for model, tp, local_batch in CONFIGS:
                    yield from ac_rows(model, tp, local_batch, quick, deadline)
                return
            for model, tp, local_batch in CONFIGS:
                yield from config_rows(model, tp, local_batch, quick)
            for model, tp, local_batch in CONFIGS:
                if time.monotonic() > deadline:
                    cfg = {"model": model, "tp": tp, "local_batch": local_batch, "seq": QUICK_SEQ if quick else SEQ}
                    yield failure(cfg, "block", "compiled", RuntimeError("skipped: run deadline"))
                    continue
                yield from compiled_rows(model, tp, local_batch, quick)
        for row in measured():
                if fields is None:
                    fields = list(row)
                    writer = csv.DictWriter(fh, fieldnames=fields)
                    writer.writeheader()
                writer.writerow(row)
                fh.flush()
                print(",".join(str(row[f]) for f in fields), flush=True)


if __name__ == "__main__":
    main()
