"""`planner sweep`: the best plan over a one- or two-parameter grid -> CSV + PNG/SVG plot."""
from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Annotated, Optional

import typer
from planner.cli.console import Console
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                           TimeRemainingColumn)
from rich.table import Table
from rich.text import Text

from hardware import load_system
from hardware.errors import VISIBLE_LINE_PATTERN, SpecError, refuse_dash, shortened
from planner.jsonout import json_text
from planner.plan import MAX_TIME_LIMIT_S
from planner.cli.common import (
    DEFAULT_MAX_GLOBAL_BATCH,
    MAX_GLOBAL_BATCH,
    MAX_SEQ_LENGTH,
    MAX_WORKERS,
    DtypeOpt,
    check_float,
    check_int,
    check_utf8_text,
    refuse_hidden_characters,
    FrameworkOpt,
    GpusOpt,
    JsonOpt,
    NoOffloadOpt,
    ReserveOpt,
    SeqOpt,
    SystemOpt,
    TpAcrossNodesOpt,
    make_job,
)
from planner.sweep import (
    ALLOWED,
    DEFAULT_OFFLOAD_GB_PER_S,
    DEFAULT_OFFLOAD_GIB,
    Axis,
    PointLog,
    SweepSpec,
    build_points,
    columns,
    default_workers,
    output_paths,
    plot,
    point_key,
    refuse_inputs_as_outputs,
    refuse_overwrite,
    run_points,
    sweep_value_text,
    write_csv,
)

Opt = typer.Option


def _summary_table(rows: list[dict], spec: SweepSpec) -> Table:
    table = Table(title="Best plan per grid point (GiB: HBM per GPU)", show_edge=False)
    names = spec.names
    for n in names:  # a grid value is read whole ("lla…" told nothing): the plan column folds instead
        table.add_column(n, no_wrap=True, min_width=len(n))
    # the plan folds onto more lines in a narrow terminal; the numbers never lose digits ("81,8…");
    # the offload column only where a point offloads (80 columns hold the rest)
    table.add_column("plan", overflow="fold", min_width=10)
    offload = any(r["feasible"] and r["offload_used_gib"] for r in rows)
    numbers = [("batch", "global_batch", "{}"), ("step s", "step_time_s", "{:.2f}"), ("MFU", "mfu", "{:.1%}"),
               ("tok/s", "tokens_per_s", "{:,.0f}"), ("GiB", "hbm_used_gib", "{:.1f}"),
               *((("offload GiB", "offload_used_gib", "{:.1f}"),) if offload else ())]
    for col, _, _ in numbers:
        table.add_column(col, justify="right", no_wrap=True, min_width=len(col))
    for r in rows:
        vals = [sweep_value_text(r[n]) for n in names]  # as the CSV writes it (40, not 40.0)
        if r["feasible"]:
            table.add_row(*vals, r["plan"], *(fmt.format(r[key]) for _, key, fmt in numbers))
        else:  # the reason below the table, at the terminal's width (in a narrow column it ran 40 lines)
            table.add_row(*vals, Text("no plan fits", style="red"), *("" for _ in numbers))
    return table


def _infeasible_lines(rows: list[dict], spec: SweepSpec) -> list[str]:
    """Why no plan fits, one line per such grid point (its first reason), for under the table."""
    return [f"{', '.join(f'{n}={sweep_value_text(r[n])}' for n in spec.names)}: {r['reason'].split(' | ')[0]}"
            for r in rows if not r["feasible"]]


def _json_rows(rows: list[dict]) -> list[dict]:
    """The CSV rows as JSON: a value a point has not (no plan fits) is null, not the CSV's empty
    cell; the reasons a list; JSON has no infinity, so infinite offload bandwidth is the string "inf"."""
    def value(v):
        if isinstance(v, float) and math.isinf(v):
            return "inf"
        return None if v == "" else v
    return [{**{k: value(v) for k, v in r.items()},
             "reasons": [part for part in str(r.get("reason") or "").split(" | ") if part]} for r in rows]


def register(app: typer.Typer) -> None:
    def sweep_command(
        vary: Annotated[list[str], Opt(
            "--vary", "-v", help=f"NAME=VALUES, once or twice. NAME is one of: {ALLOWED}. VALUES: a comma "
                                 "list (8,16), START:STOP:xFACTOR (4096:16384:x2) or START:STOP:STEP "
                                 "(256:2048:256); offload_gb_per_s accepts inf; model takes presets. Varying offload_* on "
                                 f"a system without an offload tier adds one ({DEFAULT_OFFLOAD_GIB:g} GiB at "
                                 f"{DEFAULT_OFFLOAD_GB_PER_S:g} GB/s per GPU, the other axis's value where it is "
                                 "varied).")],
        out_arg: Annotated[str, Opt("--out", "-o", help="Output folder for NAME.csv, NAME.png, NAME.svg.")],
        model: Annotated[Optional[str], Opt(
            "--model", "-m", help="Model preset, model YAML file or Hugging Face config.json (or its directory); "
                                  "omit when varying model.")] = None,
        system: SystemOpt = "h100-sxm",
        gpus: GpusOpt = None,
        seq_length: SeqOpt = None,
        global_batch: Annotated[Optional[int], Opt(
            "--global-batch", "-b", help="Fixed global batch (sequences); default: free, up to --max-global-batch.")] = None,
        max_global_batch: Annotated[Optional[int], Opt(
            "--max-global-batch", help="Largest global batch the search may pick (default 3072).")] = None,
        dtype: DtypeOpt = None,
        hbm_reserve_gib: ReserveOpt = 2.0,
        framework: FrameworkOpt = "megatron",
        no_offload: NoOffloadOpt = False,
        tp_across_nodes: TpAcrossNodesOpt = False,
        workers: Annotated[Optional[int], Opt(
            "--workers", "-j", help="Local worker processes (default min(2, CPUs)).")] = None,
        ray: Annotated[Optional[str], Opt(
            "--ray", help="Run the grid on an existing Ray cluster at this address (needs `pip install ray`).")] = None,
        name: Annotated[str, Opt("--name", help="Base name of the output files.")] = "sweep",
        force: Annotated[bool, Opt("--force", help="Overwrite existing output files and start over (no resume).")] = False,
        explain: Annotated[bool, Opt("--explain/--no-explain",
                                     help="At infeasible points run `check` to say why (slower).")] = True,
        time_limit_s: Annotated[float, Opt("--time-limit", help="CP-SAT time limit per grid point (s).")] = 30.0,
        json_out: JsonOpt = False,
    ) -> None:
        """Best plan at every point of a grid of one or two varied parameters; writes CSV + PNG/SVG.

        Each finished point is appended to OUT/NAME.points.jsonl at once: a sweep that is stopped
        (Ctrl-C, exit 130) or killed resumes where it stopped when rerun with the same inputs.

        \b
        Example:
          planner sweep -m megatron-1t -s h100-sxm --vary gpus=4096:16384:x2 --vary nvlink_domain=8,16 --out out/
        """
        check_float("time-limit", time_limit_s, 0.01, MAX_TIME_LIMIT_S)  # seconds per grid point
        check_int("workers", workers, 1, MAX_WORKERS)
        check_int("global-batch", global_batch, 1, MAX_GLOBAL_BATCH)
        check_int("seq-length", seq_length, 1, MAX_SEQ_LENGTH)  # the flag's words, as the other commands say them
        check_int("max-global-batch", max_global_batch, 1, MAX_GLOBAL_BATCH)
        if global_batch is not None and max_global_batch is not None:
            raise SpecError("max-global-batch: caps a free batch; -b fixes it (give one or the other)")
        if ray is not None and not ray.strip():
            raise SpecError("ray: empty address; give the Ray cluster's address, or leave --ray out to run here")
        if not name.strip() or name.strip(".") == "":
            raise SpecError(f"name: {shortened(name)!r} names no file; give a base name such as 'sweep'")
        if "/" in name or name.startswith(".") or name != name.strip():
            raise SpecError(f"name: {shortened(name)!r} must be a plain file name (no '/', no leading dot or space)")
        if not re.fullmatch(VISIBLE_LINE_PATTERN, name):  # as a model's name: no control characters in a file name
            raise SpecError(f"name: must be one line of visible text (no control characters), got {shortened(name)!r}")
        if not out_arg.strip():  # typer would read an empty path as the current folder
            raise SpecError("out: empty; give an output folder (`-o .` for this one)")
        refuse_dash(out_arg, "out", "give an output folder (`-o .` for this one)", "standard output")
        refuse_hidden_characters("out", out_arg, "an output folder")
        out = Path(out_arg)
        if out.exists() and not out.is_dir():
            raise SpecError(f"out: {out} exists and is not a folder")
        if out.is_symlink() and not out.exists():  # mkdir would say only "File exists"
            raise SpecError(f"out: {out} is a symbolic link that leads to no folder; give an output folder")
        paths = output_paths(out, name)
        log_path = out / f"{name}.points.jsonl"
        resuming = log_path.is_file() and not force
        if ray:
            from planner.sweep import import_ray
            import_ray()
        axes = [Axis.from_cli(v) for v in vary]
        for flag, refs in (("model", [model]), ("system", [system]),
                           ("vary model", [v for a in axes if a.name == "model" for v in a.values])):
            for ref in refs:
                check_utf8_text(flag, ref, "the sweep's point log")
        # a flag that fixes what an axis varies: the axis would silently win
        fixed = {"gpus": [("-g/--gpus", gpus)],
                 "max_batch": [("-b/--global-batch", global_batch), ("--max-global-batch", max_global_batch)]}
        for axis in axes:
            for flag, value in fixed.get(axis.name, []):
                if value is not None:
                    raise SpecError(f"vary: {axis.name} is varied and {flag} fixes it ({value}); drop one of the two")
            if no_offload and axis.name.startswith("offload_"):  # every point would be the same plan
                raise SpecError(f"vary: {axis.name} is varied and --no-offload forbids offloading; drop one of the two")
        refuse_inputs_as_outputs([*paths.values(), log_path], {
            "--model": [model] if model else [], "--system": [system],
            "--vary model": [str(v) for a in axes if a.name == "model" for v in a.values]})
        max_global_batch = DEFAULT_MAX_GLOBAL_BATCH if max_global_batch is None else max_global_batch
        job = make_job(global_batch=global_batch, max_global_batch=max(max_global_batch, global_batch or 0),
                       dtype=dtype, system=load_system(system),  # the axes vary sizes, not the GPU
                       hbm_reserve_gib=hbm_reserve_gib, allow_offload=not no_offload,
                       framework=framework, tp_within_nvlink=not tp_across_nodes)
        spec = SweepSpec.build(model=model, system=system, gpus=gpus, seq_length=seq_length, job=job,
                               axes=axes, time_limit_s=time_limit_s, explain=explain)
        points = build_points(spec)  # the inputs first: a bad --vary value is named before the outputs
        # and a bad PARPLAN_THREADS too, whichever -j runs the points (workers set their own)
        from planner.threads import thread_count
        thread_count()
        if not resuming:
            refuse_overwrite(paths, force)
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise SpecError(f"out: cannot create the folder {out} ({exc.strerror})") from None
        log = PointLog(log_path, spec, force)  # fails here, before any work, if unwritable
        # Outputs a resumed sweep left half-written (killed while writing them, which its log records)
        # are its own to replace; any other file there is the user's
        ours = {k for k, v in paths.items() if v.exists()} if resuming and log.writing else set()
        if resuming:
            try:
                refuse_overwrite({k: v for k, v in paths.items() if k not in ours}, force)
            except SpecError:
                log.close()
                raise
        order = {point_key(p.params): p.index for p in points}
        todo = [p for p in points if point_key(p.params) not in log.done]
        err = Console(stderr=True)
        if len(todo) < len(points):
            err.print(f"resuming: {len(points) - len(todo)} of {len(points)} points already done ({log.path})")
        params_of = {p.index: p.params for p in todo}
        # elapsed and remaining (rich's estimate from the points done so far): a grid of thousands
        # of points says early that it will run for days
        with Progress(TextColumn("sweep"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      TextColumn("left"), TimeRemainingColumn(), TextColumn("{task.description}"), console=err,
                      transient=False) as progress:
            task = progress.add_task("", total=len(points), completed=len(points) - len(todo))

            finished = []

            def tick(row: dict) -> None:
                log.add(row, params_of[row["_index"]])  # on disk as soon as it is done
                finished.append(row["_index"])
                point = ", ".join(f"{n}={sweep_value_text(row[n])}" for n in spec.names)
                progress.update(task, advance=1, description=point)

            try:
                new_rows = run_points(todo, workers if workers is not None else default_workers(), ray, tick) \
                    if todo else []
            except SpecError:
                # an input error at a grid point: a log with no finished point would only make the
                # corrected rerun look like another sweep ("holds the points of a different sweep")
                log.close(remove=not log.done and not finished)
                raise
        old_rows = [{k: v for k, v in r.items() if k != "_params"} | {"_key": point_key(r["_params"])}
                    for r in log.done.values()]
        new_rows = [r | {"_key": point_key(params)} for r, params in
                    zip(new_rows, [p.params for p in sorted(todo, key=lambda p: p.index)])]
        rows = sorted(old_rows + new_rows, key=lambda r: order[r["_key"]])
        for r in rows:
            r.pop("_key")
        # again: the sweep may have run for minutes, and someone may have written there meanwhile
        refuse_overwrite({k: v for k, v in paths.items() if k not in ours}, force)
        log.mark_writing()
        write_csv(rows, spec, paths["csv"])
        plot(rows, spec, out / name)
        log.close(remove=True)  # the CSV now holds every point
        if json_out:
            print(json_text({"columns": columns(spec), "rows": _json_rows(rows),
                              "files": {k: str(v) for k, v in paths.items()}}))
            return
        console = Console()
        console.print(_summary_table(rows, spec))
        missing = _infeasible_lines(rows, spec)
        if missing:
            console.print("No plan fits at:", style="bold")
            for line in missing:
                console.print(f"  {line}", markup=False)
        console.print(f"wrote {paths['csv']}, {paths['png']}, {paths['svg']}")

    app.command(name="sweep")(sweep_command)
