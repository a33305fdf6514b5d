"""Exposed data-parallel communication per step, by ZeRO stage and by implementation (seconds).

What each stage moves (Rajbhandari et al. 2020, ZeRO §5; Ψ = parameters held by the GPU):
  0  plain DP: all-reduce the gradients once per step (after the last microbatch).
  1  distributed optimizer (Megatron): reduce-scatter the gradients and all-gather the updated
     parameters once per step.
  2  + sharded gradients: a GPU keeps only its shard, so with gradient accumulation every
     microbatch's gradients are reduce-scattered (ZeRO §5.2; Megatron-FSDP `optim_grads`,
     DeepSpeed stage 2), then the parameters are all-gathered once per step.
  3  + sharded parameters (FSDP): every layer's parameters are all-gathered before its forward
     and again before its backward, and its gradients reduce-scattered after its backward, for
     every microbatch (ZeRO §5.3; PyTorch FSDP2 and Megatron-FSDP `optim_grads_params`, with
     reshard-after-forward). One collective per layer, so each pays the ring latency.

Overlap as the implementations do it: DDP / distributed optimizer bucket the last microbatch's
gradients (and first forward's parameters) behind compute (`time.overlapped_collective_s`);
FSDP prefetches layer i+1's all-gather while layer i runs (FSDP2 implicit prefetch,
Megatron-FSDP's double buffer), so per layer only what exceeds that layer's time shows, plus
the first layer's gather, which has nothing to hide behind. Hiding is not free: the collective's
kernels take SMs and HBM bandwidth from the compute beside them, so a layer of compute x with a
collective c beside it takes max(c, x + s·c) (s: the compute throughput the collective takes;
comm-bound layers show c − x, compute-bound ones s·c). The window is the layer's compute, and
also its tensor/context/expert-parallel communication when that stays inside the NVLink domain
while the data-parallel collective runs on the NICs (different links: the a2a of an intra-node
expert-parallel layer does not slow the inter-node gather; Megatron-FSDP ModelZoo Qwen3-235B).
DeepSpeed ZeRO-3 runs the same schedule through its own parameter coordinator (fetch/release
hooks, copies into flat buffers), slower than NCCL ring bandwidth and heavier on the compute
beside it: its achieved fraction of ring bandwidth is the named DEEPSPEED_ZERO3_BW_EFFICIENCY,
its contention DEEPSPEED_ZERO3_COMPUTE_CONTENTION.
"""
from __future__ import annotations

import sys

import numpy as np

from planner.analytical import comm, named
from planner.plan import DP_IMPL_CODES

# Share of a GPU's compute throughput taken by a sharded-DP collective running beside it (its
# NCCL kernels' SMs, its buffer copies' HBM traffic), per implementation: a layer of compute x
# with its prefetched collective c takes max(c, x + s·c). Fitted by bench/fsdp_moe_eval.py --fit
# (planner/fit.py fit_sharded_dp; `planner validate --lofo` refits them without each family):
# FSDP_COMPUTE_CONTENTION on the dense PyTorch FSDP rows (torchtitan FSDP2, llm-foundry FSDP:
# their all-gathers copy the shards in and out of a flat buffer and their reduce-scatters
# chunk-concatenate the gradients, copies beside compute), MEGATRON_FSDP_COMPUTE_CONTENTION on
# the dense Megatron-FSDP rows (persistent contiguous buffers, no copy-in/copy-out), each on its
# implementation's own rows since the refit of 2026-11-23 (one shared value was 0.106; refitted
# after the PyTorch rows' loss and attention kernels were corrected it took 0.34, which put the
# Megatron-FSDP rows from 6.3 to 9.8 %). The PyTorch value and the torch-stack kernel ceilings
# (planner/fit.py TORCH_STACK_FITS) move together (faster kernels, more contention), so they are
# fitted alternately, bench/calibrate.py --write then bench/fsdp_moe_eval.py --fit, until neither
# moves (two rounds from 0.358: 0.449, A100 FlashAttention-2 0.436 -> 0.467, then fixed; 0.467,
# A100 FlashAttention-2 0.473, once the torchtitan async-TP page's 8 tuned rows and DGX Cloud's
# GPT-3 175B 512-GPU rows were read; 0.467 -> 0.516 with torchtitan's per-op checkpointing costed
# and the A100's torch GEMM ceiling fitted, 2026-11-27: the next round gives 0.547 at the same
# 5.5-5.6 % on these rows, the GEMM ceiling and this contention trading off along a flat valley,
# so the alternation was stopped there);
# DEEPSPEED_ZERO3_* on the 6 DeepSpeed ZeRO-3 rows of Narayanan et al. SC'21 Table 2, whose
# step time does not shrink from mb 2 to mb 1 (768 -> 1536 GPUs: 66.75 s both; 1120 -> 2240:
# 180 -> 184 s), i.e. those steps are gather-bound (c > x: the bandwidth efficiency), while at
# mb 4 the step exceeds both compute and gathers (x + s·c: the contention). Fitted 0.111, 0.486.
FSDP_COMPUTE_CONTENTION = 0.516
MEGATRON_FSDP_COMPUTE_CONTENTION = 0.001
DEEPSPEED_ZERO3_COMPUTE_CONTENTION = 0.486
# DeepSpeed ZeRO-3's achieved fraction of ring bandwidth for its per-layer gathers / reduces.
DEEPSPEED_ZERO3_BW_EFFICIENCY = 0.11


# The named parameters above, by name (planner/fit.py refits them, leave-one-family-out included).
FITTED_PARAMETERS = ("FSDP_COMPUTE_CONTENTION", "MEGATRON_FSDP_COMPUTE_CONTENTION", "DEEPSPEED_ZERO3_BW_EFFICIENCY",
                     "DEEPSPEED_ZERO3_COMPUTE_CONTENTION")


def parameters(**values: float):
    """Run the model with some FITTED_PARAMETERS set to `values`, restored afterwards (the fit
    tries values this way; the module constants are the fitted ones)."""
    return named.overridden(sys.modules[__name__], FITTED_PARAMETERS, values)


def zero2_exposed_s(grad_rs, param_ag, m, mb_fwd, mb_bwd, p, v, hide, overlapped):
    """ZeRO-2: a gradient reduce-scatter after every microbatch's backward (each hidden behind
    that backward as far as it can be), one parameter all-gather per step."""
    hidden = (np.maximum(m - 1, 0) * np.maximum(0.0, grad_rs - mb_bwd)
              + overlapped(grad_rs, mb_bwd, p, v) + overlapped(param_ag, mb_fwd, p, v))
    return np.where(hide, hidden, m * grad_rs + param_ag)


def prefetched_layers_s(c_l, x_l, layers, contention):
    """Exposed seconds of one pass over `layers` layers whose per-layer collective c_l is
    prefetched behind the previous layer's window x_l: the first layer's collective has nothing
    to hide behind (c_l), each later layer takes max(c_l, x_l + s·c_l), i.e. shows
    max(c_l − x_l, s·c_l) beyond its own x_l."""
    return c_l + (layers - 1) * np.maximum(c_l - x_l, contention * c_l)


def fsdp_zero2_exposed_s(grad_rs, param_ag, latency_s, m, mb_fwd, mb_bwd, layers, hide, contention):
    """PyTorch FSDP's SHARD_GRAD_OP (ZeRO-2 as FSDP runs it, llm-foundry): per layer and
    microbatch an all-gather before forward and a reduce-scatter after backward, each prefetched
    behind one layer's window like ZeRO-3's (`prefetched_layers_s`); the parameters stay gathered
    from forward to backward, so no backward all-gather (torch.distributed.fsdp ShardingStrategy
    SHARD_GRAD_OP). Megatron's ZeRO-2 (`zero2_exposed_s`) buckets instead."""
    layers = np.maximum(layers, 1.0)
    ag_l = param_ag / layers + latency_s
    rs_l = grad_rs / layers + latency_s
    fwd = prefetched_layers_s(ag_l, mb_fwd / layers, layers, contention)
    bwd = prefetched_layers_s(rs_l, mb_bwd / layers, layers, contention)
    return m * np.where(hide, fwd + bwd, layers * (ag_l + rs_l))


def zero3_exposed_s(grad_rs, param_ag, latency_s, m, mb_fwd, mb_bwd, layers, hide, contention):
    """ZeRO-3 / FSDP: per layer and microbatch an all-gather before forward, another before
    backward and a reduce-scatter after it; with prefetch each hides behind one layer's window
    (`prefetched_layers_s`), the first gather of each pass does not. A rank without layers (a
    layout that breaks `layers_pp`) is costed as one layer, so no 0/0 reaches the user."""
    layers = np.maximum(layers, 1.0)
    ag_l = param_ag / layers + latency_s
    rs_l = grad_rs / layers + latency_s
    fwd_l, bwd_l = mb_fwd / layers, mb_bwd / layers
    fwd = prefetched_layers_s(ag_l, fwd_l, layers, contention)
    bwd = prefetched_layers_s(ag_l + rs_l, bwd_l, layers, contention)
    return m * np.where(hide, fwd + bwd, layers * (2 * ag_l + rs_l))


def expert_share(dense_elems, expert_elems):
    """The expert parameters' share of a rank's parameters: the share of its DP bytes that the
    expert-DP group moves."""
    return np.where(dense_elems > 0, expert_elems / np.maximum(dense_elems, 1.0), 0.0)


def replica_groups(system, P, f_exp, grad_bytes, weight_bytes):
    """(gradient bytes, parameter bytes, ranks, bandwidth, latency) of each replica group: dense
    parameters over the dp·cp replicas (stride tp); expert parameters over expert-DP =
    tp·dp·cp/(etp·ep) (stride etp·ep, Megatron MoE parallel folding). The bytes on the wire
    (memory.py: 16-bit with --grad-reduce-in-bf16, FP8 weights with --fp8-param-gather) are split
    between the groups by the experts' share `f_exp` of the parameters."""
    t, c, dp = P.tp, P.cp, P.dp
    dp_bw, dp_lat = comm.group_link(system, dp * c, t)
    n_edp = t * dp * c / (P.etp * P.ep)
    edp_bw, edp_lat = comm.group_link(system, n_edp, P.etp * P.ep)
    return [((1 - f_exp) * grad_bytes, (1 - f_exp) * weight_bytes, dp * c, dp_bw, dp_lat),
            (f_exp * grad_bytes, f_exp * weight_bytes, n_edp, edp_bw, edp_lat)]


def collective_totals_s(groups, dp_impl, per_layer: bool = True, per_step: tuple[bool, bool] = (True, True)) -> dict:
    """Each DP collective's seconds summed over the replica groups (a group with nothing to
    reduce, no experts, issues none; they run one after the other on the same links, so they are
    overlapped once, as a sum): the gradient all-reduce (ZeRO-0), reduce-scatter and parameter
    all-gather (ZeRO-1/2), and ZeRO-3's per-layer ones (bandwidth part from the whole-stage
    volume, `lat3` the latency of one call; `per_layer` False: those left at 0). `per_step`:
    whether the all-reduce and the ZeRO-1/2 pair are wanted (False: left at 0, not costed)."""
    deepspeed = dp_impl == DP_IMPL_CODES["deepspeed"]
    out = dict.fromkeys(("grad_ar", "grad_rs", "param_ag", "rs3", "ag3", "lat3"), 0.0)
    for grad_bytes, weight_bytes, n, bw, lat in groups:
        issues = grad_bytes + weight_bytes > 0
        if per_step[0]:
            out["grad_ar"] = out["grad_ar"] + np.where(issues, comm.all_reduce_s(grad_bytes, n, bw, lat), 0.0)
        if per_step[1]:
            out["grad_rs"] = out["grad_rs"] + np.where(issues, comm.reduce_scatter_s(grad_bytes, n, bw, lat), 0.0)
            out["param_ag"] = out["param_ag"] + np.where(issues, comm.all_gather_s(weight_bytes, n, bw, lat), 0.0)
        if per_layer:
            bw3 = np.where(deepspeed, bw * DEEPSPEED_ZERO3_BW_EFFICIENCY, bw)
            out["rs3"] = out["rs3"] + np.where(issues, comm.reduce_scatter_s(grad_bytes, n, bw3, 0.0), 0.0)
            out["ag3"] = out["ag3"] + np.where(issues, comm.all_gather_s(weight_bytes, n, bw3, 0.0), 0.0)
            out["lat3"] = out["lat3"] + np.where(issues & (n > 1), (n - 1) * lat, 0.0)
    return out


def dp_comm_exposed_s(groups, z, dp_impl, m, mb_fwd, mb_bwd, p, v, layers, hide, overlapped,
                      mp_fwd=0.0, mp_bwd=0.0):
    """Exposed DP communication per step. `groups` lists (gradient bytes, parameter bytes, ranks,
    bandwidth, latency) of each replica group (dense parameters over dp·cp; expert parameters over
    expert-DP); their collectives run one after the other on the same links. `mp_fwd`/`mp_bwd`:
    a microbatch's model-parallel communication on other links than the DP collectives, which
    ZeRO-3's per-layer prefetch also hides behind.

    Rows of different ZeRO stages (`z` a column, (n, 1), as step_time passes it) are costed
    apart, each with its own stage's form only: every form is elementwise, so a row's seconds are
    the same digits, and no row pays for the three forms it does not use (the search calls this
    on hundreds of thousands of rows of every stage)."""
    args = (m, mb_fwd, mb_bwd, p, v, layers, hide, mp_fwd, mp_bwd)
    rows_of = _rows_by_stage(z, dp_impl, args, groups)
    if rows_of is None:
        return _exposed_s(groups, z, dp_impl, *args, overlapped)
    n = len(z)

    def take(x, rows):  # np.take: ~3x faster than x[rows] on (n, R) arrays
        if np.ndim(x) != 2 or len(x) != n:
            return x
        if x.shape[1] > 1 and x.strides[1] == 0:  # broadcast along the ranks: gather one column
            return np.broadcast_to(np.take(x[:, :1], rows, axis=0), (len(rows), x.shape[1]))
        return np.take(x, rows, axis=0)
    parts = [(rows, _exposed_s([tuple(take(x, rows) for x in g) for g in groups], z[rows], take(dp_impl, rows),
                               *(take(x, rows) for x in args), overlapped)) for rows in rows_of]
    out = np.empty((n, max(np.shape(part)[1] for _, part in parts)))
    for rows, part in parts:
        out[rows] = part
    return out


# Fewer rows than this are costed in one call: splitting a few rows (the fit's) costs more calls
# than it saves arithmetic.
SPLIT_ROWS = 64


def _rows_by_stage(z, dp_impl, args, groups) -> list[np.ndarray] | None:
    """The row indices of each ZeRO stage present, where the inputs are step_time's columns
    ((n, 1) or (n, R) arrays, or scalars), there are SPLIT_ROWS rows or more and more than one
    stage is present; else None (one call costs them all)."""
    z = np.asarray(z)
    if z.ndim != 2 or z.shape[1] != 1 or len(z) < SPLIT_ROWS:
        return None
    for x in (dp_impl, *args, *(x for g in groups for x in g)):
        if np.ndim(x) not in (0, 2) or (np.ndim(x) == 2 and len(x) not in (1, len(z))):
            return None
    stage = z[:, 0]
    present = [s for s in (0.0, 1.0, 2.0) if np.any(stage == s)]
    other = ~np.isin(stage, present)
    if len(present) + bool(other.any()) < 2:
        return None
    return [np.flatnonzero(stage == s) for s in present] + ([np.flatnonzero(other)] if other.any() else [])


def _exposed_s(groups, z, dp_impl, m, mb_fwd, mb_bwd, p, v, layers, hide, mp_fwd, mp_bwd, overlapped):
    """dp_comm_exposed_s on rows of any stages: each stage's form only where some row uses it."""
    deepspeed = dp_impl == DP_IMPL_CODES["deepspeed"]
    contention = np.where(deepspeed, DEEPSPEED_ZERO3_COMPUTE_CONTENTION,
                          np.where(dp_impl == DP_IMPL_CODES["torch-fsdp2"], FSDP_COMPUTE_CONTENTION,
                                   MEGATRON_FSDP_COMPUTE_CONTENTION))
    fsdp2 = (dp_impl == DP_IMPL_CODES["torch-fsdp2"]) & (z == 2)
    totals = collective_totals_s(groups, dp_impl, per_layer=bool(np.any(z == 3) or np.any(fsdp2)),
                                 per_step=(bool(np.any(z == 0)), bool(np.any((z == 1) | (z == 2)))))
    grad_ar, grad_rs, param_ag = totals["grad_ar"], totals["grad_rs"], totals["param_ag"]
    rs3, ag3, lat3 = totals["rs3"], totals["ag3"], totals["lat3"]
    # each stage's form only where some row uses it (every form is costed per rank: the search
    # calls this on hundreds of thousands of rows)
    none = 0.0
    z0 = np.where(hide, overlapped(grad_ar, mb_bwd, p, v), grad_ar) if np.any(z == 0) else none
    z1 = np.where(hide, overlapped(grad_rs, mb_bwd, p, v) + overlapped(param_ag, mb_fwd, p, v),
                  grad_rs + param_ag) if np.any(z == 1) else none
    z2 = zero2_exposed_s(grad_rs, param_ag, m, mb_fwd, mb_bwd, p, v, hide, overlapped) if np.any(z == 2) else none
    z3 = zero3_exposed_s(rs3, ag3, lat3, m, mb_fwd + mp_fwd, mb_bwd + mp_bwd, layers, hide, contention) \
        if np.any(z == 3) else none
    if np.any(fsdp2):
        z2 = np.where(fsdp2, fsdp_zero2_exposed_s(rs3, ag3, lat3, m, mb_fwd + mp_fwd, mb_bwd + mp_bwd, layers, hide,
                                                  contention), z2)
    return np.where(z == 0, z0, np.where(z == 1, z1, np.where(z == 2, z2, z3)))
