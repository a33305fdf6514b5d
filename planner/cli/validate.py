"""`planner validate`: the analytical model against published measured runs."""
from __future__ import annotations

from typing import Annotated, Optional

import typer

from planner.report import json_text
from rich.console import Console
from rich.table import Table

from planner.calibration import DEFAULT_REFERENCE, accuracy_rows, load_reference, summarize


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
        cases, skipped = load_reference(reference)
        if source:
            cases = [c for c in cases if c.id.startswith(source)]
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
