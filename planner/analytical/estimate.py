"""The exact analytical model's API: `estimate` for one plan, `estimate_many` for numpy columns.

Both run the same vectorised code, so they cannot drift apart; tests check that a batch gives
the same numbers as its rows one by one.
"""
from __future__ import annotations

import numpy as np
from pydantic import BaseModel, ConfigDict

from hardware.errors import SpecError, shortened
from hardware.spec import SystemSpec
from planner.analytical import flops, layer_kinds, precision
from planner.analytical.kernels import per_op_checkpointing
from planner.analytical.layer_kinds import dense_layer_spec, lead_layer_model, lead_layers
from planner.analytical.memory import RANK_DP_PREFIX, memory_breakdown
from planner.analytical.plans import (PlanArrays, has_layout, module_selected, sequence_parallel_on,
                                     sum_over_ranks, with_every_rank)
from planner.analytical.time import OP_SAC_ATTENTION_PROJ_RERUN, op_sac_mlp_rerun, step_time
from planner.model import ModelSpec
from planner.plan import JobSpec, Plan, check_recompute_modules

# Every rule a plan can break, with the words a user sees. Bit i of `violations` is RULES[i].
RULES: dict[str, str] = {
    "gpus": "tp·pp·dp·cp must equal the GPU count",
    "heads_tp": "attention heads must be divisible by tp",
    "groups_tp": "query groups must be a multiple or a divisor of tp",
    "hidden_tp": "hidden and ffn sizes must be divisible by tp",
    "layers_pp": "the pipeline layout must hold every layer: at least one layer per virtual stage "
                 "(pp·vpp <= layers), or stage_layers summing to the layers",
    "batch": "global batch must be a multiple of micro_batch·dp",
    "vpp_needs_pp": "interleaving (vpp > 1) needs pp > 1",
    "vpp_microbatches": "with interleaving the number of microbatches must be at least pp",
    "experts_ep": "experts must be divisible by ep, expert ffn by etp, and the GPU count by etp·ep·pp",
    "cp_seq": "sequence length must be a multiple of 2·cp",
    "tp_overlap_needs_sp": "tp comm overlap needs sequence parallelism",
    "hbm": "per-GPU memory exceeds HBM capacity minus the reserve",
    "offload_capacity": "offloaded bytes exceed the offload tier (or there is none)",
    "mamba_tp": "a Mamba mixer's heads and groups must be divisible by tp",
    "hybrid_cp": "context parallelism of a hybrid Mamba stack is not costed (cp must be 1)",
    "sp_seq": "with sequence parallelism the sequence length must be a multiple of tp·cp",
}
RULE_BITS = {name: 1 << i for i, name in enumerate(RULES)}


def rule_numbers(rule: str, model: ModelSpec, plan: Plan) -> str:
    """The numbers a broken layout rule compares, for its one-line error ("" where none apply)."""
    numbers = {
        "heads_tp": f"{model.heads} heads, tp {plan.tp}",
        "groups_tp": f"{model.kv_groups} query groups, tp {plan.tp}",
        "hidden_tp": f"hidden {model.hidden}, ffn {model.ffn_hidden}, tp {plan.tp}",
        "layers_pp": (f"{model.name} has {model.layers} layers; stage_layers sum to {sum(plan.stage_layers)}"
                      if plan.stage_layers else f"{model.name} has {model.layers} layers; pp·vpp = "
                      f"{plan.pp}·{plan.vpp} = {plan.pp * plan.vpp}"),
        "batch": f"global batch {plan.global_batch}, micro_batch·dp = {plan.micro_batch}·{plan.dp}",
        "vpp_microbatches": f"{plan.num_microbatches} microbatches, pp {plan.pp}",
        "cp_seq": f"sequence {model.seq_length}, cp {plan.cp}",
        "sp_seq": f"sequence {model.seq_length}, tp·cp = {plan.tp * plan.cp}",
        "experts_ep": (f"{model.moe.num_experts} experts, ep {plan.ep}, etp {plan.etp or plan.tp}"
                       if model.moe else f"{model.name} has no experts, ep {plan.ep}"),
    }.get(rule, "")
    return f" ({numbers})" if numbers else ""


def rule_text(rule: str, model: ModelSpec, plan: Plan) -> str:
    """A broken rule as one line: its name, its words and the numbers it compares."""
    return f"{rule}: {RULES[rule]}{rule_numbers(rule, model, plan)}"


def rule_violations(model: ModelSpec, system: SystemSpec, job: JobSpec, P: PlanArrays, mem: dict) -> np.ndarray:
    t, p, dp, c, v = P.tp, P.pp, P.dp, P.cp, P.vpp
    gpus = t * p * dp * c
    m = P.global_batch / (P.micro_batch * dp)
    g = model.kv_groups
    E = model.moe.num_experts if model.moe else 1

    def off(a, b):
        # a % b != 0 as np.fmod: the same truth for any signs (a remainder is 0 exactly when the
        # truncated one is), at half the cost of numpy's floored remainder
        return np.fmod(a, b) != 0
    checks = {
        "gpus": (gpus > system.num_gpus) if job.allow_idle_gpus else (gpus != system.num_gpus),
        "heads_tp": off(model.heads, t),
        "groups_tp": off(g, t) & off(t, g),
        "hidden_tp": off(model.hidden, t) | off(model.ffn_hidden, t)
        | (off(model.expert_ffn_hidden, t) if model.moe else False),
        "layers_pp": layout_breaks(model.layers, P),
        "batch": off(P.global_batch, P.micro_batch * dp),
        "vpp_needs_pp": (v > 1) & (p == 1),
        "vpp_microbatches": (v > 1) & (m < p),
        # Megatron MoE parallel folding: experts get their own (etp, ep, expert-dp) grid over the
        # same GPUs; only world % (etp·ep·pp) == 0 is required (megatron/core/parallel_state.py)
        "experts_ep": off(E, P.ep) | off(gpus, P.etp * P.ep * p)
        | (off(model.expert_ffn_hidden, P.etp) if model.moe else False)
        | (((P.ep > 1) | (P.etp != t)) & (model.moe is None)),
        "cp_seq": (c > 1) & off(model.seq_length, 2 * c),
        "tp_overlap_needs_sp": (P.tp_comm_overlap > 0) & ~sequence_parallel_on(P),
        "hbm": mem["hbm_bytes"] > mem["hbm_capacity_bytes"],
        "offload_capacity": mem["offload_bytes"] > mem["offload_capacity_bytes"] * (1 + 1e-12),
        "mamba_tp": (off(model.mamba.num_heads, t) | off(model.mamba.groups, t)) if model.mamba else False,
        "hybrid_cp": (c > 1) & bool(model.hybrid_pattern),
        # Megatron scatters each rank's seq/cp tokens over tp (tensor_parallel/mappings.py
        # _split_along_first_dim asserts the first dimension divides by the tp size)
        "sp_seq": sequence_parallel_on(P) & off(model.seq_length, t * c),
    }
    bits = np.zeros(len(P), dtype=np.int64)
    for name, broken in checks.items():
        broken = np.asarray(broken)
        if broken.ndim == 0:  # a scalar rule (the model's or the job's alone)
            if broken:
                bits |= RULE_BITS[name]
        else:
            bits[np.broadcast_to(broken, (len(P),))] |= RULE_BITS[name]
    return bits


def layout_breaks(layers: int, P: PlanArrays) -> np.ndarray:
    """Default split: every virtual stage needs a layer; explicit: the stages sum to the layers."""
    broken = layers < P.pp * P.vpp
    for i in np.flatnonzero(has_layout(P.stage_layout)):
        broken[i] = sum(P.stage_layout[i][0]) != layers
    return broken


def violated_rules(bits: int) -> list[str]:
    return [name for name, bit in RULE_BITS.items() if bits & bit]


def recomputed_block_flops_per_token(model: ModelSpec, P: PlanArrays, attn_exec: float) -> np.ndarray:
    """Per row of a hybrid stack: forward FLOPs per token of the blocks its ranks recompute in
    full, each at its kind's (block recompute: each stage's first k, layer_kinds.rank_block_counts),
    summed over the pipeline ranks (P's column j is rank j mod pp: plans.with_every_rank, or rank 0
    without pipelining)."""
    per_block = flops.hybrid_block_matmul_flops_per_token(model)
    per_block = {**per_block, "*": per_block["*"] + attn_exec, "M": per_block["M"] + flops.ssd_flops_per_token(model)}
    return sum_over_ranks(P, layer_kinds.rank_block_sum(model, P, per_block, recomputed=True))


def selective_recompute_flops_per_token(model: ModelSpec, modules: np.ndarray, attn_exec: float) -> np.ndarray:
    """FLOPs per token that selective recompute of `modules` executes again, over all layers (the
    GEMMs and attention core of `time.selective_recompute_s`; norms and activations are
    element-wise and count no FLOPs)."""
    shared = model.moe.shared_experts * flops._mlp_flops(model, model.shared_expert_ffn_hidden) if model.moe else 0.0
    moe_layer = flops.mlp_matmul_flops_per_token(model) if model.moe else 0.0

    def has(name):
        return module_selected(modules, name)
    return (has("core_attn") * model.attention_layers * attn_exec
            + has("mla_up_proj") * model.layers * flops.mla_up_proj_flops_per_token(model)
            + has("mlp") * model.dense_layers * flops.dense_mlp_matmul_flops_per_token(model)
            + model.moe_layers * np.where(has("moe"), moe_layer, has("shared_experts") * shared))


def estimate_many(model: ModelSpec, system: SystemSpec, job: JobSpec, P: PlanArrays) -> dict[str, np.ndarray]:
    """Time and memory of every plan in `P`: a dict of equal-length arrays."""
    if layer_kinds.by_block(model) and len(np.unique(P.pp)) > 1:
        # a pipelined hybrid stack costs every rank (plans.with_every_rank): one pipeline depth at
        # a time keeps each batch's rank columns as few as its pp
        out: dict[str, np.ndarray] = {}
        for pp in np.unique(P.pp):
            rows = np.flatnonzero(P.pp == pp)
            for key, value in estimate_many(model, system, job, P.take(rows)).items():
                value = np.broadcast_to(np.asarray(value), (len(rows),) + np.shape(value)[1:])
                out.setdefault(key, np.zeros((len(P),) + value.shape[1:], dtype=value.dtype))[rows] = value
        return out
    if layer_kinds.by_block(model) and np.any(P.pp > 1):
        P = with_every_rank(P, model.layers)  # once, for memory and time (each would otherwise)
    mem = memory_breakdown(model, system, job, P)
    times = step_time(model, system, job, P, mem)
    tokens = P.global_batch * model.seq_length
    gpus = P.tp * P.pp * P.dp * P.cp
    peak = system.accelerator.peak(precision.gemm_peak_key(job.dtype))
    # MFU numerator: the reference convention (full s×s attention, as the published MFUs);
    # HFU numerator: what the GPUs execute, with the attention core counted exactly as the
    # time model runs it (causal half with fused attention) plus recomputation.
    model_flops = tokens * flops.model_flops_per_token(model)
    attn_exec = flops.executed_attention_core_flops_per_token(model, job.flash_attention)
    skipped = flops.attention_core_flops_per_token(model) - attn_exec
    layer_fwd = flops.layer_matmul_flops_per_token(model) + attn_exec
    if model.hybrid_pattern:  # a recomputed layer is the stack's mean block
        layer_fwd = (flops.transformer_matmul_flops_per_token(model) + model.attention_layers * attn_exec
                     + model.blocks("M") * flops.ssd_flops_per_token(model)) / model.layers
    executed = flops.model_flops_per_token(model) - 3.0 * (model.attention_layers + model.mtp_layers) * skipped
    rc_layers = P.recompute_total
    if lead_layers(model):  # recomputed leading dense layers rerun the dense layer's GEMMs
        lead_fwd = flops.layer_matmul_flops_per_token(lead_layer_model(model)) + attn_exec
        extra = (rc_layers - P.lead_recompute_total) * layer_fwd + P.lead_recompute_total * lead_fwd
    else:
        extra = rc_layers * layer_fwd
    if layer_kinds.by_block(model) and not any(job.bf16_layers):  # the blocks each rank reruns
        extra = np.where(P.recompute == 2, recomputed_block_flops_per_token(model, P, attn_exec), extra)
    if per_op_checkpointing(model, job):
        # torchtitan's per-op policy reruns half the attention projections and one MLP GEMM of
        # three (time.OP_SAC_ATTENTION_PROJ_RERUN), not the attention core
        rerun = (OP_SAC_ATTENTION_PROJ_RERUN * flops.attention_matmul_flops_per_token(model)
                 + op_sac_mlp_rerun(model) * flops.dense_mlp_matmul_flops_per_token(model))
        extra = extra + np.where(P.recompute == 1, model.layers * rerun, 0.0)
    else:
        extra = extra + np.where(P.recompute == 1, selective_recompute_flops_per_token(
            model, P.recompute_modules, attn_exec), 0.0)
    hw_flops = tokens * (executed + extra)
    step = times["step_time_s"]
    out = {**times, **{k: v for k, v in mem.items() if not k.startswith(RANK_DP_PREFIX)}}
    out.update({
        "model_flops": model_flops, "hardware_flops": hw_flops,
        "mfu": model_flops / (step * gpus * peak), "hfu": hw_flops / (step * gpus * peak),
        "tokens_per_s": tokens / step,
        "violations": rule_violations(model, system, job, P, mem),
    })
    return out


TIME_FIELDS = ("forward_s", "backward_s", "recompute_s", "tp_comm_exposed_s", "cp_ep_comm_exposed_s",
               "pp_bubble_s", "pp_p2p_s", "dp_comm_exposed_s", "offload_exposed_s", "optimizer_step_s")
MEMORY_FIELDS = ("weights_bytes", "grads_bytes", "optimizer_bytes", "embeddings_bytes", "activations_bytes",
                 "workspace_bytes")
OFFLOAD_FIELDS = ("offload_weights_grads_bytes", "offload_optimizer_bytes", "offload_activations_bytes")


class Estimate(BaseModel):
    """Time and per-GPU memory of one plan, with the rules it breaks."""

    model_config = ConfigDict(frozen=True)
    plan: Plan
    step_time_s: float
    time_breakdown_s: dict[str, float]
    hbm_bytes: float
    hbm_capacity_bytes: float
    memory_breakdown_bytes: dict[str, float]
    offload_bytes: float
    offload_breakdown_bytes: dict[str, float]
    offload_capacity_bytes: float
    mfu: float
    hfu: float
    tokens_per_s: float
    model_flops: float
    hardware_flops: float
    violations: list[str]

    @property
    def feasible(self) -> bool:
        return not self.violations


def estimate_from_row(result: dict[str, np.ndarray], i: int, plan: Plan) -> Estimate:
    f = {k: float(v[i]) for k, v in result.items() if k != "violations"}
    return Estimate(
        plan=plan, step_time_s=f["step_time_s"],
        time_breakdown_s={k: f[k] for k in TIME_FIELDS},
        hbm_bytes=f["hbm_bytes"], hbm_capacity_bytes=f["hbm_capacity_bytes"],
        memory_breakdown_bytes={k: f[k] for k in MEMORY_FIELDS},
        offload_bytes=f["offload_bytes"], offload_breakdown_bytes={k: f[k] for k in OFFLOAD_FIELDS},
        offload_capacity_bytes=f["offload_capacity_bytes"],
        mfu=f["mfu"], hfu=f["hfu"], tokens_per_s=f["tokens_per_s"],
        model_flops=f["model_flops"], hardware_flops=f["hardware_flops"],
        violations=violated_rules(int(result["violations"][i])))


def check_hbm_reserve(job: JobSpec, system: SystemSpec, field: str = "hbm-reserve-gib") -> None:
    """SpecError where the job's HBM reserve leaves nothing of the GPU's HBM (`field`: where the
    user wrote it: the flag, or a plan file's job setting)."""
    hbm_gib = system.accelerator.hbm_capacity_gib
    if job.hbm_reserve_gib >= hbm_gib:
        raise SpecError(f"{field}: the reserve ({job.hbm_reserve_gib:g} GiB) leaves nothing of "
                        f"the {hbm_gib:g} GiB HBM; allowed: 0 <= reserve < {hbm_gib:g}")


def check_api_inputs(model, system, job=None, plan=None, need_plan: bool = False) -> None:
    """The Python API's arguments are the spec objects, not names (a one-line SpecError naming the
    argument and how to make one, instead of an AttributeError deep inside); `need_plan`: the
    plan is required (estimate), not absent (plan, check, count)."""
    for name, value, kind, optional, how in (
            ("model", model, ModelSpec, False, "load_model('llama3-8b')"),
            ("system", system, SystemSpec, False, "load_system('h100-sxm', 64)"),
            ("job", job, JobSpec, True, "JobSpec(global_batch=512)"),
            ("plan", plan, Plan, not need_plan, "Plan(tp=2, dp=32, global_batch=512)")):
        if not isinstance(value, kind) and not (optional and value is None):
            raise SpecError(f"{name}: expected a {kind.__name__} (e.g. {how}), got {type(value).__name__} "
                            f"{shortened(str(value))!r}")
    allowed = precision.training_dtypes(system)
    if job is not None and job.dtype not in allowed:  # the training precisions, not the peak table's keys
        raise SpecError(f"dtype: {system.accelerator.name} has no {job.dtype} GEMM peak; allowed on it: "
                        f"{', '.join(allowed)}")


def estimate(model: ModelSpec, system: SystemSpec, plan: Plan, job: JobSpec | None = None) -> Estimate:
    """Exact model for one plan, at the plan's own global batch; a job that names another global
    batch is refused (its max_global_batch is a search setting, not read here)."""
    check_api_inputs(model, system, job, plan, need_plan=True)  # estimate(m, s, None) was an AttributeError
    job = job or JobSpec()
    if job.global_batch is not None and job.global_batch != plan.global_batch:
        raise SpecError(f"global_batch: the job's ({job.global_batch}) differs from the plan's "
                        f"({plan.global_batch}); give the plan the job's batch, or leave the job's unset")
    check_recompute_modules(plan, model)
    if plan.fp8_param_gather and job.dtype in ("bf16", "fp16"):
        # (the plan and the job meet only here; fp8_attention is refused in JobSpec itself)
        raise SpecError(f"fp8_param_gather (--fp8-param-gather) keeps the weights in FP8, which needs a "
                        f"low-precision dtype (--dtype fp8, fp8-cs, fp8-block, mxfp8 or nvfp4), got {job.dtype}")
    check_hbm_reserve(job, system, "hbm_reserve_gib")  # a reserve beyond the HBM left a negative capacity
    result = estimate_many(model, system, job, PlanArrays.from_plans([plan], model.layers, dense_layer_spec(model)))
    return estimate_from_row(result, 0, plan)
