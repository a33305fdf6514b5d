"""FLOP counts of one transformer; per token unless the name says otherwise.

Source: Narayanan et al., SC'21, eq. (3): F = 96·B·s·l·h²·(1 + s/6h + V/16lh) per iteration with
full recompute (72·... without). Its pieces per token and layer: 24h² matmul FLOPs forward
(2 FLOPs per multiply-add over the 12h² weights), 4sh for the attention scores and the
attention-weighted values, and 2hV for the logits; backward = 2 × forward. Generalised here to
GQA (K/V width g·h/a), head_dim apart from h/a (query width a·d), SwiGLU (three ffn matrices),
MoE (top_k routed + shared experts per token; leading dense layers), MLA (DeepSeek-V2 §2.1: the
low-rank projections' weights, scores over nope+rope, values of v_head_dim) and DeepSeek-V3's MTP
modules (§2.2: one more layer + the 2h→h projection + the shared head's logits per module).
"""
from __future__ import annotations

from planner.model import ModelSpec


def attention_in_weights(model: ModelSpec) -> int:
    """Weight elements of the projections from the hidden state to queries, keys and values:
    Q, K, V (h×(a·d + 2·g·d)), or MLA's q_a/q_b (or q_proj), kv_a_proj_with_mqa and kv_b."""
    h = model.hidden
    mla = model.mla
    if mla is None:
        return h * (model.q_hidden + 2 * model.kv_hidden)
    q_out = model.heads * mla.qk_head_dim
    q = h * mla.q_lora_rank + mla.q_lora_rank * q_out if mla.q_lora_rank else h * q_out
    kv = h * (mla.kv_lora_rank + mla.qk_rope_head_dim) \
        + mla.kv_lora_rank * model.heads * (mla.qk_nope_head_dim + mla.v_head_dim)
    return q + kv


def mla_up_proj_flops_per_token(model: ModelSpec) -> float:
    """Forward FLOPs of MLA's up-projections (DeepSeek-V2 §2.1 eqs. 10-12 and 15-16: the query
    latent to heads·(nope+rope), the key/value latent to heads·(nope + v_head_dim)), the GEMMs
    Megatron's `mla_up_proj` recompute reruns; 0 without MLA (or for an uncompressed query's part)."""
    mla = model.mla
    if mla is None:
        return 0.0
    q = mla.q_lora_rank * model.heads * mla.qk_head_dim if mla.q_lora_rank else 0
    return 2.0 * (q + mla.kv_lora_rank * model.heads * (mla.qk_nope_head_dim + mla.v_head_dim))


def attention_out_width(model: ModelSpec) -> int:
    """Input width of the output projection: all heads' values (a·d, or a·v_head_dim for MLA)."""
    return model.heads * model.mla.v_head_dim if model.mla else model.q_hidden


def qkv_out_width(model: ModelSpec) -> int:
    """Output width of the fused QKV GEMM from h (MLA: the width of one h×w GEMM with the same
    weights, its low-rank chain folded into one equivalent matmul)."""
    return attention_in_weights(model) // model.hidden


def mlp_width(model: ModelSpec) -> int:
    """Output width of the first MLP GEMM (gate and up fused for SwiGLU)."""
    ffn = model.expert_ffn_hidden if model.moe else model.ffn_hidden
    return (2 if model.activation == "swiglu" else 1) * ffn


def attention_matmul_flops_per_token(model: ModelSpec) -> float:
    return 2.0 * (attention_in_weights(model) + attention_out_width(model) * model.hidden)


def _mlp_flops(model: ModelSpec, ffn: int, width: int | None = None) -> float:
    return 2.0 * model.mlp_matrices * (width or model.hidden) * ffn


def dense_mlp_matmul_flops_per_token(model: ModelSpec) -> float:
    return _mlp_flops(model, model.ffn_hidden)


def mlp_matmul_flops_per_token(model: ModelSpec) -> float:
    """One token's MLP GEMMs in the repeated layer: for MoE the top_k routed experts, the shared
    experts and the router; else the dense MLP."""
    if model.moe:
        # LatentMoE: the routed experts on latent-wide rows, plus the h <-> latent projections
        return model.moe.top_k * _mlp_flops(model, model.expert_ffn_hidden, model.expert_hidden) \
            + model.moe.shared_experts * _mlp_flops(model, model.shared_expert_ffn_hidden) \
            + 2.0 * model.hidden * model.moe.num_experts + 2.0 * model.latent_proj_params
    return dense_mlp_matmul_flops_per_token(model)


def layer_matmul_flops_per_token(model: ModelSpec) -> float:
    """Forward GEMM FLOPs of the repeated layer (the MoE layer of a MoE model) for one token
    (Narayanan eq. 3: 24h² for GPT)."""
    return attention_matmul_flops_per_token(model) + mlp_matmul_flops_per_token(model)


def mamba_matmul_flops_per_token(model: ModelSpec) -> float:
    """A Mamba-2 block's projections (Megatron-Core ssm/mamba_mixer.py): in_proj h → z, x, B, C,
    dt and out_proj d_inner → h."""
    m = model.mamba
    return 2.0 * model.hidden * m.in_proj_width + 2.0 * m.d_inner * model.hidden if m else 0.0


def ssd_flops_per_token(model: ModelSpec) -> float:
    """Forward FLOPs of a Mamba-2 block's state-space scan by the chunked SSD algorithm (Dao & Gu
    2024, "Transformers are SSMs", §6, chunk Q, state N, head dim P, H heads in G groups): inside a
    chunk the causal C·Bᵀ (Q·N per token and group) and its product with X (Q·P per token and
    head, both halved by the causal mask); across chunks each chunk's state Bᵀ·X and each token's
    readout C·state (2·N·P per token and head each)."""
    m = model.mamba
    if m is None:
        return 0.0
    q, n, p = model.ssd_chunk_tokens, m.state_dim, m.head_dim
    return float(m.groups * q * n + m.num_heads * (q * p + 4 * n * p))


def hybrid_block_matmul_flops_per_token(model: ModelSpec) -> dict[str, float]:
    """Forward GEMM FLOPs of one block of each kind of a hybrid stack (model.HYBRID_BLOCKS)."""
    moe = mlp_matmul_flops_per_token(model) if model.moe else 0.0
    return {"M": mamba_matmul_flops_per_token(model), "*": attention_matmul_flops_per_token(model),
            "-": dense_mlp_matmul_flops_per_token(model), "E": moe}


def transformer_matmul_flops_per_token(model: ModelSpec) -> float:
    """Forward GEMM FLOPs of all layers, leading dense layers counted with the dense MLP (a hybrid
    stack: each block as what it is)."""
    if model.hybrid_pattern:
        return sum(model.blocks(k) * f for k, f in hybrid_block_matmul_flops_per_token(model).items())
    dense = attention_matmul_flops_per_token(model) + dense_mlp_matmul_flops_per_token(model)
    return model.dense_layers * dense + model.moe_layers * layer_matmul_flops_per_token(model)


# Fraction of the s×s score matrix a causal fused kernel computes: the blocks above the diagonal
# are skipped, s(s+1)/2 of s² ≈ one half (FlashAttention-2, Dao 2023 §3.1 "causal masking").
CAUSAL_FRACTION = 0.5


def attention_core_flops_per_token(model: ModelSpec, seq_length: int | None = None,
                                   causal: bool = False) -> float:
    """QKᵀ and attention·V forward for one token: 2·s·a·d_qk + 2·s·a·d_v against the full
    sequence, = 4·s·h for plain multi-head attention (Narayanan eq. 3, and the convention of every
    MFU in ../shared/reference: NeMo/Bridge/dgxc count the whole s×s score matrix); MLA: d_qk =
    nope + rope, d_v = v_head_dim. `causal=True` gives what a causal fused kernel executes (half)."""
    s = seq_length or model.seq_length
    if model.mla:
        full = 2.0 * s * model.heads * (model.mla.qk_head_dim + model.mla.v_head_dim)
    else:
        full = 4.0 * s * model.q_hidden
    return full * (CAUSAL_FRACTION if causal else 1.0)


def executed_attention_core_flops_per_token(model: ModelSpec, flash_attention: bool) -> float:
    """Attention-core FLOPs the GPU runs: fused (flash) kernels skip the masked half, the unfused
    path computes the full score matrix and masks it. The time model and the hardware-FLOP count
    (HFU) both use this, so they cannot disagree."""
    return attention_core_flops_per_token(model, causal=flash_attention)


def logit_flops_per_token(model: ModelSpec) -> float:
    """LM head forward: 2·h·V (Narayanan eq. 3's V/16lh term, forward part)."""
    return 2.0 * model.hidden * model.vocab


def mtp_flops_per_token(model: ModelSpec) -> float:
    """Forward FLOPs of DeepSeek-V3's MTP modules (§2.2): each runs one more layer, the 2h→h
    projection and the shared output head on every token."""
    # a hybrid stack's module: one attention and one MoE block (their GEMMs are the layer's)
    per_module = layer_matmul_flops_per_token(model) + attention_core_flops_per_token(model) \
        + 2.0 * 2 * model.hidden * model.hidden + logit_flops_per_token(model)
    return model.mtp_layers * per_module


def model_flops_per_token(model: ModelSpec) -> float:
    """Forward + backward (3×) model FLOPs, no recompute: the numerator of MFU. Attention is
    counted over the full s×s matrix (non-causal), as the published MFUs we validate against
    count it, so at long sequence MFU exceeds the executed fraction of peak (see HFU). A hybrid
    stack adds its Mamba blocks' scans (ssd_flops_per_token)."""
    layers = transformer_matmul_flops_per_token(model) + model.attention_layers * attention_core_flops_per_token(model) \
        + model.blocks("M") * ssd_flops_per_token(model)
    return 3.0 * (layers + logit_flops_per_token(model) + mtp_flops_per_token(model))


def megatron_logged_flops_per_token(model: ModelSpec) -> float:
    """What Megatron-LM's own throughput counter divides by time (megatron/training/training.py,
    num_floating_point_operations, since mid-2025): model FLOPs with the attention core halved
    for the causal mask. The Megatron MoE ModelZoo's TFLOP/s are this: its Qwen3-235B FSDP row
    (276 TFLOP/s · 256 GPUs · 17.6 s over 2048·4096 tokens) is 148.2 GFLOP/token, this gives 148.3
    (the full-attention count, 167.3, is 13 % more; at 128K tokens 2.6× more)."""
    core = attention_core_flops_per_token(model) * (model.attention_layers + model.mtp_layers)
    return model_flops_per_token(model) - 3.0 * (1.0 - CAUSAL_FRACTION) * core


def hardware_flops_per_token(model: ModelSpec, recompute: str) -> float:
    """FLOPs actually executed: full recompute adds one layer forward (eq. 3's 96 vs 72),
    selective recompute adds the attention-core forward (Korthikanti et al. 2022 §5)."""
    core = model.attention_layers * attention_core_flops_per_token(model)
    ssd = model.blocks("M") * ssd_flops_per_token(model)
    extra = {"none": 0.0, "selective": core,
             "full": transformer_matmul_flops_per_token(model) + core + ssd}[recompute]
    return model_flops_per_token(model) + extra


def narayanan_eq3_flops(batch: int, seq: int, layers: int, hidden: int, vocab: int,
                        recompute: bool = True) -> float:
    """Narayanan et al. SC'21 eq. (3) verbatim (GPT, MHA, ffn = 4h), kept as the test's reference."""
    if recompute:
        return 96.0 * batch * seq * layers * hidden**2 * (1 + seq / (6 * hidden) + vocab / (16 * layers * hidden))
    return 72.0 * batch * seq * layers * hidden**2 * (1 + seq / (6 * hidden) + vocab / (12 * layers * hidden))
