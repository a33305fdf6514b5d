"""What the kernel stack (JobSpec.kernels) costs in element-wise HBM traffic per layer.

Transformer Engine / Megatron ("te") fuse the norms, RoPE and the activation into single kernels;
the model's historical lump (time.ELEMENTWISE_PASSES_HIDDEN / _FFN, fitted with the hardware
efficiencies on the Megatron rows) stays what it was. The PyTorch-native stacks run the model's
own modules: in eager mode every ATen op of a chain is one kernel that reads its inputs from HBM
and writes its output back; torch.compile (Inductor) fuses each pointwise/reduction chain into
one kernel that reads the chain's inputs once and writes its outputs once.

Bytes per element moved in forward, counted op by op from the module code of the runs:
torchtitan's Llama (torchtitan/models/llama/model.py @ 9dec370, the commit of its Dec 2024
benchmark tables: RMSNorm computes in fp32, RoPE through complex fp32, repeat_kv for GQA, SwiGLU
as silu(w1 x) * w3 x) and llm-foundry's MPT (low_precision_layernorm = one F.layer_norm kernel,
nn.GELU, flash-attn on the (b, s, h, d) layout). Backward is charged as time.BACKWARD_FACTOR
times forward, as for every other element-wise term. Not counted (small): the attention output's
transpose copy before the output projection in torchtitan.
"""
from __future__ import annotations

from planner.analytical import precision
from planner.model import ModelSpec

# RMSNorm, eager: x.float() 2+4, pow(2) 4+4, mean 4, x*rsqrt 4+4, type_as 4+2, *weight 2+2 = 36.
EAGER_RMSNORM_BYTES = 36.0
# One fused norm kernel (F.layer_norm; RMSNorm under Inductor): read 2, write 2.
FUSED_NORM_BYTES = 4.0
# RoPE on each q and k element, eager: float() 2+4, complex multiply 4+4, type_as 4+2 = 20.
EAGER_ROPE_BYTES = 20.0
FUSED_ROPE_BYTES = 4.0
# repeat_kv (GQA): expand + reshape copies K and V to all query heads, read 2 + write 2 per output
# element (each of K and V); Inductor cannot avoid it either (SDPA takes materialised inputs).
REPEAT_KV_BYTES = 4.0
# residual add: read 2 + 2, write 2; two per layer in every stack.
RESIDUAL_ADD_BYTES = 6.0
# SwiGLU per ffn element: eager silu 2+2 then multiply 2+2+2 = 10; fused one kernel 2+2+2 = 6.
EAGER_SWIGLU_BYTES = 10.0
FUSED_SWIGLU_BYTES = 6.0
# GELU (MPT's nn.GELU; squared ReLU alike): one kernel in either mode, read 2 + write 2.
GELU_BYTES = 4.0
# Achieved fraction of HBM bandwidth of one streaming element-wise kernel (read its inputs once,
# write its output once): the residual add measured on an H100 reaches 2163-2458 GB/s of 3350
# (planner/data/h100_elementwise.csv, fwd+bwd over the fewest bytes), 0.65-0.73. The torch stacks'
# bytes above are counted kernel by kernel, so each moves at this rate; TE's fused lump keeps the
# fitted `hbm_efficiency` (it also absorbs what that fit cannot name).
STREAMING_HBM_EFFICIENCY = 0.70
# Loss over the logits, JobSpec.loss_kernel "flash-attn": the flash-attn package's fused
# cross-entropy (flash_attn/losses/cross_entropy.py, the xentropy kernel llm-foundry's MPT runs as
# its default loss_fn "fused_crossentropy", llmfoundry/models/mpt/modeling_mpt.py) works on the
# 16-bit logits in place of an fp32 copy: forward one read of each logit (the row's max and
# sum of exponentials, the row held on chip), backward one read and one gradient write.
FLASH_XENTROPY_FWD_BYTES = 2.0
FLASH_XENTROPY_BWD_BYTES = 4.0
# Attention kernels run narrow heads at a lower fraction of peak: per (query, key) pair a head
# does 4·d FLOPs of matrix work but a softmax (exponential, max, rescale) that does not shrink
# with d. Measured on an H100 (planner/data/h100_attention.csv, causal, fwd+bwd, seq 2048-8192),
# heads of 96 reach 0.79-0.81 of the 128-wide throughput with cuDNN's fused attention (TE's) and
# 0.88-0.89 with FlashAttention-2: (d/128)^k with k = ln(ratio)/ln(96/128), the mean over the
# three sequence lengths. Heads of 128 and wider (MLA's 192-wide queries and keys) run at the
# fitted ceilings, which were fitted on 128-wide heads.
# Measured since, and not applied (planner/data/h100_attention_head_dims.csv, 32 heads, seq
# 4096/8192): cuDNN ran 64-wide heads at 0.78 of 128-wide throughput, not the 0.58 this power law
# gives GPT-OSS, 192/128 (MLA) at 0.89, 192/192 at 0.71, 256 at 0.81. Applied as a table, the
# MoE rows moved 9.1 -> 9.0 % in sample but the held-out Bridge rows 13.0 -> 13.5 % (GPT-OSS H100
# -4.6 -> -7.3 %, already too fast: its sink/sliding-window attention kernels are not costed;
# DeepSeek-V3 on B300/GB300 +6 -> +8 %: Blackwell's MLA kernels are not measured), so the
# training runs do not support carrying the H100 kernel ratios over yet.
# Applied to cuDNN's fused kernel only (not the unfused score path of 2021 Megatron): the torch stacks' 64-wide-head rows (llm-foundry MPT-350M on
# A100, Triton FlashAttention, seq 2048-16384) are predicted within 5 % at those ceilings and
# 13-18 % slow with the H100 FlashAttention-2 factor, so that measurement does not carry over to
# them; the "flash" exponent is kept for the record, not used.
ATTENTION_HEAD_DIM_EXPONENT = {"cudnn": 0.784, "flash": 0.417}
REFERENCE_HEAD_DIM = 128


def per_op_checkpointing(model: ModelSpec, job) -> bool:
    """Whether a job's "selective" recompute is torchtitan's per-op policy (time.OP_SAC_ATTENTION_PROJ_RERUN,
    memory.op_sac_saved_per_layer): a torch stack's dense layers (not MoE, not a hybrid stack)."""
    return job.kernels != "te" and not model.moe and not model.hybrid_pattern


def attention_head_dim_factor(model: ModelSpec, backend: str) -> float:
    """Throughput of the attention kernel at the model's head width relative to 128-wide heads;
    `backend` "cudnn" (Transformer Engine's fused attention) or "flash" (FlashAttention-2 and
    the Triton port of it)."""
    width = model.mla.qk_head_dim if model.mla else model.head_dim
    return min(1.0, width / REFERENCE_HEAD_DIM) ** ATTENTION_HEAD_DIM_EXPONENT[backend]


# torchtitan's MoE layer under either torch stack (the only MoE runs on one): models/moe/moe.py
# MoE.forward and distributed/expert_parallel.py ExpertParallel._token_dispatch/_token_combine
# (_permute/_unpermute) @ b3da1a2d, the commit of its Llama-4 Scout MXFP8 record. torch.compile
# wraps the router, the reorderer and the shared experts, but neither the routed experts with
# their dispatch/combine hooks nor MoE.forward's own code (models/llama4/infra/parallelize.py
# apply_compile: "We don't compile token dispatch and token combine due to an issue on B200"), so
# those run as eager ATen ops, each reading its inputs and writing its output once. Bytes per
# hidden element, forward:
#   per routed row before dispatch / after combine: gather x[idx] 2+2, .to(float32) 2+4, times
#   the score 4+4, .to(bf16) 4+2 (score_before_experts), torch.zeros of the unsorted output 2,
#   its index_put 2+2, the read side of sum over top_k 2 = 32;
#   per received row (the busiest rank's share): _permute's gather into expert order 2+2 and
#   _unpermute's index_put back 2+2 = 8;
#   per token: the write side of the top_k sum 2, shared + routed add 2+2+2 = 8.
TORCHTITAN_MOE_ROUTED_ROW_BYTES = 32.0
TORCHTITAN_MOE_RECEIVED_ROW_BYTES = 8.0
TORCHTITAN_MOE_TOKEN_BYTES = 8.0


def torch_moe_bytes(model: ModelSpec, kernels: str) -> dict[str, float]:
    """Forward element-wise bytes of a MoE layer under a torch stack, by where they fall:
    "routed_row" and "received_row" per routed row per hidden element, "token" per token per
    hidden element (TORCHTITAN_MOE_*), "expert_act" per routed row per expert-FFN element (the
    experts' SwiGLU, never compiled: eager silu then multiply) and "shared_act" per token per
    shared-expert FFN element (compiled with the shared experts under torch.compile)."""
    swiglu = model.activation == "swiglu"
    eager_act = EAGER_SWIGLU_BYTES if swiglu else GELU_BYTES
    shared_act = (FUSED_SWIGLU_BYTES if kernels == "torch-compile" else EAGER_SWIGLU_BYTES) if swiglu else GELU_BYTES
    return {"routed_row": TORCHTITAN_MOE_ROUTED_ROW_BYTES, "received_row": TORCHTITAN_MOE_RECEIVED_ROW_BYTES,
            "token": TORCHTITAN_MOE_TOKEN_BYTES, "expert_act": eager_act, "shared_act": shared_act}


# Megatron-Core's unfused RoPE (megatron/core/models/common/embeddings/rope_utils.py
# _apply_rotary_pos_emb_bshd, megatron-core 0.19.2 and the Megatron-LM commits Megatron-Bridge
# 26.04-26.08 pin), bytes per q or k element, forward, 2-byte activations, op by op: t * cos 2+2;
# _rotate_half: the negated half 1+1 (per element of the whole) and torch.cat 2+2; * sin 2+2; the
# add 2+2+2; the final torch.cat with the empty pass-through part 2+2 = 24 (cos/sin are per
# position, negligible). Megatron-Bridge switches apply_rope_fusion off for every
# position_embedding_type but "rope" (src/megatron/bridge/utils/fusions.py
# validate_rope_fusion_compatibility, called in models/gpt_provider.py provide(); @0fbfe7d3 26.04,
# @fcbb6031 26.06), and its GPT-OSS bridge sets "yarn" (models/gpt_oss/gpt_oss_bridge.py
# provider_bridge); Megatron's own fused path also refuses a YaRN mscale != 1 (rope_utils.py
# apply_rotary_pos_emb). TE's fitted lump already holds a fused RoPE (FUSED_ROPE_BYTES), so a YaRN
# model under Megatron pays the difference.
UNFUSED_ROPE_BYTES = 24.0
# Megatron-Core's clamped quick-GeGLU on the routed experts (megatron/core/fusions/fused_bias_geglu.py
# weighted_bias_quick_geglu_impl, called by moe/experts.py TEGroupedMLP with bias_activation_fusion,
# which the GPT-OSS bridge sets): before the jit-fused activation kernel (one read of the FC1
# output, one write: SwiGLU's cost, in the fitted lump) it clamps the gate half (max only) and the
# linear half (both sides) eagerly and concatenates them again, bytes per element of the
# activation's output (ffn wide), forward: clamp of the gate half 2+2, of the linear half 2+2,
# torch.cat of both halves 4+4 = 16. Transformer Engine's fused grouped MLP (the op fuser's
# ScaledClampedQGeGLU with `limit`, JobSpec.fused_grouped_mlp) clamps inside its kernel: nothing
# extra there.
CLAMP_GLU_BYTES = 16.0

# Megatron-Core's routed-expert FC2 bias (moe/experts.py TEGroupedMLP: linear_fc2 with
# skip_bias_add=True, then _apply_bias: for each local expert t + b * p on its rows, eager, and
# torch.cat of the experts' outputs; megatron-core 0.19.2 and the Megatron-LM commits Bridge
# 26.04-26.08 pin), bytes per routed row per hidden element, forward, 16-bit probabilities (the
# router computes in the input dtype unless moe_router_dtype is set, which the GPT-OSS recipes do
# not; TE's fused router returns probs in the logits dtype): b * p written 2, the add 2+2+2,
# torch.cat 2+2 = 12. The FC1 bias is added in the GEMM's epilogue (skip_bias_add=False); TE's
# fused grouped MLP carries both biases inside its kernels.
EXPERT_FC2_BIAS_BYTES = 12.0


def expert_fc2_bias_bytes(model: ModelSpec, kernels: str, fused_mlp: bool) -> float:
    """Forward bytes per routed row per hidden element of Megatron's eager FC2 bias on the routed
    experts (EXPERT_FC2_BIAS_BYTES); 0 without linear biases, under the torch stacks, or with
    TE's fused grouped MLP."""
    if kernels != "te" or not model.biases or model.moe is None or fused_mlp:
        return 0.0
    return EXPERT_FC2_BIAS_BYTES


def unfused_rope_extra_bytes_per_token(model: ModelSpec, kernels: str) -> float:
    """Forward bytes per token that Megatron's unfused RoPE moves beyond the fused RoPE of TE's
    lump: a YaRN RoPE under Megatron ("te"), over every query and key element (MLA's decoupled
    RoPE is not covered: 0)."""
    if kernels != "te" or model.rope_scaling != "yarn" or model.mla:
        return 0.0
    return (UNFUSED_ROPE_BYTES - FUSED_ROPE_BYTES) * (model.q_hidden + model.kv_hidden)


def clamp_glu_bytes(model: ModelSpec, kernels: str, fused_mlp: bool) -> float:
    """Forward bytes per routed row per expert-FFN element of the eager clamp in front of
    Megatron's fused gated activation (CLAMP_GLU_BYTES); 0 without a clamp, under the torch
    stacks, or with TE's fused grouped MLP."""
    if kernels != "te" or model.activation_clamp is None or fused_mlp:
        return 0.0
    return CLAMP_GLU_BYTES


def torch_elementwise_bytes(model: ModelSpec, kernels: str) -> tuple[float, float]:
    """(bytes per token scaling with the hidden side, bytes per token per unit of MLP width) of
    one layer's forward under a torch stack ("torch-eager" or "torch-compile")."""
    eager = kernels == "torch-eager"
    norm = EAGER_RMSNORM_BYTES if (eager and model.rms_norm) else FUSED_NORM_BYTES
    hidden = 2 * norm * model.hidden + 2 * RESIDUAL_ADD_BYTES * model.hidden
    if model.position_embedding == "rope":
        rope = EAGER_ROPE_BYTES if eager else FUSED_ROPE_BYTES
        hidden += rope * (model.q_hidden + model.kv_hidden)
    if model.kv_groups < model.heads:
        hidden += 2 * REPEAT_KV_BYTES * model.q_hidden
    if model.activation == "swiglu":
        per_ffn = EAGER_SWIGLU_BYTES if eager else FUSED_SWIGLU_BYTES
    else:
        per_ffn = GELU_BYTES
    return hidden, per_ffn


def fused_loss_bytes(loss_kernel: str) -> tuple[float, float] | None:
    """(forward, backward) bytes per logit element of a fused loss kernel; None for the fp32
    softmax passes (time.CROSS_ENTROPY_PASSES)."""
    if loss_kernel == "flash-attn":
        return FLASH_XENTROPY_FWD_BYTES, FLASH_XENTROPY_BWD_BYTES
    return None


def quantise_bytes_per_element(dtype: str, kernels: str, non_tn_fp8_gemm: bool = False) -> float:
    """Bytes moved per quantised element (precision.QUANTISE_BYTES_PER_ELEMENT). Under
    torch.compile, torchao's per-tensor current scaling (Float8Linear, tensorwise) computes the
    amax inside the kernel that produces the tensor (Inductor fuses the reduction into it), so
    the separate 2-byte amax read of Transformer Engine's current scaling disappears and the
    cast costs what delayed scaling's does. Transformer Engine's per-tensor casts skip the
    transposed copy where FP8 GEMMs take any layout (`non_tn_fp8_gemm`: precision.quantise_bytes);
    torchao's are taken as they are on Hopper (no source here says otherwise)."""
    if kernels == "torch-compile" and dtype == "fp8-cs":
        return precision.QUANTISE_BYTES_PER_ELEMENT["fp8"]
    return precision.quantise_bytes(dtype, non_tn_fp8_gemm and kernels == "te")


# The static modules of each layer kind that per-layer CUDA graphs can capture (Megatron-Core
# enums.CudaGraphModule; `moe` captures the whole MoE layer, drop-and-pad only). The routed
# experts of a dropless MoE layer are dynamic and stay eager.
STATIC_MODULES = {"dense": ({"attn", "mlp"},), "moe": ({"attn", "moe_router", "moe_preprocess"}, {"attn", "moe"})}
# A hybrid stack's blocks (model.HYBRID_BLOCKS), each captured by its own module's graph.
BLOCK_STATIC_MODULES = {"M": ({"mamba"},), "*": ({"attn"},), "-": ({"mlp"},),
                        "E": ({"moe_router", "moe_preprocess"}, {"moe"})}


def block_launches_captured(kind: str, job) -> bool:
    """layer_launches_captured for one block of a hybrid stack."""
    captured = set(job.cuda_graph_modules)
    return job.full_iteration_cuda_graph or any(needed <= captured for needed in BLOCK_STATIC_MODULES[kind])


def layer_launches_captured(moe_layer: bool, job) -> bool:
    """Whether a layer's per-layer launch overhead (efficiency.layer_overhead_us) is gone: a
    full-iteration graph, or per-layer graphs of every static module of the layer's kind (the DeepSeek-V3
    GB200 guide @1d9edcf8 §2.3: attention, router, EP preprocess and shared experts captured, "only the
    routed experts part still has some CPU overhead")."""
    if job.full_iteration_cuda_graph:
        return True
    captured = set(job.cuda_graph_modules)
    return any(needed <= captured for needed in STATIC_MODULES["moe" if moe_layer else "dense"])
