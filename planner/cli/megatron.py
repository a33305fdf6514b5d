"""`planner megatron`: a plan -> a Megatron-LM launch (script, args or JSON) that Megatron accepts,
that means the plan, and that the model says fits."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from hardware.errors import SpecError, refuse_dash, shortened
from planner.cli.common import (
    DEFAULT_MAX_GLOBAL_BATCH,
    LAYOUT_FLAGS,
    PERF_KNOBS,
    RECIPE_KNOB_DEFAULTS,
    CrossEntropyFusionOpt,
    Fp8ParamGatherOpt,
    GradReduceBf16Opt,
    gpu_count_mismatch,
    CudaGraphOpt,
    kernel_settings,
    check_dtype_on_system,
    check_module_dtypes_on_system,
    check_job_reserve,
    check_layout_fits_model,
    check_recompute_layers,
    refuse_plan_file_contradictions,
    refuse_plan_flags_beside_plan_file,
    refuse_moe_flags_on_dense,
    with_moe_imbalance,
    check_new_file,
    Bf16LayersOpt,
    ModuleDtypeOpt,
    module_dtypes_setting,
    check_bf16_layers_fit,
    bf16_layers_setting,
    AdamMomentsOpt,
    adam_moments_setting,
    DEFAULT_BATCH,
    BatchOpt,
    CpOpt,
    DpOpt,
    DpOverlapOpt,
    DpImplOpt,
    EpOpt,
    EtpOpt,
    MoeA2aOverlapOpt,
    MoeImbalancePlanOpt,
    MoeDispatcherOpt,
    GpusOpt,
    MicroBatchOpt,
    OffloadActivationsOpt,
    OffloadOptimizerOpt,
    OffloadWeightsOpt,
    PpOpt,
    PipelineLayoutOpt,
    RecomputeLayersOpt,
    StageRecomputeOpt,
    RecomputeModulesOpt,
    RecomputeOpt,
    SavedModelOpt,
    SavedSystemOpt,
    SeqOpt,
    SpOpt,
    TpOpt,
    TpOverlapOpt,
    VppOpt,
    ZeroOpt,
    POSITIVE_KNOBS,
    given_knobs,
    layout_knobs,
    load_inputs_for_plan,
    make_job,
    plan_from_knobs,
)
from planner.plan import load_plan

FORMATS = ("script", "args", "json")
GIB = 2**30

MegatronReserveOpt = Annotated[Optional[float], typer.Option(
    "--hbm-reserve-gib", help="HBM per GPU kept free for CUDA context, NCCL and fragmentation (GiB; "
                              "default: the plan file's, else 2).")]
MegatronDtypeOpt = Annotated[Optional[str], typer.Option(
    "--dtype", help="Compute precision: bf16, fp16, fp8 (delayed scaling), fp8-cs (current scaling), fp8-block (DeepSeek-V3 block scales), "
                    "mxfp8 or nvfp4 (Blackwell). Default: the plan file's, else bf16, or fp16 on a GPU without "
                    "bf16 (V100).")]


def megatron_command(
    model: SavedModelOpt = None,
    system: SavedSystemOpt = None,
    gpus: GpusOpt = None,
    seq_length: SeqOpt = None,
    global_batch: BatchOpt = None,
    dtype: MegatronDtypeOpt = None,
    hbm_reserve_gib: MegatronReserveOpt = None,
    plan_file: Annotated[Optional[str], typer.Option(
        "--plan", help="Plan file (YAML/JSON; a top-level `plan:` mapping as `planner plan --save` writes). "
                       "-m/-s/-g/--seq-length given beside it replace the file's (the same plan launched for "
                       "another model file, system or sequence, re-checked there); the plan's own fields may "
                       "not be overridden.")] = None,
    tp: TpOpt = None, pp: PpOpt = None, dp: DpOpt = None, cp: CpOpt = None, ep: EpOpt = None,
    micro_batch: MicroBatchOpt = None, vpp: VppOpt = None, sequence_parallel: SpOpt = None,
    recompute: RecomputeOpt = None, recompute_modules: RecomputeModulesOpt = None,
    recompute_num_layers: RecomputeLayersOpt = None, zero_stage: ZeroOpt = None,
    pipeline_layout: PipelineLayoutOpt = None, stage_recompute_layers: StageRecomputeOpt = None,
    offload_activations: OffloadActivationsOpt = None, offload_optimizer: OffloadOptimizerOpt = None,
    offload_weights: OffloadWeightsOpt = None, tp_comm_overlap: TpOverlapOpt = None,
    dp_comm_overlap: DpOverlapOpt = None,
    etp: EtpOpt = None, dp_impl: DpImplOpt = None, moe_dispatcher: MoeDispatcherOpt = None,
    moe_a2a_overlap: MoeA2aOverlapOpt = None, moe_imbalance: MoeImbalancePlanOpt = None,
    cross_entropy_fusion: CrossEntropyFusionOpt = None, grad_reduce_in_bf16: GradReduceBf16Opt = None,
    fp8_param_gather: Fp8ParamGatherOpt = None,
    adam_moments: AdamMomentsOpt = None,
    bf16_layers: Bf16LayersOpt = None,
    module_dtype: ModuleDtypeOpt = None,
    cuda_graph: CudaGraphOpt = None,
    write_gb_per_s: Annotated[Optional[float], typer.Option(
        "--write-gb-per-s", help="Checkpoint storage write bandwidth, GB/s, as `planner checkpoint` "
                                 "(default: its default).")] = None,
    gpu_mtbf_hours: Annotated[Optional[float], typer.Option(
        "--gpu-mtbf-hours", help="Per-GPU MTBF in hours, as `planner checkpoint` (default: its default).")] = None,
    fmt: Annotated[str, typer.Option("--format", help="Output: script (bash), args (one line) or json.")] = "script",
    output: Annotated[Optional[str], typer.Option(
        "--output", "-o", help="Write to this file (never overwrites an existing file).")] = None,
) -> None:
    """Emit Megatron-LM `pretrain_gpt.py` arguments (hybrid Mamba stacks: `pretrain_mamba.py`)
    and a torchrun script for a plan.

    The plan comes from --plan FILE, from plan flags that include --tp, --pp, --dp or --cp (unset knobs: tp=pp=cp=1, dp fills the GPUs,
    sequence parallelism where tp > 1, ZeRO-1 with overlapped DP communication: the plan `planner estimate` costs for the same flags),
    or, with neither, from the search: `planner plan`'s best plan for the model, system, GPUs,
    sequence, batch (1536 unless -b is given), precision and routing skew given here, with plan's
    defaults for its other search options (for those, `planner plan ... --save FILE`, then --plan FILE). The plan must pass the rules and memory check of
    `planner estimate`; otherwise exit 2 with what breaks. The script saves checkpoints at the
    Daly interval of `planner checkpoint` and logs throughput.

    \b
    Example:
      planner megatron -m llama3-70b -s h100-sxm -g 64 -b 128 --tp 8 --pp 4 --sequence-parallel
    """
    _run(locals())


def _job(o: dict, model, system, plan=None):
    """JobSpec for the launch: a plan file's saved job settings, unless the user overrides them."""
    from planner.planfile import job_for_plan_file
    if o["global_batch"] is not None and o["global_batch"] < 1:
        raise SpecError(f"global-batch: must be a positive integer, got {o['global_batch']}")
    moments = adam_moments_setting(o["adam_moments"])
    bf16 = bf16_layers_setting(o["bf16_layers"], model)
    modules = module_dtypes_setting(o["module_dtype"], model)
    graphs = _graph_settings(o["cuda_graph"], model)
    skew = o["moe_imbalance"]
    saved = job_for_plan_file(o["plan_file"], plan, dtype=o["dtype"], hbm_reserve_gib=o["hbm_reserve_gib"],
                              adam_moments=moments.get("adam_moments"), bf16_layers=bf16.get("bf16_layers"),
                              module_dtypes=modules.get("module_dtypes"), moe_load_imbalance=skew,
                              **graphs) if plan is not None else None
    if saved is not None:
        saved = with_moe_imbalance(saved, skew)
        check_dtype_on_system(saved.dtype, system)
        check_module_dtypes_on_system(saved.module_dtypes, system, f"plan ({o['plan_file']}): job: module_dtypes")
        check_job_reserve(saved, system, o["plan_file"], o["hbm_reserve_gib"])
        check_bf16_layers_fit(saved.bf16_layers, model)
        return saved
    batch = plan.global_batch if plan is not None else (o["global_batch"] or DEFAULT_BATCH)
    # the default cap bounds the search's free batches only: a given batch is taken as it is
    job = make_job(global_batch=batch, max_global_batch=max(DEFAULT_MAX_GLOBAL_BATCH, batch), dtype=o["dtype"],
                   system=system, hbm_reserve_gib=2.0 if o["hbm_reserve_gib"] is None else o["hbm_reserve_gib"],
                   moe_load_imbalance=1.0 if skew is None else skew, **moments, **bf16, **modules, **graphs)
    check_job_reserve(job, system, None, o["hbm_reserve_gib"])
    return job


def _graph_settings(cuda_graph: str | None, model) -> dict:
    """The JobSpec fields of --cuda-graph, as `plan` and `estimate` read it ({} when not given: a
    plan file's own setting stands)."""
    if cuda_graph is None:
        return {}
    kernels = kernel_settings(cuda_graph, moe=model.moe is not None, mamba=model.mamba is not None)
    return {field: kernels[field] for field in ("full_iteration_cuda_graph", "cuda_graph_modules")}


def _plan_and_job(o: dict, model, system):
    for knob in POSITIVE_KNOBS:
        if o[knob] is not None and o[knob] < 1:
            raise SpecError(f"{knob.replace('_', '-')}: must be a positive integer, got {o[knob]}")
    given = given_knobs(o)
    # (the layout flags before layout_knobs, which would ask for --pp or a layout)
    refuse_plan_flags_beside_plan_file(o["plan_file"], {k: o[k] for k in ("pipeline_layout", "stage_recompute_layers")})
    given.update(layout_knobs(o["pipeline_layout"], o["stage_recompute_layers"], given, model))
    perf = {k: o[k] for k in PERF_KNOBS if o[k] is not None}
    if o["plan_file"] is not None:
        refuse_plan_flags_beside_plan_file(o["plan_file"], {**given, **perf})
        plan = load_plan(o["plan_file"])
        if o["global_batch"] is not None and o["global_batch"] != plan.global_batch:
            raise SpecError(f"global-batch: {o['global_batch']} differs from the plan's "
                            f"global_batch ({plan.global_batch})")
        check_layout_fits_model(plan, model, o["plan_file"])  # a layout is one model's: say so, naming the file
        job = _job(o, model, system, plan)
        refuse_plan_file_contradictions(plan, model, job, o["plan_file"])
        return plan, job
    job = _job(o, model, system)
    if any(o[k] is not None for k in LAYOUT_FLAGS):
        # the knobs `planner estimate` fills for the same flags (SP where tp > 1 splits the sequence:
        # plan_from_knobs turns a default SP off where it does not; Megatron's MoE layers at tp > 1
        # need it)
        return plan_from_knobs({**given, **perf}, system.num_gpus, job.global_batch, RECIPE_KNOB_DEFAULTS,
                               model.seq_length, expert_biases=model.moe is not None and model.biases,
                               layers=model.layers), job
    if given or perf:
        first = next(iter({**given, **perf})).replace("_", "-")
        raise SpecError(f"plan: --{first} describes a plan only beside --tp, --pp, --dp or --cp (unset: tp=pp=cp=1, "
                        "dp fills the GPUs); add one, or give --plan FILE, or no plan flags for `planner plan`'s best")
    from planner.recommend import recommended_plan
    plan = recommended_plan(model, system, job)
    if plan is None:
        raise SpecError("plan: the search found no plan that fits; give --plan FILE or --tp/--pp/--dp "
                        "(see `planner check`)")
    return plan, job


def fit_problems(est, system, model) -> list[str]:
    """`planner estimate`'s verdict as one-line reasons, with the amounts."""
    from planner.analytical.estimate import rule_text
    out = []
    for rule in est.violations:
        if rule == "hbm":
            cap = est.hbm_capacity_bytes
            out.append(f"memory: the plan needs {est.hbm_bytes / GIB:.2f} GiB per GPU but {system.name} has "
                       f"{cap / GIB:.2f} GiB usable (HBM minus the reserve): {(est.hbm_bytes - cap) / GIB:.2f} GiB over")
        elif rule == "offload_capacity" and system.offload is None:
            out.append(f"offload: the plan offloads {est.offload_bytes / GIB:.2f} GiB per GPU but {system.name} has "
                       "no offload memory tier")
        elif rule == "offload_capacity":
            out.append(f"offload: the plan offloads {est.offload_bytes / GIB:.2f} GiB per GPU but the tier holds "
                       f"{est.offload_capacity_bytes / GIB:.2f} GiB")
        else:
            out.append(rule_text(rule, model, est.plan))
    return out


def save_interval_iters(model, system, plan, step_time_s: float, write_gb_per_s: float | None = None,
                        gpu_mtbf_hours: float | None = None, warnings: list[str] | None = None,
                        adam_moments: str = "fp32") -> int:
    """Iterations between checkpoints: `planner checkpoint`'s Daly interval (same storage bandwidth
    and MTBF defaults, the checkpoint of the launch's Adam moments: bf16 ones save 4 B/param, not
    8) over the plan's step time; what `planner checkpoint` would warn of (writes that cannot keep
    up with failures) is added to `warnings`."""
    from planner.checkpoint import checkpoint_report
    from planner.cli.checkpoint import DEFAULT_WRITE_GB_PER_S
    from planner.plan import BytesPerParam
    bandwidth = DEFAULT_WRITE_GB_PER_S if write_gb_per_s is None else write_gb_per_s
    report = checkpoint_report(model, system, plan, write_gb_per_s=bandwidth, read_gb_per_s=bandwidth,
                               gpu_mtbf_hours=gpu_mtbf_hours,
                               bytes_per_param=BytesPerParam.for_adam_moments(adam_moments))
    if warnings is not None:
        warnings.extend(report.notes)
    return max(1, round(report.daly_interval_s / step_time_s))


# The kernel settings `plan` / `estimate` cost (JobSpec) that this launch does not carry: Megatron
# 0.19's parser excludes fp8_dot_product_attention from its command line (training/arguments.py,
# the TransformerConfig fields it does not expose); the fused grouped MLP is Megatron-Bridge's
# CuTeDSL kernel, not a Megatron flag; a full-iteration graph is emitted for dense models
# (--cuda-graph-impl full_iteration), but a dropless MoE layer has data-dependent shapes, which a
# graph takes only with HybridEP's per-rank capacity and paged stashing
# (--moe-expert-rank-capacity-factor, --moe-paged-stash), whose padding the planner does not
# cost. A launch without them would not be the plan that was costed.
UNEMITTED_KERNELS = (
    ("full_iteration_cuda_graph", "cuda-graph full-iteration",
     "a dropless MoE graph needs HybridEP's per-rank capacity and paged stashing, whose padding is not costed"),
    ("fp8_attention", "fp8-attention", "Megatron 0.19's parser has no flag for it"),
    ("fused_grouped_mlp", "fused-grouped-mlp", "it is Megatron-Bridge's CuTeDSL kernel, not a Megatron flag"))


def _refuse_unemitted_kernels(job, model) -> None:
    on = [(flag, why) for field, flag, why in UNEMITTED_KERNELS if getattr(job, field)
          and (field != "full_iteration_cuda_graph" or model.moe is not None)]
    if on:
        raise SpecError(f"{on[0][0].split()[0]}: the plan was costed with --{', --'.join(f for f, _ in on)}, which "
                        f"`planner megatron` does not emit here ({'; '.join(w for _, w in on)}); re-plan without "
                        f"{'them' if len(on) > 1 else 'it'}, or add the settings to the launch by hand")


def _run(o: dict) -> None:
    from planner import megatron as mg
    from planner.analytical import estimate

    o["fmt"] = o["fmt"].strip().lower()
    if o["fmt"] not in FORMATS:
        raise SpecError(f"format: unknown {shortened(o['fmt'])!r}; allowed: {', '.join(FORMATS)}")
    if o["gpus"] is not None and o["gpus"] < 1:
        raise SpecError(f"gpus: must be a positive integer, got {o['gpus']}")
    refuse_dash(o["output"], "output", "leave -o out to print the launch, or give the name of a new file",
                "standard output")
    check_new_file("output", o["output"], example="launch.sh")
    from planner.cli.checkpoint import check_checkpoint_flags
    check_checkpoint_flags(write_gb_per_s=o["write_gb_per_s"], gpu_mtbf_hours=o["gpu_mtbf_hours"])
    model, system = load_inputs_for_plan(o["model"], o["system"], o["gpus"], o["seq_length"], o["plan_file"])
    refuse_moe_flags_on_dense(model, o["moe_imbalance"], None, o["moe_dispatcher"], o["ep"], o["etp"])
    plan, job = _plan_and_job(o, model, system)
    check_recompute_layers(plan, model)
    _refuse_unemitted_kernels(job, model)

    if plan.gpus != system.num_gpus:  # blamed on what set each count: the file, --gpus or the flags
        raise SpecError(gpu_count_mismatch(plan, system, o["plan_file"], o["gpus"]))
    problems = mg.launch_refusals(plan, model, job, system)
    if not problems:
        est = estimate(model, system, plan, job)
        problems = fit_problems(est, system, model)
    if problems:
        raise SpecError("; ".join(problems))
    checkpoint_warnings: list[str] = []
    launch = mg.megatron_args(plan, model, job, system,
                              save_interval=save_interval_iters(model, system, plan, est.step_time_s,
                                                                o["write_gb_per_s"], o["gpu_mtbf_hours"],
                                                                checkpoint_warnings, job.adam_moments))
    for warning in checkpoint_warnings:  # in the script's notes, and said now
        launch.notes.append(f"checkpoint interval: {warning}")
        typer.echo(f"note: checkpoint interval: {warning}", err=True)
    problems = mg.validate_launch(launch, mg.gpu_arch_major(system))
    if problems:
        raise SpecError("megatron: " + "; ".join(problems))
    try:
        text = mg.render(launch, o["fmt"])
    except ValueError as err:  # a format that cannot carry what the launch needs
        raise SpecError(str(err)) from None
    if o["fmt"] == "args" and launch.entrypoint != mg.ENTRYPOINT:
        # one line of flags does not name its script; the script and json formats do
        typer.echo(f"note: these are {launch.entrypoint} arguments, not {mg.ENTRYPOINT}'s", err=True)
    if o["output"] is None:
        typer.echo(text, nl=not text.endswith("\n"))
        return
    try:
        with open(o["output"], "x") as handle:  # "x": never overwrite, even in a race
            handle.write(text)
    except FileExistsError:
        raise SpecError(f"output: {o['output']} already exists; refusing to overwrite it") from None
    except OSError as exc:
        raise SpecError(f"output: cannot write {o['output']} ({exc.strerror})") from None
    if o["fmt"] == "script":
        Path(o["output"]).chmod(0o755)
    typer.echo(f"wrote {o['output']} ({plan.short()}, {launch.nnodes} nodes x {launch.gpus_per_node} GPUs)")


def register(app: typer.Typer) -> None:
    app.command("megatron")(megatron_command)
