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
FSDP prefetches layer i+1's all-gather while layer i computes (FSDP2 implicit prefetch,
Megatron-FSDP's double buffer), so per layer only what exceeds that layer's compute shows, plus
the first layer's gather, which has nothing to hide behind. DeepSpeed ZeRO-3 runs the same
schedule through its own parameter coordinator, slower than NCCL ring bandwidth: its achieved
fraction is the named DEEPSPEED_ZERO3_BW_EFFICIENCY.
"""
from __future__ import annotations

import numpy as np

from planner.analytical import comm
from planner.plan import DP_IMPL_CODES

# Fraction of a collective's time that compute can hide when they overlap: NCCL kernels take SMs
# and HBM bandwidth from the GEMMs they run beside (FSDP2 / Megatron-FSDP overlap in practice is
# not free). 1 = perfect hiding. Fitted by bench/fsdp_moe_eval.py --fit on the FSDP rows
# (torchtitan, llm-foundry, Megatron-FSDP): 0.9, also after their kernels were costed
# (analytical/kernels.py; mean |log error| 0.077 at 0.9, 0.079 at 0.5): the rows barely move with
# it, their per-layer collectives hide behind compute almost everywhere.
FSDP_OVERLAP_FRACTION = 0.9
# DeepSpeed ZeRO-3's achieved fraction of ring bandwidth for its per-layer gathers / reduces
# (fitted by bench/fsdp_moe_eval.py --fit on the 6 DeepSpeed ZeRO-3 rows of measured_runs.yaml,
# Narayanan Table 2 baseline: mean |error| 30 % -> 12.5 %).
DEEPSPEED_ZERO3_BW_EFFICIENCY = 0.2


def zero2_exposed_s(grad_rs, param_ag, m, mb_fwd, mb_bwd, p, v, hide, overlapped):
    """ZeRO-2: a gradient reduce-scatter after every microbatch's backward (each hidden behind
    that backward as far as it can be), one parameter all-gather per step."""
    hidden = (np.maximum(m - 1, 0) * np.maximum(0.0, grad_rs - mb_bwd)
              + overlapped(grad_rs, mb_bwd, p, v) + overlapped(param_ag, mb_fwd, p, v))
    return np.where(hide, hidden, m * grad_rs + param_ag)


def zero3_exposed_s(grad_rs, param_ag, latency_s, m, mb_fwd, mb_bwd, layers, hide, overlap_fraction):
    """ZeRO-3 / FSDP: per layer and microbatch an all-gather before forward, another before
    backward and a reduce-scatter after it; with prefetch each hides behind one layer's compute
    (up to `overlap_fraction` of it), the first gather of each pass does not. A rank without
    layers (a layout that breaks `layers_pp`) is costed as one layer, so no 0/0 reaches the user."""
    layers = np.maximum(layers, 1.0)
    ag_l = param_ag / layers + latency_s
    rs_l = grad_rs / layers + latency_s
    fwd_l, bwd_l = mb_fwd / layers, mb_bwd / layers
    fwd = ag_l + (layers - 1) * np.maximum(0.0, ag_l - overlap_fraction * fwd_l)
    bwd = ag_l + rs_l + (layers - 1) * np.maximum(0.0, ag_l + rs_l - overlap_fraction * bwd_l)
    return m * np.where(hide, fwd + bwd, layers * (2 * ag_l + rs_l))


def dp_comm_exposed_s(groups, z, dp_impl, m, mb_fwd, mb_bwd, p, v, layers, hide, overlapped):
    """Exposed DP communication per step. `groups` lists (gradient bytes, parameter bytes, ranks,
    bandwidth, latency) of each replica group (dense parameters over dp·cp; expert parameters over
    expert-DP); their collectives run one after the other on the same links."""
    deepspeed = dp_impl == DP_IMPL_CODES["deepspeed"]
    total = 0.0
    for grad_bytes, weight_bytes, n, bw, lat in groups:
        bw3 = np.where(deepspeed, bw * DEEPSPEED_ZERO3_BW_EFFICIENCY, bw)
        grad_ar = comm.all_reduce_s(grad_bytes, n, bw, lat)
        grad_rs = comm.reduce_scatter_s(grad_bytes, n, bw, lat)
        param_ag = comm.all_gather_s(weight_bytes, n, bw, lat)
        z0 = np.where(hide, overlapped(grad_ar, mb_bwd, p, v), grad_ar)
        z1 = np.where(hide, overlapped(grad_rs, mb_bwd, p, v) + overlapped(param_ag, mb_fwd, p, v),
                      grad_rs + param_ag)
        z2 = zero2_exposed_s(grad_rs, param_ag, m, mb_fwd, mb_bwd, p, v, hide, overlapped)
        # per-layer collectives: bandwidth part from the whole-stage volume, latency per call
        rs3 = comm.reduce_scatter_s(grad_bytes, n, bw3, 0.0)
        ag3 = comm.all_gather_s(weight_bytes, n, bw3, 0.0)
        lat3 = np.where(n > 1, (n - 1) * lat, 0.0)
        z3 = zero3_exposed_s(rs3, ag3, lat3, m, mb_fwd, mb_bwd, layers, hide, FSDP_OVERLAP_FRACTION)
        # a group with nothing to reduce (no experts) issues no collective
        total = total + np.where(grad_bytes + weight_bytes > 0, np.where(z == 0, z0, np.where(z == 1, z1, np.where(z == 2, z2, z3))), 0.0)
    return total
