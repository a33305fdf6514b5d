"""Eleventh malformed-input audit: numbers. An integer too long for Python to convert, a system
file's GPU count past the cap of --gpus, YAML 1.1 advice that changed the value, whole-number
floats and loose types in a model's fields, and a head_dim that MLA ignores. Each test failed on
the code before."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError
from typer.testing import CliRunner

from hardware.errors import _yaml_number_hint
from hardware.load import load_system
from planner.cli.app import app
from planner.model import PRESET_DIR, MoESpec, ModelSpec, load_model, model_preset_names
from tests.conftest import one_line_error

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()
HUGE = "1" + "0" * 5000  # past Python's 4,300-digit limit of int(str)
SMALL = dict(layers=2, hidden=64, heads=4, seq_length=16, vocab=100)
MLA = dict(kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=32)


def _model_file(tmp_path: Path, old: str, new: str, preset: str = "llama3-8b") -> Path:
    text = (PRESET_DIR / f"{preset}.yaml").read_text()
    assert old in text
    path = tmp_path / "m.yaml"
    path.write_text(text.replace(old, new, 1))
    return path


def _system_file(tmp_path: Path, num_gpus, domain_gpus=1048576, offload: dict | None = None) -> Path:
    data = yaml.safe_load((ROOT / "hardware" / "presets" / "h100-sxm.yaml").read_text())
    data["network"][-1]["domain_gpus"] = domain_gpus
    if offload is not None:
        data["offload"] = offload
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(data).replace("num_gpus: 1024", f"num_gpus: {num_gpus}"))
    return path


# ---- 1. integers of thousands of digits ------------------------------------------------------

def test_an_integer_past_pythons_digit_limit_in_a_model_file_is_out_of_range(tmp_path):
    """exit 70, 'internal error (ValueError: Exceeds the limit (4300 digits) ...)'."""
    path = _model_file(tmp_path, "layers: 32", f"layers: {HUGE}")
    one_line_error(runner.invoke(app, ["estimate", "-m", str(path), "-s", "h100-sxm", "-g", "8", "-b", "64",
                                       "--tp", "2", "--pp", "1"]), "m.yaml", "layers", "out of range")
    # the same number in hexadecimal (int() converts it) and one in range of int() but not of a float
    for text in ("0x1" + "0" * 400, "1" + "0" * 400):
        path = _model_file(tmp_path, "layers: 32", f"layers: {text}")
        one_line_error(runner.invoke(app, ["count", "-m", str(path)]), "layers", "out of range")
    # nested: the path of keys is named
    path = _model_file(tmp_path, "num_experts: 256", f"num_experts: {HUGE}", "deepseek-v3")
    one_line_error(runner.invoke(app, ["count", "-m", str(path)]), "moe.num_experts", "out of range")


def test_an_explicit_number_tag_on_text_is_refused_in_one_line(tmp_path):
    """`!!int abc` reached int() unchecked: 'internal error (ValueError: invalid literal ...)'."""
    for value, words in (("!!int abc", ("layers", "not an integer")), ("!!float abc", ("layers", "not a number")),
                         ("!!int 1.5", ("layers", "not an integer")), ("!!int ''", ("layers", "not an integer"))):
        path = _model_file(tmp_path, "layers: 32", f"layers: {value}")
        one_line_error(runner.invoke(app, ["count", "-m", str(path)]), *words)


def test_a_float_past_a_floats_range_is_out_of_range_not_inf(tmp_path):
    path = _model_file(tmp_path, "layers: 32", "layers: 1.0e+999")
    line = one_line_error(runner.invoke(app, ["count", "-m", str(path)]), "layers", "out of range")
    assert "inf" not in line


def test_a_huge_integer_in_a_system_plan_reference_or_config_json_is_out_of_range(tmp_path):
    system = _system_file(tmp_path, HUGE)
    one_line_error(runner.invoke(app, ["count", "-m", "llama3-8b", "-s", str(system)]), "s.yaml", "num_gpus",
                   "out of range")
    saved = tmp_path / "p.yaml"
    assert runner.invoke(app, ["plan", "-m", "llama3-8b", "-s", "h100-sxm", "-g", "8", "-b", "64", "-k", "1",
                               "--save", str(saved)]).exit_code == 0
    saved.write_text(saved.read_text().replace("global_batch: 64", f"global_batch: {HUGE}", 1))
    one_line_error(runner.invoke(app, ["estimate", "--plan", str(saved)]), "p.yaml", "global_batch", "out of range")
    record = {"id": "mine", "model": {"name": "x", "layers": 32, "hidden": 4096, "heads": 32, "ffn": 14336,
                                      "seq": 8192, "vocab": 128256},
              "system": {"gpu": "H100-SXM5-80GB", "gpus": 16}, "parallel": {"tp": 123456789},
              "precision": "bf16", "measured": {"tokens_per_sec_per_gpu": 7000}}
    reference = tmp_path / "ref.yaml"
    reference.write_text(yaml.safe_dump({"records": [record]}).replace("123456789", HUGE))
    one_line_error(runner.invoke(app, ["validate", "--reference", str(reference)]), "ref.yaml",
                   "records.0.parallel.tp", "out of range")
    config = json.loads((ROOT / "tests" / "fixtures" / "hf" / "llama-3.2-1b" / "config.json").read_text())
    config["num_hidden_layers"] = 123456789
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config).replace("123456789", HUGE))
    one_line_error(runner.invoke(app, ["count", "-m", str(path)]), "config.json", "out of range")


def test_a_long_integer_below_the_cap_is_said_short(tmp_path):
    """A 300-digit layer count was echoed in full (a 400-character line)."""
    path = _model_file(tmp_path, "layers: 32", "layers: 1" + "0" * 300)
    line = one_line_error(runner.invoke(app, ["count", "-m", str(path)]), "layers", "from 1 to 10,000", "1e+300")
    assert len(line) < 200
    with pytest.raises(ValidationError, match="1e[+]308 or more"):
        ModelSpec(**{**SMALL, "layers": 10 ** 5000})


# ---- 2. a system file's GPU count --------------------------------------------------------------

def test_a_system_files_num_gpus_takes_the_cap_of_gpus(tmp_path):
    """num_gpus: 16777216 was accepted by count/plan/estimate, and checkpoint blamed global-batch."""
    system = _system_file(tmp_path, 16777216, domain_gpus=16777216)
    for command in (["count", "-m", "llama3-8b"], ["plan", "-m", "llama3-8b", "-b", "64"],
                    ["estimate", "-m", "llama3-8b", "-b", "64", "--tp", "2"], ["checkpoint", "-m", "llama3-8b"]):
        line = one_line_error(runner.invoke(app, [*command, "-s", str(system)]), "s.yaml", "num_gpus",
                              "from 1 to 1,048,576", "16,777,216")
        assert "global-batch" not in line
    # replaced by -g, the file's own value is still checked (as a NaN there is)
    one_line_error(runner.invoke(app, ["count", "-m", "llama3-8b", "-s", str(system), "-g", "8"]),
                   "num_gpus", "1,048,576", "which --gpus replaces")
    assert load_system(str(_system_file(tmp_path, 1048576))).num_gpus == 1048576
    with pytest.raises(ValueError, match="gpus: must be an integer from 1 to 1,048,576"):
        load_system("h100-sxm", 1048577)


# ---- 3. YAML 1.1 number advice -----------------------------------------------------------------

@pytest.mark.parametrize("text", ["1.2345e6", "1e3", "1.0e300", "989.4e12", "1E-5", ".5e3",
                                  "12345678901234567890123e2"])
def test_the_yaml_number_hint_keeps_the_value(text):
    """1.2345e6 was advised as 'write 1.2e+06', another number."""
    hint = _yaml_number_hint(text)
    written = hint.rsplit("write ", 1)[1].rstrip(")")
    assert yaml.safe_load(written) == float(text), (text, hint)


def test_the_yaml_number_hint_of_nan_and_inf_says_they_are_not_allowed(tmp_path):
    """'nan' was advised as 'write nan', which gives the same error again."""
    for text in ("nan", "inf", "-inf"):
        assert "non-finite numbers are not allowed" in _yaml_number_hint(text)
        assert "write" not in _yaml_number_hint(text)
    offload = {"name": "host", "capacity_gib": "CAP", "bandwidth_gb_per_s": 50}
    for value, words in (("1.2345e6", ("write 1.2345e+06",)), ("nan", ("non-finite",))):
        system = _system_file(tmp_path, 256, offload=offload)
        system.write_text(system.read_text().replace("CAP", value))
        one_line_error(runner.invoke(app, ["count", "-m", "llama3-8b", "-s", str(system)]),
                       "offload: capacity_gib", *words)


# ---- 4. whole-number floats for integer fields -------------------------------------------------

def test_a_whole_number_float_is_the_integer_in_every_model_field(tmp_path):
    """hidden: 4096.0 (or heads: 32.0) said 'hidden (4096) must be divisible by heads (32)', while
    layers: 32.0 was accepted."""
    preset = load_model("llama3-8b")
    for field in ("hidden: 4096", "heads: 32", "layers: 32"):
        model = load_model(str(_model_file(tmp_path, field, f"{field}.0")))
        assert model.num_params == preset.num_params and model.head_dim == preset.head_dim == 128
    assert ModelSpec(**{**SMALL, "hidden": 64.0}).head_dim == 16
    assert ModelSpec(**{**SMALL, "heads": 4.0}).head_dim == 16
    with pytest.raises(ValidationError, match="fractional part"):
        ModelSpec(**{**SMALL, "hidden": 64.5})


# ---- 5. loose types through the Python API -----------------------------------------------------

@pytest.mark.parametrize("change, words", [
    ({"layers": True}, "layers: expected a number, got true"),
    ({"layers": "2"}, "layers: expected a number, got the string '2'"),
    ({"tied_embeddings": "no"}, "tied_embeddings: expected true or false, got 'no'"),
    ({"dropout": 1}, "dropout: expected true or false, got 1"),
    ({"rotary_percent": "0.5"}, "rotary_percent: expected a number"),
    ({"moe": {"num_experts": True, "top_k": 1}}, "moe: num_experts: expected a number, got true"),
])
def test_the_python_api_refuses_loose_types_for_model_fields(change, words):
    """ModelSpec(layers=True) gave 1 layer, layers="2" 2, tied_embeddings="no" False."""
    with pytest.raises(ValidationError, match=words.replace("(", r"\(")):
        ModelSpec(**{**SMALL, **change})


def test_the_parts_of_a_model_refuse_loose_types_too_and_presets_still_load():
    with pytest.raises(ValidationError, match="moe: top_k: expected a number, got true"):
        MoESpec(num_experts=4, top_k=True)
    for name in model_preset_names():
        model = load_model(name)
        assert ModelSpec(**model.model_dump()) == model  # a dump validates again as the same model


# ---- 6. head_dim beside MLA ---------------------------------------------------------------------

def test_a_head_dim_that_mla_ignores_is_refused(tmp_path):
    """head_dim: 64 beside mla: was silently ignored (MLA sets its own head widths)."""
    path = _model_file(tmp_path, "layers: 61", "layers: 61\nhead_dim: 64", "deepseek-v3")
    one_line_error(runner.invoke(app, ["count", "-m", str(path)]), "head_dim (64)", "mla", "drop")
    with pytest.raises(ValidationError, match=r"head_dim \(8\) and mla"):
        ModelSpec(**{**SMALL, "head_dim": 8, "mla": MLA})
    # the values that change nothing pass: hidden / heads (the deepseek-v2 preset's) and v_head_dim
    assert ModelSpec(**{**SMALL, "head_dim": 16, "mla": MLA}).mla is not None
    assert ModelSpec(**{**SMALL, "head_dim": 32, "mla": MLA}).mla is not None
    assert load_model("deepseek-v2").head_dim == 40 and load_model("deepseek-v2-lite").head_dim == 128
    assert math.isclose(load_model(str(_model_file(tmp_path, "layers: 61", "layers: 61\nhead_dim: 128",
                                                   "deepseek-v3"))).num_params, load_model("deepseek-v3").num_params)
