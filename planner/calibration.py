"""The analytical model against the published runs (planner/reference.py loads them): per-row
predicted vs measured step time and the accuracy summary by group."""
from __future__ import annotations

import math

import numpy as np

from hardware.spec import SystemSpec
from hardware.errors import SpecError
from planner.analytical import PlanArrays, estimate_many, violated_rules
from planner.analytical.estimate import rule_text
from planner.analytical.layer_kinds import dense_layer_spec
from planner.reference import (DEFAULT_REFERENCES, FITTED_FRAMEWORKS, REFERENCE_DIR, RefCase, Skipped,
                               load_reference, untuned_software)

# the rules a compared record may break: what it needs in memory (the model's estimate, which a
# run that trained shows wrong) and what the planner does not cost (context parallelism of a hybrid
# stack, which Megatron runs), not a structure Megatron refuses
FIT_RULES = ("hbm", "offload_capacity", "hybrid_cp")
DEFAULT_REFERENCE = DEFAULT_REFERENCES[0]  # kept for callers that name one file

__all__ = ["DEFAULT_REFERENCE", "DEFAULT_REFERENCES", "FITTED_FRAMEWORKS", "REFERENCE_DIR", "RefCase", "Skipped",
           "load_reference", "predict", "accuracy_rows", "summarize", "log_error"]


def predict(case: RefCase, system: SystemSpec | None = None) -> dict:
    system = system or case.system
    P = PlanArrays.from_plans([case.plan], case.model.layers, dense_layer_spec(case.model))
    r = estimate_many(case.model, system, case.job, P)
    return {k: (float(v[0]) if k != "violations" else int(v[0])) for k, v in r.items()}


def accuracy_rows(cases: list[RefCase], systems: dict[str, SystemSpec] | None = None) -> list[dict]:
    """One row per case; `systems` maps an accelerator name to a system whose accelerator replaces
    the case's (the fit tries parameters this way)."""
    rows = []
    for case in cases:
        system = case.system
        trial = (systems or {}).get(case.system.accelerator.name)
        if trial is not None:
            system = system.model_copy(update={"accelerator": trial.accelerator})
        try:
            pred = predict(case, system)
        except SpecError as e:  # e.g. a dtype the record's GPU has no peak for: name the record
            raise SpecError(f"reference {case.id}: {e}") from None
        structural = [rule for rule in violated_rules(pred["violations"]) if rule not in FIT_RULES]
        if structural:  # a layout Megatron would not launch: the record is mistyped, not the model wrong
            raise SpecError(f"reference {case.id}: {rule_text(structural[0], case.model, case.plan)} "
                            f"(its layout: {case.plan.short()})")
        err = pred["step_time_s"] / case.measured_step_s - 1.0
        rows.append({"id": case.id, "source": case.source, "framework": case.framework, "family": case.family,
                     "kind": case.kind,
                     "software": f"{case.kind}, {untuned_software(case.id, case.source) or 'tuned'}",
                     "fitted": case.fit, "gpu": case.system.accelerator.name,
                     "dtype": case.job.dtype, "gpus": case.system.num_gpus, "plan": case.plan.short(),
                     "measured_s": case.measured_step_s, "predicted_s": pred["step_time_s"],
                     "error": err, "fits_hbm": pred["hbm_bytes"] <= pred["hbm_capacity_bytes"],
                     "how_measured": case.how_measured, "assumptions": case.assumptions})
    return rows


def summarize(rows: list[dict], key: str = "source") -> dict[str, dict]:
    groups: dict[str, list[float]] = {}
    for r in rows:
        groups.setdefault(str(r[key]), []).append(abs(r["error"]))
    groups["all"] = [abs(r["error"]) for r in rows]
    return {k: {"rows": len(v), "mean_abs_error": float(np.mean(v)) if v else float("nan"),
                "max_abs_error": float(np.max(v)) if v else float("nan")}
            for k, v in groups.items()}


def log_error(rows: list[dict]) -> float:
    return float(np.mean([abs(math.log1p(r["error"])) for r in rows]))
