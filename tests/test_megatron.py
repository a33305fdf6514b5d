"""Plan -> Megatron-LM arguments, and the validator that re-implements Megatron's checks
(shared/reference/megatron_args.md: the probe cases of sections 0, 2a, 2b, 2c)."""
from __future__ import annotations

import json
import random
import shutil
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hardware import load_system
from planner import megatron as mg
from planner.megatron import rules
from planner.cli import app
from planner.model import load_model
from planner.plan import JobSpec, Plan, load_plan

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "megatron_gpt3_175b.yaml"


# ----------------------------------------------------------------------------------------------
# Validator probes
# ----------------------------------------------------------------------------------------------

def base(**changes) -> dict:
    """A small valid GPT (8 GPUs: tp2 pp2 dp2); keyword changes edit flags (None drops one)."""
    args = {"--num-layers": 8, "--hidden-size": 1024, "--num-attention-heads": 16,
            "--seq-length": 2048, "--max-position-embeddings": 2048,
            "--tensor-model-parallel-size": 2, "--pipeline-model-parallel-size": 2,
            "--micro-batch-size": 1, "--global-batch-size": 16, "--bf16": True}
    for key, value in changes.items():
        flag = "--" + key.replace("_", "-")
        if value is None:
            args.pop(flag, None)
        else:
            args[flag] = value
    return args


ENV = {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}


def check(args, world=8, env=ENV, arch=9) -> list[str]:
    return mg.validate_megatron_args(args, world, env, arch)


def test_valid_base_and_list_form():
    assert check(base()) == []
    argv = ["--num-layers", "8", "--hidden-size", "1024", "--num-attention-heads", "16",
            "--seq-length", "2048", "--max-position-embeddings", "2048", "--micro-batch-size", "2",
            "--global-batch-size", "16", "--bf16"]
    assert mg.validate_megatron_args(argv, 8, {}) == []


@pytest.mark.parametrize("extra, shown", [
    (["--virtual-pipeline-model-parallel-size", "3"], "--virtual-pipeline-model-parallel-size 3"),
    (["--fp8"], "--fp8"),                        # --fp8-format exists, abbreviations are off
    (["--cpu-offloading"], "--cpu-offloading"),  # --cpu-offloading-num-layers exists
    (["--overlap-p2p-communication"], "--overlap-p2p-communication"),
])
def test_flags_that_do_not_exist_are_unrecognized(extra, shown):
    argv = rules._to_argv(base()) + extra
    assert check(argv) == [f"unrecognized arguments: {shown}"]


def test_bad_choice_is_an_argparse_error():
    errors = check(base(recompute_granularity="everything"))
    assert len(errors) == 1 and "invalid choice" in errors[0]


def test_both_vpp_flags():
    args = base(num_layers_per_virtual_pipeline_stage=2, num_virtual_stages_per_pipeline_rank=2)
    assert rules.MSG_VPP_ONE_OF in check(args)
    assert rules.MSG_VPP_ONE_OF.endswith("rank,--pipeline-model-parallel-layout. ")


def test_vpp_needs_pp_greater_than_one():
    args = base(pipeline_model_parallel_size=1, tensor_model_parallel_size=2,
                num_virtual_stages_per_pipeline_rank=2, global_batch_size=8)
    assert rules.MSG_INTERLEAVED_PP in check(args)
    args = base(num_virtual_stages_per_pipeline_rank=2, no_overlap_p2p_communication=True)
    assert rules.MSG_INTERLEAVED_PP_NO_OVERLAP in check(args)


def test_vpp_one_is_not_interleaving():
    args = base(pipeline_model_parallel_size=1, num_virtual_stages_per_pipeline_rank=1,
                global_batch_size=8)
    assert check(args, world=8) == []


def test_vpp_microbatches_multiple_of_pp():
    # 16 GPUs: tp2 pp4 dp2, mbs 1 -> gbs 12 gives 6 microbatches, not a multiple of pp=4.
    args = base(pipeline_model_parallel_size=4, num_virtual_stages_per_pipeline_rank=2,
                global_batch_size=12)
    errors = check(args, world=16)
    assert errors == ["The remainder of M (the total micro-batches) divided by N (number of "
                      "contiguous micro-batches in a virtual pipeline stage) should be 0, or larger "
                      "than or equal to the pipeline-parallel size, but it is 2. Otherwise, it "
                      "introduces dependency bubbles in the pipeline and reduces throughput."]
    # 2 microbatches < pp=4
    errors = check(base(pipeline_model_parallel_size=4, num_virtual_stages_per_pipeline_rank=2,
                        global_batch_size=4), world=16)
    assert errors == ["The number of contiguous micro-batches in a virtual pipeline stage"
                      "should range in [PP=4 , M=2]"]
    assert check(base(pipeline_model_parallel_size=4, num_virtual_stages_per_pipeline_rank=2,
                      global_batch_size=16), world=16) == []


def test_vpp_layer_divisibility():
    args = base(num_layers=12, pipeline_model_parallel_size=4, num_layers_per_virtual_pipeline_stage=2)
    assert check(args, world=16) == [rules.MSG_VPP_LAYERS_STAGE]
    args = base(num_layers=10, pipeline_model_parallel_size=4, num_layers_per_virtual_pipeline_stage=2)
    assert check(args, world=16) == [rules.MSG_VPP_LAYERS_PP]
    args = base(num_layers=12, pipeline_model_parallel_size=2, num_virtual_stages_per_pipeline_rank=4)
    assert len(check(args)) == 1 and "must be divisible" in check(args)[0]
    args = base(num_layers=10, pipeline_model_parallel_size=4)
    assert check(args, world=16) == [rules.MSG_LAYERS_PP]
    args = base(num_layers_per_virtual_pipeline_stage=2, decoder_first_pipeline_num_layers=3)
    assert rules.MSG_VPP_UNEVEN in check(args)


def test_world_size_and_global_batch():
    assert ("world size (10) is not divisible by total_model_size (total_model_size=4)"
            in check(base(), world=10))
    assert check(base(global_batch_size=15)) == [
        "global batch size (15) is not divisible by micro batch size (1) times data parallel size (2)"]


def test_overlap_param_gather_rules():
    assert check(base(overlap_param_gather=True, overlap_grad_reduce=True)) == [
        rules.MSG_PARAM_GATHER_DISTOPT]
    assert check(base(overlap_param_gather=True, use_distributed_optimizer=True)) == [
        rules.MSG_PARAM_GATHER_GRAD_REDUCE]
    assert check(base(overlap_param_gather=True, overlap_grad_reduce=True,
                      use_distributed_optimizer=True)) == []


def test_tp_comm_overlap_needs_sp_and_sp_at_tp1_is_dropped():
    assert check(base(tp_comm_overlap=True)) == [rules.MSG_TP_COMM_OVERLAP]
    assert check(base(tp_comm_overlap=True, sequence_parallel=True)) == []
    tp1 = base(tensor_model_parallel_size=1, global_batch_size=8)
    assert check({**tp1, "--sequence-parallel": True}, env={}) == []  # silently dropped
    assert check({**tp1, "--sequence-parallel": True, "--tp-comm-overlap": True}, env={}) == [
        rules.MSG_TP_COMM_OVERLAP]


def test_cuda_device_max_connections():
    assert check(base(), env={}) == [rules.MSG_CUDA_MAX_CONN]
    assert check(base(), env={"CUDA_DEVICE_MAX_CONNECTIONS": "8"}) == [rules.MSG_CUDA_MAX_CONN]
    assert check(base(), env={}, arch=10) == []      # Blackwell: no longer required
    cp = base(tensor_model_parallel_size=1, context_parallel_size=2)
    assert check(cp, env={}) == [rules.MSG_CUDA_MAX_CONN]
    fsdp = base(use_megatron_fsdp=True, data_parallel_sharding_strategy="optim_grads_params")
    assert check(fsdp, env={}) == []
    assert check(fsdp, env=ENV) == [rules.MSG_FSDP_MAX_CONN]


def test_heads_and_query_groups_vs_tp():
    args = base(num_attention_heads=12, hidden_size=768, tensor_model_parallel_size=8,
                pipeline_model_parallel_size=1)
    assert check(args) == [
        "num_attention_heads (12) must be a multiple of tensor_model_parallel_size (8)."]
    gqa = base(num_attention_heads=24, hidden_size=1536, tensor_model_parallel_size=4,
               pipeline_model_parallel_size=1, group_query_attention=True, num_query_groups=6,
               global_batch_size=8)
    assert check(gqa) == [
        "num_query_groups (6) must be a multiple or divisor of tensor_model_parallel_size (4)."]
    assert check({**gqa, "--num-query-groups": 2}) == []   # divisor of tp
    assert check({**gqa, "--num-query-groups": 8}) == []   # multiple of tp
    gqa.pop("--group-query-attention")                     # groups ignored without the switch
    assert check(gqa) == []


def test_cpu_offloading_rules():
    one = base(tensor_model_parallel_size=1, pipeline_model_parallel_size=1, global_batch_size=8)
    assert check({**one, "--cpu-offloading-num-layers": 4}, env={}) == []
    assert check({**one, "--cpu-offloading-num-layers": 8}, env={}) == [
        "CPU offloading can be done only for layers less than 8"]
    assert check(base(cpu_offloading_num_layers=2)) == [rules.MSG_CPU_OFFLOAD_PP]
    rc = {**one, "--cpu-offloading-num-layers": 2, "--recompute-granularity": "selective"}
    assert check(rc, env={}) == [rules.MSG_CPU_OFFLOAD_RECOMPUTE]


def test_moe_rules():
    assert check(base(expert_model_parallel_size=2)) == [rules.MSG_EP_NEEDS_EXPERTS]
    nobias = {"disable_bias_linear": True}  # experts with biases need etp 1 (own test below)
    assert check(base(num_experts=6, expert_model_parallel_size=4, **nobias), world=16) == [
        rules.MSG_EXPERTS_EP]
    assert check(base(num_experts=8, expert_model_parallel_size=2, **nobias)) == []
    # expert grid: etp(2) * ep(4) * pp(2) = 16 does not divide 8
    assert check(base(num_experts=8, expert_model_parallel_size=4, **nobias)) == [
        "world_size (8) is not divisible by expert_tensor_model_pipeline_parallel size (16)"]


def test_optimizer_offload_needs_precision_aware_optimizer():
    args = base(use_distributed_optimizer=True, optimizer_cpu_offload=True)
    assert check(args) == [rules.MSG_OPT_OFFLOAD]
    assert check({**args, "--use-precision-aware-optimizer": True}) == []


def test_shape_precision_and_positions():
    assert check(base(tensor_model_parallel_size=1, context_parallel_size=2, seq_length=2050,
                      max_position_embeddings=4096)) == [rules.MSG_CP_SEQ]
    assert check(base(fp16=True)) == [rules.MSG_FP16_BF16]
    assert check(base(hidden_size=1000)) == [
        "hidden_size (1000) must be divisible by num_attention_heads (16) (bare assert in Megatron)"]
    assert check(base(max_position_embeddings=1024)) == [
        "max_position_embeddings (1024) must be greater than or equal to seq_length (2048)."]
    assert check(base(num_layers=None)) == ["num_layers argument is None"]


def test_recompute_rules():
    assert check(base(recompute_granularity="selective", recompute_method="block")) == [
        rules.MSG_RECOMPUTE_SELECTIVE_METHOD]
    assert check(base(recompute_granularity="selective", recompute_num_layers=1)) == [
        "When using recompute_granularity: selective recompute_num_layers must be None."]
    assert check(base(recompute_granularity="full", recompute_num_layers=1)) == [
        'Using recompute_granularity: full so recompute_method must be "block" or "uniform"']
    assert check(base(recompute_granularity="full", recompute_method="block")) == [
        "When using recompute_granularity: full recompute_num_layers must be between "
        "1 and num_layers_per_pipeline_rank: 4"]
    assert check(base(recompute_granularity="full", recompute_method="uniform",
                      recompute_num_layers=1)) == []


def test_fp8_flags():
    assert check(base(fp8_format="hybrid", fp8_recipe="delayed")) == []
    assert check(base(fp8_format="hybrid", fp8_param_gather=True)) == [rules.MSG_FP8_PARAM_GATHER]
    assert check(base(fp8_format="hybrid", fp8_param_gather=True, use_distributed_optimizer=True)) == []
    assert check(base(fp8_format="e4m3", fp4_format="e2m1")) == [rules.MSG_FP4_FP8]
    # the DDP config asserts the grad-buffer reuse only beside MXFP8 parameters; Megatron-FSDP drops it
    mx = dict(fp8_format="e4m3", fp8_recipe="mxfp8", use_distributed_optimizer=True,
              reuse_grad_buf_for_mxfp8_param_ag=True)
    assert check(base(**mx), arch=10) == [rules.MSG_REUSE_GRAD_BUF]
    assert check(base(**mx, fp8_param_gather=True), arch=10) == []
    assert "invalid choice" in check(base(fp8_format="e5m2"))[0]


# ----------------------------------------------------------------------------------------------
# Emission round trips
# ----------------------------------------------------------------------------------------------

def emit(model: str, system: str, gpus: int, dtype: str = "bf16", **plan):
    m, s = load_model(model), load_system(system, gpus)
    p, job = Plan(**plan), JobSpec(dtype=dtype)
    assert mg.not_expressible(p, m, job) == []
    assert mg.launch_problems(p, s) == []
    launch = mg.megatron_args(p, m, job, s)
    assert mg.validate_launch(launch, mg.gpu_arch_major(s)) == []
    return launch, m, s, p


def roundtrip(launch: mg.MegatronLaunch, model, system, plan: Plan) -> dict:
    script = mg.render(launch, "script")
    env, argv, torchrun = mg.parse_script(script)
    assert env == launch.env
    assert mg.validate_megatron_args(argv, plan.gpus, env, mg.gpu_arch_major(system)) == []
    a = vars(mg.parse_megatron_args(argv))
    world = int(torchrun["--nnodes"]) * int(torchrun["--nproc-per-node"])
    assert world == plan.gpus
    tp, pp, cp = (a["tensor_model_parallel_size"], a["pipeline_model_parallel_size"],
                  a["context_parallel_size"])
    dp = world // (tp * pp * cp)
    assert tp * pp * cp * dp == plan.gpus and dp == plan.dp
    assert a["global_batch_size"] % (a["micro_batch_size"] * dp) == 0
    assert not set(mg.NONEXISTENT_FLAGS) & set(argv)
    assert torchrun["--master-port"] == "6000" and torchrun["--node-rank"] == "$NODE_RANK"
    return a


def test_gpt3_175b_on_1024_a100():
    launch, m, s, p = emit("gpt3-175b", "a100-80g", 1024, tp=8, pp=8, dp=16, vpp=2, micro_batch=1,
                           global_batch=1536, recompute="full", sequence_parallel=True)
    a = roundtrip(launch, m, s, p)
    assert (launch.nnodes, launch.gpus_per_node) == (128, 8)
    assert a["num_virtual_stages_per_pipeline_rank"] == 2
    assert a["num_layers_per_virtual_pipeline_stage"] is None
    assert (a["recompute_granularity"], a["recompute_method"], a["recompute_num_layers"]) == \
        ("full", "block", 96 // (8 * 2))
    assert launch.env == {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    assert a["use_distributed_optimizer"] and a["overlap_param_gather"] and a["bf16"]
    assert load_plan(EXAMPLE) == p


def test_llama3_70b_on_h100():
    launch, m, s, p = emit("llama3-70b", "h100-sxm", 1024, tp=8, pp=4, dp=32, micro_batch=1,
                           global_batch=1024, sequence_parallel=True, recompute="selective",
                           tp_comm_overlap=True)
    a = roundtrip(launch, m, s, p)
    flags = launch.flags()
    for flag in ("--group-query-attention", "--swiglu", "--disable-bias-linear",
                 "--untie-embeddings-and-output-weights", "--tp-comm-overlap", "--sequence-parallel"):
        assert flag in flags
    assert a["num_query_groups"] == 8 and a["ffn_hidden_size"] == 28672
    assert a["normalization"] == "RMSNorm" and a["position_embedding_type"] == "rope"
    assert "--recompute-method" not in flags


def test_mixtral_with_expert_parallelism_and_fp8():
    launch, m, s, p = emit("mixtral-8x7b", "h100-sxm", 64, dtype="fp8", tp=2, pp=4, dp=8, ep=8,
                           micro_batch=1, global_batch=512, sequence_parallel=True)
    a = roundtrip(launch, m, s, p)
    assert (a["num_experts"], a["moe_router_topk"], a["expert_model_parallel_size"]) == (8, 2, 8)
    assert a["moe_ffn_hidden_size"] == 14336
    assert a["fp8_format"] == "hybrid" and a["bf16"] and not a["fp16"]
    assert "--fp8" not in launch.flags()


def test_fp16_blackwell_fsdp_and_offload():
    launch, *_ = emit("llama3-8b", "b200", 16, dtype="fp16", tp=2, dp=8, micro_batch=2,
                      global_batch=64, zero_stage=3)
    flags = launch.flags()
    assert "--fp16" in flags and "--bf16" not in flags
    assert launch.value("--data-parallel-sharding-strategy") == "optim_grads_params"
    # Megatron-FSDP forces both overlaps on for ZeRO-3 (megatron_fsdp.py): the launch says so
    assert "--use-distributed-optimizer" not in flags and "--overlap-param-gather" in flags
    assert "--init-model-with-meta-device" in flags
    assert launch.env == {} and launch.unset_env == ["CUDA_DEVICE_MAX_CONNECTIONS"]
    launch, m, s, p = emit("llama3-8b", "h100-sxm", 8, dp=8, micro_batch=1, global_batch=64,
                           offload_activations=0.25, offload_optimizer=0.5)
    roundtrip(launch, m, s, p)
    assert launch.value("--cpu-offloading-num-layers") == str(round(0.25 * m.layers))
    assert launch.value("--optimizer-offload-fraction") == "0.5"
    assert "--use-precision-aware-optimizer" in launch.flags()
    assert launch.env == {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}  # what NVIDIA's scripts set


def test_deepseek_v3_shape_flags():
    launch, m, s, p = emit("deepseek-v3", "h100-sxm", 1024, tp=2, dp=512, ep=64, micro_batch=1,
                           global_batch=1024, sequence_parallel=True)
    a = roundtrip(launch, m, s, p)
    # DeepSeek-V3 config.json: q_lora_rank 1536, kv_lora_rank 512, qk_nope 128, qk_rope 64, v 128
    assert a["multi_latent_attention"] and not a["group_query_attention"] and a["kv_channels"] is None
    assert (a["q_lora_rank"], a["kv_lora_rank"], a["qk_head_dim"], a["qk_pos_emb_head_dim"],
            a["v_head_dim"]) == (1536, 512, 128, 64, 128)
    # first_k_dense_replace 3 of 61 layers; n_shared_experts 1 × moe_intermediate_size 2048; 1 MTP
    pattern = a["moe_layer_freq"]
    assert pattern == "([0]*3+[1]*58)" and eval(pattern) == [0, 0, 0] + [1] * 58  # noqa: S307
    assert a["moe_shared_expert_intermediate_size"] == 2048 and a["mtp_num_layers"] == 1
    assert (a["num_experts"], a["moe_router_topk"], a["moe_ffn_hidden_size"], a["ffn_hidden_size"]) == \
        (256, 8, 2048, 18432)
    assert a["moe_expert_capacity_factor"] is None  # dropless, as the model says


def test_head_dim_qk_norm_shared_width_and_capacity_flags():
    # Qwen3-30B-A3B: head_dim 128 while hidden/heads = 2048/32 = 64; q/k RMSNorm
    launch, m, s, p = emit("qwen3-30b-a3b", "h100-sxm", 64, tp=2, pp=4, dp=8, ep=8, micro_batch=1,
                           global_batch=256, sequence_parallel=True)
    a = roundtrip(launch, m, s, p)
    assert a["kv_channels"] == 128 and a["qk_layernorm"] and a["moe_layer_freq"] == "1"
    assert a["moe_shared_expert_intermediate_size"] is None and a["mtp_num_layers"] is None
    # Llama: head_dim = hidden/heads, no q/k norm: Megatron's defaults already mean the model
    launch, *_ = emit("llama3-8b", "h100-sxm", 8, dp=8, micro_batch=1, global_batch=64)
    assert "--kv-channels" not in launch.flags() and "--qk-layernorm" not in launch.flags()
    # 2 shared experts of 512 = one shared MLP of 1024; capacity 1.25 drops by probability, no pad
    moe = m.moe.model_copy(update={"shared_experts": 2, "shared_expert_ffn": 512, "capacity_factor": 1.25})
    launch = mg.megatron_args(p, m.model_copy(update={"moe": moe}), JobSpec(), s)
    assert launch.value("--moe-shared-expert-intermediate-size") == "1024"
    assert launch.value("--moe-expert-capacity-factor") == "1.25"
    assert launch.value("--moe-token-drop-policy") == "probs"
    assert "--moe-pad-expert-input-to-capacity" not in launch.flags()


def test_megatron_refuses_moe_biases_beyond_expert_tp_1_and_mla_with_groups():
    oss, job = load_model("gpt-oss-120b"), JobSpec()
    plan = Plan(tp=2, dp=32, ep=8, global_batch=64, sequence_parallel=True)
    assert any("expert tensor parallel 1" in r for r in mg.not_expressible(plan, oss, job))
    assert not any("expert tensor" in r for r in mg.not_expressible(Plan(dp=64, ep=8, global_batch=64),
                                                                      oss, job))
    assert rules.MSG_MOE_BIAS_ETP in check(base(num_experts=8, sequence_parallel=True))
    assert rules.MSG_MOE_BIAS_ETP not in check(base(num_experts=8, sequence_parallel=True,
                                                    disable_bias_linear=True))
    dsv3 = load_model("deepseek-v3").model_copy(update={"query_groups": 8})
    assert any("multi-latent" in r for r in mg.not_expressible(Plan(dp=8, global_batch=8), dsv3, job))
    assert rules.MSG_MLA_GQA in check(base(multi_latent_attention=True, group_query_attention=True,
                                           num_query_groups=2))


def test_not_expressible_reasons():
    m, job = load_model("gpt3-175b"), JobSpec()
    assert any("offload_weights" in r for r in mg.not_expressible(Plan(offload_weights=0.5), m, job))
    both = mg.not_expressible(Plan(pp=8, recompute="full", offload_activations=0.2), m, job)
    assert len(both) == 2
    assert mg.not_expressible(Plan(pp=8, vpp=2, dp=2, global_batch=12), m, job)
    assert mg.not_expressible(Plan(vpp=2), m, job)
    assert mg.not_expressible(Plan(zero_stage=0, offload_optimizer=1.0), m, job)
    assert mg.not_expressible(Plan(tp=8, tp_comm_overlap=True), m, job)
    assert mg.not_expressible(Plan(tp=8, ep=2, dp=2, global_batch=2), m, job)  # dense model
    mixtral = load_model("mixtral-8x7b")
    assert mg.not_expressible(Plan(tp=2, ep=2, dp=4, global_batch=4), mixtral, job)
    assert not mg.not_expressible(Plan(tp=2, ep=2, dp=4, global_batch=4, sequence_parallel=True),
                                  mixtral, job)


def _random_plans(rng: random.Random, n: int):
    cases = [("gpt3-175b", "a100-80g", 1024), ("llama3-70b", "h100-sxm", 512),
             ("mixtral-8x7b", "h100-sxm", 64), ("llama3-8b", "b200", 32)]
    pow2 = [1, 2, 4, 8, 16]
    for _ in range(n):
        model, system, gpus = rng.choice(cases)
        tp, pp, cp = rng.choice(pow2[:4]), rng.choice(pow2), rng.choice([1, 1, 2])
        if gpus % (tp * pp * cp):
            continue
        dp = gpus // (tp * pp * cp)
        mb = rng.choice([1, 2, 4])
        plan = dict(tp=tp, pp=pp, dp=dp, cp=cp, micro_batch=mb,
                    global_batch=mb * dp * rng.choice([1, 2, 4, 8, 16, 32]),
                    ep=rng.choice([1, 2, 4, 8]), vpp=rng.choice([1, 1, 2, 3]),
                    sequence_parallel=rng.random() < 0.6,
                    recompute=rng.choice(["none", "selective", "full"]),
                    zero_stage=rng.choice([0, 1, 1, 2, 3]),
                    offload_activations=rng.choice([0.0, 0.0, 0.25]),
                    offload_optimizer=rng.choice([0.0, 0.0, 1.0]),
                    tp_comm_overlap=rng.random() < 0.3, dp_comm_overlap=rng.random() < 0.7,
                    cross_entropy_fusion=rng.random() < 0.3, grad_reduce_in_bf16=rng.random() < 0.3,
                    fp8_param_gather=rng.random() < 0.3)
        yield model, system, gpus, rng.choice(["bf16", "fp16", "fp8", "fp8-cs", "mxfp8", "nvfp4"]), plan


def test_random_expressible_plans_are_accepted_and_never_use_missing_flags():
    rng, accepted = random.Random(4), 0
    models, systems = {}, {}
    for model, system, gpus, dtype, fields in _random_plans(rng, 600):
        if model not in models:
            models[model] = load_model(model)
        if (system, gpus) not in systems:
            systems[system, gpus] = load_system(system, gpus)
        m, s = models[model], systems[system, gpus]
        try:
            plan = Plan(**fields)
        except ValueError:
            continue
        job = JobSpec(dtype=dtype)
        launch = mg.megatron_args(plan, m, job, s)
        argv = launch.argv()
        assert not set(mg.NONEXISTENT_FLAGS) & set(argv)
        assert not ("--num-virtual-stages-per-pipeline-rank" in argv
                    and "--num-layers-per-virtual-pipeline-stage" in argv)
        if mg.launch_refusals(plan, m, job, s):
            continue
        assert mg.validate_launch(launch, mg.gpu_arch_major(s)) == [], plan.short()
        accepted += 1
    assert accepted >= 30


def test_script_is_valid_bash():
    launch, m, *_ = emit("gpt3-175b", "a100-80g", 1024, tp=8, pp=8, dp=16, micro_batch=1,
                         global_batch=1536)
    script = mg.render(launch, "script")
    assert '--data-path "$DATA_PATH"' in script and "--tokenizer-type" in script
    if shutil.which("bash"):
        subprocess.run(["bash", "-n"], input=script, text=True, check=True)
    line = mg.render(launch, "args")
    assert "\n" not in line and line.startswith("--num-layers 96")
    data = json.loads(mg.render(launch, "json"))
    assert mg.validate_megatron_args(data["args"], data["world_size"], data["env"]) == []


# ----------------------------------------------------------------------------------------------
# CLI
# ----------------------------------------------------------------------------------------------

runner = CliRunner()


def test_cli_script_from_plan_file():
    result = runner.invoke(app, ["megatron", "--plan", str(EXAMPLE), "-m", "gpt3-175b",
                                 "-s", "a100-80g"])
    assert result.exit_code == 0, result.output
    assert "NNODES=128\n" in result.stdout
    assert 'torchrun --nnodes $NNODES --nproc-per-node 8 --node-rank "$NODE_RANK"' in result.stdout
    env, argv, _ = mg.parse_script(result.stdout)
    assert mg.validate_megatron_args(argv, 1024, env, 8) == []
    assert "--num-virtual-stages-per-pipeline-rank" in argv


def test_cli_json_from_flags():
    result = runner.invoke(app, ["megatron", "-m", "llama3-70b", "-s", "h100-sxm", "-g", "64",
                                 "--tp", "8", "--pp", "4", "--micro-batch", "1", "-b", "128",
                                 "--sequence-parallel", "--recompute", "selective",
                                 "--format", "json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["world_size"] == 64 and data["nnodes"] == 8
    assert data["args"]["--tensor-model-parallel-size"] == "8"
    assert mg.validate_megatron_args(data["args"], 64, data["env"]) == []


def test_cli_output_refuses_to_overwrite(tmp_path):
    target = tmp_path / "launch.sh"
    cmd = ["megatron", "--plan", str(EXAMPLE), "--output", str(target)]
    first = runner.invoke(app, cmd)
    assert first.exit_code == 0, first.output
    content = target.read_text()
    assert content.startswith("#!/usr/bin/env bash")
    second = runner.invoke(app, cmd)
    assert second.exit_code == 2
    assert second.stderr.strip().count("\n") == 0 and "already exists" in second.stderr
    assert target.read_text() == content


@pytest.mark.parametrize("flags, needle", [
    (["--tp", "8", "--pp", "8", "--offload-weights", "0.5"], "offload_weights"),
    (["--tp", "8", "--pp", "8", "--vpp", "2", "-b", "64"], "interleaved"),
    (["--tp", "7"], "must divide the GPU count"),
    (["--plan", "does-not-exist.yaml"], "plan"),
    (["--plan", str(EXAMPLE), "--tp", "4"], "either --plan or plan flags"),
    (["--tp", "8", "--format", "xml"], "format"),
])
def test_cli_bad_plans_exit_2_with_one_line(flags, needle):
    result = runner.invoke(app, ["megatron", *flags])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], result.stderr


# ----------------------------------------------------------------------------------------------
# Issue 11 item 5: the same rule and memory checks as `planner estimate`, any batch, no silent
# substitutions, and the same default plan as `planner plan`
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("flags, needle", [
    (["-g", "0"], "gpus: must be a positive integer, got 0"),
    (["--tp", "0"], "tp: must be a positive integer, got 0"),
    (["--tp", "8", "--pp", "8", "--micro-batch", "0"], "micro-batch: must be a positive integer"),
    (["-g", "64", "-b", "64", "--tp", "1", "--pp", "1"], "GiB over"),
    (["--dtype", "fp8", "--tp", "8", "--pp", "8"], "fp8 needs compute capability 8.9 or newer"),
    (["-m", "llama3-8b", "-s", "b200", "-g", "8", "--dp", "8", "--dtype", "fp16",
      "--grad-reduce-in-bf16"], "grad_reduce_in_bf16"),
    (["-m", "llama3-8b", "-s", "h100-sxm", "-g", "8", "--dp", "8", "-b", "8", "--zero-stage", "3",
      "--no-dp-comm-overlap"], "Megatron-FSDP"),
    (["--tp", "8", "--pp", "8", "--vpp", "2", "--recompute", "full", "--recompute-num-layers", "5"],
     "not a multiple of vpp"),
])
def test_cli_refuses_what_breaks_with_one_line(flags, needle):
    result = runner.invoke(app, ["megatron", *flags])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], result.stderr


def test_cli_memory_refusal_says_by_how_much():
    from planner.analytical import estimate
    result = runner.invoke(app, ["megatron", "-g", "64", "-b", "64", "--tp", "1", "--pp", "1"])
    est = estimate(load_model("gpt3-175b"), load_system("a100-80g", 64),
                   Plan(dp=64, global_batch=64), JobSpec())
    over_gib = (est.hbm_bytes - est.hbm_capacity_bytes) / 2**30
    assert f"{over_gib:.2f} GiB over" in result.stderr and over_gib > 900


def test_cli_takes_any_batch_the_user_gives():
    result = runner.invoke(app, ["megatron", "-b", "4096", "--tp", "8", "--pp", "8", "--format", "json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["args"]["--global-batch-size"] == "4096"


def test_bare_cli_emits_planner_plans_best_plan():
    from planner.search import best_plan
    result = runner.invoke(app, ["megatron", "--format", "json"])
    assert result.exit_code == 0, result.output
    args = json.loads(result.stdout)["args"]
    m, s, job = load_model("gpt3-175b"), load_system("a100-80g"), JobSpec(global_batch=1536)
    best = best_plan(m, s, job)  # what `planner plan` (no flags) ranks first
    expected = {f: (True if v is None else v) for f, v in mg.megatron_args(best, m, job, s).args}
    assert args.pop("--save-interval") and args == expected
    assert args["--global-batch-size"] == "1536"


def test_activation_offload_runs_as_whole_layers_never_the_last_one():
    m, s = load_model("llama3-405b"), load_system("h100-offload-1tib", 8)  # 126 layers
    for frac, layers, exact in ((1.0, 125, True), (0.25, 32, False), (0.5, 63, True)):
        plan = Plan(dp=8, global_batch=8, offload_activations=frac)
        launch = mg.megatron_args(plan, m, JobSpec(), s)
        assert launch.value("--cpu-offloading-num-layers") == str(layers)
        assert (not any("offload_activations" in n for n in launch.notes)) == exact


@pytest.mark.parametrize("storage", [[], ["--write-gb-per-s", "20", "--gpu-mtbf-hours", "20000"]])
def test_cli_checkpoints_at_planner_checkpoints_interval(storage):
    from planner.analytical import estimate
    where = ["-m", "llama3-70b", "-s", "h100-sxm", "-g", "64"]
    ckpt = runner.invoke(app, ["checkpoint", *where, "--json", *storage])
    assert ckpt.exit_code == 0, ckpt.output
    daly_s = json.loads(ckpt.stdout)["daly_interval_s"]
    result = runner.invoke(app, ["megatron", *where, "-b", "128", "--tp", "8", "--pp", "4",
                                 "--sequence-parallel", "--recompute", "selective", "--format", "json", *storage])
    assert result.exit_code == 0, result.output
    plan = Plan(tp=8, pp=4, dp=2, global_batch=128, sequence_parallel=True, recompute="selective")
    step_s = estimate(load_model("llama3-70b"), load_system("h100-sxm", 64), plan, JobSpec()).step_time_s
    data = json.loads(result.stdout)["args"]
    assert data["--save-interval"] == str(max(1, round(daly_s / step_s)))
    assert data["--log-throughput"] is True


def test_bf16_adam_moments_checkpoint_at_their_own_interval():
    """A launch with bf16 moments (--exp-avg-dtype bf16) saves 10 B/param, and `planner checkpoint
    --adam-moments bf16` sizes it so; --save-interval had been the Daly interval of an fp32-moment
    checkpoint (14 B/param), 17 % longer than the one its own checkpoint calls for."""
    from planner.analytical import estimate
    where = ["-m", "llama3-70b", "-s", "h100-sxm", "-g", "64"]
    ckpt = runner.invoke(app, ["checkpoint", *where, "--tp", "8", "--pp", "4", "--adam-moments", "bf16", "--json"])
    assert ckpt.exit_code == 0, ckpt.output
    daly_s = json.loads(ckpt.stdout)["daly_interval_s"]
    result = runner.invoke(app, ["megatron", *where, "-b", "128", "--tp", "8", "--pp", "4", "--sequence-parallel",
                                 "--recompute", "selective", "--adam-moments", "bf16", "--format", "json"])
    assert result.exit_code == 0, result.output
    plan = Plan(tp=8, pp=4, dp=2, global_batch=128, sequence_parallel=True, recompute="selective")
    step_s = estimate(load_model("llama3-70b"), load_system("h100-sxm", 64), plan,
                      JobSpec(adam_moments="bf16")).step_time_s
    args = json.loads(result.stdout)["args"]
    assert args["--exp-avg-dtype"] == "bf16"
    assert args["--save-interval"] == str(max(1, round(daly_s / step_s)))


@pytest.mark.parametrize("vocab, tp, divisor", [
    (51200, 8, 128),    # GPT-3 preset: 51200 = 2^11·25, already a multiple of 128·8
    (128256, 8, 32),    # Llama 3: 2^8·501, so at most 32·8 divides it
    (128256, 4, 64),
    (32000, 2, 128),    # Mixtral: 2^8·125
    (50257, 8, 1),      # odd: no divisor leaves it unpadded; 1 pads by < tp rows
])
def test_vocab_divisor_leaves_the_vocabulary_unpadded(vocab, tp, divisor):
    from planner.megatron.emit import vocab_divisor
    assert vocab_divisor(vocab, tp) == divisor


@pytest.mark.parametrize("dtype, system, refused", [
    ("fp8", "a100-80g", True), ("fp8-cs", "a100-80g", True), ("mxfp8", "h100-sxm", True),
    ("nvfp4", "h200", True), ("fp8", "h100-sxm", False), ("mxfp8", "b200", False),
    ("nvfp4", "b200", False), ("fp16", "a100-80g", False),
])
def test_precision_needs_the_gpu_generation(dtype, system, refused):
    m, s = load_model("llama3-8b"), load_system(system, 8)
    reasons = mg.launch_refusals(Plan(dp=8, global_batch=8), m, JobSpec(dtype=dtype), s)
    assert bool(reasons) == refused and all("compute capability" in r for r in reasons)


def test_a_moe_launch_trains_the_models_own_router():
    """The router the model was trained with (MoESpec.router_*; not costed) is launched: DeepSeek-V3's
    sigmoid scores, balancing bias and 2.5 scaling with its sequence-wise aux loss at 1e-4
    (DeepSeek-V3 §2.1.2); Mixtral keeps Megatron's softmax router with its config's 2e-2 aux loss; Llama 4's
    top-1 sigmoid needs no pre-softmax. Megatron's validator accepts each; the rules mirror refuses
    the bias beside softmax scores, as Megatron's TransformerConfig does."""
    system = load_system("h100-sxm", 64)

    def argv(model, plan):
        launch = mg.megatron_args(plan, load_model(model), JobSpec(), system)
        assert mg.validate_launch(launch, 9) == [], model
        return launch.argv()

    ds = argv("deepseek-v3", Plan(tp=1, pp=8, dp=8, ep=8, micro_batch=1, global_batch=256, recompute="full"))
    assert ds[ds.index("--moe-router-score-function") + 1] == "sigmoid" and "--moe-router-enable-expert-bias" in ds
    assert ds[ds.index("--moe-router-topk-scaling-factor") + 1] == "2.5"
    assert ds[ds.index("--moe-router-load-balancing-type") + 1] == "seq_aux_loss"
    assert float(ds[ds.index("--moe-aux-loss-coeff") + 1]) == 1e-4
    mixtral = argv("mixtral-8x7b", Plan(tp=2, pp=4, dp=8, ep=8, micro_batch=1, global_batch=256, sequence_parallel=True))
    assert "--moe-router-score-function" not in mixtral and "--moe-router-enable-expert-bias" not in mixtral
    assert float(mixtral[mixtral.index("--moe-aux-loss-coeff") + 1]) == 2e-2  # config.json router_aux_loss_coef
    scout = argv("llama4-scout", Plan(tp=4, pp=1, dp=16, ep=16, micro_batch=1, global_batch=64, sequence_parallel=True,
                                      recompute="full"))
    assert scout[scout.index("--moe-router-score-function") + 1] == "sigmoid" and "--moe-router-pre-softmax" not in scout
    assert check(base(num_experts=8, moe_router_topk=2, disable_bias_linear=True, moe_router_enable_expert_bias=True)) == [
        rules.MSG_EXPERT_BIAS_SCORE]


def test_a_launch_without_a_checkpoint_interval_saves_no_checkpoints():
    """Megatron asserts --save-interval wherever --save is set (training/arguments.py); the Python
    API's launch without an interval must then not pass --save (`planner megatron` always sets one)."""
    from planner.megatron import megatron_args, parse_script, render, validate_megatron_args
    model, system = load_model("llama3-8b"), load_system("h100-sxm", 8)
    plan = Plan(dp=8, micro_batch=1, global_batch=64)
    for interval, saves in ((None, False), (500, True)):
        launch = megatron_args(plan, model, JobSpec(), system, save_interval=interval)
        env, argv, _ = parse_script(render(launch, "script"))
        assert ("--save" in argv) == saves and ("--load" in argv) == saves
        assert validate_megatron_args(argv, 8, env) == []
    assert validate_megatron_args(launch.argv() + ["--save", "ckpt"], 8, launch.env) == []  # interval 500 set
    bare = megatron_args(plan, model, JobSpec(), system)
    assert any("--save-interval" in e for e in validate_megatron_args(bare.argv() + ["--save", "ckpt"], 8, bare.env))


def test_plan_never_ranks_an_fsdp_plan_that_megatron_refuses(tmp_path):
    """`planner plan --no-dp-comm-overlap` searched Megatron-FSDP (ZeRO-2/3) without the overlap,
    which `planner megatron` refuses (Megatron-FSDP always overlaps): its best plan for Llama 3.2
    3B on 16 H100 was ZeRO-2 with exposed DP communication, and `planner megatron --plan` exited 2.
    The rule is a plan-level one: the search leaves it out and `estimate --json` names it."""
    saved = tmp_path / "plan.yaml"
    job = ["-m", "llama3.2-3b", "-s", "h100-grand-teton", "-g", "16", "-b", "128", "--dtype", "fp8-cs"]
    found = runner.invoke(app, ["plan", *job, "--no-dp-comm-overlap", "--top", "5", "--json", "--save", str(saved)])
    assert found.exit_code == 0, found.output
    plans = [Plan(**r["plan"]) for r in json.loads(found.stdout[found.stdout.index("{"):])["plans"]]
    m, s = load_model("llama3.2-3b"), load_system("h100-grand-teton", 16)
    assert plans and all(mg.launch_refusals(p, m, JobSpec(dtype="fp8-cs"), s) == [] for p in plans)
    launched = runner.invoke(app, ["megatron", "--plan", str(saved), "--format", "json"])
    assert launched.exit_code == 0, launched.output
    est = runner.invoke(app, ["estimate", *job, "--dp", "16", "--zero-stage", "3", "--no-dp-comm-overlap", "--json"])
    assert est.exit_code == 0, est.output
    assert any("always overlaps" in r for r in json.loads(est.stdout)["megatron_refusals"])
