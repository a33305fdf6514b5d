"""Hugging Face configs an independent audit (2026-11-28, tenth session) found misread: a wrapper
whose text_config names no model_type, transformers 5's rope_parameters, partial RoPE given as
rotary_dim, Qwen3-VL's q/k norms, and layer kinds the planner does not model (Gemma 4, NAS-pruned
Llama-Nemotron, Phi-3-small), which must be refused by name, not read as a plainer model."""
import json

import pytest
from typer.testing import CliRunner

from hardware.errors import SpecError
from planner.cli import app
from planner.hf_config import approximation_notes
from planner.model import load_model
from tests.conftest import HF_FIXTURES, hf_fixture_config, write_hf_config


def test_text_config_without_its_model_type_is_the_wrappers_text_tower(tmp_path):
    """Gemma 3 12B with text_config.model_type left out reads as Gemma3TextConfig (gated GeGLU,
    q/k norms), the same model as the published file: it had read as an unlisted GELU model,
    23 % short of the parameters."""
    cfg = hf_fixture_config("gemma-3-12b")
    published = load_model(str(write_hf_config(tmp_path, cfg)))
    del cfg["text_config"]["model_type"]
    bare = load_model(str(write_hf_config(tmp_path, cfg, "bare.json")))
    assert bare.num_params == published.num_params
    assert bare.activation == "swiglu" and bare.qk_norm and published.qk_norm


def test_qwen3_vl_text_towers_keep_their_qk_norm(tmp_path):
    cfg = {"model_type": "qwen3_vl_moe", "text_config": hf_fixture_config("qwen3-30b-a3b")}
    del cfg["text_config"]["model_type"]
    assert load_model(str(write_hf_config(tmp_path, cfg))).qk_norm


def test_rope_parameters_read_as_rope_theta_and_rope_scaling(tmp_path):
    """transformers 5 writes {rope_type, rope_theta, factor, ...} as one rope_parameters mapping:
    read as the older keys (GLM-5 had launched --rotary-base 10000 for its 1,000,000)."""
    old = hf_fixture_config("llama-3.1-70b")
    new = {k: v for k, v in old.items() if k not in ("rope_theta", "rope_scaling")}
    new["rope_parameters"] = {"rope_theta": old["rope_theta"], **old["rope_scaling"]}
    a, b = load_model(str(write_hf_config(tmp_path, old))), load_model(str(write_hf_config(tmp_path, new, "new.json")))
    assert (b.rope_base, b.rope_scaling, b.rope_scaling_factor) == (a.rope_base, a.rope_scaling, a.rope_scaling_factor)
    assert b.rope_base == 500_000 and b.rope_scaling == "llama3"
    plain = dict(new, rope_parameters={"rope_theta": 1_000_000, "rope_type": "default"})
    assert load_model(str(write_hf_config(tmp_path, plain, "plain.json"))).rope_base == 1_000_000
    with pytest.raises(SpecError, match="rope_parameters must be a mapping"):
        load_model(str(write_hf_config(tmp_path, dict(new, rope_parameters=[1, 2]), "bad.json")))


def test_rope_parameters_per_layer_kind_read_as_gemma_3_wrote_them(tmp_path):
    """transformers 5 writes Gemma 3's bases per layer kind: the full-attention layers' is the
    model's (--rotary-base), the sliding layers' its rope_local_base_freq (said in the notes)."""
    cfg = hf_fixture_config("gemma-3-12b")
    old = write_hf_config(tmp_path, cfg, "old.json")
    text = cfg["text_config"]
    theta, local, scaling = text.pop("rope_theta"), text.pop("rope_local_base_freq"), text.pop("rope_scaling")
    text["rope_parameters"] = {"full_attention": {"rope_theta": theta, **scaling},
                               "sliding_attention": {"rope_theta": local, "rope_type": "default"}}
    new = write_hf_config(tmp_path, cfg, "new.json")
    a, b = load_model(str(old)), load_model(str(new))
    assert (b.rope_base, b.rope_scaling, b.num_params) == (a.rope_base, a.rope_scaling, a.num_params) == \
        (1_000_000, a.rope_scaling, a.num_params)
    notes = approximation_notes(new, 4096)
    assert notes == approximation_notes(old, 4096) and any("rope_local_base_freq 10000" in n for n in notes)


def test_rotary_dim_is_partial_rope(tmp_path):
    """MiniMax-M2 ropes 64 of each head's 128 channels (rotary_dim)."""
    cfg = dict(hf_fixture_config("qwen3-4b"), head_dim=128, rotary_dim=64)
    assert load_model(str(write_hf_config(tmp_path, cfg))).rotary_percent == 0.5
    with pytest.raises(SpecError, match="rotary_dim 256 is wider than a head"):
        load_model(str(write_hf_config(tmp_path, dict(cfg, rotary_dim=256), "wide.json")))


GEMMA4_31B = {  # google/gemma-4-31B's text tower, as NVIDIA's NVFP4 checkpoint prints it
    "model_type": "gemma4_text", "hidden_size": 5376, "intermediate_size": 21504, "num_hidden_layers": 60,
    "num_attention_heads": 32, "num_key_value_heads": 16, "head_dim": 256, "global_head_dim": 512,
    "num_global_key_value_heads": 4, "attention_k_eq_v": True, "hidden_activation": "gelu_pytorch_tanh",
    "sliding_window": 1024, "vocab_size": 262144, "tie_word_embeddings": True, "enable_moe_block": False}


@pytest.mark.parametrize("cfg,key", [
    (GEMMA4_31B, "global_head_dim"),
    ({k: v for k, v in GEMMA4_31B.items() if k not in ("global_head_dim", "num_global_key_value_heads")},
     "attention_k_eq_v"),
    (dict(hf_fixture_config("llama-3.1-70b"), model_type="nemotron-nas", block_configs=[{"ffn": {"ffn_mult": 2.0}}]),
     "block_configs"),
    (dict(hf_fixture_config("qwen3-4b"), model_type="phi3small", ff_intermediate_size=14336), "ff_intermediate_size"),
])
def test_layers_the_planner_does_not_model_are_refused_by_their_key(tmp_path, cfg, key):
    """Gemma 4 31B had read as a 23 B model without a word (no gate, one head shape)."""
    path = write_hf_config(tmp_path, cfg)
    with pytest.raises(SpecError, match=f"{key} = .* builds .*does not model"):
        load_model(str(path))
    out = CliRunner().invoke(app, ["count", "-m", str(path), "-s", "h100-sxm", "-g", "8"])
    assert out.exit_code == 2 and "Traceback" not in out.output
    assert len([line for line in out.output.splitlines() if line.strip()]) == 1


def test_a_global_head_shape_equal_to_the_others_is_read(tmp_path):
    cfg = dict(hf_fixture_config("qwen3-4b"), global_head_dim=hf_fixture_config("qwen3-4b")["head_dim"])
    assert load_model(str(write_hf_config(tmp_path, cfg))).num_params == load_model(str(HF_FIXTURES / "qwen3-4b")).num_params


def test_a_per_layer_moe_list_is_named_as_such(tmp_path):
    cfg = dict(hf_fixture_config("deepseek-v3"), moe_layer_freq=[0, 1, 1])
    with pytest.raises(SpecError, match="moe_layer_freq must be an integer .*a per-layer list .* is not read"):
        load_model(str(write_hf_config(tmp_path, cfg)))


def test_deepseek_sparse_attention_is_said_to_be_costed_dense(tmp_path):
    path = write_hf_config(tmp_path, dict(hf_fixture_config("deepseek-v3"), index_topk=2048, index_n_heads=64, index_head_dim=128))
    notes = approximation_notes(path, 4096)
    assert any("DeepSeek Sparse Attention (index_topk 2048)" in n for n in notes)
    assert not any("Sparse Attention" in n for n in approximation_notes(HF_FIXTURES / "deepseek-v3" / "config.json", 4096))


def test_a_config_saved_under_its_own_name_is_named_by_it(tmp_path):
    cfg = {k: v for k, v in hf_fixture_config("qwen3-4b").items() if k != "_name_or_path"}
    assert load_model(str(write_hf_config(tmp_path, cfg, "Qwen--Qwen3-4B.json"))).name == "Qwen--Qwen3-4B"


def test_an_mla_model_whose_hidden_is_not_a_multiple_of_its_heads_is_launched(tmp_path):
    """GLM-4.7-Flash (MLA, hidden 2048 over 20 heads): Megatron's validate_args asserts hidden %
    heads unless --kv-channels is given, which MLA does not read; the launch had been refused."""
    cfg = dict(hf_fixture_config("deepseek-v2-lite"), num_attention_heads=20, num_key_value_heads=20)
    write_hf_config(tmp_path, cfg)
    out = CliRunner().invoke(app, ["megatron", "-m", str(tmp_path), "-s", "h100-sxm", "-g", "16", "-b", "64",
                                   "--tp", "1", "--ep", "8", "--format", "json"])
    assert out.exit_code == 0, out.output
    argv = json.loads(out.stdout)["argv"]
    assert argv[argv.index("--kv-channels") + 1] == str(cfg["v_head_dim"])


def test_use_routing_bias_is_the_expert_bias_of_a_sigmoid_router(tmp_path):
    """MiniMax-M2 writes its router's selection bias (e_score_correction_bias) as use_routing_bias,
    which had been dropped: the launch lacked --moe-router-enable-expert-bias."""
    cfg = dict(hf_fixture_config("qwen3-30b-a3b"), scoring_func="sigmoid", use_routing_bias=True)
    moe = load_model(str(write_hf_config(tmp_path, cfg))).moe
    assert (moe.router_score, moe.router_expert_bias) == ("sigmoid", True)
    assert not load_model(str(write_hf_config(tmp_path, dict(cfg, use_routing_bias=False), "off.json"))).moe.router_expert_bias
    with pytest.raises(SpecError, match="use_routing_bias must be true or false"):
        load_model(str(write_hf_config(tmp_path, dict(cfg, use_routing_bias="yes"), "bad.json")))


def test_minimax_m2_5_reads_to_its_card_with_its_mtp_modules_and_router_bias(tmp_path):
    """MiniMax-M2.5 (model card: 230B total, 10B active): partial RoPE (rotary_dim 64 of 128), a
    sigmoid router with its selection bias (use_routing_bias), q/k norms, and 3 MTP modules
    (use_mtp, num_mtp_modules: they had been dropped unread), counted apart from the model."""
    m = load_model(str(HF_FIXTURES / "minimax-m2.5"))
    assert (m.num_params - m.mtp_params) / 1e9 == pytest.approx(230, rel=0.01)
    assert (m.active_params - m.embedding_params - m.output_params) / 1e9 == pytest.approx(10, rel=0.03)
    assert (m.mtp_layers, m.rotary_percent, m.moe.router_score, m.moe.router_expert_bias, m.qk_norm) == \
        (3, 0.5, "sigmoid", True, True)
    cfg = dict(hf_fixture_config("minimax-m2.5"), mtp_transformer_layers=2)
    with pytest.raises(SpecError, match="mtp_transformer_layers 2: an MTP module of more than one layer"):
        load_model(str(write_hf_config(tmp_path, cfg)))


def test_glm_5_reads_to_its_card_with_its_rope_parameters_and_says_its_sparse_attention():
    """GLM-5 (model card: 744B total, 40B active; MLA with DeepSeek Sparse Attention): its RoPE
    base is in transformers 5's rope_parameters (1,000,000), and the notes say DSA is costed dense."""
    m = load_model(str(HF_FIXTURES / "glm-5"))
    assert (m.num_params - m.mtp_params) / 1e9 == pytest.approx(744, rel=0.01)
    assert (m.active_params - m.embedding_params - m.output_params) / 1e9 == pytest.approx(40, rel=0.03)
    assert m.rope_base == 1_000_000 and m.mla is not None and m.mtp_layers == 1
    assert any("DeepSeek Sparse Attention (index_topk 2048)" in n
               for n in approximation_notes(HF_FIXTURES / "glm-5" / "config.json", 4096))


@pytest.mark.parametrize("extra,mtp", [({"mtp_num_hidden_layers": 2}, 2), ({"mtp_loss_scaling_factor": 0.3}, 0),
                                       ({"use_mtp": False, "num_mtp_modules": 3}, 0)])
def test_mtp_depth_is_read_by_each_spelling_that_means_it(tmp_path, extra, mtp):
    """Qwen3-Next / Qwen3.5 spell the MTP depth mtp_num_hidden_layers; a loss weight is no depth."""
    assert load_model(str(write_hf_config(tmp_path, dict(hf_fixture_config("qwen3-4b"), **extra)))).mtp_layers == mtp


def test_an_mtp_depth_spelt_otherwise_is_refused_not_dropped(tmp_path):
    with pytest.raises(SpecError, match="num_mtp_layers names MTP layers this reader does not map"):
        load_model(str(write_hf_config(tmp_path, dict(hf_fixture_config("qwen3-4b"), num_mtp_layers=2))))
