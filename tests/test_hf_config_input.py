"""Bad values in a Hugging Face config.json (found by a fuzzer): each is one line naming the config
key and what it allows, exit 2; never a traceback or an internal error (exit 70)."""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from planner.cli.app import app
from tests.conftest import one_line_error

# a small Llama-like config that `planner count` reads as it is
BASE = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 1024,
        "num_attention_heads": 16, "num_hidden_layers": 4, "intermediate_size": 4096, "vocab_size": 32000,
        "num_key_value_heads": 16, "max_position_embeddings": 4096}
MOE = {"num_local_experts": 8, "num_experts_per_tok": 2}


def count(tmp_path, config: dict):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return CliRunner().invoke(app, ["count", "-m", str(path), "-s", "h100-sxm", "-g", "8", "-b", "64"])


@pytest.mark.parametrize("edit,words", [
    # the fuzzer's case: a list model_type was an internal error (unhashable 'list')
    ({"model_type": ["llama"]}, "model_type must be a string"),
    ({"model_type": {"name": "llama"}}, "model_type must be a string"),
    # n_group compared with 1 before any check: internal errors for a string or a list
    ({**MOE, "n_group": "8", "topk_group": 4}, "n_group must be an integer"),
    ({**MOE, "n_group": [8], "topk_group": 4}, "n_group must be an integer"),
    # wrong types are named by their config key (not by ModelSpec's field, e.g. `hidden`)
    ({"hidden_size": "1024"}, "hidden_size must be an integer"),
    ({"hidden_size": [1024]}, "hidden_size must be an integer"),
    ({"num_hidden_layers": True}, "num_hidden_layers must be an integer"),
    ({"intermediate_size": 4096.5}, "intermediate_size must be an integer"),
    ({"attention_bias": "no"}, "attention_bias must be true or false"),
    ({"hidden_act": ["silu"]}, "hidden_act must be a string"),
    ({"layer_types": "full_attention"}, "layer_types must be a list"),
    ({"swiglu_limit": "7"}, "swiglu_limit must be a finite number > 0"),
    # JSON's NaN token parses; a negative clamp is none (audit 7: both were dropped silently)
    ({"swiglu_limit": float("nan")}, "swiglu_limit must be a finite number > 0"),
    ({"swiglu_limit": -5}, "swiglu_limit must be a finite number > 0"),
    ({"text_config": [1]}, "text_config must be a mapping"),
    # values that were accepted silently
    ({"max_position_embeddings": 0}, "max_position_embeddings must be an integer >= 1, got 0"),
    ({"max_position_embeddings": -1}, "max_position_embeddings must be an integer >= 1, got -1"),
    ({"max_position_embeddings": "big"}, 'max_position_embeddings must be an integer, got "big"'),
    ({"tie_word_embeddings": "maybe"}, 'tie_word_embeddings must be true or false, got "maybe"'),
    ({"rope_scaling": "yes"}, "rope_scaling must be a mapping"),
    ({"rope_scaling": {"type": 3, "factor": 2}}, "rope_scaling.type must be a name such as default, linear"),
    ({"rope_scaling": {"type": "weird", "factor": -1}}, "rope_scaling.factor must be a number > 0, got -1"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": -1}}, "rope_scaling.factor must be a number > 0, got -1"),
    # the expert count is present: say it is too small, not that the top-k "names experts" unread
    ({"num_local_experts": 0, "num_experts_per_tok": 2}, "num_local_experts must be >= 1"),
    ({"num_experts": -4, "num_experts_per_tok": 2}, "num_experts must be an integer from 0 to"),
    # the top-k named by the config's key, not the planner's moe.top_k
    ({"num_local_experts": 8, "num_experts_per_tok": 0}, "num_experts_per_tok must be an integer from 1 to"),
    ({"num_local_experts": 8}, "num_experts_per_tok (or experts_per_token) must be"),
    # windowed layers without a window (audit): costed and launched as full attention, another model
    ({"layer_types": ["sliding_attention", "full_attention"] * 2, "sliding_window": 0},
     "layer_types names sliding_attention layers but sliding_window is 0"),
    ({"layer_types": ["sliding_attention", "full_attention"] * 2}, "give the window"),
])
def test_bad_config_values_are_one_line_errors_naming_the_key(tmp_path, edit, words):
    line = one_line_error(count(tmp_path, {**BASE, **edit}))
    assert words in line, line
    assert str(tmp_path / "config.json") in line


def test_the_fuzzers_list_model_type_in_a_json_file(tmp_path):
    path = tmp_path / "mtlist.json"
    path.write_text(json.dumps({**BASE, "model_type": ["llama"]}))
    result = CliRunner().invoke(app, ["count", "-m", str(path), "-s", "h100-sxm", "-g", "8", "-b", "64"])
    assert "model_type must be a string" in one_line_error(result)


@pytest.mark.parametrize("edit", [
    {},
    {"rope_scaling": {"rope_type": "llama3", "factor": 8.0}},   # Llama 3.1's
    {"rope_scaling": {"type": "yarn", "factor": 4}},            # the older spelling
    {"rope_scaling": {"rope_type": "proportional", "factor": 2}},  # a name transformers may add: read
    {"rope_scaling": None, "tie_word_embeddings": None},         # null = left out
    {"num_local_experts": 0},                                    # 0 experts and no top-k: a dense model
    {"max_position_embeddings": 2048.0},                         # an integral float, as pydantic reads it
    # an architecture not in ARCHITECTURES is read from its own fields on purpose (hf_config's docstring)
    {"architectures": ["FooForCausalLM"], "model_type": "foo"},
])
def test_valid_configs_still_read(tmp_path, edit):
    result = count(tmp_path, {**BASE, **edit})
    assert result.exit_code == 0, result.output


def test_gemma3_text_config_takes_transformers_defaults(tmp_path):
    """The hub's Gemma-3 4B text config omits heads, KV heads, head_dim and vocab: transformers'
    Gemma3TextConfig defaults (8 heads in 4 KV groups of 256, vocab 262,208) fill them."""
    from planner.model import load_model
    cfg = {"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "hidden_size": 2560,
           "intermediate_size": 10240, "num_hidden_layers": 34, "sliding_window": 1024,
           "rope_scaling": {"rope_type": "linear", "factor": 8.0}}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    m = load_model(str(path))
    assert (m.heads, m.query_groups, m.head_dim, m.vocab) == (8, 4, 256, 262_208)


def test_an_integral_float_max_position_caps_the_sequence(tmp_path):
    from planner.model import load_model
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**BASE, "max_position_embeddings": 2048.0}))
    assert load_model(str(path)).seq_length == 2048
