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


@pytest.fixture(scope="module")
def model_best():
    """The search's best plan of the TINY_MOE job, no gate (read-only; two tests compare with it)."""
    return search(TINY_MOE, SYSTEM, JOB, top_k=1).best


def _table_without(family: str) -> dict:
    """An evidence table in which every MoE family but `family` has one published run."""
    return {label: {"runs": 1, "mean_abs_error": 0.1, "mean_error": 0.0, "examples": []}
            for label in families(True) if label != family}


def test_restricted_search_returns_only_that_family():
    for label, restrict in families(True).items():
        for r in search(TINY_MOE, SYSTEM, JOB, top_k=3, restrict=restrict).ranked:
            assert family_of_plan(True, r.plan) == label


def test_gate_recommends_the_best_measured_plan_and_names_the_faster_one(monkeypatch, model_best):
    best = model_best
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


def test_measured_best_family_is_never_gated(monkeypatch, model_best):
    table = {label: {"runs": 1, "mean_abs_error": 0.1, "mean_error": 0.0, "examples": []}
             for label in families(True)}
    monkeypatch.setattr(evidence, "load_table", lambda: table)
    monkeypatch.setattr(recommend_mod, "UNMEASURED_ADVANTAGE_LIMIT", 0.0)
    res = recommend(TINY_MOE, SYSTEM, JOB, top_k=2)
    assert res.best.objective == pytest.approx(model_best.objective, rel=1e-9)
    assert not res.model_only and "evidence_searches_s" not in res.stats


# --- the job gate: the bar against the fastest published run of the same job ----------------
from planner.analytical import estimate  # noqa: E402
from planner.evidence import job_key  # noqa: E402
from planner.plan import Plan  # noqa: E402

# a valid but slow layout of the TINY_MOE job (full recompute, no expert parallelism)
SLOW = Plan(tp=1, pp=1, dp=16, micro_batch=1, global_batch=16, recompute="full", zero_stage=1)


@pytest.fixture(scope="module")
def raw_top3():
    """`recommend` of the TINY_MOE job, top 3, on the real reference data (no published run of the
    job): computed once, read by the two tests that publish a run against it."""
    return recommend(TINY_MOE, SYSTEM, JOB, top_k=3)


def _run(run_id: str, measured_s: float, plan: Plan, dtype: str = "bf16", imbalance: float = 1.0) -> dict:
    return {"id": run_id, "dtype": dtype, "moe_load_imbalance": imbalance, "plan": plan.short(),
            "measured_s": measured_s, "predicted_s": measured_s,
            "plan_fields": plan.model_dump(mode="json", exclude_defaults=True)}


def _published(monkeypatch, measured_s: float, plan: Plan = SLOW, dtype: str = "bf16") -> None:
    """Pretend the reference data holds one published run of the TINY_MOE job."""
    runs = [_run("fake_run", measured_s, plan, dtype)]
    jobs = {job_key(TINY_MOE, SYSTEM.accelerator.name, SYSTEM.num_gpus, JOB.global_batch): runs}
    monkeypatch.setattr(evidence, "load_jobs", lambda: jobs)


def test_job_gate_ranks_the_published_layout_first_when_the_model_claims_more(raw_top3):
    """Every plan the model ranks is more than 15 % faster than the published run: the run's own
    layout, re-scored by the exact model, leads and the model's plans become model-only."""
    raw = raw_top3
    slow_est = estimate(TINY_MOE, SYSTEM, SLOW, JOB)
    assert slow_est.feasible and slow_est.step_time_s > raw.ranked[-1].objective
    with pytest.MonkeyPatch.context() as mp:
        _published(mp, measured_s=2.0 * raw.ranked[-1].objective)
        res = recommend(TINY_MOE, SYSTEM, JOB, top_k=3)
        assert res.best.plan == SLOW and res.best.objective == pytest.approx(slow_est.step_time_s, rel=1e-12)
        assert [r.plan for r in res.model_only] == [r.plan for r in raw.ranked]
        gate = res.stats["job_gate"]
        assert gate["recommended_from"] == "fake_run"
        assert gate["model_best_ratio"] == pytest.approx(raw.best.objective / (2.0 * raw.ranked[-1].objective))
        # --allow-unmeasured keeps the model's ranking
        kept = recommend(TINY_MOE, SYSTEM, JOB, top_k=3, allow_unmeasured=True)
        assert [r.plan for r in kept.ranked] == [r.plan for r in raw.ranked] and "job_gate" not in kept.stats


def test_job_gate_keeps_the_models_plans_within_the_bar(raw_top3):
    """A bar between the model's first and second plan: the second leads, the first is
    model-only; a bar below the first changes nothing."""
    raw = raw_top3
    first, second = raw.ranked[0].objective, raw.ranked[1].objective
    assert second > first
    bar = (first + second) / 2
    with pytest.MonkeyPatch.context() as mp:
        _published(mp, measured_s=bar / (1 - recommend_mod.UNMEASURED_ADVANTAGE_LIMIT))
        res = recommend(TINY_MOE, SYSTEM, JOB, top_k=3)
        # the model's plans within the bar lead; the published layout follows at its measured time
        assert [r.plan for r in res.ranked] == [r.plan for r in raw.ranked[1:]] + [SLOW]
        assert [r.plan for r in res.model_only] == [raw.ranked[0].plan]
        assert res.stats["job_gate"]["recommended_from"] == "search"
        _published(mp, measured_s=0.99 * first / (1 - recommend_mod.UNMEASURED_ADVANTAGE_LIMIT))
        same = recommend(TINY_MOE, SYSTEM, JOB, top_k=3)
        assert [r.plan for r in same.ranked] == [r.plan for r in raw.ranked] and not same.model_only


def test_job_gate_orders_a_published_layout_by_its_measured_time_among_the_models_plans():
    """The gate had recommended the model's plans within the bar even where the published layout
    was measured faster than they are predicted (Qwen3-235B on 256 GB200 in BF16: a plan predicted
    at 30.98 s over the recipe measured at 26.66 s): it now ranks among them at its measurement."""
    raw = recommend(TINY_MOE, SYSTEM, JOB, top_k=12)
    objectives = [r.objective for r in raw.ranked]
    measured = (objectives[9] + objectives[10]) / 2
    assert (1 - recommend_mod.UNMEASURED_ADVANTAGE_LIMIT) * measured > objectives[0]  # the gate acts
    with pytest.MonkeyPatch.context() as mp:
        _published(mp, measured_s=measured)
        res = recommend(TINY_MOE, SYSTEM, JOB, top_k=12)
        bar = (1 - recommend_mod.UNMEASURED_ADVANTAGE_LIMIT) * measured
        within = [r.plan for r in raw.ranked if r.objective >= bar]
        faster = sum(r.objective <= measured for r in raw.ranked if r.objective >= bar)
        assert 0 < faster < len(within)  # the published layout goes between the model's plans
        assert [r.plan for r in res.ranked] == (within[:faster] + [SLOW] + within[faster:])[:12]
        assert [r.plan for r in res.model_only] == [r.plan for r in raw.ranked if r.objective < bar]


def test_job_gate_needs_a_run_at_a_precision_at_least_as_wide():
    """An FP8 run says nothing about what a bf16 step reaches; a bf16 run bounds an FP8 one."""
    from planner.evidence import supporting_runs
    raw = recommend(TINY_MOE, SYSTEM, JOB, top_k=1)
    with pytest.MonkeyPatch.context() as mp:
        _published(mp, measured_s=2.0 * raw.best.objective, dtype="fp8")
        assert supporting_runs(TINY_MOE, SYSTEM.accelerator.name, 16, 16, "bf16") == []
        assert len(supporting_runs(TINY_MOE, SYSTEM.accelerator.name, 16, 16, "mxfp8")) == 1
        assert recommend(TINY_MOE, SYSTEM, JOB, top_k=1).best.plan == raw.best.plan


def test_job_gate_skips_a_published_layout_the_job_pins_out():
    """A pin the published layout breaks: no layout to fall back on, the model's ranking stands."""
    job = JobSpec(global_batch=16, pins={"tp": 2})
    raw = recommend(TINY_MOE, SYSTEM, job, top_k=2)
    with pytest.MonkeyPatch.context() as mp:
        _published(mp, measured_s=10.0 * raw.best.objective)
        res = recommend(TINY_MOE, SYSTEM, job, top_k=2)
        assert [r.plan for r in res.ranked] == [r.plan for r in raw.ranked] and "job_gate" not in res.stats


def test_job_gate_ranks_the_published_layouts_by_measurement():
    """Two published runs, both far slower than the model's plans: their layouts lead in the
    order they measured, whatever the model predicts for them (ranking them by the model would
    favour the one it overrates most); routing the job asks to be less even than the runs had is
    not bounded by them."""
    from planner.evidence import supporting_runs
    raw = recommend(TINY_MOE, SYSTEM, JOB, top_k=2)
    other = Plan(tp=1, pp=1, dp=16, micro_batch=1, global_batch=16, recompute="none", zero_stage=0)
    t_slow, t_other = (estimate(TINY_MOE, SYSTEM, p, JOB).step_time_s for p in (SLOW, other))
    assert t_slow != t_other
    model_slower, model_faster = (SLOW, other) if t_slow > t_other else (other, SLOW)
    runs = [_run("measured_faster", 5.0 * raw.best.objective, model_slower),
            _run("measured_slower", 6.0 * raw.best.objective, model_faster)]
    jobs = {job_key(TINY_MOE, SYSTEM.accelerator.name, SYSTEM.num_gpus, JOB.global_batch): runs}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(evidence, "load_jobs", lambda: jobs)
        res = recommend(TINY_MOE, SYSTEM, JOB, top_k=2)
        assert [r.plan for r in res.ranked] == [model_slower, model_faster]
        assert res.stats["job_gate"]["recommended_from"] == "measured_faster"
        assert res.best.objective == pytest.approx(max(t_slow, t_other), rel=1e-12)
        assert supporting_runs(TINY_MOE, SYSTEM.accelerator.name, 16, 16, "bf16", moe_load_imbalance=1.6) == []
        learned = JobSpec(global_batch=16, moe_load_imbalance=1.6)
        assert "job_gate" not in recommend(TINY_MOE, SYSTEM, learned, top_k=1).stats


def test_a_pin_reads_the_same_on_a_published_plan_as_in_the_search():
    """Pins as build_space reads them: 'true' is a boolean pin, and an unset expert TP is tp's."""
    from constraints.space import breaks_pins
    plan = Plan(tp=2, dp=4, ep=4, global_batch=8, sequence_parallel=True, recompute="full")
    assert not breaks_pins(plan, {"tp": 2, "etp": 2, "sequence_parallel": "true", "recompute": "full"})
    assert breaks_pins(plan, {"etp": 1}) and breaks_pins(plan, {"recompute": "none"}) and breaks_pins(plan, {"tp": 4})


def test_job_gate_searches_wider_when_no_published_layout_is_valid():
    """The published layout is pinned out and the model's top 2 are both beyond the bar: the
    gate takes the model's fastest plans within the bar from a wider search (its 50 best)."""
    job = JobSpec(global_batch=16, pins={"tp": 2})
    wide = search(TINY_MOE, SYSTEM, job, top_k=recommend_mod.WIDER_TOP_K).ranked
    assert len(wide) > 6 and wide[5].objective > wide[4].objective
    bar = (wide[4].objective + wide[5].objective) / 2
    with pytest.MonkeyPatch.context() as mp:
        _published(mp, measured_s=bar / (1 - recommend_mod.UNMEASURED_ADVANTAGE_LIMIT))
        res = recommend(TINY_MOE, SYSTEM, job, top_k=2)
        assert [r.plan for r in res.ranked] == [r.plan for r in wide[5:7]]
        assert all(r.objective >= bar for r in res.ranked) and res.model_only[0].objective < bar
        assert res.stats["job_gate"]["recommended_from"] == "search"
