"""The kernel flags of `planner plan` / `estimate` (--cuda-graph, --fp8-attention,
--fused-grouped-mlp): the JobSpec fields the Bridge records are costed with, now settable by a
user, saved with a plan; `planner megatron` emits the full-iteration graph for a dense model and
refuses what it does not emit."""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from hardware import load_system
from planner.analytical import estimate
from planner.cli import app
from planner.model import load_model
from planner.plan import JobSpec, Plan

RUN = CliRunner()
ESTIMATE = ["estimate", "-m", "qwen3-30b-a3b", "-s", "gb200-nvl72", "-g", "8", "-b", "64", "--dtype", "mxfp8",
            "--tp", "1", "--pp", "1", "--ep", "8", "--micro-batch", "1", "--recompute", "selective",
            "--zero-stage", "1"]


def test_estimate_flags_are_the_jobspec_fields():
    model, system = load_model("qwen3-30b-a3b"), load_system("gb200-nvl72", 8)
    plan = Plan(dp=8, ep=8, micro_batch=1, global_batch=64, recompute="selective", zero_stage=1)
    by_hand = {}
    for flags, fields in (([], {}), (["--cuda-graph", "full-iteration", "--fp8-attention", "--fused-grouped-mlp"],
                                     dict(full_iteration_cuda_graph=True, fp8_attention=True, fused_grouped_mlp=True))):
        r = RUN.invoke(app, ESTIMATE + flags + ["--json"])
        assert r.exit_code == 0, r.output
        job = JobSpec(global_batch=64, dtype="mxfp8", **fields)
        by_hand[bool(fields)] = estimate(model, system, plan, job).step_time_s
        assert json.loads(r.output)["step_time_s"] == pytest.approx(by_hand[bool(fields)], rel=1e-12)
    assert by_hand[True] < by_hand[False]  # no per-layer launch time, FP8 attention, fused experts


@pytest.mark.parametrize("flags, field", [(["--cuda-graph", "partial"], "cuda-graph"),
                                          (["--dtype", "bf16", "--fp8-attention"], "fp8_attention")])
def test_bad_kernel_flags_are_one_line_errors(flags, field):
    args = [a for a in ESTIMATE if a not in ("--dtype", "mxfp8")] + flags
    r = RUN.invoke(app, args)
    assert r.exit_code == 2 and field in r.output and len(r.output.strip().splitlines()) == 1, r.output


def test_saved_plan_keeps_them_and_megatron_refuses_them(tmp_path):
    saved = tmp_path / "plan.yaml"
    r = RUN.invoke(app, ["plan", "-m", "qwen3-30b-a3b", "-s", "gb200-nvl72", "-g", "8", "-b", "16", "--dtype", "mxfp8",
                         "--top", "1", "--cuda-graph", "full-iteration", "--save", str(saved)])
    assert r.exit_code == 0, r.output
    again = RUN.invoke(app, ["estimate", "--plan", str(saved), "--json"])
    assert again.exit_code == 0, again.output
    without = RUN.invoke(app, ["estimate", "--plan", str(saved), "--cuda-graph", "none"])
    assert without.exit_code == 2 and "plan file" in without.output
    # a flag that agrees with the file is accepted, and the flags not given are not compared
    agrees = RUN.invoke(app, ["estimate", "--plan", str(saved), "--no-fp8-attention", "--json"])
    assert agrees.exit_code == 0, agrees.output
    assert json.loads(agrees.output)["step_time_s"] == json.loads(again.output)["step_time_s"]
    launch = RUN.invoke(app, ["megatron", "--plan", str(saved)])
    assert launch.exit_code == 2 and "--cuda-graph full-iteration" in launch.output
    assert "does not emit" in launch.output


def test_megatron_emits_a_dense_plans_full_iteration_graph(tmp_path):
    """Megatron-Core's cuda_graph_impl full_iteration, with the NaN check Megatron requires off
    (training/arguments.py: the assert on --no-check-for-nan-in-loss-and-grad); the same plan
    saved without the graph launches without them."""
    for graph, path in (("full-iteration", tmp_path / "graph.yaml"), ("none", tmp_path / "plain.yaml")):
        r = RUN.invoke(app, ["plan", "-m", "llama3-8b", "-s", "h100-sxm", "-g", "8", "-b", "64", "--top", "1",
                             "--cuda-graph", graph, "--save", str(path)])
        assert r.exit_code == 0, r.output
        launch = RUN.invoke(app, ["megatron", "--plan", str(path), "--format", "json"])
        assert launch.exit_code == 0, launch.output
        argv = json.loads(launch.stdout)["argv"]
        emitted = "--cuda-graph-impl" in argv and argv[argv.index("--cuda-graph-impl") + 1] == "full_iteration"
        assert emitted == (graph == "full-iteration")
        assert ("--no-check-for-nan-in-loss-and-grad" in argv) == (graph == "full-iteration")
