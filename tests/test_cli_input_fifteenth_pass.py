"""A fifteenth pass over malformed input (an independent audit of less-trodden flags and files):
`planner megatron` launched an expert tensor-parallel pin on a dense model that `estimate`, `plan`
and `check` refuse."""
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
