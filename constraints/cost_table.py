"""The cost table the CP-SAT model optimises: EXACT per-row costs, scaled to integers.

Why a table and not a fitted surrogate: the prototype's approximate surrogates (overlap terms
dropped, log-linear fits) lost the optimum by up to 26 % even when the exact model re-scored
their top-200; tabulating the exact cost of every candidate row gave zero regret. So each row of
the table is one complete plan, costed by `planner.analytical.estimate_many`, and the CP-SAT
model picks exactly one row.

Objective: time per token, step_time / (global_batch·seq), when the batch is free; step time
when it is fixed. Ties are broken by the row's knob values (`order_rows`), so every consumer (the
solver, the brute-force oracle) ranks identically.

Which rows are tabulated: the space (`constraints.space`) with three pruning rules, each
provably harmless for the K best DISTINCT layouts (a layout = tp, pp, dp, cp, ep, vpp,
micro_batch; each reported with its best batch and memory options) under the exact model and the
given HBM / offload capacities:

1. Batch. For one (layout, options) pair the step time is affine in the microbatch count m with
   a non-negative intercept, so time per token falls as m grows, and per-GPU memory depends on m
   only through min(m, pp) (1F1B in-flight microbatches). So the largest legal m (M) beats every
   other m >= pp with the same memory; an m < pp can only matter when M does not fit, and then
   only the largest m < pp that fits (memory grows with m), found by bisection with exact
   evaluations. A pair whose M-row is already no better than its layout's best fitting row, or
   than the K-th best layout, needs no search.
2. Per layout, rows ranked after the layout's best fitting row can never be its choice: dropped.
   Rows ranked before it do not fit (they are what the memory-fit constraint forbids); among them
   a row is dropped when an earlier row of the same layout needs no more HBM and no more offload
   capacity (Pareto dominance).
3. With `top_k`, a row ranked after the K-th best layout's best fitting row cannot be in the
   top K: dropped.
The brute-force oracle (`planner.bruteforce`) enumerates the full space with none of this, and
the regret tests compare the two.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from constraints.space import LAYOUT_KEYS, OPTION_KEYS, ROW_KEYS, Space, at_batch, cross, layouts, options
from planner.analytical import PlanArrays, estimate_many
from planner.analytical.estimate import RULE_BITS
from planner.analytical.layer_kinds import lead_layers

MEMORY_BITS = RULE_BITS["hbm"] | RULE_BITS["offload_capacity"]
CHUNK = 400_000
SCALE = 1_000_000          # integer cost = round(objective / best · SCALE)
MAX_SCALED = 1_000_000_000  # clip: rows > 1000× the best keep their order through the tie-break

KEEP_RESULTS = ("step_time_s", "hbm_bytes", "offload_bytes", "violations")


def plan_arrays(space: Space, rows: dict[str, np.ndarray]) -> PlanArrays:
    cols = {k: rows[k] for k in LAYOUT_KEYS + ("global_batch",) + OPTION_KEYS}
    return PlanArrays.from_columns(len(rows["tp"]), space.model.layers, lead_layers(space.model), **cols)


def evaluate(space: Space, rows: dict[str, np.ndarray], keep=KEEP_RESULTS) -> dict[str, np.ndarray]:
    """Exact model on every row (in chunks); adds `objective`."""
    n = len(rows["tp"])
    out: dict[str, list] = {k: [] for k in keep}
    for lo in range(0, n, CHUNK):
        part = {k: v[lo:lo + CHUNK] for k, v in rows.items()}
        res = estimate_many(space.model, space.system, space.job, plan_arrays(space, part))
        for k in keep:
            out[k].append(res[k])
    res = {k: (np.concatenate(v) if v else np.zeros(0)) for k, v in out.items()}
    res["violations"] = res["violations"].astype(np.int64)
    res["objective"] = objective(space, rows, res["step_time_s"])
    return res


def objective(space: Space, rows: dict[str, np.ndarray], step_time: np.ndarray) -> np.ndarray:
    if space.free_batch:
        return step_time / (rows["global_batch"] * space.model.seq_length)
    return np.asarray(step_time, dtype=np.float64)


def order_rows(rows: dict[str, np.ndarray], obj: np.ndarray) -> np.ndarray:
    """Permutation sorting rows by (objective, then the knob values in ROW_KEYS order)."""
    keys = [rows[k] for k in reversed(ROW_KEYS)] + [obj]
    return np.lexsort(keys)


def integer_costs(obj_sorted: np.ndarray) -> np.ndarray:
    """Integer objective coefficients for rows already in rank order: round(obj/best·1e6)·n + rank.
    Strictly increasing with the rank, so the integer optimum is the exact optimum with the same
    tie-break; the scaled part keeps the magnitudes readable in the solver's log."""
    n = len(obj_sorted)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    best = obj_sorted[0] if obj_sorted[0] > 0 else 1.0
    q = np.clip(np.round(obj_sorted / best * SCALE), 1, MAX_SCALED).astype(np.int64)
    return q * n + np.arange(n, dtype=np.int64)


@dataclass
class Table:
    """Tabulated rows in rank order (best objective first), with their exact results."""

    space: Space
    rows: dict[str, np.ndarray]            # ROW_KEYS + m, group (layout id)
    res: dict[str, np.ndarray]             # step_time_s, hbm_bytes, offload_bytes, violations, objective
    stats: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.rows["tp"])

    @property
    def fits(self) -> np.ndarray:
        return self.res["violations"] == 0

    @property
    def costs(self) -> np.ndarray:
        return integer_costs(self.res["objective"])


def _take(d: dict[str, np.ndarray], idx) -> dict[str, np.ndarray]:
    return {k: v[idx] for k, v in d.items()}


def _cat(parts: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    keys = parts[0].keys()
    return {k: np.concatenate([p[k] for p in parts]) for k in keys}


def _group_min(group: np.ndarray, values: np.ndarray, n_groups: int) -> np.ndarray:
    out = np.full(n_groups, np.inf)
    np.minimum.at(out, group, values)
    return out


def _kth(values: np.ndarray, k: int | None) -> float:
    finite = np.sort(values[np.isfinite(values)])
    if k is None or len(finite) < k:
        return np.inf
    return float(finite[k - 1])


@dataclass
class PairCosts:
    """Step 1 of `tabulate`, which does not depend on top_k: every (layout, options) pair costed
    at its largest microbatch count. The search reuses it when ties make it ask for more layouts,
    instead of costing the same 10^6 pairs again."""

    space: Space
    relax_memory: bool
    lay: dict[str, np.ndarray]
    pairs: dict[str, np.ndarray]
    full_size: int
    pre_evaluated: int
    rows_m: dict[str, np.ndarray]
    res_m: dict[str, np.ndarray]
    seconds: float


def cost_pairs(space: Space, relax_memory: bool = False) -> PairCosts:
    t0 = time.perf_counter()
    lay = layouts(space)
    pairs = cross(space, lay, options(space))
    full_size = int(np.sum((pairs["m_max"] - pairs["m_min"]) // pairs["m_step"] + 1)) if len(pairs["tp"]) else 0
    pairs, pre_evaluated = (pairs, 0) if relax_memory else _drop_dominated_offload(space, pairs)
    rows_m = at_batch(pairs, pairs["m_max"])
    res_m = evaluate(space, rows_m)
    return PairCosts(space, relax_memory, lay, pairs, full_size, pre_evaluated, rows_m, res_m,
                     time.perf_counter() - t0)


def tabulate(space: Space, top_k: int | None = None, relax_memory: bool = False,
             costed: PairCosts | None = None) -> Table:
    """The pruned exact cost table (see the module docstring). `relax_memory`: treat every row as
    fitting while pruning (used to explain infeasible boxes: what would the best plan need).
    `costed`: step 1 from an earlier call on the same space (`cost_pairs`), reused."""
    if costed is None or costed.space is not space or costed.relax_memory != relax_memory:
        costed = cost_pairs(space, relax_memory)
    t0 = time.perf_counter() - costed.seconds  # build_s: this table's seconds, step 1 included
    lay, pairs, full_size, pre_evaluated = costed.lay, costed.pairs, costed.full_size, costed.pre_evaluated
    n_pairs = len(pairs["tp"])
    group_all = pairs["lay_row"].astype(np.int64)
    n_groups = len(lay["tp"])

    # 1. every pair at its largest microbatch count
    rows_m, res_m = costed.rows_m, costed.res_m
    evaluated = n_pairs + pre_evaluated
    structural = (res_m["violations"] & ~MEMORY_BITS) != 0   # should be none: space == rules
    fit_m = (res_m["violations"] == 0) | (relax_memory & ~structural)
    obj_m = res_m["objective"]
    best_fit = _group_min(group_all[fit_m], obj_m[fit_m], n_groups)
    threshold = _kth(best_fit, top_k)

    # 1b. bisection for the largest fitting m < pp where the largest m does not fit
    parts = [(rows_m, res_m, group_all)]
    cand = (~fit_m & ~structural & (pairs["m_step"] == 1) & (pairs["m_min"] == 1) & (pairs["pp"] > 1)
            & (pairs["m_max"] > 1) & (obj_m <= np.minimum(best_fit[group_all], threshold)))
    ci = np.nonzero(cand)[0]
    if len(ci):
        sub = _take(pairs, ci)
        hi = np.minimum(sub["pp"] - 1, sub["m_max"] - 1)
        r1 = evaluate(space, at_batch(sub, np.ones(len(ci))), keep=("step_time_s", "violations"))
        evaluated += len(ci)
        ok1 = r1["violations"] == 0
        lo = np.ones(len(ci))
        hi_ex = hi + 1  # first m known not to fit (m >= pp has the memory of m_max)
        active = ok1 & (hi_ex - lo > 1)
        while active.any():
            ai = np.nonzero(active)[0]
            mid = np.floor((lo[ai] + hi_ex[ai]) / 2)
            r = evaluate(space, at_batch(_take(sub, ai), mid), keep=("step_time_s", "violations"))
            evaluated += len(ai)
            ok = r["violations"] == 0
            lo[ai[ok]] = mid[ok]
            hi_ex[ai[~ok]] = mid[~ok]
            active = ok1 & (hi_ex - lo > 1)
        good = np.nonzero(ok1)[0]
        if len(good):
            rows_b = at_batch(_take(sub, good), lo[good])
            res_b = evaluate(space, rows_b)
            evaluated += len(good)
            parts.append((rows_b, res_b, group_all[ci[good]]))
    rows = _cat([p[0] for p in parts])
    res = _cat([p[1] for p in parts])
    group = np.concatenate([p[2] for p in parts])
    keep = (res["violations"] & ~MEMORY_BITS) == 0
    # rules 2 and 3 early, by objective value alone (ties kept), so that only few rows get sorted
    fit0 = (res["violations"] == 0) | relax_memory
    bf = _group_min(group[fit0 & keep], res["objective"][fit0 & keep], n_groups)
    keep &= res["objective"] <= np.minimum(bf[group], _kth(bf, top_k))
    rows, res, group = _take(rows, keep), _take(res, keep), group[keep]

    # 2. rank, then per-layout pruning
    order = order_rows(rows, res["objective"])
    rows, res, group = _take(rows, order), _take(res, order), group[order]
    n = len(group)
    fit = (res["violations"] == 0) | relax_memory
    rank = np.arange(n)
    first_fit = np.full(n_groups, n, dtype=np.int64)
    np.minimum.at(first_fit, group[fit], rank[fit])
    keep = rank <= first_fit[group]
    # Pareto among the non-fitting rows ranked before the layout's first fit
    hbm, off = res["hbm_bytes"], res["offload_bytes"]
    by_group = np.lexsort((rank, group))           # rank order inside each group
    g_sorted = group[by_group]
    dominated = np.zeros(n, dtype=bool)
    for mask_fn in (lambda idx: off[idx] == 0, None):
        if mask_fn is not None:
            # earlier rows (same group) with no offload and no more HBM dominate
            src = np.where(mask_fn(by_group), hbm[by_group], np.inf)
            prefix = _segment_prefix_min_exclusive(src, g_sorted)
            dominated[by_group] |= prefix <= hbm[by_group]
        else:
            # earlier rows of the same group with the same offload bytes and no more HBM
            key_off = off[by_group]
            sub_order = np.lexsort((np.arange(n), key_off, g_sorted))
            seg = np.concatenate([[True], (g_sorted[sub_order][1:] != g_sorted[sub_order][:-1])
                                  | (key_off[sub_order][1:] != key_off[sub_order][:-1])])
            seg_id = np.cumsum(seg)
            prefix = _segment_prefix_min_exclusive(hbm[by_group][sub_order], seg_id)
            dominated[by_group[sub_order]] |= prefix <= hbm[by_group][sub_order]
    keep &= fit | ~dominated
    # 3. top-K threshold on the final ranking
    best_fit = _group_min(group[fit & keep], res["objective"][fit & keep], n_groups)
    keep &= res["objective"] <= _kth(best_fit, top_k)
    rows, res, group = _take(rows, keep), _take(res, keep), group[keep]
    rows["group"] = group
    stats = {"space_size": full_size, "layouts": n_groups, "pairs": n_pairs, "evaluated": evaluated,
             "table_rows": len(group), "structural_rejects": int(structural.sum()),
             "build_s": time.perf_counter() - t0}
    return Table(space=space, rows=rows, res=res, stats=stats)


OFFLOAD_COLUMNS = ("offload_weights", "offload_activations", "offload_optimizer")


def _drop_dominated_offload(space: Space, pairs: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], int]:
    """Drop offload variants whose no-offload twin (every other knob equal) fits at its largest
    batch. Exact under the model: offload only adds time (its traffic is >= 0, and the
    optimizer step of offloaded state is slower) as long as the tier is no faster than HBM's
    element-wise bandwidth, which we check; memory is then no longer a reason to offload."""
    system = space.system
    acc = system.accelerator
    offloads = np.zeros(len(pairs["tp"]), dtype=bool)
    for col in OFFLOAD_COLUMNS:
        offloads |= pairs[col] > 0
    if (system.offload is None or not offloads.any() or system.offload.bandwidth_bytes_per_s
            > acc.hbm_bandwidth_bytes_per_s * acc.efficiency.hbm_efficiency):
        return pairs, 0
    base = np.nonzero(~offloads)[0]
    res = evaluate(space, at_batch(_take(pairs, base), pairs["m_max"][base]), keep=("step_time_s", "violations"))
    # twin id: the layout row and the non-offload options, mixed radix over each option's domain
    twin = pairs["lay_row"].astype(np.int64)
    for col in (c for c in OPTION_KEYS if c not in OFFLOAD_COLUMNS):
        domain = np.asarray(sorted(set(space.domains[col])), dtype=np.float64)
        twin = twin * len(domain) + np.searchsorted(domain, pairs[col])
    twin = np.unique(twin, return_inverse=True)[1].ravel()
    twin_fits = np.zeros(int(twin.max()) + 1, dtype=bool)
    twin_fits[twin[base[res["violations"] == 0]]] = True
    keep = np.nonzero(~offloads | ~twin_fits[twin])[0]
    return _take(pairs, keep), len(base)


def _segment_prefix_min_exclusive(values: np.ndarray, seg: np.ndarray) -> np.ndarray:
    """For each position, the min of `values` at EARLIER positions of the same segment (inf if
    none); segments are contiguous runs of equal `seg`."""
    n = len(values)
    if n == 0:
        return np.zeros(0)
    starts = np.concatenate([[True], seg[1:] != seg[:-1]])
    shifted = np.concatenate([[np.inf], values[:-1]])
    shifted[starts] = np.inf
    bounds = np.flatnonzero(starts)
    lengths = np.diff(np.append(bounds, n))
    if len(lengths) * int(lengths.max()) <= 20_000_000:
        seg_id = np.cumsum(starts) - 1
        col = np.arange(n) - np.repeat(bounds, lengths)
        pad = np.full((len(lengths), int(lengths.max())), np.inf)
        pad[seg_id, col] = shifted
        return np.minimum.accumulate(pad, axis=1)[seg_id, col]
    out = np.empty(n)
    for a, length in zip(bounds, lengths):
        out[a:a + length] = np.minimum.accumulate(shifted[a:a + length])
    return out


__all__ = ["Table", "tabulate", "cost_pairs", "PairCosts", "evaluate", "objective", "order_rows", "integer_costs",
           "plan_arrays", "MEMORY_BITS"]
