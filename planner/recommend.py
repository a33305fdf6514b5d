"""The plan `planner plan` recommends: the fastest under the model, unless the model alone claims it.

The exact model is checked against published runs family by family (planner/evidence.py: dense or
MoE, ZeRO-3 or not, pipelined or not, expert parallel or not). Where the fastest plan's family has
no published run and the model predicts it more than UNMEASURED_ADVANTAGE_LIMIT faster than the
best plan of a family that has, that advantage rests on nothing measured: a claim that large cannot be
told from the model's own error on the MoE families (README, accuracy table). Then the best measured-family plans are recommended and the faster ones are reported
beside them as model-only candidates, with the numbers, for the user to measure
(`--allow-unmeasured` ranks them first). Within the limit the model's ranking stands; the plan's
Evidence line says how much stands behind it.

The same bar holds against measured practice for the job itself. Where the reference data has a
published run of this job (same model shape, GPU type and count, global batch, at this precision
or a wider one: planner.evidence.supporting_runs) and the model predicts its best plan more than
CLAIM_LIMIT faster than the fastest such run, no measurement supports that gain (the model predicts
the published runs themselves within its error; the layouts it prefers beyond them nobody has
run). Then the plans the model ranks within the bar and the published runs' own layouts lead,
the model's plans at their predicted time and the published layouts at their measured time
(re-scored for this job for the report), or, if none of those is a valid
plan of the job as asked (a recipe may rely on what the model does not cost, e.g. fine-grained
activation offload), the model's fastest plans within the bar from a wider search; the faster
plans are reported as model-only candidates.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from constraints.space import breaks_pins
from hardware.spec import SystemSpec
from planner.analytical import estimate
from planner.evidence import CLAIM_LIMIT, families, family_of_plan, measured_runs, runs_of, supporting_runs
from planner.megatron import not_expressible
from planner.model import ModelSpec
from planner.plan import JobSpec, Plan
from planner.search import Ranked, SearchResult, _objective, plan as search
from planner.ties import rank_with_ties

# Issue 9's bar (planner.evidence.CLAIM_LIMIT): no plan is predicted more than 15 % faster than
# measured practice unless a measured run supports it.
UNMEASURED_ADVANTAGE_LIMIT = CLAIM_LIMIT
# Distinct layouts the job gate searches for plans within its bar when neither the model's top K
# nor any published layout of the job qualifies.
WIDER_TOP_K = 50


@dataclass
class Recommendation(SearchResult):
    # faster by the model alone: of a family no run measured, or beyond the job's published runs
    model_only: list[Ranked] = field(default_factory=list)


def recommend(model: ModelSpec, system: SystemSpec, job: JobSpec | None = None, top_k: int = 5,
              time_limit_s: float = 30.0, allow_unmeasured: bool = False,
              offload_gain: bool = True) -> Recommendation:
    """`planner.search.plan`'s top K, gated on evidence (module docstring). `offload_gain`: where
    the best plan offloads, also search the best plan without offload (stats "offload_gain", which
    `planner plan` prints; a second search, over only the layouts the first one leaves in reach:
    constraints.no_offload)."""
    job = job or JobSpec()
    res = search(model, system, job, top_k=top_k, time_limit_s=time_limit_s)
    out = Recommendation(ranked=res.ranked, objective=res.objective, stats=res.stats)
    if not allow_unmeasured and res.best is not None:
        _family_gate(model, system, job, top_k, time_limit_s, res, out)
        _job_gate(model, system, job, top_k, out)
    if offload_gain:
        _offload_gain(model, system, job, out, time_limit_s, res)
    return out


def _family_gate(model, system, job, top_k, time_limit_s, res: SearchResult, out: Recommendation) -> None:
    is_moe, hybrid = model.moe is not None, model.hybrid_pattern is not None
    if measured_runs(is_moe, res.best.plan, hybrid):
        return
    measured = []
    for label, restrict in families(is_moe, hybrid).items():
        if runs_of(label):
            sub = search(model, system, job, top_k=top_k, time_limit_s=time_limit_s, restrict=restrict)
            measured.extend(sub.ranked)
            out.stats["evidence_searches_s"] = out.stats.get("evidence_searches_s", 0.0) + sub.stats["total_s"]
    if not measured:
        return  # nothing a published run measured fits: the model is all there is
    measured.sort(key=lambda r: r.objective)
    bar = (1 - UNMEASURED_ADVANTAGE_LIMIT) * measured[0].objective
    if res.best.objective >= bar:
        return  # within the model's error of measured practice: its ranking stands
    order = rank_with_ties([r.objective for r in measured], [r.plan for r in measured], top_k)
    out.ranked = [measured[i] for i in order]
    out.model_only = [r for r in res.ranked if r.objective < bar and not measured_runs(is_moe, r.plan, hybrid)]
    out.stats["evidence_gate"] = {
        "limit": UNMEASURED_ADVANTAGE_LIMIT,
        "model_only_family": family_of_plan(is_moe, res.best.plan, hybrid),
        "model_only_advantage": 1 - res.best.objective / measured[0].objective}


def _job_gate(model, system, job, top_k, out: Recommendation) -> None:
    """The bar against the fastest published run of this job (module docstring). Only for a fixed
    global batch: the published runs are of one batch."""
    if job.global_batch is None or out.best is None:
        return
    runs = supporting_runs(model, system.accelerator.name, system.num_gpus, job.global_batch, job.dtype,
                           job.moe_load_imbalance)
    if not runs:
        return
    bar = (1 - UNMEASURED_ADVANTAGE_LIMIT) * runs[0]["measured_s"]
    if out.best.objective >= bar:
        return
    # what measurement supports: the model's plans within the bar, and the published layouts of
    # the job themselves, each at its measured time (evidence, not the model, orders them: ranking
    # them by the model would favour the one it overrates most). A published layout measured
    # faster than a model plan within the bar is put before it: the layouts had been consulted
    # only where no model plan was within the bar, so a plan predicted slower than a layout
    # already measured could lead
    within = [r for r in out.ranked if r.objective >= bar]
    shown = {r.plan for r in within}
    published = [p for p in published_layouts(model, system, job, runs) if p.plan not in shown]
    # merged: the model's plans in the search's order (near-ties simplest first, planner.ties),
    # each published layout, fastest measured first, before the first plan predicted slower
    candidates, waiting = [], sorted(published, key=lambda r: r.measured_s)
    for r in within:
        while waiting and waiting[0].measured_s < r.objective:
            candidates.append(waiting.pop(0))
        candidates.append(r)
    candidates = (candidates + waiting)[:top_k]
    if not candidates:
        # no published layout is a valid plan of the job as asked (pins, memory reserve): the
        # model's own fastest plans within the bar
        wider = search(model, system, job, top_k=max(WIDER_TOP_K, top_k))
        candidates = [r for r in wider.ranked if r.objective >= bar][:top_k]
    if not candidates:
        return
    seen = {r.plan for r in candidates}
    fastest = out.best
    out.model_only = [r for r in out.ranked if r.objective < bar and r.plan not in seen] + out.model_only
    out.ranked = candidates
    out.stats["job_gate"] = {
        "limit": UNMEASURED_ADVANTAGE_LIMIT, "published_run": runs[0]["id"], "published_plan": runs[0]["plan"],
        "published_dtype": runs[0]["dtype"], "measured_s": runs[0]["measured_s"], "bar_s": bar,
        "model_best_s": fastest.objective, "model_best_ratio": fastest.objective / runs[0]["measured_s"],
        "recommended_from": getattr(out.ranked[0], "run_id", "") or "search"}


@dataclass
class PublishedLayout(Ranked):
    run_id: str = ""
    measured_s: float = 0.0  # the run's measured step time (what orders it among the candidates)


def published_layouts(model: ModelSpec, system: SystemSpec, job: JobSpec, runs: list[dict]) -> list[PublishedLayout]:
    """The published runs' layouts (in the runs' order, fastest measured first) that are valid
    plans for this job as asked (its pins, offload and framework rules, and they fit under the
    job's memory reserve), re-scored for it."""
    out, seen = [], set()
    for run in runs:
        plan = Plan.model_validate(run["plan_fields"])
        if plan in seen:
            continue  # several releases of one layout: the fastest measured stands for it
        seen.add(plan)
        if breaks_pins(plan, job.pins):
            continue
        if not job.allow_offload and plan.uses_offload:
            continue
        if job.framework == "megatron" and not_expressible(plan, model, job):
            continue
        est = estimate(model, system, plan, job)
        if est.feasible:
            out.append(PublishedLayout(plan=plan, estimate=est, objective=_objective(est, model.seq_length, False),
                                       run_id=run["id"], measured_s=run["measured_s"]))
    return out


def _offload_gain(model: ModelSpec, system: SystemSpec, job: JobSpec, out: Recommendation,
                  time_limit_s: float, first: SearchResult | None = None) -> None:
    """Where the best plan offloads, what it buys: the best plan without offload (stats
    "offload_gain"; None where nothing fits without it). Exact ties already go to less offload
    (constraints.cost_table.order_rows), so a plan that offloads is strictly faster or the only fit.
    `first`: the search of this job that found the plan; it bounds the search without offload
    (constraints.no_offload), which then costs only the layouts that can win it."""
    if out.best is None or not out.best.plan.uses_offload:
        return
    # without offload: the user's offload pins go too (kept, they would leave no plan at all)
    pins = {k: v for k, v in job.pins.items() if not k.startswith("offload_")}
    alone = search(model, system, job.model_copy(update={"allow_offload": False, "pins": pins}), top_k=1,
                   time_limit_s=time_limit_s, no_offload_bounds=first.no_offload if first else None).best
    out.stats["offload_gain"] = None if alone is None else {
        "plan_without_offload": alone.plan.short(), "step_time_s": alone.estimate.step_time_s,
        "objective": alone.objective, "advantage": 1 - out.best.objective / alone.objective}


def recommended_plan(model: ModelSpec, system: SystemSpec, job: JobSpec | None = None):
    """The plan `planner plan` would print first (used by `planner megatron`), or None."""
    best = recommend(model, system, job, top_k=1, offload_gain=False).best
    return best.plan if best else None


__all__ = ["recommend", "recommended_plan", "Recommendation", "UNMEASURED_ADVANTAGE_LIMIT"]
