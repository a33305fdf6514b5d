"""The Megatron-Bridge recipe knobs of a dense (Llama-3 / 3.1) bridge_runs.yaml record that the time
and memory model cost, applied to the record's plan and job (issue 9).

planner/data/bridge_recipe_knobs.yaml holds what each release's recipe set (read at that release's
Bridge commit; planner/bridge_recipes.py loads it). Here only what the model already expresses is
applied: recompute (full, block method), TP communication overlap, Megatron-FSDP, FP8 parameter
all-gather, full-iteration CUDA graphs, FP8 attention and CPU activation offload (on a system with a
host tier: the GB200 NVL72 Grace memory). The rest (per-layer CUDA graphs; the parameter-gather
overlap switch) goes into the case's assumptions as "not costed". Layout-dependent knobs (recompute,
FSDP, offload) are applied only where the recipe's tp/pp/cp/micro-batch and FSDP are the record's:
a record run with another layout than its release's recipe was launched with overrides the
repository does not keep.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from planner.bridge_recipes import RecipeKnobs
from planner.megatron.expressible import offload_fraction_of_layers
from planner.plan import Plan
from planner.reference_moe import bridge_recipe_job_updates, tp_overlap_update, uncosted_graph_notes

# dtypes whose weights Bridge's precision helpers gather in FP8 (fp8_param_gather = True):
# bf16_with_fp8_current_scaling_mixed / bf16_with_mxfp8_mixed (training/mixed_precision.py).
_FP8_WEIGHT_DTYPES = ("fp8", "fp8-cs", "mxfp8")


@dataclass
class DenseRecipe:
    """What a dense record's recipe changes: Plan and JobSpec field updates, and the assumptions."""
    plan_update: dict = field(default_factory=dict)
    job_update: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    megatron_fsdp: bool = False  # the recipe turned on Megatron-FSDP the record did not state


def same_layout(knobs: RecipeKnobs, plan: Plan) -> bool:
    """The recipe's tp, pp, cp and micro-batch are the plan's (vpp and global batch may differ:
    the tables print the per-record values, and the gbs only scales accumulation)."""
    lay = knobs.recipe_layout
    return (lay.get("tp"), lay.get("pp"), lay.get("cp", 1) or 1, lay.get("mbs", plan.micro_batch)) == \
        (plan.tp, plan.pp, plan.cp, plan.micro_batch)


def bridge_dense_recipe(knobs: RecipeKnobs, plan: Plan, dtype: str, *, recompute_stated: bool,
                        fsdp_stated: bool, layers: int, host_tier: bool) -> DenseRecipe:
    """The plan/job updates and assumption texts for a dense record's recipe knobs. What the record
    prints wins over the recipe: `recompute_stated` / `fsdp_stated` say it prints recompute / FSDP.
    `layers` is the model's layer count, `host_tier` whether the system has an offload tier.
    A record whose FSDP the recipe contradicts ran another configuration (see the entry's mismatch):
    its recipe's layout-dependent knobs are not applied either."""
    out = DenseRecipe()
    fsdp = knobs.value("use_megatron_fsdp")
    fsdp_agrees = not fsdp_stated or fsdp is None or bool(fsdp) == (plan.zero_stage == 3)
    layout_ok = same_layout(knobs, plan) and fsdp_agrees
    if knobs.mismatch or not layout_ok:
        why = knobs.mismatch or "tp/pp/cp/micro-batch or FSDP"
        out.notes.append(f"recipe {knobs.config} differs from the record ({why}): record layout kept"
                         + ("" if layout_ok else "; the recipe's recompute/FSDP/offload not applied"))
    if layout_ok and not recompute_stated:
        _recompute(knobs, plan, out)
    if layout_ok:
        _megatron_fsdp(knobs, plan, out)
    tp_update, tp_notes = tp_overlap_update(knobs, plan)
    out.plan_update.update(tp_update)
    out.notes.extend(tp_notes)
    if knobs.value("fp8_param_gather") and dtype in _FP8_WEIGHT_DTYPES and not plan.fp8_param_gather:
        out.plan_update["fp8_param_gather"] = True
        out.notes.append(f"FP8 parameter all-gather ({knobs.cite('fp8_param_gather')})")
    out.job_update, job_notes = bridge_recipe_job_updates(knobs, dtype)
    out.notes.extend(job_notes + uncosted_graph_notes(knobs))
    if layout_ok:
        _cpu_offload(knobs, plan, layers, host_tier, out)
    _uncosted(knobs, out)
    return out


def _recompute(knobs: RecipeKnobs, plan: Plan, out: DenseRecipe) -> None:
    granularity = knobs.value("recompute_granularity")
    if granularity == "full":
        # Megatron --recompute-method block --recompute-num-layers N: the first N layers of each
        # (virtual) pipeline stage recompute in full (megatron/core/transformer/transformer_block.py)
        n = knobs.value("recompute_num_layers")
        out.plan_update.update(recompute="full", recompute_num_layers=n, recompute_modules=None)
        out.notes.append(f"full recompute of {n if n else 'all'} layers per stage, block method "
                         f"({knobs.cite('recompute_num_layers' if n else 'recompute_granularity')})")
    elif granularity is None:
        if plan.recompute != "none":
            out.plan_update.update(recompute="none", recompute_modules=None, recompute_num_layers=None)
        out.notes.append(f"no recompute ({knobs.cite('recompute_granularity')})")


def _megatron_fsdp(knobs: RecipeKnobs, plan: Plan, out: DenseRecipe) -> None:
    """Megatron-FSDP with optim_grads_params shards parameters, gradients and optimizer state:
    Plan.zero_stage 3 (Megatron's implementation, dp_impl 'megatron')."""
    fsdp = knobs.value("use_megatron_fsdp")
    if fsdp is None:
        return
    cite = knobs.cite("use_megatron_fsdp")
    if fsdp and knobs.value("data_parallel_sharding_strategy") == "optim_grads_params":
        if plan.zero_stage != 3:
            out.plan_update.update(zero_stage=3, dp_impl="megatron")
            out.megatron_fsdp = True
        out.notes.append(f"Megatron-FSDP, optim_grads_params ({cite})")
    elif not fsdp and plan.zero_stage == 3:
        out.notes.append(f"record's FSDP kept; the recipe runs without Megatron-FSDP ({cite})")


def _cpu_offload(knobs: RecipeKnobs, plan: Plan, layers: int, host_tier: bool, out: DenseRecipe) -> None:
    """--cpu-offloading-num-layers N (Megatron-Core 0.19: ModelParallelConfig.cpu_offloading_num_layers,
    pp 1 and no recompute enforced by TransformerConfig) offloads the activations of N of the block's
    `layers` layers through Transformer Engine's get_cpu_offload_context (schedule and cost:
    planner/analytical/offload.py): the plan's offload_activations N / layers. Weights are never
    offloaded: TE deprecated offload_weights to a no-op (transformer_engine/pytorch/cpu_offload.py)."""
    n = knobs.value("cpu_offloading_num_layers")
    if not n:
        return
    cite = knobs.cite("cpu_offloading_num_layers")
    if not host_tier:
        out.notes.append(f"not costed: CPU offload of {n} layers (the system preset has no host memory tier) ({cite})")
        return
    fraction = offload_fraction_of_layers(n, layers)
    if plan.offload_activations != fraction:
        out.plan_update["offload_activations"] = fraction
    weights = (" (cpu_offloading_weights is a no-op in Transformer Engine: weights stay in HBM)"
               if knobs.value("cpu_offloading_weights") else "")
    out.notes.append(f"CPU offload of {n} of {layers} layers' activations to the host tier on Transformer "
                     f"Engine's per-layer schedule{weights} ({cite})")


def _uncosted(knobs: RecipeKnobs, out: DenseRecipe) -> None:
    if knobs.value("overlap_param_gather") is False:
        out.notes.append(f"not costed: parameter all-gather overlap off ({knobs.cite('overlap_param_gather')})")


__all__ = ["DenseRecipe", "bridge_dense_recipe", "same_layout"]
