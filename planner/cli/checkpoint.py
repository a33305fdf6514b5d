"""`planner checkpoint`: checkpoint size, writers, storage bandwidth, restore time and the
optimal checkpoint interval (Young 1974 / Daly 2006) for one model, system and plan layout."""
from __future__ import annotations

from typing import Annotated, Optional

import typer

from hardware.errors import SpecError, shortened
from planner.jsonout import json_text
from planner.checkpoint import DEFAULT_GPU_MTBF_HOURS, DEFAULT_RESTART_S, CheckpointReport, checkpoint_report, duration_text
from planner.cli.common import (
    DEFAULT_MODEL, DEFAULT_SYSTEM, MAX_GPUS, AdamMomentsNoPlanOpt, GpusOpt, JsonOpt, ModelOpt, SystemOpt,
    adam_moments_setting, check_float, check_int, load_inputs, refuse_moe_flags_on_dense)
from planner.plan import BytesPerParam, make_plan

# Assumption (no single source): an aggregate parallel-file-system write bandwidth of the order
# of a large Lustre/GPFS installation. Pass your storage's measured figure.
DEFAULT_WRITE_GB_PER_S = 100.0
DEFAULT_TARGET_WRITE_S = 60.0

_Int = Optional[int]

# Generous physical ranges of the checkpoint flags (finite: an MTBF of 1e300 h gave a 150-digit
# --save-interval): bandwidths up to an exabyte per second, MTBFs up to ~100,000 years, times up to
# ~115 days.
CHECKPOINT_FLAG_RANGES = {"write-gb-per-s": (1e-6, 1e9), "read-gb-per-s": (1e-6, 1e9),
                          "target-write-s": (1e-3, 1e7), "gpu-mtbf-hours": (1e-3, 1e9),
                          "node-mtbf-hours": (1e-3, 1e9), "restart-s": (0.0, 1e7)}


def check_checkpoint_flags(**values: float | None) -> None:
    """The checkpoint flags given (keyword: flag name with '_' for '-'), each within its range."""
    for name, value in values.items():
        flag = name.replace("_", "-")
        check_float(flag, value, *CHECKPOINT_FLAG_RANGES[flag])


def default_layout(num_gpus: int, gpus_per_node: int, tp: int | None, pp: int | None, dp: int | None,
                   cp: int | None, model=None) -> tuple[int, int, int, int]:
    """tp = the largest size up to min(8, GPUs per node) that divides the GPUs (and splits
    `model`'s heads, query groups and widths), pp = 1, cp = 1 unless given; dp = GPUs /
    (tp*pp*cp). The product must equal the GPU count."""
    for name, value in (("tp", tp), ("pp", pp), ("dp", dp), ("cp", cp)):
        if value is not None and value < 1:
            raise SpecError(f"{name}: must be a positive integer, got {value}")
    pp = pp if pp is not None else 1
    cp = cp if cp is not None else 1
    if tp is None:  # what the GPUs left by pp·cp (and dp, if given) divide
        from constraints.space import tp_splits
        rest = num_gpus // (pp * cp * (dp or 1)) if num_gpus % (pp * cp * (dp or 1)) == 0 else 1
        tp = next(t for t in range(min(8, gpus_per_node, max(rest, 1)), 0, -1)
                  if rest % t == 0 and (model is None or tp_splits(model, t)))
    model_parallel = tp * pp * cp
    if dp is None:
        if num_gpus % model_parallel:
            raise SpecError(f"plan: tp*pp*cp = {tp}*{pp}*{cp} = {model_parallel} does not divide the "
                            f"number of GPUs ({num_gpus}); change --tp, --pp or --cp so that it does, or --gpus")
        dp = num_gpus // model_parallel
    if tp * pp * dp * cp != num_gpus:
        raise SpecError(f"plan: tp*pp*dp*cp = {tp}*{pp}*{dp}*{cp} = {tp * pp * dp * cp} must equal the "
                        f"number of GPUs ({num_gpus})")
    return tp, pp, dp, cp


# The rules of the exact model that are about how the model splits (not memory, not the batch):
# a checkpoint of a layout Megatron cannot build is not a checkpoint at all.
LAYOUT_RULES = ("heads_tp", "groups_tp", "hidden_tp", "layers_pp", "cp_seq", "experts_ep")


def default_ep(model, dp: int, cp: int) -> int:
    """A MoE model's default expert parallelism: the largest that divides both the expert count and
    the dp*cp ranks that hold copies of the experts (Megatron: world % (etp*ep*pp) == 0); 1 dense."""
    if model.moe is None:
        return 1
    return max(e for e in range(1, model.moe.num_experts + 1) if model.moe.num_experts % e == 0 and (dp * cp) % e == 0)


def layout_notes(model, system, plan) -> list[str]:
    """One-line errors for a layout the model cannot split (Megatron could not build it); else
    the notes that qualify its numbers: a layout whose training state does not fit in HBM (its
    restore figures are of a layout nobody can train)."""
    from planner.analytical import estimate
    from planner.analytical.estimate import RULES
    from planner.cli.common import DEFAULT_MAX_GLOBAL_BATCH, make_job
    # the GPU's default precision; the batch is the layout's dp (one sequence per replica), which
    # may exceed the cap on a free batch at tens of thousands of GPUs
    job = make_job(global_batch=plan.global_batch, max_global_batch=max(plan.global_batch, DEFAULT_MAX_GLOBAL_BATCH),
                   system=system)
    est = estimate(model, system, plan, job)
    broken = [r for r in est.violations if r in LAYOUT_RULES]
    if broken:
        raise SpecError(f"plan: {plan.short()} does not split {model.name}: " + "; ".join(
            f"{RULES[r]} (heads {model.heads}, query groups {model.kv_groups}, layers {model.layers}"
            + (f", experts {model.moe.num_experts}" if model.moe else "") + ")"
            if i == 0 else RULES[r] for i, r in enumerate(broken)))
    # the checkpoint depends on the layout, not on how activations are kept: the layout fits if it
    # fits with its most frugal activations (sequence parallelism where tp > 1, every layer
    # recomputed), as a plan of it may run (`planner plan` chose tp4 ... sp rc-full for such a one)
    frugal = plan.model_copy(update={"sequence_parallel": plan.tp > 1, "recompute": "full"})
    est = estimate(model, system, frugal, job)
    if est.hbm_bytes > est.hbm_capacity_bytes:
        return [f"the layout {plan.short()} does not fit: it needs {est.hbm_bytes / 2**30:,.1f} GiB per GPU of "
                f"{est.hbm_capacity_bytes / 2**30:,.1f} usable even with sequence parallelism and full recompute, "
                "so its writers and restore reads are not those of a run; pass the layout you train with "
                "(--tp, --pp, --cp, --ep, --zero-stage; `planner plan` finds one)"]
    return []


def _copy_extent(r) -> str:
    """'16 GPUs = 2 nodes', or '4 GPUs (part of one node)' where a copy does not fill one."""
    if r.model_copy_gpus < r.gpus_per_node:
        return f"{r.model_copy_gpus} GPUs (part of one node)"
    return f"{r.model_copy_gpus} GPUs = {r.model_copy_nodes} node{'s' if r.model_copy_nodes > 1 else ''}"


def _hours(hours: float) -> str:
    """An MTBF in hours as given: whole hours with separators, a fraction of one to 3 digits."""
    return f"{hours:,.0f}" if hours >= 10 else f"{hours:.3g}"


def _bytes(n: float) -> str:
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B"


def render(report: CheckpointReport) -> None:
    from planner.cli.console import Console
    from rich.table import Table

    r = report
    mtbf_src = (f"{_hours(r.node_mtbf_hours)} h per node" if r.node_mtbf_hours is not None
                else f"{_hours(r.gpu_mtbf_hours)} h per GPU")
    table = Table(title=f"Checkpoint: {r.model} on {r.num_gpus} GPUs ({r.system}), {r.plan}",
                  show_header=True, header_style="bold")
    table.add_column("quantity")
    table.add_column("value", justify="right")
    table.add_column("how")
    what = "weights + fp32 master + Adam m,v" if r.include_optimizer else "weights only"
    rows = [
        ("parameters", f"{r.num_params / 1e9:,.1f} B", r.params_note or "model"),
        ("bytes per parameter", f"{r.checkpoint_bytes_per_param:g}", what),
        ("checkpoint size", _bytes(r.checkpoint_bytes),
         f"weights {_bytes(r.weights_bytes)} + optimizer {_bytes(r.optimizer_bytes)}"),
        ("one model copy", _copy_extent(r), "tp*pp*ep shards"),
        ("writing ranks = files", f"{r.writer_ranks:,}", "every rank (torch_dist fully parallel save)"),
        ("bytes per writing rank", _bytes(r.bytes_per_writer), "size / writers"),
        ("write time", duration_text(r.write_s), f"at {r.write_gb_per_s:g} GB/s aggregate"),
        ("write bandwidth needed", f"{r.write_gb_per_s_needed:,.1f} GB/s",
         f"to write in {r.target_write_s:g} s"),
        ("restore reads", _bytes(r.read_bytes), "every rank reads what it holds"),
        ("restore time", duration_text(r.restore_s), f"at {r.read_gb_per_s:g} GB/s aggregate"),
        ("job MTBF", duration_text(r.job_mtbf_s), mtbf_src),
        ("recovery per failure", duration_text(r.recovery_s),
         f"restart {duration_text(r.restart_s)} + restore"),
        ("interval (Young 1974)", duration_text(r.young_interval_s), "sqrt(2 C M)"),
        ("interval (Daly 2006)", duration_text(r.daly_interval_s), "higher-order"),
        ("goodput at Young", f"{100 * r.goodput_young:.2f} %", "t / (M e^(R/M) (e^((t+C)/M) - 1))"),
        ("goodput at Daly", f"{100 * r.goodput_daly:.2f} %", "the same, at the Daly interval"),
    ]
    for row in rows:
        table.add_row(*row)
    console = Console()
    console.print(table)
    for note in r.notes:
        console.print(f"Note: {note}.", style="yellow")
    console.print("Assumptions: " + "; ".join(r.assumptions) + ".", style="dim")


def register(app: typer.Typer) -> None:
    @app.command("checkpoint")
    def checkpoint(
        model: ModelOpt = DEFAULT_MODEL,
        system: SystemOpt = DEFAULT_SYSTEM,
        gpus: GpusOpt = None,
        tp: Annotated[_Int, typer.Option("--tp", help="Tensor parallel size (default: the largest up to min(8, GPUs per node) that divides "
                 "the GPUs and splits the model's heads).")] = None,
        pp: Annotated[_Int, typer.Option("--pp", help="Pipeline parallel size (default 1).")] = None,
        dp: Annotated[_Int, typer.Option("--dp", help="Data parallel size (default GPUs/(tp*pp*cp)).")] = None,
        cp: Annotated[_Int, typer.Option("--cp", help="Context parallel size (default 1).")] = None,
        ep: Annotated[_Int, typer.Option("--ep", help="Expert parallel size (MoE; default: the largest that "
                                                       "divides the experts and dp*cp).")] = None,
        etp: Annotated[_Int, typer.Option("--etp", help="Expert tensor-parallel size (MoE; default tp), as "
                                                         "`planner plan` prints it (etp1).")] = None,
        zero_stage: Annotated[int, typer.Option(
            "--zero-stage", help="0 plain DP, 1 distributed optimizer, 2, 3 (restore reads depend on it).")] = 1,
        write_gb_per_s: Annotated[float, typer.Option(
            "--write-gb-per-s", help="Aggregate storage write bandwidth, GB/s (1e9 B/s). Default is an assumption.")
        ] = DEFAULT_WRITE_GB_PER_S,
        read_gb_per_s: Annotated[Optional[float], typer.Option(
            "--read-gb-per-s", help="Aggregate storage read bandwidth, GB/s (default: the write bandwidth).")
        ] = None,
        target_write_s: Annotated[float, typer.Option(
            "--target-write-s", help="Write a checkpoint within this many seconds: bandwidth needed.")
        ] = DEFAULT_TARGET_WRITE_S,
        gpu_mtbf_hours: Annotated[Optional[float], typer.Option(
            "--gpu-mtbf-hours",
            help=f"Per-GPU MTBF in hours (default {DEFAULT_GPU_MTBF_HOURS:,.0f}: Llama 3 paper, 419 "
                 "unexpected interruptions in 54 days on 16,384 GPUs).")] = None,
        node_mtbf_hours: Annotated[Optional[float], typer.Option(
            "--node-mtbf-hours", help="Per-node MTBF in hours (instead of --gpu-mtbf-hours).")] = None,
        restart_s: Annotated[float, typer.Option(
            "--restart-s", help="Seconds to detect a failure and restart, before the restore read "
                                "(default is an assumption).")] = DEFAULT_RESTART_S,
        weights_only: Annotated[bool, typer.Option(
            "--weights-only", help="Checkpoint the weights only (no optimizer state).")] = False,
        adam_moments: AdamMomentsNoPlanOpt = None,
        as_json: JsonOpt = False,
    ) -> None:
        """Checkpoint size, who writes it, storage bandwidth and the optimal checkpoint interval.

        \b
        Example:
          planner checkpoint -m llama3-70b -s h100-sxm -g 1024 --tp 8 --pp 4 --write-gb-per-s 200
        """
        check_checkpoint_flags(write_gb_per_s=write_gb_per_s, read_gb_per_s=read_gb_per_s,
                               target_write_s=target_write_s, gpu_mtbf_hours=gpu_mtbf_hours,
                               node_mtbf_hours=node_mtbf_hours, restart_s=restart_s)
        if gpu_mtbf_hours is not None and node_mtbf_hours is not None:
            raise SpecError("mtbf: give either --gpu-mtbf-hours or --node-mtbf-hours, not both")
        if zero_stage not in (0, 1, 2, 3):
            raise SpecError(f"zero-stage: must be 0, 1, 2 or 3, got {zero_stage}")
        if weights_only and adam_moments is not None:  # as --max-global-batch beside a fixed batch
            raise SpecError(f"adam-moments: a --weights-only checkpoint holds no optimizer state, so "
                            f"--adam-moments {shortened(adam_moments)} would change nothing; drop one of the two")
        moments = adam_moments_setting(adam_moments).get("adam_moments", "fp32")
        from planner.megatron.expressible import bf16_moments_refusal
        refused = bf16_moments_refusal(moments, zero_stage, "--zero-stage")  # as estimate and megatron refuse it
        if refused:  # no run saves such a checkpoint
            raise SpecError(f"adam-moments: {refused}")
        spec, sysspec = load_inputs(model, system, gpus)
        t, p, d, c = default_layout(sysspec.num_gpus, sysspec.gpus_per_node, tp, pp, dp, cp, spec)
        check_int("ep", ep, 1, MAX_GPUS)
        check_int("etp", etp, 1, MAX_GPUS)
        refuse_moe_flags_on_dense(spec, None, None, ep=ep, etp=etp)
        plan = make_plan(tp=t, pp=p, dp=d, cp=c, ep=default_ep(spec, d, c) if ep is None else ep, etp=etp,
                         zero_stage=zero_stage, global_batch=d)
        notes = layout_notes(spec, sysspec, plan)
        report = checkpoint_report(
            spec, sysspec, plan, write_gb_per_s=write_gb_per_s,
            bytes_per_param=BytesPerParam.for_adam_moments(moments),
            read_gb_per_s=write_gb_per_s if read_gb_per_s is None else read_gb_per_s,
            target_write_s=target_write_s, gpu_mtbf_hours=gpu_mtbf_hours,
            node_mtbf_hours=node_mtbf_hours, restart_s=restart_s,
            include_optimizer=not weights_only, notes=notes)
        if as_json:
            typer.echo(json_text(report.model_dump()))
        else:
            render(report)
