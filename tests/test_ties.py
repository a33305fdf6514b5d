"""Ties: near-equal plans (within 0.1 %) rank simplest first, in the search and in the oracle."""
import pytest

from hardware import load_system
from planner.bruteforce import brute_force
from planner.model import load_model
from planner.plan import JobSpec, Plan
from planner.search import plan
from planner.ties import TIE_REL_TOL, needs_more, rank_with_ties, simplicity_key


def P(**kw) -> Plan:
    base = dict(tp=1, dp=8, global_batch=64)
    base.update(kw)
    return Plan(**base)


def test_simplicity_counts_extra_dimensions_then_sizes():
    assert simplicity_key(P()) < simplicity_key(P(tp=2, dp=4))            # smaller tp
    assert simplicity_key(P(tp=8, dp=1)) < simplicity_key(P(cp=2, dp=4))  # cp 1 beats any tp
    assert simplicity_key(P(cp=2, dp=4)) < simplicity_key(P(cp=2, dp=4, ep=2))


def test_rank_with_ties_prefers_the_simpler_of_near_equal_plans():
    cp2, cp1, tp8 = P(cp=2, dp=4), P(), P(tp=8, dp=1)
    # cp2 and cp1 within 0.1 %: cp1 first; tp8 0.2 % slower: not a tie, stays behind
    assert rank_with_ties([1.0, 1.0005, 1.002], [cp2, cp1, tp8]) == [1, 0, 2]
    # a complex plan more than 0.1 % faster keeps its place
    assert rank_with_ties([1.0, 1.0 + 1.01 * TIE_REL_TOL], [cp2, cp1]) == [0, 1]
    assert rank_with_ties([1.0, 1.0, 1.0], [cp2, cp1, tp8], top_k=1) == [1]


def test_needs_more_until_the_prefix_passes_the_tie_window():
    assert needs_more([1.0, 1.0, 1.0005], top_k=2, exhausted=False)
    assert not needs_more([1.0, 1.0, 1.01], top_k=2, exhausted=False)
    assert not needs_more([1.0, 1.0, 1.0005], top_k=2, exhausted=True)


def test_default_example_no_longer_picks_cp2():
    # GPT-3 175B on 1024 A100, batch 1536 (README's default): cp 2 used to tie cp 1 to the
    # microsecond and win; any cp-2 plan within the tie window must now rank behind cp 1
    model, system, job = load_model("gpt3-175b"), load_system("a100-80g", 1024), JobSpec(global_batch=1536)
    found = plan(model, system, job, top_k=3)
    best = found.ranked[0]
    assert best.plan.cp == 1
    for other in found.ranked[1:]:
        if other.plan.cp > 1:
            assert other.objective >= best.objective
    oracle = brute_force(model, system, job, top_k=3)
    assert [r.plan for r in found.ranked] == oracle.plans
