"""`planner validate`: the analytical model against published measured runs."""
from __future__ import annotations

import os
from typing import Annotated, Optional

import typer

from hardware.errors import SpecError, shortened

from planner.jsonout import json_text
from planner.cli.console import Console
from rich.table import Table

from planner.calibration import DEFAULT_REFERENCES, accuracy_rows, load_reference, summarize
from planner.reference import require_compared

UNIT_SUSPECT_RATIO = 3.0
GROUP_KEYS = (("source", "by source"), ("kind", "dense / MoE"),
              ("software", "dense / MoE, untuned software apart (a ladder's early steps, runs the source flags as slow)"), ("gpu", "by accelerator"),
              ("framework", "by framework"), ("family", "by model family"))


def _lofo_rows(cases, rows: list[dict], workers: int) -> list[dict]:
    from planner import fit  # imported here: only --lofo needs it
    prepared = fit.prepare(cases)
    lofo = fit.lofo_predictions(prepared, fit.fit_all(prepared), workers=workers)
    return [{**r, "predicted_s": lofo[r["id"]], "error": lofo[r["id"]] / r["measured_s"] - 1.0} for r in rows]


def _load_checked(references: list[str] | None):
    """load_reference behind a guard: whatever file the user names (empty, binary, a folder, a
    model YAML) is refused in one line before the loader sees it."""
    from pathlib import Path

    from hardware.errors import SpecError, read_yaml_mapping, refuse_dash
    for ref in references or ():
        refuse_dash(ref, "reference", "give the path of a reference YAML file (./- for a file named '-')")
        if not ref.strip():  # Path('') is '.', the folder: say what was given
            raise SpecError("reference: empty name; give the path of a reference YAML file, or leave --reference "
                            "out for the packaged files")
        path = Path(ref)
        if path.exists():
            data = read_yaml_mapping(path, "reference", aliases=True)  # the packaged FSDP file shares sources
            records = data.get("records")
            if not isinstance(records, list) or not records or not all(isinstance(r, dict) for r in records):
                raise SpecError(f"reference {path}: expected a measured-runs file (a `records:` list of runs, "
                                f"like the packaged planner/data/reference/measured_runs.yaml)")
    try:
        return load_reference(references or None)
    except SpecError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise SpecError(f"reference: a record is not a measured run ({type(exc).__name__}: {exc})") from None


def register(app: typer.Typer) -> None:
    @app.command(name="validate")
    def validate(
        reference: Annotated[Optional[list[str]], typer.Option(
            help="Reference YAML file(s) to compare against (repeatable); default: the three packaged files "
                 "(planner/data/reference).")] = None,
        source: Annotated[Optional[str], typer.Option(help="Only rows whose id starts with this (e.g. dgxc, narayanan2021, bridge).")] = None,
        rows_out: Annotated[bool, typer.Option("--rows/--summary", help="Print every row, or only the summary.")] = True,
        lofo: Annotated[bool, typer.Option("--lofo", help="Also leave-one-model-family-out: refit the efficiency "
                                           "parameters without each family and predict it (about a minute on 2 cores).")] = False,
        workers: Annotated[Optional[int], typer.Option(
            "--workers", "-j", help="Processes refitting the --lofo families side by side (default: the CPU "
                                    "count; the result does not depend on it).")] = None,
        json_out: Annotated[bool, typer.Option("--json", help="Machine-readable rows and summary.")] = False,
    ) -> None:
        """Predicted vs measured step time for every reference run the model can express.

        Prints per-row error, then mean |error| and max by source, dense/MoE (also with untuned
        software apart: an optimisation ladder's early steps, runs their source flags as slow),
        accelerator, framework and model family (with --lofo also the leave-one-family-out error
        beside the in-sample one), then how many records were read and why each skipped one was
        skipped.

        \b
        Example:
          planner validate --summary --lofo
        """
        from planner.cli.common import MAX_WORKERS, check_int
        check_int("workers", workers, 1, MAX_WORKERS)
        if workers is not None and not lofo:
            raise SpecError("workers: -j sets the processes of the --lofo refits; add --lofo or drop -j")
        if source is not None and not source.strip():
            raise SpecError("source: empty; give the start of a run id (e.g. dgxc, narayanan2021, bridge)")
        cases, skipped = _load_checked(reference)
        require_compared(cases, skipped)  # an all-skipped file is an input error, not 'nan%'
        if source:
            all_cases = cases
            cases = [c for c in cases if c.id.startswith(source)]
            if not cases:
                prefixes = sorted({c.id.split("_")[0].split("-")[0] for c in all_cases})
                raise SpecError(f"source: no reference run id starts with {shortened(source)!r}; ids start with e.g. "
                                f"{', '.join(prefixes[:12])}")
        rows = accuracy_rows(cases)
        lofo_rows = _lofo_rows(cases, rows, workers or os.cpu_count() or 1) if lofo else None
        summaries = {key: summarize(rows, key) for key, _ in GROUP_KEYS}
        lofo_summaries = {key: summarize(lofo_rows, key) for key, _ in GROUP_KEYS} if lofo_rows else None
        if json_out:  # --summary leaves the rows out, as in the text
            out = {**({"rows": rows} if rows_out else {}), "summary": summaries,
                   "skipped": [s.__dict__ for s in skipped], "read": len(cases) + len(skipped),
                   "compared": len(cases), "files": [str(p) for p in (reference or DEFAULT_REFERENCES)]}
            if lofo_rows:
                if rows_out:
                    out["lofo_rows"] = lofo_rows
                out["lofo_summary"] = lofo_summaries
            print(json_text(out))
            return
        console = Console(width=200)
        if rows_out:
            table = Table(title="Predicted vs measured step time", show_edge=False)
            cols = ["run", "GPUs", "dtype", "plan", "measured s", "predicted s", "error"]
            cols += ["LOFO error"] if lofo_rows else []
            for col in cols + ["assumed"]:
                table.add_column(col, justify="left" if col in ("run", "dtype", "plan", "assumed") else "right")
            for i, r in enumerate(rows):
                cells = [r["id"], str(r["gpus"]), r["dtype"], r["plan"], f"{r['measured_s']:.2f}",
                         f"{r['predicted_s']:.2f}", f"{r['error']:+.1%}"]
                cells += [f"{lofo_rows[i]['error']:+.1%}"] if lofo_rows else []
                table.add_row(*cells, "; ".join(r["assumptions"]))
            console.print(table)
        for key, title in GROUP_KEYS:
            table = Table(title=f"Accuracy {title}" + (" (in-sample | leave-one-family-out)" if lofo_rows else ""),
                          show_edge=False)
            cols = ["group", "rows", "fitted", "mean |error|", "max |error|"]
            cols += ["LOFO mean", "LOFO max"] if lofo_rows else []
            for col in cols:
                table.add_column(col, justify="left" if col == "group" else "right")
            for name, s in summaries[key].items():
                fitted = sum(1 for r in rows if r["fitted"] and (name == "all" or str(r[key]) == name))
                cells = [name, str(s["rows"]), str(fitted), f"{s['mean_abs_error']:.1%}", f"{s['max_abs_error']:.1%}"]
                if lofo_summaries:
                    ls = lofo_summaries[key][name]
                    cells += [f"{ls['mean_abs_error']:.1%}", f"{ls['max_abs_error']:.1%}"]
                table.add_row(*cells)
            console.print(table)
        console.print(f"read {len(cases) + len(skipped)} records: {len(cases)} compared, {len(skipped)} skipped")
        # a prediction off by more than UNIT_SUSPECT_RATIO either way is more likely a unit than a model
        # error (milliseconds for seconds, total tokens/s for per-GPU, tokens for sequences)
        for r in rows:
            ratio = r["predicted_s"] / r["measured_s"]
            if not 1 / UNIT_SUSPECT_RATIO <= ratio <= UNIT_SUSPECT_RATIO:
                console.print(f"  check the units of {r['id']}: predicted {ratio:.3g}x its measured step time "
                              "(step seconds, tokens/s per GPU, global batch in sequences)", soft_wrap=True)
            if not r["fits_hbm"]:
                console.print(f"  {r['id']}: its plan does not fit in HBM under the model (a layout, micro-batch "
                              "or recompute stated wrong, or memory savings the model does not cost)", soft_wrap=True)
        for s in skipped:
            console.print(f"  skipped {s.id}: {s.reason}", soft_wrap=True)
