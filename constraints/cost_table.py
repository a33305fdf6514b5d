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
   capacity (Pareto dominance). A layout with no fitting row has no choice: all its rows go
   (unless memory is relaxed, for `check`'s what-ifs).
3. With `top_k`, a row ranked after the K-th best layout's best fitting row (times
   1 + tie_rel_tol: near-ties are re-ranked by planner.ties) cannot be in the top K: dropped.
0. Before any of this, offload dominance and a lower bound skip pairs that rules 2 and 3 would
   drop anyway, without costing them (`_largest_batch_pass`); so do the overlap twins: a pair
   with dp/tp communication overlap or the MoE all-to-all overlap off is not costed where its
   twin with it on is never slower (and, for the all-to-all overlap, fits), by the rules of
   `constraints.dominance`. Because a tie would rank the twin first, the skipped twins of every
   row still in the running after the first bounds are costed at its batch and ranked with the
   rest ("1c" in `tabulate`), so the table is the one without this step. Last, rule 3 before
   costing: a layout whose compute and least exposed TP/CP/EP communication alone
   (`layout_lower_bounds`) are slower than the K-th best layout costed so far is not costed at
   all; its pairs are visited cheapest layout first, in blocks, so that the bar falls early
   (DeepSeek-V3 on 256 GB200: 5.0 M pairs costed before, 0.09 M after).
Full recompute without a pipeline or offload is costed at the fewest recomputed layers that fit
(`fewest_recompute_layers`), a row's own choice like its batch; the all-to-all overlap rule of
step 0 leaves those rows alone, since freeing memory can lower the count. Likewise activation
offload without a pipeline is costed at the fewest offloaded layers that fit
(`fewest_offloaded_layers`), within the layers between its grid fraction and the next one down;
step 0's offload dominance then leaves a row that offloads activations alone where the pair below
it offloads the same fraction, since that pair's other offload frees memory for fewer layers.
The brute-force oracle (`planner.bruteforce`) enumerates the full space with none of this (every
block and offloaded-layer count included), and the regret tests compare the two.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from constraints.dominance import Twins
from constraints.no_offload import LAYOUT_ID_KEYS, NoOffloadBounds, kth_best, option_ids
from constraints.space import (LAYOUT_KEYS, OPTION_KEYS, ROW_KEYS, Space, at_batch, layouts, options, pair_mask,
                               take_pairs)
from planner.analytical import PlanArrays, estimate_many
from planner.analytical.estimate import RULE_BITS
from planner.analytical.layer_kinds import dense_layer_spec
from planner.analytical.offload import fraction_of_layers, offloaded_layers
from planner.plan import MOE_DISPATCHER_CODES, RECOMPUTE_CODES
from planner.threads import map_in_order

MEMORY_BITS = RULE_BITS["hbm"] | RULE_BITS["offload_capacity"]
CHUNK = 32_768   # rows per estimate_many call: working set in cache (400 k: ~25 % more CPU, measured)


def chunk_rows(space: Space) -> int:
    """Rows per estimate_many call for `space`: CHUNK, fewer where a row carries every pipeline
    rank (a pipelined hybrid stack, plans.with_every_rank: pp columns, not 3), so that a chunk's
    arrays stay the size CHUNK rows of 3 representative ranks have (10,000 blocks at pp 1,024 had
    taken 18 GB)."""
    from planner.analytical import layer_kinds
    if not layer_kinds.by_block(space.model):
        return CHUNK
    width = max(3, max(space.domains.get("pp", (1,))))
    return max(64, CHUNK * 3 // width)
SCALE = 1_000_000          # integer cost = round(objective / best · SCALE)
MAX_SCALED = 1_000_000_000  # clip: rows > 1000× the best keep their order through the tie-break

KEEP_RESULTS = ("step_time_s", "hbm_bytes", "offload_bytes", "violations")


def plan_arrays(space: Space, rows: dict[str, np.ndarray]) -> PlanArrays:
    """The rows as model columns; `recompute_layers` (block recompute's count, 0 = all layers) is
    read where the rows carry it (`evaluate` chooses it)."""
    cols = {k: rows[k] for k in LAYOUT_KEYS + ("global_batch",) + OPTION_KEYS + ("recompute_layers",) if k in rows}
    if space.model.moe:
        cols["moe_dispatcher"] = MOE_DISPATCHER_CODES[space.job.moe_dispatcher]
    cols["cross_entropy_fusion"] = int(space.job.cross_entropy_fusion)
    return PlanArrays.from_columns(len(rows["tp"]), space.model.layers, dense_layer_spec(space.model), **cols)


def evaluate(space: Space, rows: dict[str, np.ndarray], keep=KEEP_RESULTS,
             fewest_counts: bool = True) -> dict[str, np.ndarray]:
    """Exact model on every row (in chunks); adds `objective`, `recompute_layers`, the block
    recompute count each row is costed at (0: all layers; rows that carry the column keep theirs),
    and `offload_activations`, the fraction each row is costed at. `fewest_counts`: full recompute
    without a pipeline or offload is costed at the fewest layers that fit
    (`fewest_recompute_layers`), activation offload without a pipeline at the fewest offloaded
    layers that fit (`fewest_offloaded_layers`); the brute-force oracle turns it off and
    enumerates every count."""
    keep = tuple(keep) + tuple(k for k in ("violations", "step_time_s") if k not in keep)
    res = _estimate(space, rows, keep)
    given = rows.get("recompute_layers")
    res["recompute_layers"] = np.zeros(len(rows["tp"])) if given is None else np.asarray(given, dtype=np.float64)
    res["offload_activations"] = np.asarray(rows["offload_activations"], dtype=np.float64).copy()
    if fewest_counts and given is None:
        fewest_recompute_layers(space, rows, res)
    if fewest_counts:
        fewest_offloaded_layers(space, rows, res)
    res["objective"] = objective(space, rows, res["step_time_s"])
    return res


def _estimate(space: Space, rows: dict[str, np.ndarray], keep) -> dict[str, np.ndarray]:
    size = chunk_rows(space)

    def chunk(lo: int) -> dict[str, np.ndarray]:
        part = {k: v[lo:lo + size] for k, v in rows.items()}
        res = estimate_many(space.model, space.system, space.job, plan_arrays(space, part))
        return {k: res[k] for k in keep}

    parts = map_in_order(chunk, range(0, len(rows["tp"]), size))  # on several threads: planner.threads
    res = {k: (np.concatenate([p[k] for p in parts]) if parts else np.zeros(0)) for k in keep}
    res["violations"] = res["violations"].astype(np.int64)
    return res


def block_recompute_rows(rows: dict[str, np.ndarray]) -> np.ndarray:
    """Rows whose full recompute is costed at its fewest fitting layers: those without a pipeline
    and without offload. There the count is one integer (Megatron's --recompute-num-layers, block
    method) that trades memory for time alone: each recomputed layer adds its forward and holds
    its input instead of its activations, and the memory does not depend on the microbatch count
    (one in flight), so the batch rule (rule 1) still holds. With offload it does not trade alone:
    the transfers hide behind compute, so recomputing more can be faster (every count costed, the
    fewest that fit was up to 59 % slower than the best with activation offload, 12 % with weight
    offload, on 4-8 H100/GH200): those rows keep every layer. Pipelined plans get per-stage
    counts from constraints.stages on the search's top plans instead (there the count would
    couple with the in-flight microbatches of rule 1b)."""
    offload = sum(np.asarray(rows[c]) for c in OFFLOAD_COLUMNS)
    return (rows["recompute"] == RECOMPUTE_CODES["full"]) & (rows["pp"] == 1) & (offload == 0)


def fewest_recompute_layers(space: Space, rows: dict[str, np.ndarray], res: dict[str, np.ndarray]) -> None:
    """In `res`, the block-recompute rows that fit with every layer recomputed, re-costed at the
    fewest recomputed layers that fit, found by bisection over 1..layers (memory never rises as
    a layer more is recomputed; time never falls): `res["recompute_layers"]` says how many
    (0: all, where no fewer fit)."""
    idx = np.flatnonzero(block_recompute_rows(rows) & (res["violations"] == 0))
    layers = space.model.layers
    if not len(idx) or layers < 2:
        return
    # k = 0 (none) does not fit, k = layers (every layer: the row as costed) fits
    _recost_at_fewest(space, rows, res, idx, np.zeros(len(idx)), np.full(len(idx), float(layers)),
                      "recompute_layers", lambda k: k, lambda violations: violations == 0)


def bisect_counts(a: np.ndarray, b: np.ndarray, ok) -> np.ndarray:
    """Per row, the count nearest `a` for which `ok(rows, counts)` holds, by bisection between `a`
    (exclusive: ok does not hold there, or it is another row's range) and `b` (ok holds), in either
    direction; ok is monotone between them."""
    a, b = a.astype(np.float64), b.astype(np.float64).copy()
    while True:
        active = np.flatnonzero(np.abs(b - a) > 1)
        if not len(active):
            return b
        mid = np.floor((a[active] + b[active]) / 2)
        good = ok(active, mid)
        b[active[good]] = mid[good]
        a[active[~good]] = mid[~good]


def _recost_at_fewest(space: Space, rows: dict[str, np.ndarray], res: dict[str, np.ndarray], idx: np.ndarray,
                      lo: np.ndarray, hi: np.ndarray, column: str, value_of, fits) -> None:
    """Rows `idx` re-costed in `res` at the fewest count in (lo, hi] for which `fits(violations)`
    holds, by bisection (the counts `hi` fit; fitting is monotone in the count), with
    `rows[column] = value_of(count)`; `res[column]` records the value each row is costed at."""
    sub = {k: v[idx] for k, v in rows.items()}

    def fits_at(active: np.ndarray, counts: np.ndarray) -> np.ndarray:
        probe = {k: v[active] for k, v in sub.items()}
        probe[column] = value_of(counts)
        return fits(_estimate(space, probe, ("violations",))["violations"])

    top = hi.astype(np.float64)
    hi = bisect_counts(lo.astype(np.float64), top, fits_at)
    fewer = np.flatnonzero(hi < top)
    if not len(fewer):
        return
    at = {k: v[fewer] for k, v in sub.items()}
    at[column] = value_of(hi[fewer])
    again = _estimate(space, at, tuple(res.keys() - {"recompute_layers", "offload_activations", "objective"}))
    for k, v in again.items():
        res[k][idx[fewer]] = v
    res[column][idx[fewer]] = at[column]


def offloaded_layer_range(space: Space, rows: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(lo, hi) per row: the activation-offload layer counts it stands for, lo < N <= hi. A row
    without a pipeline that offloads activations at a grid fraction f (the fraction not pinned)
    stands for every whole-layer count above the next grid fraction's and up to f's own. As a
    layer more is offloaded, HBM never rises (it keeps L - N layers beside a fixed two-layer
    buffer), host memory never falls and time never falls (offload.py: the copies' exposure grows
    with N), so the row's best count is the fewest whose HBM fits, and if the host cannot take
    that one, no count fits. Every other row: lo = hi (its own count)."""
    L = space.model.layers
    f = np.asarray(rows["offload_activations"], dtype=np.float64)
    hi = offloaded_layers(f, np.full(len(f), float(L)))
    if "offload_activations" in space.job.pins or L < 2:
        return hi.copy(), hi
    grid = np.asarray(sorted({0.0, *space.domains["offload_activations"]}))
    below = grid[np.maximum(np.searchsorted(grid, f, side="left") - 1, 0)]
    ranged = (f > 0) & (np.asarray(rows["pp"]) == 1)
    return np.where(ranged, offloaded_layers(below, np.full(len(f), float(L))), hi), hi


def hbm_fits(violations: np.ndarray) -> np.ndarray:
    """Rows that break no rule but, at most, the offload tier's capacity."""
    return (violations & ~RULE_BITS["offload_capacity"]) == 0


def fewest_offloaded_layers(space: Space, rows: dict[str, np.ndarray], res: dict[str, np.ndarray]) -> None:
    """In `res`, the rows that offload activations over a range of layer counts
    (`offloaded_layer_range`) and whose HBM fits at the most of them, re-costed at the fewest
    whose HBM fits, found by bisection; `res["offload_activations"]` is the fraction each row is
    costed at."""
    lo, hi = offloaded_layer_range(space, rows)
    idx = np.flatnonzero((hi - lo > 1) & hbm_fits(res["violations"]))
    if len(idx):  # lo: HBM does not fit (or is the next row's count), hi: fits
        _recost_at_fewest(space, rows, res, idx, lo[idx], hi[idx], "offload_activations",
                          lambda n: fraction_of_layers(n, space.model.layers), hbm_fits)


def objective(space: Space, rows: dict[str, np.ndarray], step_time: np.ndarray) -> np.ndarray:
    if space.free_batch:
        return step_time / (rows["global_batch"] * space.model.seq_length)
    return np.asarray(step_time, dtype=np.float64)


def order_rows(rows: dict[str, np.ndarray], obj: np.ndarray) -> np.ndarray:
    """Permutation sorting rows by (objective, then the total offload fraction, then the knob
    values in ROW_KEYS order). On an exact tie the plan that offloads less wins: where the
    transfers hide behind compute the model costs offload at nothing, yet it takes host memory
    and link bandwidth, so it is chosen only where it pays (issue 9)."""
    offloaded = sum(np.asarray(rows[k], dtype=np.float64) for k in OFFLOAD_COLUMNS)
    keys = [rows[k] for k in reversed(ROW_KEYS)] + [offloaded, obj]
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
    # what this search tells a search of the same job without offload (constraints.no_offload)
    no_offload: NoOffloadBounds | None = None

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


def _group_any(group: np.ndarray, flags: np.ndarray, n_groups: int) -> np.ndarray:
    """Per group, whether any of its entries is flagged."""
    out = np.zeros(n_groups, dtype=bool)
    out[group[flags]] = True
    return out


def tabulate(space: Space, top_k: int | None = None, relax_memory: bool = False,
             tie_rel_tol: float = 0.0, no_offload_bounds: NoOffloadBounds | None = None) -> Table:
    """The pruned exact cost table (see the module docstring). `relax_memory`: treat every row as
    fitting while pruning (used to explain infeasible boxes: what would the best plan need).
    `tie_rel_tol`: rule 3 keeps every layout within this relative distance of the K-th best
    (planner.ties re-ranks near-equal layouts, so all of them must reach the solver).
    `no_offload_bounds`: for a space without offload, what a search of the same job with offload
    found (`Table.no_offload`): the layouts it shows cannot reach this table are not costed."""
    t0 = time.perf_counter()
    lay = layouts(space)
    bounded_out = 0
    needed = (no_offload_bounds.needed(space, lay, top_k, tie_rel_tol)
              if no_offload_bounds is not None and not relax_memory else None)
    if needed is not None:
        bounded_out = int((~needed).sum())
        lay = _take(lay, needed)
    n_groups = len(lay["tp"])
    found = _largest_batch_pass(space, lay, relax_memory, top_k, tie_rel_tol)
    pairs, rows_m, res_m, full_size, evaluated = found.pairs, found.rows_m, found.res_m, found.full_size, found.evaluated
    n_pairs = len(pairs["tp"])
    group_all = pairs["lay_row"].astype(np.int64)

    # 1. every pair at its largest microbatch count (evaluated above)
    structural = (res_m["violations"] & ~MEMORY_BITS) != 0   # should be none: space == rules
    fit_m = (res_m["violations"] == 0) | (relax_memory & ~structural)
    obj_m = res_m["objective"]
    best_fit = _group_min(group_all[fit_m], obj_m[fit_m], n_groups)
    threshold = kth_best(best_fit, top_k) * (1.0 + tie_rel_tol)

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
    rows, res, group = _early_rules(rows, res, group, n_groups, relax_memory, top_k, tie_rel_tol)
    # 1c. the overlap twins skipped without costing (constraints.dominance) of every row still in
    # the running, at that row's batch: each is no faster than its row and, where its row fits,
    # fits, so no other twin can matter; costed, they rank as they would in the full table (ties
    # included)
    if found.shadow.any() and len(group):
        L, O, src = found.twins.lower_twins(group, rows["opt_row"], found.shadow)
        if len(L):
            key = np.stack([L, O, rows["m"][src]], axis=1)
            first = np.sort(np.unique(key, axis=0, return_index=True)[1])
            L, O, src = L[first], O[first], src[first]
            rows_t = at_batch(_pairs(found.lay, found.opt, L, O), rows["m"][src])
            res_t = evaluate(space, rows_t)
            evaluated += len(L)
            rows, res = _cat([rows, rows_t]), _cat([res, res_t])
            group = np.concatenate([group, L])
            rows, res, group = _early_rules(rows, res, group, n_groups, relax_memory, top_k, tie_rel_tol)

    # 2. rank, then per-layout pruning (each row as costed: its fewest offloaded layers)
    rows["offload_activations"] = res["offload_activations"]
    order = order_rows(rows, res["objective"])
    rows, res, group = _take(rows, order), _take(res, order), group[order]
    n = len(group)
    fit = (res["violations"] == 0) | relax_memory
    rank = np.arange(n)
    first_fit = np.full(n_groups, n, dtype=np.int64)
    np.minimum.at(first_fit, group[fit], rank[fit])
    keep = rank <= first_fit[group]
    # a layout with no fitting row can give the solver no answer: its rows would only be rejected
    # by the memory constraints, and where few layouts fit (memory at the edge: DeepSeek-V3 on 128
    # H100 with 0.1 % HBM to spare, 2 of 17,495 layouts) the K-th threshold below prunes nothing,
    # so their 300,000 rows made a CP-SAT model that did not stop within its time limit (18 min)
    keep &= (first_fit[group] < n) | relax_memory
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
    keep &= res["objective"] <= kth_best(best_fit, top_k) * (1.0 + tie_rel_tol)
    rows, res, group = _take(rows, keep), _take(res, keep), group[keep]
    rows["group"] = group
    rows["recompute_layers"] = res["recompute_layers"]  # the plan each row was costed as
    stats = {"space_size": full_size, "layouts": n_groups, "pairs": n_pairs, "evaluated": evaluated,
             "table_rows": len(group), "structural_rejects": int(structural.sum()),
             "overlap_twins_skipped": int(found.shadow.sum()),
             "build_s": time.perf_counter() - t0}
    if no_offload_bounds is not None:
        stats["layouts_bounded_out"] = bounded_out
    return Table(space=space, rows=rows, res=res, stats=stats, no_offload=found.no_offload)


OFFLOAD_COLUMNS = ("offload_weights", "offload_activations", "offload_optimizer")


def _pairs(lay: dict[str, np.ndarray], opt: dict[str, np.ndarray], L: np.ndarray, O: np.ndarray) -> dict[str, np.ndarray]:
    """`take_pairs` with the option row kept too (`opt_row`): the overlap twins are found by it."""
    rows = take_pairs(lay, opt, L, O)
    rows["opt_row"] = np.asarray(O, dtype=np.int64)
    return rows


@dataclass
class Found:
    """What `_largest_batch_pass` found: the pairs rules 2 and 3 can keep, their rows at the largest
    batch and results; and what `tabulate` needs to cost the overlap twins it skipped."""

    pairs: dict[str, np.ndarray]
    rows_m: dict[str, np.ndarray]
    res_m: dict[str, np.ndarray]
    full_size: int
    evaluated: int
    lay: dict[str, np.ndarray]
    opt: dict[str, np.ndarray]
    twins: Twins | None
    shadow: np.ndarray   # (layouts x options) pairs skipped by the overlap rules (constraints.dominance)
    no_offload: NoOffloadBounds | None = None


def _largest_batch_pass(space: Space, lay: dict[str, np.ndarray], relax_memory: bool, top_k: int | None,
                        tie_rel_tol: float):
    """Every (layout, options) pair that can be its layout's best row, evaluated once at its largest
    microbatch count; returns them as `Found` (pairs, their rows at m_max, results, full space
    size, rows evaluated, and the overlap twins skipped: `constraints.dominance`; with
    `relax_memory` none are).

    Offload dominance (exact under the model; not with `relax_memory`): a pair is dropped when a
    pair of the same layout and the same non-offload options with LESS offload fits at its
    largest batch. "Less" (u below v): u's weight and optimizer fractions are each <= v's, and u
    offloads no activations, or the same fraction on a layout whose pipeline ranks hold equal
    layers. Then u is no slower than v at every batch: the offload traffic per microbatch
    (fraction × the plan's largest parameter count, fraction × the activations of the fullest
    rank, which is every rank's when the loads are equal) and the offloaded optimizer step
    only grow with the fractions while the tier is no faster than HBM's element-wise
    bandwidth (checked), and v's time per token at any m is no better than at its own largest
    m (constraints.cost_table rule 1). So u's row beats every row of v and v is never its
    layout's choice. The pairs are visited in order of total offload, so whether some u below v
    fits is known from v's immediate lower neighbours (each fits, or is itself dropped) and a
    dropped pair is never evaluated.

    Lower bound (exact, same argument with u = v's no-offload twin, evaluated first whether it
    fits or not): v's objective at any batch is >= its twin's at the largest batch. A pair whose
    bound exceeds its layout's best fitting row so far (rule 2) or the K-th best layout so far
    (rule 3; both only fall as more rows are evaluated) would be pruned by those rules: it is
    not evaluated either."""
    opt = options(space)
    n_lay, n_opt = len(lay["tp"]), len(opt["recompute"])
    # the (layouts x options) tables below are read and written a set of option columns at a
    # time: stored column by column (Fortran order, as pair_mask's), ~30x faster on large spaces
    mask = pair_mask(space, lay, opt) if n_lay else np.zeros((0, n_opt), dtype=bool)
    counts = ((lay["m_max"] - lay["m_min"]) // lay["m_step"] + 1) if n_lay else np.zeros(0)
    full_size = int(counts @ mask.sum(axis=1)) if n_lay else 0
    system = space.system
    acc = system.accelerator
    steps = {c: np.rint(opt[c] * 2).astype(np.int64) for c in OFFLOAD_COLUMNS}  # fractions in halves
    level = steps["offload_weights"] + steps["offload_activations"] + steps["offload_optimizer"]
    no_offload = level == 0  # (before `level` may be flattened into one pass below)
    monotone = (system.offload is not None and system.offload.bandwidth_bytes_per_s
                <= acc.hbm_bandwidth_bytes_per_s * acc.efficiency.hbm_efficiency)
    offload_rules = not relax_memory and monotone and n_lay > 0 and bool((level[mask.any(axis=0)] > 0).any())
    if not offload_rules:
        level = np.zeros(n_opt, dtype=np.int64)  # one pass: no offload dominance, no lower bound
    # overlap twins (constraints.dominance): rules A, B are decided here, C per pass below
    twins = Twins(space, lay, opt, mask) if n_lay and not relax_memory else None
    shadow = twins.neutral_shadow() if twins else np.zeros_like(mask)

    # per option row: its lower neighbours (one fraction one half-step down, or the activation
    # fraction to 0) and its no-offload twin; -1: none. Rows are identified by their knob values.
    index = {tuple(opt[k][i] for k in OPTION_KEYS): i for i in range(n_opt)}

    def other(i: int, col: str | None, value: float = 0.0) -> int:
        key = {k: opt[k][i] for k in OPTION_KEYS}
        for c in (OFFLOAD_COLUMNS if col is None else (col,)):
            key[c] = value
        return index.get(tuple(key[k] for k in OPTION_KEYS), -1)

    if offload_rules:
        act_zero = np.asarray([other(i, "offload_activations") if steps["offload_activations"][i] else -1
                               for i in range(n_opt)], dtype=np.int64)
        down_w, down_o = (np.asarray([other(i, c, (steps[c][i] - 1) / 2) if steps[c][i] else -1
                                      for i in range(n_opt)], dtype=np.int64)
                          for c in ("offload_weights", "offload_optimizer"))
        twin_of = np.asarray([other(i, None) for i in range(n_opt)], dtype=np.int64)
    equal_ranks = space.model.layers % lay["pp"] == 0   # every rank holds layers/pp layers
    # layouts whose activation-offload rows are costed at their fewest fitting layers
    act_ranged = ((lay["pp"] == 1) & ("offload_activations" not in space.job.pins) & (space.model.layers >= 2)
                  if n_lay else np.zeros(0, dtype=bool))
    # Block-recompute pairs (`block_recompute_rows`) are costed at the fewest layers that fit, so
    # a pair that frees memory (no all-to-all overlap) may recompute fewer layers and be the
    # faster one: rule C does not order them. (They offload nothing; the offload rules still hold
    # above them: a fitting block pair u is no slower at its count than at every layer.)
    def block(cols: np.ndarray) -> np.ndarray:  # (layouts x cols): built for the columns asked only
        return block_recompute_rows({"recompute": opt["recompute"][cols][:, None], "pp": lay["pp"][None, :],
                                     **{c: opt[c][cols][:, None] for c in OFFLOAD_COLUMNS}}).T

    covered = np.zeros((n_lay, n_opt), dtype=bool, order="F")     # fits, or a pair below it fits
    fits_m = np.zeros((n_lay, n_opt), dtype=bool, order="F")      # evaluated and fits at its largest batch
    # objective (a lower bound) of the no-offload pairs, by no-offload option column (`zero_col`):
    # the offload passes read only those (2.7 GB for DeepSeek-V3 on 256 GB200 had it every column)
    # (at least one column: with offload pinned no pair has a no-offload twin, and -1 reads column 0)
    zero_col = np.maximum(np.cumsum(level == 0) - 1, 0)
    twin_obj = np.full((n_lay, max(1, int((level == 0).sum()))), np.inf, order="F")
    best_fit = np.full(n_lay, np.inf)
    parts: list[tuple[np.ndarray, np.ndarray, dict]] = []  # (layout rows, option rows, results)
    evaluated = 0
    a2a = opt["moe_a2a_overlap"] > 0
    live = (mask & ~shadow).any(axis=0) if n_lay else np.zeros(n_opt, dtype=bool)
    size = chunk_rows(space)
    # rule 3 before costing: a layout whose compute and least exposed communication alone are
    # slower than the K-th best layout so far is not costed (`layout_lower_bounds`); its pairs go
    # cheapest layout first, so that bar is low early
    lower = (layout_lower_bounds(space, lay, opt, live)
             if LAYOUT_BOUND and top_k is not None and not relax_memory and n_lay else None)
    cut = np.zeros(n_lay, dtype=bool)  # layouts with pairs left uncosted by that bound
    order = np.argsort(lower, kind="stable") if lower is not None else np.arange(n_lay)
    lower_in_order = lower[order] if lower is not None else None
    for lv in range(int(level.max()) + 1 if n_opt else 0):
        # the all-to-all overlap rows first: where one fits, its twin without is not costed (rule C)
        for with_a2a in (True, False):
            # (option rows shadowed for every layout, e.g. dp_comm_overlap off, are left out whole)
            cols = np.flatnonzero((level == lv) & (a2a == with_a2a) & live)
            if not len(cols):
                continue
            dominated = shadow[:, cols].copy()
            if offload_rules:
                offloads_act = steps["offload_activations"][cols] > 0
                for nb, same_act in ((act_zero[cols], False), (down_w[cols], True), (down_o[cols], True)):
                    has = nb >= 0
                    hit = covered[:, np.maximum(nb, 0)] & has[None, :]
                    if same_act:  # u offloads the same activations as v: only where rank loads are equal,
                        # and not where each is costed at its fewest fitting layers (v may need fewer)
                        hit &= ~offloads_act[None, :] | (equal_ranks & ~act_ranged)[:, None]
                    dominated |= hit
                if lv > 0:  # the lower bound from the no-offload twin (rules 2 and 3)
                    bound = np.minimum(best_fit, kth_best(best_fit, top_k) * (1.0 + tie_rel_tol))
                    tw = twin_of[cols]
                    # compared once per twin column (many offload rows share one), then spread
                    twin_cols, spread = np.unique(zero_col[np.maximum(tw, 0)], return_inverse=True)
                    over = twin_obj[:, twin_cols] > bound[:, None]
                    dominated |= over[:, spread] & (tw >= 0)[None, :]
                covered[:, cols] |= dominated & ~shadow[:, cols]
            if twins is not None and not with_a2a:
                # rule C: the twin with the overlap fits, so this pair fits too (less memory) and is
                # no faster; its objective bounds this one's from below for the offload passes
                skip = twins.dominated_by_twin("moe_a2a_overlap", fits_m, cols) & ~dominated & ~block(cols)
                if skip.any():
                    up = np.maximum(twins.up["moe_a2a_overlap"][cols], 0)
                    shadow[:, cols] |= skip
                    covered[:, cols] |= skip
                    if lv == 0:  # (a skipped pair that offloads is no pair's no-offload twin)
                        here, there = zero_col[cols], zero_col[up]
                        twin_obj[:, here] = np.where(skip, twin_obj[:, there], twin_obj[:, here])
                    dominated |= skip
            # the pairs by layout, layouts in `order` (cheapest compute first where the bound is on):
            # `pos` is each pair's layout's place in it, ascending
            pos, ci = np.nonzero((mask[:, cols] & ~dominated)[order])
            oi = cols[ci]
            start, step = 0, min(FIRST_BLOCK_ROWS, BLOCK_CHUNKS * size)
            while start < len(pos):
                if lower is not None:  # (the bar only falls as pairs are costed)
                    bar = kth_best(best_fit, top_k) * (1.0 + tie_rel_tol)
                    end = int(np.searchsorted(pos, np.searchsorted(lower_in_order, bar, side="right")))
                    if end < len(pos):
                        cut[order[pos[end:]]] = True
                        pos, oi = pos[:end], oi[:end]
                bl, bo = order[pos[start:start + step]], oi[start:start + step]
                start, step = start + len(bl), min(2 * step, BLOCK_CHUNKS * size)
                if not len(bl):
                    break

                def at_largest_batch(lo: int, li=bl, oi=bo) -> dict[str, np.ndarray]:
                    part = _pairs(lay, opt, li[lo:lo + size], oi[lo:lo + size])  # columns built chunk by chunk
                    return evaluate(space, at_batch(part, part["m_max"]))

                res_m = _cat(map_in_order(at_largest_batch, range(0, len(bl), size)))
                evaluated += len(bl)
                fits = res_m["violations"] == 0
                covered[bl, bo] = fits
                fits_m[bl, bo] = fits
                if lv == 0:
                    twin_obj[bl, zero_col[bo]] = res_m["objective"]
                np.minimum.at(best_fit, bl[fits], res_m["objective"][fits])
                parts.append((bl, bo, res_m))
    # Only pairs that rules 2 and 3 can keep are returned (and rebuilt as columns): a pair whose row
    # at its largest batch is slower than its layout's best fitting row or the K-th layout is
    # neither kept nor bisected by `tabulate` (smaller batches are slower per token, and the rows
    # found later only lower both bounds). On spaces where most pairs need offload this keeps
    # millions of evaluated pairs out of memory.
    threshold = kth_best(best_fit, top_k) * (1.0 + tie_rel_tol)
    if parts:
        li, oi = np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
        res_m = _cat([p[2] for p in parts])
    else:
        li, oi = np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        res_m = evaluate(space, at_batch(_pairs(lay, opt, li, oi), np.zeros(0)))
    kept = res_m["objective"] <= np.minimum(best_fit[li], threshold)
    if not relax_memory:
        # a layout none of whose pairs fits at its largest batch gets no fitting row in `tabulate`
        # unless a smaller batch may fit (its bisection, step 1b; the overlap twins need as much
        # memory as their rows): its pairs are not kept (where nothing fits, all of them were)
        has_fit = _group_any(li, res_m["violations"] == 0, n_lay)
        bisectable = (lay["pp"] > 1) & (lay["m_step"] == 1) & (lay["m_min"] == 1) & (lay["m_max"] > 1)
        kept &= (has_fit | bisectable)[li]
    keep = np.flatnonzero(kept)
    keep = keep[np.argsort(li[keep] * n_opt + oi[keep], kind="stable")]  # back to the order of `cross`
    pairs = _pairs(lay, opt, li[keep], oi[keep])
    # every no-offload pair was costed above, skipped as a twin no faster than a costed one, or
    # left with its layout by the layout bound (no twin bound prunes a pass's first level): what a
    # search without offload can start from
    bounds = None
    if not relax_memory and n_lay and no_offload.any():
        mine, fits = no_offload[oi], res_m["violations"] == 0
        lower_no_offload = _group_min(li[mine], res_m["objective"][mine], n_lay)
        if lower is not None:  # a layout the layout bound left partly uncosted: that bound, below all its rows
            lower_no_offload = np.where(cut, np.minimum(lower_no_offload, lower), lower_no_offload)
        bounds = NoOffloadBounds({k: lay[k] for k in LAYOUT_ID_KEYS}, lower=lower_no_offload,
                                 best_fit=_group_min(li[mine & fits], res_m["objective"][mine & fits], n_lay),
                                 option_ids=option_ids(opt, np.flatnonzero(no_offload)))
    found = Found(pairs, at_batch(pairs, pairs["m_max"]), _take(res_m, keep), full_size, evaluated,
                  lay, opt, twins, shadow, bounds)
    return found


# Whether `_largest_batch_pass` skips layouts by their lower bound (tests turn it off to
# check that the table is the same without). Between two looks at that bar it costs a block of
# pairs: FIRST_BLOCK_ROWS, doubling up to BLOCK_CHUNKS chunks (so a small space gets a bar
# early and a large one keeps the threads busy; fixed sizes: the rows costed do not depend on
# the thread count).
LAYOUT_BOUND = True
FIRST_BLOCK_ROWS = 4096
BLOCK_CHUNKS = 8


def layout_lower_bounds(space: Space, lay: dict[str, np.ndarray], opt: dict[str, np.ndarray],
                        live: np.ndarray) -> np.ndarray:
    """Per layout, a lower bound on the objective of each of its (layout, options) pairs at every
    batch the table costs: m times one microbatch on one pipeline rank, its layers' forward and
    backward compute, LM head and exposed TP, CP and expert-parallel communication, without
    recompute. Why it holds (`planner.analytical.time`): the step is at least m times the slowest
    rank's microbatch, which recompute, selective recompute and offload only lengthen, and every
    other step term is non-negative. Of the options only sequence parallelism changes a layer's
    compute and its TP collectives, so there is one probe per value and the bound is the smaller.
    Each probe runs the overlaps that expose least: TP communication overlap where sequence
    parallelism is on (it exposes 0.3 of a collective against 1.0 and 0.5 without:
    TP_EXPOSED_WITH_OVERLAP), and the expert all-to-all overlap (`a2a_overlap_exposed_s`: its
    forward plus backward exposure is never above the plain dispatch and combine, and a
    recomputed layer reruns only its forward's, which the overlap shortens), on layouts where
    it cannot run too, where the bound is then only looser. Per token the bound does not grow
    with m, so it holds at the smaller batches the table bisects too."""
    n = len(lay["tp"])
    out = np.full(n, np.inf)
    sp = opt["sequence_parallel"]
    for value in np.unique(sp[live]):
        col = int(np.flatnonzero(live & (sp == value))[0])
        rows = at_batch(_pairs(lay, opt, np.arange(n), np.full(n, col)), lay["m_max"])
        rows.update({k: np.zeros(n) for k in ("recompute", "recompute_modules") + OFFLOAD_COLUMNS})
        rows["tp_comm_overlap"] = np.full(n, float(value))
        rows["moe_a2a_overlap"] = np.full(n, float(space.model.moe is not None))
        res = _estimate(space, rows, keep=BOUND_PARTS + ("violations",))
        out = np.minimum(out, objective(space, rows, sum(res[k] for k in BOUND_PARTS)))
    return out * (1.0 - 1e-9)  # (the rows' own sums round otherwise)


# the step-time parts of a probe row without recompute that bound every row of its layout
BOUND_PARTS = ("forward_s", "backward_s", "tp_comm_exposed_s", "cp_ep_comm_exposed_s")


def _early_rules(rows, res, group, n_groups: int, relax_memory: bool, top_k: int | None, tie_rel_tol: float):
    """Structural rejects out, and rules 2 and 3 early, by objective value alone (ties kept), so
    that only few rows get sorted. Rows of a layout with no fitting row go too (rule 2's last
    clause): the overlap twins costed after this (step 1c) need as much memory as their rows, or
    exist only where their own twin fits, so they cannot give such a layout a fit."""
    keep = (res["violations"] & ~MEMORY_BITS) == 0
    fit0 = (res["violations"] == 0) | relax_memory
    bf = _group_min(group[fit0 & keep], res["objective"][fit0 & keep], n_groups)
    keep &= res["objective"] <= np.minimum(bf[group], kth_best(bf, top_k) * (1.0 + tie_rel_tol))
    if not relax_memory:
        keep &= _group_any(group, fit0 & keep, n_groups)[group]
    return _take(rows, keep), _take(res, keep), group[keep]


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


__all__ = ["Table", "tabulate", "evaluate", "objective", "order_rows", "integer_costs",
           "plan_arrays", "MEMORY_BITS"]
