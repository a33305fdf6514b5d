"""The nineteenth audit of `planner megatron` (Blackwell presets, FP8/FP4 recipes, sharded data
parallel, uneven pipelines, large MoE and hybrid stacks) against megatron-core 0.19.2: launches
that Megatron's argument parser accepts but that it refuses when it builds or wraps the model,
or that shard the weights otherwise than the plan was costed."""
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


def test_all_to_all_overlap_under_megatron_fsdp_runs_without_per_layer_graphs():
    """core/distributed/fsdp/mcore_fsdp_adapter.py asserts "1F1B overlap with FSDP does not support
    per-layer CUDA graphs" when it wraps the model. Router-only graphs (no attention graph, so no
    delayed weight gradients inside one) with the all-to-all overlap were emitted under ZeRO-2/3,
    as a plan file can ask; the plan rules refuse them there (so the search, which ranks by the
    same rules, drops them too) and keep them at ZeRO-1."""
    model = load_model("qwen3-30b-a3b")
    routers = JobSpec(global_batch=256, dtype="mxfp8", cuda_graph_modules=("moe_router", "moe_preprocess"))
    for zero, refused in ((3, True), (2, True), (1, False)):
        plan = Plan(dp=32, ep=16, micro_batch=1, global_batch=256, zero_stage=zero, moe_a2a_overlap=True,
                    moe_dispatcher="deepep")
        reasons = mg.not_expressible(plan, model, routers)
        assert any("Megatron-FSDP" in r and "per-layer CUDA graphs" in r for r in reasons) == refused, (zero, reasons)
        if not refused:
            assert reasons == []
    # without per-layer graphs Megatron-FSDP runs the overlap
    plan = Plan(dp=32, ep=16, micro_batch=1, global_batch=256, zero_stage=3, moe_a2a_overlap=True)
    assert mg.not_expressible(plan, model, JobSpec(global_batch=256, dtype="mxfp8")) == []


def test_torch_fsdp2_of_a_hybrid_stack_with_mamba_layers_is_refused():
    """core/distributed/torch_fully_sharded_data_parallel.py (0.19.2) calls fully_shard on each
    TransformerLayer, the embedding and the output layer; a MambaLayer is none of them, so every
    Mamba layer's weights stay in the root FSDP2 unit and are gathered all at once, where the
    memory model costs two layers gathered (ZeRO-3). The launch parsed; the plan rules now refuse
    it for a stack with Mamba layers and keep it for a GPT stack of the same shape of plan."""
    plan = Plan(dp=8, micro_batch=1, global_batch=64, zero_stage=3, dp_impl="torch-fsdp2", grad_reduce_in_bf16=True)
    job = JobSpec(global_batch=64, dtype="mxfp8")
    for name, refused in (("nemotron-h-8b", True), ("nemotron-3-nano", True), ("llama3-8b", False)):
        reasons = mg.not_expressible(plan, load_model(name), job)
        assert any("MambaLayers" in r for r in reasons) == refused, (name, reasons)
    assert mg.not_expressible(plan.model_copy(update={"dp_impl": "megatron"}), load_model("nemotron-h-8b"), job) == []


def test_bf16_adam_moments_with_optimizer_cpu_offload_are_refused():
    """core/optimizer/__init__.py (0.19.2) builds the HybridDeviceOptimizer of
    --optimizer-cpu-offload without exp_avg_dtype / exp_avg_sq_dtype (they reach TE's FusedAdam only
    on the GPU-only path): --exp-avg-dtype bf16 parsed and both halves kept fp32 moments, 8 B per
    parameter where the plan costs 4. The plan rules and the search's pin rules refuse the pair;
    either alone stays."""
    from constraints.space import megatron_pin_conflicts
    model = load_model("llama3-8b")
    plan = Plan(dp=16, micro_batch=1, global_batch=128, zero_stage=1, offload_optimizer=0.5)
    bf16 = JobSpec(global_batch=128, adam_moments="bf16")
    assert any("keeps Adam's moments in fp32" in r for r in mg.not_expressible(plan, model, bf16))
    assert mg.not_expressible(plan, model, JobSpec(global_batch=128)) == []
    assert mg.not_expressible(plan.model_copy(update={"offload_optimizer": 0.0}), model, bf16) == []
    pinned = bf16.model_copy(update={"pins": {"offload_optimizer": 0.5}})
    assert any("optimizer CPU offload" in c for c in megatron_pin_conflicts(pinned)), megatron_pin_conflicts(pinned)


def test_activation_offload_under_the_all_to_all_overlap_is_refused():
    """pipeline_parallel/combined_1f1b.py runs every microbatch's layers through the schedule
    plan's per-layer callables (models/gpt/fine_grained_callables.py), never through
    TransformerBlock.forward, the one place that enters the CPU-offload context: with
    --overlap-moe-expert-parallel-comm, --cpu-offloading-num-layers parsed and offloaded nothing,
    while the plan's memory counted the offloaded layers out of HBM. The plan rules, the pin rules
    and the search's option rows refuse the pair; either alone stays."""
    from constraints.space import build_space, megatron_pin_conflicts, options
    model = load_model("qwen3-30b-a3b")
    job = JobSpec(global_batch=256, dtype="mxfp8")
    plan = Plan(dp=32, ep=32, micro_batch=1, global_batch=256, offload_activations=0.5, moe_a2a_overlap=True,
                moe_dispatcher="deepep")
    assert any("combined 1F1B" in r for r in mg.not_expressible(plan, model, job))
    for alone in ({"moe_a2a_overlap": False}, {"offload_activations": 0.0}):
        assert mg.not_expressible(plan.model_copy(update=alone), model, job) == [], alone
    pinned = job.model_copy(update={"pins": {"offload_activations": 0.5, "moe_a2a_overlap": True}})
    assert any("combined 1F1B" in c for c in megatron_pin_conflicts(pinned))
    rows = options(build_space(model, load_system("gb300-nvl72", 32), job))
    both = (rows["offload_activations"] > 0) & (rows["moe_a2a_overlap"] > 0)
    assert (rows["offload_activations"] > 0).any() and (rows["moe_a2a_overlap"] > 0).any() and not both.any()


def test_torch_fsdp2_launch_builds_the_weights_on_the_host():
    """Under --use-torch-fsdp2, Transformer Engine allocates each layer's weights on the GPU at
    construction unless --use-cpu-initialization is given (extensions/transformer_engine.py
    _get_extra_te_kwargs), and training.py get_model skips .cuda() for FSDP2 only with CPU
    initialization: the whole unsharded model (Llama-3 70B at tp 1: 141 GB in bf16) sat on each
    80 GB H100 before fully_shard cut it. FSDP2's wrapper has no meta-device path, so the launch
    builds on the host and FSDP2 moves each layer's shards; Megatron-FSDP keeps its meta device."""
    model, system = load_model("llama3-70b"), load_system("h100-sxm", 64)
    job = JobSpec(global_batch=128)
    fsdp2 = Plan(dp=64, micro_batch=1, global_batch=128, zero_stage=3, dp_impl="torch-fsdp2",
                 grad_reduce_in_bf16=True, recompute="full")
    assert mg.launch_refusals(fsdp2, model, job, system) == []
    argv = mg.megatron_args(fsdp2, model, job, system).argv()
    assert "--use-cpu-initialization" in argv and "--init-model-with-meta-device" not in argv
    assert mg.validate_launch(mg.megatron_args(fsdp2, model, job, system), 9) == []
    megatron_fsdp = mg.megatron_args(fsdp2.model_copy(update={"dp_impl": "megatron"}), model, job, system).argv()
    assert "--use-cpu-initialization" not in megatron_fsdp and "--init-model-with-meta-device" in megatron_fsdp
