"""Plan -> Megatron-LM launch arguments for `pretrain_gpt.py`, plus the checks Megatron runs on them.

Every flag and every message below comes from `shared/reference/megatron_args.md` (abbreviated
"MA" in comments, e.g. "MA 2a" is its section 2a). Flags that do NOT exist in Megatron-LM and are
never emitted: --virtual-pipeline-model-parallel-size, --fp8, --cpu-offloading,
--overlap-p2p-communication (MA 0).

Public API
  megatron_args(plan, model, job, system) -> MegatronLaunch
  not_expressible(plan, model, job) -> list[str]          (fast; used by the search)
  launch_problems(plan, system) -> list[str]               (the torchrun side)
  validate_megatron_args(args, world_size, env, gpu_arch_major=9) -> list[str]
  render(launch, format='script'|'args'|'json') -> str
"""
from __future__ import annotations

import argparse
import json
import math
import shlex
from dataclasses import dataclass, field
from typing import Iterable, Literal, Mapping

from hardware.spec import SystemSpec
from planner.model import ModelSpec
from planner.plan import JobSpec, Plan

ENTRYPOINT = "pretrain_gpt.py"
MASTER_PORT = 6000

# Flags that Megatron-LM does not accept (MA 0); a test checks none is ever emitted.
NONEXISTENT_FLAGS = ("--virtual-pipeline-model-parallel-size", "--fp8", "--cpu-offloading",
                     "--overlap-p2p-communication")

Arg = tuple[str, str | None]


@dataclass
class MegatronLaunch:
    """Ordered `pretrain_gpt.py` flags (value None = store_true flag), env and torchrun geometry."""

    args: list[Arg]
    env: dict[str, str] = field(default_factory=dict)
    nnodes: int = 1
    gpus_per_node: int = 1          # torchrun --nproc-per-node
    world_size: int = 1
    entrypoint: str = ENTRYPOINT
    notes: list[str] = field(default_factory=list)

    def argv(self) -> list[str]:
        out: list[str] = []
        for flag, value in self.args:
            out.append(flag)
            if value is not None:
                out.append(value)
        return out

    def flags(self) -> list[str]:
        return [flag for flag, _ in self.args]

    def value(self, flag: str) -> str | None:
        for f, v in self.args:
            if f == flag:
                return v
        raise KeyError(flag)


# ---------------------------------------------------------------------------------------------
# What a plan cannot be in Megatron
# ---------------------------------------------------------------------------------------------

def _cpu_offload_layers(plan: Plan, model: ModelSpec) -> int:
    k = round(plan.offload_activations * model.layers)
    return min(max(k, 1), model.layers - 1)


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
    if plan.offload_optimizer > 0 and plan.zero_stage != 1:
        # MA 3: --optimizer-cpu-offload goes with the distributed optimizer.
        reasons.append("offload_optimizer: --optimizer-cpu-offload needs the distributed optimizer "
                       f"(zero_stage 1), got zero_stage {plan.zero_stage}")
    if plan.vpp > 1:
        # MA 2a: interleaving needs pp > 1; MA 2c: microbatches >= pp and a multiple of pp.
        if plan.pp == 1:
            reasons.append("vpp: the interleaved schedule needs pp > 1")
        else:
            m = plan.num_microbatches
            if m < plan.pp or m % plan.pp:
                reasons.append(f"vpp: the interleaved schedule needs the number of microbatches ({m}) "
                               f"to be >= pp and a multiple of pp ({plan.pp})")
    if layers % (plan.pp * plan.vpp):
        reasons.append(f"layers ({layers}) must be divisible by pp*vpp ({plan.pp}*{plan.vpp})")
    if model.heads % plan.tp:  # MA 2b
        reasons.append(f"heads ({model.heads}) must be a multiple of tp ({plan.tp})")
    g = model.kv_groups
    if g < model.heads and g % plan.tp and plan.tp % g:  # MA 2b
        reasons.append(f"query_groups ({g}) must be a multiple or divisor of tp ({plan.tp})")
    if plan.cp > 1 and model.seq_length % (2 * plan.cp):  # MA 2a
        reasons.append(f"seq_length ({model.seq_length}) must be a multiple of 2*cp ({2 * plan.cp})")
    if plan.ep > 1:  # MA 2a, 2c (expert grid; etp defaults to tp)
        if model.moe is None:
            reasons.append("ep: expert parallelism needs a MoE model")
        elif model.moe.num_experts % plan.ep:
            reasons.append(f"ep: experts ({model.moe.num_experts}) must be a multiple of ep ({plan.ep})")
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
    if plan.moe_dispatcher == "deepep" and model.moe is None:
        reasons.append("moe_dispatcher: deepep needs a MoE model")
    if model.moe is not None and plan.tp > 1 and not plan.sequence_parallel:
        # Megatron-core MoE: "When using MoE and tensor parallelism, sequence parallelism must be
        # used." (not in MA; kept as a conservative rule for emission only).
        reasons.append("sequence_parallel: Megatron MoE layers with tp > 1 need sequence_parallel")
    if plan.tp_comm_overlap and plan.tp > 1 and not plan.sequence_parallel:  # MA 2a
        reasons.append("tp_comm_overlap: Megatron overlaps TP communication only with sequence_parallel")
    return reasons


def launch_problems(plan: Plan, system: SystemSpec) -> list[str]:
    """torchrun needs the same process count on every node and enough GPUs."""
    problems = []
    if plan.gpus > system.num_gpus:
        problems.append(f"the plan needs {plan.gpus} GPUs but the system has {system.num_gpus}")
    if plan.gpus > system.gpus_per_node and plan.gpus % system.gpus_per_node:
        problems.append(f"torchrun: {plan.gpus} GPUs is not a whole number of "
                        f"{system.gpus_per_node}-GPU nodes")
    return problems


# ---------------------------------------------------------------------------------------------
# Emission (MA 3)
# ---------------------------------------------------------------------------------------------

def _pre_blackwell(system: SystemSpec) -> bool:
    name = system.accelerator.name.upper()
    return not (name.startswith("B") or name.startswith("GB"))


def megatron_args(plan: Plan, model: ModelSpec, job: JobSpec, system: SystemSpec) -> MegatronLaunch:
    """The Megatron-LM flags, env and torchrun geometry for `plan`. It does not refuse plans: call
    `not_expressible` (and `validate_megatron_args` on the result) to know whether Megatron will
    accept them."""
    a: list[Arg] = []

    def add(flag: str, value: object = None) -> None:
        a.append((flag, None if value is None else str(value)))

    # Model shape (MA 1).
    add("--num-layers", model.layers)
    add("--hidden-size", model.hidden)
    add("--ffn-hidden-size", model.ffn_hidden)
    add("--num-attention-heads", model.heads)
    if model.kv_groups < model.heads:
        add("--group-query-attention")  # MA 0.4: --num-query-groups is ignored without it
        add("--num-query-groups", model.kv_groups)
    add("--seq-length", model.seq_length)
    add("--max-position-embeddings", model.seq_length)
    if model.position_embedding == "rope":
        add("--position-embedding-type", "rope")
    if model.activation == "swiglu":
        add("--swiglu")
    elif model.activation == "squared_relu":
        add("--squared-relu")
    if not model.biases:
        add("--normalization", "RMSNorm")
        add("--disable-bias-linear")
    if not model.tied_embeddings:
        add("--untie-embeddings-and-output-weights")
    if model.moe is not None:
        add("--num-experts", model.moe.num_experts)
        add("--moe-router-topk", model.moe.top_k)
        add("--moe-ffn-hidden-size", model.expert_ffn_hidden)

    # Parallelism (MA 3): DP is derived by Megatron from WORLD_SIZE, never emitted.
    add("--tensor-model-parallel-size", plan.tp)
    add("--pipeline-model-parallel-size", plan.pp)
    if plan.vpp > 1:
        add("--num-virtual-stages-per-pipeline-rank", plan.vpp)  # never also the per-stage form
    if plan.cp > 1:
        add("--context-parallel-size", plan.cp)
    if model.moe is not None or plan.ep > 1:
        add("--expert-model-parallel-size", plan.ep)
        if plan.expert_tp != plan.tp:  # None = tp, Megatron's default
            add("--expert-tensor-parallel-size", plan.expert_tp)
    sp = plan.sequence_parallel and plan.tp > 1  # MA 2a: SP at tp=1 is dropped by Megatron
    if sp:
        add("--sequence-parallel")

    # Batch.
    add("--micro-batch-size", plan.micro_batch)
    add("--global-batch-size", plan.global_batch)

    # Recompute (MA 1, 3): block recomputes k layers per (virtual) pipeline stage.
    if plan.recompute == "selective":
        add("--recompute-granularity", "selective")
    elif plan.recompute == "full":
        per_stage = max(model.layers // (plan.pp * plan.vpp), 1)
        if plan.recompute_num_layers is None:
            k = per_stage
        else:  # the Plan counts per pipeline stage; Megatron counts per virtual stage
            k = min(math.ceil(plan.recompute_num_layers / plan.vpp), per_stage)
        add("--recompute-granularity", "full")
        add("--recompute-method", "block")
        add("--recompute-num-layers", k)

    # Optimizer sharding and DP overlap (MA 1, 2a).
    torch_fsdp2 = plan.dp_impl == "torch-fsdp2"
    fsdp = plan.zero_stage >= 2 and not torch_fsdp2
    dist_opt = plan.zero_stage == 1
    if dist_opt:
        add("--use-distributed-optimizer")
    if fsdp:
        add("--use-megatron-fsdp")
        add("--data-parallel-sharding-strategy",
            "optim_grads_params" if plan.zero_stage == 3 else "optim_grads")
        add("--ckpt-format", "fsdp_dtensor")  # Megatron FSDP checkpoints only in this format
    if torch_fsdp2:
        add("--use-torch-fsdp2")
        add("--ckpt-format", "torch_dist")  # --use-torch-fsdp2 requires torch_dist or torch_dcp
    if plan.moe_dispatcher == "deepep":  # megatron-core 0.19: flex dispatcher, DeepEP backend
        add("--moe-token-dispatcher-type", "flex")
        add("--moe-flex-dispatcher-backend", "deepep")
    if plan.dp_comm_overlap:
        add("--overlap-grad-reduce")
        if dist_opt:
            add("--overlap-param-gather")
    if plan.tp_comm_overlap and sp:
        add("--tp-comm-overlap")

    # Offload (MA 1, 2a, 2b).
    if plan.offload_activations > 0:
        add("--cpu-offloading-num-layers", _cpu_offload_layers(plan, model))
    if plan.offload_optimizer > 0:
        add("--optimizer-cpu-offload")
        add("--use-precision-aware-optimizer")
        add("--optimizer-offload-fraction", f"{plan.offload_optimizer:g}")

    # Precision (MA 1, 3).
    if job.dtype == "fp16":
        add("--fp16")
    else:
        add("--bf16")
    if job.dtype == "fp8":
        add("--fp8-format", "hybrid")
        add("--fp8-recipe", "delayed")

    env: dict[str, str] = {}
    # MA 2a: required when tp>1 or cp>1 before Blackwell, except with FSDP (which wants it unset).
    if (plan.tp > 1 or plan.cp > 1) and _pre_blackwell(system) and not fsdp:
        env["CUDA_DEVICE_MAX_CONNECTIONS"] = "1"

    gpus = plan.gpus
    notes = []
    if plan.offload_weights > 0:
        notes.append("offload_weights is not expressible in Megatron-LM and was left out")
    return MegatronLaunch(args=a, env=env, nnodes=math.ceil(gpus / system.gpus_per_node),
                          gpus_per_node=min(gpus, system.gpus_per_node), world_size=gpus,
                          notes=notes)


# ---------------------------------------------------------------------------------------------
# Validation: Megatron's own rules, on the emitted argument list
# ---------------------------------------------------------------------------------------------

class _ArgError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse would print and exit(2)
        raise _ArgError(message)


def _build_parser() -> _Parser:
    # Megatron's parser is built with allow_abbrev=False: `--fp8` is NOT `--fp8-format`.
    p = _Parser(prog=ENTRYPOINT, allow_abbrev=False, add_help=False)
    flag = lambda name: p.add_argument(name, action="store_true")  # noqa: E731
    for name in ("--group-query-attention", "--swiglu", "--squared-relu", "--disable-bias-linear",
                 "--untie-embeddings-and-output-weights", "--sequence-parallel",
                 "--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather",
                 "--tp-comm-overlap", "--optimizer-cpu-offload", "--use-precision-aware-optimizer",
                 "--bf16", "--fp16", "--use-megatron-fsdp", "--use-torch-fsdp2", "--mock-data"):
        flag(name)
    p.add_argument("--no-overlap-p2p-communication", dest="overlap_p2p_comm", action="store_false")
    ints = {"--num-layers": None, "--hidden-size": None, "--ffn-hidden-size": None,
            "--num-attention-heads": None, "--num-query-groups": 1, "--kv-channels": None,
            "--seq-length": None, "--max-position-embeddings": None, "--num-experts": None,
            "--moe-router-topk": 2, "--moe-ffn-hidden-size": None, "--expert-model-parallel-size": 1,
            "--expert-tensor-parallel-size": None, "--tensor-model-parallel-size": 1,
            "--pipeline-model-parallel-size": 1, "--num-layers-per-virtual-pipeline-stage": None,
            "--num-virtual-stages-per-pipeline-rank": None,
            "--microbatch-group-size-per-virtual-pipeline-stage": None,
            "--decoder-first-pipeline-num-layers": None, "--decoder-last-pipeline-num-layers": None,
            "--context-parallel-size": 1, "--micro-batch-size": None, "--global-batch-size": None,
            "--recompute-num-layers": None, "--cpu-offloading-num-layers": 0, "--vocab-size": None,
            "--make-vocab-size-divisible-by": 128}
    for name, default in ints.items():
        p.add_argument(name, type=int, default=default)
    choices = {"--recompute-granularity": ("full", "selective"),
               "--recompute-method": ("uniform", "block"),
               "--normalization": ("LayerNorm", "RMSNorm"),
               "--position-embedding-type": ("learned_absolute", "rope", "yarn", "mrope", "relative",
                                             "none"),
               "--data-parallel-sharding-strategy": ("no_shard", "optim", "optim_grads",
                                                     "optim_grads_params"),
               "--fp8-format": ("e4m3", "hybrid"),
               "--moe-token-dispatcher-type": ("allgather", "alltoall", "flex"),
               "--moe-flex-dispatcher-backend": ("deepep", "hybridep", "ncclep"),
               "--fp8-recipe": ("tensorwise", "delayed", "mxfp8", "blockwise", "custom")}
    for name, allowed in choices.items():
        p.add_argument(name, choices=allowed, default=None)
    p.add_argument("--optimizer-offload-fraction", type=float, default=1.0)
    # Free-form values (placeholders in the script may hold unexpanded "$VARS").
    for name in ("--pipeline-model-parallel-layout", "--ckpt-format", "--tokenizer-type",
                 "--tokenizer-model", "--split", "--train-iters", "--lr"):
        p.add_argument(name, default=None)
    p.add_argument("--data-path", nargs="*", default=None)
    return p


_PARSER = _build_parser()

# Messages (MA sections given where each is checked).
MSG_VPP_ONE_OF = ("No more than one of the following arguments can be set at the same time: "
                  "--num-layers-per-virtual-pipeline-stage, --num-virtual-stages-per-pipeline-rank,"
                  "--pipeline-model-parallel-layout. ")
MSG_VPP_UNEVEN = ("please use --num-virtual-stages-per-pipeline-rank to specify virtual pipeline "
                  "parallel degree when enable uneven pipeline parallelism")
MSG_VPP_LAYERS_PP = "number of layers of the model must be divisible pipeline model parallel size"
MSG_VPP_LAYERS_STAGE = ("number of layers per pipeline stage must be divisible number of layers per "
                        "virtual pipeline stage")
MSG_LAYERS_PP = "Number of layers should be divisible by the pipeline-model-parallel size"
MSG_INTERLEAVED_PP = ("When interleaved schedule is used, pipeline-model-parallel size should be "
                      "greater than 1")
MSG_INTERLEAVED_PP_NO_OVERLAP = (
    "When interleaved schedule is used and p2p communication overlap is disabled, "
    "pipeline-model-parallel size should be greater than 2 to avoid having multiple "
    "p2p sends and recvs between same 2 ranks per communication batch")
MSG_PARAM_GATHER_DISTOPT = ("--overlap-param-gather only supported with distributed optimizer, "
                            "megatron fsdp, or dist_muon")
MSG_PARAM_GATHER_GRAD_REDUCE = "Must use --overlap-param-gather with --overlap-grad-reduce"
MSG_FP16_BF16 = "--fp16 and --bf16 are mutually exclusive (bare `assert not args.bf16` in Megatron)"
MSG_CP_SEQ = "seq-length should be a multiple of 2 * context-parallel-size if context-parallel-size > 1."
MSG_RECOMPUTE_SELECTIVE_METHOD = ("recompute method is not yet supported for selective recomputing "
                                  "granularity")
MSG_TP_COMM_OVERLAP = ("Tensor parallel communication/GEMM overlap can happen only when sequence "
                       "parallelism is enabled")
MSG_CUDA_MAX_CONN = ("Using tensor model parallelism or context parallelism require setting the "
                     "environment variable CUDA_DEVICE_MAX_CONNECTIONS to 1")
MSG_FSDP_MAX_CONN = "FSDP always requires CUDA_DEVICE_MAX_CONNECTIONS value large than one"
MSG_EP_NEEDS_EXPERTS = "num_experts must be non None to use expert model parallelism"
MSG_EXPERTS_EP = "Number of experts should be a multiple of expert model parallel_size."
MSG_OPT_OFFLOAD = ("The optimizer cpu offload must be used in conjunction with "
                   "`--use-precision-aware-optimizer`, as the hybrid device optimizer reuses the "
                   "code path of this flag.")
MSG_CPU_OFFLOAD_PP = "Currently there is no support for Pipeline parallelism with CPU offloading"
MSG_CPU_OFFLOAD_RECOMPUTE = "CPU offloading does not work when activation recomputation is enabled"


def _to_argv(args: Iterable[str] | Mapping[str, object] | MegatronLaunch) -> list[str]:
    if isinstance(args, MegatronLaunch):
        return args.argv()
    if isinstance(args, Mapping):
        argv: list[str] = []
        for key, value in args.items():
            flag = key if key.startswith("-") else "--" + key.replace("_", "-")
            if value is False:
                continue
            argv.append(flag)
            if value is None or value is True:
                continue
            if isinstance(value, (list, tuple)):
                argv.extend(str(v) for v in value)
            else:
                argv.append(str(value))
        return argv
    argv = []
    for item in args:
        if isinstance(item, tuple):
            argv.append(item[0])
            if item[1] is not None:
                argv.append(str(item[1]))
        else:
            argv.append(str(item))
    return argv


def parse_megatron_args(args) -> argparse.Namespace:
    """Parse with the supported flags; raises ValueError with argparse's message."""
    argv = _to_argv(args)
    try:
        ns, extras = _PARSER.parse_known_args(argv)
    except _ArgError as err:
        raise ValueError(str(err)) from None
    if extras:
        raise ValueError("unrecognized arguments: " + " ".join(extras))
    return ns


def validate_megatron_args(args, world_size: int, env: Mapping[str, str] | None = None,
                           gpu_arch_major: int = 9) -> list[str]:
    """Megatron's checks (MA 2a validate_args, 2b TransformerConfig, 2c runtime) on an argument
    list or {flag: value} dict. Returns the violated messages; empty means Megatron accepts it."""
    env = env or {}
    try:
        a = parse_megatron_args(args)
    except ValueError as err:  # argparse exits before any other check runs
        return [str(err)]
    errors: list[str] = []
    err = errors.append

    for name in ("num_layers", "hidden_size", "num_attention_heads", "max_position_embeddings"):
        if getattr(a, name) is None:  # MA 2a required args
            err(f"{name} argument is None")
    if a.micro_batch_size is None:  # MA 2a (bare assert)
        err("micro_batch_size argument is None")
    if errors:
        return errors

    tp, pp, cp = a.tensor_model_parallel_size, a.pipeline_model_parallel_size, a.context_parallel_size
    layers = a.num_layers

    # MA 2a: world size and DP; CP counts toward the model size.
    total_model_size = tp * pp * cp
    dp = None
    if world_size % total_model_size:
        err(f"world size ({world_size}) is not divisible by total_model_size ({total_model_size=})")
    else:
        dp = world_size // total_model_size

    # MA 2a / microbatch calculator: GBS % (mbs * dp).
    num_microbatches = None
    if dp is not None:
        gbs = a.global_batch_size if a.global_batch_size is not None else a.micro_batch_size * dp
        mbs_dp = a.micro_batch_size * dp
        if gbs % mbs_dp:
            err(f"global batch size ({gbs}) is not divisible by micro batch size "
                f"({a.micro_batch_size}) times data parallel size ({dp})")
        else:
            num_microbatches = gbs // mbs_dp

    # MA 2a: virtual pipeline.
    vpp_sources = [a.num_layers_per_virtual_pipeline_stage, a.num_virtual_stages_per_pipeline_rank,
                   a.pipeline_model_parallel_layout]
    uneven = (a.decoder_first_pipeline_num_layers is not None
              or a.decoder_last_pipeline_num_layers is not None)
    vpp = None
    if sum(v is not None for v in vpp_sources) > 1:
        err(MSG_VPP_ONE_OF)
    elif a.pipeline_model_parallel_layout is not None:
        vpp = None  # the layout string is not interpreted here
    elif a.num_layers_per_virtual_pipeline_stage is not None:
        if uneven:
            err(MSG_VPP_UNEVEN)
        elif layers % pp:
            err(MSG_VPP_LAYERS_PP)
        elif (layers // pp) % a.num_layers_per_virtual_pipeline_stage:
            err(MSG_VPP_LAYERS_STAGE)
        else:
            vpp = (layers // pp) // a.num_layers_per_virtual_pipeline_stage
    elif a.num_virtual_stages_per_pipeline_rank is not None:
        vpp = a.num_virtual_stages_per_pipeline_rank
        # MA 2a leaves layers % (pp*vpp) to TransformerConfig / layout code.
        if not uneven and layers % (pp * vpp):
            err(f"number of layers ({layers}) must be divisible by pipeline-model-parallel size "
                f"times virtual stages per pipeline rank ({pp}*{vpp})")
    elif not uneven and layers % pp:
        err(MSG_LAYERS_PP)
    if vpp == 1:  # MA 2a: VPP == 1 is normalised to None
        vpp = None
    if vpp is not None:
        if a.overlap_p2p_comm and pp <= 1:
            err(MSG_INTERLEAVED_PP)
        elif not a.overlap_p2p_comm and pp <= 2:
            err(MSG_INTERLEAVED_PP_NO_OVERLAP)
        # MA 2c: interleaved schedule at run time; N defaults to PP.
        if pp > 1 and num_microbatches is not None:
            n = a.microbatch_group_size_per_virtual_pipeline_stage or pp
            if n > num_microbatches or n < pp:
                err("The number of contiguous micro-batches in a virtual pipeline stage"
                    f"should range in [PP={pp} , M={num_microbatches}]")
            else:
                final = num_microbatches % n
                if 0 < final < pp:
                    err("The remainder of M (the total micro-batches) divided by N (number of "
                        "contiguous micro-batches in a virtual pipeline stage) should be 0, "
                        "or larger than or equal to the pipeline-parallel size, but it is "
                        f"{final}. Otherwise, it introduces dependency bubbles in the pipeline "
                        "and reduces throughput.")

    # MA 2a: DP overlap.
    if a.overlap_param_gather:
        if not (a.use_distributed_optimizer or a.use_megatron_fsdp):
            err(MSG_PARAM_GATHER_DISTOPT)
        if not a.overlap_grad_reduce:
            err(MSG_PARAM_GATHER_GRAD_REDUCE)

    # MA 2a: fp16 and bf16 are mutually exclusive.
    if a.fp16 and a.bf16:
        err(MSG_FP16_BF16)

    # MA 2a: heads and hidden (bare assert, only without --kv-channels).
    if a.kv_channels is None and a.hidden_size % a.num_attention_heads:
        err(f"hidden_size ({a.hidden_size}) must be divisible by num_attention_heads "
            f"({a.num_attention_heads}) (bare assert in Megatron)")

    # MA 2a: CP and sequence length; positions.
    if a.seq_length is not None and cp > 1 and a.seq_length % (2 * cp):
        err(MSG_CP_SEQ)
    if a.seq_length is not None and a.max_position_embeddings < a.seq_length:
        err(f"max_position_embeddings ({a.max_position_embeddings}) must be greater than or equal "
            f"to seq_length ({a.seq_length}).")

    # MA 2a: recompute.
    if a.recompute_granularity == "selective" and a.recompute_method is not None:
        err(MSG_RECOMPUTE_SELECTIVE_METHOD)

    # MA 2a: SP with tp == 1 is silently dropped, then TP comm overlap needs SP.
    sequence_parallel = a.sequence_parallel and tp > 1
    if a.tp_comm_overlap and not sequence_parallel:
        err(MSG_TP_COMM_OVERLAP)

    # MA 2a: CUDA_DEVICE_MAX_CONNECTIONS before Blackwell, unless FSDP.
    if (tp > 1 or cp > 1) and gpu_arch_major < 10 and not a.use_megatron_fsdp:
        if env.get("CUDA_DEVICE_MAX_CONNECTIONS") != "1":
            err(MSG_CUDA_MAX_CONN)
    # Megatron-FSDP asserts the opposite (validate_args, Megatron FSDP block; not in MA).
    if a.use_megatron_fsdp and env.get("CUDA_DEVICE_MAX_CONNECTIONS") == "1":
        err(MSG_FSDP_MAX_CONN)

    # MA 2a: MoE.
    ep = a.expert_model_parallel_size
    if ep > 1:
        if a.num_experts is None:
            err(MSG_EP_NEEDS_EXPERTS)
        elif a.num_experts % ep:
            err(MSG_EXPERTS_EP)

    # MA 2a: optimizer CPU offload.
    if a.optimizer_cpu_offload and not a.use_precision_aware_optimizer:
        err(MSG_OPT_OFFLOAD)

    # MA 2b: TransformerConfig.
    if a.num_attention_heads % tp:
        err(f"num_attention_heads ({a.num_attention_heads}) must be a multiple of "
            f"tensor_model_parallel_size ({tp}).")
    if a.group_query_attention:  # MA 0.4: the groups only count with --group-query-attention
        g = a.num_query_groups
        if g % tp and tp % g:
            err(f"num_query_groups ({g}) must be a multiple or divisor of "
                f"tensor_model_parallel_size ({tp}).")
    if a.cpu_offloading_num_layers > 0:  # MA 2a: this turns cpu_offloading on
        if a.cpu_offloading_num_layers >= layers:
            err(f"CPU offloading can be done only for layers less than {layers}")
        if pp > 1:
            err(MSG_CPU_OFFLOAD_PP)
        if a.recompute_granularity is not None:
            err(MSG_CPU_OFFLOAD_RECOMPUTE)
    g = a.recompute_granularity
    if g == "full" and a.recompute_method is None:
        err(f'Using recompute_granularity: {g} so recompute_method must be "block" or "uniform"')
    if g == "full" and a.recompute_num_layers is None:
        err(f"When using recompute_granularity: {g} recompute_num_layers must be between "
            f"1 and num_layers_per_pipeline_rank: {layers // pp}")
    elif g == "selective" and a.recompute_num_layers is not None:
        err(f"When using recompute_granularity: {g} recompute_num_layers must be None.")

    # MA 2c: expert grid (etp defaults to tp).
    etp = a.expert_tensor_parallel_size or tp
    grid = etp * ep * pp
    if world_size % grid:
        err(f"world_size ({world_size}) is not divisible by expert_tensor_model_pipeline_parallel "
            f"size ({grid})")
    return errors


def validate_launch(launch: MegatronLaunch, gpu_arch_major: int = 9) -> list[str]:
    return validate_megatron_args(launch.argv(), launch.world_size, launch.env, gpu_arch_major)


def gpu_arch_major(system: SystemSpec) -> int:
    """Compute-capability major of the accelerator, from its name (A100 8, H100/H200/GH200 9,
    B200/GB200 10)."""
    name = system.accelerator.name.upper()
    if name.startswith(("B", "GB")):
        return 10
    if name.startswith("A"):
        return 8
    return 9


# ---------------------------------------------------------------------------------------------
# Rendering
# ---------------------------------------------------------------------------------------------

# Data, tokenizer and schedule are not part of a plan: the script leaves them as shell variables.
PLACEHOLDER_VARS = {
    "DATA_PATH": "${DATA_PATH:?set DATA_PATH to a Megatron .bin/.idx prefix}",
    "TOKENIZER_TYPE": "${TOKENIZER_TYPE:-NullTokenizer}",
    "TRAIN_ITERS": "${TRAIN_ITERS:-1000}",
    "LR": "${LR:-1.0e-4}",
}


def _placeholders(vocab_size: int | None) -> list[tuple[str, str]]:
    out = [("--data-path", '"$DATA_PATH"'), ("--split", "949,50,1"),
           ("--tokenizer-type", '"$TOKENIZER_TYPE"')]
    if vocab_size is not None:
        out.append(("--vocab-size", str(vocab_size)))
    out += [("--train-iters", '"$TRAIN_ITERS"'), ("--lr", '"$LR"')]
    return out


def render(launch: MegatronLaunch, format: Literal["args", "script", "json"] = "script",
           vocab_size: int | None = None) -> str:
    """'args': one line of flags; 'json': a dict; 'script': a ready-to-run bash script.
    `vocab_size` (the model's) goes into the script's tokenizer placeholders."""
    if format == "args":
        return shlex.join(launch.argv())
    if format == "json":
        return json.dumps({
            "entrypoint": launch.entrypoint, "env": launch.env, "nnodes": launch.nnodes,
            "nproc_per_node": launch.gpus_per_node, "world_size": launch.world_size,
            "args": {f: (True if v is None else v) for f, v in launch.args},
            "argv": launch.argv(), "notes": launch.notes,
        }, indent=2)
    if format != "script":
        raise ValueError(f"format: unknown {format!r}; allowed: args, script, json")
    lines = ["#!/usr/bin/env bash",
             "# Megatron-LM launch generated by `planner megatron`. Run it from the Megatron-LM",
             "# checkout on each of the nodes, with NODE_RANK and MASTER_ADDR set.",
             "set -euo pipefail", ""]
    lines += [f"# NOTE: {notice}" for notice in launch.notes]
    lines += [f"export {key}={shlex.quote(value)}" for key, value in launch.env.items()]
    lines += ['NODE_RANK="${NODE_RANK:-0}"', 'MASTER_ADDR="${MASTER_ADDR:-localhost}"', "",
              "# PLACEHOLDERS: data, tokenizer and schedule are not part of the plan; replace them",
              "# (e.g. TOKENIZER_TYPE=HuggingFaceTokenizer plus --tokenizer-model) for a real run."]
    lines += [f'{key}="{value}"' for key, value in PLACEHOLDER_VARS.items()]
    lines.append("")
    body = [f"torchrun --nnodes {launch.nnodes} --nproc-per-node {launch.gpus_per_node} "
            f"--node-rank $NODE_RANK --master-addr $MASTER_ADDR --master-port {MASTER_PORT} "
            f"{launch.entrypoint}"]
    body += [f"    {flag}" + ("" if value is None else f" {shlex.quote(value)}")
             for flag, value in launch.args]
    body += [f"    {flag} {value}" for flag, value in _placeholders(vocab_size)]
    return "\n".join(lines + [line + " \\" for line in body[:-1]] + body[-1:]) + "\n"


def parse_script(script: str) -> tuple[dict[str, str], list[str], dict[str, str]]:
    """Inverse of render('script'), for tests and tools: (exported env, pretrain_gpt.py argv,
    torchrun options). Placeholder values stay unexpanded ("$DATA_PATH")."""
    env: dict[str, str] = {}
    argv: list[str] = []
    torchrun: dict[str, str] = {}
    for line in script.replace("\\\n", " ").splitlines():
        s = line.strip()
        if s.startswith("export "):
            key, _, value = s[len("export "):].partition("=")
            env[key] = shlex.split(value)[0] if value else ""
        elif s.startswith("torchrun "):
            words = shlex.split(s)
            at = words.index(ENTRYPOINT)
            head = words[1:at]
            torchrun = {head[i]: head[i + 1] for i in range(0, len(head), 2)}
            argv = words[at + 1:]
    return env, argv, torchrun


__all__ = ["MegatronLaunch", "megatron_args", "not_expressible", "launch_problems",
           "validate_megatron_args", "validate_launch", "parse_megatron_args", "render",
           "parse_script", "gpu_arch_major", "NONEXISTENT_FLAGS"]
