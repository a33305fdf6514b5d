"""`planner estimate`: the exact model for one plan given by flags or a plan file."""
from __future__ import annotations

from typing import Annotated, Optional

import typer

from hardware.errors import SpecError
from planner.analytical import estimate
from planner.cli.common import (
    DEFAULT_BATCH,
    BatchOpt,
    CpOpt,
    DpOpt,
    DpOverlapOpt,
    DtypeOpt,
    EpOpt,
    GpusOpt,
    JsonOpt,
    MicroBatchOpt,
    OffloadActivationsOpt,
    OffloadOptimizerOpt,
    OffloadWeightsOpt,
    PpOpt,
    RecomputeLayersOpt,
    RecomputeOpt,
    ReserveOpt,
    SavedModelOpt,
    SavedSystemOpt,
    SeqOpt,
    SpOpt,
    TpOpt,
    TpOverlapOpt,
    VppOpt,
    ZeroOpt,
    MAX_GLOBAL_BATCH,
    check_int,
    given_knobs,
    load_inputs_for_plan,
    make_job,
    plan_from_knobs,
)
from planner.plan import load_plan
from planner.report import estimate_json, print_estimate

# What `planner estimate` assumes for knobs the user does not give: the Megatron recipe of the
# default example (Narayanan et al. SC'21: GPT-3 175B as tp8 pp8) with today's defaults.
ESTIMATE_DEFAULTS = dict(tp=8, pp=8, sequence_parallel=True, recompute="selective", zero_stage=1,
                         dp_comm_overlap=True)


def estimate_command(
    model: SavedModelOpt = None,
    system: SavedSystemOpt = None,
    gpus: GpusOpt = None,
    seq_length: SeqOpt = None,
    global_batch: BatchOpt = None,
    dtype: DtypeOpt = "bf16",
    hbm_reserve_gib: ReserveOpt = 2.0,
    plan_file: Annotated[Optional[str], typer.Option(
        "--plan", help="Plan YAML/JSON (e.g. from `planner plan --save`) instead of the flags below.")] = None,
    tp: TpOpt = None, pp: PpOpt = None, dp: DpOpt = None, cp: CpOpt = None, ep: EpOpt = None,
    micro_batch: MicroBatchOpt = None, vpp: VppOpt = None, sequence_parallel: SpOpt = None,
    recompute: RecomputeOpt = None, recompute_num_layers: RecomputeLayersOpt = None, zero_stage: ZeroOpt = None,
    offload_weights: OffloadWeightsOpt = None, offload_activations: OffloadActivationsOpt = None,
    offload_optimizer: OffloadOptimizerOpt = None, tp_comm_overlap: TpOverlapOpt = None,
    dp_comm_overlap: DpOverlapOpt = None,
    flash_attention: Annotated[bool, typer.Option(help="Fused (flash) attention: no s² activations.")] = True,
    json_out: JsonOpt = False,
) -> None:
    """Time and memory of ONE plan under the exact analytical model.

    Knobs not given default to tp 8, pp 8, SP, selective recompute, distributed optimizer.
    Exit code 0 when the plan fits, 1 when it does not (memory or a rule), 2 for an input error.
    Example: planner estimate -m gpt3-175b -s a100-80g -g 1024 --tp 8 --pp 8 -b 1536
    """
    model_spec, system_spec = load_inputs_for_plan(model, system, gpus, seq_length, plan_file)
    job = make_job(global_batch=None, dtype=dtype, hbm_reserve_gib=hbm_reserve_gib, flash_attention=flash_attention)
    knobs = given_knobs(locals())
    if plan_file:
        if knobs:
            raise SpecError(f"plan: give either --plan or plan flags (got --plan and "
                            f"--{next(iter(knobs)).replace('_', '-')})")
        plan = load_plan(plan_file)
        if global_batch is not None and global_batch != plan.global_batch:
            raise SpecError(f"global-batch: {global_batch} differs from the plan file's global_batch "
                            f"({plan.global_batch}); give one or the other")
    else:
        check_int("global-batch", global_batch, 1, MAX_GLOBAL_BATCH)
        plan = plan_from_knobs(knobs, system_spec.num_gpus, global_batch or DEFAULT_BATCH, ESTIMATE_DEFAULTS)
    if plan.gpus != system_spec.num_gpus:
        raise SpecError(f"plan: tp·pp·dp·cp = {plan.gpus} but the system has "
                        f"{system_spec.num_gpus} GPUs (set --gpus or change the plan)")
    est = estimate(model_spec, system_spec, plan, job)
    if json_out:
        print(estimate_json(est))
    else:
        from rich.console import Console
        print_estimate(Console(), model_spec, system_spec, est)
    if not est.feasible:
        raise typer.Exit(1)  # like `planner check`: 1 = the plan does not fit (2 is for input errors)


def register(app: typer.Typer) -> None:
    app.command(name="estimate")(estimate_command)
