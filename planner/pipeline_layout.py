"""Pipeline layouts: layers per virtual stage, and the Megatron flags that express them.

A layout is a tuple of transformer-layer counts, one per virtual stage, in Megatron's order:
virtual stage s runs on pipeline rank s % pp as model chunk s // pp
(megatron/core/transformer/pipeline_parallel_layer_layout.py, 1-D → 2-D conversion). The
embedding sits on stage 0 and the LM head + loss on stage pp·vpp − 1.

Megatron-core 0.19.2 rules (transformer_config.py __post_init__, transformer_block.py
get_num_layers_to_build), read from its source:
- even split: layers % (pp·vpp) == 0;
- --account-for-embedding-in-pipeline-split / --account-for-loss-in-pipeline-split: layers + e + l
  divisible by pp, and that per rank divisible by vpp; every virtual stage gets
  (layers + e + l)/(pp·vpp), the first virtual stage one fewer (e), the last one fewer (l);
- --decoder-first/last-pipeline-num-layers F, Lt: F and Lt > 0 and divisible by vpp; the middle
  pp − (#given) ranks split the rest evenly, each divisible by vpp; a rank's layers split evenly
  over its vpp chunks; cannot be combined with account-for-*;
- --pipeline-model-parallel-layout "E...|...|...L": any layout ('t' a layer, '|' between
  stages, 'E' first, 'L' last, stages may be empty).
"""
from __future__ import annotations

import re

from hardware.errors import SpecError


def rank_of_stage(stage: int, pp: int) -> int:
    return stage % pp


def rank_layers(layout: tuple[int, ...], pp: int) -> list[int]:
    """Layers each pipeline rank holds (summed over its virtual stages)."""
    out = [0] * pp
    for s, n in enumerate(layout):
        out[s % pp] += n
    return out


def stage_lead_layers(layout: tuple[int, ...], lead: int | tuple[int, ...],
                      firsts: tuple[int, ...] | None = None) -> tuple[int, ...]:
    """How many of each virtual stage's layers (with `firsts`, of its first firsts[s] layers) are
    dense layers of a MoE model: its first `lead` layers, or (a tuple) the layers at those
    positions (interleaved). Megatron numbers layers in virtual-stage order: stage s = chunk·pp
    + rank starts at the sum of the stages before it (transformer_layer.py,
    get_transformer_layer_offset), so the leading layers fill stage 0, then stage 1, ..."""
    dense = set(lead) if isinstance(lead, tuple) else None
    out, start = [], 0
    for s, n in enumerate(layout):
        m = n if firsts is None else min(n, firsts[s])
        if dense is None:
            out.append(max(0, min(m, lead - start)))
        else:
            out.append(sum(1 for i in range(start, start + m) if i in dense))
        start += n
    return tuple(out)


def rank_dense_prefix(layout: tuple[int, ...], pp: int, dense: tuple[int, ...], counts: list[int]) -> list[int]:
    """Per pipeline rank, how many of its first counts[r] layers, in its chunks' order (the order
    Megatron's block recompute takes them), are at the `dense` positions."""
    starts = [sum(layout[:s]) for s in range(len(layout))]
    dense_set = set(dense)
    out = []
    for r in range(pp):
        order = [i for s in range(r, len(layout), pp) for i in range(starts[s], starts[s] + layout[s])]
        out.append(sum(1 for i in order[:counts[r]] if i in dense_set))
    return out


def even_layout(layers: int, pp: int, vpp: int) -> tuple[int, ...] | None:
    stages = pp * vpp
    return (layers // stages,) * stages if layers % stages == 0 else None


def _chunks(n: int, vpp: int, short_first: bool) -> list[int]:
    """n layers over vpp chunks as evenly as possible; the short chunks first or last."""
    q, e = divmod(n, vpp)
    big = [q + 1] * e
    small = [q] * (vpp - e)
    return small + big if short_first else big + small


def balanced_layout(layers: int, pp: int, vpp: int) -> tuple[int, ...]:
    """The default split of `layers` over pp·vpp virtual stages: even when it divides; otherwise
    rank loads differ by at most one, with the extra layers on the middle ranks first (the first
    rank holds the most in-flight activations and the embedding, the last the LM head), and a
    rank's short chunks next to the embedding (rank 0: chunk 0) or the loss (last rank: its last
    chunk). For 126 layers on pp 8 vpp 8 this is Megatron's account-for-embedding-and-loss
    split (1, 2, ..., 2, 1)."""
    even = even_layout(layers, pp, vpp)
    if even is not None:
        return even
    q, extra = divmod(layers, pp)
    order = list(range(1, pp - 1)) + [0] + ([pp - 1] if pp > 1 else [])
    loads = [q] * pp
    for r in order[:extra]:
        loads[r] += 1
    per_rank = [_chunks(n, vpp, short_first=(r == 0)) for r, n in enumerate(loads)]
    return tuple(per_rank[s % pp][s // pp] for s in range(pp * vpp))


def layout_from_flags(layers: int, pp: int, vpp: int, *, account_embedding: bool = False,
                      account_loss: bool = False, first: int | None = None,
                      last: int | None = None) -> tuple[int, ...]:
    """The layout Megatron builds from the named flags (SpecError when Megatron rejects them)."""
    stages = pp * vpp
    if (first is not None or last is not None) and (account_embedding or account_loss):
        raise SpecError("pipeline layout: decoder-first/last cannot be combined with account-for-*")
    if first is not None or last is not None:
        loads: list[int | None] = [None] * pp
        rest, middle = layers, pp
        for rank, n, name in ((0, first, "first"), (pp - 1, last, "last")):
            if n is None:
                continue
            if n <= 0 or n % vpp:
                raise SpecError(f"pipeline layout: decoder-{name}-pipeline-num-layers ({n}) must be > 0 "
                                f"and divisible by vpp ({vpp})")
            loads[rank] = n
            rest -= n
            middle -= 1
        if bool(rest) != bool(middle) or (middle and (rest % middle or (rest // middle) % vpp)):
            raise SpecError(f"pipeline layout: {rest} middle layers do not split evenly over {middle} "
                            f"middle ranks × vpp {vpp}")
        loads = [n if n is not None else rest // middle for n in loads]
        return tuple(loads[s % pp] // vpp for s in range(stages))
    total = layers + int(account_embedding) + int(account_loss)
    if total % pp or (total // pp) % vpp:
        raise SpecError(f"pipeline layout: layers + embedding/loss ({total}) must be divisible by pp·vpp "
                        f"({pp}·{vpp})")
    out = [total // stages] * stages
    if account_embedding:
        out[0] -= 1
    if account_loss:
        out[-1] -= 1
    if min(out) < 0:
        raise SpecError("pipeline layout: a virtual stage would get fewer than 0 layers")
    return tuple(out)


def layout_string(layout: tuple[int, ...], mtp_layers: int = 0) -> str:
    """--pipeline-model-parallel-layout: 'E' + stages of 't' separated by '|' + 'L', with runs of
    equal stages written Megatron's way, (t*n|)*k."""
    def stage(n: int) -> str:
        return f"t*{n}" if n > 1 else "t" * n

    runs: list[list[int]] = []  # [layers, count]
    for n in layout[:-1]:  # the last stage is written on its own, followed by the loss
        if runs and runs[-1][0] == n:
            runs[-1][1] += 1
        else:
            runs.append([n, 1])
    text = "".join(f"({stage(n)}|)*{k}" if k > 1 else f"{stage(n)}|" for n, k in runs)
    # MTP modules run after the last decoder layer, in the last stage (Megatron's layout rules)
    return "E" + text + stage(layout[-1]) + "m" * mtp_layers + "L"


def plan_layout(plan, layers: int) -> tuple[int, ...]:
    """The layout a Plan runs: its explicit stage_layers, else the default (balanced) split."""
    return tuple(plan.stage_layers) if plan.stage_layers is not None else balanced_layout(layers, plan.pp, plan.vpp)


def fullest_rank_layers(plan, layers: int) -> int:
    """Layers the fullest pipeline rank of a Plan holds (over its virtual stages): a recompute count
    of at least this many is every layer."""
    return max(rank_layers(plan_layout(plan, layers), plan.pp))


def pipeline_args(plan, layers: int, mtp_layers: int = 0) -> list[tuple[str, object]]:
    """Megatron's pipeline-layout flags for `plan` as (flag, value) pairs (value None: a switch):
    the virtual-stage count and the simplest layout flag set (`megatron_layout_args`). A layout
    string already fixes vpp, and Megatron refuses both at once (arguments.py)."""
    flags = megatron_layout_args(layers, plan.pp, plan.vpp, plan_layout(plan, layers), mtp_layers)
    out: list[tuple[str, object]] = []
    if plan.vpp > 1 and "--pipeline-model-parallel-layout" not in flags:
        out.append(("--num-virtual-stages-per-pipeline-rank", plan.vpp))
    group = int(vp_microbatch_group(plan.num_microbatches, plan.pp)) if plan.vpp > 1 else plan.pp
    if group != plan.pp:  # pp does not divide the microbatches: Megatron's default N = pp would refuse
        out.append(("--microbatch-group-size-per-virtual-pipeline-stage", group))
    i = 0
    while i < len(flags):
        if i + 1 < len(flags) and not flags[i + 1].startswith("--"):
            out.append((flags[i], flags[i + 1]))
            i += 2
        else:
            out.append((flags[i], None))
            i += 1
    return out


def recompute_per_chunk(plan) -> int | None:
    """--recompute-num-layers (block) for an explicit per-stage recompute, else None."""
    return max(plan.stage_recompute_layers) if plan.stage_recompute_layers else None


def layout_not_expressible(plan, layers: int) -> list[str]:
    """Why Megatron cannot run the plan's layout (empty: it can)."""
    from planner.plan import compress_runs
    reasons = []
    if plan.stage_layers is None and layers < plan.pp * plan.vpp:
        stages = plan.pp * plan.vpp
        # NVIDIA's Llama 3.1 405B recipe: 126 layers on 128 stages, the first holding the embedding
        # and the last the loss alone (--account-for-embedding/loss-in-pipeline-split)
        hint = (f"; with the first and last stages holding only the embedding and the loss, as NVIDIA's "
                f"recipes do: --pipeline-layout 0,1x{layers},0" if stages == layers + 2 else "")
        reasons.append(f"layers ({layers}) must be at least pp*vpp ({plan.pp}*{plan.vpp}){hint}")
    if plan.stage_layers is not None and sum(plan.stage_layers) != layers:
        reasons.append(f"stage_layers sum to {sum(plan.stage_layers)}, the model has {layers} layers")
    if plan.stage_recompute_layers:
        k = max(plan.stage_recompute_layers)
        if tuple(plan.stage_recompute_layers) != tuple(min(k, n) for n in plan.stage_layers):
            reasons.append("stage_recompute_layers (--stage-recompute-layers): Megatron's --recompute-method block "
                           f"recomputes min(k, layers) of every virtual stage for one k (k {k}: "
                           f"{compress_runs(min(k, n) for n in plan.stage_layers)})")
    return reasons


def layout_string_stages(text: str) -> int:
    """Virtual stages in a --pipeline-model-parallel-layout string, unrolled as Megatron does
    (PipelineParallelLayerLayout.parse_str_to_list: (..)*n groups, then x*n runs)."""
    return _unroll_layout_string(text).count("|") + 1


# The longest unrolled layout string read (symbols): far above any model's layers and stages
# (MAX_LAYERS 10,000), far below what '(t|)*99999999' would allocate
MAX_UNROLLED_LAYOUT = 1 << 20


def _unroll_layout_string(text: str) -> str:
    """Megatron's unrolling (PipelineParallelLayerLayout.parse_str_to_list): '(..)*n' groups first,
    then 'x*n' runs of one symbol; ',' is only a separator."""
    def repeat(g) -> str:
        if len(g.group(1)) * int(g.group(2)) > MAX_UNROLLED_LAYOUT:
            raise SpecError(f"pipeline layout {text!r}: {g.group(0)!r} unrolls to over {MAX_UNROLLED_LAYOUT:,} "
                            "symbols; no model has that many layers or stages")
        return g.group(1) * int(g.group(2))
    text = text.replace(",", "").replace(" ", "")
    text = re.sub(r"\(([^()]+)\)\*(\d+)", repeat, text)
    text = re.sub(r"([A-Za-z])\*(\d+)", repeat, text)
    if len(text) > MAX_UNROLLED_LAYOUT:
        raise SpecError(f"pipeline layout: unrolls to over {MAX_UNROLLED_LAYOUT:,} symbols; no model has that many "
                        "layers or stages")
    return text


def layout_string_problems(text: str, mtp_layers: int = 0) -> list[str]:
    """What Megatron's layout check (PipelineParallelLayerLayout.validate_layer_layout) refuses in a
    user's layout string: the embedding once, first; the loss once, last; as many MTP modules ('m')
    as the model has."""
    flat = _unroll_layout_string(text)
    stages = flat.split("|")
    out = []
    if flat.count("E") != 1 or not stages[0].startswith("E"):
        out.append("the embedding 'E' must come once, first in the first stage")
    if flat.count("L") != 1 or not stages[-1].endswith("L"):
        out.append("the loss 'L' must come once, last in the last stage")
    if flat.count("m") != mtp_layers:
        out.append(f"it has {flat.count('m')} MTP modules 'm'; the model has {mtp_layers}")
    return out


def layout_from_string(text: str) -> tuple[int, ...]:
    """Decoder layers per virtual stage of a --pipeline-model-parallel-layout string: 't' is a
    decoder layer, '|' a stage boundary, 'E' the embedding, 'L' the loss, 'm' an MTP module (none
    of these three is a decoder layer). 'Et|(tt|)*30L' → (1, 2 × 30, 0)."""
    flat = _unroll_layout_string(text)
    if not flat or set(flat) - set("tEmL|"):
        shown = text if len(text) <= 60 else text[:57] + "..."
        raise SpecError(f"pipeline layout {shown!r}: symbols must be t, E, L, m, '|', '(..)*n' or 'x*n'")
    return tuple(stage.count("t") for stage in flat.split("|"))


def megatron_layout_args(layers: int, pp: int, vpp: int, layout: tuple[int, ...] | None,
                         mtp_layers: int = 0) -> list[str]:
    """The simplest flag set that makes Megatron build `layout` (None or even: no flag)."""
    if layout is None or layout == even_layout(layers, pp, vpp):
        return []
    for emb, loss in ((True, False), (False, True), (True, True)):
        try:
            if layout_from_flags(layers, pp, vpp, account_embedding=emb, account_loss=loss) == layout:
                return (["--account-for-embedding-in-pipeline-split"] if emb else []) + \
                       (["--account-for-loss-in-pipeline-split"] if loss else [])
        except SpecError:
            pass
    loads = rank_layers(layout, pp)
    if pp > 2 or (pp == 2 and vpp >= 1):
        for first, last in ((loads[0], None), (None, loads[-1]), (loads[0], loads[-1])):
            try:
                if layout_from_flags(layers, pp, vpp, first=first, last=last) == layout:
                    return ((["--decoder-first-pipeline-num-layers", str(first)] if first else [])
                            + (["--decoder-last-pipeline-num-layers", str(last)] if last else []))
            except SpecError:
                pass
    return ["--pipeline-model-parallel-layout", layout_string(layout, mtp_layers)]


__all__ = ["layout_string_problems", "stage_lead_layers", "rank_dense_prefix", "pipeline_args", "plan_layout", "layout_not_expressible", "recompute_per_chunk", "balanced_layout", "even_layout", "layout_from_flags", "layout_from_string", "layout_string", "megatron_layout_args",
           "rank_layers", "rank_of_stage"]


def vp_microbatch_group(m, pp):
    """N, the microbatches each virtual stage runs in a row under Megatron's interleaved schedule
    (--microbatch-group-size-per-virtual-pipeline-stage; None means N = pp): pp when pp divides
    the m microbatches, else the smallest N in [pp, m] whose last group m % N is 0 or >= pp
    (megatron/core/pipeline_parallel/schedules.py, forward_backward_pipelining_with_interleaving:
    N outside [pp, m] or a last group in (0, pp) is refused). The smallest such N keeps the
    warm-up, (v−1)·N + 2(pp−1) chunk-forwards on rank 0, and so the in-flight activations, least.
    Elementwise over arrays; m < pp gives pp (no interleaved schedule runs then)."""
    import numpy as np
    m_arr, p_arr = np.broadcast_arrays(np.asarray(m, dtype=np.float64), np.asarray(pp, dtype=np.float64))
    out = p_arr.copy()
    # (m or pp not whole: no Megatron schedule, N = pp is kept)
    odd = np.flatnonzero((m_arr >= p_arr) & (np.mod(m_arr, p_arr) != 0)
                         & (m_arr == np.trunc(m_arr)) & (p_arr == np.trunc(p_arr)))
    if len(odd):
        # each distinct (m, pp) pair searched once (packed into one integer: np.unique sorts
        # numbers), its N written to its rows through the inverse, in one pass (a mask per pair
        # had cost a pass over every row per pair)
        m_odd, p_odd = m_arr.ravel()[odd].astype(np.int64), p_arr.ravel()[odd].astype(np.int64)
        _, first, which = np.unique(m_odd * (int(p_odd.max()) + 1) + p_odd, return_index=True, return_inverse=True)
        found = [next((n for n in range(pi + 1, mi + 1) if mi % n == 0 or mi % n >= pi), max(pi, mi))
                 for mi, pi in ((int(m_odd[i]), int(p_odd[i])) for i in first)]
        out.ravel()[odd] = np.asarray(found, dtype=np.float64)[np.ravel(which)]
    return out if out.shape else float(out)
