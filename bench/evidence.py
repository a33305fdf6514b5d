"""Write planner/data/evidence.json: per plan family, how many published runs of it the
reference data holds and the model's error on them, and planner/data/published_jobs.json: the
published runs of each job (model shape, GPUs, batch, dtype) with their measured and predicted
times (planner/evidence.py).

    PYTHONPATH=. python bench/evidence.py [--write]
"""
from __future__ import annotations

import argparse
import json

from planner.calibration import accuracy_rows
from planner.evidence import EVIDENCE_FILE, JOBS_FILE, jobs_from_rows, table_from_rows
from planner.reference import load_reference


def current_table(rows: list[dict] | None = None) -> dict:
    """The table from the packaged reference runs; `rows`: their accuracy_rows when the caller
    has them already (the tests share one computation)."""
    cases, _ = load_reference()
    rows = accuracy_rows(cases) if rows is None else rows
    return table_from_rows(rows, {c.id: c.plan for c in cases}, {c.id: c.model.moe is not None for c in cases})


def current_jobs(rows: list[dict] | None = None) -> dict:
    """The published runs by job, from the packaged reference runs (`rows` as in current_table)."""
    cases, _ = load_reference()
    rows = accuracy_rows(cases) if rows is None else rows
    return jobs_from_rows(rows, {c.id: c for c in cases})


def jobs_text(jobs: dict) -> str:
    """published_jobs.json with one run per line (a diff then shows which runs changed)."""
    blocks = [f"{json.dumps(key)}: [\n  " + ",\n  ".join(json.dumps(r, ensure_ascii=False) for r in runs) + "\n ]"
              for key, runs in jobs.items()]
    return "{\n " + ",\n ".join(blocks) + "\n}\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--write", action="store_true", help=f"write {EVIDENCE_FILE}")
    args = ap.parse_args()
    table = current_table()
    text = json.dumps(table, indent=1, ensure_ascii=False) + "\n"
    if args.write:
        EVIDENCE_FILE.write_text(text)
        JOBS_FILE.write_text(jobs_text(current_jobs()))
    print(text)


if __name__ == "__main__":
    main()
