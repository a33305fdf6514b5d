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
The bridge_runs.yaml rows of DeepSeek-V3 and Qwen3-235B take their knobs from the recipe of their
own release instead (planner/bridge_recipes.py, planner/data/bridge_recipe_knobs.yaml: the
dispatcher, the all-to-all overlap, etp, recompute and TP overlap as each release set them); the
@067f987 rules above remain for a bridge_ record that table does not cover. The ModelZoo GB200/GB300
rows take theirs, the same way, from the launch command printed under their table row
(planner/data/modelzoo_command_knobs.yaml). Each applied setting is listed among the case's
assumptions with where it was read.

Rows still off after their own settings are applied, for reasons the model cannot express (numbers
from `planner validate`; no per-row factor is applied to any of them):
- ModelZoo GB200 BF16 tp1 pp8 ep8 (+20.7 %, 31.3 s predicted against 25.9 s): the model charges 16 local
  experts x 2 GEMMs x EXPERT_GEMM_HOST_US (50 us) = 1.6 ms of host issue per MoE layer forward
  against 0.87 ms of expert GPU time: 0.73 ms exposed, 6.7 s of the step with the backward. The
  row is within 20 % at <= 49 us per expert GEMM (31 us to match; with no host cost at all it is
  -3.8 %), while the x86 hosts' rows with the same 16 local experts need the fitted value
  (H100 BF16 tp4 pp8 ep8: -7.6 % at 50 us, -17 % at 40 us; Bridge B200 ep8 25.09 / 26.02: +1.3 % /
  -3.5 % at 50 us, -7.4 / -11.5 % at 40). Not the CPU: Grace spends more host time per linear
  layer than a DGX H100's Xeon (NVIDIA/TransformerEngine issue #2053, GB200 vs H100 DGX: torch
  Linear 37 vs 13 us of CPU per forward). Not the dtype or the TE release alone either: the H100 rows are BF16 on the ModelZoo's
  July-2025 image (TE 07afda9), the Bridge B200 26.02 row is MXFP8 on a TE with "Reduce CPU
  overheads" (#2377; TE 5671fd3), and both need the fitted value. This row is the only one with both:
  BF16 (GroupedLinear quantises nothing per expert) on the ModelZoo's Blackwell image (TE 99df881,
  release_v2.9 with #2377), plus per-layer CUDA graphs of attn, moe_router and moe_preprocess and
  HybridEP. A host constant for that combination would be fitted on this single row (the other
  GB200/GB300 rows have <= 4 local experts and are not host-bound), i.e. a per-row factor. Nor a
  true grouped GEMM on that image: TE's CUTLASS grouped GEMM is Hopper-only and opt-in
  (nvte_multi_tensor_gemm checks sm 90 and NVTE_USE_CUTLASS_GROUPED_GEMM), and its single
  cuBLASLt grouped GEMM, which keeps the token counts on the device, needs cuBLAS 13.3 (TE docs).
- Bridge 25.11 DGX-B200 Qwen3-235B (-18 %) and DeepSeek-V3 (-17 %): both ran 16-25 % slower per
  microbatch than the same layouts on the same GPUs in the neighbouring releases, which the model
  predicts within 5 %: Qwen3 tp1 pp8 ep8, 156.6 ms per microbatch (25.11) against 124.8 (25.09,
  +2.3 %) and 134.6 (26.02, -3.5 %; equal bubble share 7/256); DeepSeek-V3 tp1 pp16 ep8, 107 ms
  bubble-corrected against 90 (26.02, -1.7 %). The recipe settings that differ are costed: Qwen3's
  all-to-all overlap runs NCCL's alltoall at ep 8 inside the node, where it hides nothing
  (time.a2a_in_nccl_copy_kernels; with the shared efficiency it was worth 1.7 s and the
  row -27 %), and the record's vpp 2 against the recipe's vpp 4 moves it 0.2 s. The rest of the gap
  is the 25.11 container on B200 (or the overlap's measured loss there, which the model does not
  charge), a software-release efficiency the model has no mechanism for.
- ModelZoo H100 tp2 pp8 vpp4 ep32 DeepEP "+1f1b overlap" (-18 %): its pair without the overlap is
  +7 %; measured the overlap saved 2.1 s (19.7 -> 17.6 s, 0.893x), the model credits 6.3 s (0.703x;
  6.7 s, 0.684x, before each all-to-all was paired with its own compute piece),
  while the same layout with NCCL alltoall (Bridge Qwen3 H100 25.09 -> 25.11, overlap switched on)
  matches (predicted 0.760x, measured 0.764x). What differs is the dispatcher (DeepEP's normal
  kernels run on SMs the overlapped GEMMs then lack; across nodes the model has one overlap
  efficiency, A2A_OVERLAP_EFFICIENCY, for every dispatcher) and the code (a dev branch, moe_dev f3e6c5); one
  pair cannot separate them, so the fitted efficiency stays shared.
"""
from __future__ import annotations

from typing import get_args

from planner.bridge_recipes import RecipeKnobs, launch_knobs, release_number
from planner.megatron.expressible import a2a_overlap_refusals
from planner.model import ModelSpec
from planner.plan import CudaGraphModuleName, Plan, applicable_recompute_modules

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
    knobs = launch_knobs(rid)
    if knobs is not None:
        # forced balance and token-drop padded to capacity both run every expert at its share
        update, recipe_notes = bridge_recipe_plan_updates(knobs, model, plan, gpu)
        return update, 1.0, recipe_notes
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


def _routing_note(knobs: RecipeKnobs) -> str:
    cf = knobs.value("moe_expert_capacity_factor")
    if cf is not None and knobs.value("moe_pad_expert_input_to_capacity"):
        # every expert is padded to its capacity: it runs cf x the balanced share, whatever the router did
        return (f"token-drop routing, capacity factor {cf:g} padded to capacity "
                f"({knobs.cite('moe_expert_capacity_factor')})")
    if knobs.value("moe_router_force_load_balancing"):
        return f"forced-balanced routing ({knobs.cite('moe_router_force_load_balancing')})"
    return "routing balance not set by the recipe: balanced assumed"


# From Megatron-Bridge 26.04 (v0.4.0, 0fbfe7d3) on, scripts/performance/utils/overrides.py
# set_workload_base_configs runs after a system function's own dispatcher assignment and, whenever
# the workload config names a flex backend, calls training/flex_dispatcher_backend.py
# apply_flex_dispatcher_backend, which switches to the flex dispatcher when the GPU takes the
# backend (HybridEP: compute capability 8, 9 or 10; DeepEP: 8 or 9, or a GPU named B200/B300, so not
# GB200/GB300); otherwise it sets alltoall. Earlier releases decided it in each system function.
FLEX_BY_BACKEND_FROM_RELEASE = (26, 4)


def backend_runs_flex(backend: str, gpu: str) -> bool:
    """Whether apply_flex_dispatcher_backend turns the flex dispatcher on for `backend` on `gpu`."""
    gpu_u = gpu.upper()
    if backend == "hybridep":
        return gpu_u.startswith(("A100", "H100", "H200", "GH200", "B200", "B300", "GB200", "GB300"))
    if backend == "deepep":
        return gpu_u.startswith(("A100", "H100", "H200", "GH200", "B200", "B300"))
    return False


def bridge_recipe_plan_updates(knobs: RecipeKnobs, model: ModelSpec, plan: Plan,
                               gpu: str = "") -> tuple[dict, list[str]]:
    """(Plan field updates, assumptions) from a bridge record's own-release recipe: token
    dispatcher, expert all-to-all overlap, expert TP, selective recompute and TP comm overlap, each
    cited; the knobs the model does not cost yet are listed as such."""
    update: dict = {}
    notes = [f"recipe of {knobs.release}: {knobs.source} {knobs.tag} ({knobs.commit[:12]}) {knobs.config}",
             _routing_note(knobs)]
    if not knobs.layout_matches_record:
        notes.append(f"the recipe's layout differs from the record ({knobs.mismatch}): record layout kept, "
                     "recipe knobs applied")
    elif knobs.mismatch:
        notes.append(f"recipe variant differs from the record: {knobs.mismatch}")
    etp = knobs.value("expert_tensor_parallel_size")
    if etp is not None and plan.tp > 1 and plan.etp != etp:
        update["etp"] = etp
        notes.append(f"etp {etp} ({knobs.cite('expert_tensor_parallel_size')})")
    granularity = knobs.value("recompute_granularity")
    if granularity == "selective":
        asked = knobs.value("recompute_modules")
        applies = applicable_recompute_modules(model)
        kept = None if asked is None else tuple(m for m in asked if applies.get(m, "unknown") is None)
        dropped = [] if asked is None else [m for m in asked if m not in (kept or ())]
        if kept == ():
            # an empty module list recomputes nothing: Megatron-Core fills in ["core_attn"] only for
            # None (transformer_config.py __post_init__, megatron-core 0.19.2)
            update.update(recompute="none", recompute_modules=None)
            notes.append(f"no recompute: selective with no module that applies ({knobs.cite('recompute_modules')})"
                         + (f"; {', '.join(dropped)} does nothing here" if dropped else ""))
        else:
            update.update(recompute="selective", recompute_modules=kept)
            notes.append(f"selective recompute of {' '.join(kept) if kept else 'core_attn (Megatron default)'} "
                         f"({knobs.cite('recompute_modules')})" + (f"; {', '.join(dropped)} does nothing here"
                                                                    if dropped else ""))
    elif granularity is None and plan.recompute != "none":
        update.update(recompute="none", recompute_modules=None)
        notes.append(f"no recompute ({knobs.cite('recompute_granularity')})")
    if plan.ep > 1:
        backend = knobs.value("moe_flex_dispatcher_backend")
        dispatcher = knobs.value("moe_token_dispatcher_type")
        by_backend = (dispatcher is None and backend is not None
                      and release_number(knobs.release)[:2] >= FLEX_BY_BACKEND_FROM_RELEASE)
        flex = backend_runs_flex(backend, gpu) if by_backend else dispatcher == "flex"
        update["moe_dispatcher"] = "deepep" if flex else "alltoall"
        if by_backend:
            what = f"flex dispatcher, {backend}" if flex else f"alltoall dispatcher ({backend} not on {gpu})"
            notes.append(f"{what} (set_workload_base_configs applies the workload's backend, release >= 26.04; "
                         f"{knobs.cite('moe_flex_dispatcher_backend')})")
        else:
            notes.append(f"flex dispatcher, {backend} ({knobs.cite('moe_flex_dispatcher_backend')})" if flex
                         else f"alltoall dispatcher ({knobs.cite('moe_token_dispatcher_type')})")
    if knobs.value("overlap_moe_expert_parallel_comm"):
        trial = Plan.model_validate({**plan.model_dump(), **update})
        refused = a2a_overlap_refusals(trial, model)
        if refused:
            notes.append(f"expert all-to-all overlap set by the recipe but not applied: {refused[0]}")
        else:
            update["moe_a2a_overlap"] = True
            notes.append(f"expert all-to-all overlap + delayed wgrad ({knobs.cite('overlap_moe_expert_parallel_comm')})")
    elif plan.moe_a2a_overlap:
        update["moe_a2a_overlap"] = False
    tp_update, tp_notes = tp_overlap_update(knobs, plan)
    update.update(tp_update)
    notes.extend(tp_notes + _uncosted_knobs(knobs))
    return update, notes


def tp_overlap_update(knobs: RecipeKnobs, plan: Plan) -> tuple[dict, list[str]]:
    """(Plan update, assumption) for the recipe's TP communication overlap where it differs from
    the plan's (MoE and dense records alike)."""
    overlap = knobs.value("tp_comm_overlap")
    if plan.tp > 1 and overlap is not None and plan.tp_comm_overlap != bool(overlap):
        return ({"tp_comm_overlap": bool(overlap)},
                [f"TP comm overlap {'on' if overlap else 'off'} ({knobs.cite('tp_comm_overlap')})"])
    return {}, []


def bridge_recipe_model(knobs: RecipeKnobs, model: ModelSpec) -> tuple[ModelSpec, list[str]]:
    """The model as the recipe ran it: token-drop capacity (25.09) and MTP off where the table
    says 'w/o MTP' (25.11 GB200)."""
    notes, update = [], {}
    cf = knobs.value("moe_expert_capacity_factor")
    if model.moe is not None and cf is not None and model.moe.capacity_factor != cf:
        update["moe"] = model.moe.model_copy(update={"capacity_factor": float(cf)})
    mtp = knobs.value("mtp_num_layers")
    if mtp is not None and model.mtp_layers != mtp:
        update["mtp_layers"] = int(mtp)
        notes.append(f"{mtp} MTP layers ({knobs.where('mtp_num_layers')})")
    return (model.model_copy(update=update) if update else model), notes


def bridge_recipe_job_updates(knobs: RecipeKnobs, dtype: str) -> tuple[dict, list[str]]:
    """(JobSpec field updates, assumptions) for the recipe's kernel settings the time model costs:
    full-iteration CUDA graphs, the CuTeDSL (TE op-fuser) grouped MLP, FP8 attention."""
    update, notes = {}, []
    if full_iteration_graph(knobs):
        update["full_iteration_cuda_graph"] = True
        notes.append(f"full-iteration CUDA graph ({knobs.cite('cuda_graph_impl')})")
    elif layer_graph_modules(knobs):
        update["cuda_graph_modules"] = layer_graph_modules(knobs)
        notes.append(f"per-layer CUDA graphs of {'/'.join(update['cuda_graph_modules'])} "
                     f"({knobs.cite('cuda_graph_impl')})")
    if knobs.value("cutedsl_fused_grouped_mlp"):
        update["fused_grouped_mlp"] = True
        notes.append(f"fused grouped MLP, TE op fuser ({knobs.cite('cutedsl_fused_grouped_mlp')})")
    if knobs.value("fp8_dot_product_attention") and dtype not in ("bf16", "fp16"):
        update["fp8_attention"] = True
        notes.append(f"FP8 dot-product attention ({knobs.cite('fp8_dot_product_attention')})")
    kept = (knobs.value("num_layers_at_start_in_bf16", 0), knobs.value("num_layers_at_end_in_bf16", 0))
    if any(kept) and dtype not in ("bf16", "fp16"):
        update["bf16_layers"] = kept
        cited = "num_layers_at_end_in_bf16" if kept[1] else "num_layers_at_start_in_bf16"
        notes.append(f"first {kept[0]} / last {kept[1]} layers in bf16 ({knobs.cite(cited)})")
    if knobs.value("module_dtypes") and dtype not in ("bf16", "fp16"):
        update["module_dtypes"] = dict(knobs.value("module_dtypes"))
        notes.append("per-module precision " + ", ".join(f"{k} {v}" for k, v in update["module_dtypes"].items())
                     + f" ({knobs.cite('module_dtypes')})")
    return update, notes


def full_iteration_graph(knobs: RecipeKnobs) -> bool:
    """Whether the recipe captures the whole iteration in one CUDA graph: cuda_graph_impl
    'full_iteration', or 'local' with scope full_iteration (Megatron-Core's FullCudaGraphWrapper,
    before the impl had its own name). Other graphs are per layer."""
    impl, scope = knobs.value("cuda_graph_impl"), knobs.value("cuda_graph_scope") or []
    return impl == "full_iteration" or (impl == "local" and "full_iteration" in scope)


def layer_graph_modules(knobs: RecipeKnobs) -> tuple[str, ...]:
    """The modules Transformer Engine's per-layer CUDA graphs capture (cuda_graph_impl
    'transformer_engine' with a cuda_graph_scope), as JobSpec.cuda_graph_modules; () for other
    graphs or a scope with a module the model does not know (e.g. mamba)."""
    impl, scope = knobs.value("cuda_graph_impl"), tuple(knobs.value("cuda_graph_scope") or ())
    if impl != "transformer_engine" or not scope or not set(scope) <= set(get_args(CudaGraphModuleName)):
        return ()
    return scope


def uncosted_graph_notes(knobs: RecipeKnobs) -> list[str]:
    """The assumption text for per-layer CUDA graphs the time model does not cost ('local' ones)."""
    impl, scope = knobs.value("cuda_graph_impl"), knobs.value("cuda_graph_scope")
    if not impl or full_iteration_graph(knobs) or layer_graph_modules(knobs):
        return []
    return [f"not costed: CUDA graphs {impl}" + (f" scope {'/'.join(scope)}" if scope else "")
            + f" ({knobs.cite('cuda_graph_impl')})"]


def _uncosted_knobs(knobs: RecipeKnobs) -> list[str]:
    """The recipe's speed knobs the time model does not cost (beyond bridge_recipe_job_updates),
    as assumption texts."""
    out = uncosted_graph_notes(knobs)
    if knobs.value("moe_shared_expert_overlap"):
        out.append(f"not costed: shared-expert overlap ({knobs.cite('moe_shared_expert_overlap')})")
    for name, text in (("moe_paged_stash", "paged activation stash"),):
        if knobs.value(name):
            out.append(f"not costed: {text} ({knobs.cite(name)})")
    if knobs.value("offload_modules"):
        out.append(f"not costed: activation offload of {' '.join(knobs.value('offload_modules'))} "
                   f"({knobs.cite('offload_modules')})")
    rank_cf = knobs.value("moe_expert_rank_capacity_factor")
    if rank_cf:
        out.append(f"not costed: expert-rank capacity {rank_cf:g} padding for the CUDA graph "
                   f"({knobs.cite('moe_expert_rank_capacity_factor')})")
    return out


__all__ = ["MOE_IMBALANCE_LEARNED_DROPLESS", "a2a_overlap_allowed", "bridge_recipe_job_updates", "bridge_recipe_model",
           "bridge_recipe_plan_updates", "full_iteration_graph", "layer_graph_modules", "nvidia_moe_settings", "tp_overlap_update",
           "uncosted_graph_notes"]
