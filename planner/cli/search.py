"""`planner plan`, `planner check`, `planner count`, `planner presets`: the search from the CLI."""
from __future__ import annotations

import shlex
from typing import Annotated, Optional

import typer

from hardware.errors import SpecError
from planner.jsonout import json_text
from hardware.load import load_system, system_preset_names
from planner.cli.common import (
    check_new_file,
    check_plan_file_names,
    given_flags,
    CudaGraphOpt,
    Fp8AttentionOpt,
    FusedGroupedMlpOpt,
    kernel_settings,
    DEFAULT_BATCH,
    DEFAULT_MAX_GLOBAL_BATCH,
    DEFAULT_MODEL,
    DEFAULT_SYSTEM,
    CpOpt,
    DpOpt,
    DpOverlapOpt,
    DtypeOpt,
    EpOpt,
    FrameworkOpt,
    GpusOpt,
    IdleGpusOpt,
    JsonOpt,
    MaxBatchOpt,
    MicroBatchOpt,
    ModelOpt,
    NoOffloadOpt,
    OffloadActivationsOpt,
    OffloadOptimizerOpt,
    OffloadWeightsOpt,
    PpOpt,
    RecomputeOpt,
    ReserveOpt,
    SeqOpt,
    SpOpt,
    SystemOpt,
    TpAcrossNodesOpt,
    TpOpt,
    MoeA2aOverlapOpt,
    MoeDispatcherOpt,
    MoeImbalanceOpt,
    Bf16LayersOpt,
    ModuleDtypeOpt,
    module_dtypes_setting,
    bf16_layers_setting,
    AdamMomentsNoPlanOpt,
    adam_moments_setting,
    refuse_moe_flags_on_dense,
    TpOverlapOpt,
    VppOpt,
    ZeroOpt,
    MAX_GLOBAL_BATCH,
    EtpOpt,
    RecomputeModulesOpt,
    check_int,
    given_knobs,
    refuse_contradictions,
    load_inputs,
    make_job,
)
from planner.model import load_model, model_preset_names
from planner.plan import MAX_TOP_K

GIB = 2**30

BatchOpt = Annotated[Optional[int], typer.Option(
    "--global-batch", "-b", help="Global batch in sequences (fixed; default 1536). See --free-batch.")]
FreeBatchOpt = Annotated[bool, typer.Option(
    "--free-batch", help="Let the search pick the batch (<= --max-global-batch); ranks by time per token.")]
SearchCrossEntropyFusionOpt = Annotated[bool, typer.Option(
    "--cross-entropy-fusion/--no-cross-entropy-fusion",
    help="Megatron's fused cross-entropy (--cross-entropy-loss-fusion) in every plan: the same fp32 loss in "
         "fewer passes, no memory cost; --no-cross-entropy-fusion searches Megatron's unfused default.")]
Opt = typer.Option


def _inputs(o: dict):
    check_int("global-batch", o["global_batch"], 1, MAX_GLOBAL_BATCH)
    check_int("max-global-batch", o["max_global_batch"], 1, MAX_GLOBAL_BATCH)
    if o["max_global_batch"] is not None and not o["free_batch"]:
        raise SpecError(f"max-global-batch: caps the batch --free-batch picks; the batch is fixed "
                        f"({o['global_batch'] or DEFAULT_BATCH}), so it would do nothing: add --free-batch or drop it")
    model, system = load_inputs(o["model"], o["system"], o["gpus"], o["seq_length"])
    if o["free_batch"] and o["global_batch"] is not None:
        raise SpecError(f"global-batch: --global-batch {o['global_batch']} fixes the batch and --free-batch "
                        "lets the search pick it; give one (use --max-global-batch to cap a free batch)")
    gb = None if o["free_batch"] else (o["global_batch"] or DEFAULT_BATCH)
    pins = given_knobs(o)
    dispatcher = pins.pop("moe_dispatcher", "alltoall")  # a job setting: the search costs every plan with it
    refuse_contradictions(pins, o["framework"])
    refuse_moe_flags_on_dense(model, o.get("moe_imbalance"), o.get("fused_grouped_mlp"), o.get("moe_dispatcher"),
                              pins.get("ep"), pins.get("etp"))
    if "recompute_modules" in pins:  # a module set names selective recompute (alone: it means it)
        if pins.setdefault("recompute", "selective") != "selective":
            raise SpecError(f"recompute-modules: names what selective recompute reruns (got --recompute "
                            f"{pins['recompute']})")
    max_gb = max(o["max_global_batch"] or DEFAULT_MAX_GLOBAL_BATCH, gb or 0)
    job = make_job(global_batch=gb, max_global_batch=max_gb, dtype=o["dtype"], system=system,
                   hbm_reserve_gib=o["hbm_reserve_gib"], pins=pins, allow_offload=not o["no_offload"],
                   allow_idle_gpus=o["allow_idle_gpus"], framework=o["framework"],
                   tp_within_nvlink=not o["tp_across_nodes"], moe_load_imbalance=o.get("moe_imbalance", 1.0),
                   moe_dispatcher=dispatcher, cross_entropy_fusion=o.get("cross_entropy_fusion", True),
                   **kernel_settings(o.get("cuda_graph", "none"), o.get("fp8_attention", False),
                                     o.get("fused_grouped_mlp", False), moe=model.moe is not None,
                                     mamba=model.mamba is not None),
                   **adam_moments_setting(o.get("adam_moments")), **bf16_layers_setting(o.get("bf16_layers"), model),
                   **module_dtypes_setting(o.get("module_dtype"), model))
    if job.framework == "megatron":
        from planner.megatron.expressible import graph_pin_refusals
        refused = graph_pin_refusals(job.pins, model, job)
        if refused:
            raise SpecError(f"{refused[0]} (--cuda-graph layers); drop one of the two")
        # options the user pinned that Megatron cannot run together (constraints.space.KNOB_RULES):
        # contradictory flags, whatever the hardware
        from constraints.space import megatron_pin_conflicts
        conflicts = megatron_pin_conflicts(job)
        if conflicts:
            raise SpecError(f"pins: {conflicts[0]}; drop one of the two")
    return model, system, job


def _why_lost(best, alt, seq: int, free: bool) -> str:
    """The biggest time-component differences of `alt` vs `best`, per token or per step; within
    the tie tolerance (planner.ties: a simpler plan first) it says so."""
    from planner.report import TIME_LABELS
    from planner.ties import TIE_REL_TOL
    nb = best.plan.global_batch * seq if free else 1.0
    na = alt.plan.global_batch * seq if free else 1.0
    diffs = []
    for key, label in TIME_LABELS.items():
        d = alt.time_breakdown_s[key] / na - best.time_breakdown_s[key] / nb
        diffs.append((d, label))
    diffs.sort(reverse=True)
    base = best.step_time_s / nb
    if alt.step_time_s / na <= best.step_time_s / nb * (1 + TIE_REL_TOL):
        return "tie: the simpler plan ranks first"
    parts = [f"+{d / base:.1%} {label}" for d, label in diffs[:2] if d / base >= 0.0005]
    # and what it gains, so that the parts add up to the loss ("+5.8 % DP comm" for a plan 0.3 %
    # slower read as if it lost 5.8 %)
    gain, label = diffs[-1]
    if parts and gain / base <= -0.0005:
        parts.append(f"saves {-gain / base:.1%} {label}")
    return ", ".join(parts) or "ties"


def _versus_estimate(path: str, model, system, job):
    """The --versus plan, costed for this job: the same model, system, global batch and precision
    (the comparison is of layouts, on one job), and the saved job settings in which its file
    differs from this job ({field: (file's, this job's)}), for the note that says so."""
    from planner.analytical.estimate import estimate, rule_text
    from planner.cli.common import (check_layout_fits_model, check_plan_file_header, check_recompute_layers,
                                    read_plan_mapping, refuse_plan_file_contradictions)
    from planner.model import load_model
    from planner.plan import load_plan
    from planner.planfile import SAVED_JOB_FIELDS, saved_job, saved_reference
    saved_mapping = read_plan_mapping(path, "versus")
    saved_model = saved_system = None
    try:
        if "plan" in saved_mapping:  # a saved plan file: its other fields as `estimate --plan` checks them
            check_plan_file_header(saved_mapping, path)
            # the model and system it was saved for must exist (a layout is one model's, and the
            # note below names a system the file was saved for that this job is not)
            if "model" in saved_mapping:
                saved_model = load_model(saved_reference(saved_mapping["model"], "model", path))
            if "system" in saved_mapping:
                saved_system = load_system(saved_reference(saved_mapping["system"], "system", path))
        plan = load_plan(path)
        saved = saved_job(path, plan)
        check_layout_fits_model(plan, model, path)
        refuse_plan_file_contradictions(plan, model, saved, path)
        check_recompute_layers(plan, model)
    except SpecError as err:  # the file's own errors, named as --versus's
        text = str(err)
        raise SpecError(f"versus: {text if text.startswith('plan ') else f'plan {path}: {text}'}") from None
    said = saved_mapping.get("gpus")
    if said is not None and said != plan.gpus:  # (as `estimate --plan` refuses the same file)
        raise SpecError(f"versus: plan {path}: tp·pp·dp·cp = {plan.gpus} but the file says gpus: {said}; "
                        "change one of them")
    if job.global_batch is None:
        raise SpecError(f"versus: compares plans at one global batch; give -b {plan.global_batch} (the plan's) "
                        "instead of --free-batch")
    if plan.global_batch != job.global_batch:
        raise SpecError(f"versus: the plan {path} runs global batch {plan.global_batch}, this job {job.global_batch}; "
                        f"give -b {plan.global_batch} to compare at the plan's batch")
    if plan.gpus != system.num_gpus:
        raise SpecError(f"versus: the plan {path} runs on tp·pp·dp·cp = {plan.gpus} GPUs, this job on "
                        f"{system.num_gpus}; give -g {plan.gpus} to compare on the plan's GPUs")
    if plan.uses_offload and system.offload is None:
        raise SpecError(f"versus: the plan {path} offloads, and {system.name} has no offload tier")
    try:
        est = estimate(model, system, plan, job)
    except SpecError as err:  # the plan against this job's model (its recompute modules, its FP8 weights)
        raise SpecError(f"versus: plan {path}: {err}") from None
    structural = [rule for rule in est.violations if rule not in ("hbm", "offload_capacity")]
    if structural:
        raise SpecError(f"versus: plan {path}: {rule_text(structural[0], model, plan)}")
    # what the file was saved for and this job is not (both plans are costed for this job)
    differs = {} if saved is None else {
        name: (getattr(saved, name), getattr(job, name)) for name in SAVED_JOB_FIELDS
        if getattr(saved, name) != getattr(job, name)}
    if saved_system is not None and saved_system.name != system.name:
        differs = {"system": (saved_system.name, system.name), **differs}
    if saved_model is not None and saved_model.name != model.name:
        differs = {"model": (saved_model.name, model.name), **differs}
    return est, differs


def _versus_differs_text(differs: dict) -> str:
    """' Note: the file was saved for dtype mxfp8; …' where the --versus file's job differs."""
    from planner.planfile import setting_text
    if not differs:
        return ""
    return (" Note: the file was saved for " + "; ".join(f"{k} {setting_text(v[0])}" for k, v in differs.items())
            + "; both plans are costed here for this command's job ("
            + "; ".join(f"{k} {setting_text(v[1])}" for k, v in differs.items()) + ").")


def _needs_hbm_text(base) -> str:
    """'it needs 91.2 GiB of HBM of 77.6 usable': a --versus plan that does not fit."""
    return f"it needs {base.hbm_bytes / GIB:.1f} GiB of HBM of {base.hbm_capacity_bytes / GIB:.1f} usable"


def _versus_text(path: str, base, best) -> str:
    """One paragraph: the --versus plan's predicted time and where the best plan gains on it."""
    from planner.report import difference_text, time_difference
    parts = difference_text(time_difference(base.time_breakdown_s, best.time_breakdown_s), base.step_time_s)
    ratio = best.step_time_s / base.step_time_s
    verdict = f"the best plan is {1 - ratio:.1%} faster" if ratio <= 1 else f"the best plan is {ratio - 1:.1%} slower"
    head = f"Versus {base.plan.short()} ({path}): "
    if not base.feasible:
        offload = ", and more than the offload tier holds" if "offload_capacity" in base.violations else ""
        return (head + f"it does not fit: {_needs_hbm_text(base)}{offload} (were it to fit: {base.step_time_s:.3f} s "
                f"per step; {verdict}: {parts}).")
    if ratio > 1:  # a plan the search's space or the evidence gates left behind the recommendation
        verdict += " (the search left this plan out, or the evidence gates ranked it behind the recommendation)"
    return head + f"predicted {base.step_time_s:.3f} s per step; {verdict}: {parts}."


def _versus_alone_text(path: str, base) -> str:
    """The --versus plan's own verdict where the search found no plan to set it against."""
    head = f"Versus {base.plan.short()} ({path}): "
    if base.feasible:
        return head + (f"it fits, {base.step_time_s:.3f} s per step, outside what the search may choose "
                       "(see `planner check` for the rules that bind)")
    return head + f"it does not fit either: {_needs_hbm_text(base)}"


def _versus_json(base, best) -> dict:
    from planner.report import time_difference
    out = {"plan": base.plan.short(), "step_time_s": base.step_time_s, "fits": base.feasible,
           "hbm_bytes": base.hbm_bytes, "violations": base.violations}
    if best is not None:
        out["best_over_versus"] = best.estimate.step_time_s / base.step_time_s
        out["difference_s"] = dict(time_difference(base.time_breakdown_s, best.estimate.time_breakdown_s))
    return out


def _published_runs(model, system, job, best) -> list[dict]:
    """Published runs of the best plan's job (planner.evidence.supporting_runs), fastest first."""
    from planner.evidence import supporting_runs
    if best is None:
        return []
    return supporting_runs(model, system.accelerator.name, system.num_gpus, best.plan.global_batch, job.dtype,
                           job.moe_load_imbalance)


def _print_gates(console, result) -> None:
    """Why a faster plan of the model's is not ranked first (planner.recommend's two gates)."""
    job_gate = result.stats.get("job_gate")
    if job_gate:
        g = job_gate
        fastest = result.model_only[0]
        lead = (f"the layout of the published run {g['recommended_from']}, re-scored for this job,"
                if g["recommended_from"] != "search" else f"the model's fastest plan within {g['limit']:.0%} of it")
        console.print(
            f"Measured practice leads: the fastest published run of this job, {g['published_run']} "
            f"({g['published_plan']}, {g['published_dtype']}), measured {g['measured_s']:.3f} s per step. The "
            f"model's fastest plan, {fastest.plan.short()}, is predicted at {g['model_best_s']:.3f} s "
            f"({g['model_best_ratio']:.2f}× that measurement), more than {g['limit']:.0%} faster than any "
            f"measured run of the job, so it is listed as a model-only candidate and {lead} is ranked "
            "first. Measure the candidate before adopting it (--allow-unmeasured ranks the model's plans first).")
        return
    for r in result.model_only[:1]:
        gate = result.stats["evidence_gate"]
        console.print(
            f"Model-only candidate: {r.plan.short()} at {r.estimate.step_time_s:.3f} s per step, "
            f"{gate['model_only_advantage']:.0%} faster than the best plan of a measured family by the "
            f"model alone. No published run is of its family ({gate['model_only_family']}), so "
            "that gain rests on the model alone: measure it before adopting it "
            "(--allow-unmeasured ranks it first).")


def _plan_json(r, model) -> dict:
    from planner.evidence import evidence_note
    data = r.estimate.model_dump()
    data["objective"] = r.objective
    data["stages"] = getattr(r, "stages", None)  # per-stage CP-SAT decisions (None: pp 1 or not affine)
    data["evidence"] = evidence_note(model, r.plan)
    return data


def register(app: typer.Typer) -> None:
    def plan_command(
        model: ModelOpt = DEFAULT_MODEL,
        system: SystemOpt = DEFAULT_SYSTEM,
        gpus: GpusOpt = None,
        seq_length: SeqOpt = None,
        global_batch: BatchOpt = None,
        free_batch: FreeBatchOpt = False,
        max_global_batch: MaxBatchOpt = None,
        dtype: DtypeOpt = None,
        hbm_reserve_gib: ReserveOpt = 2.0,
        top: Annotated[int, Opt("--top", "-k", help="How many distinct layouts to return.")] = 5,
        tp: TpOpt = None, pp: PpOpt = None, dp: DpOpt = None, cp: CpOpt = None, ep: EpOpt = None,
        etp: EtpOpt = None,
        micro_batch: MicroBatchOpt = None, vpp: VppOpt = None, sequence_parallel: SpOpt = None,
        recompute: RecomputeOpt = None, recompute_modules: RecomputeModulesOpt = None,
        zero_stage: ZeroOpt = None, offload_weights: OffloadWeightsOpt = None,
        offload_activations: OffloadActivationsOpt = None, offload_optimizer: OffloadOptimizerOpt = None,
        tp_comm_overlap: TpOverlapOpt = None, dp_comm_overlap: DpOverlapOpt = None,
        moe_a2a_overlap: MoeA2aOverlapOpt = None,
        moe_dispatcher: MoeDispatcherOpt = None,
        moe_imbalance: MoeImbalanceOpt = 1.0,
        adam_moments: AdamMomentsNoPlanOpt = None,
        bf16_layers: Bf16LayersOpt = None,
        module_dtype: ModuleDtypeOpt = None,
        cuda_graph: CudaGraphOpt = "none",
        fp8_attention: Fp8AttentionOpt = False,
        fused_grouped_mlp: FusedGroupedMlpOpt = False,
        cross_entropy_fusion: SearchCrossEntropyFusionOpt = True,
        no_offload: NoOffloadOpt = False,
        framework: FrameworkOpt = "megatron",
        allow_idle_gpus: IdleGpusOpt = False,
        tp_across_nodes: TpAcrossNodesOpt = False,
        allow_unmeasured: Annotated[bool, Opt(
            "--allow-unmeasured", help="Rank the model's fastest plan first even when no measurement supports "
            "its gain: a plan of a family no published run has measured, predicted more than 15 % faster than "
            "the best measured family's plan, or a plan predicted more than 15 % faster than the fastest "
            "published run of the same job (by default such a plan is shown as a model-only candidate beside "
            "the recommendation).")] = False,
        json_out: JsonOpt = False,
        save: Annotated[Optional[str], Opt("--save", help="Write the best plan as YAML (never overwrites).")] = None,
        versus: Annotated[Optional[str], Opt(
            "--versus", metavar="PLAN",
            help="A plan YAML/JSON to set the best plan against (your current layout or a published recipe, "
            "e.g. from `planner estimate --tp .. --pp .. --save`): it is costed for this job (model, system, batch, "
            "precision) and the difference is split by time component: where the gain comes from.")] = None,
    ) -> None:
        """Search for the fastest plans (CP-SAT over the exact model); default: GPT-3 175B on 1024 A100, batch 1536.

        Flags such as --tp or --recompute pin a knob; everything else is searched. Exit code 0 with a
        plan, 1 when nothing fits (then see `planner check`), 2 for a mistake in the input.

        \b
        Examples:
          planner plan -m llama3-70b -s h100-sxm -g 512 -b 1024
          planner plan -m gpt3-175b -s h100-offload-1tib -g 1024 --free-batch --top 10 --json
          planner plan -m llama3-8b -s h100-sxm -g 64 -b 512 --save plan.yaml
          planner plan -m llama3-8b -s h100-sxm -g 64 -b 512 --versus my_layout.yaml
        """
        _plan(dict(locals()))

    def check_command(
        ctx: typer.Context,
        model: ModelOpt = DEFAULT_MODEL,
        system: SystemOpt = DEFAULT_SYSTEM,
        gpus: GpusOpt = None,
        seq_length: SeqOpt = None,
        global_batch: BatchOpt = None,
        free_batch: FreeBatchOpt = False,
        max_global_batch: MaxBatchOpt = None,
        dtype: DtypeOpt = None,
        hbm_reserve_gib: ReserveOpt = 2.0,
        tp: TpOpt = None, pp: PpOpt = None, dp: DpOpt = None, cp: CpOpt = None, ep: EpOpt = None,
        etp: EtpOpt = None,
        micro_batch: MicroBatchOpt = None, vpp: VppOpt = None, sequence_parallel: SpOpt = None,
        recompute: RecomputeOpt = None, recompute_modules: RecomputeModulesOpt = None,
        zero_stage: ZeroOpt = None, offload_weights: OffloadWeightsOpt = None,
        offload_activations: OffloadActivationsOpt = None, offload_optimizer: OffloadOptimizerOpt = None,
        tp_comm_overlap: TpOverlapOpt = None, dp_comm_overlap: DpOverlapOpt = None,
        moe_a2a_overlap: MoeA2aOverlapOpt = None,
        moe_dispatcher: MoeDispatcherOpt = None,
        moe_imbalance: MoeImbalanceOpt = 1.0,
        adam_moments: AdamMomentsNoPlanOpt = None,
        bf16_layers: Bf16LayersOpt = None,
        module_dtype: ModuleDtypeOpt = None,
        cuda_graph: CudaGraphOpt = "none",
        fp8_attention: Fp8AttentionOpt = False,
        fused_grouped_mlp: FusedGroupedMlpOpt = False,
        no_offload: NoOffloadOpt = False,
        framework: FrameworkOpt = "megatron",
        allow_idle_gpus: IdleGpusOpt = False,
        tp_across_nodes: TpAcrossNodesOpt = False,
        json_out: JsonOpt = False,
    ) -> None:
        """Can this model train on this box? Prints yes + the best plan (exit 0) or no + what is missing (exit 1).

        \b
        Example:
          planner check -m gpt3-175b -s a100-80g -g 8 -b 64
        """
        o = dict(locals())
        # the `planner plan` it suggests on more GPUs repeats the user's own flags
        flags = given_flags(o.pop("ctx"), drop=("gpus", "json_out"))
        o["plan_command"] = lambda n: shlex.join(["planner", "plan", *flags, "-g", str(n)])
        raise typer.Exit(_check(o))

    def count_command(
        model: ModelOpt = DEFAULT_MODEL,
        system: SystemOpt = DEFAULT_SYSTEM,
        gpus: GpusOpt = None,
        seq_length: SeqOpt = None,
        global_batch: BatchOpt = None,
        free_batch: FreeBatchOpt = False,
        max_global_batch: MaxBatchOpt = None,
        no_offload: NoOffloadOpt = False,
        framework: FrameworkOpt = "megatron",
        allow_idle_gpus: IdleGpusOpt = False,
        tp_across_nodes: TpAcrossNodesOpt = False,
        json_out: JsonOpt = False,
    ) -> None:
        """Number of valid mappings (knob assignments passing every non-memory rule; memory ignored).

        \b
        Example:
          planner count -m seed-1t-256blocks -s h100-sxm -g 4096 --free-batch
        """
        o = dict(locals())
        o.update(dtype=None, hbm_reserve_gib=2.0)  # the GPU's default precision (fp16 on a V100)
        from planner.search import count
        model_spec, system_spec, job = _inputs(o)
        n = count(model_spec, system_spec, job)
        if json_out:
            print(json_text({"model": model_spec.name, "system": system_spec.name,
                              "gpus": system_spec.num_gpus, "seq_length": model_spec.seq_length, "mappings": n,
                              "global_batch": job.global_batch,
                              "max_global_batch": None if job.global_batch else job.max_global_batch}))
        else:
            batch = f"global batch {job.global_batch}" if job.global_batch else \
                f"any global batch <= {job.max_global_batch}"
            print(f"{n:,} valid mappings of {model_spec.name} ({model_spec.layers} layers) on "
                  f"{system_spec.num_gpus} GPUs ({system_spec.name}), {batch}, memory ignored")

    def presets_command(json_out: JsonOpt = False) -> None:
        """List model and system presets with their key numbers.

        \b
        Example:
          planner presets --json
        """
        models = [load_model(n) for n in model_preset_names()]
        systems = [load_system(n) for n in system_preset_names()]
        if json_out:
            print(json_text({
                "models": [{"name": m.name, "params": m.num_params, "layers": m.layers, "hidden": m.hidden,
                            "heads": m.heads, "kv_groups": m.kv_groups, "ffn": m.ffn_hidden,
                            "seq_length": m.seq_length, "experts": m.moe.num_experts if m.moe else None,
                            "top_k": m.moe.top_k if m.moe else None,
                            "moe_layers": m.moe_layers if m.moe else None} for m in models],
                "systems": [{"name": s.name, "accelerator": s.accelerator.name, "gpus": s.num_gpus,
                             "gpus_per_node": s.gpus_per_node, "hbm_gib": s.accelerator.hbm_capacity_gib,
                             "nvlink_domain": s.nvlink_domain_gpus, "peak_flops": s.accelerator.peak_flops,
                             "source": s.source,
                             "offload_gib": s.offload.capacity_gib if s.offload else None,
                             "offload_gb_per_s": s.offload.bandwidth_gb_per_s if s.offload else None}
                            for s in systems]},
                indent=2))
            return
        # plain text, not rich: full preset names in any terminal width or pipe, and ~0.1 s less
        # start-up (rich's import and table layout; `planner presets` goal: 0.3 s, issue 10)
        model_rows = [(m.name, f"{m.num_params / 1e9:,.1f}", str(m.layers), str(m.hidden), str(m.heads),
                       str(m.kv_groups), str(m.ffn_hidden), str(m.seq_length),
                       (f"{m.moe.num_experts}x top-{m.moe.top_k}" if m.moe else "")
                       + (f", {m.moe_layers} of {m.layers} layers" if m.moe and m.moe.layer_step > 1 else "")
                       + (" (hybrid Mamba)" if m.hybrid_pattern else "")) for m in models]
        print(_text_table("Model presets (--model)", ("name", "params (B)", "layers", "hidden", "heads", "kv groups",
                                                      "ffn", "seq", "MoE"), model_rows, left=1))
        system_rows = [(s.name, s.accelerator.name, str(s.num_gpus), str(s.gpus_per_node), str(s.nvlink_domain_gpus),
                        f"{s.accelerator.hbm_capacity_gib:g}",
                        f"{s.accelerator.peak_flops['bf16'] / 1e12:,.0f}" if "bf16" in s.accelerator.peak_flops else "-",
                        f"{s.offload.capacity_gib:g} GiB @ {s.offload.bandwidth_gb_per_s:g} GB/s" if s.offload else "-")
                       for s in systems]
        print()
        print(_text_table("System presets (--system)", ("name", "accelerator", "GPUs", "per node", "NVLink domain",
                                                        "HBM GiB", "BF16 TFLOP/s", "offload"), system_rows, left=2))
        print()
        for s in systems:  # where each system's figures come from (details in hardware/presets/*.yaml)
            dtypes = ", ".join(sorted(k for k in s.accelerator.peak_flops if k not in ("fp32", "tf32")))
            print(f"{s.name}: {dtypes}; source: {s.source or '-'}")

    app.command("plan")(plan_command)
    app.command("check")(check_command)
    app.command("count")(count_command)
    app.command("presets")(presets_command)


def _plan(o: dict) -> None:
    from planner.recommend import recommend
    check_int("top", o["top"], 1, MAX_TOP_K)
    check_new_file("save", o["save"])
    if o["save"] is not None:  # what the file will name: said before the search, not after
        check_plan_file_names(o.get("model"), o.get("system"))
    model, system, job = _inputs(o)
    baseline, differs = _versus_estimate(o["versus"], model, system, job) if o.get("versus") is not None \
        else (None, {})
    result = recommend(model, system, job, top_k=o["top"], allow_unmeasured=o["allow_unmeasured"])
    free = job.global_batch is None
    why = None
    if result.best is None:  # the same diagnosis `planner check` prints, for the text and the JSON
        from planner.search import check
        why = check(model, system, job, searcher=lambda: result)  # (the search just run found nothing)
        refuse_contradictory_pins(why)
    if o["save"] is not None and result.best is not None:
        # written before the output: a reader that leaves early (`| head`) ends the printing with
        # exit 141, and the file asked for was lost with it.
        # Everything the launch needs (planner/planfile.py), so `megatron/estimate --plan` agree
        from planner.planfile import plan_file_data
        from planner.cli.common import write_plan_file
        write_plan_file(o["save"], plan_file_data(result.best.plan, o["model"], o["system"], model, system, job,
                                                  step_time_s=result.best.estimate.step_time_s,
                                                  objective=result.objective))
    if o["json_out"]:
        from planner.report import kernel_json, precision_json
        out = {"model": model.name, "system": system.name, "gpus": system.num_gpus,
               "precision": precision_json(job), "kernel_settings": kernel_json(job),
               "objective": result.objective, "plans": [_plan_json(r, model) for r in result.ranked],
               "model_only": [_plan_json(r, model) for r in result.model_only],
               "published_runs": _published_runs(model, system, job, result.best),
               "stats": result.stats}
        if why is not None:
            out["no_plan"] = {"reasons": why.reasons, "binding_rules": why.binding_rules, "numbers": why.numbers}
        if baseline is not None:
            out["versus"] = {**_versus_json(baseline, result.best),
                             "file_job_differs": {k: [getattr(v, "model_dump", lambda v=v: v)() for v in pair]
                                                  for k, pair in differs.items()}}
        print(json_text(out))
    else:
        from planner.cli.console import Console
        from rich.table import Table
        from rich.text import Text

        from planner.report import offload_note, print_estimate
        console = Console()
        if why is not None:
            console.print(Text.assemble(("No plan fits.", "bold red"), " " + ("; ".join(why.reasons[:2]) if why.reasons
                                        else "Run `planner check` with the same options to see why.")))
            if baseline is not None:  # a layout outside the search's rules (e.g. TP across nodes) may still fit
                console.print(_versus_alone_text(o["versus"], baseline) + _versus_differs_text(differs))
        else:
            best = result.best.estimate
            print_estimate(console, model, system, best, title="Best plan: step time", job=job)
            if "uneven_split_note" in result.stats:
                console.print(f"Note: it {result.stats['uneven_split_note']}")
            if "offload_gain" in result.stats:
                console.print(offload_note(model, system, result.best.plan, best, result.stats["offload_gain"]))
            if len(result.ranked) > 1:
                # plans within TIE_REL_TOL of each other are ties: the simpler ranks first (planner.ties)
                t = Table(title=f"Next best layouts (ranked by {result.objective}; within 0.1 % the simpler first)",
                          show_edge=False)
                # batch and tokens/s say something only where the plans' global batches differ
                # (a free batch); at one batch the step time ranks them alone
                batches = len({r.plan.global_batch for r in result.ranked}) > 1
                columns = ("#", "plan", *(("batch",) if batches else ()), "step s",
                           *(("tokens/s",) if batches else ()), "vs best", "MFU", "HBM GiB", "why it lost")
                for col in columns:  # a plan's layout folds onto more lines rather than lose its end
                    t.add_column(col, justify="left" if col in ("plan", "why it lost") else "right",
                                 overflow="fold" if col == "plan" else "ellipsis")
                for i, r in enumerate(result.ranked[1:], start=2):
                    e = r.estimate
                    # a row ranked above a faster one (within TIE_REL_TOL, the simpler first) says so
                    faster = [j for j, later in enumerate(result.ranked[i:], start=i + 1)
                              if later.objective < r.objective]
                    why = _why_lost(best, e, model.seq_length, free)
                    if faster and not why.startswith("tie"):
                        why = f"{why}; above #{faster[0]} (a tie: the simpler first)"
                    t.add_row(str(i), r.plan.short(), *((str(r.plan.global_batch),) if batches else ()),
                              f"{e.step_time_s:.3f}", *((f"{e.tokens_per_s:,.0f}",) if batches else ()),
                              f"{r.objective / result.best.objective - 1:+.1%}",  # ties: a simpler plan may lead by < TIE_REL_TOL
                              f"{e.mfu:.1%}", f"{e.hbm_bytes / GIB:.1f}",
                              why)
                console.print(t)
            _print_gates(console, result)
            if baseline is not None:
                console.print(_versus_text(o["versus"], baseline, result.best.estimate) + _versus_differs_text(differs))
            s = result.stats
            console.print(f"searched {s['space_size']:,} mappings ({s['layouts']:,} layouts; {s['evaluated']:,} "
                          f"evaluated exactly, {s['table_rows']:,} given to CP-SAT) in {s['total_s']:.2f} s")
            st = result.best.stages
            if st:  # the per-stage CP-SAT model (constraints/stages.py)
                verdict = "proven optimal" if st["proven_optimal"] else st["status"].lower()
                if st.get("window_layers"):  # a long hybrid stack: searched near its mean-block split
                    verdict += f" (each stage bound kept within {st['window_layers']} layers of the mean-block split)"
                what = "kept" if st["kept"] else "no better than the balanced split, not used"
                console.print(f"per-stage CP-SAT: layers per virtual stage + recompute count, "
                              f"{st['variables']} variables, {st['constraints']} constraints, {verdict} "
                              f"in {st['solve_s']:.3f} s ({what})")
    if o["save"] is not None and result.best is not None and not o["json_out"]:
        print(f"wrote {o['save']}")
    if result.best is None:
        raise typer.Exit(1)  # like `planner check`: 1 = nothing fits (2 is kept for input errors)


def _text_table(title: str, headers: tuple[str, ...], rows: list[tuple[str, ...]], left: int) -> str:
    """Columns padded to their widest cell; the first `left` columns left-aligned, the rest right."""
    widths = [max(len(r[i]) for r in [headers, *rows]) for i in range(len(headers))]

    def line(cells) -> str:
        return "  ".join(c.ljust(w) if i < left else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths))).rstrip()
    return "\n".join([title, line(headers), line(["-" * w for w in widths]), *map(line, rows)])


def refuse_contradictory_pins(res) -> None:
    """Pins that together leave no layout of the job (each alone passed its own check: tp 8 and
    pp 16 on 64 GPUs) are a mistake in the input, told in one line with exit 2 as `estimate` tells
    them, not a box where nothing fits (exit 1: memory)."""
    if "pins" in res.binding_rules:
        raise SpecError("; ".join(res.reasons))


def _check(o: dict) -> int:
    from planner.recommend import recommend
    from planner.report import kernel_json, precision_json
    from planner.search import check
    model, system, job = _inputs(o)
    recommended = []

    def searcher():  # the plan `planner plan` recommends (gated on published runs), not the raw best
        recommended.append(recommend(model, system, job, top_k=1, offload_gain=False))  # check prints no gain
        return recommended[-1]
    res = check(model, system, job, searcher=searcher, plan_command=o.get("plan_command"))
    refuse_contradictory_pins(res)
    model_only = recommended[-1].model_only if res.feasible and recommended else []
    if o["json_out"]:
        print(json_text({"feasible": res.feasible, "model": model.name, "system": system.name,
                          "gpus": system.num_gpus, "precision": precision_json(job),
                          "kernel_settings": kernel_json(job), "best": _plan_json(res.best, model) if res.best else None,
                          "model_only": [_plan_json(r, model) for r in model_only], "reasons": res.reasons,
                          "binding_rules": res.binding_rules, "numbers": res.numbers}))
        return 0 if res.feasible else 1
    from rich.text import Text

    from planner.cli.console import Console
    from planner.report import describe_plan, fold_at_separators
    console = Console()
    if res.feasible:
        console.print(Text.assemble(("yes", "bold green"), f": {model.name} trains on {system.num_gpus}× "
                                    f"{system.accelerator.name} ({system.name})"))
        console.print(fold_at_separators(describe_plan(res.best.estimate, model.layers), console.width))
        e = res.best.estimate
        console.print(f"{e.step_time_s:.3f} s per step · MFU {e.mfu:.1%} · {e.hbm_bytes / GIB:.1f} of "
                      f"{e.hbm_capacity_bytes / GIB:.1f} GiB HBM per GPU")
        for line in res.reasons:  # how the plan was found, where that qualifies it
            console.print(f"Note: it {line}")
        if model_only:
            fast = model_only[0]
            console.print(f"(the model alone predicts {fast.estimate.step_time_s:.3f} s with {fast.plan.short()}, "
                          "a gain no published run supports: `planner plan` shows it as a model-only candidate)")
        return 0
    console.print(Text.assemble(("no", "bold red"), f": no plan of {model.name} fits on {system.num_gpus}× "
                                f"{system.accelerator.name} ({system.name})"))
    if res.binding_rules:
        from constraints.encode import RULE_TEXT
        console.print("binding rules: " + "; ".join(f"{n} ({RULE_TEXT.get(n, n)})" for n in res.binding_rules))
    for line in res.reasons:
        console.print(f"  - {line}")
    return 1
