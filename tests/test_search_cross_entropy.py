"""Searched plans run Megatron's fused cross-entropy unless told not to (JobSpec.cross_entropy_fusion):
it shortens the loss's forward (time.CROSS_ENTROPY_FUSED_SHARE) and costs no memory, so a plan
without it is never the fastest, and an independent brute force over `planner estimate` flags
had found every searched best beaten by the same plan with --cross-entropy-fusion."""
import json

from typer.testing import CliRunner

from hardware import load_system
from planner.analytical import estimate
from planner.cli import app
from planner.model import load_model
from planner.plan import JobSpec
from planner.search import plan as search_plan

runner = CliRunner()


def test_the_search_turns_fused_cross_entropy_on_and_it_is_only_faster():
    model, system = load_model("llama3-8b"), load_system("h100-sxm", 16)
    fused = search_plan(model, system, JobSpec(global_batch=64), top_k=3)
    unfused = search_plan(model, system, JobSpec(global_batch=64, cross_entropy_fusion=False), top_k=3)
    assert all(r.plan.cross_entropy_fusion for r in fused.ranked)
    assert not any(r.plan.cross_entropy_fusion for r in unfused.ranked)
    best, best_unfused = fused.ranked[0], unfused.ranked[0]
    assert best.plan.model_copy(update={"cross_entropy_fusion": False}) == best_unfused.plan
    # the same layout, costed alone both ways: faster with the fused loss, same memory
    job = JobSpec(global_batch=64)
    with_fusion = estimate(model, system, best.plan, job)
    without = estimate(model, system, best.plan.model_copy(update={"cross_entropy_fusion": False}), job)
    assert with_fusion.step_time_s == best.estimate.step_time_s < without.step_time_s == best_unfused.estimate.step_time_s
    assert with_fusion.hbm_bytes == without.hbm_bytes


def test_cli_plan_says_so_and_can_search_megatrons_default():
    args = ["plan", "-m", "llama3-8b", "-s", "h100-sxm", "-g", "16", "-b", "64"]
    fused = runner.invoke(app, args)
    assert fused.exit_code == 0, fused.output
    assert "fused cross-entropy" in fused.output
    plain = runner.invoke(app, args + ["--no-cross-entropy-fusion"])
    assert plain.exit_code == 0, plain.output
    assert "fused cross-entropy" not in plain.output
    fused_json = json.loads(runner.invoke(app, args + ["--json"]).output)
    plain_json = json.loads(runner.invoke(app, args + ["--no-cross-entropy-fusion", "--json"]).output)
    assert fused_json["plans"][0]["plan"]["cross_entropy_fusion"] is True
    assert plain_json["plans"][0]["plan"]["cross_entropy_fusion"] is False
    assert fused_json["plans"][0]["step_time_s"] < plain_json["plans"][0]["step_time_s"]
