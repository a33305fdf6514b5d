"""Per-GPU memory of many plans at once (numpy columns); bytes unless the name says otherwise.

The worst pipeline stage is the first one: it holds the embedding and, under 1F1B, the most
microbatches in flight (Korthikanti et al. 2022 §4.2.3); the last stage's LM-head workspace is
added as a transient buffer.
"""
from __future__ import annotations

import numpy as np

from hardware.spec import SystemSpec
from planner.analytical.flops import attention_out_width
from planner.analytical.plans import PlanArrays
from planner.model import ModelSpec
from planner.plan import JobSpec


def activation_coefficients(model: ModelSpec) -> tuple[float, float, float]:
    """Korthikanti et al. 2022 §4.1 (Table 2 first row, sbh(34 + 5as/h)) split into the terms
    tensor parallelism does not shard (10: two layer-norm inputs 4, QKV and MLP inputs 4, two
    dropout masks 2), the terms it shards (24 = attention Q,K,V and projection input 8 + GeLU
    input/output 16) and the s² attention-score term (5as/h), in units of s·b·h bytes.
    Generalised: K,V are g/a as wide (GQA); the MLP terms scale with ffn/h (SwiGLU stores the
    fused gate+up output 2f and the product f); MoE: see below."""
    h = model.hidden
    # two 1-byte dropout masks (after attention and after the MLP) exist only with dropout
    unsharded = 10.0 if model.dropout else 8.0
    # Q (a·d wide), K and V (g·d each) and the projection input (a·d_v): 2+4g/a+2 when a·d = h
    attention = (2.0 * model.q_hidden + 4.0 * model.kv_hidden + 2.0 * attention_out_width(model)) / h
    act = 6.0 if model.activation == "swiglu" else 4.0
    mlp = act * model.ffn_hidden / h
    if model.moe:
        moe = model.moe
        # a MoE layer stores, per token: top_k expert MLPs; the permuted expert inputs (one bf16
        # copy of the token per routed expert, kept for FC1's weight gradient: 2·top_k); the
        # router's fp32 logits and probabilities (8·E/h); the shared experts' MLP terms
        # (Megatron-Core moe/: token_dispatcher permute, router.py, shared_experts.py)
        moe_mlp = (act * moe.top_k * model.expert_ffn_hidden / h + 2.0 * moe.top_k + 8.0 * moe.num_experts / h
                   + act * moe.shared_experts * model.shared_expert_ffn_hidden / h)
        # leading dense layers keep the dense MLP: averaged per layer like the time model
        f_moe = model.moe_layers / model.layers
        mlp = (1 - f_moe) * mlp + f_moe * moe_mlp
    score = 5.0 * model.heads * model.seq_length / h
    return unsharded, attention + mlp, score


def activation_bytes_per_layer(model: ModelSpec, job: JobSpec, P: PlanArrays) -> np.ndarray:
    """Stored activations of one layer for one microbatch, per GPU (Korthikanti Table 2):
    none: sbh(10 + 24/t + 5as/(ht)); TP+SP: sbh/t·(34 + 5as/h); selective: the 5as/h term is
    recomputed (and fused/flash attention never stores it); full: only the 2sbh layer input
    (sharded by SP). Context parallelism splits s by cp."""
    unsharded, sharded, score = activation_coefficients(model)
    t = P.tp
    sp = (P.sequence_parallel > 0) & (t > 1)
    sbh = P.micro_batch * model.seq_length / P.cp * model.hidden
    keeps_scores = (P.recompute == 0) & (not job.flash_attention)
    per_layer = sbh * (np.where(sp, unsharded / t, unsharded) + sharded / t
                       + np.where(keeps_scores, score / t, 0.0))
    input_only = np.where(sp, 2.0 * sbh / t, 2.0 * sbh)
    return np.where(P.recompute == 2, input_only, per_layer), per_layer


def in_flight_microbatches(P: PlanArrays) -> np.ndarray:
    """Microbatches whose activations the first stage holds under 1F1B: min(pp, m), times the
    interleaving factor (1 + (p−1)/(p·v)) (Korthikanti et al. 2022 §4.2.3)."""
    m = P.global_batch / (P.micro_batch * P.dp)
    p, v = P.pp, P.vpp
    factor = np.where(v > 1, 1.0 + (p - 1.0) / (p * v), 1.0)
    return np.minimum(p, m) * factor


def stage_params(model: ModelSpec, P: PlanArrays) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(transformer-block dense, vocabulary, expert) parameters held by one GPU of the first
    stage. TP shards every matrix (norms are replicated: negligible and ignored); EP shards the
    experts over etp·ep (Megatron parallel folding; etp = tp by default); the stage holds one V×h matrix (embedding,
    or the LM head on the last stage; both when pp = 1 and the embeddings are untied)."""
    layers_per_stage = model.layers / P.pp
    blocks = layers_per_stage * model.non_expert_params_per_layer / P.tp
    vocab_matrices = np.where((P.pp == 1) & (not model.tied_embeddings), 2.0, 1.0)
    vocab = vocab_matrices * model.vocab * model.hidden / P.tp
    expert = layers_per_stage * model.expert_params_per_layer / (P.etp * P.ep)
    return blocks, vocab, expert


def expert_dp(P: PlanArrays) -> np.ndarray:
    """Expert-data-parallel size: world / (etp·ep·pp) (Megatron MoE parallel folding)."""
    return P.tp * P.dp * P.cp / (P.etp * P.ep)


def model_state_elems(dense, expert, P: PlanArrays) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Elements of (weights, grads, optimizer state) one GPU keeps. ZeRO / distributed-optimizer
    sharding (Rajbhandari et al. 2020, ZeRO §5; Megatron's distributed optimizer = stage 1:
    6 + 12/d bytes per parameter): dense weights are replicated over dp·cp, experts over the
    expert-data-parallel group world/(etp·ep·pp) = tp·dp·cp/(etp·ep) (megatron/core/parallel_state.py)."""
    sharded = dense / (P.dp * P.cp) + expert / np.maximum(expert_dp(P), 1.0)
    params = dense + expert
    z = P.zero_stage
    return np.where(z >= 3, sharded, params), np.where(z >= 2, sharded, params), np.where(z >= 1, sharded, params)


# Bytes per element of the model state that two Megatron switches change. Source: Megatron-LM
# megatron/core/distributed/param_and_grad_buffer.py (group_params_for_buffers): the parameter
# buffer stores FP8 parameters as torch.uint8 (1 B) when --fp8-param-gather keeps the compute
# weights in FP8, and the gradient buffer is fp32 only while grad_reduce_in_fp32 holds, which
# --grad-reduce-in-bf16 turns off (megatron/training/arguments.py) -> 2-byte gradients, reduced
# in 16 bits. Embedding and LM head are never FP8 (Transformer Engine quantises the transformer
# blocks' Linear layers only), so they keep `bpp.weights`.
FP8_WEIGHT_BYTES = 1.0
BF16_GRAD_BYTES = 2.0


def block_weight_bytes_per_elem(job: JobSpec, P: PlanArrays) -> np.ndarray:
    """Bytes per transformer-block weight element on the GPU (and in the DP parameter gather)."""
    return np.where(P.fp8_param_gather > 0, FP8_WEIGHT_BYTES, job.bytes_per_param.weights)


def grad_bytes_per_elem(job: JobSpec, P: PlanArrays) -> tuple[np.ndarray, np.ndarray]:
    """(bytes per gradient element kept, bytes per gradient element on the DP wire)."""
    bpp = job.bytes_per_param
    bf16 = P.grad_reduce_in_bf16 > 0
    return np.where(bf16, BF16_GRAD_BYTES, bpp.grads), np.where(bf16, BF16_GRAD_BYTES, bpp.grad_reduce)


def memory_breakdown(model: ModelSpec, system: SystemSpec, job: JobSpec, P: PlanArrays) -> dict[str, np.ndarray]:
    """Bytes per GPU: HBM by category, offload-tier use by category, and the HBM budget."""
    bpp = job.bytes_per_param
    blocks, vocab, expert = stage_params(model, P)
    params = blocks + vocab + expert
    weight_elems, grad_elems, opt_elems = model_state_elems(blocks + vocab, expert, P)
    vocab_w, vocab_g, vocab_o = model_state_elems(vocab, 0.0, P)

    layers_per_stage = model.layers / P.pp
    # ZeRO-3 gathers two layers at a time (the one computing, the one prefetching).
    block_wb = block_weight_bytes_per_elem(job, P)
    grad_b, grad_wire_b = grad_bytes_per_elem(job, P)
    gathered = np.where(P.zero_stage >= 3, 2.0 * params / layers_per_stage * block_wb, 0.0)

    weights = weight_elems * block_wb + vocab_w * (bpp.weights - block_wb)
    grads = grad_elems * grad_b
    optimizer = opt_elems * bpp.optimizer_total

    stored_per_layer, full_per_layer = activation_bytes_per_layer(model, job, P)
    # Partial full recompute: k of the stage's layers keep only their input.
    k = P.full_recompute_layers(model.layers)
    act_mb = k * stored_per_layer + (layers_per_stage - k) * np.where(P.recompute == 2, full_per_layer,
                                                                      stored_per_layer)
    activations = act_mb * in_flight_microbatches(P)

    # Offload: the fraction moved out; HBM keeps at least two layers' worth (one computing,
    # one in transfer) of whatever is offloaded (DESIGN.md, Offload).
    two_layers = 2.0 / layers_per_stage
    def _kept(total, frac):
        return np.where(frac > 0, total * np.maximum(1.0 - frac, np.minimum(two_layers, 1.0)), total)
    hbm_weights = _kept(weights, P.offload_weights)
    hbm_grads = _kept(grads, P.offload_weights)
    hbm_optimizer = optimizer * (1.0 - P.offload_optimizer)
    hbm_activations = _kept(activations, P.offload_activations)
    offloaded = {"weights_grads_bytes": (weights - hbm_weights) + (grads - hbm_grads),
                 "optimizer_bytes": optimizer - hbm_optimizer,
                 "activations_bytes": activations - hbm_activations}
    offload_bytes = sum(offloaded.values())
    # the embedding / LM-head share of the model state in HBM, reported on its own line
    vocab_hbm_w = _kept(vocab_w * bpp.weights, P.offload_weights)
    vocab_hbm_g = _kept(vocab_g * grad_b, P.offload_weights)
    vocab_hbm_o = vocab_o * bpp.optimizer_total * (1.0 - P.offload_optimizer)

    # Transient buffers: one layer recomputed in full, and the fp32 logits of the LM head
    # (4·s·b·V/t, Korthikanti et al. 2022 §4.3) on the last stage.
    sbV = P.micro_batch * model.seq_length / P.cp * model.vocab
    workspace = gathered + np.where(P.recompute == 2, full_per_layer, 0.0) + 4.0 * sbV / P.tp

    hbm_total = hbm_weights + hbm_grads + hbm_optimizer + hbm_activations + workspace
    capacity = system.accelerator.hbm_capacity_bytes - job.hbm_reserve_gib * 2**30
    offload_capacity = system.offload.capacity_bytes if system.offload else 0.0
    return {
        "weights_bytes": hbm_weights - vocab_hbm_w, "grads_bytes": hbm_grads - vocab_hbm_g,
        "optimizer_bytes": hbm_optimizer - vocab_hbm_o,
        "embeddings_bytes": vocab_hbm_w + vocab_hbm_g + vocab_hbm_o,
        "activations_bytes": hbm_activations, "workspace_bytes": workspace,
        **{f"offload_{k}": v for k, v in offloaded.items()},
        "hbm_bytes": hbm_total, "hbm_capacity_bytes": np.full(len(P), capacity),
        "offload_bytes": offload_bytes, "offload_capacity_bytes": np.full(len(P), float(offload_capacity)),
        "activations_per_microbatch_bytes": act_mb, "opt_elems": opt_elems, "params_elems": params,
        "expert_params_elems": np.broadcast_to(expert, (len(P),)),
        # what one DP gradient reduce / parameter all-gather moves per GPU's model copy
        "grad_reduce_bytes": params * grad_wire_b,
        "param_gather_bytes": (blocks + expert) * block_wb + vocab * bpp.weights,
    }
