"""Step time of many plans at once (numpy columns); seconds unless the name says otherwise.

Structure (Narayanan et al. SC'21 §2-3): each pipeline stage runs m microbatches of
forward + backward (+ recompute) over its l/p layers; 1F1B adds a bubble of (p−1)/v stage-times
(§2.2.1-2.2.2: bubble fraction (p−1)/(v·m)); the last stage also runs the LM head. Data-parallel
gradient reduction, optimizer step and offload traffic are added where they are not hidden.
"""
from __future__ import annotations

import sys
import types

import numpy as np

from hardware import arch
from hardware.spec import SystemSpec
from planner.analytical import comm, data_parallel, flops, kernels, layer_kinds, memory, named, precision
from planner.analytical.memory import RANK_DP_PREFIX, at_rank
from planner.analytical.offload import activation_offload_exposed_s
from planner.analytical.plans import (PlanArrays, module_selected, rank_argmax, rank_max, sequence_parallel_on,
                                     sum_over_ranks, with_every_rank)
from planner.model import ModelSpec
from planner.pipeline_layout import vp_microbatch_group
from planner.plan import MOE_DISPATCHER_CODES, JobSpec

# Fraction of TP communication left exposed. Without --tp-comm-overlap the forward all-reduces
# block; in backward Megatron overlaps the input-gradient all-reduce with the weight-gradient
# GEMM (Narayanan et al. SC'21 §4.2 / async TP all-reduce). With TE's userbuffer GEMM overlap
# most of it hides; 0.3 is our assumption, not a measurement.
TP_EXPOSED_FWD = 1.0
TP_EXPOSED_BWD = 0.5
TP_EXPOSED_WITH_OVERLAP = 0.3
# Backward of a GEMM is two GEMMs of the same size (input and weight gradients).
BACKWARD_FACTOR = 2.0
# Adam step per parameter, memory-bound: read the fp32 gradient, read and write the master copy
# and both moments, write the 16-bit weight: 4 + 2·(4 + 8) + 2 = 30 B with fp32 moments, 22 B
# with bf16 ones (JobSpec.adam_moments).
OPTIMIZER_GRAD_READ_BYTES = 4.0


def optimizer_step_bytes_per_param(job: JobSpec) -> float:
    bpp = job.bytes_per_param
    return OPTIMIZER_GRAD_READ_BYTES + 2.0 * bpp.optimizer_total + bpp.weights


# Element-wise bytes per token per layer, forward, in units of hidden (norms, residual adds,
# dropout, bias) and of the MLP width (activation function read + write); 2-byte elements.
ELEMENTWISE_PASSES_HIDDEN = 12.0
ELEMENTWISE_PASSES_FFN = 2.0
# Cross-entropy: logits cast to fp32, max, exp-sum, normalise: ~3 passes forward.
CROSS_ENTROPY_PASSES = 3.0
# --cross-entropy-loss-fusion (native impl) runs the same three steps as fused kernels. Bytes per
# fp32 logit element moved in forward, counted from Megatron-LM core/tensor_parallel/cross_entropy.py
# (cast 2+4, max 4, subtract 4+4, exp 4+4, sum 4, divide 4+4 = 38) and core/fusions/
# fused_cross_entropy.py (cast+max 2+4, subtract+exp+sum 4+4, divide 4+4 = 22): the fused
# share of the element-wise cross-entropy time in forward (the backward's one gradient kernel is
# the same in both files). The fused path keeps the fp32 softmax, so memory is unchanged.
CROSS_ENTROPY_FUSED_SHARE = 22.0 / 38.0
# Unfused attention writes and re-reads the s×s scores (scale/mask/softmax, dropout): 4 passes.
UNFUSED_SCORE_PASSES = 4.0
# One layer norm forward reads its input and writes its output (2 of ELEMENTWISE_PASSES_HIDDEN's
# passes; the per-token statistics are negligible): what `layernorm` recompute reruns per norm.
LAYERNORM_PASSES = 2.0


def gemm_efficiency(max_eff: float, half_dim: float, min_dim: np.ndarray) -> np.ndarray:
    """Achieved/peak of a GEMM whose smallest dimension is `min_dim` (saturating curve)."""
    return max_eff * min_dim / (min_dim + half_dim)


def _gemm_time(flop_count, min_dim, peak, eff, dtype):
    return flop_count / (peak * eff.compute_rate
                         * gemm_efficiency(eff.matmul_ceiling(dtype), eff.matmul_half(dtype), min_dim))


def overlapped_collective_s(total_s, window_s, p, v):
    """Exposed part of a DP collective that Megatron overlaps bucket by bucket (gradient
    reduce with --overlap-grad-reduce behind the backward; parameter gather with
    --overlap-param-gather behind the forward, the same schedule mirrored).

    Non-interleaved: the stage's buckets overlap its last microbatch's backward (or first
    forward), one microbatch-time `window_s`: exposed total − window.
    Interleaved (v model chunks, chunk-time c = window/v): Megatron launches chunk k's share
    (total/v) as soon as its last microbatch's backward is done (schedules.py
    forward_backward_pipelining_with_interleaving, grad_sync_func; param_sync_func mirrors it for
    the next step's forwards). The schedule runs microbatches in groups of p (get_schedule_table),
    and the last group runs its backward chunk by chunk in reverse, p chunk-steps each, so chunk k
    is released (k·p + 1) chunk-times before the end of the rank's compute (k = 0: the final
    chunk-step, whose buckets overlap it). The shares then run one after the other on the same
    links: the last one finishes max over k of (k+1)·total/v − (k·p + 1)·c after the end, which,
    linear in k, peaks at k = 0 or k = v−1."""
    chunk = window_s / v
    return np.maximum(0.0, np.maximum(total_s / v - chunk, total_s - ((v - 1) * p + 1) * chunk))


def attention_gemm_fwd_s(model: ModelSpec, system: SystemSpec, job: JobSpec, P: PlanArrays) -> np.ndarray:
    """The attention's QKV and output-projection GEMMs, one microbatch, one GPU, forward (in the
    attention's own dtype under a per-module recipe)."""
    eff = system.accelerator.efficiency
    dtype = precision.module_dtype(job, "attention")
    peak_gemm = system.accelerator.peak(precision.gemm_peak_key(dtype))
    h, t = model.hidden, P.tp
    tokens = P.micro_batch * model.seq_length / P.cp
    qkv_w = flops.qkv_out_width(model)
    out_w = flops.attention_out_width(model)  # = h unless head_dim is set apart (Qwen3) or MLA
    return (
        _gemm_time(2 * tokens * h * qkv_w / t, np.minimum(np.minimum(tokens, h), qkv_w / t), peak_gemm, eff, dtype)
        + _gemm_time(2 * tokens * out_w * h / t, np.minimum(np.minimum(tokens, out_w / t), h), peak_gemm, eff, dtype)
    )


def layer_mlp_quantised_elements(model: ModelSpec, job: JobSpec) -> float:
    """precision.mlp_quantised_elements of the repeated layer's MLP (a MoE model's: routed experts
    and shared experts on its rows), per token, forward + backward."""
    gated = 2 if model.activation == "swiglu" else 1
    mlp_w = flops.mlp_width(model)
    topk = model.moe.top_k if model.moe else 1
    shared_ffn = model.moe.shared_experts * model.shared_expert_ffn_hidden if model.moe and model.moe.shared_experts else 0
    return precision.mlp_quantised_elements(model.hidden, mlp_w, mlp_w / gated, topk, fused_experts(model, job),
                                            gated * shared_ffn, shared_ffn,
                                            model.moe.latent_size if model.moe else None)


def quantise_s_per_element(system: SystemSpec, job: JobSpec, group: str | None, tokens, t, hbm_bytes_per_s):
    """Seconds per quantised element per token of one layer's scaling passes (precision.py), in
    the module group's dtype (None: the job's), charged as a third to the forward so that
    forward + BACKWARD_FACTOR·forward carries all of it."""
    dtype = precision.module_dtype(job, group) if group else job.dtype
    per_element = kernels.quantise_bytes_per_element(dtype, job.kernels, arch.non_tn_fp8_gemm(system.accelerator))
    return per_element * tokens / t / (1 + BACKWARD_FACTOR) / hbm_bytes_per_s


def attention_core_fwd_s(model: ModelSpec, system: SystemSpec, job: JobSpec, P: PlanArrays) -> np.ndarray:
    """The attention core (softmax(QKᵀ)V; with unfused attention its s×s score passes; with
    context parallelism the ring steps' output merges), one microbatch, one GPU, forward."""
    acc = system.accelerator
    eff = acc.efficiency
    # The attention core stays in 16 bits unless --fp8-dot-product-attention: then cuDNN's FP8
    # kernel runs at the FP8 peak with the same achieved fraction (Shah et al. 2024,
    # FlashAttention-3, Figs. 5 and 7: cuDNN head-dim 256 at 4k, FP8 1087 / BF16 581 TFLOP/s
    # non-causal, 1015 / 483 causal, i.e. 1.9-2.1x, the 2x of the peaks)
    peak_attn = acc.peak(precision.attention_peak_key(job.dtype, job.fp8_attention))
    t = P.tp
    tokens = P.micro_batch * model.seq_length / P.cp
    hbm = acc.hbm_bandwidth_bytes_per_s * eff.hbm_efficiency
    # Attention core at its own ceiling; causal fused kernels skip the masked half (the same
    # count the hardware-FLOP total uses).
    core_flops = flops.executed_attention_core_flops_per_token(model, job.flash_attention) * tokens / t
    # the kernel sees the local query chunk: with context parallelism each ring step is s/cp long
    chunk = model.seq_length / P.cp
    # cuDNN fused (TE) or FlashAttention-2 (torch stacks; TE with NVTE_FUSED_ATTN=0)
    attn_kernel = "flash-attn" if job.te_flash_attention else "triton-flash" if job.triton_flash_attention \
        else job.kernels
    attn_max, attn_half = eff.attention_curve(attn_kernel)
    # the head-width factor measured for cuDNN's fused kernel (kernels.py), not the unfused path
    width = kernels.attention_head_dim_factor(model, "cudnn") if attn_kernel == "te" and job.flash_attention else 1.0
    attention = core_flops / (peak_attn * eff.compute_rate * attn_max * width * chunk / (chunk + attn_half))
    # the unfused s×s score passes belong to the attention core (selective recompute reruns them)
    score_bytes = 0.0 if job.flash_attention else \
        2.0 * UNFUSED_SCORE_PASSES * tokens * model.seq_length * model.heads / t
    return attention + score_bytes / hbm + cp_output_correction_s(model, P, hbm)


# torchtitan's per-op selective activation checkpointing, the torch stacks' "selective"
# (torchtitan models/llama3/infra/parallelize.py _save_list and _custom_policy, @820504e): in each
# layer's checkpoint it saves the outputs of aten.mm (every second one recomputed, counting the
# layer's mms in forward order), of SDPA and of the TP reduce-scatters, and reruns every other op.
# A Llama block's mms run wq, wk, wv, wo, w1, w3, w2: wk, wo and w3 are rerun, i.e. half the
# attention projections' FLOPs (wk/wv and wq/wo are pairs of one size) and one of the SwiGLU
# MLP's three (one of a GeLU MLP's two), plus every element-wise op; the attention core is not.
OP_SAC_ATTENTION_PROJ_RERUN = 0.5


def op_sac_mlp_rerun(model: ModelSpec) -> float:
    """Share of a dense MLP's GEMM FLOPs torchtitan's per-op policy reruns: w3 of (w1, w3, w2),
    or w2 of (w1, w2) without a gate (the mm count's even positions)."""
    return 1.0 / 3.0 if model.activation == "swiglu" else 0.5


def kernel_stack_system(system: SystemSpec, job: JobSpec) -> SystemSpec:
    """`system` with the GEMM ceiling of the job's kernel stack: a torch stack's
    `matmul_max_torch` where the accelerator has one (idempotent)."""
    eff = system.accelerator.efficiency
    if job.kernels == "te" or eff.matmul_max_torch is None or eff.matmul_max_torch == eff.matmul_max:
        return system
    acc = system.accelerator.model_copy(update={"efficiency": eff.model_copy(update={"matmul_max": eff.matmul_max_torch})})
    return system.model_copy(update={"accelerator": acc})


def layer_compute_fwd_s(model: ModelSpec, system: SystemSpec, job: JobSpec, P: PlanArrays) -> dict:
    """One layer, one microbatch, one GPU, forward: GEMMs, attention core, element-wise. A hybrid
    stack's layer is the mean of its blocks (planner.analytical.hybrid)."""
    system = kernel_stack_system(system, job)
    if model.hybrid_pattern:
        from planner.analytical import hybrid
        return hybrid.mean_layer_fwd_s(model, system, job, P)
    acc = system.accelerator
    eff = acc.efficiency
    peak_gemm = acc.peak(precision.gemm_peak_key(job.dtype))
    h, t = model.hidden, P.tp
    tokens = P.micro_batch * model.seq_length / P.cp
    qkv_w = flops.qkv_out_width(model)
    attn_gemm = attention_gemm_fwd_s(model, system, job, P)
    hbm = acc.hbm_bandwidth_bytes_per_s * eff.hbm_efficiency
    # an op-by-op kernel's bandwidth (kernels.STREAMING_HBM_EFFICIENCY)
    stream = acc.hbm_bandwidth_bytes_per_s * kernels.STREAMING_HBM_EFFICIENCY
    sp = sequence_parallel_on(P)
    te = job.kernels == "te"
    torch_hidden_bytes, torch_ffn_bytes = (0.0, 0.0) if te else kernels.torch_elementwise_bytes(model, job.kernels)
    act_bytes = 2.0 * ELEMENTWISE_PASSES_FFN if te else torch_ffn_bytes
    # the torch stacks' element-wise bytes are counted kernel by kernel, each a streaming pass
    # (kernels.STREAMING_HBM_EFFICIENCY); TE's lump keeps the fitted hbm_efficiency
    elem_hbm = hbm if te else stream
    # The MLP of the repeated layer: the MoE layer of a MoE model, else the dense MLP. A MoE
    # model's leading dense layers are costed as their own kind (layer_kinds, per_layer_terms).
    if model.moe:
        moe = moe_mlp_fwd_s(model, system, job, P)
        mlp_gemm, mlp_elem = moe["gemm"], moe["elementwise"]
    else:
        mlp_gemm, mlp_elem = dense_mlp_fwd_s(model, model.ffn_hidden, tokens, t, peak_gemm, eff, job.dtype, elem_hbm,
                                             act_bytes)
    gemm = attn_gemm + mlp_gemm
    hidden_bytes = 2.0 * ELEMENTWISE_PASSES_HIDDEN * h if te else torch_hidden_bytes
    elem_bytes = tokens * hidden_bytes / np.where(sp, t, 1.0)
    # a YaRN RoPE runs unfused under Megatron (kernels.UNFUSED_ROPE_BYTES): op-by-op kernels on the
    # tensor-parallel shard of the heads, each streaming
    rope_s = tokens * kernels.unfused_rope_extra_bytes_per_token(model, job.kernels) / t / stream
    # Low-precision scaling passes (precision.py), forward + backward per layer, each module
    # group in its own dtype.
    quant_s = (quantise_s_per_element(system, job, None, tokens, t, hbm) * layer_mlp_quantised_elements(model, job)
               + quantise_s_per_element(system, job, "attention", tokens, t, hbm)
               * precision.attention_quantised_elements(h, qkv_w)
               + quantise_s_per_element(system, job, "latent_proj", tokens, t, hbm)
               * precision.latent_quantised_elements(h, model.moe.latent_size if model.moe else None))
    # per-layer launch/host overhead, not paid when CUDA graphs capture the layer's launches
    overhead_s = 0.0 if kernels.layer_launches_captured(model.moe is not None, job) else eff.layer_overhead_us * 1e-6
    # Forward pieces that selective recompute reruns (`selective_recompute_s`), per layer of their
    # kind: a dense MLP, a MoE MLP, its parts, MLA's up-projections, one separate norm.
    moe_parts = moe if model.moe else {"gemm": 0.0, "elementwise": 0.0, "expert_act_s": 0.0, "shared_expert_s": 0.0}
    up_flops = flops.mla_up_proj_flops_per_token(model) * tokens / t
    # smallest GEMM dimension: the tokens or the latent rank (the contraction)
    up_min = np.minimum(tokens, min(r for r in (model.mla.q_lora_rank, model.mla.kv_lora_rank) if r)) \
        if model.mla else 1.0
    elementwise = elem_bytes / elem_hbm + rope_s + quant_s + mlp_elem + overhead_s
    pieces = {
        "dense_mlp_s": 0.0 if model.moe else mlp_gemm + mlp_elem,  # the repeated layer's, if dense
        # what torchtitan's per-op policy reruns of a dense layer (OP_SAC_ATTENTION_PROJ_RERUN)
        "op_sac_rerun_s": 0.0 if model.moe else (OP_SAC_ATTENTION_PROJ_RERUN * attn_gemm
                                                 + op_sac_mlp_rerun(model) * mlp_gemm + elementwise),
        "moe_mlp_s": moe_parts["gemm"] + moe_parts["elementwise"],
        "moe_act_s": moe_parts["expert_act_s"], "shared_expert_s": moe_parts["shared_expert_s"],
        "mla_up_proj_s": _gemm_time(up_flops, up_min, peak_gemm, eff, job.dtype) if model.mla else 0.0,
        "norm_s": 2.0 * tokens * LAYERNORM_PASSES * h / np.where(sp, t, 1.0) / hbm,
    }
    return {"gemm": gemm, "attention": attention_core_fwd_s(model, system, job, P), "elementwise": elementwise,
            "wgrad_extra": moe["wgrad_extra_s"] if model.moe else 0.0, **pieces}


def dense_mlp_fwd_s(model: ModelSpec, ffn, rows, t, peak, eff, dtype, hbm_bytes_per_s,
                    act_bytes: float = 2.0 * ELEMENTWISE_PASSES_FFN):
    """(GEMM s, element-wise s) of a dense MLP of width `ffn` over `rows` tokens, sharded over t:
    up (+gate) and down GEMMs, and the activation function's `act_bytes` per ffn element
    (ELEMENTWISE_PASSES_FFN 2-byte passes with fused kernels; kernels.py for the torch stacks)."""
    h = model.hidden
    up_w = (2 if model.activation == "swiglu" else 1) * ffn
    gemm = (_gemm_time(2 * rows * h * up_w / t, np.minimum(np.minimum(rows, h), up_w / t), peak, eff, dtype)
            + _gemm_time(2 * rows * ffn * h / t, np.minimum(np.minimum(rows, ffn / t), h), peak, eff, dtype))
    return gemm, rows * act_bytes * ffn / t / hbm_bytes_per_s


# --- MoE layer mechanisms (Megatron-Core moe/: router.py, token_dispatcher.py, experts.py) ----
# Achieved / link bandwidth of NCCL all-to-all (many small messages, no ring pipelining) relative
# to the ring collectives the network tier's efficiency describes. Named; 1.0 = the tier's own
# efficiency (bench/fsdp_moe_eval.py --fit).
A2A_BW_EFFICIENCY = 1.0
# Share of the ideally hideable expert all-to-all that the combined-1F1B overlap hides (1.0 =
# max(compute, communication)). Named; fitted by bench/fsdp_moe_eval.py jointly with
# A2A_BW_EFFICIENCY and EXPERT_GEMM_HOST_US on every MoE row (the Bridge recipes switch the
# overlap on and off release by release): 0.9. Checks: Bridge Qwen3-235B 256 H100 25.09 -> 25.11
# (overlap switched on) predicted 0.760x, measured 0.764x; the ModelZoo "+1f1b overlap" pair
# predicted 0.684x, measured 0.893x (that pair alone gave 0.3); with the four pairs of
# `a2a_overlap_exposed_s` (2026-11-28) 0.703x, and the refit keeps 0.9.
A2A_OVERLAP_EFFICIENCY = 0.9
# The MoE constants fitted on measured runs (bench/fsdp_moe_eval.py --fit in sample; planner.fit
# refits them without each family for `planner validate --lofo`). EXPERT_GEMM_HOST_US is not one:
# a kernel measurement, which no training run sets, in sample or LOFO.
MOE_FITTED_PARAMETERS = ("A2A_OVERLAP_EFFICIENCY",)


def moe_parameters(**values: float):
    """Context: the model with some MOE_FITTED_PARAMETERS set to `values`."""
    return named.overridden(sys.modules[__name__], MOE_FITTED_PARAMETERS, values)


# Router: fp32 logits, softmax (or sigmoid) + top-k + the aux-loss statistics: ~4 passes over
# tokens×E fp32 (router.py: TopKRouter.routing).
ROUTER_PASSES = 4.0
# Host (CPU) microseconds to issue one local expert's GEMM with its per-expert bookkeeping
# (quantisation, scale allocation and swizzle kernels in low precision). Transformer Engine's
# GroupedLinear, which Megatron's TEGroupedMLP runs, launches one cuBLAS GEMM per expert
# ("MXFP8 Grouped GEMM, implemented using multi-stream + cuBLAS": Megatron-LM DeepSeek-V3 GB200
# guide @1d9edcf8, §1 item 3). The routed experts are the part partial CUDA graphs cannot capture
# (dynamic shapes, guide §2.3), and the device-host sync that sizes them (tokens per expert,
# guide §3.1) drains the GPU queue first, so host time beyond the experts' GPU time is exposed:
# the guide's "CPU overhead / host boundedness" (§2).
# Measured, not fitted: one GEMM per expert issued in a loop on an H100 host takes a median 49 µs
# of host time in bf16 and 52 µs in fp8 (planner/data/h100_grouped_gemm.csv, 88 shapes each,
# p10-p90 26-78 µs; bench/gpu/moe_kernels_table.py): 50. A kernel measurement, so `planner
# validate --lofo` keeps it for every family as it keeps the other measured kernels. Fitted end
# to end on the MoE rows it would be 58 µs (golden section), a valley the eager x86 rows (H100, DGX
# B200: predicted fast when host-bound) and the one host-bound GB200 row with partial CUDA graphs
# (ModelZoo BF16, predicted slow) pull apart; refitted without Qwen3 it went to ~61 and that GB200
# row to +32 % (docs/history.md, 2026-11-29 seventeenth session).
EXPERT_GEMM_HOST_US = 50.0
# Permutation and unpermutation (moe_utils.permute / unpermute): each reads and writes every
# routed row once; unpermute also reads the probabilities (negligible). 2 ops × (read + write).
PERMUTE_PASSES = 4.0


def routed_tokens_per_rank(model: ModelSpec, P: PlanArrays) -> np.ndarray:
    """Tokens of one microbatch that one GPU routes: the tensor-parallel group's tokens, split
    over tp by sequence parallelism (Megatron's MoE layer routes each SP shard on its own)."""
    sp = sequence_parallel_on(P)
    return P.micro_batch * model.seq_length / P.cp / np.where(sp, P.tp, 1.0)


def moe_load_imbalance(model: ModelSpec, job: JobSpec, P: PlanArrays) -> np.ndarray:
    """Rows the busiest expert-parallel rank receives over the mean, (n,).

    Two parts, multiplied: the job's routing skew (`JobSpec.moe_load_imbalance`; 1.0 = balanced,
    as NVIDIA's benchmarks force with --moe-router-force-load-balancing) and the sampling spread
    of routing itself: a rank's received rows are ~Poisson with mean μ = routed tokens·top_k, and
    the largest of ep such counts exceeds μ by about sqrt(2·ln ep·μ) (expected maximum of n
    Gaussians, e.g. Cramér 1946 §28.6). A capacity factor drops rows above cf × the mean
    (GShard §2.2), capping the product."""
    mean_rows = routed_tokens_per_rank(model, P) * model.moe.top_k
    spread = 1.0 + np.sqrt(2.0 * np.log(np.maximum(P.ep, 1.0)) / np.maximum(mean_rows, 1.0))
    # at ep 1 every rank holds every expert and computes all its routed rows: no rank is busier
    imbalance = np.where(P.ep > 1, job.moe_load_imbalance, 1.0) * spread
    cf = model.moe.capacity_factor
    return imbalance if cf is None else np.minimum(imbalance, max(cf, 1.0))


def moe_mlp_fwd_s(model: ModelSpec, system: SystemSpec, job: JobSpec, P: PlanArrays) -> dict:
    """One MoE layer's MLP, one microbatch, one GPU, forward, seconds by mechanism:
    router GEMM (h×E) + softmax/top-k; permute/unpermute (memory-bound); the routed experts'
    grouped GEMM at the efficiency of its per-expert row count; shared experts (a dense MLP on
    every token, attention tp); the activation passes. Load imbalance scales what waits on the
    busiest expert. Dispatch/combine communication is in `moe_dispatch_s`."""
    acc = system.accelerator
    eff = acc.efficiency
    peak = acc.peak(precision.gemm_peak_key(job.dtype))
    hbm = acc.hbm_bandwidth_bytes_per_s * eff.hbm_efficiency
    stream = acc.hbm_bandwidth_bytes_per_s * kernels.STREAMING_HBM_EFFICIENCY  # op-by-op kernels
    h, t, E, k = model.hidden, P.tp, model.moe.num_experts, model.moe.top_k
    tokens = P.micro_batch * model.seq_length / P.cp  # per tensor-parallel group
    routed_tokens = routed_tokens_per_rank(model, P)
    imbalance = moe_load_imbalance(model, job, P)
    # router: a tokens×h by h×E GEMM, its fp32 softmax/top-k element-wise
    router = _gemm_time(2 * routed_tokens * h * E, np.minimum(np.minimum(routed_tokens, h), E), peak, eff, job.dtype) \
        + ROUTER_PASSES * 4.0 * routed_tokens * E / hbm
    # LatentMoE (ModelSpec.moe.latent_size): the routed rows are `w` wide from the projection
    # h -> latent before the dispatch to the projection back after the combine (Megatron-Core
    # moe_layer.py fc1/fc2 latent projections), two GEMMs over the group's tokens
    w = model.expert_hidden
    if model.moe.latent_size:
        latent_dtype = precision.module_dtype(job, "latent_proj")
        router = router + 2 * _gemm_time(2 * routed_tokens * h * w, np.minimum(np.minimum(routed_tokens, h), w),
                                         acc.peak(precision.gemm_peak_key(latent_dtype)), eff, latent_dtype)
    permute = PERMUTE_PASSES * 2.0 * routed_tokens * k * w / hbm
    # the experts' FC2 bias, added eagerly per expert on the rows the busiest rank receives
    # (kernels.EXPERT_FC2_BIAS_BYTES), streaming kernels
    fc2_bias = tokens * k * model.expert_hidden / t * kernels.expert_fc2_bias_bytes(model, job.kernels,
                                                                                     fused_experts(model, job)) / stream
    # experts: one GPU holds E/ep experts, 1/etp of each; rows per local expert per microbatch =
    # tokens·top_k·etp·ep/(E·t) (= tokens·top_k·ep/E at etp = tp); its FLOPs are 1/t of the
    # tensor-parallel group's routed work whatever the folding.
    ffn, up_w = model.expert_ffn_hidden, flops.mlp_width(model)
    rows_per_expert = tokens * k * P.etp * P.ep / (E * t)
    expert_gemm = (_gemm_time(2 * tokens * k * w * up_w / t, np.minimum(np.minimum(rows_per_expert, w), up_w / P.etp),
                              peak, eff, job.dtype)
                   + _gemm_time(2 * tokens * k * ffn * w / t, np.minimum(np.minimum(rows_per_expert, ffn / P.etp), w),
                                peak, eff, job.dtype))
    # the activation pass; fused into the grouped GEMMs' epilogues by TE's op fuser
    expert_act = 0.0 if fused_experts(model, job) else 2.0 * tokens * k * ELEMENTWISE_PASSES_FFN * ffn / t / hbm
    # a clamped gated activation (GPT-OSS) clamps eagerly in front of the fused kernel
    # (kernels.CLAMP_GLU_BYTES), streaming kernels; part of the activation that moe_act recompute reruns
    expert_act = expert_act + tokens * k * kernels.clamp_glu_bytes(model, job.kernels, fused_experts(model, job)) \
        * ffn / t / stream
    shared_act_bytes, shared_hbm = 2.0 * ELEMENTWISE_PASSES_FFN, hbm
    if job.kernels != "te":
        # the torch stacks run torchtitan's MoE op by op (kernels.torch_moe_bytes), each kernel a
        # streaming pass: its routing glue and permutations replace Megatron's permute/unpermute
        # passes, the experts' eager SwiGLU the fused activation lump
        tb = kernels.torch_moe_bytes(model, job.kernels)
        permute = (routed_tokens * k * tb["routed_row"] + routed_tokens * tb["token"]) * h / stream \
            + imbalance * routed_tokens * k * tb["received_row"] * h / stream
        expert_act = 0.0 if fused_experts(model, job) else tokens * k * tb["expert_act"] * ffn / t / stream
        shared_act_bytes, shared_hbm = tb["shared_act"], stream
    host_exposed = expert_host_exposed_s(model, job, P, imbalance * (expert_gemm + expert_act + fc2_bias))
    wgrad_extra = expert_wgrad_memory_excess_s(model, job, P, rows_per_expert * imbalance,
                                               imbalance * expert_gemm, hbm)
    shared_gemm, shared_elem = (0.0, 0.0)
    if model.moe.shared_experts:
        shared_gemm, shared_elem = dense_mlp_fwd_s(model, model.moe.shared_experts * model.shared_expert_ffn_hidden,
                                                   tokens, t, peak, eff, job.dtype, shared_hbm, shared_act_bytes)
    return {"gemm": imbalance * expert_gemm + shared_gemm + router,
            "elementwise": imbalance * (expert_act + fc2_bias) + permute + shared_elem + host_exposed,
            "wgrad_extra_s": wgrad_extra, "expert_host_exposed_s": host_exposed,
            "router_s": router, "permute_s": permute, "expert_gemm_s": imbalance * expert_gemm,
            "expert_act_s": imbalance * expert_act, "expert_bias_s": imbalance * fc2_bias,
            "shared_expert_s": shared_gemm + shared_elem}


def expert_host_exposed_s(model: ModelSpec, job: JobSpec, P: PlanArrays, expert_gpu_s) -> np.ndarray:
    """Forward seconds one MoE layer waits on the host issuing its local experts' GEMMs
    (EXPERT_GEMM_HOST_US each, FC1 and FC2): the excess over the experts' GPU time. None with a
    full-iteration CUDA graph (no launches), the fused grouped MLP (one kernel for all experts) or
    the torch stacks: torchtitan runs each expert projection as one torch._grouped_mm over all
    local experts (torchtitan/models/moe.py _run_experts_grouped_mm), with no per-expert host loop.
    The backward issues dgrad + wgrad per GEMM against twice the GPU time: BACKWARD_FACTOR.
    Measured on an H100 (planner/data/h100_grouped_gemm.csv, bench/kernel_fit.py --moe): one
    torch.matmul per expert issues in 26-78 us of host time (p10-p90, median 49); at 128-256 rows
    per expert and 16 or more experts the loop runs at the host's pace, 1.3-17x (median 4.3x) the
    grouped kernel's time."""
    if job.full_iteration_cuda_graph or fused_experts(model, job) or job.kernels != "te":
        return np.zeros(np.shape(P.ep))
    local_experts = model.moe.num_experts / P.ep
    host_s = local_experts * 2.0 * EXPERT_GEMM_HOST_US * 1e-6
    return np.maximum(0.0, host_s - expert_gpu_s)


def fused_experts(model: ModelSpec, job: JobSpec) -> bool:
    """Whether the routed experts run TE's fused grouped MLP (JobSpec.fused_grouped_mlp)."""
    return bool(job.fused_grouped_mlp and model.moe)


def expert_wgrad_memory_excess_s(model: ModelSpec, job: JobSpec, P: PlanArrays, rows: np.ndarray,
                                 wgrad_compute_s: np.ndarray, hbm_bytes_per_s: float) -> np.ndarray:
    """Backward time the local experts' weight-gradient GEMMs spend beyond their compute, one MoE
    layer, one microbatch: Megatron accumulates wgrad straight into the main gradient
    (--gradient-accumulation-fusion, on by default; TE fuse_wgrad_accumulation), so each
    expert's dW (h × FFN-width) is read and written every microbatch, beside its operands, in the
    gradient buffer's dtype: fp32, or bf16 where the gradients are reduced in bf16
    (grad_reduce_in_fp32=False: Megatron-Core DistributedDataParallel allocates main_grad in bf16).
    By the roofline (Williams, Waterman & Patterson 2009, CACM 52(4)) the GEMM takes the larger of
    its compute and its memory time; its intensity is about rows/4 FLOP/byte, below H100's ridge
    (~300 bf16) when an expert gets few hundred rows (fine-grained experts at small ep). `rows`
    per local expert on the busiest rank; `wgrad_compute_s` = the forward GEMM time (wgrad does
    the same FLOPs)."""
    h, E = model.expert_hidden, model.moe.num_experts  # the experts' row width (LatentMoE: latent)
    ffn, up_w = model.expert_ffn_hidden, flops.mlp_width(model)
    local_experts = E / P.ep
    b = precision.GEMM_OPERAND_BYTES[job.dtype]
    main_grad_rw = 2.0 * memory.grad_bytes_per_elem(job, P)[0]  # read + write per element
    fc1 = rows * (h + up_w / P.etp) * b + main_grad_rw * h * up_w / P.etp
    fc2 = rows * (ffn / P.etp + h) * b + main_grad_rw * ffn / P.etp * h
    return np.maximum(0.0, local_experts * (fc1 + fc2) / hbm_bytes_per_s - wgrad_compute_s)


def group_limited_remote_domains(moe, G: np.ndarray) -> np.ndarray:
    """Expected remote domains a token reaches under group-limited routing (DeepSeek-V3 §3.2.2:
    each token goes to at most M = router_group_topk nodes; Megatron --moe-router-num-groups /
    --moe-router-group-topk), out of G domains. Experts sit on EP ranks in order and the groups are
    contiguous expert ranges, so a domain holds q = groups/G whole groups (q >= 1) or a group spans
    1/q domains (q < 1). q >= 1: a domain is missed when none of its q groups is among the token's
    chosen ones, P = prod_{i<g} (n − q − i)/(n − i) (drawing g of n groups); q < 1: the k experts
    land in the g/q domains the chosen groups span. The local domain is one of them with
    probability 1/G. No limit: infinity (the caller keeps the unlimited count)."""
    if moe.router_groups is None:
        return np.full(np.shape(G), np.inf)
    n, g, k = float(moe.router_groups), moe.router_group_topk, moe.top_k
    q = n / G
    untouched = np.ones(np.shape(G))
    for i in range(g):
        untouched = untouched * np.clip((n - q - i) / (n - i), 0.0, 1.0)
    reach = np.minimum(g / np.minimum(q, 1.0), G)
    touched = np.where(q >= 1.0, G * (1.0 - untouched), reach * (1.0 - (1.0 - 1.0 / reach) ** k))
    return touched * (G - 1.0) / G


def ranks_reached(moe, ep) -> np.ndarray:
    """Expected expert-parallel ranks (of `ep`, the own one included) that hold at least one of a
    token's top_k experts: E/ep experts on each rank, the token's k distinct experts drawn without
    replacement, so a rank is missed with probability prod_{i<k} (E − E/ep − i)/(E − i)
    (hypergeometric). Group-limited routing is left out: with a rank's experts inside one group it
    changes this by under 1 % for DeepSeek-V3 at ep 64 (4 of 8 groups, 4 experts per rank)."""
    E, k = float(moe.num_experts), moe.top_k
    ep = np.asarray(ep, dtype=np.float64)
    missed = np.ones(ep.shape)
    for i in range(k):
        missed = missed * np.clip((E - E / ep - i) / (E - i), 0.0, 1.0)
    return ep * (1.0 - missed)


def remote_domains_reached(moe, G) -> np.ndarray:
    """Expected NVLink domains other than the token's own that hold at least one of its top_k
    experts, the ep group's experts spread evenly over G domains: `ranks_reached` with domains in
    place of ranks, less the own domain's share (each domain is reached with the same probability)."""
    G = np.asarray(G, dtype=np.float64)
    return ranks_reached(moe, G) * (G - 1.0) / G


def moe_dispatch_s(model: ModelSpec, system: SystemSpec, job: JobSpec, P: PlanArrays,
                   act_bytes: float = 2.0) -> np.ndarray:
    """Dispatch + combine all-to-all of one MoE layer forward, one microbatch (Lepikhin et al.
    2020, GShard §2.2; Megatron MoEAlltoAllTokenDispatcher): each rank sends its routed rows
    (tokens·top_k·h) to the ep ranks holding their experts and gets them back. The ep group is
    strided by etp in Megatron's expert rank order (etp → ep → expert-dp), so it stays inside the
    NVLink domain (72 GPUs on NVL72) while etp·ep fits there and crosses the NICs otherwise
    (`comm.group_link`). With etp > 1 the expert-TP group all-gathers the received rows and
    reduce-scatters the outputs. The busiest rank receives `moe_load_imbalance` × the mean."""
    h, k = model.expert_hidden, model.moe.top_k  # rows move at the experts' width (LatentMoE: latent)
    routed_tokens = routed_tokens_per_rank(model, P)
    rows = routed_tokens * k
    imbalance = moe_load_imbalance(model, job, P)
    nbytes = rows * h * act_bytes * imbalance
    deepep = P.moe_dispatcher == MOE_DISPATCHER_CODES["deepep"]
    # Inside a domain DeepEP/HybridEP send a token once to each rank that holds >= 1 of its experts
    # (DeepEP get_dispatch_layout's is_token_in_rank; the receiver expands it to its local
    # experts), NCCL's alltoall one row per (token, expert) pair: Qwen3-235B at ep 8 (16 experts a
    # rank) sends 5.34 rows per token, not 8
    sent_bytes = np.where(deepep, routed_tokens * ranks_reached(model.moe, P.ep) * h * act_bytes * imbalance, nbytes)
    # DeepEP: a token crosses to each remote domain that holds >= 1 of its k experts once
    # (DeepSeek-V3 §3.2.2 node-limited dispatch; DeepEP normal kernels: RDMA then NVLink forward).
    # With the experts spread evenly over G = ep/k_in domains a token reaches ranks_reached(G) of
    # them, each equally likely, its own among them: E[remote domains] = ranks_reached(G)·(G−1)/G
    k_in = np.clip(system.network[0].domain_gpus / P.etp, 1.0, P.ep)
    G = np.maximum(P.ep / k_in, 1.0)
    remote = np.minimum(remote_domains_reached(model.moe, G), group_limited_remote_domains(model.moe, G))
    dedup_outer = routed_tokens * h * act_bytes * imbalance * remote
    plain_outer = nbytes * (P.ep - k_in) / P.ep
    outer = np.where(deepep, np.minimum(dedup_outer, plain_outer), plain_outer)
    a2a = comm.all_to_all_placed_s(system, sent_bytes, P.ep, P.etp, A2A_BW_EFFICIENCY, outer_bytes=outer)
    etp_bw, etp_lat = comm.group_link(system, P.etp, 1)
    etp_xchg = comm.all_gather_s(rows * h * act_bytes * P.etp, P.etp, etp_bw, etp_lat)
    return 2.0 * a2a + 2.0 * etp_xchg


def unpaired_microbatch_fraction(P: PlanArrays) -> np.ndarray:
    """Share of a rank's forward (and backward) chunk passes that the combined 1F1B schedule
    cannot pair with a pass of another microbatch: the warm-up forwards and cool-down backwards.
    Interleaved: 2(p−1) + (v−1)·N + 1 warm-up chunk-forwards on rank 0 out of m·v (N = p unless
    p does not divide m: pipeline_layout.vp_microbatch_group)
    (megatron/core/pipeline_parallel/schedules.py, get_pp_rank_microbatches, +1 with
    overlap_moe_expert_parallel_comm); without pipelining only the first forward and the last
    backward (combined_1f1b_schedule_for_no_pipelining)."""
    m = P.global_batch / (P.micro_batch * P.dp)
    p, v = P.pp, P.vpp
    warmup = np.where(p > 1, 2.0 * (p - 1.0) + (v - 1.0) * vp_microbatch_group(m, p) + 1.0, 1.0)
    return np.minimum(1.0, warmup / np.maximum(m * v, 1.0))


def a2a_in_nccl_copy_kernels(system: SystemSpec, dispatcher_code, ep, etp) -> np.ndarray:
    """Whether the expert all-to-all runs as NCCL's intra-domain copy kernels: the alltoall
    dispatcher, and the ep group (strided by etp, `moe_dispatch_s`) inside the NVLink domain.

    There the combined-1F1B overlap hides nothing (`a2a_overlap_exposed_s`). NCCL moves
    intra-domain data with SM kernels (each channel a thread block loading and storing over
    NVLink), which beside the paired microbatch's GEMMs wait for SMs; DeepEP/HybridEP (a few SMs,
    or copy engines) and NIC-bound transfers across domains overlap. Measured, every such overlap
    ran slower than the same job without it: Bridge Qwen3-235B on 64 B200 (ep 8) 25.09 -> 25.11
    15.97 -> 20.05 s (the reference); held out, Qwen3-30B-A3B on 16 H100 (ep 8) 26.02 with it
    51.3 s, 26.02.01 without 28.9 s, Qwen3-235B on 256 B300 (ep 8) 26.02 with it 48.7 s, 26.04
    without 26.9 s; across nodes (Qwen3-235B, 256 H100, ep 32) 25.09 -> 25.11 saved what
    A2A_OVERLAP_EFFICIENCY predicts (0.764x measured, 0.760x predicted). The model charges no gain,
    not the measured loss. Megatron-Bridge's EP-overlap guidance (docs/training/
    communication-overlap.md, 0.6.0) names DeepEP/HybridEP as the dispatchers with the higher overlap."""
    return (np.asarray(dispatcher_code) == MOE_DISPATCHER_CODES["alltoall"]) & \
        (np.asarray(ep) * np.asarray(etp) <= system.nvlink_domain_gpus)


def a2a_overlap_exposed_s(a2a_s, fwd_compute_s, bwd_compute_s, P: PlanArrays, nccl_in_domain=False,
                          mlp_fwd_s=None, mlp_bwd_s=None):
    """(forward, backward) exposed expert all-to-all per layer and microbatch.

    Without overlap the dispatch + combine block the layer in both passes. With
    --overlap-moe-expert-parallel-comm (Megatron combined 1F1B) each steady-state step runs one
    microbatch's forward beside another's backward, layer by layer, on a compute and a
    communication stream, in four pairs (model_chunk_schedule_plan.py, schedule_layer_1f1b, with
    --delay-wgrad-compute as the launch sets it beside the overlap): the forward's attention beside
    the backward's combine, the backward MLP's input gradient beside the forward's dispatch, the
    forward's MLP and the backward MLP's delayed weight gradient beside the backward's dispatch,
    the backward's attention beside the forward's combine. Each pair takes the longer of its two,
    so an all-to-all hides only behind the compute it is paired with: a short attention (few
    tokens, small head count) leaves its pair's all-to-all exposed however long the MLP is. Each
    of the four moves one direction's bytes (half of `a2a_s`, `moe_dispatch_s`). The MLP piece
    holds the router and the permutation, which Megatron runs in the attention step (post_attn):
    a few percent of the MLP, left where the model keeps them. A2A_OVERLAP_EFFICIENCY of the ideal
    is reached (the communication kernels take SMs from the compute). Given no MLP split
    (a hybrid stack's mean block), the pairs are pooled: max(compute, communication) per step.
    The unpaired warm-up/cool-down passes expose theirs. The hidden part is charged to the
    backward (the pass it overlaps). Where `nccl_in_domain` (a2a_in_nccl_copy_kernels) the
    overlap hides nothing: both passes expose what they would without it."""
    plain = np.broadcast_to(a2a_s, np.shape(P.tp)).astype(np.float64)
    u = unpaired_microbatch_fraction(P)
    if mlp_fwd_s is None:
        hideable = np.minimum(2.0 * plain, fwd_compute_s + bwd_compute_s)
    else:
        one_way = 0.5 * plain
        # the MLP's backward: its input gradient (one forward's worth), then its weight gradient
        mlp_dgrad = np.minimum(mlp_fwd_s, mlp_bwd_s)
        paired_compute = (fwd_compute_s - mlp_fwd_s, mlp_dgrad, mlp_fwd_s + (mlp_bwd_s - mlp_dgrad),
                          bwd_compute_s - mlp_bwd_s)
        hideable = sum(np.minimum(one_way, np.maximum(c, 0.0)) for c in paired_compute)
    paired = 2.0 * plain - A2A_OVERLAP_EFFICIENCY * hideable
    on = (P.moe_a2a_overlap > 0) & ~np.asarray(nccl_in_domain, dtype=bool)
    fwd = np.where(on, u * plain, plain)
    bwd = np.where(on, u * plain + (1.0 - u) * paired, plain)
    return fwd, bwd


# Ring attention merges each step's partial output into the running one: read the running fp32
# output and log-sum-exp, read the step's, write the merged (TransformerEngine
# attention/dot_product_attention/context_parallel.py, AttnFuncWithCPAndKVP2P: the
# flash_attn_fwd_out_correction after every step but the first): 3 passes over the output in the
# activation dtype (2 bytes; the fp32 log-sum-exp is one value per head and token, negligible).
CP_CORRECTION_PASSES = 3.0
CP_CORRECTION_BYTES = 2.0


def cp_output_correction_s(model: ModelSpec, P: PlanArrays, hbm_bytes_per_s: float) -> np.ndarray:
    """Memory-bound merge of cp−1 ring steps' partial attention outputs, one layer forward."""
    tokens = P.micro_batch * model.seq_length / P.cp
    per_step = CP_CORRECTION_PASSES * CP_CORRECTION_BYTES * tokens * flops.attention_out_width(model) / P.tp
    return (P.cp - 1) * per_step / hbm_bytes_per_s


def mtp_fwd_s(model: ModelSpec, layer: dict, logit_fwd_s, system: SystemSpec, job: JobSpec,
              P: PlanArrays) -> np.ndarray:
    """Forward seconds of the MTP modules of one microbatch on the last stage (DeepSeek-V3 §2.2):
    each runs one more transformer layer (`layer`, with its MoE dispatch), the 2h→h projection
    of [norm(h); norm(embedding)] and the shared output head again (`logit_fwd_s`)."""
    if not model.mtp_layers:
        return np.zeros(len(P))
    own_dtype = "mtp" in job.module_dtypes
    if own_dtype:  # the whole module in its own dtype (a per-module recipe)
        job = job.model_copy(update={"dtype": job.module_dtypes["mtp"], "module_dtypes": {},
                                     "fp8_attention": job.fp8_attention and job.module_dtypes["mtp"] != "bf16"})
    acc = system.accelerator
    tokens = P.micro_batch * model.seq_length / P.cp
    h, t = model.hidden, P.tp
    proj = _gemm_time(2 * tokens * 2 * h * h / t, np.minimum(np.minimum(tokens, h / t), 2 * h),
                      acc.peak(precision.gemm_peak_key(job.dtype)), acc.efficiency, job.dtype)
    if model.hybrid_pattern:  # the module's attention block and MoE block (Nemotron's "*E")
        from planner.analytical import hybrid
        # its own blocks, whatever the stack's pattern holds (a bf16-kept tail may have no
        # attention block: _with_bf16_layers costs those blocks as a pattern of their own)
        module = "*E" if model.moe else "*-"
        kinds = hybrid.block_fwd_s(model.model_copy(update={"hybrid_pattern": module, "layers": 2}), system, job, P)
        block = sum(hybrid.block_forward_s(kinds[k]) for k in module)
    else:
        if own_dtype:
            layer = layer_compute_fwd_s(model, system, job, P)
        block = layer["gemm"] + layer["attention"] + layer["elementwise"]
    if model.moe:
        block = block + moe_dispatch_s(model, system, job, P)
    return model.mtp_layers * (block + proj + logit_fwd_s)


def per_layer_terms(model: ModelSpec, system: SystemSpec, job: JobSpec, P: PlanArrays) -> dict:
    """One microbatch, one GPU: seconds per layer (forward / backward compute, exposed TP, CP
    and EP communication, selective recompute) and of the LM head; (n,) arrays."""
    if any(job.bf16_layers):
        return _with_bf16_layers(model, system, job, P)
    system = kernel_stack_system(system, job)
    acc = system.accelerator
    eff = acc.efficiency
    h, t, c = model.hidden, P.tp, P.cp
    tokens = P.micro_batch * model.seq_length / c
    act_bytes = 2.0  # 16-bit activations on the wire

    layer = layer_compute_fwd_s(model, system, job, P)
    fwd_compute = layer["gemm"] + layer["attention"] + layer["elementwise"]
    bwd_compute = BACKWARD_FACTOR * fwd_compute + layer["wgrad_extra"]

    # --- tensor parallel: 2 all-reduces forward, 2 backward per layer (Narayanan SC'21 §3,
    # Fig. 5; with SP an all-gather + reduce-scatter pair of the same volume, Korthikanti §4.2.2)
    tp_bw, tp_lat = comm.group_link(system, t, 1)
    ar = comm.all_reduce_s(tokens * h * act_bytes, t, tp_bw, tp_lat)
    # GEMM/communication overlap (TE userbuffers) works through NVLink peer memory: a TP group
    # that leaves the NVLink domain gets no overlap from it.
    overlap = (P.tp_comm_overlap > 0) & ~comm.group_link_crosses_nvlink(system, t)
    # one collective per block: a hybrid stack's layer is a single block
    blocks = 1.0 if model.hybrid_pattern else 2.0
    tp_fwd = blocks * ar * np.where(overlap, TP_EXPOSED_WITH_OVERLAP, TP_EXPOSED_FWD)
    tp_bwd = blocks * ar * np.where(overlap, TP_EXPOSED_WITH_OVERLAP, TP_EXPOSED_BWD)

    # --- context parallel: ring attention passes K,V around the cp ranks (Liu et al. 2023, Ring
    # Attention §3; Megatron's default cp_comm_type "p2p", TE AttnFuncWithCPAndKVP2P): cp−1 sends
    # of the local K,V, each hidden behind one step's attention kernel (1/cp of the layer's
    # attention, the load-balanced causal halves make the steps equal); backward moves K,V and
    # dK,dV (twice the bytes) behind twice the compute.
    cp_bw, cp_lat = comm.group_link(system, c, t)
    kv_bytes = tokens * 2.0 * model.kv_hidden / t * act_bytes
    cp_send = comm.p2p_s(kv_bytes, cp_bw, cp_lat)
    attn_step = layer["attention"] / c
    cp_fwd = np.where(c > 1, (c - 1) * np.maximum(0.0, cp_send - attn_step), 0.0)
    cp_bwd = np.where(c > 1, (c - 1) * np.maximum(0.0, 2 * cp_send - BACKWARD_FACTOR * attn_step), 0.0)

    # --- expert parallel: dispatch + combine per MoE layer forward, the same backward, exposed
    # as far as the all-to-all overlap leaves it (leading dense layers, their own kind, have none).
    if model.moe:
        a2a = moe_dispatch_s(model, system, job, P, act_bytes)
        if model.hybrid_pattern:  # the mean block: only the MoE blocks dispatch
            a2a = a2a * model.blocks("E") / model.layers
        # the MoE MLP apart from the rest of the layer (the overlap's pairs); a hybrid stack's
        # mean block has no such split
        mlp_fwd = None if model.hybrid_pattern else layer["moe_mlp_s"]
        mlp_bwd = None if model.hybrid_pattern else BACKWARD_FACTOR * layer["moe_mlp_s"] + layer["wgrad_extra"]
        ep_fwd, ep_bwd = a2a_overlap_exposed_s(a2a, fwd_compute, bwd_compute, P,
                                               a2a_in_nccl_copy_kernels(system, P.moe_dispatcher, P.ep, P.etp),
                                               mlp_fwd, mlp_bwd)
    else:
        ep_fwd = ep_bwd = np.zeros(len(P))

    # Recompute: full reruns the forward (with its communication) of its k layers; selective
    # reruns the forward of its modules in every layer (`selective_recompute_s`), under a torch
    # stack what torchtitan's per-op policy reruns (OP_SAC_ATTENTION_PROJ_RERUN).
    rerun = layer["op_sac_rerun_s"] if kernels.per_op_checkpointing(model, job) else \
        selective_recompute_s(model, layer, P, tp_fwd, ep_fwd)
    selective = np.where(P.recompute == 1, rerun, 0.0)
    # A torch stack's selective recompute is torchtitan's per-op policy (parallelize_llama.py
    # @820504e, _save_list): it keeps the reduce-scatters' outputs but not the sequence-parallel
    # all-gathers', so the backward reruns both of the layer's all-gathers (each backward GEMM
    # that reads the gathered input needs them), each half an all-reduce. Async TP fuses an
    # all-gather only with the GEMMs that take it as left operand (torch/_inductor/fx_passes/
    # micro_pipeline_tp.py, fuse_all_gather_matmul), in the rerun the one recomputed GEMM it
    # feeds: the MLP's w3 hides its gather like any fused one; the attention's, the narrow K
    # projection (every second mm is rerun), cannot, so that gather stays exposed.
    if job.kernels != "te":
        rerun = 0.5 * ar * TP_EXPOSED_FWD + 0.25 * tp_fwd
        selective = selective + np.where((P.recompute == 1) & sequence_parallel_on(P), rerun, 0.0)

    # LM head (last stage): logits GEMM M=tokens, K=h, N=V/t, forward + backward; outside the
    # low-precision autocast (Megatron's output layer is not a TE module), so bf16/fp16.
    head_dtype = precision.high_precision_dtype(job.dtype)
    logit_fwd = _gemm_time(2 * tokens * h * model.vocab / t,
                           np.minimum(np.minimum(tokens, h), model.vocab / t),
                           acc.peak(head_dtype), eff, head_dtype)
    # fp32 cross-entropy over the vocabulary shard: softmax and its gradient make
    # CROSS_ENTROPY_PASSES memory-bound passes over 4-byte logits; the backward's gradient kernel
    # is the same with and without --cross-entropy-loss-fusion. A fused loss kernel on the 16-bit
    # logits (JobSpec.loss_kernel, kernels.py) moves its own bytes instead.
    per_logit_byte = tokens * model.vocab / t / (acc.hbm_bandwidth_bytes_per_s * eff.hbm_efficiency)
    fused_loss = kernels.fused_loss_bytes(job.loss_kernel)
    if fused_loss is None:
        ce_unfused = CROSS_ENTROPY_PASSES * 4.0 * per_logit_byte
        ce_fwd = np.where(P.cross_entropy_fusion > 0, CROSS_ENTROPY_FUSED_SHARE, 1.0) * ce_unfused
        ce_bwd = BACKWARD_FACTOR * ce_unfused
    else:
        ce_fwd, ce_bwd = fused_loss[0] * per_logit_byte, fused_loss[1] * per_logit_byte
    logit_bwd = BACKWARD_FACTOR * logit_fwd + ce_bwd
    logit_fwd = logit_fwd + ce_fwd
    # MTP modules (DeepSeek-V3 §2.2) run on the last stage after the LM head, like it.
    mtp = mtp_fwd_s(model, layer, logit_fwd, system, job, P)
    logit_fwd = logit_fwd + mtp
    logit_bwd = logit_bwd + BACKWARD_FACTOR * mtp
    terms = {"fwd_compute": fwd_compute, "bwd_compute": bwd_compute, "attention": layer["attention"],
             "selective": selective, "tp_fwd": tp_fwd, "tp_bwd": tp_bwd, "cp_fwd": cp_fwd, "cp_bwd": cp_bwd,
             "ep_fwd": ep_fwd, "ep_bwd": ep_bwd, "logit_fwd": logit_fwd, "logit_bwd": logit_bwd}
    if layer_kinds.lead_layers(model):
        # a MoE model's leading dense layers: the same terms of its dense twin (no experts, no
        # dispatch), kept apart so that each rank is costed with the layers it really holds
        lead = per_layer_terms(layer_kinds.lead_layer_model(model), system, job, P)
        terms["lead"] = {key: lead[key] for key in LAYER_TERMS}
    return terms


def _with_bf16_layers(model: ModelSpec, system: SystemSpec, job: JobSpec, P: PlanArrays) -> dict:
    """`per_layer_terms` with JobSpec.bf16_layers kept in bf16: each per-layer term is the mean
    over the layers of the two precisions, weighted by their counts (exact where a rank holds the
    mean layer, as at pp 1; a hybrid stack's bf16 layers are its pattern's own first and last
    blocks, costed as their own mean block). The LM head is the low-precision job's (bf16 anyway)."""
    first, last = job.bf16_layers
    share = memory.bf16_layer_share(model, job)
    low_model = wide_model = model
    if model.hybrid_pattern:
        pattern, n = model.hybrid_pattern, model.layers
        kept = pattern[:first] + pattern[max(first, n - last):]
        rest = pattern[first:max(first, n - last)] or kept
        low_model = model.model_copy(update={"hybrid_pattern": rest, "layers": len(rest)})
        wide_model = model.model_copy(update={"hybrid_pattern": kept, "layers": len(kept)})
    terms = per_layer_terms(low_model, system, memory.without_bf16_layers(job), P)
    wide = per_layer_terms(wide_model, system, memory.bf16_job(job), P)

    def mix(low: dict, high: dict) -> dict:
        return {**low, **{key: (1 - share) * low[key] + share * high[key] for key in LAYER_TERMS}}
    out = mix(terms, wide)
    if "lead" in terms:
        out["lead"] = mix(terms["lead"], wide["lead"])
    return out


# The per-layer entries of `per_layer_terms` (the rest belong to the LM head on the last rank).
LAYER_TERMS = ("fwd_compute", "bwd_compute", "attention", "selective", "tp_fwd", "tp_bwd", "cp_fwd", "cp_bwd",
               "ep_fwd", "ep_bwd")


def layers_sum(terms: dict, per_layer, n, lead):
    """Σ over n layers, `lead` of them leading dense layers, of `per_layer(terms of that kind)`.
    n, lead: (n,) or (n, R) counts (per-layer values broadcast along R). Without leading layers
    this is n·per_layer(terms), computed exactly so."""
    shape = _col if np.ndim(n) == 2 else np.asarray
    main = shape(per_layer(terms))
    if "lead" not in terms:
        return n * main
    return (n - lead) * main + lead * shape(per_layer(terms["lead"]))


def selective_recompute_s(model: ModelSpec, layer: dict, P: PlanArrays, tp_fwd, ep_fwd) -> np.ndarray:
    """Forward seconds one layer (the repeated layer, or a leading dense layer's twin) re-spends in the
    backward under selective recompute of the module set `P.recompute_modules` (Megatron-Core
    --recompute-modules; what each checkpoints: planner.analytical.memory.selective_freed_coefficients):
      core_attn       the attention core (Korthikanti et al. 2022 §5; unfused score passes included)
      layernorm       the separate norms' forward: the input norm with MLA, the pre-MLP norm of
                      MoE layers (the others are fused into their GEMMs and not recomputed)
      mla_up_proj     MLA's q/kv up-projection GEMMs (RoPE's element-wise pass neglected)
      mlp             dense layers' MLP forward, with its fused norm and its half of the layer's
                      forward tensor-parallel collectives (the checkpoint reruns them)
      moe             MoE layers' whole MLP forward: router, permutation, experts, shared
                      experts, the dispatch/combine all-to-all and its half of the TP collectives
      moe_act         the routed experts' activation function (element-wise; inside `moe`)
      shared_experts  the shared experts' forward (inside `moe`)"""
    f_moe = 1.0 if model.moe else 0.0  # the repeated layer (leading dense layers: their own kind)
    m = P.recompute_modules

    def has(name):
        return module_selected(m, name)
    norms = (model.mla is not None) + f_moe
    moe_whole = f_moe * (layer["moe_mlp_s"] + 0.5 * tp_fwd) + ep_fwd
    return (has("core_attn") * layer["attention"]
            + has("layernorm") * norms * layer["norm_s"]
            + has("mla_up_proj") * layer["mla_up_proj_s"]
            + has("mlp") * (1 - f_moe) * (layer["dense_mlp_s"] + layer["norm_s"] + 0.5 * tp_fwd)
            + np.where(has("moe"), moe_whole,
                       f_moe * (has("moe_act") * layer["moe_act_s"] + has("shared_experts") * layer["shared_expert_s"])))


def _col(x):
    if type(x) is np.ndarray:  # the common case, without np.ndim's dispatch (~10^6 calls in a fit)
        return x.astype(np.float64, copy=False)[:, None] if x.ndim == 1 else x
    return np.asarray(x, dtype=np.float64)[:, None] if np.ndim(x) == 1 else x


def layer_microbatch_s(x: dict) -> np.ndarray:
    """One layer's forward + backward of one microbatch with its exposed communication."""
    return x["fwd_compute"] + x["bwd_compute"] + x["selective"] + x["tp_fwd"] + x["tp_bwd"] \
        + x["cp_fwd"] + x["cp_bwd"] + x["ep_fwd"] + x["ep_bwd"]


def layer_recompute_s(x: dict) -> np.ndarray:
    """One layer's full recompute: its forward and the forward's communication again."""
    return x["fwd_compute"] + x["tp_fwd"] + x["cp_fwd"] + x["ep_fwd"]


def rank_compute_s(terms: dict, P: PlanArrays, excess: dict | None = None) -> dict[str, np.ndarray]:
    """(n, R) per representative rank, one microbatch: the forward compute of its layers, their
    backward compute, and what recompute adds to the backward (full recompute of its k_r layers'
    forward, each layer's selective recompute). The slowest rank's are the step's compute and the
    windows its DP collectives overlap (step_time); constraints.stages reads them per rank."""
    x = terms
    out = {"fwd": layers_sum(x, lambda y: y["fwd_compute"], P.rank_layers, P.rank_lead_layers),
           "bwd": layers_sum(x, lambda y: y["bwd_compute"], P.rank_layers, P.rank_lead_layers),
           "recompute": layers_sum(x, lambda y: y["fwd_compute"], P.rank_recompute, P.rank_lead_recompute)
           + layers_sum(x, lambda y: y["selective"], P.rank_layers, P.rank_lead_layers)}
    if excess is not None:
        out = {"fwd": out["fwd"] + excess["fwd"], "bwd": out["bwd"] + excess["bwd"],
               "recompute": out["recompute"] + excess["rc_fwd"]}
    return out


def rank_microbatch_s(terms: dict, P: PlanArrays, excess: dict | None = None) -> np.ndarray:
    """(n, R): one microbatch's forward + backward on each representative rank: its n_r layers
    (of them the leading dense layers it holds costed as such), k_r of them recomputed in full
    (forward and its communication again), and on the last rank the LM head. The slowest rank
    sets the 1F1B steady state (Narayanan et al. SC'21 §2.2). `excess`: a pipelined hybrid
    stack's ranks' own blocks beyond the mean block (`hybrid.rank_excess_s`)."""
    x = terms
    last = P.rank_index == _col(P.pp) - 1
    out = (layers_sum(x, layer_microbatch_s, P.rank_layers, P.rank_lead_layers)
           + layers_sum(x, layer_recompute_s, P.rank_recompute, P.rank_lead_recompute)
           + last * _col(x["logit_fwd"] + x["logit_bwd"]))
    if excess is None:
        return out
    return out + sum(excess.values())


def step_time(model: ModelSpec, system: SystemSpec, job: JobSpec, P: PlanArrays, mem: dict) -> dict:
    """Seconds per step of every plan, as components that add up to `step_time_s`. The critical
    path is the pipeline's slowest rank: m microbatches of its layers (plus the LM head on the
    last rank), the bubble, then what data parallelism, offload and the optimizer leave exposed."""
    system = kernel_stack_system(system, job)
    acc = system.accelerator
    eff = acc.efficiency
    h, t, c = model.hidden, P.tp, P.cp
    p, v, dp = P.pp, P.vpp, P.dp
    m = P.global_batch / (P.micro_batch * dp)
    tokens = P.micro_batch * model.seq_length / c
    act_bytes = 2.0  # 16-bit activations on the wire
    by_block = layer_kinds.by_block(model)
    if by_block and np.any(p > 1):
        # which blocks a rank holds, not only how many: every rank kept (plans.with_every_rank)
        P = with_every_rank(P, model.layers)
    terms = per_layer_terms(model, system, job, P)
    logit_fwd, logit_bwd = terms["logit_fwd"], terms["logit_bwd"]
    excess = None
    if by_block:
        from planner.analytical import hybrid
        excess = hybrid.rank_excess_s(model, system, job, P, terms)

    # --- per pipeline rank (representative ranks, (n, R)): one microbatch's forward + backward
    # over its n_r layers, k_r of them recomputed in full; the last rank adds the LM head; a
    # pipelined hybrid stack's rank its own blocks (`excess`). The slowest rank sets the 1F1B
    # steady state (Narayanan et al. SC'21 §2.2).
    n_r, k_r = P.rank_layers, P.rank_recompute
    last_r = P.rank_index == _col(p) - 1
    rank_time = rank_microbatch_s(terms, P, excess)
    slow = rank_argmax(rank_time)
    def at(x):
        return at_rank(_col(x), slow, rank_time.shape)
    n_slow, last_slow = at(n_r), at(last_r)

    def on_rank(per_layer, recomputed):
        # (n, R): Σ over each rank's layers and its recomputed layers, each kind at its own cost
        return layers_sum(terms, per_layer, n_r, P.rank_lead_layers) \
            + layers_sum(terms, recomputed, k_r, P.rank_lead_recompute)

    # per rank: its compute, its exposed tensor- and context/expert-parallel communication (the
    # slowest rank's are the step's; every rank's are the windows of its DP collectives, below)
    compute = rank_compute_s(terms, P, excess)
    stage_fwd, stage_bwd, recompute_compute = at(compute["fwd"]), at(compute["bwd"]), at(compute["recompute"])
    tp_r = on_rank(lambda x: x["tp_fwd"] + x["tp_bwd"], lambda x: x["tp_fwd"])
    cpep_r = on_rank(lambda x: x["cp_fwd"] + x["cp_bwd"] + x["ep_fwd"] + x["ep_bwd"], lambda x: x["cp_fwd"] + x["ep_fwd"])
    if excess is not None:
        cpep_r = cpep_r + excess["ep_fwd"] + excess["ep_bwd"] + excess["rc_ep_fwd"]
    stage_tp, stage_cpep = at(tp_r), at(cpep_r)

    # --- pipeline: bubble (p−1)/v stage-times (Narayanan SC'21 §2.2); p2p of one microbatch's
    # boundary activation, split over tp with the scatter/gather optimisation (§4.1).
    # Uneven stages: filling and draining the pipeline passes one microbatch through every OTHER
    # rank once, (sum of all ranks' microbatch times − the slowest's)/v; for equal stages this is
    # SC'21's (p−1)/v stage-times. The sum over all ranks is exact from totals: every layer once,
    # recompute_total recomputed layers, one LM head.
    all_ranks = (layers_sum(terms, lambda x: x["fwd_compute"] + x["bwd_compute"] + x["selective"]
                            + (x["tp_fwd"] + x["tp_bwd"] + x["cp_fwd"] + x["cp_bwd"] + x["ep_fwd"] + x["ep_bwd"]),
                            P.num_layers, P.lead_layers)
                 + layers_sum(terms, lambda x: x["fwd_compute"] + (x["tp_fwd"] + x["cp_fwd"] + x["ep_fwd"]),
                              P.recompute_total, P.lead_recompute_total)
                 + logit_fwd + logit_bwd)
    if excess is not None:
        # a hybrid's held blocks sum to the mean block over the whole pattern, its recomputed
        # blocks need not: their excess over every rank (with_every_rank: column j is rank j mod pp)
        all_ranks = all_ranks + sum_over_ranks(P, excess["rc_fwd"] + excess["rc_ep_fwd"])
    bubble = np.where(p > 1, np.maximum(all_ranks - at(rank_time), 0.0) / v, 0.0)
    pp_bw, pp_lat = comm.group_link(system, 2, t * c * dp)
    p2p = comm.p2p_s(tokens * h * act_bytes / t, pp_bw, pp_lat)
    pp_p2p = np.where(p > 1, 2 * (p - 1) * v * p2p + np.where(v > 1, 0.0, 2 * m * p2p), 0.0)

    # --- data parallel (planner/analytical/data_parallel.py): dense parameters over the dp·cp
    # replicas (stride tp); expert parameters over expert-DP = tp·dp·cp/(etp·ep) (stride etp·ep,
    # Megatron MoE parallel folding).
    # Every pipeline rank reduces (and gathers) its own parameters behind its own microbatches'
    # compute (Megatron's DDP buckets per model chunk), so each representative rank's exposure is
    # costed from its own bytes and its own windows, and the step waits for the largest. (Pairing
    # the fullest rank's bytes with the slowest rank's window, as before 2026-11-28, let an
    # uneven split "hide" one rank's collectives behind another rank's longer backward.)
    bpp = job.bytes_per_param
    dense = mem["params_elems"]  # the fullest rank's parameters (offload streams them)
    col = types.SimpleNamespace(**{k: _col(getattr(P, k)) for k in ("tp", "cp", "dp", "etp", "ep")})
    rank = lambda key: mem[f"{RANK_DP_PREFIX}{key}"]  # noqa: E731
    groups = data_parallel.replica_groups(
        system, col, data_parallel.expert_share(rank("params_elems"), rank("expert_params_elems")),
        rank("grad_reduce"), rank("param_gather"))
    # one microbatch's forward / backward (with its recompute) on each rank: the overlap windows
    mb_fwd, mb_bwd = compute["fwd"], compute["bwd"] + compute["recompute"]
    # ZeRO-3's per-layer prefetch also hides behind the layer's tensor/context/expert-parallel
    # communication when that stays inside the NVLink domain and the DP groups (both span
    # tp·dp·cp ranks) leave it: the gathers then run on the NICs, on other links.
    domain = system.nvlink_domain_gpus
    other_links = _col((t * dp * c > domain) & (t * c <= domain) & (P.etp * P.ep <= domain))
    mp_fwd = layers_sum(terms, lambda x: x["tp_fwd"] + x["cp_fwd"] + x["ep_fwd"], n_r, P.rank_lead_layers)
    mp_all = tp_r + cpep_r
    dp_comm = rank_max(data_parallel.dp_comm_exposed_s(
        groups, _col(P.zero_stage), _col(P.dp_impl), _col(m), mb_fwd, mb_bwd, _col(p), _col(v), P.rank_layers,
        _col(P.dp_comm_overlap > 0), overlapped_collective_s, np.where(other_links, mp_fwd, 0.0),
        np.where(other_links, mp_all - mp_fwd, 0.0)))

    # --- optimizer step, memory-bound on HBM; the offloaded share runs where its state lives.
    opt_elems = mem["opt_elems"]
    hbm_bw = acc.hbm_bandwidth_bytes_per_s * eff.hbm_efficiency
    f_o = P.offload_optimizer
    step_bytes = optimizer_step_bytes_per_param(job)
    optimizer = opt_elems * (1 - f_o) * step_bytes / hbm_bw

    # --- offload traffic (docs/design.md, offload): weights (+ their gradients) stream in for the
    # forward and backward of every microbatch, overlapping that microbatch's compute.
    # Activations go out in the forward and come back in the backward on Transformer Engine's
    # per-layer schedule (planner/analytical/offload.py: each layer's copy has a deadline a few
    # layers later, one direction of the tier's link each way). Where weights are offloaded too
    # (no Megatron flag does it), both share the link and the compute window: the single budget
    # (all bytes over the bandwidth against the microbatch's compute) is a floor. Offloaded
    # optimizer state is updated at the offload tier's bandwidth after moving gradients down and
    # weights up.
    if system.offload is not None:
        off_bw = system.offload.bandwidth_bytes_per_s
        weights_mb = P.offload_weights * dense * (2 * bpp.weights + 2 * bpp.grads) / off_bw
        compute_mb = stage_fwd + stage_bwd + recompute_compute
        activations_mb = activation_offload_exposed_s(
            P.offload_activations, n_slow, mem["activations_per_microbatch_bytes"], off_bw,
            stage_fwd, stage_bwd + recompute_compute)
        shared_link = np.where(P.offload_weights > 0, np.maximum(
            0.0, weights_mb + P.offload_activations * 2.0 * mem["activations_per_microbatch_bytes"] / off_bw
            - compute_mb), 0.0)
        per_mb = np.maximum(np.maximum(0.0, weights_mb - compute_mb) + activations_mb, shared_link)
        offload = m * per_mb \
            + f_o * opt_elems * (step_bytes + bpp.grad_reduce + bpp.weights) / off_bw
    else:
        offload = np.zeros(len(P))

    logits_fwd_total = m * last_slow * logit_fwd
    logits_bwd_total = m * last_slow * logit_bwd
    parts = {
        "forward_s": m * stage_fwd + logits_fwd_total,
        "backward_s": m * stage_bwd + logits_bwd_total,
        "recompute_s": m * recompute_compute,
        "tp_comm_exposed_s": m * stage_tp,
        "cp_ep_comm_exposed_s": m * stage_cpep,
        "pp_bubble_s": bubble,
        "pp_p2p_s": pp_p2p,
        "dp_comm_exposed_s": dp_comm,
        "offload_exposed_s": offload,
        "optimizer_step_s": optimizer,
    }
    parts["step_time_s"] = sum(parts.values())
    parts["pipeline_slowest_rank"] = at(P.rank_index)
    return parts
