"""The plan `planner plan` recommends: the fastest under the model, unless the model alone claims it.

The exact model is checked against published runs family by family (planner/evidence.py: dense or
MoE, ZeRO-3 or not, pipelined or not, expert parallel or not). Where the fastest plan's family has
no published run and the model predicts it more than UNMEASURED_ADVANTAGE_LIMIT faster than the
best plan of a family that has, that advantage rests on nothing measured: the model's error on the
measured MoE families is 9-42 % (README, accuracy table), so such a claim cannot be told from a
model error. Then the best measured-family plans are recommended and the faster ones are reported
beside them as model-only candidates, with the numbers, for the user to measure
(`--allow-unmeasured` ranks them first). Within the limit the model's ranking stands; the plan's
Evidence line says how much stands behind it.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from hardware.spec import SystemSpec
from planner.evidence import CLAIM_LIMIT, families, family_of_plan, measured_runs, runs_of
from planner.model import ModelSpec
from planner.plan import JobSpec
from planner.search import Ranked, SearchResult, plan as search
from planner.ties import rank_with_ties

# Issue 9's bar (planner.evidence.CLAIM_LIMIT): no plan is predicted more than 15 % faster than
# measured practice unless a measured run supports it.
UNMEASURED_ADVANTAGE_LIMIT = CLAIM_LIMIT


@dataclass
class Recommendation(SearchResult):
    model_only: list[Ranked] = field(default_factory=list)  # faster by the model alone, unmeasured family


def recommend(model: ModelSpec, system: SystemSpec, job: JobSpec | None = None, top_k: int = 5,
              time_limit_s: float = 30.0, allow_unmeasured: bool = False) -> Recommendation:
    """`planner.search.plan`'s top K, gated on evidence (module docstring)."""
    job = job or JobSpec()
    res = search(model, system, job, top_k=top_k, time_limit_s=time_limit_s)
    out = Recommendation(ranked=res.ranked, objective=res.objective, stats=res.stats)
    _offload_gain(model, system, job, out, time_limit_s)
    is_moe = model.moe is not None
    if allow_unmeasured or res.best is None or measured_runs(is_moe, res.best.plan):
        return out
    measured = []
    for label, restrict in families(is_moe).items():
        if runs_of(label):
            sub = search(model, system, job, top_k=top_k, time_limit_s=time_limit_s, restrict=restrict)
            measured.extend(sub.ranked)
            out.stats["evidence_searches_s"] = out.stats.get("evidence_searches_s", 0.0) + sub.stats["total_s"]
    if not measured:
        return out  # nothing a published run measured fits: the model is all there is
    measured.sort(key=lambda r: r.objective)
    bar = (1 - UNMEASURED_ADVANTAGE_LIMIT) * measured[0].objective
    if res.best.objective >= bar:
        return out  # within the model's error of measured practice: its ranking stands
    order = rank_with_ties([r.objective for r in measured], [r.plan for r in measured], top_k)
    out.ranked = [measured[i] for i in order]
    out.model_only = [r for r in res.ranked if r.objective < bar and not measured_runs(is_moe, r.plan)]
    out.stats["evidence_gate"] = {
        "limit": UNMEASURED_ADVANTAGE_LIMIT,
        "model_only_family": family_of_plan(is_moe, res.best.plan),
        "model_only_advantage": 1 - res.best.objective / measured[0].objective}
    return out


def _offload_gain(model: ModelSpec, system: SystemSpec, job: JobSpec, out: Recommendation,
                  time_limit_s: float) -> None:
    """Where the best plan offloads, what it buys: the best plan without offload (stats
    "offload_gain"; None where nothing fits without it). Exact ties already go to less offload
    (constraints.cost_table.order_rows), so a plan that offloads is strictly faster or the only fit."""
    if out.best is None or not out.best.plan.uses_offload:
        return
    alone = search(model, system, job.model_copy(update={"allow_offload": False}), top_k=1,
                   time_limit_s=time_limit_s).best
    out.stats["offload_gain"] = None if alone is None else {
        "plan_without_offload": alone.plan.short(), "step_time_s": alone.estimate.step_time_s,
        "objective": alone.objective, "advantage": 1 - out.best.objective / alone.objective}


def recommended_plan(model: ModelSpec, system: SystemSpec, job: JobSpec | None = None):
    """The plan `planner plan` would print first (used by `planner megatron`), or None."""
    best = recommend(model, system, job, top_k=1).best
    return best.plan if best else None


__all__ = ["recommend", "recommended_plan", "Recommendation", "UNMEASURED_ADVANTAGE_LIMIT"]
