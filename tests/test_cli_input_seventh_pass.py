"""A seventh pass over malformed input (an audit of about 580 commands): what reached the
internal-error exit (a folder the user may not enter, a file name that is not UTF-8, a config.json
nested 200,000 deep, a FIFO, a closed pipe, a full disk), and what was read silently (a config key
given twice, a plan file's `job:` in YAML's loose booleans, conflicting expert counts)."""
from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from planner.cli.app import EXIT_PIPE_CLOSED, app
from tests.conftest import one_line_error

runner = CliRunner()
HF = Path(__file__).parent / "fixtures" / "hf"
BASE = {"model_type": "llama", "hidden_size": 1024, "num_attention_heads": 16, "num_hidden_layers": 4,
        "intermediate_size": 4096, "vocab_size": 32000, "num_key_value_heads": 16, "max_position_embeddings": 4096}
ESTIMATE = ["-s", "h100-sxm", "-g", "8", "-b", "64", "--tp", "1", "--pp", "1"]


def run(args: list[str]):
    return runner.invoke(app, args)


def _config(tmp_path, text: str, name: str = "config.json") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


# ---- config.json: what json.loads accepts and the reader must not -------------------------------

def test_a_config_key_given_twice_is_refused_not_read_as_the_last(tmp_path):
    text = json.dumps(BASE)[:-1] + ', "num_hidden_layers": 2}'
    one_line_error(run(["estimate", "-m", _config(tmp_path, text), *ESTIMATE]), "'num_hidden_layers' appears twice")


def test_a_byte_order_mark_is_not_an_error(tmp_path):
    path = tmp_path / "config.json"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(BASE).encode())
    out = run(["estimate", "-m", str(path), *ESTIMATE])
    assert out.exit_code == 0, out.output


def test_a_config_nested_too_deep_is_one_line(tmp_path):
    one_line_error(run(["estimate", "-m", _config(tmp_path, "[" * 200_000), *ESTIMATE]), "nested too deep")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_fifo_named_config_json_is_refused_not_read(tmp_path):
    """Reading a FIFO blocks until a writer comes: the command hung until killed."""
    fifo = tmp_path / "config.json"
    os.mkfifo(fifo)
    one_line_error(run(["estimate", "-m", str(fifo), *ESTIMATE]), "not a regular file")


def test_an_upper_case_json_suffix_is_a_config_json(tmp_path):
    out = run(["estimate", "-m", _config(tmp_path, json.dumps(BASE), "CONFIG.JSON"), *ESTIMATE])
    assert out.exit_code == 0, out.output


@pytest.mark.parametrize("edit,words", [
    ({"num_experts": 16, "num_local_experts": 8, "num_experts_per_tok": 2}, "given twice and differs"),
    ({"layer_types": ["full_attention"]}, "layer_types lists 1 layers, num_hidden_layers is 4"),
    # a rule between fields names the config keys behind the planner's names
    ({"num_attention_heads": 15}, "heads = num_attention_heads"),
    ({"num_key_value_heads": 32}, "query_groups = num_key_value_heads"),
])
def test_config_values_read_silently_before(tmp_path, edit, words):
    one_line_error(run(["estimate", "-m", _config(tmp_path, json.dumps({**BASE, **edit})), *ESTIMATE]), words)


def test_nemotron_h_mtp_pattern_is_checked(tmp_path):
    """The check ran before the MTP depth was read, so it could never fire."""
    cfg = json.loads((HF / "nemotron-3-nano" / "config.json").read_text())
    cfg.update({"num_nextn_predict_layers": 2, "mtp_hybrid_override_pattern": "XYZ"})
    one_line_error(run(["estimate", "-m", _config(tmp_path, json.dumps(cfg)), *ESTIMATE]),
                   "mtp_hybrid_override_pattern 'XYZ' is not supported")


def test_nemotron_h_shared_experts_wider_than_their_width_are_named_by_key(tmp_path):
    """moe_shared_expert_intermediate_size // n_shared_experts was 0: an error on a width the
    planner had derived, not on the keys the user wrote."""
    cfg = json.loads((HF / "nemotron-3-nano" / "config.json").read_text())
    cfg["n_shared_experts"] = 4096
    one_line_error(run(["estimate", "-m", _config(tmp_path, json.dumps(cfg)), *ESTIMATE]),
                   "moe_shared_expert_intermediate_size", "n_shared_experts (4096)")


def test_a_config_name_of_a_slash_or_control_characters_still_gives_a_header(tmp_path):
    out = run(["estimate", "-m", _config(tmp_path, json.dumps({**BASE, "_name_or_path": "a\nb\x1b[31m"})), *ESTIMATE])
    assert out.exit_code == 0 and out.output.splitlines()[0].startswith("ab[31m ("), out.output
    out = run(["estimate", "-m", _config(tmp_path, json.dumps({**BASE, "_name_or_path": "/"})), *ESTIMATE])
    assert out.exit_code == 0 and out.output.splitlines()[0].startswith(f"{tmp_path.name} ("), out.output


# ---- names and paths -----------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["", "   ", "evil\nname", "\x1b[31mred", "c1\x9bcontrol", "line\u2028break",
                                  "abc\u202egpt", "iso\u2066late"])  # bidi overrides print the name reversed
def test_a_model_name_is_one_line_of_visible_text(tmp_path, name):
    model = yaml.safe_load(Path("planner/presets/llama3-8b.yaml").read_text())
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump({**model, "name": name}))
    one_line_error(run(["estimate", "-m", str(path), *ESTIMATE]), "name:")


def test_a_file_name_that_is_not_utf8_is_an_input_error(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    one_line_error(run(["estimate", "-m", os.fsdecode(b"\xff.yaml"), *ESTIMATE]), "does not exist")


def test_a_permission_error_on_a_path_is_an_input_error(monkeypatch):
    """A folder on the way that this user may not enter (root may enter any, so it is simulated)."""
    import hardware.load

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied", "locked/s.yaml")
    monkeypatch.setattr(hardware.load, "resolve_preset_or_file", refuse)
    one_line_error(run(["estimate", "-m", "llama3-8b", "-s", "locked/s.yaml", "-g", "8"]), "locked/s.yaml",
                   "permission denied")


def test_an_empty_plan_path_is_said_to_be_empty():
    one_line_error(run(["estimate", "--plan", ""]), "plan: empty name")
    one_line_error(run(["megatron", "--plan", " "]), "plan: empty name")


def test_a_save_into_a_folder_that_cannot_be_written_is_refused_before_the_search(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "access", lambda path, mode: False)
    one_line_error(run(["plan", "-m", "llama3-8b", "-s", "h100-sxm", "-g", "8", "-b", "64",
                        "--save", str(tmp_path / "p.yaml")]), "is not writable")


def test_sweep_force_does_not_write_through_a_symbolic_link(tmp_path):
    target = tmp_path / "precious.csv"
    target.write_text("keep me\n")
    (tmp_path / "sweep.csv").symlink_to(target)
    one_line_error(run(["sweep", "-m", "llama3-8b", "-s", "h100-sxm", "--vary", "gpus=8,16", "-b", "64",
                        "-o", str(tmp_path), "--force"]), "symbolic link")
    assert target.read_text() == "keep me\n"


# ---- a plan file's job: as strict as its plan ----------------------------------------------------

@pytest.mark.parametrize("field,value,words", [
    ("flash_attention", "no", "expected true or false, got 'no'"),
    ("flash_attention", 0, "expected true or false, got 0"),
    ("full_iteration_cuda_graph", "on", "expected true or false"),
    ("hbm_reserve_gib", True, "expected a number, got true"),
    ("hbm_reserve_gib", "2", "expected a number, got the string '2'"),
    ("bytes_per_param", "x", "bytes_per_param: expected a mapping"),
])
def test_a_plan_files_job_fields_take_no_loose_types(tmp_path, llama3_8b_plan_file_text, field, value, words):
    data = copy.deepcopy(yaml.safe_load(llama3_8b_plan_file_text))
    data["job"][field] = value
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    one_line_error(run(["estimate", "--plan", str(path)]), f"job: {field}" if field != "bytes_per_param" else "job:",
                   words)


def test_a_plan_files_global_batch_as_text_is_named_as_such(tmp_path, llama3_8b_plan_file_text):
    data = yaml.safe_load(llama3_8b_plan_file_text)
    data["global_batch"] = str(data["global_batch"])
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    one_line_error(run(["estimate", "--plan", str(path)]), "global_batch: expected an integer")


# ---- flags -----------------------------------------------------------------------------------------

def test_a_layout_too_long_says_so():
    one_line_error(run(["estimate", "-m", "llama3-8b", "-s", "h100-sxm", "-g", "8", "--pipeline-layout", "1," * 6000]),
                   "pipeline-layout: too long")


def test_megatron_format_in_capitals_gives_its_error_as_json():
    out = run(["megatron", "-m", "llama3-8b", "-s", "h100-sxm", "-g", "8", "--tp", "0", "--format", "JSON"])
    assert out.exit_code == 2 and "error" in json.loads(out.output), out.output


# ---- the output side -------------------------------------------------------------------------------

def test_a_closed_pipe_is_exit_141_not_no_plan_fits(monkeypatch):
    """click answers EPIPE with exit 1, which here means "no plan fits"; a broken pipe that is not
    stdout's (a worker's) stays what it is, a bug."""
    import planner.cli.search
    app_module = sys.modules["planner.cli.app"]  # (the package's `app` attribute is the Typer app)

    def closed(*args, **kwargs):
        raise BrokenPipeError(32, "Broken pipe")
    monkeypatch.setattr(planner.cli.search, "model_preset_names", closed)
    monkeypatch.setattr(app_module, "stdout_reader_gone", lambda: True)
    out = run(["presets"])
    assert out.exit_code == EXIT_PIPE_CLOSED, out.output
    assert "Traceback" not in out.output and "internal error" not in out.output
    monkeypatch.setattr(app_module, "stdout_reader_gone", lambda: False)
    out = run(["presets"])
    assert out.exit_code == 70 and "internal error" in out.output and "BrokenPipeError" in out.output, out.output


PLANNER = shutil.which("planner") or ""


@pytest.mark.skipif(not PLANNER or not os.path.exists("/dev/full"), reason="needs the installed command and /dev/full")
@pytest.mark.parametrize("json_out", [False, True])
def test_a_full_disk_is_an_output_error_not_a_bug(json_out):
    """Under --json the error line went to the full stdout too, and failed there: a traceback."""
    with open("/dev/full", "w") as full:
        done = subprocess.run([PLANNER, "presets", *(["--json"] if json_out else [])], stdout=full,
                              stderr=subprocess.PIPE, text=True, timeout=120)
    assert done.returncode == 74, done.stderr
    assert "cannot write the output" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.skipif(not PLANNER, reason="needs the installed command")
def test_an_ascii_terminal_gets_escapes_not_a_crash():
    done = subprocess.run([PLANNER, "presets"], capture_output=True, timeout=120,
                          env={**os.environ, "PYTHONIOENCODING": "ascii"})
    assert done.returncode == 0, done.stderr
    assert b"\\xa7" in done.stdout  # the presets' "§" escaped, not a crash


@pytest.mark.skipif(not PLANNER or sys.platform != "linux", reason="needs the installed command")
def test_a_reader_that_leaves_early_gets_141():
    """`planner validate | head -1` (here the bridge rows only: 455 kB, seven times what a pipe
    holds, at half the cost of all 850 kB): exit 141, as a shell reports SIGPIPE, and nothing on
    stderr."""
    proc = subprocess.Popen([PLANNER, "validate", "--source", "bridge"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    proc.stdout.readline()
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=300) == EXIT_PIPE_CLOSED, err
    assert b"Traceback" not in err and b"error" not in err, err


@pytest.mark.skipif(not PLANNER or sys.platform != "linux", reason="needs the installed command")
def test_an_input_error_under_json_into_a_closed_pipe_is_still_exit_2():
    done = subprocess.run(f"set -o pipefail; {PLANNER} estimate --tp 0 --json | true", shell=True, capture_output=True,
                          text=True, timeout=120, executable="/bin/bash")
    assert done.returncode == 2 and "Traceback" not in done.stderr, (done.returncode, done.stderr)


def test_a_config_folder_named_oddly_still_reads(tmp_path):
    """The name falls back to the folder's: a long or control-character folder name is cleaned,
    not refused (the user never gave a name)."""
    for folder in ("a" * 220, "bad\nname"):
        d = tmp_path / folder
        d.mkdir()
        (d / "config.json").write_text(json.dumps(BASE))
        out = run(["estimate", "-m", str(d), *ESTIMATE])
        assert out.exit_code == 0, out.output
