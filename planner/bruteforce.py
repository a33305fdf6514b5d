"""Brute force under the exact model: the test oracle of the search.

It enumerates the FULL space of `constraints.space` (every legal global batch, every memory and
overlap option, no dominance pruning), evaluates every row with `estimate_many`, keeps the rows
the model itself finds feasible (`violations == 0`, i.e. its own divisibility, batch,
compatibility and memory rules) and, with framework 'megatron', that `megatron.not_expressible`
accepts, then returns the best row of each distinct layout (tp, pp, dp, cp, ep, vpp,
micro_batch), best first, with the same objective and tie-break as the search (planner.ties
re-ranks near-equal layouts simplest first). Only for spaces
small enough to enumerate (the tests use up to a few hundred thousand rows).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, fields
from typing import Callable

import numpy as np

from constraints.space import build_space, cross, expand_batches, layouts, options
from constraints.cost_table import (MEMORY_BITS, block_recompute_rows, evaluate, hbm_fits, offloaded_layer_range,
                                   order_rows, plan_arrays)
from planner.analytical.offload import fraction_of_layers
from hardware.spec import SystemSpec
from planner.megatron import not_expressible
from planner.model import ModelSpec
from planner.plan import JobSpec, Plan
from planner.ties import TIE_REL_TOL, needs_more, rank_with_ties


@dataclass
class BruteForce:
    plans: list[Plan]
    objectives: list[float]
    space_size: int
    feasible_rows: int
    stats: dict = field(default_factory=dict)


def brute_force(model: ModelSpec, system: SystemSpec, job: JobSpec | None = None,
                top_k: int | None = None, max_rows: int = 20_000_000,
                keep: Callable[[Plan], bool] | None = None) -> BruteForce:
    """`keep`: only plans it accepts count (a plan family, for planner.recommend's oracle)."""
    t0 = time.perf_counter()
    job = job or JobSpec()
    space = build_space(model, system, job)
    lay = layouts(space)
    lay["layout_id"] = np.arange(len(lay["tp"]), dtype=np.float64)
    rows = with_every_recompute_count(cross(space, expand_batches(lay), options(space)), model.layers)
    n = len(rows["tp"])
    if n > max_rows:
        raise ValueError(f"brute force: {n} rows is more than max_rows={max_rows}")
    if n == 0:
        return BruteForce([], [], 0, 0, {"seconds": time.perf_counter() - t0})
    res = evaluate(space, rows, fewest_counts=False)
    rows, res = with_every_offloaded_layer_count(space, rows, res)
    structural = int(np.count_nonzero(res["violations"] & ~MEMORY_BITS))
    ok = np.nonzero(res["violations"] == 0)[0]
    # The walk below visits feasible rows in the search's order and stops after the K best
    # layouts (ties included). Rows with objective <= `bound` are exactly a prefix of that order, so
    # the walk over them alone visits the same rows if it stops inside them; only if it does not
    # is the whole order needed (sorting millions of rows on 20 keys is most of the oracle's time
    # after the evaluation itself).
    prefix = ok
    if top_k is not None and len(ok):
        layout_of = rows["layout_id"][ok].astype(np.int64)
        best_of_layout = np.full(int(layout_of.max()) + 1, np.inf)
        np.minimum.at(best_of_layout, layout_of, res["objective"][ok])
        finite = np.sort(best_of_layout[np.isfinite(best_of_layout)])
        bound = finite[min(len(finite), 2 * top_k + 1) - 1] * (1.0 + 2.0 * TIE_REL_TOL)
        prefix = ok[res["objective"][ok] <= bound]
    plans, objectives, skipped, stopped = _walk(space, rows, res["objective"], prefix, model, job, top_k, keep)
    if not stopped and len(prefix) < len(ok):
        plans, objectives, skipped, _ = _walk(space, rows, res["objective"], ok, model, job, top_k, keep)
    order = rank_with_ties(objectives, plans, top_k)
    plans, objectives = [plans[j] for j in order], [objectives[j] for j in order]
    if top_k is not None:
        # the same per-stage step as the search (issue 8): this oracle checks the layout level
        # (its own per-stage oracle is best_stage_split), so both refine their top K alike
        from planner.analytical import estimate  # noqa: PLC0415
        from planner.search import Ranked, refine_stages  # noqa: PLC0415 (same layer)
        ranked = [Ranked(plan=p, estimate=estimate(model, system, p, job), objective=o)
                  for p, o in zip(plans, objectives)]
        ranked = refine_stages(model, system, job, ranked, space.free_batch, top_k)
        plans, objectives = [r.plan for r in ranked], [r.objective for r in ranked]
    return BruteForce(plans, objectives, n, len(ok),
                      {"seconds": time.perf_counter() - t0, "structural_rejects": structural,
                       "not_expressible_skips": skipped})


def with_every_recompute_count(rows: dict[str, np.ndarray], layers: int) -> dict[str, np.ndarray]:
    """Each row with a block count to choose (full recompute, no pipeline, no offload:
    `cost_table.block_recompute_rows`) once per count k = 1 .. layers (`recompute_layers`; k =
    layers is every layer), every other row as it is (count 0): the search costs such rows at the
    fewest layers that fit, the oracle tries them all."""
    block = block_recompute_rows(rows)  # which rows have the choice: the space's definition
    reps = np.where(block, layers, 1)
    out = {k: np.repeat(v, reps) for k, v in rows.items()}
    start = np.repeat(np.cumsum(reps) - reps, reps)
    out["recompute_layers"] = np.where(np.repeat(block, reps), np.arange(len(start)) - start + 1, 0).astype(np.float64)
    return out


def with_every_offloaded_layer_count(space, rows: dict[str, np.ndarray], res: dict[str, np.ndarray]):
    """Rows and results with every activation-offload layer count a row stands for
    (`cost_table.offloaded_layer_range`: the search costs such a row at the fewest whose HBM fits,
    the oracle tries them all). Only counts below a row whose HBM fits are added: HBM never falls
    as fewer layers are offloaded, so below a row whose HBM does not fit none fits."""
    lo, hi = offloaded_layer_range(space, rows)
    src = np.flatnonzero((hi - lo > 1) & hbm_fits(res["violations"]))
    if not len(src):
        return rows, res
    counts = (hi - lo - 1)[src].astype(np.int64)  # lo < k < hi: hi is the row itself
    idx = np.repeat(src, counts)
    k = np.repeat(lo[src], counts) + 1 + (np.arange(len(idx)) - np.repeat(np.cumsum(counts) - counts, counts))
    extra = {name: v[idx] for name, v in rows.items()}
    extra["offload_activations"] = fraction_of_layers(k, space.model.layers)
    res_x = evaluate(space, extra, fewest_counts=False)
    return ({name: np.concatenate([v, extra[name]]) for name, v in rows.items()},
            {name: np.concatenate([v, res_x[name]]) for name, v in res.items()})


def _walk(space, rows: dict[str, np.ndarray], objective: np.ndarray, idx: np.ndarray, model: ModelSpec,
          job: JobSpec, top_k: int | None, keep: Callable[[Plan], bool] | None = None
          ) -> tuple[list[Plan], list[float], int, bool]:
    """The best row of each distinct layout among rows `idx`, in the search's order (objective,
    then the knob values), Megatron-inexpressible rows skipped; with `top_k`, until the K best
    layouts and their ties are found. Returns (plans, objectives, skips, stopped early)."""
    sub = {k: v[idx] for k, v in rows.items()}
    obj = objective[idx]
    seen: set[int] = set()
    plans, objectives = [], []
    skipped = 0
    for i in order_rows(sub, obj):
        g = int(sub["layout_id"][i])
        if g in seen:
            continue
        plan = plan_arrays(space, {k: v[i:i + 1] for k, v in sub.items()}).row(0)
        if job.framework == "megatron" and not_expressible(plan, model, job):
            skipped += 1
            continue
        if keep is not None and not keep(plan):
            continue
        seen.add(g)
        plans.append(plan)
        objectives.append(float(obj[i]))
        if top_k is not None and len(plans) > top_k and not needs_more(objectives, top_k, False):
            return plans, objectives, skipped, True
    return plans, objectives, skipped, top_k is None


def compositions(total: int, parts: int):
    """Every way to write `total` as `parts` positive integers, in lexicographic order."""
    if parts == 1:
        yield (total,)
        return
    for first in range(1, total - parts + 2):
        for rest in compositions(total - first, parts - 1):
            yield (first,) + rest


def best_stage_split(model: ModelSpec, system: SystemSpec, job: JobSpec, plan: Plan) -> tuple[Plan | None, float]:
    """The per-stage oracle: every split of the layers over pp·vpp virtual stages (each >= 1)
    and, under full recompute, every block recompute count k (k = 0: none), each costed by the
    exact model; the fastest one that breaks no rule. Small cases only (C(L−1, S−1)·L plans)."""
    from planner.analytical import PlanArrays, estimate_many  # noqa: PLC0415 (oracle-only import)
    from planner.analytical.layer_kinds import dense_layer_spec  # noqa: PLC0415
    from planner.analytical.plans import RANK_FIELDS  # noqa: PLC0415
    S = plan.pp * plan.vpp
    splits = list(compositions(model.layers, S))
    ks = range(0, max(max(s) for s in splits) + 1) if plan.recompute == "full" else [0]
    layouts, recompute = [], []
    for split in splits:
        for k in ks:
            if k and k > max(split):
                continue
            layouts.append((split, tuple(min(k, n) for n in split) if k else None))
            recompute.append(2 if k else (0 if plan.recompute == "full" else {"none": 0, "selective": 1}[plan.recompute]))
    n = len(layouts)
    base = PlanArrays.from_plans([plan.model_copy(update={"stage_layers": None, "stage_recompute_layers": None,
                                                          "recompute_num_layers": None})], model.layers,
                                dense_layer_spec(model))
    # every knob of the plan but the per-stage ones (MoE folding, dispatcher and switches included)
    cols = {f.name: np.repeat(getattr(base, f.name), n) for f in fields(PlanArrays)
            if f.name not in RANK_FIELDS + ("recompute", "recompute_layers", "stage_layout")}
    stage_layout = np.empty(n, dtype=object)
    stage_layout[:] = layouts
    P = PlanArrays.from_columns(n, model.layers, dense_layer_spec(model), recompute=np.asarray(recompute, dtype=float),
                                stage_layout=stage_layout, **cols)
    res = estimate_many(model, system, job, P)
    ok = np.nonzero(res["violations"] == 0)[0]
    if not len(ok):
        return None, float("inf")
    best = ok[np.argmin(res["step_time_s"][ok])]
    return P.row(int(best)), float(res["step_time_s"][best])


__all__ = ["BruteForce", "brute_force", "best_stage_split", "compositions"]
