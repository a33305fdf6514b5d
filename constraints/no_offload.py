"""Which layouts a search WITHOUT offload needs, known from a search of the same job WITH it.

Where the best plan offloads, `planner plan` says what the offload buys by searching the job
again with offload off (planner.recommend). On frontier MoE jobs that second search cost as much
as the first (DeepSeek-V3 on 256 GB200: 15 s each), re-costing the same no-offload pairs.

The first search's cost table (`constraints.cost_table._largest_batch_pass`) already costs every
no-offload (layout, options) pair at its largest batch, or skips it as an overlap twin no faster
than a pair it costs (rules 0 A-C). So, per layout, the least of those objectives bounds every
no-offload row of the layout from below (a smaller batch is slower per token: rule 1), and the
best of them that fits is a no-offload plan. The second search's K-th best layout is therefore no
slower than the K-th best of those fitting rows (T); its table keeps only layouts within T times
1 + the tie tolerance (rule 3), so a layout whose bound is beyond that never reaches it and is left
out before costing. The second search's table, ranking and answer are the full search's
(tests/test_offload_gain.py compares the two).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from constraints.space import LAYOUT_KEYS, OPTION_KEYS, Space, options

# a layout is identified by its knobs and its microbatch counts (a free batch spans several)
LAYOUT_ID_KEYS = LAYOUT_KEYS + ("m_min", "m_max", "m_step")
# kept a hair wider than the bound: it is compared with the second search's own thresholds
BOUND_SLACK = 1e-9


def layout_ids(lay: dict[str, np.ndarray]) -> list[tuple]:
    return list(zip(*(lay[k].tolist() for k in LAYOUT_ID_KEYS)))


def option_ids(opt: dict[str, np.ndarray], rows: np.ndarray | None = None) -> frozenset:
    cols = [opt[k] if rows is None else opt[k][rows] for k in OPTION_KEYS]
    return frozenset(zip(*(c.tolist() for c in cols)))


def kth_best(values: np.ndarray, k: int | None) -> float:
    """The k-th smallest finite value (inf if there are fewer, or no k)."""
    finite = np.sort(values[np.isfinite(values)])
    if k is None or len(finite) < k:
        return np.inf
    return float(finite[k - 1])


@dataclass(frozen=True)
class NoOffloadBounds:
    """Per layout of a search with offload allowed (`layouts`): `lower`, a lower bound on every
    no-offload row's objective, and `best_fit`, the best fitting no-offload row costed (inf:
    none); `option_ids`, that search's no-offload option rows. Made by the search's cost table
    (`constraints.cost_table._largest_batch_pass`) from the pairs it costed."""

    layouts: dict[str, np.ndarray]   # LAYOUT_ID_KEYS columns of that search's layouts
    lower: np.ndarray
    best_fit: np.ndarray
    option_ids: frozenset

    def needed(self, space: Space, lay: dict[str, np.ndarray], top_k: int | None,
               tie_rel_tol: float) -> np.ndarray | None:
        """Which of `lay` (the layouts of a search of the same job without offload, keeping
        `top_k` layouts and their ties) can reach its table; None: all of them (the option rows
        differ, or fewer than `top_k` layouts fitted without offload)."""
        if option_ids(options(space)) != self.option_ids:
            return None
        bound = kth_best(self.best_fit, top_k) * (1.0 + tie_rel_tol) * (1.0 + BOUND_SLACK)
        if not np.isfinite(bound):
            return None
        index = {key: i for i, key in enumerate(layout_ids(self.layouts))}  # (built only when asked)
        idx = np.asarray([index.get(key, -1) for key in layout_ids(lay)], dtype=np.int64)
        # a layout the first search did not have is not bounded: kept
        lower = np.where(idx >= 0, self.lower[np.maximum(idx, 0)], -np.inf) if len(idx) else np.zeros(0)
        return lower <= bound


__all__ = ["NoOffloadBounds", "LAYOUT_ID_KEYS", "kth_best", "layout_ids", "option_ids"]
