"""Fuzzer findings on model and plan files: upper bounds on a model's integers, unknown top-level
keys of a saved plan file, and duplicate YAML keys. Each is a one-line error (exit 2) naming the
field or key; every shipped preset and example still loads."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from hardware.errors import SpecError, read_yaml_mapping
from hardware.load import ACCELERATOR_DIR, PRESET_DIR as SYSTEM_PRESET_DIR, load_accelerator, load_system
from planner.cli.app import app
from planner.cli.common import MAX_SEQ_LENGTH
from planner.model import (MAX_EXPERTS, MAX_FFN, MAX_HEADS, MAX_LAYERS, MAX_VOCAB, MAX_WIDTH, PRESET_DIR,
                           load_model)
from planner.plan import load_plan
from planner.planfile import PLAN_FILE_FIELDS, SAVED_RESULT_FIELDS

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()


def one_line_error(args: list[str]) -> str:
    result = runner.invoke(app, args)
    assert result.exit_code == 2, (result.exit_code, result.output)
    assert "Traceback" not in result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    return lines[0]


BASE = {"name": "t", "layers": 4, "hidden": 256, "heads": 4, "seq_length": 512, "vocab": 1000}
MOE = {"num_experts": 8, "top_k": 2}


def write_model(tmp_path: Path, **fields) -> Path:
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump({**BASE, **fields}, sort_keys=False))
    return path


def count(path: Path) -> list[str]:
    return ["count", "-m", str(path), "-s", "h100-sxm", "-g", "8", "-b", "64"]


# ---- every built-in preset and example loads ---------------------------------------------------
def _example_loader(path: Path):
    data = yaml.safe_load(path.read_text())
    if "plan" in data:
        return load_plan
    return load_model if "layers" in data else load_system


SHIPPED = ([(p, load_model) for p in sorted(PRESET_DIR.glob("*.yaml"))]
           + [(p, load_system) for p in sorted(SYSTEM_PRESET_DIR.glob("*.yaml"))]
           + [(p, load_accelerator) for p in sorted(ACCELERATOR_DIR.glob("*.yaml"))]
           + [(p, _example_loader(p)) for p in sorted((ROOT / "examples").glob("*.yaml"))])


def test_shipped_files_are_all_covered():
    every = set((ROOT / "hardware" / "presets").rglob("*.yaml")) | set(PRESET_DIR.glob("*.yaml")) \
        | set((ROOT / "examples").glob("*.yaml"))
    assert every == {p for p, _ in SHIPPED}
    assert len(SHIPPED) > 40


@pytest.mark.parametrize(("path", "loader"), SHIPPED, ids=[str(p.relative_to(ROOT)) for p, _ in SHIPPED])
def test_every_shipped_preset_and_example_loads(path, loader):
    assert loader(str(path)) is not None


def test_frontier_models_fit_the_bounds():
    """Real frontier shapes load well inside the caps (DeepSeek-V3, Kimi K2's 384 experts,
    Llama 3 405B's widths, a 256k vocabulary)."""
    assert load_model("llama3-405b").hidden == 16384 and load_model("llama3-405b").ffn == 53248
    assert load_model("kimi-k2").moe.num_experts == 384
    assert load_model("deepseek-v3").moe.num_experts == 256
    assert load_model(str(PRESET_DIR / "llama3-8b.yaml"), {"seq_length": MAX_SEQ_LENGTH}).seq_length == MAX_SEQ_LENGTH
    assert MAX_VOCAB >= 262144 and MAX_EXPERTS >= 384 and MAX_WIDTH >= 16384 and MAX_FFN >= 53248


# ---- 1. upper bounds on the model's integers ----------------------------------------------------
def test_absurd_layer_count_is_refused_at_load(tmp_path):
    with pytest.raises(SpecError, match=r"layers: must be an integer from 1 to 10,000, got 1000000000"):
        load_model(str(write_model(tmp_path, layers=1_000_000_000)))


def test_seq_length_cap_is_the_cli_cap(tmp_path):
    with pytest.raises(SpecError, match=f"seq_length: must be an integer from 1 to {MAX_SEQ_LENGTH:,}"):
        load_model(str(write_model(tmp_path, seq_length=1_000_000_000)))
    assert load_model(str(write_model(tmp_path, seq_length=MAX_SEQ_LENGTH))).seq_length == MAX_SEQ_LENGTH


@pytest.mark.parametrize(("fields", "field", "cap"), [
    ({"layers": MAX_LAYERS + 1}, "layers", MAX_LAYERS),
    ({"seq_length": MAX_SEQ_LENGTH + 1}, "seq_length", MAX_SEQ_LENGTH),
    ({"hidden": MAX_WIDTH * 2}, "hidden", MAX_WIDTH),
    ({"heads": MAX_HEADS * 2, "head_dim": 64}, "heads", MAX_HEADS),
    ({"ffn": MAX_FFN + 1}, "ffn", MAX_FFN),
    ({"vocab": MAX_VOCAB + 1}, "vocab", MAX_VOCAB),
    ({"mtp_layers": MAX_LAYERS + 1}, "mtp_layers", MAX_LAYERS),
    ({"moe": {**MOE, "num_experts": MAX_EXPERTS + 1}}, "moe.num_experts", MAX_EXPERTS),
    ({"moe": {**MOE, "top_k": MAX_EXPERTS + 1}}, "moe.top_k", MAX_EXPERTS),
    ({"moe": {**MOE, "expert_ffn": MAX_FFN + 1}}, "moe.expert_ffn", MAX_FFN),
    ({"moe": {**MOE, "shared_experts": MAX_EXPERTS + 1}}, "moe.shared_experts", MAX_EXPERTS),
], ids=lambda v: v if isinstance(v, str) else None)
def test_model_integer_above_its_cap_is_one_line(tmp_path, fields, field, cap):
    line = one_line_error(count(write_model(tmp_path, **fields)))
    assert f"{field}: must be an integer from" in line and f"to {cap:,}, got" in line, line


def test_model_at_its_caps_loads(tmp_path):
    m = load_model(str(write_model(tmp_path, layers=MAX_LAYERS, vocab=MAX_VOCAB,
                                   moe={"num_experts": 384, "top_k": 8, "shared_experts": 1})))
    assert (m.layers, m.vocab, m.moe.num_experts) == (MAX_LAYERS, MAX_VOCAB, 384)


# ---- 2. unknown top-level keys of a saved plan file ---------------------------------------------
@pytest.fixture(scope="module")
def saved_plan(llama3_8b_plan_file_text) -> str:
    assert "\ngpus: 8\n" in llama3_8b_plan_file_text
    return llama3_8b_plan_file_text


def test_saved_plan_keys_are_all_allowed(saved_plan, tmp_path):
    data = yaml.safe_load(saved_plan)
    assert set(data) <= set(PLAN_FILE_FIELDS + SAVED_RESULT_FIELDS)
    path = tmp_path / "p.yaml"
    path.write_text(saved_plan)
    assert load_plan(path).gpus == 8


@pytest.mark.parametrize("command", ["estimate", "megatron"])
def test_misspelt_top_level_plan_key_is_named(saved_plan, tmp_path, command):
    path = tmp_path / "p.yaml"
    path.write_text(saved_plan.replace("\ngpus: 8\n", "\ngpu: 16\n"))
    line = one_line_error([command, "--plan", str(path)])
    assert "unknown field 'gpu'" in line and "allowed: plan, model, system, gpus" in line, line


def test_unknown_top_level_plan_key_at_load(saved_plan, tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text(saved_plan + "colour: blue\n")
    with pytest.raises(SpecError, match=r"unknown field 'colour'; allowed: .*global_batch, job"):
        load_plan(path)


def test_bare_plan_mapping_still_loads(tmp_path):
    path = tmp_path / "bare.yaml"
    path.write_text("tp: 8\npp: 8\ndp: 16\nglobal_batch: 1536\n")
    assert load_plan(path).gpus == 1024


# ---- 3. duplicate keys ----------------------------------------------------------------------------
def test_duplicate_model_key_is_refused(tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text("name: t\nlayers: 8\nhidden: 256\nheads: 4\nlayers: 16\nseq_length: 512\nvocab: 1000\n")
    with pytest.raises(SpecError, match=r"duplicate key 'layers' \(line 5\)"):
        load_model(str(path))
    line = one_line_error(count(path))
    assert "duplicate key 'layers' (line 5)" in line and str(path) in line, line


def test_duplicate_nested_key_names_it_and_its_line(tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(BASE, sort_keys=False) + "moe:\n  num_experts: 8\n  top_k: 2\n  top_k: 4\n")
    with pytest.raises(SpecError, match=r"duplicate key 'top_k' \(line 10\)"):
        load_model(str(path))


def test_duplicate_plan_file_key_is_refused(saved_plan, tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text(saved_plan.replace("\ngpus: 8\n", "\ngpus: 8\ngpus: 16\n"))
    assert "duplicate key 'gpus'" in one_line_error(["estimate", "--plan", str(path)])
    with pytest.raises(SpecError, match="duplicate key 'gpus'"):
        load_plan(path)


def test_duplicate_system_key_is_refused(tmp_path):
    text = (ROOT / "examples" / "custom_system.yaml").read_text()
    path = tmp_path / "s.yaml"
    path.write_text(text + "num_gpus: 512\n")
    with pytest.raises(SpecError, match="duplicate key 'num_gpus'"):
        load_system(str(path))


@pytest.mark.parametrize("fast", [True, False], ids=["libyaml", "pure-python"])
@pytest.mark.parametrize(("text", "key"), [
    ("a: 1\nb: 2\na: 3\n", "'a' (line 3)"),
    ("a: 1\n'a': 2\n", "'a' (line 2)"),            # quoted or not, the same string
    ("1: x\n0x1: y\n", "'0x1' (line 2)"),          # the same int once loaded
    ("l:\n- {x: 1}\n- {x: 1, x: 2}\n", "'x' (line 3)"),
])
def test_loader_refuses_duplicate_keys(tmp_path, monkeypatch, fast, text, key):
    if not fast:
        monkeypatch.delattr(yaml, "CSafeLoader", raising=False)
    path = tmp_path / "f.yaml"
    path.write_text(text)
    with pytest.raises(SpecError, match=f"duplicate key {key}".replace("(", r"\(").replace(")", r"\)")
                       .replace(".", r"\.")):
        read_yaml_mapping(path, "model")


@pytest.mark.parametrize("fast", [True, False], ids=["libyaml", "pure-python"])
def test_loader_keeps_same_key_in_different_mappings_and_refuses_aliases(tmp_path, monkeypatch, fast):
    if not fast:
        monkeypatch.delattr(yaml, "CSafeLoader", raising=False)
    path = tmp_path / "f.yaml"
    path.write_text("a: {x: 1}\nb: {x: 2}\nc: [{x: 1}, {x: 2}]\n'1': s\n")
    assert read_yaml_mapping(path, "model") == {"a": {"x": 1}, "b": {"x": 2}, "c": [{"x": 1}, {"x": 2}],
                                                "1": "s"}
    # beside '1', a bare 1 is no duplicate but a number, which no spec names a field by
    path.write_text("'1': s\n1: i\n")
    with pytest.raises(SpecError, match="key 1: YAML reads it as a number"):
        read_yaml_mapping(path, "model")
    path.write_text("a: &r 1\nb: *r\n")
    with pytest.raises(SpecError, match="aliases"):
        read_yaml_mapping(path, "model")
