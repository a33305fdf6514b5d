"""The two kinds of transformer layer a model can have: the repeated layer (the MoE layer of a
MoE model, else the dense layer) and a MoE model's leading dense layers (DeepSeek-V3 §4.2: the
first three layers keep a dense FFN; MoESpec.first_dense_layers). The cost model prices each kind
with the same functions: a leading dense layer is the repeated layer of the model's dense twin."""
from __future__ import annotations

import numpy as np

from planner.analytical.plans import PlanArrays, has_layout
from planner.model import HYBRID_BLOCKS, ModelSpec
from planner.pipeline_layout import balanced_layout, rank_of_stage


def lead_layers(model: ModelSpec) -> int:
    """Leading dense layers of a MoE model (0 for a dense model: one layer kind)."""
    return model.moe.first_dense_layers if model.moe else 0


def lead_layer_model(model: ModelSpec) -> ModelSpec:
    """The model whose repeated layer is `model`'s leading dense layer: the same attention,
    norms and dense FFN width, no experts, no MTP modules (those run on the last stage with the
    repeated layer). Only its per-layer costs are used."""
    return model.model_copy(update={"moe": None, "mtp_layers": 0})


def by_block(model: ModelSpec) -> bool:
    """Whether a rank's costs follow the hybrid blocks it holds (a hybrid stack without leading
    dense layers: `rank_block_sum` needs one layer kind besides the blocks)."""
    return bool(model.hybrid_pattern) and not lead_layers(model)


def rank_block_counts(model: ModelSpec, P: PlanArrays) -> tuple[list[str], list[tuple[np.ndarray, np.ndarray]]]:
    """(block kinds, [(rows, counts)]): the rows of `P` grouped by layout (an explicit one, else
    the default split of their (pp, vpp)), and for each group the (R, kinds) count of each block
    kind of a hybrid stack on each representative rank: the pattern cut at the layout, virtual
    stage j on rank j mod pp. A group's rows share their representative ranks (the default split's,
    every rank after `plans.with_every_rank`, or an explicit layout's); rows that do not are
    grouped alone."""
    kinds = [k for k in HYBRID_BLOCKS if model.blocks(k)]
    groups: dict = {}
    explicit = has_layout(P.stage_layout)
    p, v = P.pp.astype(int), P.vpp.astype(int)
    keys = p * (v.max() + 1) + v
    for key in np.unique(keys[~explicit]):  # default splits: one group per (pp, vpp)
        rows = np.flatnonzero((keys == key) & ~explicit)
        groups[(int(p[rows[0]]), int(v[rows[0]]), None)] = rows
    for i in np.flatnonzero(explicit):
        groups.setdefault((int(p[i]), int(v[i]), tuple(P.stage_layout[i][0])), []).append(i)
    out = []
    for (pp, vpp, layout), rows in groups.items():
        stages = layout or balanced_layout(model.layers, pp, vpp)
        per_rank = np.zeros((pp, len(kinds)))
        at = 0
        for j, n in enumerate(stages):
            for c in model.hybrid_pattern[at:at + n]:
                per_rank[rank_of_stage(j, pp), kinds.index(c)] += 1
            at += n
        rows = np.asarray(rows)
        ranks = P.rank_index[rows].astype(int) % pp
        if np.all(ranks == ranks[0]):
            out.append((rows, per_rank[ranks[0]]))
        else:
            out += [(rows[j:j + 1], per_rank[ranks[j]]) for j in range(len(rows))]
    return kinds, out


def rank_block_sum(model: ModelSpec, P: PlanArrays, per_block: dict, counts=None) -> np.ndarray:
    """(n, R): Σ over the blocks each representative rank holds of `per_block[kind]` (a number, or
    one per row; kinds not given count 0). `counts`: `rank_block_counts(model, P)`, if at hand."""
    kinds, groups = counts or rank_block_counts(model, P)
    values = np.stack([np.broadcast_to(np.asarray(per_block.get(k, 0.0), dtype=np.float64), (len(P),))
                       for k in kinds], axis=1)
    out = np.zeros(P.rank_index.shape)
    for rows, table in groups:
        out[rows] = values[rows] @ table.T
    return out


__all__ = ["by_block", "lead_layers", "lead_layer_model", "rank_block_counts", "rank_block_sum"]
