"""`planner plan --versus PLAN`: the best plan set against the user's own layout (or a published
recipe's), costed for the same job, with the difference split by time component."""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from planner.analytical.estimate import estimate
from planner.cli.app import app
from planner.model import load_model
from planner.plan import JobSpec, Plan
from planner.report import COMPARED_TIME_PARTS, TIME_LABELS, difference_text, time_difference
from hardware.load import load_system

runner = CliRunner()
JOB = ["-m", "llama3-8b", "-s", "h100-sxm", "-g", "16", "-b", "16"]
# a layout nobody would pick: pp 4 with 4 microbatches per pipeline (a bubble of 3/4 of the work)
BASELINE = {"tp": 1, "pp": 4, "dp": 4, "micro_batch": 1, "global_batch": 16, "zero_stage": 1}


def _write(tmp_path, fields: dict, name: str = "base.yaml"):
    import yaml
    path = tmp_path / name
    path.write_text(yaml.safe_dump(fields))
    return str(path)


def test_time_difference_covers_every_time_component_once():
    keys = [k for keys in COMPARED_TIME_PARTS.values() for k in keys]
    assert sorted(keys) == sorted(TIME_LABELS)  # a component left out would hide part of the gain


def test_time_difference_by_hand():
    base = dict.fromkeys(TIME_LABELS, 0.0) | {"forward_s": 1.0, "backward_s": 2.0, "pp_bubble_s": 1.5}
    other = dict.fromkeys(TIME_LABELS, 0.0) | {"forward_s": 0.9, "backward_s": 1.8, "dp_comm_exposed_s": 0.2}
    parts = dict(time_difference(base, other))
    assert parts["pipeline bubble"] == pytest.approx(-1.5)
    assert parts["forward + backward compute"] == pytest.approx(-0.3)
    assert parts["DP comm"] == pytest.approx(0.2)
    assert [label for label, _ in time_difference(base, other)][:3] == [
        "pipeline bubble", "forward + backward compute", "DP comm"]  # largest change first
    text = difference_text(time_difference(base, other), 4.5)
    assert text == ("−1.50 s pipeline bubble (−33%), −0.30 s forward + backward compute (−7%), "
                    "+0.20 s DP comm (+4%)")
    # changes under 0.5 % of the base step are left out
    assert difference_text([("DP comm", 0.01)], 4.5) == "no change"


def test_versus_splits_the_gain_and_the_parts_add_up(tmp_path):
    path = _write(tmp_path, BASELINE)
    res = runner.invoke(app, ["plan", *JOB, "--versus", path, "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    best_s = out["plans"][0]["step_time_s"]
    versus = out["versus"]
    # the baseline costed independently, through the Python API, for the same job
    own = estimate(load_model("llama3-8b"), load_system("h100-sxm", 16), Plan(**BASELINE), JobSpec(global_batch=16))
    assert versus["step_time_s"] == pytest.approx(own.step_time_s, rel=1e-12)
    assert versus["best_over_versus"] == pytest.approx(best_s / own.step_time_s, rel=1e-12)
    assert sum(versus["difference_s"].values()) == pytest.approx(best_s - own.step_time_s, rel=1e-9)
    # pp 4 at 4 microbatches: its bubble is (p-1)/m = 3/4 of the microbatches' time, which a plan
    # without a pipeline does not pay
    assert own.time_breakdown_s["pp_bubble_s"] > 0.3 * own.step_time_s
    assert versus["difference_s"]["pipeline bubble"] == pytest.approx(-own.time_breakdown_s["pp_bubble_s"])
    text = runner.invoke(app, ["plan", *JOB, "--versus", path], env={"COLUMNS": "1000"})  # no folded path
    assert text.exit_code == 0
    line = " ".join(text.output.split())
    assert f"Versus tp1 pp4 dp4 mb1 zero1 ({path}): predicted {own.step_time_s:.3f} s per step; the best plan is" in line
    assert "pipeline bubble (−" in line


def test_versus_the_best_plan_itself_changes_nothing(tmp_path):
    saved = tmp_path / "best.yaml"
    assert runner.invoke(app, ["plan", *JOB, "--save", str(saved)]).exit_code == 0
    out = json.loads(runner.invoke(app, ["plan", *JOB, "--versus", str(saved), "--json"]).stdout)
    assert out["versus"]["best_over_versus"] == pytest.approx(1.0, rel=1e-12)
    assert all(abs(d) < 1e-12 for d in out["versus"]["difference_s"].values())


def test_versus_a_plan_that_does_not_fit_says_so(tmp_path):
    path = _write(tmp_path, {"tp": 1, "pp": 1, "dp": 16, "micro_batch": 1, "global_batch": 16, "zero_stage": 0,
                             "recompute": "none", "cp": 1})
    res = runner.invoke(app, ["plan", *JOB, "--versus", path, "--json"])
    assert res.exit_code == 0
    versus = json.loads(res.stdout)["versus"]
    assert versus["fits"] is False and "hbm" in versus["violations"]
    line = " ".join(runner.invoke(app, ["plan", *JOB, "--versus", path]).output.split())
    assert "it does not fit: it needs" in line and "were it to fit" in line


@pytest.mark.parametrize("extra, fields, expected", [
    ([], {**BASELINE, "global_batch": 128}, "versus: the plan {path} runs global batch 128, this job 16; give -b 128"),
    ([], {**BASELINE, "dp": 8}, "versus: the plan {path} runs on tp·pp·dp·cp = 32 GPUs, this job on 16"),
    (["--free-batch"], BASELINE, "versus: compares plans at one global batch"),
    ([], {"name": "x", "accelerator": "h100-sxm5-80gb"}, "versus {path}: this is a system file"),
    ([], {**BASELINE, "stage_layers": [8, 8, 8, 7]}, "versus: plan {path}: its stage_layers hold 31 layers"),
])
def test_versus_input_errors_are_one_line(tmp_path, extra, fields, expected):
    path = _write(tmp_path, fields)
    job = JOB if "--free-batch" not in extra else JOB[:-2]
    res = runner.invoke(app, ["plan", *job, *extra, "--versus", path])
    assert res.exit_code == 2, res.output
    assert expected.format(path=path) in res.output and "Traceback" not in res.output
    assert len(res.output.strip().splitlines()) == 1


def test_versus_missing_file_and_empty_name():
    missing = runner.invoke(app, ["plan", *JOB, "--versus", "/nonexistent/plan.yaml"])
    assert missing.exit_code == 2 and "versus /nonexistent/plan.yaml: cannot read" in missing.output
    empty = runner.invoke(app, ["plan", *JOB, "--versus", ""])
    assert empty.exit_code == 2 and "versus: empty name" in empty.output


def test_estimate_save_writes_the_plan_that_versus_and_megatron_read(tmp_path):
    """`estimate --save` keeps a layout given by flags (a recipe, the run of today) as a plan file:
    `estimate --plan` costs it to the same digits and `plan --versus` compares with it."""
    saved = tmp_path / "mine.yaml"
    flags = [*JOB, "--pp", "4", "--dp", "4", "--micro-batch", "1"]
    first = runner.invoke(app, ["estimate", *flags, "--save", str(saved), "--json"])
    assert first.exit_code == 0, first.output
    again = runner.invoke(app, ["estimate", "--plan", str(saved), "--json"])
    assert again.exit_code == 0, again.output
    assert json.loads(again.stdout)["step_time_s"] == json.loads(first.stdout)["step_time_s"]
    versus = json.loads(runner.invoke(app, ["plan", *JOB, "--versus", str(saved), "--json"]).stdout)["versus"]
    assert versus["step_time_s"] == json.loads(first.stdout)["step_time_s"]
    # never over an existing file, and not beside --plan (the plan is already a file)
    twice = runner.invoke(app, ["estimate", *flags, "--save", str(saved)])
    assert twice.exit_code == 2 and "already exists" in twice.output
    beside = runner.invoke(app, ["estimate", "--plan", str(saved), "--save", str(tmp_path / "copy.yaml")])
    assert beside.exit_code == 2 and "save: the plan is already a file" in beside.output
    assert not (tmp_path / "copy.yaml").exists()


def test_versus_where_no_plan_fits_gives_its_own_verdict(tmp_path):
    """Llama-3 70B on 8 H100 fits no plan; the --versus layout is costed all the same and said not
    to fit, with its GiB (a layout outside the search's rules may fit where the search found none)."""
    path = _write(tmp_path, {"tp": 8, "pp": 1, "dp": 1, "micro_batch": 1, "global_batch": 16, "recompute": "full"})
    res = runner.invoke(app, ["plan", "-m", "llama3-70b", "-s", "h100-sxm", "-g", "8", "-b", "16", "--versus", path],
                        env={"COLUMNS": "1000"})
    assert res.exit_code == 1
    own = estimate(load_model("llama3-70b"), load_system("h100-sxm", 8),
                   Plan(tp=8, pp=1, dp=1, micro_batch=1, global_batch=16, recompute="full"), JobSpec(global_batch=16))
    assert not own.feasible
    assert f"it does not fit either: it needs {own.hbm_bytes / 2**30:.1f} GiB of HBM" in res.output


def test_versus_names_the_job_settings_its_file_was_saved_for(tmp_path):
    """A plan file saved for FP8, compared in a bf16 job: both plans are costed for this job (the
    comparison is of layouts), and the note says what the file was saved for."""
    saved = tmp_path / "fp8.yaml"
    flags = [*JOB, "--pp", "4", "--dp", "4", "--micro-batch", "1"]
    assert runner.invoke(app, ["estimate", *flags, "--dtype", "fp8", "--save", str(saved)]).exit_code == 0
    out = json.loads(runner.invoke(app, ["plan", *JOB, "--versus", str(saved), "--json"]).stdout)["versus"]
    assert out["file_job_differs"] == {"dtype": ["fp8", "bf16"]}
    bf16 = estimate(load_model("llama3-8b"), load_system("h100-sxm", 16), Plan(**BASELINE), JobSpec(global_batch=16))
    assert out["step_time_s"] == pytest.approx(bf16.step_time_s, rel=1e-12)  # costed in bf16, as the job
    line = " ".join(runner.invoke(app, ["plan", *JOB, "--versus", str(saved)], env={"COLUMNS": "1000"}).output.split())
    assert "Note: the file was saved for dtype fp8; both plans are costed here for this command's job (dtype bf16)." \
        in line
    same = json.loads(runner.invoke(app, ["plan", *JOB, "--dtype", "fp8", "--versus", str(saved), "--json"]).stdout)
    assert same["versus"]["file_job_differs"] == {}
