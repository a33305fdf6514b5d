"""The two kinds of transformer layer a model can have: the repeated layer (the MoE layer of a
MoE model, else the dense layer) and a MoE model's leading dense layers (DeepSeek-V3 §4.2: the
first three layers keep a dense FFN; MoESpec.first_dense_layers). The cost model prices each kind
with the same functions: a leading dense layer is the repeated layer of the model's dense twin."""
from __future__ import annotations

import numpy as np

from planner.analytical.plans import PlanArrays, has_layout, rows_by_split, uniform_chunk_recompute
from planner.model import HYBRID_BLOCKS, ModelSpec
from planner.plan import RECOMPUTE_CODES
from planner.pipeline_layout import balanced_layout, rank_of_stage


def lead_layers(model: ModelSpec) -> int:
    """Dense layers of a MoE model, leading or interleaved (0 for a dense model: one layer kind)."""
    return model.dense_layers if model.moe else 0


def interleaved(model: ModelSpec) -> bool:
    """Whether a MoE model's dense layers sit between its MoE layers (MoESpec.layer_step > 1), not
    only before them: the per-stage counts then follow the positions, not a prefix."""
    return bool(model.moe) and model.moe.layer_step > 1


def dense_layer_spec(model: ModelSpec) -> int | tuple[int, ...]:
    """What PlanArrays needs to count each rank's dense layers: their number when they lead (the
    first ones), else their positions (an interleaved MoE model)."""
    return model.dense_layer_positions if interleaved(model) else lead_layers(model)


def lead_layer_model(model: ModelSpec) -> ModelSpec:
    """The model whose repeated layer is `model`'s leading dense layer: the same attention,
    norms and dense FFN width, no experts, no MTP modules (those run on the last stage with the
    repeated layer). Only its per-layer costs are used."""
    return model.model_copy(update={"moe": None, "mtp_layers": 0})


def by_block(model: ModelSpec) -> bool:
    """Whether a rank's costs follow the hybrid blocks it holds (a hybrid stack without leading
    dense layers: `rank_block_sum` needs one layer kind besides the blocks)."""
    return bool(model.hybrid_pattern) and not lead_layers(model)


def rank_block_counts(model: ModelSpec, P: PlanArrays) -> tuple[list[str], list[tuple]]:
    """(block kinds, [(rows, held, recomputed)]): the rows of `P` grouped by layout (an explicit
    one, else the default split of their (pp, vpp)) and full-recompute count, and for each group
    the (R, kinds) count of each block kind of a hybrid stack that each representative rank holds
    and recomputes in full: the pattern cut at the layout, virtual stage j on rank j mod pp.
    Megatron's block method recomputes a stage's first layers: with per-stage counts, each
    stage's first ones; with one count k per stage, the first k/vpp of every chunk
    (`plans.uniform_chunk_recompute`); else (vpp does not divide k: no Megatron launch) a rank's
    first min(k, its layers) in chunk order (k = 0 all). A group's rows share their representative
    ranks (the default split's, every rank after `plans.with_every_rank`, or an explicit
    layout's); rows that do not are grouped alone."""
    kinds = [k for k in HYBRID_BLOCKS if model.blocks(k)]
    groups: dict = {}
    explicit = has_layout(P.stage_layout)
    # recompute per group: ("stages", per-stage counts) or ("ranks", k; -1 none, 0 all)
    k = np.where(P.recompute == RECOMPUTE_CODES["full"], P.recompute_layers, -1.0)
    keys = np.stack([P.pp, P.vpp, k], axis=1).astype(int)
    default = np.flatnonzero(~explicit)
    if len(default):  # default splits: one group per (pp, vpp, recompute count)
        for pp, vpp, k_g, rows in rows_by_split(keys[:, 0], keys[:, 1], keys[:, 2], default):
            groups[(pp, vpp, None, ("ranks", k_g))] = rows
    for i in np.flatnonzero(explicit):
        layout, stage_rc = P.stage_layout[i]
        rc = ("stages", tuple(stage_rc)) if stage_rc is not None else ("ranks", int(keys[i, 2]))
        groups.setdefault((int(keys[i, 0]), int(keys[i, 1]), tuple(layout), rc), []).append(i)
    out = []
    for (pp, vpp, layout, rc), rows in groups.items():
        stages = layout or balanced_layout(model.layers, pp, vpp)
        chunks = uniform_chunk_recompute(stages, rc[1], vpp) if rc[0] == "ranks" else None
        held, recomputed = _block_tables(model.hybrid_pattern, kinds, stages, pp,
                                         rc if chunks is None else ("stages", chunks))
        rows = np.asarray(rows)
        ranks = P.rank_index[rows].astype(int) % pp
        if np.all(ranks == ranks[0]):
            out.append((rows, held[ranks[0]], recomputed[ranks[0]]))
        else:
            out += [(rows[j:j + 1], held[ranks[j]], recomputed[ranks[j]]) for j in range(len(rows))]
    return kinds, out


def _block_tables(pattern: str, kinds: list[str], stages: tuple[int, ...], pp: int, rc: tuple):
    """(held, recomputed): (pp, kinds) block counts per rank. `rc`: ("stages", the count each
    stage recomputes, its first blocks) or ("ranks", k: each rank's first min(k, its blocks) in
    chunk order; 0 all, -1 none)."""
    held, recomputed = np.zeros((pp, len(kinds))), np.zeros((pp, len(kinds)))
    chunked: list[str] = [""] * pp  # each rank's blocks, chunk by chunk
    at = 0
    for j, n in enumerate(stages):
        r = rank_of_stage(j, pp)
        chunked[r] += pattern[at:at + n]
        if rc[0] == "stages":
            for c in pattern[at:at + rc[1][j]]:
                recomputed[r, kinds.index(c)] += 1
        at += n
    for r, blocks in enumerate(chunked):
        for c in blocks:
            held[r, kinds.index(c)] += 1
        if rc[0] == "ranks" and rc[1] >= 0:
            for c in blocks[:rc[1] or len(blocks)]:
                recomputed[r, kinds.index(c)] += 1
    return held, recomputed


def rank_block_sum(model: ModelSpec, P: PlanArrays, per_block: dict, counts=None, recomputed: bool = False) -> np.ndarray:
    """(n, R): Σ over the blocks each representative rank holds (`recomputed`: recomputes in
    full) of `per_block[kind]` (a number, or one per row; kinds not given count 0). `counts`:
    `rank_block_counts(model, P)`, if at hand."""
    kinds, groups = counts or rank_block_counts(model, P)
    values = np.stack([np.broadcast_to(np.asarray(per_block.get(k, 0.0), dtype=np.float64), (len(P),))
                       for k in kinds], axis=1)
    out = np.zeros(P.rank_index.shape)
    for rows, held, rec in groups:
        out[rows] = values[rows] @ (rec if recomputed else held).T
    return out


__all__ = ["by_block", "dense_layer_spec", "interleaved", "lead_layers", "lead_layer_model", "rank_block_counts", "rank_block_sum"]
