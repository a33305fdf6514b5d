"""A thirteenth pass over malformed input (about 590 probes of model, system and Hugging Face
files, saved plans, sweeps and the environment, by an independent audit): a file name that is not
UTF-8 ended a sweep in "internal error" and was saved into a plan file no command could read back,
--versus compared files that `estimate --plan` refuses, `sweep --force` overwrote the accelerator
file a system file names, a saved plan cut short lost its precision in silence, and messages that
named the wrong culprit or Python's types."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import yaml
from typer.testing import CliRunner

from planner.cli.app import app
from tests.conftest import one_line_error

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[1]
JOB = ["-m", "llama3-8b", "-s", "h100-sxm", "-g", "16", "-b", "32"]


def run(args: list[str]):
    return runner.invoke(app, args)


def _saved(tmp_path) -> Path:
    path = tmp_path / "base.yaml"
    assert run(["plan", *JOB, "-k", "1", "--save", str(path)]).exit_code == 0
    return path


def _edited(tmp_path, base: Path, name: str, **top) -> str:
    doc = yaml.safe_load(base.read_text())
    plan = top.pop("plan", {})
    doc.update(top)
    doc["plan"].update(plan)
    path = tmp_path / name
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return str(path)


def test_a_file_name_that_is_not_utf8_is_refused_where_it_would_be_written(tmp_path):
    """A name with a 0xff byte reaches Python as a lone surrogate, which neither the sweep's JSON
    point log nor a YAML plan file can hold: the sweep ended in "internal error" (exit 70) and left
    an empty output folder; `plan --save` wrote a file its readers refused. Both are refused up
    front, in one line that shows the byte; commands that write nothing still read the file."""
    model = tmp_path / os.fsdecode(b"m\xff.yaml")
    shutil.copy(ROOT / "examples" / "custom_model.yaml", model)
    out = tmp_path / "out"
    line = one_line_error(run(["sweep", "-m", str(model), "-s", "h100-sxm", "-b", "8", "--vary", "gpus=8",
                               "-o", str(out), "-j", "1"]), "model:", "m\\xff.yaml", "not valid UTF-8")
    assert "point log" in line and not out.exists()
    saved = tmp_path / "p.yaml"
    one_line_error(run(["plan", "-m", str(model), "-s", "h100-sxm", "-g", "8", "-b", "8", "-k", "1",
                        "--save", str(saved)]), "save: model:", "not valid UTF-8", "plan file")
    one_line_error(run(["estimate", "-m", str(model), "-s", "h100-sxm", "-g", "8", "-b", "8", "--tp", "1",
                        "--save", str(saved)]), "save: model:", "not valid UTF-8")
    assert not saved.exists()
    costed = run(["estimate", "-m", str(model), "-s", "h100-sxm", "-g", "8", "-b", "8", "--tp", "1"])
    assert costed.exit_code in (0, 1) and "error:" not in costed.output, costed.output  # 1: does not fit


def test_versus_checks_a_saved_file_as_estimate_does(tmp_path):
    """--versus compared files that `estimate --plan` refuses (exit 0): a pipeline rank without a
    layer, a file naming no model that exists or a model of the wrong kind, numbers written as
    text or out of range (a negative gpus was said as a GPU-count mismatch)."""
    base = _saved(tmp_path)
    cases = [
        (dict(plan={"pp": 2, "dp": 8, "stage_layers": [0, 32]}), "every pipeline rank needs a layer"),
        (dict(model=5), "model: expected str, got 5"),
        (dict(model="llama9"), "model: unknown preset 'llama9'"),
        (dict(model="missing_model.yaml"), "model: file"),
        (dict(seq_length=0), "seq_length: must be an integer from 1"),
        (dict(seq_length="8192"), "seq_length: expected int, got '8192'"),
        (dict(gpus="16"), "gpus: expected int, got '16'"),
        (dict(gpus=-16), "gpus: must be an integer from 1"),
    ]
    for i, (edit, words) in enumerate(cases):
        path = _edited(tmp_path, base, f"v{i}.yaml", **edit)
        one_line_error(run(["estimate", "--plan", path]), words)
        one_line_error(run(["plan", *JOB, "-k", "1", "--versus", path]), "versus:", f"plan {path}", words)


def test_versus_notes_a_file_saved_for_another_model(tmp_path):
    path = _edited(tmp_path, _saved(tmp_path), "other.yaml", model="llama3-70b")
    result = run(["plan", *JOB, "-k", "1", "--versus", path])
    assert result.exit_code == 0, result.output
    assert "saved for model llama3-70b" in " ".join(result.output.split())


def test_megatron_blames_the_plan_files_gpus_not_the_system(tmp_path):
    """`megatron --plan` said "the plan needs 16 GPUs but the system has 8", where the 8 was the
    file's own gpus: (h100-sxm has 1,024); `estimate --plan` names the file."""
    path = _edited(tmp_path, _saved(tmp_path), "g.yaml", gpus=8)
    for command in ("estimate", "megatron"):
        one_line_error(run([command, "--plan", path]), f"plan {path}: tp·pp·dp·cp = 16 but the file says gpus: 8")
    one_line_error(run(["megatron", "-m", "llama3-8b", "-s", "h100-sxm", "-g", "8", "--tp", "2", "--pp", "2",
                        "--dp", "4", "-b", "32"]), "tp·pp·dp·cp = 16 but the system has 8 GPUs")


def test_a_saved_plan_cut_short_before_its_job_says_so(tmp_path):
    """A saved fp8 plan cut before `job:` was costed in bf16 without a word; a hand-written layout
    (model and system beside the plan, no job) stays quiet."""
    fp8 = tmp_path / "fp8.yaml"
    assert run(["plan", *JOB, "--dtype", "fp8", "-k", "1", "--save", str(fp8)]).exit_code == 0
    text = fp8.read_text()
    cut = tmp_path / "cut.yaml"
    cut.write_text(text[:text.index("\njob:") + 1])
    result = run(["estimate", "--plan", str(cut)])
    assert f"note: plan {cut} looks cut short: it has no job: block" in " ".join(result.output.split())
    example = str(ROOT / "examples" / "megatron_gpt3_175b.yaml")
    assert "cut short" not in run(["megatron", "--plan", example]).output


def test_sweep_force_never_overwrites_the_accelerator_file_a_system_names(tmp_path):
    (tmp_path / "sweep.csv").write_text((ROOT / "hardware/presets/accelerators/h100-sxm5-80gb.yaml").read_text())
    system = yaml.safe_load((ROOT / "hardware/presets/h100-sxm.yaml").read_text())
    system["accelerator"] = "./sweep.csv"
    (tmp_path / "sys.yaml").write_text(yaml.safe_dump(system))
    before = (tmp_path / "sweep.csv").read_text()
    one_line_error(run(["sweep", "-m", "llama3-8b", "-s", str(tmp_path / "sys.yaml"), "-b", "16", "--vary", "gpus=8",
                        "-o", str(tmp_path), "--force"]), "is the accelerator file of --system", "would be overwritten")
    assert (tmp_path / "sweep.csv").read_text() == before


def test_messages_say_what_the_file_holds_in_its_own_words(tmp_path):
    """null, not NoneType; a merge key, not a constructor tag; an empty or non-UTF-8 config.json,
    not "not a JSON config"; a missing expert count or top-k named as missing."""
    (tmp_path / "merge.yaml").write_text("<<: {layers: 40, hidden: 5120}\nname: x\n")
    one_line_error(run(["estimate", "-m", str(tmp_path / "merge.yaml"), "-s", "h100-sxm", "-g", "8"]),
                   "a YAML merge key (<<) is not supported")
    (tmp_path / "list.yaml").write_text("- a\n- b\n")
    one_line_error(run(["estimate", "-m", str(tmp_path / "list.yaml"), "-s", "h100-sxm", "-g", "8"]),
                   "expected a YAML mapping of fields, got a list")
    config = tmp_path / "config.json"
    for content, words in ((b"null", "expected a JSON object of fields, got null"),
                           (b"", "the file is empty"), (b"\xff\xfe{}", "not a text (UTF-8) JSON file"),
                           (b'{"a":\n', "not a JSON config at line 2")):
        config.write_bytes(content)
        one_line_error(run(["estimate", "-m", str(config), "-s", "h100-sxm", "-g", "8"]), words)
    mixtral = {"model_type": "mixtral", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
               "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32000,
               "max_position_embeddings": 32768}
    import json
    config.write_text(json.dumps({**mixtral, "num_experts_per_tok": 2}))
    one_line_error(run(["estimate", "-m", str(config), "-s", "h100-sxm", "-g", "8"]),
                   "num_experts_per_tok names experts, and the expert count is missing")
    config.write_text(json.dumps({**mixtral, "num_local_experts": 8}))
    one_line_error(run(["estimate", "-m", str(config), "-s", "h100-sxm", "-g", "8"]),
                   "num_experts_per_tok (or experts_per_token) must be an integer >= 1", "it is missing")
    plan = _saved(tmp_path)
    doc = yaml.safe_load(plan.read_text())
    doc["plan"] = None
    plan.write_text(yaml.safe_dump(doc))
    one_line_error(run(["estimate", "--plan", str(plan)]), "expected a mapping of plan fields, got null")


def test_pydantics_bounds_and_types_are_said_with_what_was_written(tmp_path):
    """"tp: Input should be greater than 0" named the field but not the value or the kind wanted."""
    base = _saved(tmp_path)
    cases = [(dict(plan={"tp": -1}), "tp: must be > 0, got the number -1"),
             (dict(plan={"stage_layers": "16,16"}), "stage_layers: expected a list such as [16, 16], got the text '16,16'"),
             (dict(plan={"micro_batch": 1.5}), "micro_batch: expected an integer (a whole number), got the number 1.5"),
             (dict(plan={"tp": [1]}), "tp: expected an integer, got a list")]
    for i, (edit, words) in enumerate(cases):
        one_line_error(run(["estimate", "--plan", _edited(tmp_path, base, f"b{i}.yaml", **edit)]), words)
    doc = yaml.safe_load(base.read_text())
    doc["job"]["hbm_reserve_gib"] = 5000
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(doc))
    one_line_error(run(["estimate", "--plan", str(tmp_path / "r.yaml")]), "hbm_reserve_gib: must be <= 1024")


def test_megatron_names_the_file_whose_layout_is_another_models(tmp_path):
    """`megatron --plan FILE -m llama3-70b` said "stage_layers sum to 32, the model has 80 layers"
    naming no file; `estimate --plan` says whose layout it is."""
    path = tmp_path / "pp2.yaml"
    assert run(["plan", *JOB, "-k", "1", "--pp", "2", "--save", str(path)]).exit_code == 0
    for command in ("estimate", "megatron"):
        one_line_error(run([command, "--plan", str(path), "-m", "llama3-70b"]),
                       f"plan {path}: its stage_layers hold 32 layers, but llama3-70b has 80")


def test_a_closed_standard_output_exits_74_as_a_full_disk_does():
    """Started with fd 1 closed (`>&-`), Python drops every print: `plan` exited 0 with its answer
    lost; a full disk (/dev/full) already gave 74."""
    import subprocess
    import sys
    done = subprocess.run(["bash", "-c", f'"{sys.executable}" -m planner.cli presets >&-'], capture_output=True,
                          text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 74, (done.returncode, done.stderr)
    assert done.stderr.strip() == "error: cannot write the output (standard output is closed)"


def test_a_system_files_accelerator_errors_name_the_system_file(tmp_path):
    """An `accelerator:` naming a system file failed on its first unknown key ("num_gpus: unknown
    field (and 8 more problems)"), and an unknown preset name did not say which system file named
    it."""
    system = yaml.safe_load((ROOT / "hardware/presets/h100-sxm.yaml").read_text())
    shutil.copy(ROOT / "hardware/presets/h100-sxm.yaml", tmp_path / "x.yaml")
    for name, accelerator, words in (("s1.yaml", "./x.yaml", "this is a system file (accelerator:); pass it with -s"),
                                     ("s2.yaml", "h900", "accelerator: unknown preset 'h900'")):
        (tmp_path / name).write_text(yaml.safe_dump({**system, "accelerator": accelerator}))
        one_line_error(run(["estimate", "-m", "llama3-8b", "-s", str(tmp_path / name), "-g", "8"]),
                       f"system ({tmp_path / name})", words)


def test_checks_offload_need_is_the_least_tier_that_fits_rounded_up(tmp_path):
    """`check` named a power-of-two tier ("128 GiB (not with 64)") where 98.7 GiB fits, and printed
    the least plan's offload rounded to nearest, so a tier of the printed size did not fit (35.6
    against 35.63 GiB). The need is now the least tier, rounded up: it fits, 0.2 GiB less does not."""
    import json
    job = ["-m", "llama3-70b", "-g", "8", "-b", "64"]
    result = run(["check", *job, "-s", "h100-sxm", "--json"])
    assert result.exit_code == 1, result.output
    need = json.loads(result.output)["numbers"]["offload_tier_needed_gib"]
    assert need == int(need * 10 + 0.999) / 10 and 50 < need < 128  # tenths, far below the old 128
    system = yaml.safe_load((ROOT / "hardware/presets/h100-sxm.yaml").read_text())
    for capacity, fits in ((need, 0), (round(need - 0.2, 1), 1)):
        path = tmp_path / f"box{capacity}.yaml"
        path.write_text(yaml.safe_dump({**system, "offload": {"name": "pool", "capacity_gib": capacity,
                                                              "bandwidth_gb_per_s": 100}}))
        assert run(["check", *job, "-s", str(path)]).exit_code == fits, capacity


def test_a_sweeps_progress_line_says_how_long_is_left(tmp_path):
    """A 10,000-point grid (about 3.5 days at 30 s a point) started without a word on its length:
    the progress line now carries rich's remaining-time estimate beside the elapsed time."""
    result = run(["sweep", "-m", "llama3-8b", "-s", "h100-sxm", "-b", "16", "--vary", "gpus=8,16", "-o",
                  str(tmp_path / "out"), "-j", "1"])
    assert result.exit_code == 0, result.output
    assert any(line.startswith("sweep") and " left " in line for line in result.output.splitlines()), result.output
