"""Frontier-model schema (head_dim apart, MLA, shared experts, leading dense layers, MTP): parameter
counts against the published totals, FLOPs against those counts, validation messages."""
import pytest
from pydantic import ValidationError

from planner.analytical import flops
from planner.model import ModelSpec, load_model


def test_deepseek_v3_totals_match_the_report():
    # DeepSeek-V3 technical report (arXiv:2412.19437) abstract and §2.2 / HF README:
    # 671B total, 37B activated per token; 685B on Hugging Face with the 14B MTP module.
    m = load_model("deepseek-v3")
    assert (m.num_params - m.mtp_params) / 1e9 == pytest.approx(671, rel=0.01)
    # the HF 685B also stores the MTP module's own copies of embedding and head; we share them
    assert m.num_params / 1e9 == pytest.approx(685, rel=0.01)
    assert m.dense_layers == 3 and m.moe_layers == 58
    # "37B" has two digits: the weights a token multiplies (the embedding is a lookup)
    assert (m.active_params - m.embedding_params) / 1e9 == pytest.approx(37, abs=0.5)


def test_deepseek_v3_mla_weights_by_hand():
    # every MLA matrix of the DeepSeek-V3 checkpoint, shapes from its config.json
    h, heads = 7168, 128
    q_a, q_norm, q_b = h * 1536, 1536, 1536 * heads * (128 + 64)
    kv_a, kv_norm, kv_b = h * (512 + 64), 512, 512 * heads * (128 + 128)
    o = heads * 128 * h
    expected = q_a + q_norm + q_b + kv_a + kv_norm + kv_b + o
    assert load_model("deepseek-v3").attention_params == expected
    assert expected == 187_107_328  # 187.1M per layer
    # widths attention stores / CP exchanges: Q 128·192; K 128·192 + V 128·128
    m = load_model("deepseek-v3")
    assert m.q_hidden == 24576 and 2 * m.kv_hidden == 128 * 192 + 128 * 128


def test_mla_without_query_compression():
    # DeepSeek-V2-Lite style: q_lora_rank None -> a full q_proj h × heads·(nope+rope)
    mla = {"kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128}
    m = ModelSpec(layers=2, hidden=2048, heads=16, seq_length=4096, vocab=1000, biases=False, mla=mla)
    q = 2048 * 16 * 192
    kv = 2048 * 576 + 512 + 512 * 16 * 256
    assert m.attention_params == q + kv + 16 * 128 * 2048
    # MLA needs no hidden/heads divisibility: its head widths are its own
    odd = ModelSpec(layers=2, hidden=2000, heads=16, seq_length=4096, vocab=1000, biases=False, mla=mla)
    assert odd.q_hidden == 16 * 192


@pytest.mark.parametrize("preset,total_b,non_embedding_b,active_b", [
    # Qwen3 model cards (Qwen/Qwen3-235B-A22B, Qwen/Qwen3-30B-A3B): total, non-embedding, activated
    ("qwen3-235b-a22b", 235, 234, 22),
    ("qwen3-30b-a3b", 30.5, 29.9, 3.3),
])
def test_qwen3_moe_totals_match_model_cards(preset, total_b, non_embedding_b, active_b):
    m = load_model(preset)
    assert m.num_params / 1e9 == pytest.approx(total_b, rel=0.01)
    embeddings = m.embedding_params + m.vocab * m.hidden  # input embedding + untied head
    assert (m.num_params - embeddings) / 1e9 == pytest.approx(non_embedding_b, rel=0.01)
    # the cards print the active count to two digits
    assert m.active_params / 1e9 == pytest.approx(active_b, rel=0.02)


def test_qwen3_head_dim_apart_from_hidden():
    m = load_model("qwen3-235b-a22b")
    assert m.head_dim == 128 and m.q_hidden == 8192 and m.kv_hidden == 512  # 64·128, 4·128
    assert m.attention_params == 4096 * (8192 + 2 * 512) + 8192 * 4096 + 2 * 128  # + q/k norms


def test_gpt_oss_120b_matches_the_model_card_components():
    # OpenAI gpt-oss model card, Table 1: MLP 114.71B, attention 0.96B, embed+unembed 1.16B,
    # total 116.83B, active 5.13B (active counts the unembedding, not the embedding lookup)
    m = load_model("gpt-oss-120b")
    assert m.layers * (m.expert_params_per_layer + m.router_params) / 1e9 == pytest.approx(114.71, rel=0.001)
    assert m.layers * m.attention_params / 1e9 == pytest.approx(0.96, abs=0.005)
    assert 2 * m.vocab * m.hidden / 1e9 == pytest.approx(1.16, abs=0.005)
    assert m.num_params / 1e9 == pytest.approx(116.83, rel=0.001)
    assert (m.active_params - m.embedding_params) / 1e9 == pytest.approx(5.13, rel=0.01)


def test_llama31_405b_is_the_llama3_405b_transformer():
    a, b = load_model("llama3.1-405b"), load_model("llama3-405b")
    assert a.num_params == b.num_params
    assert a.num_params / 1e9 == pytest.approx(405, rel=0.01)  # Llama 3 herd paper: 405B


def test_shared_experts_and_dense_layers_split_the_count():
    moe = {"num_experts": 4, "top_k": 1, "expert_ffn": 64, "shared_experts": 2, "shared_expert_ffn": 32,
           "first_dense_layers": 1}
    m = ModelSpec(layers=3, hidden=16, heads=2, ffn=128, seq_length=8, vocab=10, activation="swiglu",
                  biases=False, tied_embeddings=False, position_embedding="rope", moe=moe)
    attention, norms = 4 * 16 * 16, 2 * 16
    dense_layer = attention + 3 * 16 * 128 + norms
    moe_layer = attention + 16 * 4 + 2 * 3 * 16 * 32 + 4 * 3 * 16 * 64 + norms
    assert (m.dense_layer_params, m.moe_layer_params) == (dense_layer, moe_layer)
    head = 10 * 16 + 16
    assert m.num_params == dense_layer + 2 * moe_layer + 10 * 16 + head
    active_moe = attention + 16 * 4 + 2 * 3 * 16 * 32 + 1 * 3 * 16 * 64 + norms
    assert m.active_params == dense_layer + 2 * active_moe + 10 * 16 + head


@pytest.mark.parametrize("preset", ["deepseek-v3", "qwen3-235b-a22b", "qwen3-30b-a3b", "mixtral-8x7b",
                                    "gpt-oss-120b", "llama3-70b"])
def test_layer_gemm_flops_are_twice_the_active_weights(preset):
    """Forward GEMM FLOPs per token = 2 × the weights a token multiplies (flops.py and model.py
    count independently; norms, biases and MLA's latent norms are the only difference)."""
    m = load_model(preset)
    active_layer_weights = m.active_params - m.embedding_params - m.output_params
    assert flops.transformer_matmul_flops_per_token(m) == pytest.approx(2 * active_layer_weights, rel=2e-3)


def test_mla_attention_core_and_mtp_flops_by_hand():
    m = load_model("deepseek-v3")
    s, h, V = 4096, 7168, 129280
    # QKᵀ over nope+rope (192) and attention·V over v_head_dim (128), 128 heads, forward
    assert flops.attention_core_flops_per_token(m) == 2 * s * 128 * 192 + 2 * s * 128 * 128
    no_mtp = m.model_copy(update={"mtp_layers": 0})
    layer = flops.layer_matmul_flops_per_token(m) + flops.attention_core_flops_per_token(m)
    extra = flops.model_flops_per_token(m) - flops.model_flops_per_token(no_mtp)
    assert extra == pytest.approx(3 * (layer + 2 * 2 * h * h + 2 * h * V), rel=1e-12)


def test_dense_model_flops_unchanged_by_explicit_head_dim():
    base = load_model("llama3-8b")
    explicit = load_model("llama3-8b", {"head_dim": 128})
    assert flops.model_flops_per_token(explicit) == flops.model_flops_per_token(base)


def test_validation_messages_name_the_fields():
    with pytest.raises(ValidationError, match="or give head_dim"):
        ModelSpec(layers=2, hidden=100, heads=3, seq_length=8, vocab=10)
    assert ModelSpec(layers=2, hidden=100, heads=3, head_dim=32, seq_length=8, vocab=10).q_hidden == 96
    with pytest.raises(ValidationError, match="first_dense_layers"):
        ModelSpec(layers=2, hidden=16, heads=2, seq_length=8, vocab=10,
                  moe={"num_experts": 2, "top_k": 1, "first_dense_layers": 2})
    with pytest.raises(ValidationError, match="capacity_factor"):
        ModelSpec(layers=2, hidden=16, heads=2, seq_length=8, vocab=10,
                  moe={"num_experts": 2, "top_k": 1, "capacity_factor": 0})


def megatron_flops_per_token_without_core(h, V, layers, dense_layers, ffn, moe_ffn, top_k, shared_ffn, heads,
                                          q_lora, kv_lora, nope, rope, v_dim, mtp):
    """Megatron-LM's own count (megatron/training/training.py, num_floating_point_operations, MLA
    branch, commit 001b00c), per token, minus its causal-half attention core: 3 (fwd + 2 bwd) ×
    2 (FMA) × [MLP: dense 3·ffn·h, routed top_k·3·moe_ffn·h, shared 3·shared_ffn·h; MLA:
    q_lora·(h + heads·(nope+rope) + 1) + kv_lora·(h + heads·(nope+v) + 1) + h·rope + heads·v·h;
    MTP: each module one more (MoE) layer + 3h norms + 2h² projection; logits h·V·(1 + mtp)]."""
    moe_layers = layers - dense_layers + mtp
    mlp = h * (3 * ffn * dense_layers + (3 * moe_ffn * top_k + 3 * shared_ffn) * moe_layers)
    attn = (q_lora * (h + heads * (nope + rope) + 1) + kv_lora * (h + heads * (nope + v_dim) + 1)
            + h * rope + heads * v_dim * h) * (layers + mtp)
    return 6 * (mlp + attn + mtp * (3 * h + 2 * h * h) + h * V * (1 + mtp))


def test_deepseek_v3_model_flops_agree_with_megatrons_count():
    m = load_model("deepseek-v3")
    megatron = megatron_flops_per_token_without_core(7168, 129280, 61, 3, 18432, 2048, 8, 2048, 128,
                                                     1536, 512, 128, 64, 128, mtp=1)
    ours = flops.model_flops_per_token(m) - 3 * (m.layers + m.mtp_layers) * flops.attention_core_flops_per_token(m)
    # what the two counts treat differently, stated: we count the router GEMM (2hE per MoE layer,
    # MTP included); Megatron counts the latent norms (q_lora + kv_lora a layer) and MTP's 3h norms
    router = 6 * 7168 * 256 * (58 + 1)
    norms = 6 * ((1536 + 512) * (61 + 1) + 3 * 7168)
    assert ours - router == pytest.approx(megatron - norms, rel=1e-12)


def test_qk_norm_adds_one_head_dim_norm_for_queries_and_one_for_keys_per_layer():
    # HF Qwen3Attention: q_norm = k_norm = Qwen3RMSNorm(head_dim), shared by all heads
    m = load_model("qwen3-30b-a3b")
    assert m.qk_norm
    without = m.model_copy(update={"qk_norm": False})
    assert m.attention_params - without.attention_params == 2 * 128
    assert m.num_params - without.num_params == 48 * 2 * 128
