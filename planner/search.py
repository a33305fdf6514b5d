"""The search: space -> exact cost table -> CP-SAT -> top-K distinct layouts -> re-scored Plans.

Public API
  plan(model, system, job=None, top_k=5) -> SearchResult     ranked (Plan, Estimate), stats
  best_plan(model, system, job=None) -> Plan | None          the best plan, no evidence gate (planner.recommend)
  check(model, system, job=None) -> CheckResult              yes + best plan, or no + why (numbers)
  count(model, system, job=None) -> int                      number of valid mappings

Objective: time per token (step_time / (global_batch·seq)) when the batch is free
(job.global_batch is None: any batch up to job.max_global_batch that is a multiple of
micro_batch·dp), step time when it is fixed. "Top K" means the K best DISTINCT layouts
(tp, pp, dp, cp, ep, vpp, micro_batch), each with its best batch and memory/overlap options. Near-equal layouts (within
0.1 %) are re-ranked simplest first by planner.ties, hooked in `plan` after the solver.
See constraints/space.py, cost_table.py, encode.py and solve.py for the pieces.
"""
from __future__ import annotations

import itertools
import math
import numbers
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from constraints.no_offload import NoOffloadBounds
from constraints.solve import explain, solve_top_k, stopping_solves
from constraints.stages import best_stages
from constraints.space import (LAYOUT_CLASS_SP, N_LAYOUT_CLASSES, OPTION_KEYS, at_batch, build_space, layout_class,
                               layout_exists_at_some_batch, megatron_pin_conflicts,
                               layouts, options,
                               options_allowed, pair_mask, take_pairs)
from constraints.cost_table import (MEMORY_BITS, chunk_rows, OFFLOAD_COLUMNS, Table, bisect_counts,
                                   offloaded_layer_range, plan_arrays, tabulate)
from hardware.errors import SpecError
from hardware.spec import GIB, MemoryTier, SystemSpec
from planner.analytical import Estimate, estimate
from planner.analytical.estimate import check_api_inputs, rule_violations
from planner.analytical.memory import memory_breakdown
from planner.analytical.offload import fraction_of_layers
from planner.megatron import not_expressible
from planner.model import ModelSpec
from planner.pipeline_layout import plan_layout
from planner.plan import MAX_TIME_LIMIT_S, MAX_TOP_K, JobSpec, Plan
from planner.threads import map_in_order
from planner.ties import TIE_REL_TOL, rank_with_ties

HYPOTHETICAL_OFFLOAD_GIB = 4096.0
HYPOTHETICAL_OFFLOAD_GB_S = 100.0
MAX_GPU_FACTOR = 64
# The fewest GPUs that fit are looked for between the last power-of-two multiple of -g that does
# not fit and the first that does, in whole nodes (at most this many counts tried; coarser steps
# beyond, said in the answer)
MAX_GPU_COUNTS_TRIED = 32
# The per-stage CP-SAT model refines the first STAGE_REFINE_TOP reported plans (each is one or
# two solves of 0.01-2.5 s; all 50 of a top-50 would break the 10 s budget).
STAGE_REFINE_TOP = 5


@dataclass
class Ranked:
    plan: Plan
    estimate: Estimate
    objective: float          # seconds per token (free batch) or per step (fixed batch)
    stages: dict | None = None  # what the per-stage CP-SAT model decided (constraints.stages)


@dataclass
class SearchResult:
    ranked: list[Ranked]
    objective: str            # "time per token" | "step time"
    stats: dict = field(default_factory=dict)
    # what this search tells a search of the same job without offload (constraints.no_offload)
    no_offload: NoOffloadBounds | None = None

    @property
    def best(self) -> Ranked | None:
        return self.ranked[0] if self.ranked else None


@dataclass
class CheckResult:
    feasible: bool
    best: Ranked | None
    reasons: list[str] = field(default_factory=list)   # plain words with numbers when infeasible
    binding_rules: list[str] = field(default_factory=list)
    numbers: dict = field(default_factory=dict)


def _objective(est: Estimate, seq: int, free: bool) -> float:
    return est.step_time_s / (est.plan.global_batch * seq) if free else est.step_time_s


def _row_plan(table: Table, i: int) -> Plan:
    sub = {k: v[i:i + 1] for k, v in table.rows.items()}
    return plan_arrays(table.space, sub).row(0)


def plan(model: ModelSpec, system: SystemSpec, job: JobSpec | None = None, top_k: int = 5,
         time_limit_s: float = 30.0, restrict: dict[str, Callable[[float], bool]] | None = None,
         no_offload_bounds: NoOffloadBounds | None = None) -> SearchResult:
    """The K best distinct layouts under the exact model, best first. `restrict` keeps, per knob,
    only the domain values its predicate accepts (a plan family: planner.recommend); a knob left
    with no value leaves no plan. `no_offload_bounds`: for a job without offload, the
    `SearchResult.no_offload` of a search of the same job with it (the same answer, sooner)."""
    check_api_inputs(model, system, job)
    if not isinstance(top_k, numbers.Integral) or isinstance(top_k, bool) or not 1 <= top_k <= MAX_TOP_K:
        raise SpecError(f"top_k: must be an integer from 1 to {MAX_TOP_K:,}, got {top_k!r}")
    top_k = int(top_k)
    if isinstance(time_limit_s, bool) or not isinstance(time_limit_s, numbers.Real) \
            or not 0 < time_limit_s <= MAX_TIME_LIMIT_S:  # NaN fails too; a string reached OR-Tools' TypeError
        raise SpecError(f"time_limit_s: must be a number of seconds > 0 and at most {MAX_TIME_LIMIT_S:,}, "
                        f"got {time_limit_s!r}")
    t0 = time.perf_counter()
    job = job or JobSpec()
    space = build_space(model, system, job)
    objective = "time per token" if space.free_batch else "step time"
    unknown = sorted(set(restrict or {}) - set(space.domains), key=str)
    if unknown:
        raise SpecError(f"restrict: unknown knob {unknown[0]!r}; the knobs: {', '.join(sorted(space.domains))}")
    for knob, keep in (restrict or {}).items():
        space.domains[knob] = tuple(v for v in space.domains[knob] if keep(v))
    if not all(space.domains.values()):
        return SearchResult(ranked=[], objective=objective,
                            stats={"total_s": time.perf_counter() - t0, "empty_domain": True})
    # ties: every layout within TIE_REL_TOL of the K-th best is tabulated (and no layout beyond
    # that bound can be among the first K after re-ranking: the K-th pick's window starts at or
    # below the K-th objective), so the solver fetches exactly the layouts in the table, and
    # planner.ties re-ranks them (the simpler of near-equal plans first)
    # the best plan must not depend on how many are asked for: the per-stage CP-SAT refines the
    # first STAGE_REFINE_TOP picks and may lift a lower one above the first, so at least that
    # many are searched and refined, and the first top_k returned (`--top 1` and `planner
    # megatron`'s own search give the plan `planner plan` prints first)
    asked, top_k = top_k, max(top_k, STAGE_REFINE_TOP)
    table = tabulate(space, top_k=top_k, tie_rel_tol=TIE_REL_TOL,
                     no_offload_bounds=no_offload_bounds if restrict is None else None)
    sols = solve_top_k(table, table_layouts(table), time_limit_s)
    objectives = [float(table.res["objective"][i]) for i in sols.indices]
    t1 = time.perf_counter()
    plans = [_row_plan(table, i) for i in sols.indices]
    order = rank_with_ties(objectives, plans, top_k)
    ranked, mismatches, dropped = [], 0, 0
    for i, p in zip([sols.indices[j] for j in order], [plans[j] for j in order]):
        if job.framework == "megatron" and not_expressible(p, model, job):
            dropped += 1  # cannot happen: the space encodes the same rules
            continue
        est = estimate(model, system, p, job)
        obj = _objective(est, model.seq_length, space.free_batch)
        if not math.isclose(obj, float(table.res["objective"][i]), rel_tol=1e-9):
            mismatches += 1
        ranked.append(Ranked(plan=p, estimate=est, objective=obj))
    t_stages = time.perf_counter()
    ranked = refine_stages(model, system, job, ranked, space.free_batch, top_k)[:asked]
    stats = dict(table.stats)
    if not ranked:  # nothing fits at the default stage splits: an uneven one may (UNEVEN_MARGIN)
        near = memory_floor(space, offload_min=False, pipelined=UNEVEN_CANDIDATES).near_pipelined
        ranked = uneven_split_plans(model, system, job, space, near)[:asked]
        if ranked:
            stats["uneven_split_note"] = uneven_split_note(len(near))
    stats.update(sols.stats)
    stats["stages_s"] = time.perf_counter() - t_stages
    stats.update({"status": sols.status, "rescore_s": time.perf_counter() - t1,
                  "rescore_mismatches": mismatches, "not_expressible_dropped": dropped,
                  "total_s": time.perf_counter() - t0, "free_batch": space.free_batch})
    return SearchResult(ranked=ranked, objective=objective, stats=stats, no_offload=table.no_offload)


def table_layouts(table: Table) -> int:
    """How many distinct layouts of the table have a fitting row (what the solver can return)."""
    return len(np.unique(table.rows["group"][table.fits])) if len(table) else 0


def refine_stages(model: ModelSpec, system: SystemSpec, job: JobSpec, ranked: list[Ranked],
                  free: bool, top_k: int) -> list[Ranked]:
    """Per-stage choices of the first STAGE_REFINE_TOP reported pipelined plans, by CP-SAT (constraints.stages): the
    layers per virtual stage and the block-recompute count under per-rank memory. The solver's
    answer is re-scored by the exact model and kept when it is feasible, expressible and no
    slower; then the list is re-ranked (ties: planner.ties)."""
    out = []
    # the first few plans only (search-speed budget), their solves side by side (planner.threads)
    head = ranked[:STAGE_REFINE_TOP]
    solved = map_in_order(lambda r: best_stages(model, system, job, r.plan), head, stopping=stopping_solves)
    for r, (cand, sol) in zip(head, solved):
        if sol is None:  # no per-stage problem (ZeRO-3, offload): ZeRO-3's block count alone
            out.append(fewest_uniform_recompute(model, system, job, r, free) or r)
            continue
        info = {"variables": sol.variables, "constraints": sol.constraints, "status": sol.status,
                "proven_optimal": sol.proven_optimal, "solve_s": sol.wall_s,
                "stage_layers": list(sol.stage_layers) if sol.stage_layers else None,
                "recompute_layers_per_stage": sol.recompute_layers, "kept": False,
                **({"window_layers": sol.window} if sol.window is not None else {})}
        best = Ranked(plan=r.plan, estimate=r.estimate, objective=r.objective, stages=info)
        valid = _valid_ranked(model, system, job, cand, free) if cand is not None else None
        if valid is not None and valid.objective < r.objective * (1 - 1e-12):
            info["kept"] = True
            best = Ranked(plan=cand, estimate=valid.estimate, objective=valid.objective, stages=info)
        out.append(best)
    out += ranked[STAGE_REFINE_TOP:]
    out.sort(key=lambda r: r.objective)  # stable: equal objectives keep the search's order
    return [out[i] for i in rank_with_ties([r.objective for r in out], [r.plan for r in out], top_k)]


def _valid_ranked(model: ModelSpec, system: SystemSpec, job: JobSpec, p: Plan, free: bool) -> Ranked | None:
    """`p` re-scored by the exact model, or None where it does not fit or (Megatron) cannot be
    launched: what a plan made outside the search (per-stage splits) must pass to be returned."""
    est = estimate(model, system, p, job)
    if not est.feasible or (job.framework == "megatron" and not_expressible(p, model, job)):
        return None
    return Ranked(plan=p, estimate=est, objective=_objective(est, model.seq_length, free))


def fewest_uniform_recompute(model: ModelSpec, system: SystemSpec, job: JobSpec, r: Ranked,
                             free: bool) -> Ranked | None:
    """A pipelined ZeRO-3 plan under full recompute, which the per-stage problem does not pose
    (memory is not linear in the layer counts there), at the fewest layers per virtual stage that
    fit (Megatron's --recompute-num-layers, the same count in every chunk), by bisection with the
    exact model: memory never rises and time never falls as a layer more is recomputed. None
    where every layer must be, or the plan names its own count."""
    p = r.plan
    if p.pp == 1 or p.recompute != "full" or p.recompute_num_layers is not None or p.stage_recompute_layers \
            or p.uses_offload:  # with offload more recompute can be faster (cost_table.block_recompute_rows)
        return None
    per_chunk = max(plan_layout(p, model.layers))

    def at(k: int) -> Ranked:
        q = p.model_copy(update={"recompute_num_layers": k * p.vpp})
        est = estimate(model, system, q, job)
        return Ranked(plan=q, estimate=est, objective=_objective(est, model.seq_length, free))

    lo, hi, best = 0, per_chunk, None  # lo: does not fit (k 0 is no recompute); hi: fits (every layer)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        trial = at(mid)
        if trial.estimate.feasible:
            hi, best = mid, trial
        else:
            lo = mid
    if best is None or best.objective >= r.objective * (1 - 1e-12) \
            or (job.framework == "megatron" and not_expressible(best.plan, model, job)):
        return None
    return best


def best_plan(model: ModelSpec, system: SystemSpec, job: JobSpec | None = None) -> Plan | None:
    result = plan(model, system, job, top_k=1)
    return result.best.plan if result.best else None


# ---------------------------------------------------------------------------------------------
# count
# ---------------------------------------------------------------------------------------------

def count(model: ModelSpec, system: SystemSpec, job: JobSpec | None = None) -> int:
    """Number of valid MAPPINGS, counted combinatorially (nothing is evaluated).

    A mapping is one full assignment of the knobs (tp, pp, dp, cp, ep, vpp, micro_batch,
    global_batch, recompute, sequence_parallel, tp_comm_overlap, dp_comm_overlap, zero_stage,
    offload fractions of weights / activations / optimizer) from the domains of
    `constraints.space` that satisfies every structural rule: divisibility (heads, query groups,
    hidden/ffn by tp; pp·vpp at most the layers, which need not divide evenly; experts by ep), GPU
    count, batch (global batch a multiple
    of micro_batch·dp, fixed or up to the cap; interleaving needs >= pp microbatches, a free batch
    a multiple of pp),
    compatibility (SP needs tp > 1 and the sequence split over tp·cp, TP overlap needs SP) and, for framework 'megatron',
    expressibility in Megatron-LM. MEMORY IS IGNORED (no plan is evaluated): this is the size of
    the space the search prunes, i.e. exactly the rows the brute-force oracle enumerates.

    Counting: sum over layouts (tp, pp, dp, cp, ep, vpp, micro_batch) of (number of legal
    microbatch counts, a closed form per layout) × (number of option combinations compatible
    with the layout's class: tp > 1 or not, pp = 1 or not).
    """
    check_api_inputs(model, system, job)
    job = job or JobSpec()
    space = build_space(model, system, job)
    lay = layouts(space)
    if not len(lay["tp"]):
        return 0
    opt = options(space)
    n_m = ((lay["m_max"] - lay["m_min"]) // lay["m_step"] + 1).astype(np.int64)
    per_class = [int(options_allowed(space, opt, c).sum()) for c in range(N_LAYOUT_CLASSES)]
    return int(np.sum(n_m * np.asarray(per_class, dtype=np.int64)[layout_class(lay, model.seq_length)]))


# ---------------------------------------------------------------------------------------------
# check
# ---------------------------------------------------------------------------------------------

def _gib(x: float) -> str:
    return f"{x / GIB:.1f} GiB"


def _gib_ceil(x: float) -> float:
    """Bytes as GiB rounded up to 0.1: that much always suffices (rounded to nearest, 110.42 read
    110.4, and a GPU of 110.4 GiB did not fit)."""
    return math.ceil(x / GIB * 10 - 1e-9) / 10


def _gib_up(x: float) -> str:
    """A need, rounded up to 0.1 GiB (_gib_ceil)."""
    return f"{_gib_ceil(x):.1f} GiB"


def _gib_down(x: float) -> str:
    """What is available, rounded down to 0.1 GiB (beside a need rounded up, never the same figure
    for a need above it)."""
    return f"{math.floor(x / GIB * 10 + 1e-9) / 10:.1f} GiB"


# Knobs that change no byte of memory (time only): the memory floor evaluates one option row per
# combination of the others (tests/test_check_bound.py checks that the model agrees).
MEMORY_NEUTRAL_KNOBS = ("tp_comm_overlap", "dp_comm_overlap")
# The floor and the cost table price a pipelined layout at Megatron's default stage split. An
# uneven split (fewer layers on the early ranks, which hold more microbatches in flight) can fit
# where that one does not: DeepSeek-V3 on 160 H100, batch 256, tp8 pp5 cp4 ep4 takes 79.8 GiB at
# [12,13,12,12,12] and 75.5 GiB at [14,12,12,12,11] (77.6 usable). So where nothing fits, the
# per-stage model (constraints.stages) is asked for a split that fits on the pipelined plans
# nearest to fitting: the UNEVEN_CANDIDATES smallest footprints of distinct layouts within
# UNEVEN_MARGIN of usable HBM (not every layout: each is a CP-SAT solve).
UNEVEN_MARGIN = 0.15
UNEVEN_CANDIDATES = 4


@dataclass
class Floor:
    """Memory over every otherwise-valid plan, each at its smallest legal batch (per-GPU HBM and
    offload bytes never fall as the batch grows, so a plan fits at some batch iff it fits there)."""

    hbm_min_bytes: float          # smallest HBM over all plans (inf: none)
    plan: Plan | None             # smallest HBM among plans whose offload fits the tier (else overall)
    hbm_bytes: float              # that plan's HBM
    usable_hbm_bytes: float
    offload_plan: Plan | None     # among plans that fit HBM, the one offloading the fewest bytes
    offload_min_bytes: float      # its offload bytes (inf: no plan fits HBM)
    # pipelined plans (distinct layouts) over HBM by at most UNEVEN_MARGIN at their default stage
    # split, smallest first, whose offload fits the tier (only with memory_floor's `pipelined`)
    near_pipelined: tuple[Plan, ...] = ()

    @property
    def fits(self) -> bool:
        """Exact: some plan fits HBM and the offload tier."""
        return self.plan is not None and self.hbm_bytes <= self.usable_hbm_bytes


def memory_floor(space, offload_min: bool = True, pipelined: int = 0) -> Floor:
    """Floor of `space` from the exact memory model only (no step time, no search), over the
    layouts × memory-relevant options, in bounded chunks. `offload_min=False` leaves
    `offload_plan`/`offload_min_bytes` out (then much of the offload grid need not be costed).

    Offload corners (exact): per-GPU HBM never rises with an offload fraction (what is offloaded
    leaves HBM, two layers' worth at most stay) and offloaded bytes never fall. So within a group
    of rows that differ only in offload fractions, the row offloading the most (componentwise;
    the "corner") has the group's smallest HBM. The corners are costed first; the other rows of
    a group are costed only where they can matter: the corner's offload exceeds the tier (a row
    offloading less may fit the tier: the smallest footprint among rows that fit it), or, for
    `offload_min`, the corner fits HBM (a row offloading less may also fit HBM). `pipelined`: also
    keep that many pipelined plans nearest to fitting (`Floor.near_pipelined`; UNEVEN_MARGIN)."""
    cap = space.system.accelerator.hbm_capacity_bytes - space.job.hbm_reserve_gib * GIB
    none = Floor(math.inf, None, math.inf, cap, None, math.inf)
    lay = layouts(space)
    opt = options(space)
    if not len(lay["tp"]) or not len(opt["recompute"]):
        return none
    relevant = np.stack([opt[k] for k in OPTION_KEYS if k not in MEMORY_NEUTRAL_KNOBS], axis=1)
    first = np.sort(np.unique(relevant, axis=0, return_index=True)[1])
    opt = {k: v[first] for k, v in opt.items()}
    mask = pair_mask(space, lay, opt)
    if not mask.any():
        return none
    off_cap = space.system.offload.capacity_bytes if space.system.offload else 0.0
    best = {"hbm": (math.inf, None), "within": (math.inf, None), "offload": (math.inf, None)}
    near: dict[int, tuple[float, tuple]] = {}  # layout row -> (HBM, pair) of its nearest pipelined pair

    def pair_rows(L: np.ndarray, O: np.ndarray, act: np.ndarray | None) -> dict[str, np.ndarray]:
        rows = at_batch(take_pairs(lay, opt, L, O), lay["m_min"][L])
        if act is not None:  # a whole-layer activation-offload count of the pair's range
            rows["offload_activations"] = act
        return rows

    def footprint(L: np.ndarray, O: np.ndarray, act: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(HBM, offload bytes) of the pairs at their smallest batch (inf: a structural rule broken)."""
        size = chunk_rows(space)

        def chunk(lo: int) -> tuple[np.ndarray, np.ndarray]:
            part = slice(lo, lo + size)
            P = plan_arrays(space, pair_rows(L[part], O[part], None if act is None else act[part]))
            mem = memory_breakdown(space.model, space.system, space.job, P)
            structural = (rule_violations(space.model, space.system, space.job, P, mem) & ~MEMORY_BITS) != 0
            return np.where(structural, np.inf, mem["hbm_bytes"]), np.where(structural, np.inf, mem["offload_bytes"])

        parts = map_in_order(chunk, range(0, len(L), size))  # on several threads, as the cost table's chunks
        return (np.concatenate([np.zeros(0), *(h for h, _ in parts)]),
                np.concatenate([np.zeros(0), *(o for _, o in parts)]))

    def cost(L: np.ndarray, O: np.ndarray, act: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """`footprint`, folded into `best`."""
        hbm, off = footprint(L, O, act)
        candidates = {"hbm": hbm, "within": np.where(off <= off_cap * (1 + 1e-12), hbm, np.inf),
                      "offload": np.where(hbm <= cap, off, np.inf)}
        for key, values in candidates.items():
            if len(values):
                i = int(np.argmin(values))
                if values[i] < best[key][0]:
                    best[key] = (float(values[i]), (int(L[i]), int(O[i]), None if act is None else float(act[i])))
        if pipelined:
            close = np.flatnonzero((lay["pp"][L] > 1) & (hbm > cap) & (hbm <= cap * (1 + UNEVEN_MARGIN))
                                   & (off <= off_cap * (1 + 1e-12)))
            close = close[np.argsort(hbm[close], kind="stable")]
            first = np.sort(np.unique(L[close], return_index=True)[1])[:pipelined]  # each layout's smallest
            for i in close[first]:
                if int(L[i]) not in near or hbm[i] < near[int(L[i])][0]:
                    near[int(L[i])] = (float(hbm[i]), (int(L[i]), int(O[i]), None))
        return hbm, off

    steps = np.stack([np.rint(opt[c] * 2) for c in OFFLOAD_COLUMNS], axis=1)  # fractions in halves
    if not steps.any():
        cost(*np.nonzero(mask))
    else:
        # groups: option rows equal but for the offload fractions
        others = np.stack([opt[k] for k in OPTION_KEYS if k not in MEMORY_NEUTRAL_KNOBS + OFFLOAD_COLUMNS], axis=1)
        group_of = np.unique(others, axis=0, return_inverse=True)[1].ravel()
        corner_L, corner_O, rest = [], [], []
        for g in range(int(group_of.max()) + 1):
            cols = np.flatnonzero(group_of == g)
            sub = mask[:, cols]
            score = np.where(sub, steps[cols].sum(axis=1)[None, :], -1.0)
            pick = np.argmax(score, axis=1)
            has = sub.any(axis=1)
            # the pick is a corner only if it offloads at least as much of everything as every
            # allowed row of its group; elsewhere the whole group is costed
            is_corner = has.copy()
            for j in range(3):
                top = np.max(np.where(sub, steps[cols, j][None, :], -1.0), axis=1)
                is_corner &= steps[cols[pick], j] >= top
            corner_L.append(np.flatnonzero(is_corner))
            corner_O.append(cols[pick[is_corner]])
            rest.append((cols, sub, is_corner, has))
        cl, co = np.concatenate(corner_L), np.concatenate(corner_O)
        hbm_c, off_c = cost(cl, co)
        needs = off_c > off_cap * (1 + 1e-12)
        if offload_min:
            needs |= hbm_c <= cap
        need_pair = np.zeros(mask.shape, dtype=bool)   # (layout, corner option) whose group is needed
        need_pair[cl[needs], co[needs]] = True
        more_L, more_O = [], []
        for cols, sub, is_corner, has in rest:
            want = (need_pair[:, cols].any(axis=1) | (has & ~is_corner))[:, None] & sub
            li, ci = np.nonzero(want)
            more_L.append(li)
            more_O.append(cols[ci])
        ml, mo = np.concatenate(more_L), np.concatenate(more_O)
        if len(ml):
            cost(ml, mo)
        _offloaded_layer_counts(space, lay, opt, mask, cap, off_cap, footprint, cost, offload_min)

    def plan_at(pair) -> Plan | None:
        if pair is None:
            return None
        li, oi = np.asarray([pair[0]]), np.asarray([pair[1]])
        act = None if pair[2] is None else np.asarray([pair[2]])
        return plan_arrays(space, pair_rows(li, oi, act)).row(0)

    pick = best["within"] if best["within"][1] is not None else best["hbm"]
    offload = best["offload"] if offload_min else (math.inf, None)
    nearest = sorted(near.values(), key=lambda x: (x[0], x[1]))[:pipelined]
    return Floor(hbm_min_bytes=best["hbm"][0], plan=plan_at(pick[1]), hbm_bytes=pick[0], usable_hbm_bytes=cap,
                 offload_plan=plan_at(offload[1]), offload_min_bytes=offload[0],
                 near_pipelined=tuple(plan_at(pair) for _, pair in nearest))


def _split_words(floor: Floor) -> str:
    """How far `check`'s footprint holds for pipelined plans: at Megatron's default stage splits,
    and for the nearest ones (UNEVEN_MARGIN) at the splits the per-stage model tried."""
    n = len(floor.near_pipelined)
    if not n:
        return (f"; that is at Megatron's default pipeline splits, and no pipelined plan comes within "
                f"{UNEVEN_MARGIN:.0%} of fitting there")
    return (f"; that is at Megatron's default pipeline splits, and the per-stage model found no uneven split "
            f"that fits for the {n} pipelined layout{'s' if n != 1 else ''} within {UNEVEN_MARGIN:.0%} of fitting")


def uneven_split_note(tried: int) -> str:
    """What a plan found by `uneven_split_plans` is, in words (`plan` and `check` print it)."""
    return (f"fits only with an uneven pipeline split: no plan fits at Megatron's default stage splits, and the "
            f"per-stage model found splits that do for the {tried} pipelined layout{'s' if tried != 1 else ''} "
            f"nearest to fitting (within {UNEVEN_MARGIN:.0%} of usable HBM); other layouts were not split so, "
            f"a faster plan may exist")


def uneven_split_plans(model: ModelSpec, system: SystemSpec, job: JobSpec, space, candidates) -> list[Ranked]:
    """The candidates (pipelined plans that miss HBM at the default stage split) that fit with the
    per-stage model's split (constraints.stages.best_stages: layers per stage and block recompute
    under each rank's memory), each with the fastest setting of the memory-neutral overlaps the
    space allows (the floor keeps one per combination of the rest), fastest first."""
    out = []
    for candidate in candidates:
        split, _ = best_stages(model, system, job, candidate)
        if split is None:
            continue
        variants = (split.model_copy(update={k: bool(v) for k, v in zip(MEMORY_NEUTRAL_KNOBS, values)})
                    for values in itertools.product(*(space.domains[k] for k in MEMORY_NEUTRAL_KNOBS)))
        valid = [r for p in variants if (r := _valid_ranked(model, system, job, p, space.free_batch)) is not None]
        if valid:
            out.append(min(valid, key=lambda r: r.objective))  # the first of equal ones, as before
    out.sort(key=lambda r: r.objective)
    return out


def _offloaded_layer_counts(space, lay, opt, mask, cap: float, off_cap: float, footprint, cost,
                            offload_min: bool) -> None:
    """The floor over the activation-offload layer counts a row stands for beyond its grid
    fraction (constraints.cost_table.offloaded_layer_range: HBM never rises and host bytes never
    fall as a layer more is offloaded). Per pair, two counts can set a floor number: the most
    whose offload fits the tier (the smallest HBM among plans that fit it; whether anything fits),
    beyond the grid row itself only where that row's offload exceeds the tier, and, for
    `offload_min`, the fewest whose HBM fits (the fewest offloaded bytes among plans that fit HBM).
    Each is found by bisection and `cost`-ed."""
    L_all, O_all = np.nonzero(mask & (opt["offload_activations"] > 0)[None, :] & (lay["pp"] == 1)[:, None])
    if not len(L_all):
        return
    rows = at_batch(take_pairs(lay, opt, L_all, O_all), lay["m_min"][L_all])
    lo, hi = offloaded_layer_range(space, rows)
    ranged = np.flatnonzero(hi - lo > 1)
    if not len(ranged):
        return
    L, O, lo, hi = L_all[ranged], O_all[ranged], lo[ranged], hi[ranged]
    layers = space.model.layers

    def fits_hbm(i, n):
        return footprint(L[i], O[i], fraction_of_layers(n, layers))[0] <= cap

    def fits_tier(i, n):
        return footprint(L[i], O[i], fraction_of_layers(n, layers))[1] <= off_cap * (1 + 1e-12)

    hbm_hi, off_hi = footprint(L, O, fraction_of_layers(hi, layers))  # the grid rows, costed already
    h = np.flatnonzero(hbm_hi <= cap) if offload_min else np.zeros(0, dtype=np.int64)
    if len(h):  # some count fits HBM: the fewest that does
        n = bisect_counts(lo[h], hi[h], lambda i, m: fits_hbm(h[i], m))
        cost(L[h], O[h], fraction_of_layers(n, layers))
    over = np.flatnonzero(off_hi > off_cap * (1 + 1e-12))
    if not len(over):
        return
    _, off_lo = footprint(L[over], O[over], fraction_of_layers(lo[over] + 1, layers))
    s = over[off_lo <= off_cap * (1 + 1e-12)]
    if len(s):  # the tier takes fewer layers than the grid row's: the most it takes
        n = bisect_counts(hi[s] + 1, lo[s] + 1, lambda i, m: fits_tier(s[i], m))
        cost(L[s], O[s], fraction_of_layers(n, layers))


def _min_footprint(space) -> tuple[float, float, Plan | None, float]:
    """(HBM of the floor's plan, smallest HBM overall, that plan, usable HBM): see `memory_floor`."""
    f = memory_floor(space)
    return f.hbm_bytes, f.hbm_min_bytes, f.plan, f.usable_hbm_bytes


def _fitting_example(model: ModelSpec, system: SystemSpec, job: JobSpec) -> Ranked | None:
    """A plan that fits (the smallest HBM footprint), decided by the memory floor (exact at the
    default stage splits: some plan fits there iff this one does), else the nearest pipelined plan
    with the uneven split the per-stage model finds; None when neither fits. The what-ifs of
    `check` ask "would it fit", for which a search for the fastest plan is not needed."""
    try:
        space = build_space(model, system, job)
    except SpecError:
        # the job's pins are not legal on this box, a what-if GPU count (--tp 2 on 5 GPUs): no plan
        # of this job fits it. Raised, it had ended `check` and `plan` on the user's own box with
        # that pin's input error (Qwen3-32B on 4 A100, --tp 2: "pin tp: 2 ... allowed: 1", exit 2)
        return None
    floor = memory_floor(space, offload_min=False, pipelined=1)
    if not floor.fits:  # the nearest pipelined plan may fit with an uneven split (UNEVEN_MARGIN)
        uneven = uneven_split_plans(model, system, job, space, floor.near_pipelined)
        return uneven[0] if uneven else None
    est = estimate(model, system, floor.plan, job)
    return Ranked(plan=floor.plan, estimate=est, objective=_objective(est, model.seq_length, space.free_batch))


def check(model: ModelSpec, system: SystemSpec, job: JobSpec | None = None, searcher=None,
          plan_command: Callable[[int], str] | None = None) -> CheckResult:
    """Can this job run on this box? Yes: the best plan. No: which rules bind and by how much, and
    what would make it fit (more GPUs, an offload tier, TP across nodes, no pins), each decided
    exactly by the memory floor with an example plan that fits. `searcher`: what finds the plan
    when the floor allows one (default the search's best; the CLI passes its recommendation).
    `plan_command(gpus)`: the command that plans on that many GPUs (the CLI repeats the user's own
    flags in it)."""
    check_api_inputs(model, system, job)
    job = job or JobSpec()
    space = build_space(model, system, job)
    reasons: list[str] = []
    numbers: dict = {}
    lay = layouts(space)
    if not len(lay["tp"]):
        return _structural(model, system, job, space)
    # (the fewest offloaded bytes are the offload what-if's, from its own floor below: not costed here,
    # which on a large offload grid was most of a `check`: Kimi K2 on 1,024 GB200, --framework any)
    floor = memory_floor(space, offload_min=False, pipelined=UNEVEN_CANDIDATES)
    hbm_min, small_plan, cap = floor.hbm_bytes, floor.plan, floor.usable_hbm_bytes
    if small_plan is None:  # layouts exist, but no option combination goes with any of them
        return _structural(model, system, job, space, lay)
    if hbm_min > cap:  # none fits at the default stage splits: an uneven one may (UNEVEN_MARGIN)
        uneven = uneven_split_plans(model, system, job, space, floor.near_pipelined)
        if uneven:
            return CheckResult(feasible=True, best=uneven[0], reasons=[uneven_split_note(len(floor.near_pipelined))])
    if hbm_min <= cap:  # the memory bound does not rule everything out: search
        result = searcher() if searcher is not None else plan(model, system, job, top_k=1)
        if result.best is not None:
            return CheckResult(feasible=True, best=result.best)
        binding = explain(tabulate(space, top_k=None))
    else:
        # Exact without searching: every valid plan at its smallest legal batch (memory never falls
        # as the batch grows) needs more HBM than usable, or more offload than the tier holds. The
        # CP-SAT core would name the same two memory rules after a minute on a large space.
        binding = (["memory_fit_hbm", "memory_fit_offload"] if space.system.offload and job.allow_offload
                   else ["memory_fit_hbm"])
    numbers.update({"min_hbm_bytes": hbm_min, "usable_hbm_bytes": cap})
    if hbm_min > cap:
        # the GPU's HBM that would fit: footprint plus the reserve, over the HBM it has
        hbm_gib = system.accelerator.hbm_capacity_gib
        factor_needed = (hbm_min / GIB + job.hbm_reserve_gib) / hbm_gib
        numbers["hbm_factor_needed"] = factor_needed
        which = ("plans whose offload fits the tier" if system.offload and job.allow_offload
                 else "otherwise-valid plans")
        need_gib = _gib_ceil(hbm_min + job.hbm_reserve_gib * GIB)
        # (only where the smallest footprint is a pipelined plan's: elsewhere the splits' proofs
        # cost seconds, 5 -> 49 s for Llama 3.1 405B on 100 H100, and found nothing lower)
        uneven_gib, uneven_example = _uneven_hbm_need(model, system, job, hbm_min, need_gib) \
            if small_plan.pp > 1 else (need_gib, None)
        where, tail = "", _split_words(floor)
        if uneven_example is not None:  # a GPU with less HBM fits once the stages need not be even
            factor_needed = uneven_gib / hbm_gib
            numbers["hbm_factor_needed"] = factor_needed
            need = (f"{uneven_gib:.1f} GiB per GPU, with an uneven pipeline split such as "
                    f"{uneven_example.plan.short()}; {need_gib:.1f} GiB at Megatron's default splits")
            # the footprint is the default splits'; the need already says what an uneven one saves
            where, tail = " at Megatron's default pipeline splits", ""
        else:
            need = f"{need_gib:.1f} GiB per GPU"
        reasons.append(f"memory: the smallest per-GPU footprint over all {which}{where} is "
                       f"{_gib_up(hbm_min)} ({small_plan.short()}), but only {_gib_down(cap)} of "
                       f"{hbm_gib:g} GiB HBM is usable ({job.hbm_reserve_gib:g} GiB reserve): needs >= "
                       f"{math.ceil(factor_needed * 100 - 1e-9) / 100:.2f}x HBM ({need})" + tail)
    if not job.allow_idle_gpus:
        # fewer GPUs than the box has may fit where its own count does not divide (405B on 100 H100:
        # no layout of 100 fits, one of 96 does)
        idle = _fitting_example(model, system, job.model_copy(update={"allow_idle_gpus": True}))
        used = None if idle is None else idle.plan.gpus
        if used is not None and used < system.num_gpus:  # (all of them in use is not "the others idle")
            reasons.append(f"GPUs: it fits on {used} of the {system.num_gpus} GPUs, the others idle "
                           f"(--allow-idle-gpus), e.g. {idle.plan.short()}, {_gib(idle.estimate.hbm_bytes)} per GPU")
    gpus_reason, gpus_needed = _fewest_gpus(model, system, job, plan_command)
    reasons.append(gpus_reason)
    if gpus_needed is not None:
        numbers["gpus_needed"] = gpus_needed
    # offload: one floor over the largest hypothetical tier gives the fewest offloaded bytes of any
    # plan that fits HBM, hence the smallest tier that fits (capacity changes no other number)
    bw = system.offload.bandwidth_gb_per_s if system.offload else HYPOTHETICAL_OFFLOAD_GB_S
    tier = MemoryTier(name="hypothetical", capacity_gib=HYPOTHETICAL_OFFLOAD_GIB, bandwidth_gb_per_s=bw)
    hypo = system.with_changes(offload=tier.model_dump())
    hypo_job = job.model_copy(update={"allow_offload": True})
    off = memory_floor(build_space(model, hypo, hypo_job))
    if off.offload_plan is not None and off.offload_min_bytes <= HYPOTHETICAL_OFFLOAD_GIB * GIB * (1 + 1e-12):
        # the least tier that fits: the fewest offloaded bytes, rounded up to 0.1 GiB (a tier of the
        # printed size must fit; rounded to nearest, "35.6 GiB" did not hold 35.63)
        tier_gib = max(_gib_ceil(off.offload_min_bytes), 0.1)
        smallest = system.with_changes(offload={**tier.model_dump(), "capacity_gib": tier_gib})
        est = estimate(model, smallest, off.offload_plan, hypo_job)
        numbers["offload_tier_needed_gib"] = tier_gib
        numbers["offload_needed_bytes"] = est.offload_bytes
        have = (f"the system has {system.offload.capacity_gib:g} GiB" if system.offload
                else "the system has no offload tier")
        off_note = "" if job.allow_offload else ", but offload is off for this job (--no-offload)"
        reasons.append(f"offload: it fits with an offload tier of at least {tier_gib:.1f} GiB per GPU at {bw:g} GB/s; "
                       f"{have}{off_note}. The plan that offloads the least: {off.offload_plan.short()}, "
                       f"{_gib_up(est.offload_bytes)} offloaded per GPU; `planner plan` on such a system finds the fastest")
    else:
        msg = (f"offload: no {job.framework}-expressible plan fits even with "
               f"{HYPOTHETICAL_OFFLOAD_GIB:g} GiB of offload memory per GPU at {bw:g} GB/s")
        if job.framework == "megatron":
            # the fewest offloaded bytes of any plan that fits HBM once weights may go too
            anyf = memory_floor(build_space(model, hypo, hypo_job.model_copy(update={"framework": "any"})))
            if anyf.offload_plan is not None and anyf.offload_min_bytes <= HYPOTHETICAL_OFFLOAD_GIB * GIB:
                numbers["offload_needed_bytes_any_framework"] = anyf.offload_min_bytes
                msg += (f"; with a framework that offloads what Megatron cannot (weights, or activations beside "
                        f"recompute or a pipeline: --framework any) it fits with at least "
                        f"{_gib_up(anyf.offload_min_bytes)} of it per GPU ({anyf.offload_plan.short()})")
                if system.offload and system.offload.capacity_gib * GIB >= anyf.offload_min_bytes:
                    msg += (f"; this system's {system.offload.capacity_gib:g} GiB tier holds that"
                            + (" (without --no-offload)" if not job.allow_offload else ""))
                elif not job.allow_offload:
                    msg += " (and without --no-offload)"
        reasons.append(msg)
    if job.tp_within_nvlink and "gpus_needed" not in numbers:
        wide_job = job.model_copy(update={"tp_within_nvlink": False})
        wide = _fitting_example(model, system, wide_job)
        beyond = f"with TP beyond the {system.nvlink_domain_gpus}-GPU NVLink domain (--tp-across-nodes)"
        if wide is not None:
            reasons.append(f"tensor parallelism: {beyond} it fits, e.g. {wide.plan.short()}")
        else:  # more GPUs alone do not fit either (pins that fix dp, say): both together may
            more, wide_gpus = _fewest_gpus(model, system, wide_job, None)
            if wide_gpus is not None:
                reasons.append(f"tensor parallelism: {beyond} and more GPUs: " + more.removeprefix("GPUs: "))
    if job.pins:
        r = _fitting_example(model, system, job.model_copy(update={"pins": {}}))
        if r is not None:
            reasons.append(f"pins: without your pins ({_pins(job)}) it fits, e.g. {r.plan.short()}")
    return CheckResult(feasible=False, best=None, reasons=reasons, binding_rules=list(binding),
                       numbers=numbers)


def _uneven_hbm_need(model: ModelSpec, system: SystemSpec, job: JobSpec, hbm_min: float,
                     need_gib: float) -> tuple[float, Ranked | None]:
    """`check`'s HBM what-if where uneven pipeline splits count, as `plan` counts them: the least
    HBM per GPU, in 0.1 GiB, below `need_gib` (the default splits' need, rounded up) on which the
    per-stage model splits one of the pipelined layouts nearest to fitting so that it fits
    (`uneven_split_plans` on `memory_floor`'s `near_pipelined`, what `plan` tries where no plan
    fits at the default splits), with that plan; (need_gib, None) where none fits 0.1 GiB below.
    Llama 3.1 405B on 40 H100, batch 64: 180.0 GiB at the default splits, 178.3 with an uneven
    one. Lowering the HBM keeps the nearest layouts nearest (none fits at its default split) and
    drops those more than UNEVEN_MARGIN over; the first layout that fits is bisected (its fit taken
    as monotone in HBM). The others are not tried below its least: proving that none of them fits
    took 15 s on Llama 3.1 405B on 100 H100 (93.2 -> 85.3 GiB), so another may fit a little lower."""
    def box(tenths: int) -> SystemSpec:
        acc = system.accelerator.model_copy(update={"hbm_capacity_gib": tenths / 10})
        return system.model_copy(update={"accelerator": acc})

    def fit(candidate: Plan, tenths: int) -> Ranked | None:
        s = box(tenths)
        cap = s.accelerator.hbm_capacity_bytes - job.hbm_reserve_gib * GIB
        if estimate(model, s, candidate, job).hbm_bytes > cap * (1 + UNEVEN_MARGIN):
            return None  # too far over for `plan` to split it
        ranked = uneven_split_plans(model, s, job, build_space(model, s, job), [candidate])
        return ranked[0] if ranked else None

    hi = round(need_gib * 10) - 1
    near = memory_floor(build_space(model, box(hi), job), offload_min=False,
                        pipelined=UNEVEN_CANDIDATES).near_pipelined
    for candidate in near:
        example = fit(candidate, hi)
        if example is None:
            continue
        lo = math.floor((hbm_min / GIB / (1 + UNEVEN_MARGIN) + job.hbm_reserve_gib) * 10)  # too far over
        while hi - lo > 1:
            mid = (lo + hi) // 2
            r = fit(candidate, mid)
            lo, hi, example = (lo, mid, r) if r is not None else (mid, hi, example)
        return hi / 10, example
    return need_gib, None


def _fewest_gpus(model: ModelSpec, system: SystemSpec, job: JobSpec,
                 plan_command: Callable[[int], str] | None) -> tuple[str, int | None]:
    """`check`'s "more GPUs" answer and the GPU count in it: the first power-of-two multiple of
    the system's count that fits, then the fewest GPUs between the last one that did not and it,
    in whole nodes (finer below one node; steps of more nodes where more than
    MAX_GPU_COUNTS_TRIED counts lie between, said in the answer). Exact per count tried."""
    n, factor = system.num_gpus, 2
    fixed = [job.pins.get(k) for k in ("tp", "pp", "dp", "cp")]
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in fixed):
        # tp·pp·dp·cp pinned: no other GPU count is a plan of this job
        return (f"GPUs: your pins fix the GPU count (tp·pp·dp·cp = {math.prod(int(v) for v in fixed)}); more "
                f"GPUs need other values of those pins", None)
    while factor <= MAX_GPU_FACTOR and _fitting_example(model, system.with_changes(num_gpus=n * factor), job) is None:
        factor *= 2
    if factor > MAX_GPU_FACTOR:
        return f"GPUs: no plan fits even on {n * MAX_GPU_FACTOR} GPUs ({MAX_GPU_FACTOR}x -g {n})", None
    low, high = n * factor // 2, n * factor  # low does not fit, high does
    unit = system.gpus_per_node if low >= system.gpus_per_node else 1
    step = unit * max(1, -(-(high - low) // (unit * MAX_GPU_COUNTS_TRIED)))
    fewest, example = high, None
    for count in range(low + step - low % step if low % step else low + step, high, step):
        example = _fitting_example(model, system.with_changes(num_gpus=count), job)
        if example is not None:
            fewest = count
            break
    if example is None:
        example = _fitting_example(model, system.with_changes(num_gpus=high), job)
    grain = "" if step == 1 else f" (the fewest of the counts tried, in steps of {step} GPUs)"
    # the command only where the CLI knows the user's own flags: a bare `planner plan -g N` would
    # plan the default example, not this job (a sweep's point may not even have a preset system)
    how = f"`{plan_command(fewest)}` finds the fastest" if plan_command else \
        f"planning this job on {fewest} GPUs finds the fastest"
    return (f"GPUs: it fits on {fewest} GPUs{grain}, {fewest / n:.4g}x -g {n} (e.g. {example.plan.short()}, "
            f"{_gib(example.estimate.hbm_bytes)} per GPU; {how})", fewest)


def _pins(job: JobSpec) -> str:
    return ", ".join(f"{k}={v}" for k, v in job.pins.items())


def _fills_gpus(prods, dps, n: int, idle: bool) -> bool:
    """Whether some tp·pp·cp of `prods` times a dp of `dps` (the pinned domains) uses the n GPUs
    (at most n with idle GPUs)."""
    dps = set(dps)
    for prod in prods:
        if (idle and any(prod * x <= n for x in dps)) or (n % prod == 0 and n // prod in dps):
            return True
    return False


def _expert_folding_reason(model: ModelSpec, job: JobSpec, d: dict, n: int) -> str | None:
    """Why no MoE layout exists, where it is Megatron's expert folding: etp·ep·pp must divide the
    GPUs (and ep the experts) for some pp of the domain; None where some combination does."""
    if model.moe is None:
        return None
    world = [n] if not job.allow_idle_gpus else range(1, n + 1)
    if any(w % (etp * ep * pp) == 0 for w in world for pp in d["pp"] for ep in d["ep"] for etp in d["etp"]):
        return None
    return (f"experts: Megatron folds expert parallelism over the GPUs: etp·ep·pp must divide {n}, and no "
            f"etp in {list(d['etp'])}, ep in {list(d['ep'])}, pp in {list(d['pp'])} does (see the ep/etp pins)")


def _structural(model: ModelSpec, system: SystemSpec, job: JobSpec, space, lay: dict | None = None) -> CheckResult:
    """No layout passes the non-memory rules, or (`lay`: the layouts that do) no option combination
    goes with any of them: say which."""
    d = space.domains
    n = system.num_gpus
    reasons = []
    binding = []
    if lay is not None and len(lay["tp"]):
        tps = sorted({int(t) for t in lay["tp"]})
        sp_ok = (layout_class(lay, model.seq_length) & LAYOUT_CLASS_SP) != 0
        if (job.pins.get("sequence_parallel") or job.pins.get("tp_comm_overlap")) and not sp_ok.any():
            binding.append("sp_seq")
            reasons.append(f"sequence parallelism: needs tp > 1 and the sequence ({model.seq_length}) a multiple "
                           f"of tp·cp; no layout here has both (tp: {', '.join(map(str, tps))})")
        elif job.framework == "megatron" and model.moe is not None and min(tps) > 1:
            binding.append("moe_tp_needs_sp")
            reasons.append(f"sequence parallelism: Megatron's MoE layers with tp > 1 need it, and it needs the "
                           f"sequence ({model.seq_length}) to be a multiple of tp·cp (tp here: "
                           f"{', '.join(map(str, tps))})")
        else:
            binding.append("options")
            conflicts = megatron_pin_conflicts(job)
            reasons.append(f"options: {'; '.join(conflicts)}" if conflicts else
                           "options: no combination of recompute, sequence parallelism, overlaps and offload "
                           "goes with the layouts left (see the pins)")
        if job.pins:
            binding.append("pins")
            reasons.append(f"pins: your pins ({_pins(job)}) leave layouts, but none with a valid option set")
        return CheckResult(feasible=False, best=None, reasons=reasons, binding_rules=binding)
    if job.pins:
        free = build_space(model, system, job.model_copy(update={"pins": {}}))
        if len(layouts(free)["tp"]):
            binding.append("pins")
            why = (" (bf16 Adam moments need the distributed optimizer: zero_stage 1)"
                   if job.adam_moments == "bf16" and job.pins.get("zero_stage", 1) != 1 else "")
            reasons.append(f"pins: your pins ({_pins(job)}) leave no valid layout{why}; without them there are "
                           f"{count(model, system, job.model_copy(update={'pins': {}})):,} mappings")
    prods = sorted({a * b * c for a in d["tp"] for b in d["pp"] for c in d["cp"]})
    pinned = {k: int(job.pins[k]) for k in ("tp", "pp", "dp", "cp") if isinstance(job.pins.get(k), (int, float))}
    product = math.prod(pinned.values())
    # the dp values the batch rules below name: the pinned one, or those the GPUs leave
    dps = [pinned["dp"]] if "dp" in pinned else sorted({n // p for p in prods if n % p == 0})
    dps_text = f"{dps[:12]}{'...' if len(dps) > 12 else ''}"
    if len(pinned) > 1 and product > n:
        binding.append("gpus")
        reasons.append(f"gpus: your pins need {'·'.join(pinned)} = {product} GPUs; the system has {n}")
    elif isinstance(job.pins.get("ep"), (int, float)) and job.pins["ep"] > n:
        binding.append("experts_ep")
        reasons.append(f"ep: {int(job.pins['ep'])} expert-parallel ranks need as many GPUs; the system has {n}")
    elif isinstance(job.pins.get("vpp"), (int, float)) and job.pins["vpp"] * min(d["pp"]) > model.layers:
        binding.append("layers_pp")
        reasons.append(f"vpp: pp·vpp = {min(d['pp'])}·{int(job.pins['vpp'])} virtual stages exceed the "
                       f"{model.layers} layers (each needs one)")
    elif not job.allow_idle_gpus and not any(n % p == 0 for p in prods):
        binding.append("gpus")
        reasons.append(f"gpus: no tp·pp·cp from tp in {list(d['tp'])}, pp in {list(d['pp'])}, cp in "
                       f"{list(d['cp'])} divides {n} GPUs (try --allow-idle-gpus or another GPU count)")
    elif not _fills_gpus(prods, d["dp"], n, job.allow_idle_gpus):
        binding.append("gpus")
        reasons.append(f"gpus: no tp in {list(d['tp'])}, pp in {list(d['pp'])}, cp in {list(d['cp'])} and dp in "
                       f"{list(d['dp'])[:12]}{'...' if len(d['dp']) > 12 else ''} make tp·pp·dp·cp "
                       f"{'at most' if job.allow_idle_gpus else 'equal to'} {n} (see the pins)")
    elif folding := _expert_folding_reason(model, job, d, n):
        binding.append("experts_ep")
        reasons.append(folding)
    elif not layout_exists_at_some_batch(space):  # each rule holds alone, but not all at once
        binding.append("layout")
        reasons.append(f"layout: no layout meets the GPU count ({n}), Megatron's expert folding (etp·ep·pp "
                       f"dividing it) and the pipeline rules together (tp in {list(d['tp'])}, pp in "
                       f"{list(d['pp'])}, cp in {list(d['cp'])}, ep in {list(d['ep'])}; see the pins)"
                       if model.moe else
                       f"layout: no layout meets the GPU count ({n}) and the pipeline rules together (tp in "
                       f"{list(d['tp'])}, pp in {list(d['pp'])}, cp in {list(d['cp'])}; see the pins)")
    elif job.global_batch:
        binding.append("batch")
        reasons.append(f"batch: the global batch {job.global_batch} is not a multiple of "
                       f"micro_batch·dp for any dp in {dps_text} (with interleaving also at least pp microbatches)")
    elif min(dps, default=0) > job.max_global_batch and ("dp" in pinned or not job.allow_idle_gpus):
        # a free batch whose cap is below every dp the GPUs leave (idle GPUs would allow a smaller one)
        binding.append("batch")
        reasons.append(f"batch: --max-global-batch {job.max_global_batch} is below micro_batch·dp for every dp "
                       f"in {dps_text}; a free batch is a multiple of it")
    if not reasons:
        reasons.append("no combination of the knob domains passes the structural rules")
    return CheckResult(feasible=False, best=None, reasons=reasons, binding_rules=binding)


__all__ = ["plan", "best_plan", "check", "count", "SearchResult", "CheckResult", "Ranked"]
