"""Plan -> Megatron-LM `pretrain_gpt.py` flags, environment and torchrun geometry (MA 3).
Section numbers ("MA 2a") refer to shared/reference/megatron_args.md."""
from __future__ import annotations

import math

from hardware.spec import SystemSpec
from planner.megatron.expressible import _cpu_offload_layers
from planner.megatron.launch import Arg, MegatronLaunch
from planner.model import ModelSpec
from planner.plan import JobSpec, Plan

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
    fsdp = plan.zero_stage >= 2
    dist_opt = plan.zero_stage == 1
    if dist_opt:
        add("--use-distributed-optimizer")
    if fsdp:
        add("--use-megatron-fsdp")
        add("--data-parallel-sharding-strategy",
            "optim_grads_params" if plan.zero_stage == 3 else "optim_grads")
        add("--ckpt-format", "fsdp_dtensor")  # Megatron FSDP checkpoints only in this format
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

