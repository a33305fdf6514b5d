"""Megatron offloads activations by whole layers (--cpu-offloading-num-layers k): under
--framework megatron the search costs the fractions a launch runs (k / layers), and a pinned
fraction is costed as the layers it launches. Before, 0.5 of DeepSeek-V3's 61 layers was costed
at 0.5 and launched as 31 layers (0.508)."""
from __future__ import annotations

import pytest
from typer.testing import CliRunner

from constraints.space import build_space
from hardware import load_system
from planner import megatron as mg
from planner.cli.app import app
from planner.megatron.expressible import cpu_offload_layers
from planner.model import load_model
from planner.plan import JobSpec
from planner.search import plan

runner = CliRunner()


def test_the_megatron_grid_is_whole_layers():
    model, system = load_model("deepseek-v3"), load_system("gb200-nvl72", 256)
    mega = build_space(model, system, JobSpec(global_batch=1024)).domains["offload_activations"]
    assert mega == (0.0, 31 / 61, 1.0)
    free = build_space(model, system, JobSpec(global_batch=1024, framework="any")).domains["offload_activations"]
    assert free == (0.0, 0.5, 1.0)  # weights and any fraction: the co-design grid as it was


def test_a_pinned_fraction_is_costed_as_the_layers_it_launches():
    model, system = load_model("deepseek-v2-lite"), load_system("gb200-nvl72", 16)
    job = JobSpec(global_batch=128, pins={"offload_activations": 0.5, "pp": 1})
    best = plan(model, system, job, top_k=1).best.plan
    assert best.offload_activations == pytest.approx(14 / 27)  # 0.5 of 27 layers rounds up to 14
    launch = mg.megatron_args(best, model, job, system)
    assert cpu_offload_layers(best, model) == 14
    assert not [n for n in launch.notes if "whole layers" in n]  # costed as launched: nothing to say


def test_planner_plan_takes_an_offload_pin():
    """The comparison without offload dropped the tier but kept the pin: no plan, and the error
    blamed a --no-offload nobody gave."""
    result = runner.invoke(app, ["plan", "-m", "llama3-8b", "-s", "gb200-nvl72", "-g", "8", "-b", "64",
                                 "--offload-activations", "0.25"])
    assert result.exit_code == 0, result.output
    assert "offload activations 25%" in result.output


def test_estimate_costs_the_layers_megatron_offloads():
    """`planner estimate --offload-activations 0.5` on 27 layers costs the 14 layers `planner
    megatron` launches (it had costed 13.5)."""
    import json
    args = ["-m", "deepseek-v2-lite", "-s", "gb200-nvl72", "-g", "64", "-b", "512", "--tp", "1", "--pp", "1",
            "--ep", "4", "--micro-batch", "8", "--recompute", "none", "--offload-activations", "0.5"]
    est = runner.invoke(app, ["estimate", *args, "--json"])
    assert est.exit_code == 0, est.output
    assert json.loads(est.stdout)["plan"]["offload_activations"] == pytest.approx(14 / 27)
    launch = runner.invoke(app, ["megatron", *args, "--format", "json"])
    argv = json.loads(launch.stdout)["argv"]
    assert argv[argv.index("--cpu-offloading-num-layers") + 1] == "14"


def test_a_pinned_offload_that_costs_time_says_so():
    """A pinned offload slower than the best plan without it: "It costs", not "It pays ... -13.9 %".
    On 8 GB200 (batch 64; 64 GPUs and batch 512 took eight times as long) the plan is the same
    (ep 4, micro-batch 8, one microbatch, 52 % offloaded, 0.108 s of it exposed) and the plan
    without offload takes 13.7 % less time per token."""
    result = runner.invoke(app, ["plan", "-m", "deepseek-v2-lite", "-s", "gb200-nvl72", "-g", "8", "-b", "64",
                                 "--offload-activations", "0.5"])
    assert result.exit_code == 0, result.output
    import re
    text = " ".join(result.output.split())
    assert re.search(r"It costs: the best plan without offload, .*, takes [\d.]+ s per step, \d+\.\d% less time "
                     r"per token", text), text


def test_memory_keeps_the_layers_the_schedule_leaves_in_hbm():
    """Any framework: a fraction is moved in whole layers, ceil(f·L) of them (the count the offload
    schedule times), so HBM keeps the other L − ceil(f·L) layers' activations. 0.5 of 27 layers
    moves 14 and keeps 13/27 of the activations (it had kept 13.5/27 while the time counted 14)."""
    from planner.analytical import estimate
    from planner.plan import Plan
    model, system = load_model("deepseek-v2-lite"), load_system("gb200-nvl72", 64)
    job = JobSpec(global_batch=512, framework="any")
    base = Plan(tp=1, pp=1, dp=64, ep=4, micro_batch=8, global_batch=512, recompute="none")
    none = estimate(model, system, base, job).memory_breakdown_bytes["activations_bytes"]
    half = estimate(model, system, base.model_copy(update={"offload_activations": 0.5}), job)
    assert half.memory_breakdown_bytes["activations_bytes"] == pytest.approx(none * 13 / 27)
    assert half.offload_breakdown_bytes["offload_activations_bytes"] == pytest.approx(none * 14 / 27)
    same = estimate(model, system, base.model_copy(update={"offload_activations": 14 / 27}), job)
    assert same.hbm_bytes == pytest.approx(half.hbm_bytes) and same.step_time_s == pytest.approx(half.step_time_s)
