"""The evidence gate of `planner plan` (planner/recommend.py) against the brute-force oracle."""
from __future__ import annotations

import pytest

import planner.evidence as evidence
import planner.recommend as recommend_mod
from hardware import load_system
from planner.bruteforce import brute_force
from planner.evidence import families, family_of_plan
from planner.model import ModelSpec, MoESpec
from planner.plan import JobSpec
from planner.recommend import recommend
from planner.search import plan as search

TINY_MOE = ModelSpec(name="tiny-moe", layers=8, hidden=1024, heads=16, seq_length=1024, vocab=32000,
                     moe=MoESpec(num_experts=8, top_k=2))
# a case whose best family leads every other family by > 20 % (no tie window in the way)
SYSTEM = load_system("h100-sxm", 16)
JOB = JobSpec(global_batch=16)


def _table_without(family: str) -> dict:
    """An evidence table in which every MoE family but `family` has one published run."""
    return {label: {"runs": 1, "mean_abs_error": 0.1, "mean_error": 0.0, "examples": []}
            for label in families(True) if label != family}


def test_restricted_search_returns_only_that_family():
    for label, restrict in families(True).items():
        for r in search(TINY_MOE, SYSTEM, JOB, top_k=3, restrict=restrict).ranked:
            assert family_of_plan(True, r.plan) == label


def test_gate_recommends_the_best_measured_plan_and_names_the_faster_one(monkeypatch):
    best = search(TINY_MOE, SYSTEM, JOB, top_k=1).best
    unmeasured = family_of_plan(True, best.plan)
    monkeypatch.setattr(evidence, "load_table", lambda: _table_without(unmeasured))
    oracle = brute_force(TINY_MOE, SYSTEM, JOB, top_k=1,
                         keep=lambda p: family_of_plan(True, p) != unmeasured)
    monkeypatch.setattr(recommend_mod, "UNMEASURED_ADVANTAGE_LIMIT", 0.0)
    res = recommend(TINY_MOE, SYSTEM, JOB, top_k=3)
    assert oracle.objectives[0] > 1.01 * best.objective  # the case separates the families
    assert res.best.objective == pytest.approx(oracle.objectives[0], rel=1e-9)
    assert family_of_plan(True, res.best.plan) != unmeasured
    assert res.model_only and res.model_only[0].objective == pytest.approx(best.objective, rel=1e-9)
    gain = 1 - best.objective / oracle.objectives[0]
    assert res.stats["evidence_gate"]["model_only_advantage"] == pytest.approx(gain, rel=1e-9)
    # below the limit the model's own ranking stands, and --allow-unmeasured always keeps it
    monkeypatch.setattr(recommend_mod, "UNMEASURED_ADVANTAGE_LIMIT", gain * 1.01)
    assert recommend(TINY_MOE, SYSTEM, JOB, top_k=1).best.objective == pytest.approx(best.objective, rel=1e-9)
    monkeypatch.setattr(recommend_mod, "UNMEASURED_ADVANTAGE_LIMIT", 0.0)
    kept = recommend(TINY_MOE, SYSTEM, JOB, top_k=1, allow_unmeasured=True)
    assert kept.best.objective == pytest.approx(best.objective, rel=1e-9) and not kept.model_only


def test_measured_best_family_is_never_gated(monkeypatch):
    table = {label: {"runs": 1, "mean_abs_error": 0.1, "mean_error": 0.0, "examples": []}
             for label in families(True)}
    monkeypatch.setattr(evidence, "load_table", lambda: table)
    monkeypatch.setattr(recommend_mod, "UNMEASURED_ADVANTAGE_LIMIT", 0.0)
    res = recommend(TINY_MOE, SYSTEM, JOB, top_k=2)
    assert res.best.objective == pytest.approx(search(TINY_MOE, SYSTEM, JOB, top_k=1).best.objective, rel=1e-9)
    assert not res.model_only and "evidence_searches_s" not in res.stats
