"""Per-layer CUDA graphs (Megatron --cuda-graph-impl transformer_engine --cuda-graph-modules):
a layer whose every static module is captured pays no per-layer launch overhead; the routed
experts stay eager."""
import pytest
from typer.testing import CliRunner

from hardware import load_system
from planner.analytical import kernels
from planner.analytical.estimate import estimate
from planner.analytical.time import BACKWARD_FACTOR
from planner.cli.app import app
from planner.model import load_model
from planner.plan import JobSpec, Plan
from planner.search import plan as search_plan


@pytest.mark.parametrize("modules,moe,captured", [
    (("attn", "mlp"), False, True), (("attn",), False, False), (("mlp",), False, False),
    (("attn", "moe_router", "moe_preprocess"), True, True), (("moe_router", "moe_preprocess"), True, False),
    (("attn", "moe_router"), True, False), (("attn", "moe"), True, True), (("attn", "mlp"), True, False),
])
def test_a_layer_is_captured_only_with_all_its_static_modules(modules, moe, captured):
    assert kernels.layer_launches_captured(moe, JobSpec(cuda_graph_modules=modules)) is captured
    assert kernels.layer_launches_captured(moe, JobSpec(full_iteration_cuda_graph=True))


def test_captured_layers_drop_exactly_the_launch_overhead():
    """Llama-3 8B on 8 H100, dp 8, 8 microbatches: 32 layers x 8 microbatches x the H100's fitted
    layer overhead, forward and backward (BACKWARD_FACTOR x the forward)."""
    model, system = load_model("llama3-8b"), load_system("h100-sxm", 8)
    plan = Plan(tp=1, pp=1, dp=8, micro_batch=1, global_batch=64, zero_stage=1)
    eager = estimate(model, system, plan, JobSpec(global_batch=64)).step_time_s
    graphed = estimate(model, system, plan, JobSpec(global_batch=64, cuda_graph_modules=("attn", "mlp"))).step_time_s
    overhead_s = system.accelerator.efficiency.layer_overhead_us * 1e-6
    assert eager - graphed == pytest.approx(32 * 8 * overhead_s * (1 + BACKWARD_FACTOR), rel=1e-9)


def test_moe_experts_keep_their_host_time():
    """Qwen3-30B-A3B, ep 8, 16 local experts: graphs of attention, router and preprocess remove
    the layer overhead but not the experts' eager launches (time.expert_host_exposed_s)."""
    model, system = load_model("qwen3-30b-a3b"), load_system("h100-sxm", 8)
    plan = Plan(tp=1, pp=1, dp=8, ep=8, micro_batch=1, global_batch=64, zero_stage=1)
    layers = JobSpec(global_batch=64, cuda_graph_modules=("attn", "moe_router", "moe_preprocess"))
    full = JobSpec(global_batch=64, full_iteration_cuda_graph=True)
    eager = estimate(model, system, plan, JobSpec(global_batch=64)).step_time_s
    assert estimate(model, system, plan, full).step_time_s < estimate(model, system, plan, layers).step_time_s < eager


def test_cli_layers_launches_transformer_engine_graphs(tmp_path):
    runner = CliRunner()
    for name, modules in (("llama3-8b", "attn mlp"), ("qwen3-30b-a3b", "attn moe_router moe_preprocess")):
        out = tmp_path / f"{name}.yaml"
        res = runner.invoke(app, ["plan", "-m", name, "-s", "h100-sxm", "-g", "8", "-b", "64", "--cuda-graph", "layers",
                                  "--top", "1", "--save", str(out)])
        assert res.exit_code == 0, res.output
        launch = runner.invoke(app, ["megatron", "--plan", str(out), "--format", "args"])
        assert launch.exit_code == 0, launch.output
        assert "--cuda-graph-impl transformer_engine" in launch.output
        assert f"--cuda-graph-modules {modules}" in launch.output


def test_pins_that_break_a_graph_rule_are_one_line_input_errors():
    runner = CliRunner()
    res = runner.invoke(app, ["plan", "-m", "llama3-8b", "-s", "h100-sxm", "-g", "8", "-b", "64",
                              "--cuda-graph", "layers", "--recompute", "full"])
    assert res.exit_code == 2 and res.output.count("\n") == 1
    assert "full recompute runs only with a full-iteration CUDA graph" in res.output


def test_estimate_says_when_megatron_would_not_run_the_plan():
    res = CliRunner().invoke(app, ["estimate", "-m", "llama3-8b", "-s", "h100-sxm", "-g", "8", "-b", "64",
                                   "--tp", "1", "--pp", "1", "--cuda-graph", "layers", "--recompute", "full"])
    assert res.exit_code == 0  # it fits; the cost stands, with the note
    assert "Not expressible in Megatron-LM" in " ".join(res.output.split())


def test_all_to_all_overlap_is_not_searched_beside_an_attention_graph():
    """The overlap delays the weight gradients (--delay-wgrad-compute) into the graphed attention,
    which megatron-core 0.19.2 runs only with Transformer Engine >= 2.12 (training/arguments.py;
    the launches target TE 2.10, as ../shared/tools/megatron_check): refused in the plan rules, so
    the search does not pick it, and Megatron's own message in the launch rules."""
    from planner import megatron as mg
    from planner.megatron.expressible import graph_option_refusals
    qwen3 = load_model("qwen3-30b-a3b")
    graphs = JobSpec(global_batch=64, cuda_graph_modules=("attn", "moe_router", "moe_preprocess"))
    assert graph_option_refusals("none", (), 0.0, True, qwen3, graphs)
    assert not graph_option_refusals("none", (), 0.0, False, qwen3, graphs)
    routers_only = graphs.model_copy(update={"cuda_graph_modules": ("moe_router", "moe_preprocess")})
    assert not graph_option_refusals("none", (), 0.0, True, qwen3, routers_only)  # no shared expert
    plan = Plan(dp=8, ep=8, micro_batch=1, global_batch=64, moe_a2a_overlap=True)
    system = load_system("h100-sxm", 8)
    launch = mg.megatron_args(plan, qwen3, graphs, system)
    assert mg.rules.MSG_GRAPH_DELAY_WGRAD_TE in mg.validate_launch(launch, 9)
    best = search_plan(qwen3, system, graphs, top_k=3)
    assert best.ranked and not any(r.plan.moe_a2a_overlap for r in best.ranked)


def test_plan_says_which_kernel_settings_it_was_costed_with():
    """A launch without the graphs the time assumed runs slower than printed: the header and the
    JSON name the settings (nothing where they are the defaults)."""
    import json
    runner = CliRunner()
    job = ["-m", "llama3-8b", "-s", "h200", "-g", "8", "-b", "64", "--tp", "1", "--pp", "1"]
    graphed = runner.invoke(app, ["estimate", *job, "--cuda-graph", "layers", "--fp8-attention", "--dtype", "fp8"])
    assert graphed.exit_code == 0, graphed.output
    header = " ".join(graphed.output.split("\n")[:2]).replace("  ", " ")
    assert "CUDA graphs of attn, mlp per layer, FP8 attention" in " ".join(header.split()), header
    plain = runner.invoke(app, ["estimate", *job])
    assert "CUDA graph" not in plain.output and "FP8 attention" not in plain.output
    settings = json.loads(runner.invoke(app, ["plan", *job, "--cuda-graph", "full-iteration", "--json"]).stdout)
    assert settings["kernel_settings"] == {"kernels": "te", "full_iteration_cuda_graph": True, "cuda_graph_modules": [],
                                           "fp8_attention": False, "fused_grouped_mlp": False}
