"""What a launch runs, beyond what Megatron's parser accepts (an audit of `planner megatron`
against megatron-core 0.19.2's source, 2026-11-28): flags Megatron parses but a model path
ignores, combinations its validator refuses, and settings its own messages ask for."""
from hardware import load_system
from planner import megatron as mg
from planner.model import load_model
from planner.plan import JobSpec, Plan


def test_activation_offload_of_a_hybrid_stack_is_refused():
    """core/models/hybrid (0.19.2) never opens the CPU-offload context that
    transformer_block.py opens for GPT layers: --cpu-offloading-num-layers parses and offloads
    nothing, so a plan whose memory counts on it would run out of HBM. The same plan on a GPT
    model stays expressible."""
    plan = Plan(tp=1, dp=8, micro_batch=1, global_batch=64, recompute="none", offload_activations=0.5)
    job = JobSpec(global_batch=64)
    hybrid = mg.not_expressible(plan, load_model("nemotron-h-8b"), job)
    assert any("hybrid (Mamba) layer stack has no layer-wise CPU offloading" in r for r in hybrid), hybrid
    assert not [r for r in mg.not_expressible(plan, load_model("llama3-8b"), job) if "offload" in r]


def test_fp8_parameters_with_optimizer_offload_need_delayed_scaling():
    """arguments.py: with --fp8-param-gather the optimizer CPU offload asserts --fp8-recipe
    delayed. The plan rule refuses current scaling and MXFP8, keeps delayed (dtype fp8); the
    rules mirror refuses the argument list with Megatron's own message."""
    plan = Plan(tp=1, dp=16, micro_batch=1, global_batch=128, zero_stage=1, offload_optimizer=0.5,
                fp8_param_gather=True)
    model = load_model("llama3-8b")
    for dtype, refused in (("fp8-cs", True), ("mxfp8", True), ("fp8", False)):
        reasons = mg.not_expressible(plan, model, JobSpec(global_batch=128, dtype=dtype))
        assert any("delayed scaling" in r for r in reasons) == refused, (dtype, reasons)
    system = load_system("gh200", 16)
    launch = mg.megatron_args(plan, model, JobSpec(global_batch=128, dtype="fp8-cs"), system)
    errors = mg.validate_launch(launch, mg.gpu_arch_major(system))
    assert any("--fp8-recipe delayed" in e for e in errors), errors


def test_moe_launch_trains_the_router_with_a_balancing_loss():
    """Megatron's default --moe-aux-loss-coeff is 0: no load balancing at all, while the plan is
    costed at a stated routing balance. The launch sets the aux loss at the model's own weight
    (Qwen3-MoE's config.json router_aux_loss_coef 1e-3, as Megatron-Bridge trains it), else at the
    1e-2 Megatron's help recommends, says what balance the cost assumed, and still parses."""
    model, system = load_model("qwen3-30b-a3b"), load_system("h100-sxm", 16)
    plan = Plan(tp=1, dp=16, ep=8, micro_batch=1, global_batch=128)
    launch = mg.megatron_args(plan, model, JobSpec(global_batch=128, moe_load_imbalance=1.6), system)
    argv = launch.argv()
    i = argv.index("--moe-aux-loss-coeff")
    assert float(argv[i + 1]) == 1e-3
    unnamed = model.model_copy(update={"moe": model.moe.model_copy(update={"router_aux_loss_coeff": None})})
    other = mg.megatron_args(plan, unnamed, JobSpec(global_batch=128), system).argv()
    assert float(other[other.index("--moe-aux-loss-coeff") + 1]) == 1e-2
    assert argv[argv.index("--moe-router-load-balancing-type") + 1] == "aux_loss"
    assert any("1.6x the mean token load" in n for n in launch.notes), launch.notes
    assert mg.validate_launch(launch, 9) == []
    dense = mg.megatron_args(Plan(tp=1, dp=16, micro_batch=1, global_batch=128), load_model("llama3-8b"),
                             JobSpec(global_batch=128), system)
    assert "--moe-aux-loss-coeff" not in dense.argv()


def test_all_to_all_overlap_gets_more_than_one_cuda_connection():
    """arguments.py: --overlap-moe-expert-parallel-comm wants a larger CUDA_DEVICE_MAX_CONNECTIONS
    (its communication kernels beside the compute stream's; the MoE ModelZoo sets 32), TP
    communication overlap before Blackwell wants 1, Megatron-FSDP wants it unset."""
    model = load_model("qwen3-30b-a3b")
    job = JobSpec(global_batch=512)
    base = dict(dp=16, ep=8, pp=2, vpp=2, micro_batch=1, global_batch=512, moe_a2a_overlap=True)
    h100, gb200 = load_system("h100-sxm", 32), load_system("gb200-nvl72", 32)
    assert mg.megatron_args(Plan(tp=1, **base), model, job, h100).env["CUDA_DEVICE_MAX_CONNECTIONS"] == "32"
    tp_overlap = Plan(tp=2, sequence_parallel=True, tp_comm_overlap=True, **base)
    assert mg.megatron_args(tp_overlap, model, job, h100).env["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"
    assert mg.megatron_args(tp_overlap, model, job, gb200).env["CUDA_DEVICE_MAX_CONNECTIONS"] == "32"
    plain = Plan(tp=1, dp=16, ep=8, pp=2, micro_batch=1, global_batch=512)
    assert mg.megatron_args(plain, model, job, h100).env["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"


def test_torch_fsdp2_fp8_parameter_gather_is_refused_for_the_right_reason():
    """arguments.py accepts --fp8-param-gather beside --use-torch-fsdp2 and then turns it off
    (Transformer Engine >= 2.0: 'will fallback to bf16'): the plan rule refuses it with that
    reason, and the rules mirror no longer answers with a message that lists FSDP2 as allowed."""
    plan = Plan(tp=1, dp=16, micro_batch=1, global_batch=64, zero_stage=3, dp_impl="torch-fsdp2",
                fp8_param_gather=True)
    model = load_model("qwen3-8b")
    reasons = mg.not_expressible(plan, model, JobSpec(global_batch=64, dtype="fp8-cs"))
    assert any("turns it off under torch FSDP2" in r for r in reasons), reasons
    launch = mg.megatron_args(plan, model, JobSpec(global_batch=64, dtype="fp8-cs"), load_system("h100-sxm", 16))
    assert not [e for e in mg.validate_launch(launch, 9) if "fp8-param-gather" in e]


def test_flex_dispatcher_runs_hybridep_on_nvl72_and_deepep_on_8_gpu_nodes():
    """DeepEP's training kernels need 8-GPU NVLink nodes (deepseek-ai/DeepEP issues 392, 579);
    NVIDIA's GB200 recipes run the flex dispatcher's HybridEP backend. Same plan, both systems."""
    model = load_model("qwen3-30b-a3b")
    plan = Plan(tp=1, dp=64, ep=32, micro_batch=1, global_batch=512, moe_dispatcher="deepep")
    job = JobSpec(global_batch=512)
    for system_name, backend in (("gb200-nvl72", "hybridep"), ("h100-sxm", "deepep"), ("b200", "deepep")):
        argv = mg.megatron_args(plan, model, job, load_system(system_name, 64)).argv()
        assert argv[argv.index("--moe-flex-dispatcher-backend") + 1] == backend, system_name


def test_mxfp8_parameters_reuse_the_gradient_buffer_for_their_gather():
    """optimizer_config.py warns that MXFP8 without --reuse-grad-buf-for-mxfp8-param-ag keeps a
    second parameter buffer ("significant amount additional GPU memory"), which the memory model
    does not cost; Megatron-Bridge's MXFP8 recipe sets it beside --fp8-param-gather. Emitted for
    MXFP8 parameters on the distributed optimizer only: other FP8 recipes keep their parameters in
    the buffer, and Megatron-FSDP turns it off."""
    model, system = load_model("llama3-8b"), load_system("b200", 16)
    flag = "--reuse-grad-buf-for-mxfp8-param-ag"
    for zero, dtype, emitted in ((1, "mxfp8", True), (1, "fp8-cs", False), (3, "mxfp8", False)):
        plan = Plan(tp=1, dp=16, micro_batch=1, global_batch=128, zero_stage=zero, fp8_param_gather=True)
        job = JobSpec(global_batch=128, dtype=dtype)
        assert mg.not_expressible(plan, model, job) == [], (zero, dtype)
        launch = mg.megatron_args(plan, model, job, system)
        assert (flag in launch.argv()) == emitted, (zero, dtype)
        assert mg.validate_launch(launch, mg.gpu_arch_major(system)) == [], (zero, dtype)
    bf16_params = mg.megatron_args(Plan(tp=1, dp=16, micro_batch=1, global_batch=128, zero_stage=1), model,
                                   JobSpec(global_batch=128, dtype="mxfp8"), system)
    assert flag not in bf16_params.argv()


def test_torch_fsdp2_plan_must_cost_the_bf16_gradients_megatron_reduces():
    """Megatron 0.19.2's --use-torch-fsdp2 calls fully_shard over the bf16 parameters with no
    mixed-precision policy (core/distributed/torch_fully_sharded_data_parallel.py; its DDP config
    is built without grad_reduce_in_fp32), so gradients are kept and reduce-scattered in bf16
    whatever --grad-reduce-in-bf16 says. A plan costing fp32 gradients was launched as is
    (`planner megatron --dp-impl torch-fsdp2`): refused now, and launched with the bf16 reduce."""
    from typer.testing import CliRunner

    from planner.cli import app
    model, system, job = load_model("llama3-8b"), load_system("h100-sxm", 8), JobSpec(global_batch=64)
    fp32 = Plan(dp=8, micro_batch=1, global_batch=64, zero_stage=3, dp_impl="torch-fsdp2")
    assert any("--use-torch-fsdp2 keeps and reduce-scatters gradients" in r
               for r in mg.launch_refusals(fp32, model, job, system))
    assert mg.launch_refusals(fp32.model_copy(update={"grad_reduce_in_bf16": True}), model, job, system) == []
    flags = ["megatron", "-m", "llama3-8b", "-s", "h100-sxm", "-g", "8", "-b", "64", "--dp", "8",
             "--dp-impl", "torch-fsdp2", "--format", "args"]
    refused = CliRunner().invoke(app, flags)
    assert refused.exit_code == 2 and "grad_reduce_in_bf16" in refused.output
    launched = CliRunner().invoke(app, flags + ["--grad-reduce-in-bf16"])
    assert launched.exit_code == 0 and "--grad-reduce-in-bf16" in launched.stdout, launched.output
