"""What a Hugging Face config's model does that `planner megatron` does not launch is said in a
note (an audit of 87 launches from 29 configs through Megatron's parser found seven such features
dropped in silence): linear/LongRoPE scaling, Qwen2-MoE's shared-expert gate, Llama 4's NoPE
layers and input-side router scores, Gemma's activation, norm, soft-capping and softmax scale,
DeepSeek-V2's group scoring, and a model_type the planner does not list."""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from planner import megatron as mg
from planner.cli import app
from planner.hf_config import approximation_notes
from tests.megatron_parser import checker_batch
from tests.test_megatron_parser import PLACEHOLDERS

LLAMA = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
         "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 32000, "max_position_embeddings": 4096,
         "rms_norm_eps": 1e-5, "hidden_act": "silu"}
QWEN2_MOE = {**LLAMA, "model_type": "qwen2_moe", "moe_intermediate_size": 1408, "num_experts": 60,
             "num_experts_per_tok": 4, "shared_expert_intermediate_size": 5632, "decoder_sparse_step": 1}
GEMMA2 = {"model_type": "gemma2", "hidden_size": 3584, "intermediate_size": 14336, "num_hidden_layers": 42,
          "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 256, "vocab_size": 256000,
          "query_pre_attn_scalar": 224, "final_logit_softcapping": 30.0, "attn_logit_softcapping": 50.0,
          "hidden_activation": "gelu_pytorch_tanh"}


def notes(tmp_path, cfg: dict) -> str:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return " | ".join(approximation_notes(path, 4096))


@pytest.mark.parametrize("cfg,words", [
    ({**LLAMA, "rope_scaling": {"type": "linear", "factor": 2.5}},
     ['rope_type "linear" (factor 2.5) is launched as plain RoPE', "takes whole factors only"]),
    ({**LLAMA, "rope_scaling": {"type": "longrope", "long_factor": [1.0], "short_factor": [1.0]}},
     ['rope_type "longrope" is launched as plain RoPE', "no LongRoPE"]),
    ({"model_type": "llama4", "text_config": {**LLAMA, "model_type": "llama4_text", "num_local_experts": 16,
                                              "num_experts_per_tok": 1, "intermediate_size_mlp": 16384,
                                              "interleave_moe_layer_step": 1, "head_dim": 128,
                                              "no_rope_layers": [1, 1, 1, 0] * 4 + [1, 0, 1, 0] * 4}},
     ["leave it out of 12 in no fixed period", "--no-rope-freq"]),
    (GEMMA2, ["gelu-tanh GLU is launched as SwiGLU", "--apply-layernorm-1p",
              "attn_logit_softcapping and final_logit_softcapping", "query_pre_attn_scalar 224 as head_dim 256"]),
    ({**LLAMA, "model_type": "starcoder2", "use_bias": True}, ['model_type "starcoder2" is not one the planner lists']),
    ({**LLAMA, "model_type": "deepseek_v2", "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_nope_head_dim": 128,
      "qk_rope_head_dim": 64, "v_head_dim": 128, "n_routed_experts": 160, "num_experts_per_tok": 6,
      "moe_intermediate_size": 1536, "n_shared_experts": 2, "first_k_dense_replace": 1, "n_group": 8,
      "topk_group": 3, "topk_method": "group_limited_greedy", "scoring_func": "softmax"},
     ["group_limited_greedy", "by the sum of its top experts"]),
])
def test_what_the_launch_leaves_out_is_said(tmp_path, cfg, words):
    said = notes(tmp_path, cfg)
    for w in words:
        assert w in said, said


def test_a_listed_model_with_nothing_left_out_gets_no_such_note(tmp_path):
    said = notes(tmp_path, LLAMA)
    for w in ("launched as plain RoPE", "by hand", "not one the planner lists", "launch trains another model"):
        assert w not in said, said
    assert "gate" not in notes(tmp_path, QWEN2_MOE)  # launched now: nothing left to say
    assert "RoPE" not in notes(tmp_path, {**LLAMA, "rope_scaling": {"type": "linear", "factor": 4.0}})


def test_llama4s_nope_layers_and_input_side_scores_are_read_and_launched():
    """Both Llama 4 configs leave RoPE out of every 4th layer (Scout lists no_rope_layers,
    Maverick takes transformers' default interval 4) and scale the expert's input by the router
    score: read into the model, launched as --no-rope-freq 4 and --moe-apply-probs-on-input (the
    Megatron parser round trip in tests/test_megatron_parser.py checks what Megatron builds)."""
    from pathlib import Path

    from hardware import load_system
    from planner import megatron as mg
    from planner.model import load_model
    from planner.plan import JobSpec, Plan
    fixtures = Path(__file__).resolve().parent / "fixtures" / "hf"
    for name in ("llama-4-scout", "llama-4-maverick"):
        model = load_model(str(fixtures / name))
        assert model.no_rope_every == 4 and model.moe.apply_probs_on_input, name
        assert model == load_model(name.replace("llama-4-", "llama4-")).model_copy(
            update={"name": model.name, "seq_length": model.seq_length}), name
        launch = mg.megatron_args(Plan(tp=1, pp=1, dp=16, ep=16, micro_batch=1, global_batch=16), model,
                                  JobSpec(), load_system("gb200-nvl72", 16))
        assert ("--no-rope-freq", "4") in launch.args and ("--moe-apply-probs-on-input", None) in launch.args, name


def _config_launch(tmp_path_factory, name: str, config: dict, gpus: int, *flags: str) -> tuple:
    """`planner megatron` on a config.json, as a user runs it: the argv (data path as mock data)
    and the checker case for it."""
    folder = tmp_path_factory.mktemp(name)
    (folder / "config.json").write_text(json.dumps(config))
    result = CliRunner().invoke(app, ["megatron", "-m", str(folder), "-s", "h100-sxm", "-g", str(gpus), *flags])
    assert result.exit_code == 0, result.output
    env, argv, _ = mg.parse_script(result.output)
    at = argv.index("--data-path")
    argv = [PLACEHOLDERS.get(word, word) for word in argv[:at] + ["--mock-data"] + argv[at + 2:]]
    return argv, [{"argv": argv, "world_size": gpus, "env": env}]


@checker_batch("hf_qwen2_moe")
def _qwen2_moe_launch(tmp_path_factory):
    return _config_launch(tmp_path_factory, "qwen2_moe", {**QWEN2_MOE, "num_hidden_layers": 8}, 16,
                          "-b", "64", "--tp", "1", "--ep", "4")


def test_qwen2_moes_shared_expert_gate_is_launched_and_megatron_builds_it(megatron_checked):
    """Qwen2-MoE scales its shared expert by sigmoid(shared_expert_gate(x)): the launch had no
    --moe-shared-expert-gate, so Megatron built the shared expert ungated (found by the audit)."""
    argv, (res,) = megatron_checked.get("hf_qwen2_moe")
    assert "--moe-shared-expert-gate" in argv
    assert res["ok"], res.get("error")
    assert res["cfg"]["moe_shared_expert_gate"] is True and res["cfg"]["moe_shared_expert_intermediate_size"] == 5632


@checker_batch("hf_linear_rope")
def _linear_rope_launch(tmp_path_factory):
    config = {**LLAMA, "num_hidden_layers": 4, "rope_scaling": {"type": "linear", "factor": 4.0}}
    return _config_launch(tmp_path_factory, "linear_rope", config, 8, "-b", "16", "--tp", "1")


def test_linear_rope_scaling_is_launched_and_megatron_builds_it(megatron_checked):
    """A config's linear RoPE scaling (transformers rope_type "linear") was launched as plain RoPE
    in silence (found by the audit): a whole factor is now Megatron's position interpolation."""
    argv, (res,) = megatron_checked.get("hf_linear_rope")
    assert argv[argv.index("--rotary-seq-len-interpolation-factor") + 1] == "4"
    assert res["ok"], res.get("error")
    assert res["ns"]["rotary_seq_len_interpolation_factor"] == 4  # a GPTModel argument, not a config field
