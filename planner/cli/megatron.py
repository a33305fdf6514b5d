"""`planner megatron`: a plan -> a Megatron-LM launch (script, args or JSON) that Megatron accepts."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from hardware.errors import SpecError
from planner.cli.common import (
    DEFAULT_BATCH,
    BatchOpt,
    CpOpt,
    DpOpt,
    DpOverlapOpt,
    DtypeOpt,
    EpOpt,
    GpusOpt,
    MicroBatchOpt,
    OffloadActivationsOpt,
    OffloadOptimizerOpt,
    OffloadWeightsOpt,
    PpOpt,
    RecomputeLayersOpt,
    RecomputeOpt,
    SavedModelOpt,
    SavedSystemOpt,
    SeqOpt,
    SpOpt,
    TpOpt,
    TpOverlapOpt,
    VppOpt,
    ZeroOpt,
    given_knobs,
    load_inputs_for_plan,
    make_job,
    plan_from_knobs,
)
from planner.plan import load_plan

FORMATS = ("script", "args", "json")


def _fail(lines: list[str]) -> None:
    """Every problem, on one line (the app prints it and exits 2)."""
    raise SpecError("; ".join(lines))


def megatron_command(
    model: SavedModelOpt = None,
    system: SavedSystemOpt = None,
    gpus: GpusOpt = None,
    seq_length: SeqOpt = None,
    global_batch: BatchOpt = None,
    dtype: DtypeOpt = "bf16",
    plan_file: Annotated[Optional[Path], typer.Option(
        "--plan", help="Plan file (YAML/JSON; a top-level `plan:` mapping as `planner plan --save` writes).")] = None,
    tp: TpOpt = None, pp: PpOpt = None, dp: DpOpt = None, cp: CpOpt = None, ep: EpOpt = None,
    micro_batch: MicroBatchOpt = None, vpp: VppOpt = None, sequence_parallel: SpOpt = None,
    recompute: RecomputeOpt = None, recompute_num_layers: RecomputeLayersOpt = None, zero_stage: ZeroOpt = None,
    offload_activations: OffloadActivationsOpt = None, offload_optimizer: OffloadOptimizerOpt = None,
    offload_weights: OffloadWeightsOpt = None, tp_comm_overlap: TpOverlapOpt = None,
    dp_comm_overlap: DpOverlapOpt = None,
    fmt: Annotated[str, typer.Option("--format", help="Output: script (bash), args (one line) or json.")] = "script",
    output: Annotated[Optional[Path], typer.Option(
        "--output", "-o", help="Write to this file (never overwrites an existing file).")] = None,
) -> None:
    """Emit Megatron-LM `pretrain_gpt.py` arguments (and a torchrun script) for a plan.

    The plan comes from --plan FILE, from plan flags (unset knobs: tp=pp=cp=1, dp fills the GPUs),
    or, with neither, from the search (`planner plan`'s best plan).
    """
    _run(locals())


def _run(o: dict) -> None:
    from planner import megatron as mg

    if o["fmt"] not in FORMATS:
        raise SpecError(f"format: unknown {o['fmt']!r}; allowed: {', '.join(FORMATS)}")
    if o["output"] is not None and o["output"].exists():
        raise SpecError(f"output: {o['output']} already exists; refusing to overwrite it")
    model, system = load_inputs_for_plan(o["model"], o["system"], o["gpus"], o["seq_length"], o["plan_file"])
    job = make_job(global_batch=o["global_batch"], dtype=o["dtype"])
    given = given_knobs(o)
    if o["plan_file"] is not None:
        if given:
            raise SpecError(f"plan: give either --plan or plan flags (got --plan and "
                            f"--{next(iter(given)).replace('_', '-')})")
        plan = load_plan(o["plan_file"])
        if job.global_batch is not None and job.global_batch != plan.global_batch:
            raise SpecError(f"global-batch: {job.global_batch} differs from the plan's "
                            f"global_batch ({plan.global_batch})")
    elif any(o[k] is not None for k in ("tp", "pp", "dp")):
        plan = plan_from_knobs(given, system.num_gpus, job.global_batch or DEFAULT_BATCH)
    else:
        if given:
            raise SpecError("plan: give --tp/--pp/--dp with the other plan flags, or --plan FILE")
        try:
            from planner.search import best_plan
        except ImportError:
            raise SpecError("plan: give --plan FILE or --tp/--pp/--dp; the search is not available") from None
        plan = best_plan(model, system, job)
        if plan is None:
            raise SpecError("plan: the search found no plan that fits; give --plan FILE or --tp/--pp/--dp")

    problems = mg.not_expressible(plan, model, job) + mg.launch_problems(plan, system)
    if problems:
        _fail(problems)
    launch = mg.megatron_args(plan, model, job, system)
    problems = mg.validate_launch(launch, mg.gpu_arch_major(system))
    if problems:
        _fail(problems)
    text = mg.render(launch, o["fmt"], vocab_size=model.vocab)
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
        o["output"].chmod(0o755)
    typer.echo(f"wrote {o['output']} ({plan.short()}, {launch.nnodes} nodes x {launch.gpus_per_node} GPUs)")


def register(app: typer.Typer) -> None:
    app.command("megatron")(megatron_command)
