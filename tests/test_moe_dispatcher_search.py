"""`planner plan --moe-dispatcher deepep`: the search costs every plan with the job's dispatcher,
and what it reports is what the exact model says of that plan."""
import math

from typer.testing import CliRunner

from hardware import load_system
from planner.analytical.estimate import estimate
from planner.cli.app import app
from planner.model import load_model
from planner.plan import JobSpec
from planner.search import plan


def _job(dispatcher: str) -> JobSpec:
    # ep 32 over four 8-GPU nodes: the all-to-all crosses the NICs, where DeepEP's dedup acts
    return JobSpec(global_batch=64, moe_dispatcher=dispatcher, pins={"ep": 32, "tp": 1, "pp": 1})


def test_search_costs_plans_with_the_jobs_dispatcher():
    model, system = load_model("qwen3-30b-a3b"), load_system("h100-sxm", 32)
    plain = plan(model, system, _job("alltoall"), top_k=3)
    dedup = plan(model, system, _job("deepep"), top_k=3)
    assert all(r.plan.moe_dispatcher == "alltoall" for r in plain.ranked)
    assert all(r.plan.moe_dispatcher == "deepep" for r in dedup.ranked)
    for r in dedup.ranked:  # the table's number is the exact model's for the reported plan
        assert math.isclose(r.estimate.step_time_s, estimate(model, system, r.plan, _job("deepep")).step_time_s,
                            rel_tol=1e-9)
    # DeepEP sends a token across the network once per destination node, never more bytes than
    # the plain all-to-all: the same layout is never slower, and here (128 experts, top-8 over 4
    # nodes) strictly faster
    same = plain.best.plan.model_copy(update={"moe_dispatcher": "deepep"})
    assert estimate(model, system, same, _job("deepep")).step_time_s < plain.best.estimate.step_time_s
    assert dedup.best.estimate.step_time_s <= estimate(model, system, same, _job("deepep")).step_time_s * (1 + 1e-9)


def test_cli_plan_with_deepep_launches_the_flex_dispatcher(tmp_path):
    out = tmp_path / "p.yaml"
    args = ["plan", "-m", "qwen3-30b-a3b", "-s", "h100-sxm", "-g", "32", "-b", "64", "--ep", "32", "--tp", "1",
            "--pp", "1", "--moe-dispatcher", "deepep", "--save", str(out)]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    assert "DeepEP dispatch" in res.output
    launch = CliRunner().invoke(app, ["megatron", "--plan", str(out)])
    assert launch.exit_code == 0, launch.output
    assert "--moe-token-dispatcher-type flex" in launch.output and "--moe-flex-dispatcher-backend deepep" in launch.output


def test_dispatcher_on_a_dense_model_is_an_input_error():
    res = CliRunner().invoke(app, ["plan", "-m", "llama3-8b", "-s", "h100-sxm", "-g", "8", "-b", "64",
                                   "--moe-dispatcher", "deepep"])
    assert res.exit_code == 2 and "moe-dispatcher: applies to MoE models only" in res.output


def test_named_choices_are_case_insensitive_and_name_the_flag():
    ok = CliRunner().invoke(app, ["plan", "-m", "qwen3-30b-a3b", "-s", "h100-sxm", "-g", "32", "-b", "64", "--ep", "32",
                                  "--tp", "1", "--pp", "1", "--moe-dispatcher", "DeepEP", "--top", "1"])
    assert ok.exit_code == 0 and "DeepEP dispatch" in ok.output
    bad = CliRunner().invoke(app, ["estimate", "-m", "qwen3-30b-a3b", "-s", "h100-sxm", "-g", "8", "-b", "64",
                                   "--tp", "1", "--pp", "1", "--ep", "8", "--dp-impl", "zero3"])
    assert bad.exit_code == 2
    assert "dp-impl: unknown 'zero3'; allowed: megatron, torch-fsdp2, deepspeed" in bad.output
