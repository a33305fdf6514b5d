"""`planner validate`: the analytical model against published measured runs."""
from __future__ import annotations

from typing import Annotated, Optional

import typer

from hardware.errors import SpecError

from planner.jsonout import json_text
from rich.console import Console
from rich.table import Table

from planner.calibration import DEFAULT_REFERENCE, accuracy_rows, load_reference, summarize


def _load_checked(reference: str):
    """load_reference behind a guard: whatever file the user names (empty, binary, a folder, a
    model YAML) is refused in one line before the loader sees it."""
    from pathlib import Path

    from hardware.errors import SpecError, read_yaml_mapping
    path = Path(reference)
    if path.exists():
        data = read_yaml_mapping(path, "reference")
        records = data.get("records")
        if not isinstance(records, list) or not records or not all(isinstance(r, dict) for r in records):
            raise SpecError(f"reference {path}: expected a measured-runs file (a `records:` list of runs, "
                            f"like ../shared/reference/measured_runs.yaml)")
    try:
        return load_reference(reference)
    except SpecError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise SpecError(f"reference {path}: a record is not a measured run "
                        f"({type(exc).__name__}: {exc})") from None


def register(app: typer.Typer) -> None:
    @app.command(name="validate")
    def validate(
        reference: Annotated[str, typer.Option(help="measured_runs.yaml to compare against.")] = str(DEFAULT_REFERENCE),
        source: Annotated[Optional[str], typer.Option(help="Only rows whose id starts with this (e.g. dgxc, narayanan2021).")] = None,
        rows_out: Annotated[bool, typer.Option("--rows/--summary", help="Print every row, or only the summary.")] = True,
        json_out: Annotated[bool, typer.Option("--json", help="Machine-readable rows and summary.")] = False,
    ) -> None:
        """Predicted vs measured step time for every reference run the model can express.

        Prints per-row error, then mean |error| and max by source and by accelerator. Rows the
        model cannot express (no published layout, no preset for the GPU) are listed as skipped.
        """
        cases, skipped = _load_checked(reference)
        if source:
            all_cases = cases
            cases = [c for c in cases if c.id.startswith(source)]
            if not cases:
                prefixes = sorted({c.id.split("_")[0].split("-")[0] for c in all_cases})
                raise SpecError(f"source: no reference run id starts with {source!r}; ids start with e.g. "
                                f"{', '.join(prefixes[:12])}")
        rows = accuracy_rows(cases)
        by_source, by_gpu, by_fw = summarize(rows, "source"), summarize(rows, "gpu"), summarize(rows, "framework")
        if json_out:
            print(json_text({"rows": rows, "by_source": by_source, "by_gpu": by_gpu, "by_framework": by_fw,
                              "skipped": [s.__dict__ for s in skipped]}))
            return
        console = Console(width=200)
        if rows_out:
            table = Table(title="Predicted vs measured step time", show_edge=False)
            for col, just in (("run", "left"), ("GPUs", "right"), ("dtype", "left"), ("plan", "left"),
                              ("measured s", "right"), ("predicted s", "right"), ("error", "right"),
                              ("assumed", "left")):
                table.add_column(col, justify=just)
            for r in rows:
                table.add_row(r["id"], str(r["gpus"]), r["dtype"], r["plan"], f"{r['measured_s']:.2f}",
                              f"{r['predicted_s']:.2f}", f"{r['error']:+.1%}", "; ".join(r["assumptions"]))
            console.print(table)
        for title, summary in (("by source", by_source), ("by accelerator", by_gpu), ("by framework", by_fw)):
            table = Table(title=f"Accuracy {title}", show_edge=False)
            for col in ("group", "rows", "mean |error|", "max |error|"):
                table.add_column(col, justify="left" if col == "group" else "right")
            for name, s in summary.items():
                table.add_row(name, str(s["rows"]), f"{s['mean_abs_error']:.1%}", f"{s['max_abs_error']:.1%}")
            console.print(table)
        console.print(f"skipped {len(skipped)} records: " + "; ".join(f"{s.id} ({s.reason})" for s in skipped))
