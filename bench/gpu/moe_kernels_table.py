"""Measure the MoE layer's kernels on the local GPU (companion to gemm_table.py and kernels_table.py).

    python3 bench/gpu/moe_kernels_table.py OUT_DIR [--quick]

grouped_gemm.csv: the routed experts' FC1 (w -> up width) and FC2 (ffn -> w) GEMMs for the expert
shapes of the reference MoE models, per count of local experts and rows per expert, run four ways:
  grouped      torch._grouped_mm, bf16 (one CUTLASS grouped kernel for all experts);
  loop         one torch.matmul per expert after torch.split, bf16 (the per-expert cuBLAS launches
               Transformer Engine's GroupedLinear issues);
  grouped_fp8  torch._scaled_grouped_mm, e4m3 with row-wise scales;
  loop_fp8     one torch._scaled_mm per expert, e4m3, per-tensor scales;
plus grouped_fwd_bwd (bf16 grouped forward + backward through autograd). Columns: GPU median ms
(CUDA events), TFLOP/s, and for the loops the host microseconds per expert GEMM issued while the
GPU is kept busy (so the host never waits): the launch cost EXPERT_GEMM_HOST_US stands for.
loop_fp8_quant adds the per-expert quantisation (amax, scale, cast) TE does before each GEMM.

moe_kernels.csv: the router (logits GEMM; fp32 softmax + top-k + routing map + tokens per expert),
and the permutation (Megatron moe_utils.permute: routing-map mask -> indices -> index_select) and
unpermutation (probability multiply + scatter_add) in plain PyTorch ops, with the planner's byte
count for each (time.PERMUTE_PASSES, time.ROUTER_PASSES) and the bandwidth that count implies.

Timing: CUDA events, median of REPEATS after 3 warm-ups, random data, rows routed uniformly
(balanced), input sets rotated when one set is smaller than L2. Each measurement is written as it
is taken, and a failure of one op (an op this PyTorch build lacks) is recorded, not fatal.
"""
from __future__ import annotations

import csv
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch

REPEATS = 10
# model: (expert row width w, expert ffn, gated activation, local expert counts measured)
EXPERT_SHAPES = {
    "deepseek-v3": (7168, 2048, True, (8, 32)),
    "qwen3-235b-a22b": (4096, 1536, True, (4, 16)),
    "qwen3-30b-a3b": (2048, 768, True, (16, 128)),
    "mixtral-8x7b": (4096, 14336, True, (1, 4)),
    "gpt-oss-120b": (2880, 2880, True, (4, 16)),
    "nemotron-3-super": (1024, 2688, False, (16, 64)),  # LatentMoE: 1024-wide latent rows, squared ReLU
}
ROWS_PER_EXPERT = (128, 256, 512, 1024, 2048, 4096, 8192)
MAX_TOTAL_ROWS = 1 << 20
L2_BYTES = 50e6
# router / permutation shapes: (hidden, experts, top_k)
ROUTER_SHAPES = ((7168, 256, 8), (7168, 384, 8), (4096, 128, 8), (2048, 128, 8), (4096, 512, 22), (2880, 128, 4))
TOKENS = (4096, 8192, 16384)
CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"


def sync():
    if CUDA:
        torch.cuda.synchronize()


def median_ms(fn, count_sets: int = 1) -> float:
    for i in range(3):
        fn(i % count_sets)
    sync()
    times = []
    for r in range(REPEATS):
        if CUDA:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn(r % count_sets)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn(r % count_sets)
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def host_us_per_call(fn, calls: int) -> float:
    """Host microseconds per launched GEMM while the GPU runs a long sleep kernel first, so the
    launch queue never makes the host wait."""
    fn(0)
    sync()
    samples = []
    for _ in range(3):
        if CUDA:
            torch.cuda._sleep(60_000_000)  # ~30 ms of GPU time at ~2 GHz
        t0 = time.perf_counter()
        fn(0)
        samples.append((time.perf_counter() - t0) * 1e6 / calls)
        sync()
    return statistics.median(samples)


class Writer:
    def __init__(self, path: Path, fields: list[str]):
        self.fh = open(path, "w", newline="")
        self.w = csv.DictWriter(self.fh, fieldnames=fields)
        self.w.writeheader()

    def row(self, **values):
        self.w.writerow(values)
        self.fh.flush()


def expert_weights(experts: int, n: int, k: int, sets: int):
    return [torch.randn(experts, n, k, device=DEVICE, dtype=torch.bfloat16) * k ** -0.5 for _ in range(sets)]


def fp8(x):
    return x.to(torch.float8_e4m3fn)


def gemm_ops(experts: int, rows: int, n: int, k: int):
    """{variant: (fn(set index), sets, launches per call)} for one expert GEMM (rows x k) @ (k x n)."""
    total = experts * rows
    set_bytes = (total * k + experts * n * k) * 2
    sets = max(1, min(4, int(2 * L2_BYTES // set_bytes) + 1))
    xs = [torch.randn(total, k, device=DEVICE, dtype=torch.bfloat16) for _ in range(sets)]
    ws = expert_weights(experts, n, k, sets)
    splits = [rows] * experts
    offs = torch.arange(rows, total + 1, rows, device=DEVICE, dtype=torch.int32)
    ops = {
        "grouped": (lambda i: torch._grouped_mm(xs[i], ws[i].transpose(-2, -1), offs=offs), 1),
        "loop": (lambda i: [torch.matmul(a, ws[i][e].t()) for e, a in enumerate(torch.split(xs[i], splits))], experts),
    }
    xq, wq = [fp8(x) for x in xs], [fp8(w) for w in ws]
    row_scale = torch.ones(total, device=DEVICE, dtype=torch.float32)
    col_scale = torch.ones(experts, n, device=DEVICE, dtype=torch.float32)
    one = torch.ones((), device=DEVICE, dtype=torch.float32)
    ops["grouped_fp8"] = (lambda i: torch._scaled_grouped_mm(xq[i], wq[i].transpose(-2, -1), row_scale, col_scale,
                                                             offs=offs, out_dtype=torch.bfloat16), 1)
    ops["loop_fp8"] = (lambda i: [torch._scaled_mm(a, wq[i][e].t(), scale_a=one, scale_b=one,
                                                   out_dtype=torch.bfloat16)
                                  for e, a in enumerate(torch.split(xq[i], splits))], experts)

    def quantised_loop(i):
        out = []
        for e, a in enumerate(torch.split(xs[i], splits)):
            scale = 448.0 / a.abs().amax().float().clamp(min=1e-12)
            out.append(torch._scaled_mm(fp8(a * scale), wq[i][e].t(), scale_a=scale.reciprocal(), scale_b=one,
                                        out_dtype=torch.bfloat16))
        return out
    ops["loop_fp8_quant"] = (quantised_loop, experts)
    xg = [x.clone().requires_grad_(True) for x in xs]
    wg = [w.clone().requires_grad_(True) for w in ws]

    def fwd_bwd(i):
        out = torch._grouped_mm(xg[i], wg[i].transpose(-2, -1), offs=offs)
        out.backward(torch.ones_like(out))
    ops["grouped_fwd_bwd"] = (fwd_bwd, 1)
    return ops, sets


def grouped_gemm_table(out: Path, quick: bool, gpu: str) -> None:
    w = Writer(out / "grouped_gemm.csv", ["gpu", "model", "gemm", "variant", "experts", "rows_per_expert", "n", "k",
                                          "median_ms", "tflops", "host_us_per_gemm", "error"])
    for model, (width, ffn, gated, expert_counts) in EXPERT_SHAPES.items():
        up = 2 * ffn if gated else ffn
        for experts in expert_counts[:1] if quick else expert_counts:
            for rows in ROWS_PER_EXPERT[:2] if quick else ROWS_PER_EXPERT:
                if experts * rows > MAX_TOTAL_ROWS:
                    continue
                for gemm, n, k in (("fc1", up, width), ("fc2", width, ffn)):
                    if quick:
                        n, k = n // 16, k // 16
                    try:
                        ops, sets = gemm_ops(experts, rows, n, k)
                    except Exception as exc:  # out of memory: record and go on
                        w.row(gpu=gpu, model=model, gemm=gemm, variant="alloc", experts=experts, rows_per_expert=rows,
                              n=n, k=k, median_ms="", tflops="", host_us_per_gemm="", error=str(exc)[:160])
                        continue
                    for variant, (fn, launches) in ops.items():
                        flop = 2.0 * experts * rows * n * k * (3 if variant == "grouped_fwd_bwd" else 1)
                        try:
                            ms = median_ms(fn, sets)
                            host = host_us_per_call(fn, launches) if launches > 1 and rows <= 1024 else ""
                            w.row(gpu=gpu, model=model, gemm=gemm, variant=variant, experts=experts,
                                  rows_per_expert=rows, n=n, k=k, median_ms=round(ms, 5),
                                  tflops=round(flop / (ms * 1e-3) / 1e12, 1),
                                  host_us_per_gemm=round(host, 2) if host != "" else "", error="")
                        except Exception as exc:
                            w.row(gpu=gpu, model=model, gemm=gemm, variant=variant, experts=experts,
                                  rows_per_expert=rows, n=n, k=k, median_ms="", tflops="", host_us_per_gemm="",
                                  error=f"{type(exc).__name__}: {str(exc).splitlines()[0][:140]}")
                    del ops
                    if CUDA:
                        torch.cuda.empty_cache()


def router_and_permutation_table(out: Path, quick: bool, gpu: str) -> None:
    w = Writer(out / "moe_kernels.csv", ["gpu", "kernel", "tokens", "hidden", "experts", "top_k", "median_ms",
                                         "planner_bytes", "rate", "rate_unit", "error"])
    for hidden, experts, top_k in ROUTER_SHAPES:
        for tokens in TOKENS[:1] if quick else TOKENS:
            if quick:
                hidden, tokens = hidden // 16, tokens // 16
            x = torch.randn(tokens, hidden, device=DEVICE, dtype=torch.bfloat16)
            router_w = torch.randn(experts, hidden, device=DEVICE, dtype=torch.bfloat16) * hidden ** -0.5
            logits = (x @ router_w.t()).float()

            def routing(_):
                probs = torch.softmax(logits, dim=-1)
                top_p, top_i = torch.topk(probs, top_k, dim=-1)
                routing_map = torch.zeros_like(probs, dtype=torch.bool).scatter_(1, top_i, True)
                return top_p, routing_map, routing_map.sum(dim=0)
            _, routing_map, _ = routing(0)
            rows = tokens * top_k
            probs_rows = torch.rand(rows, device=DEVICE, dtype=torch.float32)

            def permute(_):
                mask = routing_map.t().contiguous()
                idx = torch.arange(tokens, device=DEVICE).unsqueeze(0).expand(experts, -1).masked_select(mask)
                return x.index_select(0, idx), idx
            permuted, idx = permute(0)

            def unpermute(_):
                weighted = permuted * probs_rows.unsqueeze(-1).to(permuted.dtype)
                return torch.zeros_like(x).scatter_add_(0, idx.unsqueeze(1).expand(-1, hidden), weighted)
            kernels = {
                "router_gemm": (lambda _: x @ router_w.t(), 2 * tokens * hidden * experts / 1e12),
                # time.ROUTER_PASSES fp32 passes over tokens x experts
                "router_softmax_topk": (routing, 4.0 * 4 * tokens * experts),
                # time.PERMUTE_PASSES: each op reads and writes every routed row once
                "permute": (permute, 2.0 * 2 * rows * hidden),
                "unpermute": (unpermute, 2.0 * 2 * rows * hidden),
            }
            for name, (fn, count) in kernels.items():
                try:
                    ms = median_ms(fn)
                    is_flops = name == "router_gemm"
                    w.row(gpu=gpu, kernel=name, tokens=tokens, hidden=hidden, experts=experts, top_k=top_k,
                          median_ms=round(ms, 5), planner_bytes="" if is_flops else int(count),
                          rate=round(count / (ms * 1e-3) / (1 if is_flops else 1e9), 1),
                          rate_unit="TFLOP/s" if is_flops else "GB/s (planner bytes)", error="")
                except Exception as exc:
                    w.row(gpu=gpu, kernel=name, tokens=tokens, hidden=hidden, experts=experts, top_k=top_k,
                          median_ms="", planner_bytes="", rate="", rate_unit="",
                          error=f"{type(exc).__name__}: {str(exc).splitlines()[0][:140]}")


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    quick = "--quick" in sys.argv
    gpu = torch.cuda.get_device_name(0) if CUDA else "cpu"
    print(f"torch {torch.__version__} on {gpu}", flush=True)
    t0 = time.time()
    for part in (router_and_permutation_table, grouped_gemm_table):
        try:
            part(out, quick, gpu)
        except Exception:
            traceback.print_exc()
        print(f"{part.__name__} done at {time.time() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
