"""Hugging Face configs of models without a preset, found misread by an audit (2026-11-29): the
original Qwen's MLP width, GPT-NeoX's and Qwen's RoPE keys, and a DeepSeek-V2 config that leaves
its untied head to Hugging Face's default."""
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hardware.errors import SpecError
from planner.cli import app
from planner.model import load_model

HF = Path(__file__).parent / "fixtures" / "hf"


def _fixture(name: str) -> dict:
    return json.loads((HF / name / "config.json").read_text())


def _write(tmp_path: Path, cfg: dict, name: str = "config.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(cfg))
    return path


def _argv(model: str) -> list[str]:
    out = CliRunner().invoke(app, ["megatron", "-m", model, "-s", "h100-sxm", "-g", "64", "-b", "256",
                                   "--tp", "2", "--pp", "2", "--format", "json"])
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
    m = load_model(str(HF / "qwen-1.8b"))
    assert m.num_params == 1_836_828_672
    assert (m.ffn, m.activation, m.qkv_bias, m.biases, m.tied_embeddings) == (5504, "swiglu", True, False, False)
    argv = _argv(str(HF / "qwen-1.8b"))
    assert argv[argv.index("--ffn-hidden-size") + 1] == "5504" and "--add-qkv-bias" in argv
    assert argv[argv.index("--rotary-base") + 1] == "10000"  # rotary_emb_base


def test_an_odd_original_qwen_intermediate_size_is_one_line(tmp_path):
    path = _write(tmp_path, dict(_fixture("qwen-1.8b"), intermediate_size=11007))
    with pytest.raises(SpecError, match="intermediate_size 11007 must be even for model_type \"qwen\""):
        load_model(str(path))
    out = CliRunner().invoke(app, ["count", "-m", str(path), "-s", "h100-sxm", "-g", "8"])
    assert out.exit_code == 2 and "Traceback" not in out.output


def test_gpt_neox_and_qwen_rope_keys_are_read(tmp_path):
    """GPTNeoXConfig and QWenConfig write RoPE's fraction and base as rotary_pct / rotary_emb_base
    (Pythia: rotary_pct 0.25; Qwen-72B: rotary_emb_base 1,000,000): read as partial_rotary_factor
    and rope_theta, and launched; they had been dropped (RoPE on every channel, base 10000)."""
    path = _write(tmp_path, dict(_fixture("qwen-1.8b"), rotary_pct=0.25, rotary_emb_base=1_000_000))
    m = load_model(str(path))
    assert (m.rotary_percent, m.rope_base) == (0.25, 1_000_000)
    argv = _argv(str(path))
    assert argv[argv.index("--rotary-percent") + 1] == "0.25"
    assert argv[argv.index("--rotary-base") + 1] == "1000000"
    # the newer key wins where a config gives both
    both = _write(tmp_path, dict(_fixture("qwen-1.8b"), rotary_pct=0.25, partial_rotary_factor=0.5), "both.json")
    assert load_model(str(both)).rotary_percent == 0.5
    for key, value in (("rotary_pct", 0), ("rotary_emb_base", 0.5)):
        with pytest.raises(SpecError, match=f"{key} must be a number"):
            load_model(str(_write(tmp_path, dict(_fixture("qwen-1.8b"), **{key: value}), f"{key}.json")))


def test_deepseek_v2_without_tie_word_embeddings_keeps_its_own_head(tmp_path):
    """transformers' DeepseekV2Config defaults tie_word_embeddings to False: a DeepSeek-V2-Lite
    config without the key (as mlc-llm's copy of it) is the same 15.7 B model (model card), not
    one 0.21 B (102,400 · 2,048) smaller with a tied head."""
    cfg = _fixture("deepseek-v2-lite")
    del cfg["tie_word_embeddings"]
    written = load_model(str(HF / "deepseek-v2-lite"))
    left_out = load_model(str(_write(tmp_path, cfg)))
    assert not left_out.tied_embeddings and left_out.num_params == written.num_params
    assert written.num_params / 1e9 == pytest.approx(15.7, rel=0.01)
