"""`planner megatron`: a plan -> a Megatron-LM launch (script, args or JSON) that Megatron accepts."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from hardware.errors import SpecError
from planner.cli_common import (DEFAULT_BATCH, DEFAULT_MODEL, DEFAULT_SYSTEM, BatchOpt, DtypeOpt,
                                GpusOpt, ModelOpt, SeqOpt, SystemOpt, load_inputs, make_job)
from planner.plan import Plan, load_plan, make_plan

FORMATS = ("script", "args", "json")
RECOMPUTE = ("none", "selective", "full")


def _fail(lines: list[str]) -> None:
    for line in lines:
        print(f"error: {line}", file=sys.stderr)
    raise typer.Exit(2)


def _plan_from_flags(system_gpus: int, global_batch: int | None, **f) -> Plan:
    tp, pp, cp, dp = f["tp"] or 1, f["pp"] or 1, f["cp"] or 1, f["dp"]
    if dp is None:
        if system_gpus % (tp * pp * cp):
            raise SpecError(f"dp: {system_gpus} GPUs are not divisible by tp*pp*cp ({tp}*{pp}*{cp}); "
                            "give --dp or --gpus")
        dp = system_gpus // (tp * pp * cp)
    if f["recompute"] is not None and f["recompute"] not in RECOMPUTE:
        raise SpecError(f"recompute: unknown {f['recompute']!r}; allowed: {', '.join(RECOMPUTE)}")
    fields = dict(f, tp=tp, pp=pp, cp=cp, dp=dp,
                  global_batch=global_batch or DEFAULT_BATCH)
    return make_plan(**fields)


def megatron_command(
    model: ModelOpt = DEFAULT_MODEL,
    system: SystemOpt = DEFAULT_SYSTEM,
    gpus: GpusOpt = None,
    seq_length: SeqOpt = None,
    global_batch: BatchOpt = None,
    dtype: DtypeOpt = "bf16",
    plan_file: Annotated[Optional[Path], typer.Option(
        "--plan", help="Plan file (YAML/JSON; a top-level `plan:` mapping as `planner plan --save` writes).")] = None,
    tp: Annotated[Optional[int], typer.Option("--tp", help="Tensor parallel size.")] = None,
    pp: Annotated[Optional[int], typer.Option("--pp", help="Pipeline parallel size.")] = None,
    dp: Annotated[Optional[int], typer.Option("--dp", help="Data parallel size (default: GPUs/(tp*pp*cp)).")] = None,
    cp: Annotated[Optional[int], typer.Option("--cp", help="Context parallel size.")] = None,
    ep: Annotated[Optional[int], typer.Option("--ep", help="Expert parallel size (MoE).")] = None,
    micro_batch: Annotated[Optional[int], typer.Option("--micro-batch", help="Micro-batch size.")] = None,
    vpp: Annotated[Optional[int], typer.Option("--vpp", help="Virtual stages per pipeline rank.")] = None,
    sequence_parallel: Annotated[Optional[bool], typer.Option(
        "--sequence-parallel/--no-sequence-parallel", help="Megatron sequence parallelism (tp>1).")] = None,
    recompute: Annotated[Optional[str], typer.Option(
        "--recompute", help="Activation recompute: none, selective or full.")] = None,
    recompute_num_layers: Annotated[Optional[int], typer.Option(
        "--recompute-num-layers", help="Full recompute: layers per pipeline stage (default all).")] = None,
    zero_stage: Annotated[Optional[int], typer.Option(
        "--zero-stage", help="0 plain DP, 1 distributed optimizer, 2/3 Megatron FSDP.")] = None,
    offload_activations: Annotated[Optional[float], typer.Option(
        "--offload-activations", help="Fraction of layers whose activations go to host memory.")] = None,
    offload_optimizer: Annotated[Optional[float], typer.Option(
        "--offload-optimizer", help="Fraction of optimizer state offloaded to host memory.")] = None,
    offload_weights: Annotated[Optional[float], typer.Option(
        "--offload-weights", help="Fraction of weights offloaded (not expressible in Megatron).")] = None,
    tp_comm_overlap: Annotated[Optional[bool], typer.Option(
        "--tp-comm-overlap/--no-tp-comm-overlap", help="Overlap TP communication with GEMMs (needs SP).")] = None,
    dp_comm_overlap: Annotated[Optional[bool], typer.Option(
        "--dp-comm-overlap/--no-dp-comm-overlap", help="Overlap DP grad reduce / param gather.")] = None,
    fmt: Annotated[str, typer.Option("--format", help="Output: script (bash), args (one line) or json.")] = "script",
    output: Annotated[Optional[Path], typer.Option(
        "--output", "-o", help="Write to this file (never overwrites an existing file).")] = None,
) -> None:
    """Emit Megatron-LM `pretrain_gpt.py` arguments (and a torchrun script) for a plan."""
    try:
        _run(locals())
    except SpecError as err:
        _fail([str(err)])


def _run(o: dict) -> None:
    from planner import megatron as mg

    if o["fmt"] not in FORMATS:
        raise SpecError(f"format: unknown {o['fmt']!r}; allowed: {', '.join(FORMATS)}")
    if o["output"] is not None and o["output"].exists():
        raise SpecError(f"output: {o['output']} already exists; refusing to overwrite it")
    model, system = load_inputs(o["model"], o["system"], o["gpus"], o["seq_length"])
    job = make_job(global_batch=o["global_batch"], dtype=o["dtype"])
    knobs = ("tp", "pp", "dp", "cp", "ep", "micro_batch", "vpp", "sequence_parallel", "recompute",
             "recompute_num_layers", "zero_stage", "offload_activations", "offload_optimizer",
             "offload_weights", "tp_comm_overlap", "dp_comm_overlap")
    given = {k: o[k] for k in knobs if o[k] is not None}
    if o["plan_file"] is not None:
        if given:
            raise SpecError(f"plan: give either --plan or plan flags (got --plan and "
                            f"--{next(iter(given)).replace('_', '-')})")
        plan = load_plan(o["plan_file"])
        if job.global_batch is not None and job.global_batch != plan.global_batch:
            raise SpecError(f"global-batch: {job.global_batch} differs from the plan's "
                            f"global_batch ({plan.global_batch})")
    elif any(o[k] is not None for k in ("tp", "pp", "dp")):
        plan = _plan_from_flags(system.num_gpus, job.global_batch, **{k: o[k] for k in knobs})
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
