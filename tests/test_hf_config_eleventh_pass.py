"""Hugging Face config.json keys read for the wrong architecture or dropped without a word (audit,
eleventh pass): each is now read as Hugging Face's config class reads it for that model_type, or
refused in one line naming the key and the model_type (exit 2)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from planner.cli.app import app
from planner.model import load_model
from tests.conftest import one_line_error

FIXTURES = Path(__file__).parent / "fixtures" / "hf"
runner = CliRunner()


def _hf(tmp_path, base: str, drop: tuple[str, ...] = (), **changes) -> str:
    """A copy of fixture `base` with keys dropped and changed, in its own folder under tmp_path."""
    cfg = json.loads((FIXTURES / base / "config.json").read_text())
    for key in drop:
        cfg.pop(key)
    cfg.update(changes)
    folder = tmp_path / f"{base}-{len(list(tmp_path.iterdir()))}"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(cfg))
    return str(folder)


def _count(ref: str):
    return runner.invoke(app, ["count", "-m", ref, "-s", "h100-sxm", "-g", "8", "-b", "64"])


def _same_model(a, b) -> bool:
    return a.model_dump(exclude={"name"}) == b.model_dump(exclude={"name"})


# ---- 1. MLA: a DeepSeek config without kv_lora_rank is HF's default, not plain attention ---------

def test_deepseek_v3_without_kv_lora_rank_is_read_as_hfs_default_mla_and_says_so(tmp_path):
    """Without kv_lora_rank DeepSeek-V3 was costed as multi-head attention (mla None, head_dim 56,
    no note); transformers' DeepseekV3Config defaults kv_lora_rank to 512 and always builds MLA."""
    folder = _hf(tmp_path, "deepseek-v3", drop=("kv_lora_rank",))
    model = load_model(folder)
    assert model.mla is not None and model.mla.kv_lora_rank == 512
    assert _same_model(model, load_model(str(FIXTURES / "deepseek-v3")))
    args = ["-s", "h100-sxm", "-g", "1024", "-b", "1024", "--tp", "1", "--pp", "16", "--ep", "64", "--json"]
    res = runner.invoke(app, ["estimate", "-m", folder, *args])
    published = runner.invoke(app, ["estimate", "-m", str(FIXTURES / "deepseek-v3"), *args])
    assert "kv_lora_rank 512: absent from config.json, read as Hugging Face's DeepseekV3Config default" in res.stderr
    assert "kv_lora_rank" not in published.stderr
    # the estimate of the published config (its MLA does not fit here: exit 1, as the published one)
    assert res.exit_code == published.exit_code and "Traceback" not in res.output
    ours, theirs = json.loads(res.stdout), json.loads(published.stdout)  # the note stays off the JSON
    assert (ours["step_time_s"], ours["hbm_bytes"]) == (theirs["step_time_s"], theirs["hbm_bytes"])


def test_deepseek_v2_without_q_lora_rank_is_hfs_default_and_null_is_no_query_compression(tmp_path):
    """DeepseekV2Config defaults q_lora_rank to 1536; null (DeepSeek-V2-Lite) is no q compression."""
    absent = load_model(_hf(tmp_path, "deepseek-v2", drop=("q_lora_rank",)))
    assert absent.mla.q_lora_rank == 1536
    assert _same_model(absent, load_model(str(FIXTURES / "deepseek-v2")))
    lite = load_model(str(FIXTURES / "deepseek-v2-lite"))
    assert lite.mla is not None and lite.mla.q_lora_rank is None
    # ...and is not told it was defaulted (the note read the config with its nulls dropped)
    from planner.hf_config import approximation_notes
    assert not [n for n in approximation_notes(FIXTURES / "deepseek-v2-lite" / "config.json", 4096) if "q_lora_rank" in n]
    res = _count(_hf(tmp_path, "deepseek-v2", drop=("q_lora_rank",)))
    assert res.exit_code == 0 and "q_lora_rank 1536: absent from config.json" in res.stderr, res.output


def test_a_deepseek_config_without_mla_keys_is_told_why_it_needs_head_widths(tmp_path):
    """With no MLA key at all, the refusal named kv_lora_rank as if the config had set it: it says
    the model_type makes the attention MLA, and where the rank came from. A config that writes
    kv_lora_rank keeps the short reason."""
    heads = ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
    one_line_error(_count(_hf(tmp_path, "deepseek-v3", drop=("kv_lora_rank", *heads))),
                   "missing qk_nope_head_dim, qk_rope_head_dim, v_head_dim",
                   "deepseek_v3 model's attention is always MLA", "DeepseekV3Config default 512")
    written = one_line_error(_count(_hf(tmp_path, "deepseek-v3", drop=heads)), "kv_lora_rank (MLA) needs its head widths")
    assert "always MLA" not in written


def test_a_null_kv_lora_rank_in_a_deepseek_config_is_refused(tmp_path):
    one_line_error(_count(_hf(tmp_path, "deepseek-v3", kv_lora_rank=None)),
                   "kv_lora_rank is null", "always MLA", "512")


@pytest.mark.parametrize("key,value", [("q_lora_rank", 128), ("kv_lora_rank", 64), ("qk_nope_head_dim", 128),
                                       ("qk_rope_head_dim", 64), ("v_head_dim", 128)])
def test_mla_keys_in_a_llama_config_are_refused(tmp_path, key, value):
    """A Llama config carrying q_lora_rank / qk_*_head_dim / v_head_dim was read as plain Llama."""
    one_line_error(_count(_hf(tmp_path, "llama-3.2-1b", **{key: value})),
                   f"{key} {value}", 'model_type "llama"', "deepseek_v3", "remove it")


def test_mla_sizes_without_kv_lora_rank_in_an_unlisted_model_type_are_refused(tmp_path):
    one_line_error(_count(_hf(tmp_path, "llama-3.2-1b", model_type="my_mla", q_lora_rank=128, v_head_dim=64)),
                   "q_lora_rank, v_head_dim given without kv_lora_rank", "my_mla")


# ---- 2. keys another architecture reads ------------------------------------------------------------

def test_mixtral_does_not_read_moe_intermediate_size(tmp_path):
    """Mixtral + moe_intermediate_size 1000 was 4.75 B parameters; MixtralConfig has no such field."""
    one_line_error(_count(_hf(tmp_path, "mixtral-8x7b", moe_intermediate_size=1000)),
                   "moe_intermediate_size 1000", 'model_type "mixtral"', "remove it")


def test_qwen3_moe_has_no_shared_expert(tmp_path):
    """Qwen3MoeConfig reads no shared expert: n_shared_experts 2 with a width of 5632 was read as two
    shared experts of the routed width (the width dropped)."""
    line = one_line_error(_count(_hf(tmp_path, "qwen3-30b-a3b", n_shared_experts=2,
                                     shared_expert_intermediate_size=5632)),
                          "n_shared_experts 2", 'model_type "qwen3_moe"', "shared_expert_intermediate_size")
    assert "remove it" in line
    one_line_error(_count(_hf(tmp_path, "qwen3-30b-a3b", shared_expert_intermediate_size=5632)),
                   "shared_expert_intermediate_size 5632", "qwen2_moe")
    # 0 says "none" (Qwen3-Coder-480B's published config): the same model, read as it is
    coder = load_model(str(FIXTURES / "qwen3-coder-480b-a35b"))
    assert coder.moe.shared_experts == 0


def test_qwen2_moe_reads_its_shared_expert_width_but_no_count(tmp_path):
    cfg = {"model_type": "qwen2_moe", "hidden_size": 1024, "num_attention_heads": 16, "num_hidden_layers": 4,
           "intermediate_size": 4096, "vocab_size": 32000, "num_experts": 8, "num_experts_per_tok": 2,
           "moe_intermediate_size": 512, "shared_expert_intermediate_size": 2048}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    model = load_model(str(path))
    assert (model.moe.shared_experts, model.moe.shared_expert_ffn) == (1, 2048)
    path.write_text(json.dumps({**cfg, "n_shared_experts": 2}))
    one_line_error(_count(str(path)), "n_shared_experts 2", 'model_type "qwen2_moe"')


@pytest.mark.parametrize("base,key,value,model_type", [
    ("qwen3-30b-a3b", "moe_latent_size", 1024, "qwen3_moe"),                     # Nemotron 3's only
    ("llama-3.2-1b", "intermediate_size_mlp", 99999, "llama"),                   # Llama 4's only
    ("deepseek-v3", "moe_shared_expert_intermediate_size", 9999, "deepseek_v3"),  # Nemotron-H's only
    ("llama-3.2-1b", "use_qk_norm", True, "llama"),                              # Llama 4's, GLM-4.5's
])
def test_a_key_only_another_architecture_reads_is_refused(tmp_path, base, key, value, model_type):
    one_line_error(_count(_hf(tmp_path, base, **{key: value})),
                   f"{key} {json.dumps(value)}", f'model_type "{model_type}"', "remove it")


def test_nemotron_only_keys_are_refused_for_an_unlisted_model_type_too(tmp_path):
    one_line_error(_count(_hf(tmp_path, "qwen3-30b-a3b", model_type="my_moe", moe_latent_size=1024)),
                   "moe_latent_size 1024", "my_moe", "nemotron_h")


def test_the_published_configs_still_read():
    """The published configs the new key checks could trip on read as the presets made from them
    (same parameter count to the unit)."""
    for name, preset in (("nemotron-3-nano", "nemotron-3-nano"), ("llama-4-scout", "llama4-scout"),
                         ("glm-4.5", "glm-4.5"), ("deepseek-v2-lite", "deepseek-v2-lite"),
                         ("qwen3-coder-480b-a35b", "qwen3-coder-480b-a35b"), ("gpt-oss-20b", "gpt-oss-20b")):
        assert load_model(str(FIXTURES / name)).num_params == load_model(preset).num_params, name


# ---- 3. Nemotron-H: errors in the config's terms ---------------------------------------------------

def test_nemotron_h_partial_rotary_factor_is_named_as_the_config_key(tmp_path):
    """Was 'rotary_percent (0.5) sizes RoPE; position_embedding is none' (neither is a config key)."""
    line = one_line_error(_count(_hf(tmp_path, "nemotron-3-nano", partial_rotary_factor=0.5)),
                          "partial_rotary_factor 0.5", "nemotron_h has no RoPE", "remove it")
    assert "rotary_percent" not in line and "position_embedding" not in line
    line = one_line_error(_count(_hf(tmp_path, "nemotron-3-nano", rope_scaling={"rope_type": "yarn", "factor": 4})),
                          "rope_scaling", "nemotron_h has no RoPE")
    assert "position_embedding" not in line


def test_nemotron_h_swiglu_limit_is_named_as_the_config_key(tmp_path):
    """Was '(use activation: swiglu or drop activation_clamp)': planner fields, not config keys."""
    line = one_line_error(_count(_hf(tmp_path, "nemotron-3-nano", swiglu_limit=7.0)),
                          "swiglu_limit 7.0", 'model_type "nemotron_h"', "gpt_oss", "remove it")
    assert "activation_clamp" not in line and "activation:" not in line


def test_swiglu_limit_on_an_ungated_mlp_is_named_as_the_config_key(tmp_path):
    line = one_line_error(_count(_hf(tmp_path, "llama-3.2-1b", model_type="my_gelu", hidden_act="gelu",
                                     swiglu_limit=7.0)),
                          "swiglu_limit 7.0", "not gated", "hidden_act gelu", "remove it")
    assert "activation_clamp" not in line


# ---- 4. sliding_window's type ----------------------------------------------------------------------

@pytest.mark.parametrize("value,words", [("512", 'sliding_window must be an integer, got "512"'),
                                         (512.5, "sliding_window must be an integer"),
                                         ([512], "sliding_window must be an integer"),
                                         (True, "sliding_window must be an integer"),
                                         (-1, "sliding_window must be an integer from 0")])
def test_a_sliding_window_that_is_not_an_integer_is_refused(tmp_path, value, words):
    """A string "512" was ignored: no type error and no approximation note."""
    one_line_error(_count(_hf(tmp_path, "mistral-7b-v0.1", sliding_window=value)), words)


def test_a_use_sliding_window_that_is_not_a_flag_is_refused(tmp_path):
    one_line_error(_count(_hf(tmp_path, "qwen3-30b-a3b", use_sliding_window="no")),
                   'use_sliding_window must be true or false, got "no"')


def test_an_integral_float_sliding_window_is_read_and_noted(tmp_path):
    res = runner.invoke(app, ["estimate", "-m", _hf(tmp_path, "mistral-7b-v0.1", sliding_window=512.0),
                              "-s", "h100-sxm", "-g", "8", "-b", "64", "--tp", "8", "--pp", "1"])
    assert res.exit_code == 0, res.output
    assert "sliding-window attention (window 512 < sequence 4096)" in res.stderr
