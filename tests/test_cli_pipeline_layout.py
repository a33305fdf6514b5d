"""`--pipeline-layout` / `--stage-recompute-layers` on `planner estimate` and `planner megatron`:
an uneven (interleaved) layout such as NVIDIA's Llama 3.1 405B recipe (pp 8, vpp 4: 3, 4 x 30, 3
layers) is costed and launched from flags, written as plans print it or as Megatron's layout
string, and a layout that cannot be is a one-line error."""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from hardware import load_system
from planner.analytical.estimate import estimate
from planner.cli.app import app
from planner.model import load_model
from planner.plan import JobSpec, Plan
from tests.conftest import one_line_error

runner = CliRunner()
BASE = ["-m", "llama3-8b", "-s", "h200", "-g", "16", "-b", "64", "--tp", "1"]


def _estimate_json(*extra: str) -> dict:
    result = runner.invoke(app, ["estimate", *BASE, *extra, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_the_layout_is_costed_as_the_plan_it_describes():
    """The flags' step time and memory equal the model's for the Plan with that stage layout
    (written as counts, with runs, or as Megatron's string), and differ from the even split's."""
    # rank 0 holds stages 0 and 2 (18 layers), rank 1 stages 1 and 3 (14)
    by_counts = _estimate_json("--pp", "2", "--vpp", "2", "--pipeline-layout", "10,10,8,4")
    by_runs = _estimate_json("--pp", "2", "--pipeline-layout", "10x2,8,4")  # vpp 2 from the 4 stages
    by_string = _estimate_json("--pp", "2", "--pipeline-layout", "Et*10|t*10|t*8|t*4L")
    plan = Plan(pp=2, dp=8, vpp=2, global_batch=64, recompute="none", zero_stage=1, dp_comm_overlap=True,
                stage_layers=(10, 10, 8, 4))
    want = estimate(load_model("llama3-8b"), load_system("h200", 16), plan, JobSpec())
    for got in (by_counts, by_runs, by_string):
        assert got["step_time_s"] == pytest.approx(want.step_time_s, rel=1e-12)
        assert got["hbm_bytes"] == pytest.approx(want.hbm_bytes, rel=1e-12)
    even = _estimate_json("--pp", "2", "--vpp", "2")
    assert even["step_time_s"] != pytest.approx(by_counts["step_time_s"], rel=1e-6)


def test_per_stage_recompute_counts():
    got = _estimate_json("--pp", "2", "--pipeline-layout", "16,16", "--stage-recompute-layers", "4,0")
    plan = Plan(pp=2, dp=8, global_batch=64, recompute="full", zero_stage=1, dp_comm_overlap=True,
                stage_layers=(16, 16), stage_recompute_layers=(4, 0))
    want = estimate(load_model("llama3-8b"), load_system("h200", 16), plan, JobSpec())
    assert got["step_time_s"] == pytest.approx(want.step_time_s, rel=1e-12)


def test_megatron_launches_nvidias_405b_recipe_layout():
    """pp 8 vpp 4 with 3 layers on the first and last stages: Megatron's own split when the
    embedding and the loss count as layers (--account-for-embedding/loss-in-pipeline-split)."""
    result = runner.invoke(app, ["megatron", "-m", "llama3.1-405b", "-s", "gb300-nvl72", "-g", "256", "-b", "1536",
                                 "--tp", "4", "--pp", "8", "--pipeline-layout", "3,4x30,3", "--dtype", "nvfp4",
                                 "--format", "json"])
    assert result.exit_code == 0, result.output
    argv = json.loads(result.stdout)["argv"]
    assert argv[argv.index("--num-virtual-stages-per-pipeline-rank") + 1] == "4"
    assert "--account-for-embedding-in-pipeline-split" in argv and "--account-for-loss-in-pipeline-split" in argv


@pytest.mark.parametrize("extra, message", [
    (["--pipeline-layout", "16,16"], "pipeline-layout: give --pp too"),
    (["--pp", "4", "--pipeline-layout", "8,8,8"], "pipeline-layout: 3 stages is not a multiple of --pp 4"),
    (["--pp", "2", "--vpp", "2", "--pipeline-layout", "16,16"], "pipeline-layout: 2 stages, but pp·vpp = 2·2 = 4"),
    (["--pp", "2", "--pipeline-layout", "16,17"], "pipeline-layout: the stages hold 33 layers in all; llama3-8b has 32"),
    (["--pp", "2", "--pipeline-layout", "0,32"], "pipeline-layout: every pipeline rank needs a layer"),
    (["--pp", "2", "--pipeline-layout", "16,a"], "pipeline-layout: 'a' is not a count"),
    (["--pp", "2", "--pipeline-layout", "16x0"], "pipeline-layout: '16x0': a run repeats 1 to"),
    (["--pp", "2", "--pipeline-layout", " "], "pipeline-layout: expected layers per stage"),
    (["--pp", "2", "--pipeline-layout", "Et*16|q*16L"], "symbols must be t, E, L, m"),
    (["--pp", "2", "--stage-recompute-layers", "1,1"], "stage-recompute-layers: needs --pipeline-layout"),
    (["--pp", "2", "--pipeline-layout", "16,16", "--stage-recompute-layers", "1"],
     "stage-recompute-layers: 1 stages, but --pipeline-layout has 2"),
    (["--pp", "2", "--pipeline-layout", "16,16", "--stage-recompute-layers", "1,17"],
     "stage-recompute-layers: stage 1 recomputes 17 of its 16 layers"),
    (["--pp", "2", "--pipeline-layout", "16,16", "--stage-recompute-layers", "1,1", "--recompute", "none"],
     "stage-recompute-layers: needs --recompute full (got --recompute none)"),
    (["--pp", "2", "--pipeline-layout", "16,16", "--stage-recompute-layers", "0x2"],
     "stage-recompute-layers: every stage recomputes 0 layers"),
    # Megatron's own layout check: the embedding once and first, the loss once and last, the MTP modules
    (["--pp", "2", "--pipeline-layout", "Et*16|t*16"], "the loss 'L' must come once, last in the last stage"),
    (["--pp", "2", "--pipeline-layout", "t*16|Et*16L"], "the embedding 'E' must come once, first in the first stage"),
    (["--pp", "2", "--pipeline-layout", "Et*16|t*16mL"], "it has 1 MTP modules 'm'; the model has 0"),
    (["--pp", "1", "--pipeline-layout", "E|t*32|L"], "pipeline-layout: 3 stages need pipeline parallelism (got --pp 1)"),
    # a string that would unroll to hundreds of millions of symbols is refused before it is built
    (["--pp", "2", "--pipeline-layout", "(t|)*99999999"], "unrolls to over 1,048,576 symbols"),
])
@pytest.mark.parametrize("command", ["estimate", "megatron"])
def test_a_layout_that_cannot_be_is_a_one_line_error(command, extra, message):
    result = runner.invoke(app, [command, *BASE, *extra])
    assert result.exit_code == 2, result.output
    assert message in one_line_error(result)


def test_a_plan_file_and_a_layout_flag_do_not_mix(tmp_path):
    saved = tmp_path / "plan.yaml"
    result = runner.invoke(app, ["plan", *BASE[:-2], "--save", str(saved)])
    assert result.exit_code == 0, result.output
    result = runner.invoke(app, ["estimate", "--plan", str(saved), "--pp", "2", "--pipeline-layout", "16,16"])
    assert result.exit_code == 2 and "give either --plan or plan flags" in one_line_error(result)


def test_a_saved_layout_run_with_another_model_is_refused(tmp_path):
    """A plan file's stage layout belongs to its model: with -m of a deeper model it would be
    costed with layers it does not hold (exit 1 and a 1.7 % MFU), now a one-line input error."""
    import yaml
    saved = tmp_path / "plan.yaml"
    result = runner.invoke(app, ["plan", *BASE[:-2], "--pp", "2", "--save", str(saved)])
    assert result.exit_code == 0, result.output
    data = yaml.safe_load(saved.read_text())
    data["plan"].update(stage_layers=[12, 20], vpp=1)
    saved.write_text(yaml.safe_dump(data))
    assert runner.invoke(app, ["estimate", "--plan", str(saved)]).exit_code in (0, 1)  # its own model: costed
    result = runner.invoke(app, ["estimate", "--plan", str(saved), "-m", "llama2-13b"])
    assert result.exit_code == 2
    assert "its stage_layers hold 32 layers, but llama2-13b has 40" in one_line_error(result)
