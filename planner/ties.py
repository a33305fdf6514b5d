"""How near-equal plans are ranked: the simpler one first.

Two plans whose predicted objective (time per token, or step time) is equal or within
TIE_REL_TOL are a tie: the model cannot tell them apart, so the plan with fewer non-trivial
parallel dimensions wins (cp 1, ep 1, no interleaving), then the smaller cp, ep, interleaving
and tp. Ranking (`rank_with_ties`): take the fastest remaining plan's objective b; among the
remaining plans within b·(1 + TIE_REL_TOL) pick the simplest (then the faster, then the earlier in
the incoming order, which is already deterministic); repeat. The search and the brute-force
oracle both apply it to their objective-ordered lists of distinct layouts.
"""
from __future__ import annotations

from typing import Sequence

from planner.plan import Plan

TIE_REL_TOL = 1e-3


def simplicity_key(plan: Plan) -> tuple[int, ...]:
    """Smaller is simpler: the count of extra parallel dimensions in use, then their sizes."""
    # an uneven pipeline layout (explicit stage_layers, issue 8) counts as one more dimension
    extra = int(plan.cp > 1) + int(plan.ep > 1) + int(plan.vpp > 1) + int(plan.stage_layers is not None)
    return (extra, plan.cp, plan.ep, plan.vpp, plan.tp)


def needs_more(objectives: Sequence[float], top_k: int, exhausted: bool) -> bool:
    """Whether an objective-ordered prefix of the candidates may miss a plan that ties into the
    top K: every plan within TIE_REL_TOL of the K-th objective must be in it (the K-th pick's
    window never starts above the K-th objective), so the prefix must end above that bound."""
    if exhausted or len(objectives) < top_k:
        return False
    return objectives[-1] <= objectives[top_k - 1] * (1.0 + TIE_REL_TOL)


def rank_with_ties(objectives: Sequence[float], plans: Sequence[Plan], top_k: int | None = None) -> list[int]:
    """Indices into the objective-ordered inputs, re-ranked with the tie rule; the first top_k."""
    remaining = list(range(len(plans)))
    picked: list[int] = []
    limit = len(plans) if top_k is None else min(top_k, len(plans))
    while len(picked) < limit:
        bound = min(objectives[i] for i in remaining) * (1.0 + TIE_REL_TOL)
        window = [i for i in remaining if objectives[i] <= bound]
        best = min(window, key=lambda i: (simplicity_key(plans[i]), objectives[i], i))
        picked.append(best)
        remaining.remove(best)
    return picked
