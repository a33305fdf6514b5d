"""Hugging Face configs of models without a preset, found misread by an audit (2026-11-29): the
original Qwen's MLP width, GPT-NeoX's and Qwen's RoPE keys, and a DeepSeek-V2 config that leaves
its untied head to Hugging Face's default."""
import json

import pytest
from typer.testing import CliRunner

from hardware.errors import SpecError
from planner.cli import app
from planner.hf_config import approximation_notes
from planner.model import load_model
from tests.conftest import HF_FIXTURES, hf_fixture_config, write_hf_config


def _argv(model: str, *plan: str) -> list[str]:
    out = CliRunner().invoke(app, ["megatron", "-m", model, "-s", "h100-sxm", "-g", "64", "-b", "256",
                                   "--tp", "2", "--pp", "2", *plan, "--format", "json"])
    assert out.exit_code == 0, out.output
    return json.loads(out.stdout)["argv"]


def test_original_qwen_mlp_is_half_its_intermediate_size():
    """Qwen-1.8B (model card: 1.8B; arXiv:2309.16609 Table 1) by hand, from its config.json and
    modeling_qwen.py: w1, w2 are intermediate_size // 2 = 5504 wide, c_attn has q/k/v biases,
    c_proj and the MLP none (no_bias), untied head:
      embedding + head   2 · 151,936 · 2,048                                   =   622,329,856
      per layer          2,048 · 6,144 + 6,144 (c_attn) + 2,048² (c_proj)
                         + 3 · 2,048 · 5,504 (w1, w2, c_proj) + 2 · 2,048 (ln)  =    50,604,032
      24 layers + ln_f   24 · 50,604,032 + 2,048                               = 1,214,498,816
      total                                                                     = 1,836,828,672
    Read as written (MLP 11,008 wide, no biases) it was 2.65 B, 44 % over."""
    m = load_model(str(HF_FIXTURES / "qwen-1.8b"))
    assert m.num_params == 1_836_828_672
    assert (m.ffn, m.activation, m.qkv_bias, m.biases, m.tied_embeddings) == (5504, "swiglu", True, False, False)
    argv = _argv(str(HF_FIXTURES / "qwen-1.8b"))
    assert argv[argv.index("--ffn-hidden-size") + 1] == "5504" and "--add-qkv-bias" in argv
    assert argv[argv.index("--rotary-base") + 1] == "10000"  # rotary_emb_base


def test_an_odd_original_qwen_intermediate_size_is_one_line(tmp_path):
    path = write_hf_config(tmp_path, dict(hf_fixture_config("qwen-1.8b"), intermediate_size=11007))
    with pytest.raises(SpecError, match="intermediate_size 11007 must be even for model_type \"qwen\""):
        load_model(str(path))
    out = CliRunner().invoke(app, ["count", "-m", str(path), "-s", "h100-sxm", "-g", "8"])
    assert out.exit_code == 2 and "Traceback" not in out.output


def test_gpt_neox_and_qwen_rope_keys_are_read(tmp_path):
    """GPTNeoXConfig and QWenConfig write RoPE's fraction and base as rotary_pct / rotary_emb_base
    (Pythia: rotary_pct 0.25; Qwen-72B: rotary_emb_base 1,000,000): read as partial_rotary_factor
    and rope_theta, and launched; they had been dropped (RoPE on every channel, base 10000)."""
    path = write_hf_config(tmp_path, dict(hf_fixture_config("qwen-1.8b"), rotary_pct=0.25, rotary_emb_base=1_000_000))
    m = load_model(str(path))
    assert (m.rotary_percent, m.rope_base) == (0.25, 1_000_000)
    argv = _argv(str(path))
    assert argv[argv.index("--rotary-percent") + 1] == "0.25"
    assert argv[argv.index("--rotary-base") + 1] == "1000000"
    # the newer key wins where a config gives both
    both = write_hf_config(tmp_path, dict(hf_fixture_config("qwen-1.8b"), rotary_pct=0.25, partial_rotary_factor=0.5), "both.json")
    assert load_model(str(both)).rotary_percent == 0.5
    for key, value in (("rotary_pct", 0), ("rotary_emb_base", 0.5)):
        with pytest.raises(SpecError, match=f"{key} must be a number"):
            load_model(str(write_hf_config(tmp_path, dict(hf_fixture_config("qwen-1.8b"), **{key: value}), f"{key}.json")))


def test_deepseek_v2_without_tie_word_embeddings_keeps_its_own_head(tmp_path):
    """transformers' DeepseekV2Config defaults tie_word_embeddings to False: a DeepSeek-V2-Lite
    config without the key (as mlc-llm's copy of it) is the same 15.7 B model (model card), not
    one 0.21 B (102,400 · 2,048) smaller with a tied head."""
    cfg = hf_fixture_config("deepseek-v2-lite")
    del cfg["tie_word_embeddings"]
    written = load_model(str(HF_FIXTURES / "deepseek-v2-lite"))
    left_out = load_model(str(write_hf_config(tmp_path, cfg)))
    assert not left_out.tied_embeddings and left_out.num_params == written.num_params
    assert written.num_params / 1e9 == pytest.approx(15.7, rel=0.01)


def test_nemotron_h_layers_block_type_is_its_block_pattern(tmp_path):
    """transformers 5's NemotronHConfig lists the blocks as layers_block_type and derives
    num_hidden_layers from it (Nemotron 3 Ultra, Nemotron 3.5 Lightning): it had been refused as
    "missing num_hidden_layers". Nemotron 3 Ultra 550B-A55B: 48 Mamba-2, 12 attention and 48
    LatentMoE blocks, one MTP module of attention + MoE; 550 B without the MTP module and 55 B
    active without the embedding (the model's name)."""
    m = load_model(str(HF_FIXTURES / "nemotron-3-ultra"))
    assert m.layers == 108 and (m.hybrid_pattern.count("M"), m.hybrid_pattern.count("*"),
                                m.hybrid_pattern.count("E")) == (48, 12, 48)
    assert m.hybrid_pattern.startswith("MEMEMEM*E") and m.mtp_layers == 1 and m.moe.latent_size == 2048
    assert (m.num_params - m.mtp_params) / 1e9 == pytest.approx(550, rel=0.01)
    assert (m.active_params - m.embedding_params) / 1e9 == pytest.approx(55, rel=0.01)
    cfg = hf_fixture_config("nemotron-3-ultra")
    for edit, message in (({"num_hidden_layers": 100}, "layers_block_type lists 108 layers, num_hidden_layers is 100"),
                          ({"layers_block_type": ["mamba", "linear_attention"]}, "layers_block_type names linear_attention"),
                          ({"mtp_layers_block_type": ["attention", "mlp"]}, "mtp_hybrid_override_pattern '\\*-'")):
        path = write_hf_config(tmp_path, dict(cfg, **edit))
        with pytest.raises(SpecError, match=message):
            load_model(str(path))


def test_minimax_attn_type_list_of_softmax_layers_is_read(tmp_path):
    """NVIDIA's MiniMax-M2.5 / M2.7 checkpoints write attn_type_list, 1 (softmax attention) for each
    of the 62 layers, where MiniMaxAI's config.json has none (ai-dynamo/aiconfigurator 095f58a51
    model_configs): the same model, which had been refused as a linear-attention hybrid. A 0
    (lightning attention, MiniMax-M1) is still refused by name."""
    cfg = hf_fixture_config("minimax-m2.5")
    plain = load_model(str(HF_FIXTURES / "minimax-m2.5"))
    listed = load_model(str(write_hf_config(tmp_path, dict(cfg, attn_type_list=[1] * 62))))
    assert listed.num_params == plain.num_params and listed.active_params == plain.active_params
    with pytest.raises(SpecError, match="attn_type_list marks a Mamba or linear-attention mixer"):
        load_model(str(write_hf_config(tmp_path, dict(cfg, attn_type_list=[0] + [1] * 61), "m1.json")))


def test_granite_shared_mlp_is_a_shared_expert(tmp_path):
    """GraniteMoeShared (and Granite 4.0's GraniteMoeHybrid) run a shared MLP beside the experts in
    every layer: gated SiLU, shared_intermediate_size wide, no output gate (transformers
    modeling_granitemoeshared.py GraniteMoeSharedMLP: input_linear h -> 2·w, output_linear w -> h).
    It had been dropped without a word. Mixtral-8x7B's shapes under that model_type with a
    14,336-wide shared MLP gain 32 layers · 3 · 4,096 · 14,336 = 5,637,144,576 parameters, total
    and active alike; with no experts the shared MLP is the layer's only MLP. Another model_type
    that writes the key is refused by name."""
    cfg = dict(hf_fixture_config("mixtral-8x7b"), model_type="granitemoeshared")
    plain = load_model(str(write_hf_config(tmp_path, cfg, "plain.json")))
    shared = load_model(str(write_hf_config(tmp_path, dict(cfg, shared_intermediate_size=14336))))
    added = 32 * 3 * 4096 * 14336
    assert shared.num_params - plain.num_params == added == shared.active_params - plain.active_params
    assert (shared.moe.shared_experts, shared.moe.shared_expert_ffn) == (1, 14336)
    argv = _argv(str(tmp_path / "config.json"), "--ep", "8")
    assert argv[argv.index("--moe-shared-expert-intermediate-size") + 1] == "14336"
    dense = {k: v for k, v in cfg.items() if k not in ("num_local_experts", "num_experts_per_tok")}
    assert load_model(str(write_hf_config(tmp_path, dict(dense, model_type="granitemoehybrid", shared_intermediate_size=8192),
                                 "dense.json"))).ffn == 8192
    with pytest.raises(SpecError, match="shared_intermediate_size 14336 .* is not read for model_type \"mixtral\""):
        load_model(str(write_hf_config(tmp_path, dict(cfg, model_type="mixtral", shared_intermediate_size=14336), "mx.json")))


def test_parallel_attention_and_mlp_blocks_are_said(tmp_path):
    """Cohere's layers add attention and MLP of the same normed input to the residual
    (transformers CohereDecoderLayer), which Megatron cannot launch: said, not silent. Aya-23-8B by
    hand (tied head, one LayerNorm per layer): 256,000 · 4,096 + 32 · (2 · 4,096² + 2 · 4,096 · 1,024
    + 3 · 4,096 · 14,336 + 4,096) + 4,096 = 8,028,033,024 (model card: 8B); the planner counts a
    second norm per layer, 32 · 4,096 more. GPT-NeoX says it with use_parallel_residual."""
    m = load_model(str(HF_FIXTURES / "aya-23-8b"))
    assert m.num_params - 32 * 4096 == 8_028_033_024 and m.tied_embeddings
    notes = approximation_notes(HF_FIXTURES / "aya-23-8b" / "config.json", 4096)
    assert any("attention and MLP run in parallel on the same input (model_type cohere)" in n for n in notes)
    neox = {"model_type": "gpt_neox", "hidden_size": 512, "num_hidden_layers": 2, "num_attention_heads": 8,
            "intermediate_size": 2048, "vocab_size": 1024, "hidden_act": "gelu"}
    for edit, said in (({}, "use_parallel_residual absent, true by default"),
                       ({"use_parallel_residual": True}, "use_parallel_residual true"),
                       ({"use_parallel_residual": False}, None)):
        notes = approximation_notes(write_hf_config(tmp_path, dict(neox, **edit)), 4096)
        assert any(said in n for n in notes) if said else not any("in parallel" in n for n in notes)


def test_olmo_whole_width_qk_norm_and_post_norm_are_said():
    """OLMo 2 normalises q and k over all heads at once and each sublayer's output, not its input
    (transformers Olmo2Attention / Olmo2DecoderLayer): Megatron launches neither, which had gone
    unsaid. OLMo-2-1124-7B by hand: 2 · 100,352 · 4,096 + 32 · (4 · 4,096² + 3 · 4,096 · 11,008
    + 4 · 4,096) + 4,096 = 7,298,617,344 (7.3B); the planner leaves out the q/k norms' 32 · 8,192."""
    m = load_model(str(HF_FIXTURES / "olmo-2-7b"))
    assert m.num_params + 32 * 8192 == 7_298_617_344 and not m.qk_norm
    notes = approximation_notes(HF_FIXTURES / "olmo-2-7b" / "config.json", 4096)
    assert any("q/k RMSNorm over all heads' width at once" in n and "post-norm" in n for n in notes)


def test_deepseek_sparse_attention_layer_types_are_the_dsa_model(tmp_path):
    """NVIDIA's GLM-5.2 checkpoint lists its 78 layers as deepseek_sparse_attention in layer_types,
    zai-org's config.json not at all (ai-dynamo/aiconfigurator 095f58a51 model_configs): the same
    model, which had been refused as a linear-attention hybrid from the one copy. Read as the DSA
    that index_topk gives (costed as dense MLA, and said); without index_topk still refused."""
    cfg = hf_fixture_config("glm-5")
    listed = load_model(str(write_hf_config(tmp_path, dict(cfg, layer_types=["deepseek_sparse_attention"] * 78))))
    assert listed.num_params == load_model(str(HF_FIXTURES / "glm-5")).num_params
    notes = approximation_notes(tmp_path / "config.json", 4096)
    assert any("DeepSeek Sparse Attention (index_topk 2048)" in n for n in notes)
    bare = {k: v for k, v in cfg.items() if k != "index_topk"}
    with pytest.raises(SpecError, match="layer_types has deepseek_sparse_attention layers"):
        load_model(str(write_hf_config(tmp_path, dict(bare, layer_types=["deepseek_sparse_attention"] * 78), "bare.json")))


def test_gemma3_text_configs_leave_rope_and_norm_to_their_defaults():
    """Gemma-3-27B's config.json gives no rope_theta, rope_local_base_freq or rms_norm_eps: its
    model is transformers' Gemma3TextConfig defaults, RoPE base 1,000,000 on the global layers
    (10,000 on the windowed ones) and epsilon 1e-6. It had been launched with Megatron's 10000 and
    1e-5 (the script saying the spec gave none). Its text tower is 27,009,002,240 parameters
    (keras-hub gemma3_presets.py gemma3_27b_text, vocabulary 262,144: 64 · 5,376 fewer embedding
    rows, and two more norms per layer, 62 · 2 · 5,376, than the planner counts)."""
    m = load_model(str(HF_FIXTURES / "gemma-3-27b"))
    assert (m.rope_base, m.norm_epsilon, m.head_dim, m.query_groups, m.attention_window) == (1_000_000, 1e-6, 128, 16, 1024)
    assert m.num_params - 64 * 5376 + 62 * 2 * 5376 == pytest.approx(27_009_002_240, rel=1e-4)
    argv = _argv(str(HF_FIXTURES / "gemma-3-27b"))
    assert argv[argv.index("--rotary-base") + 1] == "1000000" and argv[argv.index("--norm-epsilon") + 1] == "1e-06"
    notes = approximation_notes(HF_FIXTURES / "gemma-3-27b" / "config.json", 4096)
    assert any("rope_local_base_freq 10000" in n for n in notes)
