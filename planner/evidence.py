"""How much measured evidence stands behind a plan of this kind: the published runs of the same
plan family in the reference data, and the model's error on them.

A plan family is what decides which cost terms dominate: dense or MoE, how data parallelism
shards (ZeRO-3/FSDP or not), pipelining or not, expert parallelism or not. `planner plan` prints
the family's evidence beside the best plan, so that a predicted advantage of a family no run has
measured reads as what it is. The table (`planner/data/evidence.json`) is written by
`bench/evidence.py --write` from `planner validate`'s rows; a test checks it is current.
"""
from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

from planner.model import ModelSpec
from planner.plan import Plan

EVIDENCE_FILE = Path(__file__).resolve().parent / "data" / "evidence.json"


def family_of_plan(is_moe: bool, plan: Plan) -> str:
    parts = ["MoE" if is_moe else "dense",
             "ZeRO-3/FSDP" if plan.zero_stage == 3 else "replicated weights (ZeRO-0/1/2)",
             "pipelined" if plan.pp > 1 else "no pipeline"]
    if is_moe:
        parts.append("expert parallel" if plan.ep > 1 else "no expert parallelism")
    return " · ".join(parts)


def table_from_rows(rows: list[dict], plans: dict[str, Plan], moe: dict[str, bool]) -> dict[str, dict]:
    """{family: {runs, mean_abs_error, mean_error, examples}} from accuracy rows (planner.calibration)."""
    out: dict[str, dict] = {}
    for r in rows:
        fam = family_of_plan(moe[r["id"]], plans[r["id"]])
        e = out.setdefault(fam, {"runs": 0, "errors": [], "examples": []})
        e["runs"] += 1
        e["errors"].append(r["error"])
        if len(e["examples"]) < 3:
            e["examples"].append(r["id"])
    for e in out.values():
        errs = e.pop("errors")
        e["mean_abs_error"] = round(sum(abs(x) for x in errs) / len(errs), 4)
        e["mean_error"] = round(sum(errs) / len(errs), 4)
    return dict(sorted(out.items()))


@lru_cache(maxsize=1)
def load_table() -> dict[str, dict]:
    try:
        return json.loads(EVIDENCE_FILE.read_text())
    except (OSError, ValueError):
        return {}


def evidence_note(model: ModelSpec, plan: Plan) -> str:
    fam = family_of_plan(model.moe is not None, plan)
    e = load_table().get(fam)
    if not e:
        return (f"Evidence: no published run in the reference data is of this plan family ({fam}); "
                "its predicted time rests on the model alone.")
    return (f"Evidence: {e['runs']} published run{'s' if e['runs'] != 1 else ''} of this plan family ({fam}); "
            f"the model's mean error on them {e['mean_error']:+.0%} (mean |error| {e['mean_abs_error']:.0%}).")


__all__ = ["family_of_plan", "table_from_rows", "load_table", "evidence_note", "EVIDENCE_FILE"]
