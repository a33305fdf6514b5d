"""The files in examples/ load and run as their README says."""
from pathlib import Path

import pytest

from hardware import load_system
from planner import megatron as mg
from planner.model import load_model
from planner.plan import JobSpec, load_plan
from planner.search import plan

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def test_custom_model_and_system_plan():
    model = load_model(str(EXAMPLES / "custom_model.yaml"))
    system = load_system(str(EXAMPLES / "custom_system.yaml"))
    assert round(model.num_params / 1e9, 1) == 13.0  # Llama-2 13B
    assert system.num_gpus == 256 and system.offload.capacity_gib == 512
    best = plan(model, system, JobSpec(global_batch=512), top_k=1).best
    assert best is not None and best.estimate.feasible and best.plan.gpus == 256


def test_custom_hybrid_model_plans():
    model = load_model(str(EXAMPLES / "custom_hybrid_model.yaml"))
    assert (model.blocks("M"), model.blocks("-"), model.blocks("*")) == (21, 17, 4)
    assert round(model.num_params / 1e9, 1) == 4.0  # Nemotron 3 Nano 4B
    system, job = load_system("h100-sxm", 8), JobSpec(global_batch=256)
    best = plan(model, system, job, top_k=1).best
    assert best is not None and best.estimate.feasible and best.plan.cp == 1
    # its launch, as examples/README.md runs it: pretrain_mamba.py with the block pattern
    launch = mg.megatron_args(best.plan, model, job, system)
    assert launch.entrypoint == "pretrain_mamba.py" and mg.launch_refusals(best.plan, model, job, system) == []
    assert mg.validate_launch(launch, mg.gpu_arch_major(system)) == []
    assert launch.value("--hybrid-layer-pattern").replace("|", "") == model.hybrid_pattern


def test_saved_megatron_example_is_a_valid_launch():
    p = load_plan(EXAMPLES / "megatron_gpt3_175b.yaml")
    model, system = load_model("gpt3-175b"), load_system("a100-80g", 1024)
    job = JobSpec(global_batch=p.global_batch)
    assert mg.not_expressible(p, model, job) == []
    assert mg.validate_launch(mg.megatron_args(p, model, job, system), mg.gpu_arch_major(system)) == []


def test_the_uneven_405b_layout_example_is_costed_and_launched():
    """examples/README.md: NVIDIA's Llama 3.1 405B layout from flags (pp 8, vpp 4 from 32 stages)."""
    import json
    from typer.testing import CliRunner
    from planner.cli.app import app
    args = ["-m", "llama3.1-405b", "-s", "gb300-nvl72", "-g", "256", "-b", "1536", "--tp", "4", "--pp", "8",
            "--pipeline-layout", "3,4x30,3", "--dtype", "nvfp4"]
    est = CliRunner().invoke(app, ["estimate", *args, "--json"])
    assert est.exit_code == 0, est.output
    assert json.loads(est.stdout)["plan"]["stage_layers"] == [3] + [4] * 30 + [3]
    launch = CliRunner().invoke(app, ["megatron", *args, "--format", "json"])
    assert launch.exit_code == 0, launch.output
    assert json.loads(launch.stdout)["argv"].count("--account-for-loss-in-pipeline-split") == 1


def test_the_maverick_example_plans_on_one_rack():
    """examples/README.md: Llama 4 Maverick on 72 GB200 in MXFP8 has a plan, its ranks holding
    both layer kinds (interleaved: 24 of its 48 layers MoE)."""
    model, system = load_model("llama4-maverick"), load_system("gb200-nvl72", 72)
    assert (model.dense_layers, model.moe_layers) == (24, 24)
    best = plan(model, system, JobSpec(global_batch=576, dtype="mxfp8"), top_k=1).best
    assert best is not None and best.estimate.feasible and best.plan.gpus == 72


def test_the_versus_example_compares_with_the_recipe(tmp_path):
    """examples/README.md: NVIDIA's 26.02 H100 gpt-oss-120b recipe kept by `estimate --save`, then
    `plan --versus` it: the recipe is costed as `estimate` costs it, and the split adds up."""
    import json
    from typer.testing import CliRunner
    from planner.cli.app import app
    job = ["-m", "gpt-oss-120b", "-s", "h100-sxm", "-g", "64", "-b", "1280"]
    recipe = tmp_path / "recipe.yaml"
    est = CliRunner().invoke(app, ["estimate", *job, "--pp", "4", "--ep", "8", "--micro-batch", "1",
                                   "--recompute", "selective", "--recompute-modules", "layernorm,moe_act",
                                   "--save", str(recipe), "--json"])
    assert est.exit_code == 0, est.output
    res = CliRunner().invoke(app, ["plan", *job, "--versus", str(recipe), "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    versus, best_s = out["versus"], out["plans"][0]["step_time_s"]
    assert versus["plan"] == "tp1 pp4 dp16 ep8 mb1 rc-selective[layernorm+moe_act] zero1" and versus["fits"]
    assert versus["step_time_s"] == json.loads(est.stdout)["step_time_s"]
    assert sum(versus["difference_s"].values()) == pytest.approx(best_s - versus["step_time_s"])
