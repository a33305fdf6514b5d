"""`planner estimate`: the exact model for one plan given by flags or a plan file."""
from __future__ import annotations

from typing import Annotated, Optional

import typer
from rich.console import Console

from hardware.errors import SpecError
from planner.analytical import estimate
from planner.cli_common import (DEFAULT_BATCH, DEFAULT_MODEL, DEFAULT_SYSTEM, BatchOpt, DtypeOpt, GpusOpt,
                                JsonOpt, ModelOpt, ReserveOpt, SeqOpt, SystemOpt, load_inputs, make_job)
from planner.plan import Plan, load_plan, make_plan
from planner.report import estimate_json, print_estimate


def plan_from_flags(plan_file: str | None, gpus: int, global_batch: int | None, **flags) -> Plan:
    """A plan file, or flags; dp defaults to GPUs/(tp·pp·cp)."""
    if plan_file:
        return load_plan(plan_file)
    tp, pp, cp = flags["tp"], flags["pp"], flags["cp"]
    if flags.get("dp") is None:
        if gpus % (tp * pp * cp):
            raise SpecError(f"tp·pp·cp ({tp}·{pp}·{cp}) must divide the GPU count ({gpus}); "
                            "pass --dp or change --gpus")
        flags["dp"] = gpus // (tp * pp * cp)
    if global_batch is None:
        raise SpecError("global-batch: required for estimate (e.g. --global-batch 1536)")
    plan = make_plan(global_batch=global_batch, **flags)
    if plan.gpus != gpus:
        raise SpecError(f"plan: tp·pp·dp·cp = {plan.gpus} but the system has {gpus} GPUs "
                        "(set --gpus or change the plan)")
    return plan


def register(app: typer.Typer) -> None:
    def estimate_cmd(
        model: ModelOpt = DEFAULT_MODEL,
        system: SystemOpt = DEFAULT_SYSTEM,
        gpus: GpusOpt = None,
        seq_length: SeqOpt = None,
        global_batch: BatchOpt = DEFAULT_BATCH,
        dtype: DtypeOpt = "bf16",
        hbm_reserve_gib: ReserveOpt = 2.0,
        plan_file: Annotated[Optional[str], typer.Option("--plan", help="Plan YAML/JSON (e.g. from `planner plan --save`).")] = None,
        tp: Annotated[int, typer.Option(help="Tensor-parallel size.")] = 8,
        pp: Annotated[int, typer.Option(help="Pipeline-parallel size.")] = 8,
        dp: Annotated[Optional[int], typer.Option(help="Data-parallel size (default GPUs/(tp·pp·cp)).")] = None,
        cp: Annotated[int, typer.Option(help="Context-parallel size.")] = 1,
        ep: Annotated[int, typer.Option(help="Expert-parallel size (MoE).")] = 1,
        micro_batch: Annotated[int, typer.Option(help="Micro-batch size (sequences).")] = 1,
        vpp: Annotated[int, typer.Option(help="Virtual pipeline stages per rank (interleaving).")] = 1,
        sequence_parallel: Annotated[bool, typer.Option(help="Megatron sequence parallelism (needs tp > 1).")] = True,
        recompute: Annotated[str, typer.Option(help="Activation recompute: none, selective or full.")] = "selective",
        recompute_num_layers: Annotated[Optional[int], typer.Option(help="Full recompute: layers per stage (default all).")] = None,
        zero_stage: Annotated[int, typer.Option(help="0 none, 1 distributed optimizer, 2 +grads, 3 +params.")] = 1,
        offload_weights: Annotated[float, typer.Option(help="Fraction of weights+grads in the offload tier.")] = 0.0,
        offload_activations: Annotated[float, typer.Option(help="Fraction of activations in the offload tier.")] = 0.0,
        offload_optimizer: Annotated[float, typer.Option(help="Fraction of optimizer state in the offload tier.")] = 0.0,
        tp_comm_overlap: Annotated[bool, typer.Option(help="Overlap TP communication with GEMMs (needs SP).")] = False,
        dp_comm_overlap: Annotated[bool, typer.Option(help="Overlap DP gradient reduce / param gather.")] = True,
        flash_attention: Annotated[bool, typer.Option(help="Fused (flash) attention: no s² activations.")] = True,
        json_out: JsonOpt = False,
    ) -> None:
        """Time and memory of ONE plan under the exact analytical model.

        Example: planner estimate -m gpt3-175b -s a100-80g -g 1024 --tp 8 --pp 8 -b 1536
        """
        model_spec, system_spec = load_inputs(model, system, gpus, seq_length)
        job = make_job(global_batch=None, dtype=dtype, hbm_reserve_gib=hbm_reserve_gib,
                       flash_attention=flash_attention)
        plan = plan_from_flags(
            plan_file, system_spec.num_gpus, global_batch, tp=tp, pp=pp, dp=dp, cp=cp, ep=ep,
            micro_batch=micro_batch, vpp=vpp, sequence_parallel=sequence_parallel and tp > 1,
            recompute=recompute, recompute_num_layers=recompute_num_layers, zero_stage=zero_stage,
            offload_weights=offload_weights, offload_activations=offload_activations,
            offload_optimizer=offload_optimizer, tp_comm_overlap=tp_comm_overlap,
            dp_comm_overlap=dp_comm_overlap)
        if plan.gpus != system_spec.num_gpus:
            raise SpecError(f"plan: tp·pp·dp·cp = {plan.gpus} but the system has "
                            f"{system_spec.num_gpus} GPUs (set --gpus or change the plan)")
        est = estimate(model_spec, system_spec, plan, job)
        if json_out:
            print(estimate_json(est))
        else:
            print_estimate(Console(), model_spec, system_spec, est)

    app.command(name="estimate")(estimate_cmd)
