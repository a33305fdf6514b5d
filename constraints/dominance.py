"""Overlap twins: option rows the exact model orders without costing them (cost-table pruning).

Three on/off switches only hide communication behind compute: dp_comm_overlap, tp_comm_overlap
and moe_a2a_overlap. A row with a switch off ("v") and its twin with the switch on ("u", every
other knob equal) are ordered by the model (planner/analytical/time.py) as follows.

A. dp_comm_overlap: it only selects the exposed-DP formula (data_parallel.dp_comm_exposed_s),
   and each hidden variant is <= its exposed one term by term (overlapped_collective_s <= its
   total; ZeRO-2/3 per-microbatch and per-layer terms likewise); no memory term reads it. So
   v is never faster than u and needs the same memory: everywhere.
B. tp_comm_overlap (with sequence parallelism): it lowers the exposed TP fraction of every
   layer (TP_EXPOSED_WITH_OVERLAP <= TP_EXPOSED_FWD, TP_EXPOSED_BWD), so every pipeline rank's
   microbatch time falls, and so do the bubble (the other ranks' sum) and m x the slowest rank.
   It also enters the DP/offload overlap windows through selective recompute of `mlp` / `moe`
   (half the layer's forward TP collectives are recomputed); a smaller window can expose more
   DP traffic than the rank time saves, so the rule holds only without those modules, and only
   where the slowest rank cannot change (its compute sets the windows): one pipeline rank, or
   every rank holding the same number of layers of one kind (then the last rank, with the LM
   head, is the slowest either way). Same memory.
C. moe_a2a_overlap: per MoE layer the exposed all-to-all falls from 2a to 2a - (1-u)·hidden
   (a2a_overlap_exposed_s; forward alone from a to u·a), with the same conditions as B (`moe`
   recompute reruns the dispatch) and no activation offload across unequal ranks (the offload
   traffic reads the fullest rank's activations). It costs one more layer in flight
   (memory.in_flight_microbatches), so u needs MORE memory: v is dominated only where u fits.
   Where the overlap hides nothing (NCCL's intra-domain all-to-all, time.a2a_in_nccl_copy_kernels)
   u takes v's time with more memory: no rule, both twins are costed (the tie ranks v first).
   Nor for full recompute without a pipeline or offload: there each twin is costed at the fewest
   recomputed layers that fit (cost_table.fewest_recompute_layers), so v, with less memory, may
   recompute fewer layers and be the faster one.

Where a rule holds, v is not costed. Ties (u exactly as fast as v, e.g. dp = 1, or every
microbatch unpaired) would rank v first (`order_rows`: the lower knob value), so the cost table
costs the skipped twins of every row still in the running after its bounds (`lower_twins`) and
ranks them with the rest: the table is the one without these rules.
tests/test_overlap_dominance.py checks each rule against the model on sampled rows, and the
zero-regret tests against the brute-force oracle.
"""
from __future__ import annotations

import numpy as np

from constraints.space import OPTION_KEYS, Space
from planner.analytical.layer_kinds import lead_layers
from planner.analytical.time import a2a_in_nccl_copy_kernels
from planner.plan import MOE_DISPATCHER_CODES, RECOMPUTE_CODES, RECOMPUTE_MODULE_BITS

# the switches, in the order their twins are looked up
OVERLAP_KNOBS = ("dp_comm_overlap", "tp_comm_overlap", "moe_a2a_overlap")
MEMORY_NEUTRAL = ("dp_comm_overlap", "tp_comm_overlap")  # rules A, B; C is decided by fit


def twin_indices(opt: dict[str, np.ndarray], knob: str) -> tuple[np.ndarray, np.ndarray]:
    """(up, down): for every option row, the row equal but for `knob` switched on (up, for rows
    with it off) or off (down, for rows with it on); -1 where there is none (e.g. a pin)."""
    n = len(opt["recompute"])
    keys = [tuple(opt[k][i] for k in OPTION_KEYS) for i in range(n)]
    index = {key: i for i, key in enumerate(keys)}
    pos = OPTION_KEYS.index(knob)
    up, down = np.full(n, -1, dtype=np.int64), np.full(n, -1, dtype=np.int64)
    for i, key in enumerate(keys):
        flipped = key[:pos] + (1.0 - key[pos],) + key[pos + 1:]
        j = index.get(flipped, -1)
        if key[pos] == 0:
            up[i] = j
        else:
            down[i] = j
    return up, down


def slowest_rank_fixed(space: Space, lay: dict[str, np.ndarray]) -> np.ndarray:
    """Layouts whose slowest pipeline rank is the same whatever the per-layer times: one rank,
    or equal layer counts of one layer kind on every rank (the last rank adds the LM head)."""
    one_kind = lead_layers(space.model) == 0
    return (lay["pp"] == 1) | ((np.mod(space.model.layers, lay["pp"]) == 0) & one_kind)


def _selective_with(opt: dict[str, np.ndarray], modules: tuple[str, ...]) -> np.ndarray:
    bits = sum(RECOMPUTE_MODULE_BITS[m] for m in modules)
    return (opt["recompute"] == RECOMPUTE_CODES["selective"]) & ((opt["recompute_modules"].astype(np.int64) & bits) != 0)


# the switches whose rule holds at every pair (rule A): their `rule_holds` table is all True
HOLDS_EVERYWHERE = frozenset({"dp_comm_overlap"})


def rule_holds(space: Space, lay: dict[str, np.ndarray], opt: dict[str, np.ndarray], knob: str,
               cols: np.ndarray | None = None) -> np.ndarray:
    """(layouts x options, or x `cols` of them) where switching `knob` on is never slower (rules
    A-C above; for C the fit of the twin is checked by the caller). Each rule is a layout
    condition and an option condition, so the table is built for the columns asked only (whole,
    it took 0.7 GB a knob for Kimi K2 on 1,024 GB200)."""
    at = slice(None) if cols is None else cols
    # built as (options x layouts) and transposed: stored column by column, as pair_mask
    if knob in HOLDS_EVERYWHERE:
        return np.ones((len(opt["recompute"][at]), len(lay["tp"])), dtype=bool).T
    fixed = slowest_rank_fixed(space, lay)[None, :]
    if knob == "tp_comm_overlap":
        return (~_selective_with(opt, ("mlp", "moe"))[at][:, None] & fixed).T
    if knob == "moe_a2a_overlap":
        no_act_offload = (opt["offload_activations"][at] == 0)[:, None] | (lay["pp"] == 1)[None, :]
        hides = ~a2a_in_nccl_copy_kernels(space.system, MOE_DISPATCHER_CODES[space.job.moe_dispatcher],
                                          lay["ep"], lay["etp"])[None, :]
        return (~_selective_with(opt, ("moe",))[at][:, None] & (fixed & hides) & no_act_offload).T
    raise ValueError(knob)


class Twins:
    """The twin tables of one (space, layouts, options)."""

    def __init__(self, space: Space, lay: dict[str, np.ndarray], opt: dict[str, np.ndarray], mask: np.ndarray):
        self.space, self.lay, self.opt = space, lay, opt
        self.up, self.down = {}, {}
        for knob in OVERLAP_KNOBS:
            self.up[knob], self.down[knob] = twin_indices(opt, knob)
        self.mask = mask

    def holds(self, knob: str, cols: np.ndarray | None = None) -> np.ndarray:
        """`rule_holds` of this table (its `cols` columns)."""
        return rule_holds(self.space, self.lay, self.opt, knob, cols)

    def neutral_shadow(self) -> np.ndarray:
        """(layouts x options) pairs not costed by rules A and B: the switch off, the twin with it
        on allowed for the layout, and the rule holding there."""
        # stored as the mask is, column by column (np.zeros, not zeros_like: the OS hands out zeroed
        # pages, where zeros_like writes 0.5 GB of them for DeepSeek-V3 under --framework any)
        shadow = np.zeros(self.mask.shape, dtype=bool, order="F")
        for knob in MEMORY_NEUTRAL:
            cols = np.flatnonzero(self.up[knob] >= 0)  # rows with the switch off and a twin
            shadow[:, cols] |= self.dominated_by_twin(knob, self.mask, cols)
        return shadow

    def dominated_by_twin(self, knob: str, twin_ok: np.ndarray, cols: np.ndarray | None = None) -> np.ndarray:
        """(layouts x cols) pairs with `knob` off whose twin with it on is a pair for which
        `twin_ok` (layouts x options) holds, where the rule holds."""
        cols = np.arange(self.mask.shape[1]) if cols is None else cols
        up = self.up[knob][cols]
        has = up >= 0
        out = self.mask[:, cols] & twin_ok[:, np.maximum(up, 0)]
        if not has.all():
            out &= has[None, :]
        if knob not in HOLDS_EVERYWHERE:  # (an all-True table is not built)
            out &= self.holds(knob, cols)
        return out

    def lower_twins(self, L: np.ndarray, O: np.ndarray, shadow: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The shadowed pairs below the pairs (L[i], O[i]): every option reached by switching off
        one or more overlap switches, kept where `shadow` marks it not costed. Returns (layout
        rows, option rows, i) with duplicates of the same (i's batch, pair) left to the caller."""
        lays, opts, src = [L], [O], [np.arange(len(L))]
        for knob in OVERLAP_KNOBS:  # each switch off, applied to all found so far: every subset
            cur_l, cur_o, cur_s = (np.concatenate(x) for x in (lays, opts, src))
            down = self.down[knob][cur_o]
            ok = down >= 0
            lays.append(cur_l[ok])
            opts.append(down[ok])
            src.append(cur_s[ok])
        L2, O2, S2 = (np.concatenate(x[1:]) if len(x) > 1 else np.zeros(0, dtype=np.int64) for x in (lays, opts, src))
        keep = shadow[L2, O2]
        return L2[keep], O2[keep], S2[keep]


__all__ = ["Twins", "rule_holds", "twin_indices", "slowest_rank_fixed", "OVERLAP_KNOBS", "MEMORY_NEUTRAL"]
