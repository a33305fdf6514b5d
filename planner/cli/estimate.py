"""`planner estimate`: the exact model for one plan given by flags or a plan file."""
from __future__ import annotations

from typing import Annotated, Optional

import typer

from hardware.errors import SpecError
from planner.analytical import estimate
from planner.cli.common import (
    DEFAULT_MODEL,
    DEFAULT_SYSTEM,
    check_new_file,
    check_plan_file_names,
    write_plan_file,
    check_dtype_on_system,
    check_module_dtypes_on_system,
    check_job_reserve,
    check_layout_fits_model,
    refuse_plan_file_contradictions,
    refuse_plan_flags_beside_plan_file,
    check_recompute_layers,
    CudaGraphOpt,
    Fp8AttentionOpt,
    FusedGroupedMlpOpt,
    kernel_settings,
    DEFAULT_BATCH,
    BatchOpt,
    CpOpt,
    DpOpt,
    DpOverlapOpt,
    DpImplOpt,
    EpOpt,
    EtpOpt,
    MoeA2aOverlapOpt,
    MoeDispatcherOpt,
    MoeImbalancePlanOpt,
    Bf16LayersOpt,
    check_bf16_layers_fit,
    ModuleDtypeOpt,
    module_dtypes_setting,
    bf16_layers_setting,
    AdamMomentsOpt,
    adam_moments_setting,
    refuse_moe_flags_on_dense,
    GpusOpt,
    JsonOpt,
    MicroBatchOpt,
    OffloadActivationsOpt,
    OffloadOptimizerOpt,
    OffloadWeightsOpt,
    PipelineLayoutOpt,
    PpOpt,
    RecomputeLayersOpt,
    RecomputeModulesOpt,
    RecomputeOpt,
    SavedModelOpt,
    SavedSystemOpt,
    SeqOpt,
    SpOpt,
    StageRecomputeOpt,
    TpOpt,
    TpOverlapOpt,
    VppOpt,
    ZeroOpt,
    MAX_GLOBAL_BATCH,
    LAYOUT_FLAGS,
    PERF_KNOBS,
    RECIPE_KNOB_DEFAULTS,
    CrossEntropyFusionOpt,
    Fp8ParamGatherOpt,
    GradReduceBf16Opt,
    check_int,
    gpu_count_mismatch,
    given_knobs,
    layout_knobs,
    load_inputs_for_plan,
    make_job,
    with_moe_imbalance,
    plan_from_knobs,
)
from planner.plan import load_plan
from planner.planfile import job_for_plan_file
from planner.report import estimate_json, print_estimate

# What `planner estimate` assumes for knobs the user does not give: the Megatron recipe of the
# default example (Narayanan et al. SC'21: GPT-3 175B as tp8 pp8) with today's defaults.
ESTIMATE_DEFAULTS = dict(tp=8, pp=8, **RECIPE_KNOB_DEFAULTS)


def estimate_command(
    model: SavedModelOpt = None,
    system: SavedSystemOpt = None,
    gpus: GpusOpt = None,
    seq_length: SeqOpt = None,
    global_batch: BatchOpt = None,
    dtype: Annotated[Optional[str], typer.Option(
        "--dtype", help="Compute precision: bf16, fp16, fp8 (delayed scaling), fp8-cs (current scaling), fp8-block (DeepSeek-V3 block scales), "
                        "mxfp8 or nvfp4 (Blackwell only); default: the plan file's, else bf16, or fp16 on a GPU "
                        "without bf16 (V100).")] = None,
    hbm_reserve_gib: Annotated[Optional[float], typer.Option(
        "--hbm-reserve-gib", help="HBM per GPU kept free for CUDA context, NCCL and fragmentation "
                                  "(GiB; default: the plan file's, else 2).")] = None,
    plan_file: Annotated[Optional[str], typer.Option(
        "--plan", help="Plan YAML/JSON (e.g. from `planner plan --save`) instead of the flags below. "
                       "-m/-s/-g/--seq-length given beside it replace the file's (the same plan on "
                       "another system or sequence); the plan's own fields may not be overridden.")] = None,
    tp: TpOpt = None, pp: PpOpt = None, dp: DpOpt = None, cp: CpOpt = None, ep: EpOpt = None,
    micro_batch: MicroBatchOpt = None, vpp: VppOpt = None, sequence_parallel: SpOpt = None,
    recompute: RecomputeOpt = None, recompute_modules: RecomputeModulesOpt = None,
    recompute_num_layers: RecomputeLayersOpt = None, zero_stage: ZeroOpt = None,
    pipeline_layout: PipelineLayoutOpt = None, stage_recompute_layers: StageRecomputeOpt = None,
    offload_weights: OffloadWeightsOpt = None, offload_activations: OffloadActivationsOpt = None,
    offload_optimizer: OffloadOptimizerOpt = None, tp_comm_overlap: TpOverlapOpt = None,
    dp_comm_overlap: DpOverlapOpt = None,
    etp: EtpOpt = None, dp_impl: DpImplOpt = None, moe_dispatcher: MoeDispatcherOpt = None,
    moe_a2a_overlap: MoeA2aOverlapOpt = None, moe_imbalance: MoeImbalancePlanOpt = None,
    cross_entropy_fusion: CrossEntropyFusionOpt = None, grad_reduce_in_bf16: GradReduceBf16Opt = None,
    fp8_param_gather: Fp8ParamGatherOpt = None,
    flash_attention: Annotated[Optional[bool], typer.Option(
        "--flash-attention/--no-flash-attention",
        help="Fused (flash) attention: no s² activations (default: the plan file's, else on).")] = None,
    cuda_graph: CudaGraphOpt = None, fp8_attention: Fp8AttentionOpt = None,
    fused_grouped_mlp: FusedGroupedMlpOpt = None,
    adam_moments: AdamMomentsOpt = None,
    bf16_layers: Bf16LayersOpt = None,
    module_dtype: ModuleDtypeOpt = None,
    json_out: JsonOpt = False,
    save: Annotated[Optional[str], typer.Option(
        "--save", help="Also write the plan as a plan file (YAML, or JSON by its name; never overwrites), "
                       "e.g. your current layout for `planner plan --versus` or `planner megatron --plan`.")] = None,
) -> None:
    """Time and memory of ONE plan under the exact analytical model.

    Knobs not given default to SP (where tp > 1), no recompute (with fused attention, recomputing
    the attention core saves no memory), the distributed optimizer with overlapped DP communication,
    and tp=pp=cp=1 with dp filling the GPUs, as `planner megatron` reads the same flags; with no
    layout flag at all, tp 8 pp 8 (the default example's Megatron layout). TP communication
    overlap and the fused cross-entropy are Megatron's default, off, unless given (`planner plan`
    turns both on where they pay; its --save file or its printed line gives them back).
    Exit code 0 when the plan fits, 1 when it does not (memory, offload capacity), 2 for an input
    error (a plan that breaks a layout rule, e.g. ep not dividing the experts, or offload with no tier).
    A plan Megatron-LM cannot launch as costed is still costed (exit 0 if it fits); why Megatron
    refuses it is printed (`megatron_refusals` in --json), and `planner megatron` refuses it.

    \b
    Examples:
      planner estimate -m gpt3-175b -s a100-80g -g 1024 --tp 8 --pp 8 -b 1536
      planner estimate -m llama3.1-405b -s gb300-nvl72 -g 256 --tp 4 --pp 8 --pipeline-layout 3,4x30,3 \\
          --dtype nvfp4 -b 1536      # an uneven interleaved layout (vpp 4 from the 32 stages)
      planner estimate -m llama3-70b -s h100-sxm -g 64 -b 512 --tp 8 --pp 4 --save mine.yaml
    """
    if save is not None and plan_file:
        raise SpecError(f"save: the plan is already a file ({plan_file}); --save writes a plan given by flags")
    check_new_file("save", save)
    if save is not None:
        check_plan_file_names(model, system)
    model_spec, system_spec = load_inputs_for_plan(model, system, gpus, seq_length, plan_file)
    options = dict(locals())
    knobs = given_knobs(options)
    knobs.update({k: options[k] for k in PERF_KNOBS if options[k] is not None})  # recipe settings, not searched
    refuse_moe_flags_on_dense(model_spec, moe_imbalance, fused_grouped_mlp, moe_dispatcher, knobs.get("ep"),
                              knobs.get("etp"))
    kernels = kernel_settings("none" if cuda_graph is None else cuda_graph, bool(fp8_attention), bool(fused_grouped_mlp),
                              moe=model_spec.moe is not None, mamba=model_spec.mamba is not None)
    # (the layout flags before layout_knobs, which would ask for --pp or --pipeline-layout)
    refuse_plan_flags_beside_plan_file(plan_file, {"pipeline_layout": pipeline_layout,
                                                   "stage_recompute_layers": stage_recompute_layers})
    knobs.update(layout_knobs(pipeline_layout, stage_recompute_layers, knobs, model_spec))
    job = None
    if plan_file:
        refuse_plan_flags_beside_plan_file(plan_file, knobs)
        plan = load_plan(plan_file)
        if global_batch is not None and global_batch != plan.global_batch:
            raise SpecError(f"global-batch: {global_batch} differs from the plan file's global_batch "
                            f"({plan.global_batch}); give one or the other")
        # cost the plan as it was saved (dtype, reserve, attention), as `planner megatron --plan` does
        # only the kernel flags the user gave are checked against the file (None: not given)
        given_kernels = {field: None if flag is None else kernels[field] for field, flag in (
            ("full_iteration_cuda_graph", cuda_graph), ("cuda_graph_modules", cuda_graph), ("fp8_attention", fp8_attention),
            ("fused_grouped_mlp", fused_grouped_mlp))}
        given_kernels["adam_moments"] = adam_moments_setting(adam_moments).get("adam_moments")
        given_kernels["bf16_layers"] = bf16_layers_setting(bf16_layers, model_spec).get("bf16_layers")
        given_kernels["module_dtypes"] = module_dtypes_setting(module_dtype, model_spec).get("module_dtypes")
        job = job_for_plan_file(plan_file, plan, dtype=dtype, hbm_reserve_gib=hbm_reserve_gib,
                                flash_attention=flash_attention, moe_load_imbalance=moe_imbalance, **given_kernels)
        if job is not None:
            check_dtype_on_system(job.dtype, system_spec)
            check_module_dtypes_on_system(job.module_dtypes, system_spec, f"plan ({plan_file}): job: module_dtypes")
    else:
        check_int("global-batch", global_batch, 1, MAX_GLOBAL_BATCH)
        # the default example's tp 8 pp 8 only where no layout is given: --tp 2 alone is tp 2 pp 1,
        # as `planner megatron` reads the same flags
        layout_given = any(k in knobs for k in LAYOUT_FLAGS)
        plan = plan_from_knobs(knobs, system_spec.num_gpus, global_batch or DEFAULT_BATCH,
                               RECIPE_KNOB_DEFAULTS if layout_given else ESTIMATE_DEFAULTS,
                               model_spec.seq_length, expert_biases=model_spec.moe is not None and model_spec.biases,
                               layers=model_spec.layers)
    if job is None:
        job = make_job(global_batch=None, dtype=dtype, system=system_spec,
                       hbm_reserve_gib=2.0 if hbm_reserve_gib is None else hbm_reserve_gib,
                       flash_attention=flash_attention,
                       **kernels, **adam_moments_setting(adam_moments),
                       **bf16_layers_setting(bf16_layers, model_spec), **module_dtypes_setting(module_dtype, model_spec))
    job = with_moe_imbalance(job, moe_imbalance)
    check_job_reserve(job, system_spec, plan_file, hbm_reserve_gib)
    check_bf16_layers_fit(job.bf16_layers, model_spec)
    check_layout_fits_model(plan, model_spec, plan_file)
    if plan_file:
        refuse_plan_file_contradictions(plan, model_spec, job, plan_file)
    check_recompute_layers(plan, model_spec)
    if plan.gpus != system_spec.num_gpus:
        raise SpecError(gpu_count_mismatch(plan, system_spec, plan_file, gpus))
    est = estimate(model_spec, system_spec, plan, job)
    structural = [rule for rule in est.violations if rule not in ("hbm", "offload_capacity")]
    if structural:  # a plan no layout rule allows: an input error, from flags as from a plan file
        from planner.analytical.estimate import rule_text  # noqa: PLC0415
        where = f"plan {plan_file}" if plan_file else f"plan {plan.short()}"
        raise SpecError(f"{where}: {rule_text(structural[0], model_spec, plan)}")
    if plan.uses_offload and system_spec.offload is None:
        raise SpecError(f"offload: {system_spec.name} has no offload tier to offload to; leave the offload "
                        "fractions at 0, or pick a system with one (`planner presets`: e.g. gb200-nvl72, "
                        "h100-offload-1tib)")
    if save is not None:  # written whether or not it fits: a baseline to compare with; and before the
        # output, which a reader that leaves early (`| head`) ends with exit 141
        from planner.planfile import plan_file_data
        write_plan_file(save, plan_file_data(plan, DEFAULT_MODEL if model is None else model,
                                             DEFAULT_SYSTEM if system is None else system, model_spec, system_spec,
                                             job, step_time_s=est.step_time_s))
    if json_out:
        print(estimate_json(est, job, model_spec, system_spec))
    else:
        from planner.cli.console import Console
        print_estimate(Console(), model_spec, system_spec, est, job=job)
    if save is not None and not json_out:
        print(f"wrote {save}")
    if not est.feasible:
        raise typer.Exit(1)  # like `planner check`: 1 = the plan does not fit (2 is for input errors)


def register(app: typer.Typer) -> None:
    app.command(name="estimate")(estimate_command)
