"""What a plan cannot be in Megatron-LM (plan-level rules, cheap: the search calls them on many
plans). Section numbers ("MA 2a") refer to shared/reference/megatron_args.md."""
from __future__ import annotations

import numpy as np

from hardware.spec import SystemSpec
from planner.analytical.offload import fraction_of_layers, offloaded_layers
from planner.pipeline_layout import fullest_rank_layers, layout_not_expressible
from planner.megatron.launch import arch_text, compute_capability, gpu_arch_major
from planner.megatron.rules import GROUPED_GEMM_MIN_ARCH
from planner.model import ModelSpec
from planner.plan import DEFAULT_RECOMPUTE_MODULES, JobSpec, Plan, applicable_recompute_modules

# Lowest compute-capability major each precision runs on: FP8 tensor cores arrive with Hopper
# (sm_90); MXFP8 and NVFP4 block scaling need Blackwell (sm_100) in Transformer Engine.
# Transformer Engine's fused attention (cuDNN) and FlashAttention-2 run from Ampere on
# (cli.common.gpu_job_defaults: a Volta job defaults to the unfused path)
FUSED_ATTENTION_MIN_ARCH = 8.0
PRECISION_MIN_ARCH: dict[str, float] = {"bf16": 8.0, "fp16": 7.0, "fp8": 8.9, "fp8-cs": 8.9, "fp8-block": 9.0,
                                        "mxfp8": 10.0, "nvfp4": 10.0}
# Precisions whose compute weights Megatron can keep (and gather) in FP8 (--fp8-param-gather).
FP8_PARAM_DTYPES = ("fp8", "fp8-cs", "fp8-block", "mxfp8")


def cpu_offload_layers(plan: Plan, model: ModelSpec) -> int:
    """--cpu-offloading-num-layers for the plan's activation-offload fraction f. Megatron offloads
    whole layers and never the last one (MA 2a: 1 <= k < layers; its backward starts at once), and
    the memory model keeps at least two layers' worth in HBM anyway, so f = 1 means k = layers - 1. Other
    fractions round UP to whole layers: never less offloaded than the memory check assumed."""
    return _whole_layers(plan.offload_activations, model.layers)


def _whole_layers(fraction: float, layers: int) -> int:
    """The cost model's whole-layer count (analytical.offload.offloaded_layers), as an int."""
    return int(offloaded_layers(np.float64(fraction), np.float64(layers)))


def megatron_offload_fraction(fraction: float, layers: int) -> float:
    """The activation-offload fraction a Megatron launch of `fraction` runs: whole layers (0.5 of
    61 layers runs 31, 0.508), the grid the search costs under --framework megatron, so that a plan
    is costed as launched."""
    return 0.0 if fraction <= 0 else offload_fraction_of_layers(_whole_layers(fraction, layers), layers)


def offload_fraction_of_layers(k: int, layers: int) -> float:
    """The activation-offload fraction a launch with k offloaded layers runs (inverse of
    cpu_offload_layers on the fractions Megatron can express)."""
    return float(fraction_of_layers(k, layers))


def bf16_moments_refusal(adam_moments: str, zero_stage: int, stage: str = "zero_stage") -> str | None:
    """Why Adam moments of `adam_moments` cannot run at `zero_stage` (None: they can), the stage
    named as `stage` (a plan field, or the flag that set it). core/optimizer/optimizer_config.py:
    the precision-aware optimizer needs the distributed optimizer; Megatron-Bridge turns it off
    under Megatron-FSDP ("cannot work with FSDP together", scripts/performance/utils/helpers.py
    @v0.2.0), so ZeRO-1 only."""
    if adam_moments == "bf16" and zero_stage != 1:
        return ("bf16 moments need Megatron's precision-aware optimizer, which runs on the distributed optimizer "
                f"({stage} 1), got {stage} {zero_stage}")
    return None


def not_expressible(plan: Plan, model: ModelSpec, job: JobSpec) -> list[str]:
    """Reasons this plan cannot be launched with Megatron-LM (empty = expressible). Cheap: the
    search calls it on many plans. Batch divisibility is already a Plan invariant."""
    reasons: list[str] = []
    layers = model.layers
    if plan.offload_weights > 0:
        reasons.append("offload_weights: Megatron-LM has no flag to offload weights to host memory")
    if plan.offload_activations > 0:
        # MA 2b: cpu offloading needs num_layers > k >= 1, no PP and no recompute.
        if plan.pp > 1:
            reasons.append("offload_activations: Megatron's --cpu-offloading-num-layers does not "
                           "support pipeline parallelism (pp must be 1)")
        if plan.recompute != "none":
            reasons.append("offload_activations: Megatron's CPU offloading does not work with "
                           "activation recomputation (recompute must be none)")
        if layers < 2:
            reasons.append("offload_activations: CPU offloading needs at least 2 layers")
        if model.hybrid_pattern:
            # core/models/hybrid (0.19.2): only the GPT layer stack (transformer_block.py) opens
            # the CPU-offload context; the hybrid stack parses the flag and offloads nothing
            reasons.append("offload_activations: Megatron's hybrid (Mamba) layer stack has no layer-wise CPU "
                           "offloading; --cpu-offloading-num-layers would offload nothing")
    if plan.offload_optimizer > 0 and plan.zero_stage != 1:
        # MA 3: --optimizer-cpu-offload goes with the distributed optimizer.
        reasons.append("offload_optimizer: --optimizer-cpu-offload needs the distributed optimizer "
                       f"(zero_stage 1), got zero_stage {plan.zero_stage}")
    moments = bf16_moments_refusal(job.adam_moments, plan.zero_stage)
    if moments:
        reasons.append(f"adam_moments: {moments}")
    if job.adam_moments == "bf16" and plan.offload_optimizer > 0:
        # core/optimizer/__init__.py (0.19.2): with --optimizer-cpu-offload the HybridDeviceOptimizer
        # is built without exp_avg_dtype / exp_avg_sq_dtype (those reach TE's FusedAdam only
        # on the GPU path), so both halves keep fp32 moments, 8 B/param against the 4 costed
        reasons.append("adam_moments: Megatron's optimizer CPU offload (--optimizer-cpu-offload) keeps Adam's moments "
                       "in fp32 whatever --exp-avg-dtype says, while the plan costs bf16 moments; drop "
                       "offload_optimizer or the bf16 moments")
    if plan.vpp > 1:
        # MA 2a: interleaving needs pp > 1; MA 2c: microbatches >= pp (a group size N != pp,
        # emitted, covers an m that pp does not divide: pipeline_layout.vp_microbatch_group).
        if plan.pp == 1:
            reasons.append("vpp: the interleaved schedule needs pp > 1")
        elif plan.num_microbatches < plan.pp:
            reasons.append(f"vpp: the interleaved schedule needs at least pp ({plan.pp}) microbatches, "
                           f"got {plan.num_microbatches}")
    reasons += layout_not_expressible(plan, layers)  # uneven layouts: pipeline_layout.py (issue 8)
    reasons += graph_job_refusals(model, job) + graph_option_refusals(
        plan.recompute, plan.recompute_modules or (DEFAULT_RECOMPUTE_MODULES if plan.recompute == "selective" else ()),
        plan.offload_activations, plan.moe_a2a_overlap, model, job, plan.zero_stage)
    if model.heads % plan.tp:  # MA 2b
        allowed = [t for t in (1, 2, 4, 8, 16, 32, 64) if model.heads % t == 0]
        reasons.append(f"tp: {plan.tp} must divide the attention heads ({model.heads}); allowed: "
                       f"{', '.join(map(str, allowed))}")
    if model.mla is not None and model.kv_groups < model.heads:  # arguments.py validate_args
        reasons.append("query_groups: Megatron's multi-latent attention has no query groups "
                       f"(got {model.kv_groups} for {model.heads} heads)")
    g = model.kv_groups
    if g < model.heads and g % plan.tp and plan.tp % g:  # MA 2b
        reasons.append(f"tp: {plan.tp} must be a multiple or divisor of the query groups ({g})")
    if plan.cp > 1 and model.seq_length % (2 * plan.cp):  # MA 2a
        reasons.append(f"seq_length ({model.seq_length}) must be a multiple of 2*cp ({2 * plan.cp})")
    if plan.ep > 1:  # MA 2a, 2c (expert grid; etp defaults to tp)
        if model.moe is None:
            reasons.append("ep: expert parallelism needs a MoE model")
        elif model.moe.num_experts % plan.ep:
            reasons.append(f"ep: experts ({model.moe.num_experts}) must be a multiple of ep ({plan.ep})")
    if model.moe is None and plan.etp is not None and plan.etp != plan.tp:
        reasons.append("etp: expert tensor parallelism needs a MoE model")
    grid = plan.expert_tp * plan.ep * plan.pp
    if plan.gpus % grid:  # MA 2c: Megatron MoE parallel folding (megatron/core/parallel_state.py)
        reasons.append(f"ep: world size ({plan.gpus}) must be divisible by etp*ep*pp "
                       f"({plan.expert_tp}*{plan.ep}*{plan.pp})")
    if model.moe is not None and model.expert_ffn_hidden % plan.expert_tp:
        reasons.append(f"etp: moe ffn ({model.expert_ffn_hidden}) must be divisible by etp ({plan.expert_tp})")
    if plan.dp_impl == "deepspeed":
        reasons.append("dp_impl: DeepSpeed ZeRO is not part of Megatron-LM")
    if plan.dp_impl == "torch-fsdp2":  # megatron/training/arguments.py, --use-torch-fsdp2 asserts
        if plan.zero_stage != 3:
            reasons.append("dp_impl: torch-fsdp2 shards parameters (zero_stage 3)")
        if plan.pp > 1 or plan.ep > 1:
            reasons.append("dp_impl: --use-torch-fsdp2 is not supported with pipeline or expert parallelism")
        if model.tied_embeddings:
            reasons.append("dp_impl: --use-torch-fsdp2 requires --untie-embeddings-and-output-weights")
        if model.mamba is not None:
            # core/distributed/torch_fully_sharded_data_parallel.py (0.19.2) calls fully_shard on
            # each TransformerLayer (MoE and MLP layers of a hybrid stack are ones), the embedding
            # and the output layer; MambaLayer is none of them, so every Mamba layer's weights stay
            # in the root unit, gathered whole through the forward and the backward
            reasons.append("dp_impl: Megatron's --use-torch-fsdp2 shards a hybrid stack's Mamba layers only as part of "
                           "the whole model (fully_shard wraps TransformerLayers, not MambaLayers), so all of them are "
                           "gathered at once, while the plan costs two layers gathered at a time; use Megatron-FSDP "
                           "(dp_impl megatron)")
        if job.dtype == "fp16":
            reasons.append("dtype: --use-torch-fsdp2 is not supported with fp16 (use bf16)")
        elif not plan.grad_reduce_in_bf16 and (job.bytes_per_param.grads, job.bytes_per_param.grad_reduce) != (2, 2):
            # core/distributed/torch_fully_sharded_data_parallel.py (0.19.2): fully_shard over the
            # bf16 parameters (Float16Module) with no mixed-precision policy, so FSDP2 keeps and
            # reduce-scatters the gradients in bf16 whatever --grad-reduce-in-bf16 or
            # --accumulate-allreduce-grads-in-fp32 say (its DDP config is built without them)
            reasons.append("grad_reduce_in_bf16: Megatron's --use-torch-fsdp2 keeps and reduce-scatters gradients in "
                           "the parameters' bf16 (no fp32 reduce policy), while the plan costs fp32 gradients; add "
                           "--grad-reduce-in-bf16")
    if plan.moe_dispatcher == "deepep" and model.moe is None:
        reasons.append("moe_dispatcher: deepep needs a MoE model")
    if plan.moe_a2a_overlap:
        reasons += a2a_overlap_refusals(plan, model)
        if plan.offload_activations > 0:
            # pipeline_parallel/combined_1f1b.py runs every microbatch's layers through the
            # schedule plan's per-layer callables (models/gpt/fine_grained_callables.py), never
            # through TransformerBlock.forward, the only place that enters the CPU-offload context
            # (0.19.2): --cpu-offloading-num-layers parses and offloads nothing
            reasons.append("offload_activations: Megatron's layer-wise CPU offloading (--cpu-offloading-num-layers) "
                           "runs only in TransformerBlock.forward, which the all-to-all overlap's combined 1F1B "
                           "schedule (--overlap-moe-expert-parallel-comm) bypasses: nothing would be offloaded")
    etp = plan.expert_tp  # Megatron's default expert TP is tp
    if model.moe is not None and model.biases and etp > 1:
        # transformer_config.py: "Bias in Moe is only supported when ETP==1" (GPT-OSS has biases)
        reasons.append(f"tp: Megatron's MoE layers with biases need expert tensor parallel 1, got {etp} "
                       "(expert TP defaults to tp)")
    if model.moe is not None and plan.tp > 1 and not plan.sequence_parallel:
        # Megatron-core MoE: "When using MoE and tensor parallelism, sequence parallelism must be
        # used." (not in MA; kept as a conservative rule for emission only).
        reasons.append("sequence_parallel: Megatron MoE layers with tp > 1 need sequence parallelism "
                       "(--sequence-parallel)")
    if plan.tp_comm_overlap and plan.tp > 1 and not plan.sequence_parallel:  # MA 2a
        reasons.append("tp_comm_overlap: Megatron overlaps TP communication only with sequence_parallel")
    k = plan.recompute_num_layers
    if plan.recompute == "full" and k is not None and plan.vpp > 1 and k % plan.vpp \
            and k < fullest_rank_layers(plan, layers):  # (a count covering every layer is all)
        # Megatron's --recompute-num-layers counts per virtual chunk: k per stage runs as
        # vpp·ceil(k/vpp) or vpp·floor(k/vpp), never k.
        reasons.append(f"recompute_num_layers: Megatron recomputes the same number of layers in each of the "
                       f"{plan.vpp} virtual chunks; {k} per pipeline stage is not a multiple of vpp ({plan.vpp})")
    reasons += recompute_modules_not_expressible(plan, model, job)
    if plan.fp8_param_gather:
        if job.dtype not in FP8_PARAM_DTYPES:
            reasons.append(f"fp8_param_gather: needs an FP8 dtype ({', '.join(FP8_PARAM_DTYPES)}), "
                           f"got {job.dtype}")
        if plan.zero_stage == 0:
            reasons.append("fp8_param_gather: Megatron gathers FP8 parameters only with the distributed "
                           "optimizer or FSDP (zero_stage >= 1)")
        if plan.dp_impl == "torch-fsdp2":
            # arguments.py (0.19.2): under --use-torch-fsdp2 with TE >= 2.0 Megatron turns
            # --fp8-param-gather off with a warning and gathers in bf16
            reasons.append("fp8_param_gather: Megatron turns it off under torch FSDP2 (Transformer Engine >= 2.0) "
                           "and gathers bf16 parameters; use the distributed optimizer or Megatron-FSDP")
        if plan.offload_optimizer > 0 and job.dtype != "fp8":
            # arguments.py (0.19.2): the hybrid device optimizer keeps FP8 parameters only under
            # delayed scaling
            reasons.append("fp8_param_gather: with offload_optimizer Megatron keeps FP8 parameters only under "
                           f"delayed scaling (dtype fp8), got {job.dtype}")
    if plan.grad_reduce_in_bf16 and job.dtype == "fp16":
        reasons.append("grad_reduce_in_bf16: Megatron applies --grad-reduce-in-bf16 only to bf16-based "
                       "training, not fp16")
    if plan.zero_stage >= 2 and not plan.dp_comm_overlap and plan.dp * plan.cp > 1:
        # megatron_fsdp.py forces overlap_grad_reduce (and overlap_param_gather for ZeRO-3) on. A
        # plan-level rule (no system in it): the search (constraints.space.KNOB_RULES) and
        # `planner estimate`'s megatron_refusals must know it as `planner megatron` does
        impl = "PyTorch FSDP2" if plan.dp_impl == "torch-fsdp2" else "Megatron-FSDP"
        reasons.append(f"dp_comm_overlap: {impl} (zero_stage {plan.zero_stage}) always overlaps the gradient "
                       "reduce-scatter and parameter gather, while the plan costs them exposed; drop "
                       "--no-dp-comm-overlap")
    return reasons


def a2a_overlap_model(model: ModelSpec) -> bool:
    """Whether the model can run the MoE all-to-all overlap at all: MoE, at most one MTP layer, and
    not a hybrid stack (Megatron's combined 1F1B schedule is GPTModel's)."""
    return model.moe is not None and (model.mtp_layers or 0) <= 1 and not model.hybrid_pattern


def a2a_overlap_refusals(plan: Plan, model: ModelSpec) -> list[str]:
    """Why Megatron would refuse --overlap-moe-expert-parallel-comm on this plan (empty = it
    accepts it), whether or not the plan asks for it (transformer_config.py,
    overlap_moe_expert_parallel_comm asserts)."""
    reasons = []
    if model.moe is None or plan.ep < 2:
        reasons.append("moe_a2a_overlap: needs a MoE model with expert parallelism (ep > 1)")
    if model.hybrid_pattern:  # the rule a2a_overlap_model gives the search space
        reasons.append("moe_a2a_overlap: Megatron's combined 1F1B schedule (--overlap-moe-expert-parallel-comm) "
                       "runs GPTModel only, not a hybrid Mamba stack (pretrain_mamba.py)")
    if plan.pp > 1 and plan.vpp < 2:
        reasons.append("moe_a2a_overlap: with pp > 1 Megatron needs interleaving (vpp > 1)")
    if plan.recompute == "full":
        reasons.append("moe_a2a_overlap: Megatron refuses full recompute with the all-to-all overlap")
    if (model.mtp_layers or 0) > 1:
        reasons.append("moe_a2a_overlap: Megatron allows at most one MTP layer with the overlap")
    if plan.recompute == "selective" and "moe" in (plan.recompute_modules or ()):
        reasons.append("recompute_modules: moe cannot be recomputed with the MoE all-to-all overlap "
                       "(--overlap-moe-expert-parallel-comm)")
    return reasons


# --recompute-modules that Transformer Engine's FP8 delayed scaling cannot recompute
# (transformer_config.py: "Delayed scaling does not support moe_act and layernorm recompute for fp8").
FP8_DELAYED_NO_RECOMPUTE = ("moe_act", "layernorm")


def recompute_modules_not_expressible(plan: Plan, model: ModelSpec, job: JobSpec) -> list[str]:
    """Selective-recompute modules Megatron cannot run for this model and precision (the rules of
    planner/megatron/rules.py at plan level), or that do nothing for this model."""
    if plan.recompute != "selective" or plan.recompute_modules is None:
        return []
    applies = applicable_recompute_modules(model)
    allowed = ", ".join(n for n, why in applies.items() if why is None)
    reasons = [f"recompute_modules: {name} {why}; allowed for {model.name}: {allowed}" for name, why in applies.items()
               if why is not None and name in plan.recompute_modules]
    if job.dtype == "fp8":
        bad = [n for n in plan.recompute_modules if n in FP8_DELAYED_NO_RECOMPUTE]
        if bad:
            reasons.append(f"recompute_modules: {' and '.join(bad)} cannot be recomputed under FP8 delayed "
                           "scaling (dtype fp8); use fp8-cs or drop them")
    return reasons


def launch_refusals(plan: Plan, model: ModelSpec, job: JobSpec, system: SystemSpec) -> list[str]:
    """Why `planner megatron` must not emit this plan for this system (empty = emit): plan-level
    rules, torchrun geometry, precision the GPU lacks, and overlap Megatron-FSDP would force."""
    reasons = not_expressible(plan, model, job) + launch_problems(plan, system)
    arch, need = compute_capability(system), PRECISION_MIN_ARCH[job.dtype]
    if arch < need:
        reasons.append(f"dtype: {job.dtype} needs compute capability {need:.1f} or newer; "
                       f"{system.accelerator.name} is {arch_text(system)}")
    if job.flash_attention and arch < FUSED_ATTENTION_MIN_ARCH:
        # the launch would say --attention-backend fused, which no kernel runs there
        reasons.append(f"flash_attention: the plan was costed with fused attention, which needs compute capability "
                       f"{FUSED_ATTENTION_MIN_ARCH:.1f} or newer (cuDNN fused attention, FlashAttention-2); "
                       f"{system.accelerator.name} is {arch_text(system)}: cost it with --no-flash-attention")
    if plan.recompute == "selective" and "moe_act" in (plan.recompute_modules or ()) and not grouped_gemm(system):
        reasons.append(f"recompute_modules: moe_act needs the grouped expert GEMM, which needs compute capability "
                       f"{GROUPED_GEMM_MIN_ARCH}.0 or newer; {system.accelerator.name} is {arch_text(system)}")
    # the launch keeps 16-bit parameters beside fp32 master weights whatever the costing said
    # (a plan file's job.bytes_per_param): a plan costed otherwise is not what Megatron would run
    for field, runs in (("weights", 2.0), ("master", 4.0)):
        if getattr(job.bytes_per_param, field) != runs:
            reasons.append(f"bytes_per_param.{field}: the plan was costed with {getattr(job.bytes_per_param, field):g} "
                           f"B per parameter; Megatron's launch keeps {runs:g} ({'bf16/fp16 parameters' if runs == 2 else 'fp32 master weights'})")
    return reasons


def grouped_gemm(system: SystemSpec) -> bool:
    """Whether Megatron runs the experts as grouped GEMMs on this GPU (--moe-grouped-gemm: Ampere
    and later); before, one GEMM per expert, and no moe_act recompute (rules.MSG_MOE_ACT_GROUPED)."""
    return gpu_arch_major(system) >= GROUPED_GEMM_MIN_ARCH


def launch_problems(plan: Plan, system: SystemSpec) -> list[str]:
    """torchrun needs the same process count on every node and enough GPUs."""
    problems = []
    if plan.gpus > system.num_gpus:
        problems.append(f"the plan needs {plan.gpus} GPUs but the system has {system.num_gpus}")
    if plan.gpus > system.gpus_per_node and plan.gpus % system.gpus_per_node:
        problems.append(f"torchrun: {plan.gpus} GPUs is not a whole number of "
                        f"{system.gpus_per_node}-GPU nodes")
    return problems


# Per-layer CUDA graphs (--cuda-graph-impl transformer_engine --cuda-graph-modules), as
# megatron-core 0.19.2 transformer_config.py __post_init__ checks them.
def has_dense_mlp_layers(model: ModelSpec) -> bool:
    """Whether any layer has a dense MLP (what an `mlp` CUDA graph captures): every layer of a
    dense transformer, a MoE model's leading or interleaved dense layers, a hybrid stack's '-' blocks."""
    return model.moe is None or model.dense_layers > 0 or "-" in (model.hybrid_pattern or "")


def graph_job_refusals(model: ModelSpec, job: JobSpec) -> list[str]:
    """What no plan of this job can run with its cuda_graph_modules (model and dispatcher rules)."""
    mods = set(job.cuda_graph_modules)
    if not mods or job.full_iteration_cuda_graph:
        return []
    out = []
    if model.moe is None and mods & {"moe", "moe_router", "moe_preprocess"}:
        out.append("cuda_graph_modules: moe / moe_router / moe_preprocess need a MoE model")
    if "mamba" in mods and model.mamba is None:
        out.append("cuda_graph_modules: mamba captures Mamba blocks, which this model has none of")
    if "mlp" in mods and not has_dense_mlp_layers(model):
        out.append("cuda_graph_modules: mlp captures dense layers, which this MoE model has none of")
    if "moe" in mods:
        out.append("cuda_graph_modules: moe (the whole MoE layer) needs drop-and-pad experts "
                   "(--moe-pad-expert-input-to-capacity), which a plan does not launch")
    if "moe_preprocess" in mods and "moe_router" not in mods:
        out.append("cuda_graph_modules: moe_preprocess needs moe_router")
    if "moe_preprocess" in mods and model.moe is not None and model.moe.capacity_factor is not None:
        out.append("cuda_graph_modules: moe_preprocess cannot be captured with a capacity factor "
                   "(device-to-host copies in the preprocess)")
    return out


def graph_option_refusals(recompute: str, modules: tuple[str, ...], offload_activations: float,
                          moe_a2a_overlap: bool, model: ModelSpec, job: JobSpec, zero_stage: int = 0) -> list[str]:
    """What a plan's memory/overlap options cannot be with the job's per-layer CUDA graphs."""
    mods = set(job.cuda_graph_modules)
    if not mods or job.full_iteration_cuda_graph:
        return []
    out = []
    if recompute == "full":
        out.append("recompute: full recompute runs only with a full-iteration CUDA graph, not per-layer graphs")
    if offload_activations > 0:
        out.append("offload_activations: CPU offloading does not run with per-layer CUDA graphs")
    if moe_a2a_overlap and mods & {"mlp", "moe"}:
        out.append("moe_a2a_overlap: per-layer graphs of mlp / moe do not run with the all-to-all overlap")
    if moe_a2a_overlap and zero_stage >= 2:
        # core/distributed/fsdp/mcore_fsdp_adapter.py asserts it when it wraps the model: "1F1B
        # overlap with FSDP does not support per-layer CUDA graphs" (PyTorch FSDP2 has no expert
        # parallelism in Megatron, so no overlap either)
        out.append(f"moe_a2a_overlap: Megatron-FSDP (zero_stage {zero_stage}) runs the all-to-all overlap only "
                   "without per-layer CUDA graphs")
    if moe_a2a_overlap and ("attn" in mods or ("moe_router" in mods and model.moe is not None
                                               and model.moe.shared_experts)):
        # the overlap delays the weight gradients (--delay-wgrad-compute) into the graphed module
        out.append("moe_a2a_overlap: with an attn (or, with shared experts, moe_router) CUDA graph the "
                   "delayed weight gradients run inside the graph, which Megatron allows only with "
                   "Transformer Engine >= 2.12 (the launch targets megatron-core 0.19.2 with TE 2.10)")
    if recompute == "selective":
        if "moe" in modules and "moe_router" in mods:
            out.append("recompute_modules: moe recompute does not run with a moe_router CUDA graph")
        # graphed recompute cannot draw random numbers: no dropout inside a graphed recomputed module
        if model.dropout and (("core_attn" in modules and "attn" in mods) or ("mlp" in modules and "mlp" in mods)):
            out.append("recompute_modules: a graphed module with dropout cannot be recomputed")
    return out


def graph_pin_refusals(pins: dict, model: ModelSpec, job: JobSpec) -> list[str]:
    """The per-layer CUDA graph rules that the job's pins alone break (no plan could satisfy them)."""
    modules = pins.get("recompute_modules") or (DEFAULT_RECOMPUTE_MODULES if pins.get("recompute") == "selective" else ())
    return graph_job_refusals(model, job) + graph_option_refusals(
        pins.get("recompute", "none"), tuple(modules), pins.get("offload_activations") or 0.0,
        bool(pins.get("moe_a2a_overlap")), model, job, pins.get("zero_stage") or 0)
