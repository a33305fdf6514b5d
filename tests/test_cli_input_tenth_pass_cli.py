"""A tenth pass over malformed command-line input: a sweep step so small that its count overflowed
(exit 70), a point log that is a FIFO (the sweep hung) or a link (the sweep wrote into the user's
file), `-` taken as a file name, numbers in other scripts' digits or with '_' read as numbers,
5 kB values echoed whole, control characters in a sweep's file names, negative zero kept as -0.0,
a system file's num_gpus never checked beside --gpus, and `planner megatron` without the
--cuda-graph that `planner plan --help` says it emits."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import yaml
from typer.testing import CliRunner

from planner.cli.app import app
from planner.sweep import Axis
from tests.conftest import one_line_error

runner = CliRunner()
SMALL = ["-m", "llama3.2-1b", "-s", "h100-sxm", "-g", "8", "-b", "64"]
ESTIMATE = ["estimate", *SMALL, "--tp", "1"]
SWEEP = ["sweep", "-m", "llama3.2-1b", "-s", "h100-sxm", "-b", "64", "-j", "1", "--no-explain"]
TIERS = [{"name": "nvl", "domain_gpus": 8, "bandwidth_gb_per_s": 450, "latency_us": 3},
         {"name": "ib", "domain_gpus": 1048576, "bandwidth_gb_per_s": 50, "latency_us": 8}]


def run(args: list[str]):
    return runner.invoke(app, args)


# ---- 1. a sweep step below the smallest normal float --------------------------------------------

@pytest.mark.parametrize("vary", ["hbm_gib=80:90:1e-320", "gpus=8:16:5e-324", "offload_gib=0:1:1e-310"])
def test_a_subnormal_sweep_step_is_too_many_values(tmp_path, vary):
    """(stop - start) / step was inf, and int() of it an OverflowError (exit 70)."""
    one_line_error(run([*SWEEP, "--vary", vary, "-o", str(tmp_path / "out")]), "vary", "more than 1000 values")
    assert not (tmp_path / "out").exists()


# ---- 2. the point log as a FIFO or a link --------------------------------------------------------

def test_a_fifo_point_log_is_refused_not_waited_on(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    os.mkfifo(out / "sweep.points.jsonl")
    try:  # a child process: the old code blocked forever opening the FIFO
        proc = subprocess.run([sys.executable, "-m", "planner.cli", *SWEEP, "-g", "8", "--vary", "hbm_gib=80,90",
                               "-o", str(out)], capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail("the sweep waited on the FIFO point log")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and "sweep.points.jsonl exists and is not a file" in proc.stderr


@pytest.mark.parametrize("force", [False, True])
def test_a_linked_point_log_is_refused_and_its_target_kept(tmp_path, force):
    mine = tmp_path / "mine.txt"
    mine.write_text("the user's notes\n")
    out = tmp_path / "out"
    out.mkdir()
    (out / "sweep.points.jsonl").symlink_to(mine)
    one_line_error(run([*SWEEP, "-g", "8", "--vary", "hbm_gib=80,90", "-o", str(out), *(["--force"] * force)]),
                   "sweep.points.jsonl is a symbolic link")
    assert mine.read_text() == "the user's notes\n"
    assert sorted(p.name for p in out.iterdir()) == ["sweep.points.jsonl"]


# ---- 3. `-` for standard input or output ---------------------------------------------------------

@pytest.mark.parametrize("args,words", [
    (["plan", *SMALL, "--top", "1", "--save", "-"], ("save:", "standard output", "new file")),
    (["megatron", *SMALL, "--tp", "1", "-o", "-"], ("output:", "standard output", "leave -o out")),
    ([*SWEEP, "-g", "8", "--vary", "hbm_gib=80", "-o", "-"], ("out:", "standard output", "folder")),
    (["plan", "-m", "-", "-s", "h100-sxm"], ("model:", "standard input", "preset name")),
    (["estimate", "-m", "llama3.2-1b", "-s", "-"], ("system:", "standard input", "preset name")),
    (["estimate", "--plan", "-"], ("plan:", "standard input", "plan file")),
    (["megatron", "--plan", "-"], ("plan:", "standard input", "plan file")),
    (["validate", "--reference", "-"], ("reference:", "standard input", "reference YAML file")),
    ([*SWEEP[:1], "-s", "h100-sxm", "--vary", "model=-,llama3.2-1b", "-o", "out"], ("model:", "standard input")),
])
def test_a_dash_is_refused_as_stdin_or_stdout(tmp_path, monkeypatch, args, words):
    """`-` wrote a file (or a folder) named '-', or was looked up as a preset '-'."""
    monkeypatch.chdir(tmp_path)
    one_line_error(run(args), "'-'", "not supported", *words)
    assert list(tmp_path.iterdir()) == []


def test_a_file_named_dash_is_still_read_as_dot_slash_dash(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "-").write_text(yaml.safe_dump({"name": "s", "num_gpus": 8, "gpus_per_node": 8,
                                                "accelerator": "h100-sxm5-80gb", "network": TIERS}))
    result = run(["estimate", "-m", "llama3.2-1b", "-s", "./-", "-b", "64", "--tp", "1", "--pp", "1", "--json"])
    assert result.exit_code == 0, result.output


# ---- 4. digits of other scripts, '_' separators ---------------------------------------------------

@pytest.mark.parametrize("args,words", [
    ([*ESTIMATE, "--pp", "1", "--dtype", "fp8-cs", "--bf16-layers", "١,٢"], ("bf16-layers",)),
    ([*ESTIMATE, "--pp", "1", "--dtype", "fp8-cs", "--bf16-layers", "²,1"], ("bf16-layers",)),
    ([*ESTIMATE, "--pp", "2", "--pipeline-layout", "٨,٨"], ("pipeline-layout", "ASCII")),
    ([*ESTIMATE, "--pp", "2", "--pipeline-layout", "８,８"], ("pipeline-layout", "ASCII")),
    ([*ESTIMATE, "--pp", "2", "--pipeline-layout", "Et*٨|t*8L"], ("pipeline-layout", "ASCII")),
    ([*ESTIMATE, "--pp", "1", "--moe-imbalance", "1_5"], ("--moe-imbalance", "'1_5'", "ASCII digits without '_'")),
    ([*ESTIMATE, "--pp", "1", "--seq-length", "1_024"], ("--seq-length", "'1_024'", "ASCII digits")),
    ([*ESTIMATE, "--pp", "1", "--hbm-reserve-gib", "٢"], ("--hbm-reserve-gib", "ASCII digits")),
    (["estimate", "-m", "llama3.2-1b", "-s", "h100-sxm", "-g", "1_6", "--tp", "1"], ("--gpus", "ASCII digits")),
    ([*SWEEP, "--vary", "gpus=٨,١٦", "-o", "out"], ("vary: gpus", "'٨'", "not a number", "ASCII")),
    ([*SWEEP, "--vary", "gpus=1_6", "-o", "out"], ("vary: gpus", "'1_6'", "not a number")),
    ([*SWEEP, "--vary", "hbm_gib=٨٠:٩٠:5", "-o", "out"], ("vary: hbm_gib", "not a number")),
])
def test_numbers_take_ascii_digits_only(tmp_path, monkeypatch, args, words):
    """Python's int()/float() read '١٦' as 16 and '1_5' as 15 (--moe-imbalance 1_5 was 15)."""
    monkeypatch.chdir(tmp_path)
    one_line_error(run(args), *words)


# ---- 5. long values are echoed cut short ----------------------------------------------------------

LONG = "t" * 5000


@pytest.mark.parametrize("args", [
    [*ESTIMATE, "--pp", "2", "--pipeline-layout", LONG],
    [*ESTIMATE, "--pp", "1", "--recompute-modules", LONG],
    [*ESTIMATE, "--pp", "1", "--recompute-modules", f"core_attn,{LONG}"],
    [*ESTIMATE, "--pp", "1", "--module-dtype", LONG],
    [*ESTIMATE, "--pp", "1", "--dtype", LONG],
    [*ESTIMATE, "--pp", "1", "--bf16-layers", LONG],
    [*ESTIMATE, "--pp", "1", "--recompute", LONG],
    [*ESTIMATE, "--pp", "1", "--cuda-graph", LONG],
    [*ESTIMATE, "--pp", "1", "--adam-moments", LONG],
    ["megatron", *SMALL, "--tp", "1", "--format", LONG],
    [*SWEEP, "--vary", f"gpus={LONG}", "-o", "out"],
    [*SWEEP, "--vary", f"gpus=8:{LONG}:8", "-o", "out"],
    [*SWEEP, "--vary", f"{LONG}=8", "-o", "out"],
    [*SWEEP, "--vary", LONG, "-o", "out"],
])
def test_a_long_value_is_echoed_cut_short(tmp_path, monkeypatch, args):
    monkeypatch.chdir(tmp_path)
    line = one_line_error(run(args))
    assert len(line) < 400 and "..." in line, len(line)


# ---- 6. a sweep's file names hold visible text ----------------------------------------------------

@pytest.mark.parametrize("name", ["a\nb", "a\tb", "a\x7fb", "a\x1bb", "a\u2028b"])
def test_a_sweep_name_with_control_characters_is_refused(tmp_path, name):
    out = tmp_path / "out"
    one_line_error(run([*SWEEP, "-g", "8", "--vary", "hbm_gib=80", "-o", str(out), "--name", name]),
                   "name:", "visible text")
    assert not out.exists()


# ---- 7. negative zero -----------------------------------------------------------------------------

def test_negative_zero_options_are_saved_as_zero(tmp_path):
    saved = tmp_path / "p.yaml"
    result = run(["plan", *SMALL, "--top", "1", "--hbm-reserve-gib", "-0.0", "--save", str(saved)])
    assert result.exit_code == 0, result.output
    assert "hbm_reserve_gib: 0.0" in saved.read_text() and "-0.0" not in saved.read_text()


def test_negative_zero_sweep_values_are_zero():
    values = Axis.from_cli("offload_gib=-0.0,512").values
    assert values == [0.0, 512.0] and str(values[0]) == "0.0"


def test_zero_and_negative_zero_are_one_sweep_value(tmp_path):
    one_line_error(run([*SWEEP, "-g", "8", "--vary", "offload_gib=0,-0.0", "-o", str(tmp_path / "out")]),
                   "offload_gib", "repeated")


# ---- 8. a system file's own num_gpus beside --gpus ------------------------------------------------

@pytest.mark.parametrize("value,words", [(".nan", ("must be a finite number",)),
                                          ("1.0e+30", ("num_gpus",)),
                                          ("8.5", ("integer",)),
                                          ("true", ("expected a number",))])
def test_a_system_files_num_gpus_is_checked_under_gpus(tmp_path, value, words):
    system = tmp_path / "s.yaml"
    system.write_text(yaml.safe_dump({"name": "s", "num_gpus": "@@", "gpus_per_node": 8,
                                      "accelerator": "h100-sxm5-80gb", "network": TIERS}).replace("'@@'", value))
    one_line_error(run(["estimate", "-m", "llama3.2-1b", "-s", str(system), "-g", "8", "-b", "64", "--tp", "1",
                        "--pp", "1"]), "system (", "num_gpus", "--gpus", *words)


def test_a_system_file_without_num_gpus_still_takes_gpus(tmp_path):
    system = tmp_path / "s.yaml"
    system.write_text(yaml.safe_dump({"name": "s", "gpus_per_node": 8, "accelerator": "h100-sxm5-80gb",
                                      "network": TIERS}))
    result = run(["estimate", "-m", "llama3.2-1b", "-s", str(system), "-g", "8", "-b", "64", "--tp", "1", "--pp", "1",
                  "--json"])
    assert result.exit_code == 0, result.output


# ---- 9. planner megatron --cuda-graph -------------------------------------------------------------

def test_megatron_takes_cuda_graph_as_plan_does(tmp_path):
    """`planner plan --help` says megatron emits full-iteration graphs; only a --plan file reached it."""
    full = run(["megatron", *SMALL, "--tp", "1", "--pp", "1", "--cuda-graph", "full-iteration", "--format", "args"])
    assert full.exit_code == 0, full.output
    assert "--cuda-graph-impl full_iteration" in full.output
    layers = run(["megatron", *SMALL, "--tp", "1", "--pp", "1", "--cuda-graph", "layers", "--format", "args"])
    assert layers.exit_code == 0, layers.output
    assert "--cuda-graph-impl transformer_engine" in layers.output and "--cuda-graph-modules attn mlp" in layers.output
    one_line_error(run(["megatron", *SMALL, "--tp", "1", "--cuda-graph", "every"]), "cuda-graph", "none, layers")
    saved = tmp_path / "p.yaml"
    assert run(["plan", *SMALL, "--top", "1", "--save", str(saved)]).exit_code == 0
    one_line_error(run(["megatron", "--plan", str(saved), "--cuda-graph", "layers"]), "cuda-graph",
                   "differs from the plan file's")
    assert run(["megatron", "--plan", str(saved), "--cuda-graph", "none", "--format", "args"]).exit_code == 0
    # in the flag's own words, not the field's true/false (input audit)
    one_line_error(run(["megatron", "--plan", str(saved), "--cuda-graph", "full-iteration"]),
                   "cuda-graph: full-iteration differs from the plan file's (none)")


def test_a_long_unknown_option_or_command_is_echoed_cut_short():
    """click echoed a pasted 3,000-character option or command name whole."""
    for args in (["plan", "--" + "t" * 3000], ["x" * 3000]):
        res = CliRunner().invoke(app, args)
        assert res.exit_code == 2 and len(res.output) < 300, len(res.output)
        assert "..." in res.output
