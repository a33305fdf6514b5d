"""How much measured evidence stands behind a plan of this kind: the published runs of the same
plan family in the reference data, and the model's error on them.

A plan family is what decides which cost terms dominate: dense or MoE, how data parallelism
shards (ZeRO-3/FSDP or not), pipelining or not, expert parallelism or not. `planner plan` prints
the family's evidence beside the best plan, so that a predicted advantage of a family no run has
measured reads as what it is. The table (`planner/data/evidence.json`) is written by
`bench/evidence.py --write` from `planner validate`'s rows; a test checks it is current.
"""
from __future__ import annotations

import itertools
import json
from functools import lru_cache
from pathlib import Path

from planner.analytical.precision import GEMM_OPERAND_BYTES
from planner.model import ModelSpec
from planner.plan import Plan

EVIDENCE_FILE = Path(__file__).resolve().parent / "data" / "evidence.json"


def family_label(is_moe: bool, zero3: bool, pipelined: bool, expert_parallel: bool, hybrid: bool = False) -> str:
    """A plan family's name; a hybrid Mamba stack's families are their own (the reference data holds
    no run of one)."""
    parts = [("hybrid Mamba " if hybrid else "") + ("MoE" if is_moe else "dense"),
             "ZeRO-3/FSDP" if zero3 else "replicated weights (ZeRO-0/1/2)",
             "pipelined" if pipelined else "no pipeline"]
    if is_moe:
        parts.append("expert parallel" if expert_parallel else "no expert parallelism")
    return " · ".join(parts)


def family_of_plan(is_moe: bool, plan: Plan, hybrid: bool = False) -> str:
    return family_label(is_moe, plan.zero_stage == 3, plan.pp > 1, plan.ep > 1, hybrid)


def families(is_moe: bool, hybrid: bool = False) -> dict[str, dict]:
    """Every family of this kind: {label: the search restriction (knob -> predicate) to its plans}."""
    out = {}
    for zero3, pipelined, expert_parallel in itertools.product((False, True), repeat=3):
        if expert_parallel and not is_moe:
            continue
        restrict = {"zero_stage": (lambda z, want=zero3: (z == 3) == want),
                    "pp": (lambda p, want=pipelined: (p > 1) == want)}
        if is_moe:
            restrict["ep"] = lambda e, want=expert_parallel: (e > 1) == want
        out[family_label(is_moe, zero3, pipelined, expert_parallel, hybrid)] = restrict
    return out


def runs_of(family: str) -> int:
    """Published runs of this family in the reference data (0: the model alone speaks)."""
    return int(load_table().get(family, {}).get("runs", 0))


def measured_runs(is_moe: bool, plan: Plan, hybrid: bool = False) -> int:
    return runs_of(family_of_plan(is_moe, plan, hybrid))


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


@lru_cache(maxsize=4)
def _packaged_json(path: Path) -> dict:
    """A JSON table bench/evidence.py writes into planner/data, once per process ({} if absent)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def load_table() -> dict[str, dict]:
    return _packaged_json(EVIDENCE_FILE)


JOBS_FILE = Path(__file__).resolve().parent / "data" / "published_jobs.json"
# Issue 9's bar: a plan predicted more than this much faster than measured practice is a claim
# that needs a measured run behind it (the model's mean error on MoE runs is ~7-11 %). The
# published-run note flags it; planner.recommend's evidence gate uses the same limit.
CLAIM_LIMIT = 0.15


def job_key(model: ModelSpec, accelerator: str, gpus: int, global_batch: int | None) -> str:
    """What makes two jobs the same for comparing a plan with a published run: the model's
    shape (not its name: presets and records name models differently), the GPU type and count
    and the global batch. The precision is per run (`supporting_runs`)."""
    return "|".join(str(x) for x in (*model_shape(model), accelerator, gpus, global_batch))


def model_shape(model: ModelSpec) -> tuple:
    """A model by its shape, not its name (presets and records name models differently)."""
    moe = model.moe
    return (model.layers, model.hidden, model.heads, model.ffn_hidden, model.seq_length,
            moe.num_experts if moe else 0, moe.top_k if moe else 0)


def gemm_bits(dtype: str) -> int:
    """Bits per GEMM operand element (block scales rounded away): what orders precisions by how
    much work a step does in them."""
    return round(8 * GEMM_OPERAND_BYTES[dtype])


def jobs_from_rows(rows: list[dict], cases: dict) -> dict[str, list[dict]]:
    """{job key: its published runs, fastest first} from accuracy rows and their cases by id; each
    run keeps its plan whole (`plan_fields`), so the gate in planner.recommend can re-score it."""
    out: dict[str, list[dict]] = {}
    for r in rows:
        c = cases[r["id"]]
        key = job_key(c.model, c.system.accelerator.name, c.system.num_gpus, c.job.global_batch)
        out.setdefault(key, []).append({"id": r["id"], "dtype": c.job.dtype,
                                        "moe_load_imbalance": c.job.moe_load_imbalance, "plan": c.plan.short(),
                                        "plan_fields": c.plan.model_dump(mode="json", exclude_defaults=True),
                                        "measured_s": round(r["measured_s"], 4),
                                        "predicted_s": round(r["predicted_s"], 4)})
    for runs in out.values():
        runs.sort(key=lambda x: (x["measured_s"], x["id"]))
    return dict(sorted(out.items()))


def load_jobs() -> dict[str, list[dict]]:
    return _packaged_json(JOBS_FILE)


def supporting_runs(model: ModelSpec, accelerator: str, gpus: int, global_batch: int | None, dtype: str,
                    moe_load_imbalance: float = 1.0) -> list[dict]:
    """The published runs that bound this job's step time from measurement, fastest first: the
    same model shape, GPU type and count and global batch, doing at least this job's work: at
    `dtype` or a wider precision (a run that did its GEMMs in bf16 is evidence for what an FP8 step
    can reach, not the reverse) and with routing at least as uneven (a run with forced-balanced
    routing bounds nothing for learned routing)."""
    bits = gemm_bits(dtype)
    return [r for r in load_jobs().get(job_key(model, accelerator, gpus, global_batch), [])
            if gemm_bits(r["dtype"]) >= bits and r["moe_load_imbalance"] >= moe_load_imbalance]


def published_job_note(model: ModelSpec, accelerator: str, gpus: int, global_batch: int | None, dtype: str,
                       step_time_s: float, moe_load_imbalance: float = 1.0, moe_dispatcher: str = "alltoall") -> str:
    """The fastest published run of the same job (`supporting_runs`), set against this plan's
    predicted time; '' when the reference data has none. Where the run is faster and ran a MoE
    dispatcher this job was not given (a job setting: the search costs every plan with the one
    given), say how to search with it."""
    runs = supporting_runs(model, accelerator, gpus, global_batch, dtype, moe_load_imbalance)
    if not runs:
        return ""
    r = runs[0]
    ratio = step_time_s / r["measured_s"]
    claim = (f" More than {CLAIM_LIMIT:.0%} faster than measured practice: a model claim until a run of this plan "
             "measures it." if ratio < 1 - CLAIM_LIMIT else "")
    theirs = r["plan_fields"].get("moe_dispatcher", "alltoall")
    if ratio > 1 and theirs != moe_dispatcher:
        claim += (f" That run uses the {theirs} MoE dispatcher, which this search was not given (it costs every "
                  f"plan with {moe_dispatcher}): add --moe-dispatcher {theirs} to search with it.")
    precision = "" if r["dtype"] == dtype else f", in {r['dtype']}"
    return (f"Published run of this job: {r['id']} ({r['plan']}{precision}) measured {r['measured_s']:.3f} s per "
            f"step (the model predicts it at {r['predicted_s']:.3f} s); this plan is predicted at "
            f"{ratio:.2f}× that measurement.{claim}")


def evidence_note(model: ModelSpec, plan: Plan) -> str:
    fam = family_of_plan(model.moe is not None, plan, model.hybrid_pattern is not None)
    e = load_table().get(fam)
    if not e:
        return (f"Evidence: no published run in the reference data is of this plan family ({fam}); "
                "its predicted time rests on the model alone.")
    return (f"Evidence: {e['runs']} published run{'s' if e['runs'] != 1 else ''} of this plan family ({fam}); "
            f"the model's mean error on them {e['mean_error']:+.0%} (mean |error| {e['mean_abs_error']:.0%}).")


__all__ = ["family_of_plan", "family_label", "families", "runs_of", "measured_runs", "table_from_rows", "load_table",
           "evidence_note", "EVIDENCE_FILE", "JOBS_FILE", "job_key", "jobs_from_rows", "load_jobs", "published_job_note",
           "supporting_runs", "gemm_bits"]
