"""What NVIDIA's published MoE benchmark runs set that their records do not state: routing balance,
token dispatcher and the expert all-to-all overlap (planner/reference.py applies it to a record).

Sources, read for facts only:
- Megatron-Bridge performance recipes (NVIDIA-NeMo/Megatron-Bridge @067f987,
  src/megatron/bridge/perf_recipes/{deepseek,qwen}/*): every MoE benchmark sets
  moe_router_force_load_balancing = True; GB200/GB300 recipes use the flex dispatcher (HybridEP),
  as does DeepSeek-V3 everywhere (its base recipe asks for HybridEP, which Megatron-Bridge keeps on
  Ampere/Hopper/Blackwell: flex_dispatcher_backend.py; DeepEP on B200 at ep 32); Qwen3 on H100
  and B200 uses alltoall. The expert all-to-all overlap (overlap_moe_expert_parallel_comm +
  delay_wgrad_compute) is on in the full-iteration MXFP8/NVFP4 recipes of DeepSeek-V3 and of the
  GB200/GB300 systems, and in Qwen3-235B on H100 (tp2 pp8 vpp4 ep32); Qwen3 on B200 sets it off.
- Megatron MoE ModelZoo tables (fsdp_moe_runs.yaml records): the dispatcher column, "+1f1b
  overlap" in the notes, forced-balance vs dropless routing in the long-context table.
- NeMo 2.0 performance scripts (NVIDIA/NeMo @8cfedd7 scripts/performance/llm/, and
  pretrain_grok1_314b.py @5dcb379): only DeepSeek-V3 forces balanced routing; the DGX Cloud
  Grok-1 proxies ran learned routing.
Older releases of the archived tables may have run other settings: each applied setting is listed
among the case's assumptions.
"""
from __future__ import annotations

from planner.megatron.expressible import a2a_overlap_refusals
from planner.model import ModelSpec
from planner.plan import Plan

# Busiest expert-parallel rank's rows over the mean with LEARNED dropless routing (aux-loss
# balanced, as trained), as opposed to forced-balanced benchmark routing. A named physical
# quantity fitted by bench/fsdp_moe_eval.py on the ModelZoo long-context pairs that differ only in
# routing (forced-balance vs dropless, Qwen3-235B, 16k-128k sequence); a planning hint for users
# (`--moe-imbalance`), not applied to benchmark rows.
MOE_IMBALANCE_LEARNED_DROPLESS = 1.6

NVIDIA_MOE_SOURCES = ("bridge_", "mcore-modelzoo", "mcore-dsv3-gb200guide", "dgxc")
FULL_ITERATION_DTYPES = ("mxfp8", "nvfp4")


def a2a_overlap_allowed(plan: Plan, model: ModelSpec) -> bool:
    """Whether Megatron accepts --overlap-moe-expert-parallel-comm on this plan
    (planner.megatron.expressible.a2a_overlap_refusals)."""
    return not a2a_overlap_refusals(plan, model)


def nvidia_moe_settings(rid: str, model: ModelSpec, plan: Plan, dtype: str, gpu: str, notes: str = "",
                        dispatcher: str = "") -> tuple[dict, float | None, list[str]]:
    """(Plan field updates, JobSpec.moe_load_imbalance or None, assumptions) for an NVIDIA MoE
    benchmark record; nothing for other records or dense models."""
    if model.moe is None:
        return {}, None, []
    if not rid.startswith(NVIDIA_MOE_SOURCES):
        # other stacks train their router as it learns (torchtitan: auxiliary-loss-free bias
        # balancing, no forced routing), so the learned-routing skew applies
        return {}, MOE_IMBALANCE_LEARNED_DROPLESS, [
            f"learned routing (imbalance {MOE_IMBALANCE_LEARNED_DROPLESS:g}; no forced balance outside NVIDIA's benchmarks)"]
    notes_l, gpu_u, disp = notes.lower(), gpu.upper(), dispatcher.lower()
    update, assumptions = {}, []
    dropless = "dropless" in rid or "dropless routing" in notes_l or (
        rid.startswith("dgxc") and "deepseek" not in model.name.lower())
    imbalance = MOE_IMBALANCE_LEARNED_DROPLESS if dropless else 1.0
    assumptions.append(f"learned dropless routing (imbalance {imbalance:g})" if dropless
                       else "forced-balanced routing (NVIDIA MoE benchmarks)")
    grace = gpu_u.startswith("GB")
    if rid.startswith("bridge_"):
        deepseek = "deepseek" in model.name.lower()
        flex = deepseek or grace
        overlap = (dtype in FULL_ITERATION_DTYPES and (deepseek or grace)) or ("H100" in gpu_u and "qwen3" in model.name.lower())
        why = "Megatron-Bridge perf recipe @067f987"
    elif rid.startswith("dgxc"):
        flex = overlap = False
        why = "NeMo perf script"
    else:
        flex = "deepep" in disp or "hybridep" in disp or "deepep" in rid
        overlap = "1f1b overlap" in notes_l
        why = "record"
    folded = rid.startswith("mcore-modelzoo") or (rid.startswith("bridge_") and "deepseek" in model.name.lower())
    if folded and plan.etp is None and plan.tp > 1:
        # the recipes fold the experts to expert TP 1 (Megatron-Bridge @067f987
        # recipes/deepseek/h100/deepseek_v3.py and scripts/moe_model_zoo/model_configs/
        # Qwen3-235B-A22B.yaml @7b63722: expert_tensor_parallel_size = 1); Megatron's own default
        # would be etp = tp
        update["etp"] = 1
        assumptions.append("etp 1 (the recipe's model config)")
    if plan.ep > 1 and flex:
        update["moe_dispatcher"] = "deepep"
        assumptions.append(f"flex dispatcher (DeepEP/HybridEP; {why})")
    if overlap and a2a_overlap_allowed(plan, model):
        update["moe_a2a_overlap"] = True
        assumptions.append(f"expert all-to-all overlap ({why})")
    return update, imbalance, assumptions


__all__ = ["MOE_IMBALANCE_LEARNED_DROPLESS", "a2a_overlap_allowed", "nvidia_moe_settings"]
