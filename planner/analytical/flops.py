"""FLOP counts of one transformer; per token unless the name says otherwise.

Source: Narayanan et al., SC'21, eq. (3): F = 96·B·s·l·h²·(1 + s/6h + V/16lh) per iteration with
full recompute (72·... without). Its pieces per token and layer: 24h² matmul FLOPs forward
(2 FLOPs per multiply-add over the 12h² weights), 4sh for the attention scores and the
attention-weighted values, and 2hV for the logits; backward = 2 × forward. Generalised here to
GQA (K/V width g·h/a), SwiGLU (three ffn matrices) and MoE (top_k experts per token).
"""
from __future__ import annotations

from planner.model import ModelSpec


def qkv_out_width(model: ModelSpec) -> int:
    return model.hidden + 2 * model.kv_hidden


def mlp_width(model: ModelSpec) -> int:
    """Output width of the first MLP GEMM (gate and up fused for SwiGLU)."""
    ffn = model.expert_ffn_hidden if model.moe else model.ffn_hidden
    return (2 if model.activation == "swiglu" else 1) * ffn


def attention_matmul_flops_per_token(model: ModelSpec) -> float:
    h = model.hidden
    return 2.0 * (h * qkv_out_width(model) + h * h)


def mlp_matmul_flops_per_token(model: ModelSpec) -> float:
    """One token's MLP GEMMs: top_k experts for MoE, plus the router."""
    ffn = model.expert_ffn_hidden if model.moe else model.ffn_hidden
    dense = 2.0 * model.mlp_matrices * model.hidden * ffn
    if model.moe:
        return model.moe.top_k * dense + 2.0 * model.hidden * model.moe.num_experts
    return dense


def layer_matmul_flops_per_token(model: ModelSpec) -> float:
    """Forward GEMM FLOPs of one layer for one token (Narayanan eq. 3: 24h² for GPT)."""
    return attention_matmul_flops_per_token(model) + mlp_matmul_flops_per_token(model)


# Fraction of the s×s score matrix a causal fused kernel computes: the blocks above the diagonal
# are skipped, s(s+1)/2 of s² ≈ one half (FlashAttention-2, Dao 2023 §3.1 "causal masking").
CAUSAL_FRACTION = 0.5


def attention_core_flops_per_token(model: ModelSpec, seq_length: int | None = None,
                                   causal: bool = False) -> float:
    """QKᵀ and attention·V forward for one token: 4·s·h against the full sequence (Narayanan
    eq. 3, and the convention of every MFU in ../shared/reference: NeMo/Bridge/dgxc count the
    whole s×s score matrix); `causal=True` gives what a causal fused kernel executes (half)."""
    s = seq_length or model.seq_length
    return 4.0 * s * model.hidden * (CAUSAL_FRACTION if causal else 1.0)


def executed_attention_core_flops_per_token(model: ModelSpec, flash_attention: bool) -> float:
    """Attention-core FLOPs the GPU runs: fused (flash) kernels skip the masked half, the unfused
    path computes the full score matrix and masks it. The time model and the hardware-FLOP count
    (HFU) both use this, so they cannot disagree."""
    return attention_core_flops_per_token(model, causal=flash_attention)


def logit_flops_per_token(model: ModelSpec) -> float:
    """LM head forward: 2·h·V (Narayanan eq. 3's V/16lh term, forward part)."""
    return 2.0 * model.hidden * model.vocab


def model_flops_per_token(model: ModelSpec) -> float:
    """Forward + backward (3×) model FLOPs, no recompute: the numerator of MFU. Attention is
    counted over the full s×s matrix (non-causal), as the published MFUs we validate against
    count it, so at long sequence MFU exceeds the executed fraction of peak (see HFU)."""
    per_layer = layer_matmul_flops_per_token(model) + attention_core_flops_per_token(model)
    return 3.0 * (model.layers * per_layer + logit_flops_per_token(model))


def hardware_flops_per_token(model: ModelSpec, recompute: str) -> float:
    """FLOPs actually executed: full recompute adds one layer forward (eq. 3's 96 vs 72),
    selective recompute adds the attention-core forward (Korthikanti et al. 2022 §5)."""
    extra = {"none": 0.0,
             "selective": attention_core_flops_per_token(model),
             "full": layer_matmul_flops_per_token(model) + attention_core_flops_per_token(model)}[recompute]
    return model_flops_per_token(model) + model.layers * extra


def narayanan_eq3_flops(batch: int, seq: int, layers: int, hidden: int, vocab: int,
                        recompute: bool = True) -> float:
    """Narayanan et al. SC'21 eq. (3) verbatim (GPT, MHA, ffn = 4h), kept as the test's reference."""
    if recompute:
        return 96.0 * batch * seq * layers * hidden**2 * (1 + seq / (6 * hidden) + vocab / (16 * layers * hidden))
    return 72.0 * batch * seq * layers * hidden**2 * (1 + seq / (6 * hidden) + vocab / (12 * layers * hidden))
