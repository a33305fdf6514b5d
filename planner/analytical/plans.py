"""Many plans as columns of numpy arrays: the shape the vectorized model and the search share."""
from __future__ import annotations

import functools
from dataclasses import dataclass, fields, replace

import numpy as np

from planner.pipeline_layout import balanced_layout, even_layout, rank_dense_prefix, rank_layers, stage_lead_layers
from planner.plan import (DP_IMPL_CODES, MOE_DISPATCHER_CODES, RECOMPUTE_CODES, RECOMPUTE_MODULE_BITS, Plan,
                          recompute_modules_from_mask, recompute_modules_mask)

RECOMPUTE_NAMES = {code: name for name, code in RECOMPUTE_CODES.items()}
DP_IMPL_NAMES = {code: name for name, code in DP_IMPL_CODES.items()}
DISPATCHER_NAMES = {code: name for name, code in MOE_DISPATCHER_CODES.items()}


@dataclass(frozen=True)
class PlanArrays:
    """One column per knob; row i is plan i. recompute: 0 none, 1 selective, 2 full;
    recompute_layers: layers per stage recomputed under full recompute, 0 = all (ignored otherwise;
    with an explicit layout, k/vpp of each virtual stage: uniform_chunk_recompute);
    recompute_modules: selective recompute's module bit mask (planner.plan.RECOMPUTE_MODULE_BITS;
    0 = core_attn, Megatron's default; forced to 0 unless recompute is selective).

    The pipeline layout is held per plan as a few REPRESENTATIVE pipeline ranks (2-D columns
    rank_index / rank_layers / rank_recompute, one column per representative): the ranks whose
    time or memory can be the plan's worst. A rank left out has the same layers and recompute as
    a kept rank of lower index and is neither first nor last, so it is dominated: same compute, fewer
    in-flight microbatches, no embedding, so the max over representatives equals the max over all
    ranks (exact reduction). Even and balanced splits need 3 (first, a fullest middle, last);
    explicit layouts keep every rank. `stage_layout` keeps an explicit Plan layout for `row`.

    Layer kinds: a MoE model's first `lead_layers` layers are dense (DeepSeek-V3: 3) and cost
    differently from its MoE layers, so each representative also counts how many of its layers
    (rank_lead_layers) and of its recomputed layers (rank_lead_recompute) are leading dense ones.
    They sit in the first virtual stages (`stage_lead_layers`), so with them the default split
    keeps ranks 0 .. min(lead_layers, pp − 1) and the last (see `_lead_rank_columns`)."""

    tp: np.ndarray
    pp: np.ndarray
    dp: np.ndarray
    cp: np.ndarray
    ep: np.ndarray
    etp: np.ndarray
    micro_batch: np.ndarray
    global_batch: np.ndarray
    vpp: np.ndarray
    sequence_parallel: np.ndarray
    recompute: np.ndarray
    recompute_layers: np.ndarray
    recompute_modules: np.ndarray
    zero_stage: np.ndarray
    offload_weights: np.ndarray
    offload_activations: np.ndarray
    offload_optimizer: np.ndarray
    tp_comm_overlap: np.ndarray
    dp_comm_overlap: np.ndarray
    dp_impl: np.ndarray
    moe_dispatcher: np.ndarray
    moe_a2a_overlap: np.ndarray
    cross_entropy_fusion: np.ndarray
    grad_reduce_in_bf16: np.ndarray
    fp8_param_gather: np.ndarray
    rank_index: np.ndarray = None      # (n, R) pipeline rank of each representative
    rank_layers: np.ndarray = None     # (n, R) transformer layers on that rank
    rank_recompute: np.ndarray = None  # (n, R) of those, layers recomputed in full
    recompute_total: np.ndarray = None  # (n,) layers recomputed in full over all ranks
    num_layers: np.ndarray = None      # (n,) the model's transformer layers
    stage_layout: np.ndarray = None    # (n,) object: (stage_layers, stage_recompute | None) or None
    rank_lead_layers: np.ndarray = None     # (n, R) of rank_layers, leading dense layers (MoE models)
    rank_lead_recompute: np.ndarray = None  # (n, R) of rank_recompute, leading dense layers
    lead_layers: np.ndarray = None          # (n,) the model's leading dense layers (0: one layer kind)
    lead_recompute_total: np.ndarray = None  # (n,) of recompute_total, leading dense layers

    def __len__(self) -> int:
        return len(self.tp)

    @classmethod
    def from_columns(cls, n: int, layers: int, lead_layers: int | tuple[int, ...] = 0, **cols) -> "PlanArrays":
        """Columns given as arrays or scalars (broadcast to n rows); missing knobs take Plan defaults.
        `lead_layers`: the model's dense layers (`layer_kinds.dense_layer_spec(model)`): their number
        when they lead, their positions when interleaved between MoE layers."""
        default = Plan()
        out = {}
        for f in fields(cls):
            if f.name in RANK_FIELDS or f.name == "stage_layout":
                continue
            if f.name in cols:
                value = cols[f.name]
            elif f.name in ("recompute_layers", "recompute_modules"):
                value = 0  # all layers of the stage / Megatron's default modules, resolved below
            elif f.name == "recompute":
                value = RECOMPUTE_CODES[default.recompute]
            elif f.name == "etp":
                value = 0  # 0 = same as tp (Megatron's default), resolved below
            elif f.name == "dp_impl":
                value = DP_IMPL_CODES[default.dp_impl]
            elif f.name == "moe_dispatcher":
                value = MOE_DISPATCHER_CODES[default.moe_dispatcher]
            else:
                value = getattr(default, f.name)
            out[f.name] = np.broadcast_to(np.asarray(value, dtype=np.float64), (n,)).copy()
        out["etp"] = np.where(out["etp"] > 0, out["etp"], out["tp"])
        selective = out["recompute"] == RECOMPUTE_CODES["selective"]
        default_modules = float(recompute_modules_mask(None))
        out["recompute_modules"] = np.where(selective, np.where(out["recompute_modules"] > 0, out["recompute_modules"],
                                                                default_modules), 0.0)
        # 0 means "every layer of the stage"; a count above the stage's layers means the same
        layouts = cols.get("stage_layout")
        out["stage_layout"] = np.empty(n, dtype=object) if layouts is None else np.asarray(layouts, dtype=object)
        # (default split: no rank holds more than ceil(layers/pp), so k >= layers/pp is "all")
        explicit = np.zeros(n, dtype=bool) if layouts is None else has_layout(out["stage_layout"])
        all_layers = (out["recompute_layers"] >= layers / out["pp"]) & ~explicit
        out["recompute_layers"] = np.where(all_layers, 0.0, np.maximum(out["recompute_layers"], 0.0))
        if isinstance(lead_layers, tuple):  # dense layers interleaved between MoE layers
            out.update(_interleaved_rank_columns(layers, lead_layers, out))
        else:
            out.update(_rank_columns(layers, out))
            out.update(_lead_rank_columns(layers, lead_layers, out))
        return cls(**out)

    @classmethod
    def from_plans(cls, plans: list[Plan], layers: int, lead_layers: int | tuple[int, ...] = 0) -> "PlanArrays":
        cols: dict[str, list] = {f.name: [] for f in fields(cls)}
        for p in plans:
            for name in cols:
                if name == "recompute":
                    cols[name].append(RECOMPUTE_CODES[p.recompute])
                elif name == "recompute_layers":
                    cols[name].append(p.recompute_num_layers or 0)
                elif name == "recompute_modules":
                    cols[name].append(recompute_modules_mask(p.recompute_modules) if p.recompute == "selective" else 0)
                elif name == "etp":
                    cols[name].append(p.etp or 0)
                elif name == "dp_impl":
                    cols[name].append(DP_IMPL_CODES[p.dp_impl])
                elif name == "moe_dispatcher":
                    cols[name].append(MOE_DISPATCHER_CODES[p.moe_dispatcher])
                elif name == "stage_layout":
                    cols[name].append(None if p.stage_layers is None else (p.stage_layers, p.stage_recompute_layers))
                elif name in RANK_FIELDS:
                    continue
                else:
                    cols[name].append(float(getattr(p, name)))
        layouts = np.empty(len(plans), dtype=object)
        layouts[:] = cols.pop("stage_layout")
        return cls.from_columns(len(plans), layers, lead_layers, stage_layout=layouts,
                                **{k: np.array(v) for k, v in cols.items() if k not in RANK_FIELDS})

    def row(self, i: int) -> Plan:
        """Plan i back as a pydantic Plan (for reports and Megatron emission)."""
        rc = RECOMPUTE_NAMES[int(self.recompute[i])]
        k = int(self.recompute_layers[i]) if rc == "full" and self.recompute_layers[i] > 0 else None
        modules = recompute_modules_from_mask(int(self.recompute_modules[i])) if rc == "selective" else None
        pp, vpp = int(self.pp[i]), int(self.vpp[i])
        explicit = self.stage_layout[i]
        if explicit is not None:
            stage_layers, stage_recompute = explicit
        else:  # the default split, written out when it is not even (Megatron needs to be told)
            stage_layers = balanced_layout(int(self.num_layers[i]), pp, vpp)
            stage_layers = None if stage_layers == even_layout(int(self.num_layers[i]), pp, vpp) else stage_layers
            stage_recompute = None
        return Plan(
            stage_layers=stage_layers, stage_recompute_layers=stage_recompute,
            tp=int(self.tp[i]), pp=int(self.pp[i]), dp=int(self.dp[i]), cp=int(self.cp[i]),
            ep=int(self.ep[i]), etp=None if self.etp[i] == self.tp[i] else int(self.etp[i]),
            dp_impl=DP_IMPL_NAMES[int(self.dp_impl[i])],
            moe_dispatcher=DISPATCHER_NAMES[int(self.moe_dispatcher[i])], micro_batch=int(self.micro_batch[i]),
            global_batch=int(self.global_batch[i]), vpp=int(self.vpp[i]),
            sequence_parallel=bool(self.sequence_parallel[i]), recompute=rc,
            recompute_num_layers=k, recompute_modules=modules,
            zero_stage=int(self.zero_stage[i]), offload_weights=float(self.offload_weights[i]),
            offload_activations=float(self.offload_activations[i]),
            offload_optimizer=float(self.offload_optimizer[i]),
            tp_comm_overlap=bool(self.tp_comm_overlap[i]), dp_comm_overlap=bool(self.dp_comm_overlap[i]),
            moe_a2a_overlap=bool(self.moe_a2a_overlap[i]),
            cross_entropy_fusion=bool(self.cross_entropy_fusion[i]),
            grad_reduce_in_bf16=bool(self.grad_reduce_in_bf16[i]),
            fp8_param_gather=bool(self.fp8_param_gather[i]))

    def take(self, index: np.ndarray) -> "PlanArrays":
        return PlanArrays(**{f.name: getattr(self, f.name)[index] for f in fields(self)})


def with_every_rank(P: PlanArrays, layers: int) -> PlanArrays:
    """`P` with every pipeline rank of every row as a representative (column j: rank j mod pp),
    for costs that depend on which layers a rank holds, not only on how many (a hybrid stack's
    blocks, planner.analytical.hybrid.rank_excess_s). Default splits are grouped by (pp, vpp),
    each group's `balanced_layout` computed once; explicit layouts keep every rank already and
    are widened. One layer kind only (no leading dense layers). A `P` that already has every rank
    (from this function) is returned as it is."""
    p, v = P.pp.astype(int), P.vpp.astype(int)
    width = max(3, int(p.max()))
    if P.rank_index.shape[1] == width and np.array_equal(P.rank_index, np.arange(width) % p[:, None]):
        return P
    idx = np.zeros((len(P), width))
    nr = np.zeros((len(P), width))
    explicit = has_layout(P.stage_layout)
    keys = p * (v.max() + 1) + v
    for key in np.unique(keys[~explicit]):
        rows = np.flatnonzero((keys == key) & ~explicit)
        pp, vpp = int(p[rows[0]]), int(v[rows[0]])
        ranks = np.arange(width) % pp
        idx[rows] = ranks
        nr[rows] = np.asarray(rank_layers(balanced_layout(layers, pp, vpp), pp), dtype=np.float64)[ranks]
    kr = np.where((P.recompute == RECOMPUTE_CODES["full"])[:, None],
                  np.where(P.recompute_layers[:, None] > 0, np.minimum(P.recompute_layers[:, None], nr), nr), 0.0)
    for i in np.flatnonzero(explicit):  # their columns are ranks already: widen to `width`
        ranks = np.arange(width) % int(p[i])
        idx[i], nr[i], kr[i] = ranks, P.rank_layers[i][ranks], P.rank_recompute[i][ranks]
    zeros = np.zeros_like(nr)
    return replace(P, rank_index=idx, rank_layers=nr, rank_recompute=kr, rank_lead_layers=zeros,
                   rank_lead_recompute=zeros)


def sum_over_ranks(P: PlanArrays, values: np.ndarray) -> np.ndarray:
    """(n,): Σ of (n, R) per-rank `values` over each row's pipeline ranks, once each, for a `P`
    whose column j is rank j mod pp (`with_every_rank`, or every column rank 0 without pipelining)."""
    distinct = np.arange(values.shape[1])[None, :] < P.pp[:, None]
    return np.sum(np.where(distinct, values, 0.0), axis=1)


# numpy's max / argmax over a short last axis (the few representative ranks) pays a per-row cost:
# 2.2 ms / 0.9 ms on 32 k x 3 rows, against 40 us column by column, and the model takes several
# per chunk. Max is exact and the first maximum is kept, so these give numpy's numbers.
RANK_COLUMNS_BY_HAND = 16


def rank_max(values: np.ndarray) -> np.ndarray:
    """np.max(values, axis=1) of (n, R) per-rank values, computed column by column."""
    values = np.asarray(values)
    if values.ndim != 2 or not 0 < values.shape[1] <= RANK_COLUMNS_BY_HAND:
        return np.max(values, axis=1)
    out = values[:, 0].copy()
    for j in range(1, values.shape[1]):
        np.maximum(out, values[:, j], out=out)
    return out


def rank_argmax(values: np.ndarray) -> np.ndarray:
    """np.argmax(values, axis=1) (the first maximum of each row), computed column by column; a
    row with a NaN is left to numpy (which returns the first NaN)."""
    values = np.asarray(values)
    if values.ndim != 2 or not 0 < values.shape[1] <= RANK_COLUMNS_BY_HAND:
        return np.argmax(values, axis=1)
    best = values[:, 0].copy()
    index = np.zeros(len(values), dtype=np.intp)
    for j in range(1, values.shape[1]):
        column = values[:, j]
        index[column > best] = j
        np.maximum(best, column, out=best)
    if np.isnan(best).any():
        return np.argmax(values, axis=1)
    return index


def sequence_parallel_on(P) -> np.ndarray:
    """Rows (of PlanArrays, or its per-rank columns) whose layers run Megatron's sequence
    parallelism: sp set and tp > 1 (with tp 1 there is no sequence to split, and no all-gather)."""
    return (P.sequence_parallel > 0) & (P.tp > 1)


def module_selected(modules: np.ndarray, name: str) -> np.ndarray:
    """Rows (of a `recompute_modules` bit-mask column) whose selective recompute includes `name`."""
    # integer AND: 20x faster than floor/mod on float columns (the search calls this on 10^6 rows)
    return (np.asarray(modules).astype(np.int64) & RECOMPUTE_MODULE_BITS[name]) != 0


def has_layout(stage_layout: np.ndarray) -> np.ndarray:
    """Rows with an explicit layout (elementwise `is not None`, in C)."""
    return np.not_equal(stage_layout, None)


RANK_FIELDS = ("rank_index", "rank_layers", "rank_recompute", "recompute_total", "num_layers",
               "rank_lead_layers", "rank_lead_recompute", "lead_layers", "lead_recompute_total")


def uniform_chunk_recompute(stage_layers, k: int, vpp: int) -> tuple[int, ...] | None:
    """Per-virtual-stage recompute counts of an explicit layout under one count k per pipeline
    stage: Megatron's --recompute-method block recomputes the first k/vpp layers of every chunk
    (transformer_block.py), so a chunk holding fewer recomputes all of its own. None where k is
    not whole chunks (vpp does not divide it: no Megatron launch; costed per rank, min(k, load))."""
    if k <= 0 or k % vpp:
        return None
    return tuple(min(k // vpp, s) for s in stage_layers)


def _rank_columns(layers: int, cols: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Representative ranks of every row (see PlanArrays). Default split (no explicit layout):
    ranks 0, 1 (a fullest middle rank: `balanced_layout` puts the extra layers on ranks 1, 2, …
    first) and pp − 1, vectorised; rows with an explicit layout keep every rank."""
    p, v = cols["pp"], cols["vpp"]
    n = len(p)
    q = np.floor(layers / p)
    extra = layers - q * p
    even = np.mod(layers, p * v) == 0
    # extra layers go to ranks 1..pp-2 first, then rank 0, then the last rank
    middle = np.maximum(p - 2, 0)
    first_extra = extra > middle
    last_extra = extra > middle + 1
    n0 = np.where(even, layers / p, q + first_extra)
    n1 = np.where(even, layers / p, q + np.where(p > 2, extra >= 1, np.where(p == 2, last_extra, first_extra)))
    nl = np.where(even, layers / p, q + np.where(p > 1, last_extra, first_extra))
    idx = np.stack([np.zeros(n), np.minimum(1.0, p - 1), p - 1], axis=1)
    nr = np.stack([n0, n1, nl], axis=1)
    full = cols["recompute"] == 2
    k = cols["recompute_layers"]
    kr = np.where(full[:, None], np.where(k[:, None] > 0, np.minimum(k[:, None], nr), nr), 0.0)
    # total over all ranks: `extra` ranks hold q+1 layers, the rest q
    def recomputed(nl_):
        return np.where(full, np.where(k > 0, np.minimum(k, nl_), nl_), 0.0)
    total = np.where(even, p * recomputed(layers / p), extra * recomputed(q + 1) + (p - extra) * recomputed(q))
    explicit = np.flatnonzero(has_layout(cols["stage_layout"]))
    if not len(explicit):
        return {"rank_index": idx, "rank_layers": nr, "rank_recompute": kr, "recompute_total": total,
            "num_layers": np.full(n, float(layers))}
    width = max(3, max(int(p[i]) for i in explicit))
    pad = lambda a: np.concatenate([a, np.repeat(a[:, :1], width - a.shape[1], axis=1)], axis=1)
    idx, nr, kr = pad(idx), pad(nr), pad(kr)
    for i in explicit:
        stage_layers, stage_recompute = cols["stage_layout"][i]
        pp_i = int(p[i])
        if stage_recompute is None and full[i]:
            stage_recompute = uniform_chunk_recompute(stage_layers, int(k[i]), int(v[i]))
        loads = np.zeros(pp_i)
        rec = np.zeros(pp_i)
        for s, count in enumerate(stage_layers):
            loads[s % pp_i] += count
        if stage_recompute is not None:
            for s, count in enumerate(stage_recompute):
                rec[s % pp_i] += count
        elif full[i]:
            rec = np.minimum(k[i], loads) if k[i] > 0 else loads
        ranks = np.arange(width) % pp_i  # extra columns repeat ranks: harmless for a max
        idx[i], nr[i], kr[i] = ranks, loads[ranks], rec[ranks]
        total[i] = rec.sum()
    return {"rank_index": idx, "rank_layers": nr, "rank_recompute": kr, "recompute_total": total,
            "num_layers": np.full(n, float(layers))}


def _lead_rank_columns(layers: int, lead: int, cols: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Leading-dense-layer counts of every representative rank (see PlanArrays), and the rank
    columns widened where the leading layers make ranks differ.

    Explicit layouts keep every rank already: their counts come from the layout. Default splits
    (`balanced_layout`): the leading layers fall in virtual stages 0 .. lead − 1 (every stage has
    a layer), i.e. on ranks 0 .. min(lead, pp) − 1; the representatives become ranks
    0 .. min(lead, pp − 1) and pp − 1. Exact: rank j = min(lead, pp − 1), when a middle rank, is
    the lowest-index middle rank without leading layers, and balanced_layout gives middle ranks
    non-increasing loads, so it dominates every later middle rank as before. Rows are grouped by
    (pp, vpp): each group's layout is computed once."""
    n = len(cols["pp"])
    nr, kr = cols["rank_layers"], cols["rank_recompute"]
    if lead == 0:
        zeros = np.zeros_like(nr)
        return {"rank_lead_layers": zeros, "rank_lead_recompute": zeros, "lead_layers": np.zeros(n),
                "lead_recompute_total": np.zeros(n)}
    p, v = cols["pp"], cols["vpp"]
    full = cols["recompute"] == 2
    k = cols["recompute_layers"]
    explicit = has_layout(cols["stage_layout"])
    default = np.flatnonzero(~explicit)
    width = max(nr.shape[1], min(lead, int(p[default].max()) - 1) + 2 if len(default) else 0)
    pad = lambda a: np.concatenate([a, np.repeat(a[:, :1], width - a.shape[1], axis=1)], axis=1)  # noqa: E731
    idx, nr, kr = pad(cols["rank_index"]), pad(nr), pad(kr)
    dr, dk = np.zeros_like(nr), np.zeros_like(nr)
    total_dk = np.zeros(n)
    for i in np.flatnonzero(explicit):  # every rank kept (the columns past pp repeat ranks)
        stage_layers, stage_recompute = cols["stage_layout"][i]
        pp_i = int(p[i])
        if stage_recompute is None and full[i]:  # one count: the first k/vpp of every chunk
            stage_recompute = uniform_chunk_recompute(stage_layers, int(k[i]), int(v[i]))
        ranks = idx[i].astype(int)
        lead_s = stage_lead_layers(tuple(stage_layers), lead)
        d = np.asarray(rank_layers(lead_s, pp_i), dtype=np.float64)
        if stage_recompute is not None:
            # block recompute takes a stage's first layers: the leading ones first
            d_rc = np.asarray(rank_layers(stage_lead_layers(tuple(stage_layers), lead, tuple(stage_recompute)), pp_i),
                              dtype=np.float64)
        else:  # as _rank_columns: min(k, rank load) per rank (k = 0: all), leading layers first
            loads = np.asarray(rank_layers(tuple(stage_layers), pp_i), dtype=np.float64)
            rec = (np.minimum(k[i], loads) if k[i] > 0 else loads) if full[i] else np.zeros(pp_i)
            d_rc = np.minimum(rec, d)
        dr[i], dk[i] = d[ranks], d_rc[ranks]
        total_dk[i] = d_rc.sum()
    if len(default):
        # one small table per (pp, vpp) group (its layout computed once), gathered per row
        sel = slice(None) if len(default) == n else default  # (no explicit rows: no gather)
        key = p[sel] * (v[sel].max() + 1) + v[sel]
        groups, first, gid = np.unique(key, return_index=True, return_inverse=True)
        first = default[first]  # a row of each group
        t_idx, t_load, t_lead = (np.zeros((len(groups), width)) for _ in range(3))
        t_dense_load, t_dense = np.zeros((len(groups), lead)), np.zeros((len(groups), lead))
        max_v = int(v[sel].max())
        # leading layers of each chunk of each representative rank, and of every stage: one count
        # k recomputes the first k/vpp layers of every chunk, whose leading layers come first
        t_chunk_lead = np.zeros((len(groups), width, max_v))
        t_stage_lead = np.zeros((len(groups), int(p[sel].max()) * max_v))
        for g, row in enumerate(first):
            pp_g, vpp_g = int(p[row]), int(v[row])
            layout = balanced_layout(layers, pp_g, vpp_g)
            loads = np.asarray(rank_layers(layout, pp_g), dtype=np.float64)
            lead_s = stage_lead_layers(layout, lead)
            d = np.asarray(rank_layers(lead_s, pp_g), dtype=np.float64)
            reps = list(range(min(lead, pp_g - 1) + 1)) + [pp_g - 1]
            reps = np.asarray(reps + [0] * (width - len(reps)))
            t_idx[g], t_load[g], t_lead[g] = reps, loads[reps], d[reps]
            holding = np.flatnonzero(d > 0)  # at most `lead` ranks
            t_dense_load[g, :len(holding)], t_dense[g, :len(holding)] = loads[holding], d[holding]
            by_rank = np.asarray(lead_s, dtype=np.float64).reshape(vpp_g, pp_g).T  # (rank, chunk)
            t_chunk_lead[g, :, :vpp_g] = by_rank[reps]
            t_stage_lead[g, :len(lead_s)] = lead_s
        idx[sel], nr[sel], dr[sel] = t_idx[gid], t_load[gid], t_lead[gid]

        def recomputed(load, kk, is_full):
            # as the default split has it: min(k, rank load) per rank (k = 0: all)
            return np.where(is_full, np.where(kk > 0, np.minimum(kk, load), load), 0.0)
        kk, is_full = k[sel][:, None], full[sel][:, None]
        kr[sel] = recomputed(nr[sel], kk, is_full)
        dk[sel] = np.minimum(kr[sel], dr[sel])  # the leading layers are a rank's first
        total_dk[sel] = np.minimum(recomputed(t_dense_load[gid], kk, is_full), t_dense[gid]).sum(axis=1)
        # one count k that whole chunks take (Megatron's block method): k/vpp of every chunk
        vv = v[sel]
        chunked = full[sel] & (k[sel] > 0) & (np.mod(k[sel], vv) == 0) & (vv > 1)
        if chunked.any():
            per_chunk = np.where(chunked, k[sel] / vv, 0.0)
            dk[sel] = np.where(chunked[:, None], np.minimum(per_chunk[:, None, None], t_chunk_lead[gid]).sum(axis=2),
                               dk[sel])
            total_dk[sel] = np.where(chunked, np.minimum(per_chunk[:, None], t_stage_lead[gid]).sum(axis=1),
                                     total_dk[sel])
    return {"rank_index": idx, "rank_layers": nr, "rank_recompute": kr, "rank_lead_layers": dr,
            "rank_lead_recompute": dk, "lead_layers": np.full(n, float(lead)), "lead_recompute_total": total_dk}


def _interleaved_rank_columns(layers: int, dense: tuple[int, ...], cols: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The rank columns of every row (see PlanArrays) for a MoE model whose dense layers sit at
    the positions `dense`, between MoE layers (MoESpec.layer_step > 1). Which ranks hold them
    depends on each stage's bounds, so a default split (`balanced_layout`) is counted as the
    explicit layout it is: its representatives are the first and last rank and one rank per
    distinct middle rank (`_interleaved_ranks`); an explicit layout keeps every rank. Block
    recompute takes a stage's first layers (per-stage counts; one count k: the first k/vpp of every
    chunk, as Megatron runs it). Rows sharing a layout, recompute and k are costed once."""
    n = len(cols["pp"])
    p, v = cols["pp"].astype(int), cols["vpp"].astype(int)
    full = cols["recompute"] == RECOMPUTE_CODES["full"]
    k = np.where(full, cols["recompute_layers"], -1.0).astype(int)  # -1: no full recompute
    totals = {"recompute_total": np.zeros(n), "lead_recompute_total": np.zeros(n)}
    explicit = has_layout(cols["stage_layout"])
    keys: dict[tuple, np.ndarray | list[int]] = {}
    default = np.flatnonzero(~explicit)
    if len(default):  # default splits, grouped by (pp, vpp, k) without a Python loop over rows
        for pp, vpp, kk, rows in rows_by_split(p, v, k, default):
            keys[(pp, vpp, kk, None)] = rows
    for i in np.flatnonzero(explicit):
        stages, stage_rc = cols["stage_layout"][i]
        key = (int(p[i]), int(v[i]), int(k[i]), (tuple(stages), None if stage_rc is None else tuple(stage_rc)))
        keys.setdefault(key, []).append(i)
    # explicit layouts keep every rank (as in _rank_columns: reports list them all)
    tables = {key: _interleaved_ranks(*(key[3] if key[3] is not None else (balanced_layout(layers, key[0], key[1]), None)),
                                      key[0], key[2], dense, every_rank=key[3] is not None) for key in keys}
    width = max(3, max(len(t[0]) for t in tables.values()))
    out = {name: np.zeros((n, width)) for name in ("rank_index", "rank_layers", "rank_recompute",
                                                   "rank_lead_layers", "rank_lead_recompute")}
    for key, rows in keys.items():
        reps, table, (rec_total, dense_rec_total) = tables[key]
        cols_of = np.asarray(reps + [reps[0]] * (width - len(reps)))  # extra columns repeat rank 0: harmless for a max
        rows = np.asarray(rows)
        out["rank_index"][rows] = cols_of
        for name, values in zip(("rank_layers", "rank_recompute", "rank_lead_layers", "rank_lead_recompute"), table):
            out[name][rows] = np.asarray(values, dtype=np.float64)[cols_of]
        totals["recompute_total"][rows] = rec_total
        totals["lead_recompute_total"][rows] = dense_rec_total
    return {**out, **totals, "num_layers": np.full(n, float(layers)), "lead_layers": np.full(n, float(len(dense)))}


def rows_by_split(p: np.ndarray, v: np.ndarray, k: np.ndarray, rows: np.ndarray) -> list[tuple[int, int, int, np.ndarray]]:
    """`rows` grouped by their (pp, vpp, full-recompute count k >= -1) as integers: [(pp, vpp, k,
    the group's rows in ascending order)], in (pp, vpp, k) order. The triple is packed into one
    integer so that np.unique sorts numbers, not rows (np.unique(axis=0) sorts a structured view:
    ~1 s of an interleaved-MoE or hybrid oracle case), and each group's rows come from one stable
    argsort, not from a pass over every row per group."""
    pd, vd, kd = (np.asarray(x, dtype=np.int64)[rows] for x in (p, v, k))
    kd = kd + 1
    code = (pd * (int(vd.max()) + 1) + vd) * (int(kd.max()) + 1) + kd
    _, first, inverse = np.unique(code, return_index=True, return_inverse=True)
    inverse = np.ravel(inverse)
    groups = np.split(rows[np.argsort(inverse, kind="stable")], np.cumsum(np.bincount(inverse))[:-1])
    return [(int(pd[i]), int(vd[i]), int(kd[i]) - 1, g) for i, g in zip(first, groups)]


@functools.lru_cache(maxsize=4096)
def _interleaved_ranks(stages: tuple[int, ...], stage_rc: tuple[int, ...] | None, pp: int, k: int,
                       dense: tuple[int, ...], every_rank: bool = False):
    """One layout's representative ranks, the (layers, recomputed, dense, dense recomputed) of
    every rank, and the totals over ranks of the two recomputed counts. k: layers each rank
    recomputes in full (0 all, -1 none; k/vpp of every chunk, uniform_chunk_recompute, else
    min(k, its layers) where vpp does not divide k), unless per-stage counts `stage_rc` are given.
    Representatives: the first and last rank and, among the middle ones, the first of each
    distinct count tuple (a later twin has the same compute and fewer microbatches in flight:
    dominated, as in PlanArrays); with `every_rank`, all of them."""
    loads = rank_layers(stages, pp)
    held = rank_layers(stage_lead_layers(stages, dense), pp)
    if stage_rc is None and k > 0:  # one count: Megatron's first k/vpp layers of every chunk
        stage_rc = uniform_chunk_recompute(stages, k, len(stages) // pp)
    if stage_rc is not None:
        rec = rank_layers(stage_rc, pp)
        rec_dense = rank_layers(stage_lead_layers(stages, dense, stage_rc), pp)
    else:
        rec = [0 if k < 0 else (min(k, n) if k > 0 else n) for n in loads]
        rec_dense = rank_dense_prefix(stages, pp, dense, rec)
    reps, seen = [0], set()
    for r in range(1, pp - 1):
        counts = (loads[r], rec[r], held[r], rec_dense[r])
        if every_rank or counts not in seen:
            seen.add(counts)
            reps.append(r)
    if pp > 1:
        reps.append(pp - 1)
    return reps, (loads, rec, held, rec_dense), (sum(rec), sum(rec_dense))
