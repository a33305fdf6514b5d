"""A fifteenth pass over malformed input (an independent audit of less-trodden flags and files):
`planner megatron` launched an expert tensor-parallel pin on a dense model that `estimate`, `plan`
and `check` refuse; `sweep` checked its HBM reserve only after creating the output folder; `plan
--versus` took a file saved for a system that does not exist."""
from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from planner.cli.app import app
from tests.conftest import one_line_error

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[1]


def run(args: list[str]):
    return runner.invoke(app, args)


def test_megatron_refuses_an_expert_tp_pin_on_a_dense_model():
    """`planner megatron -m llama3-8b --tp 2 --etp 2` exited 0 and dropped the pin without a word
    (only an etp other than tp was refused, as 'etp: expert tensor parallelism needs a MoE model'),
    where `planner estimate` with the same flags refuses any --etp on a model without experts."""
    args = ["-m", "llama3-8b", "-s", "h100-sxm", "-g", "64", "-b", "64", "--tp", "2", "--etp", "2"]
    for command in ("megatron", "estimate"):
        one_line_error(run([command, *args]), "etp: expert parallelism needs a MoE model",
                       "llama3-8b has no experts", "--etp 2")
    assert run(["megatron", "-m", "llama3-8b", "-s", "h100-sxm", "-g", "64", "-b", "64", "--tp", "2",
                "--ep", "1"]).exit_code == 0  # ep 1 is the dense layout itself


def test_a_sweeps_hbm_reserve_beyond_the_hbm_is_refused_before_the_grid_starts(tmp_path):
    """`planner sweep --hbm-reserve-gib 100` on an 80 GB H100 (an axis other than hbm_gib) created
    the output folder, drew the progress bar and only then failed at the first point: two lines on
    the terminal and an empty folder left behind. Now one line, before anything is written."""
    out = tmp_path / "out"
    one_line_error(run(["sweep", "-m", "llama3-8b", "-s", "h100-sxm", "-b", "64", "--vary", "gpus=8",
                        "-o", str(out), "--hbm-reserve-gib", "100"]),
                   "hbm-reserve-gib: the reserve (100 GiB) leaves nothing of the 79.6 GiB HBM",
                   "allowed: 0 <= reserve < 79.6")
    assert not out.exists()


def test_a_versus_files_system_is_checked_and_named_as_its_model_is(tmp_path):
    """`plan --versus FILE` refused a file saved for an unknown model but took `system: nope-sys`
    with exit 0, and said nothing when the file was saved for another real system (found by the
    audit): the system must now exist, and the note names it as it names a model."""
    job = ["plan", "-m", "llama3-8b", "-s", "h100-sxm", "-g", "8", "-b", "64", "--top", "1"]
    saved = tmp_path / "p.yaml"
    assert run([*job, "--save", str(saved)]).exit_code == 0
    text = saved.read_text()
    assert "\nsystem: h100-sxm\n" in text
    unknown, other = tmp_path / "unknown.yaml", tmp_path / "other.yaml"
    unknown.write_text(text.replace("\nsystem: h100-sxm\n", "\nsystem: nope-sys\n"))
    other.write_text(text.replace("\nsystem: h100-sxm\n", "\nsystem: h200\n"))
    one_line_error(run([*job, "--versus", str(unknown)]), "versus:", "system: unknown preset 'nope-sys'")
    result = run([*job, "--versus", str(other)])
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert "Note: the file was saved for system h200; both plans are costed here for this command's job " \
           "(system h100-sxm)." in said
    same = run([*job, "--versus", str(saved)])
    assert same.exit_code == 0 and "Note: the file was saved for" not in " ".join(same.output.split())
