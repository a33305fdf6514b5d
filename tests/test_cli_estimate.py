"""`planner estimate` end to end: every preset pair, JSON, and one-line errors for bad input."""
import json

import pytest
from typer.testing import CliRunner

from hardware import load_system, system_preset_names
from planner.analytical import estimate, flops
from planner.cli import app
from planner.model import load_model, model_preset_names
from planner.cli.common import gpu_job_defaults
from planner.plan import JobSpec, Plan
from tests.conftest import one_line_error

runner = CliRunner()


@pytest.mark.parametrize("model_name", model_preset_names())
@pytest.mark.parametrize("system_name", system_preset_names())
def test_every_preset_pair_estimates(model_name, system_name):
    model, system = load_model(model_name), load_system(system_name)
    tp = max(t for t in (1, 2, 4, 8) if model.heads % t == 0)
    plan = Plan(tp=tp, dp=system.num_gpus // tp, global_batch=system.num_gpus // tp, sequence_parallel=tp > 1)
    est = estimate(model, system, plan, JobSpec(**gpu_job_defaults(system)))  # V100: fp16, unfused attention
    assert est.step_time_s > 0 and est.hbm_bytes > 0
    assert 0 < est.mfu < 1
    assert sum(est.time_breakdown_s.values()) == pytest.approx(est.step_time_s)


def test_cli_table_and_json():
    result = runner.invoke(app, ["estimate"])
    assert result.exit_code == 0, result.output
    assert "Step time" in result.output and "MFU" in result.output
    result = runner.invoke(app, ["estimate", "-m", "llama3-70b", "-s", "h100-sxm", "-g", "64", "--tp", "8",
                                 "--pp", "4", "-b", "128", "--vpp", "5", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["plan"]["dp"] == 2 and data["feasible"] in (True, False)
    assert data["step_time_s"] == pytest.approx(sum(data["time_breakdown_s"].values()))


def test_cli_reads_a_plan_file(tmp_path):
    path = tmp_path / "plan.yaml"
    path.write_text("plan: {tp: 8, pp: 8, dp: 16, global_batch: 1536, micro_batch: 1}\n")
    result = runner.invoke(app, ["estimate", "--plan", str(path), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["plan"]["pp"] == 8
    # a file that names no model or system is costed for the defaults, and says so
    assert "names no model and no system; using gpt3-175b" in result.stderr


def test_unknown_preset():
    one_line_error(runner.invoke(app, ["estimate", "-m", "gpt5"]), "model", "allowed")
    one_line_error(runner.invoke(app, ["estimate", "-s", "tpu"]), "system", "allowed")


def test_gpu_product_mismatch():
    one_line_error(runner.invoke(app, ["estimate", "--dp", "3"]), "tp·pp·dp·cp")


def test_negative_and_bad_values():
    one_line_error(runner.invoke(app, ["estimate", "--micro-batch", "-1"]), "micro-batch")
    one_line_error(runner.invoke(app, ["estimate", "--recompute", "some"]), "recompute")
    one_line_error(runner.invoke(app, ["estimate", "-g", "-8"]), "gpus")


def test_model_yaml_errors(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("layers: 4\nhidden: 100\nheads: 3\nseq_length: 128\nvocab: 1000\n")
    one_line_error(runner.invoke(app, ["estimate", "-m", str(bad), "-g", "8", "--tp", "1", "--pp", "1"]),
                   "divisible by heads")
    broken = tmp_path / "broken.yaml"
    broken.write_text("layers: [4\n")
    one_line_error(runner.invoke(app, ["estimate", "-m", str(broken)]), "malformed YAML")
    missing = tmp_path / "missing.yaml"
    missing.write_text("layers: 4\nhidden: 128\n")
    one_line_error(runner.invoke(app, ["estimate", "-m", str(missing)]), "heads", "missing")
    one_line_error(runner.invoke(app, ["estimate", "-m", str(tmp_path / "nope.yaml")]), "does not exist")


def test_saved_plan_carries_its_model_and_system(tmp_path):
    saved = tmp_path / "plan.yaml"
    result = runner.invoke(app, ["plan", "-m", "llama3-8b", "-s", "h100-sxm", "-g", "16", "-b", "64",
                                 "--save", str(saved)])
    assert result.exit_code == 0, result.output
    est = runner.invoke(app, ["estimate", "--plan", str(saved), "--json"])
    assert est.exit_code == 0, est.output
    data = json.loads(est.output)
    assert data["plan"]["tp"] * data["plan"]["pp"] * data["plan"]["dp"] * data["plan"]["cp"] == 16
    assert data["model_flops"] == pytest.approx(
        64 * 8192 * flops.model_flops_per_token(load_model("llama3-8b")), rel=1e-12)
    mg = runner.invoke(app, ["megatron", "--plan", str(saved), "--format", "json"])
    assert mg.exit_code == 0, mg.output
    assert json.loads(mg.output)["args"]["--num-layers"] == "32"


def test_estimate_plan_file_costs_the_saved_job(tmp_path):
    """`estimate --plan F` uses the dtype/reserve the plan was saved with, as `megatron --plan F`."""
    saved = tmp_path / "plan.yaml"
    result = runner.invoke(app, ["plan", "-m", "llama3-8b", "-s", "h100-sxm", "-g", "16", "-b", "64",
                                 "--dtype", "fp8", "--hbm-reserve-gib", "4", "--save", str(saved)])
    assert result.exit_code == 0, result.output
    from_file = json.loads(runner.invoke(app, ["estimate", "--plan", str(saved), "--json"]).output)
    p = from_file["plan"]
    flags = ["estimate", "-m", "llama3-8b", "-s", "h100-sxm", "-g", "16", "-b", "64", "--json",
             "--tp", str(p["tp"]), "--pp", str(p["pp"]), "--dp", str(p["dp"]), "--cp", str(p["cp"]),
             "--micro-batch", str(p["micro_batch"]), "--recompute", p["recompute"],
             "--zero-stage", str(p["zero_stage"]),
             "--sequence-parallel" if p["sequence_parallel"] else "--no-sequence-parallel",
             "--cross-entropy-fusion" if p["cross_entropy_fusion"] else "--no-cross-entropy-fusion"]
    fp8 = json.loads(runner.invoke(app, flags + ["--dtype", "fp8", "--hbm-reserve-gib", "4"]).output)
    bf16 = json.loads(runner.invoke(app, flags).output)
    assert from_file["step_time_s"] == fp8["step_time_s"] != bf16["step_time_s"]
    assert from_file["hbm_capacity_bytes"] == fp8["hbm_capacity_bytes"] != bf16["hbm_capacity_bytes"]
    # the same setting given again is fine; a different one is refused in one line
    again = runner.invoke(app, ["estimate", "--plan", str(saved), "--dtype", "fp8", "--json"])
    assert again.exit_code == 0 and json.loads(again.output)["step_time_s"] == fp8["step_time_s"]
    one_line_error(runner.invoke(app, ["estimate", "--plan", str(saved), "--dtype", "bf16"]),
                   "dtype", "differs", "fp8")
