"""The nineteenth audit of `planner megatron` (Blackwell presets, FP8/FP4 recipes, sharded data
parallel, uneven pipelines, large MoE and hybrid stacks) against megatron-core 0.19.2: launches
that Megatron refuses when it builds the model, beyond what its argument parser checks."""
from hardware import load_system
from planner import megatron as mg
from planner.model import load_model
from planner.plan import JobSpec, Plan


def _dispatcher(argv: list[str]) -> tuple[str, str | None]:
    at = argv.index("--moe-token-dispatcher-type")
    backend = argv[argv.index("--moe-flex-dispatcher-backend") + 1] if "--moe-flex-dispatcher-backend" in argv else None
    return argv[at + 1], backend


def test_deepep_without_an_expert_parallel_group_is_launched_as_alltoall():
    """moe/token_dispatcher.py MoEFlexTokenDispatcher asserts "DeepEP dispatcher requires TPxEP >
    1" (expert TP x EP) when it builds each MoE layer: a deepep plan at etp 1, ep 1 parsed and then
    died at start-up. No token leaves its rank there, so the cost has no all-to-all either way and
    the launch names the alltoall dispatcher, with a note; with a group (ep > 1, or etp > 1) the
    flex dispatcher stays."""
    model, system = load_model("qwen3-30b-a3b"), load_system("b300", 8)
    job = JobSpec(global_batch=64, dtype="mxfp8")
    alone = Plan(dp=8, micro_batch=1, global_batch=64, moe_dispatcher="deepep")
    assert mg.launch_refusals(alone, model, job, system) == []
    launch = mg.megatron_args(alone, model, job, system)
    assert _dispatcher(launch.argv()) == ("alltoall", None)
    assert any("launched as alltoall" in n for n in launch.notes), launch.notes
    assert mg.validate_launch(launch, mg.gpu_arch_major(system)) == []
    for grouped in (alone.model_copy(update={"ep": 8}),
                    Plan(tp=2, dp=4, etp=2, micro_batch=1, global_batch=64, sequence_parallel=True,
                         moe_dispatcher="deepep")):
        other = mg.megatron_args(grouped, model, job, system)
        assert _dispatcher(other.argv()) == ("flex", "deepep"), grouped.short()
        assert not any("launched as alltoall" in n for n in other.notes)
