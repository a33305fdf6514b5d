"""The search's offload pruning (constraints.cost_table._largest_batch_pass) against brute force on
the framework-any space (weights, activations and optimizer offload all searched), on a small
case whose memory is tight enough that most layouts need some offload, with uneven pipeline
layouts (30 layers on pp 4) where the activation-offload dominance is restricted."""
from __future__ import annotations

import math

import numpy as np
import pytest

from constraints.cost_table import evaluate, tabulate
from constraints.space import LAYOUT_KEYS, build_space, enumerate_rows
from hardware import load_system
from planner.bruteforce import brute_force
from planner.model import ModelSpec
from planner.plan import JobSpec
from planner.search import plan

MODEL = ModelSpec(name="offload-30l", layers=30, hidden=6144, heads=48, seq_length=2048, vocab=32000)
JOBS = [JobSpec(global_batch=16, framework="any"),
        JobSpec(global_batch=16, framework="any", hbm_reserve_gib=30)]


def test_framework_any_zero_regret():
    job = JOBS[1]
    system = load_system("h100-offload-1tib", 4)
    found = plan(MODEL, system, job, top_k=5)
    oracle = brute_force(MODEL, system, job, top_k=5)
    assert len(found.ranked) == len(oracle.objectives) == 5
    for got, want in zip(found.ranked, oracle.objectives):
        assert math.isclose(got.objective, want, rel_tol=1e-9)
    assert [r.plan for r in found.ranked] == oracle.plans


@pytest.mark.parametrize("job", JOBS, ids=["reserve0", "reserve30"])
def test_every_layout_keeps_its_best_row(job):
    """Without the top-K rule, the pruned table still holds every layout's best fitting row: the
    per-layout optimum of the full space (every row costed), layout by layout."""
    system = load_system("h100-offload-1tib", 4)
    space = build_space(MODEL, system, job)
    table = tabulate(space, top_k=None)
    rows = enumerate_rows(space)
    res = evaluate(space, rows)
    fits = res["violations"] == 0
    assert table.stats["evaluated"] < 0.6 * len(rows["tp"])  # the offload pruning did drop rows
    assert (rows["pp"][fits] == 4).any() and (rows["offload_activations"][fits] > 0).any()

    def best_by_layout(r, obj, ok):
        best: dict[tuple, float] = {}
        for i in np.flatnonzero(ok):
            key = tuple(float(r[k][i]) for k in LAYOUT_KEYS)
            best[key] = min(best.get(key, math.inf), float(obj[i]))
        return best

    want = best_by_layout(rows, res["objective"], fits)
    got = best_by_layout(table.rows, table.res["objective"], table.fits)
    assert got.keys() == want.keys()
    assert any(k[1] == 4 for k in want)  # uneven layouts (30 layers on pp 4) are among them
    for key, value in want.items():
        assert math.isclose(got[key], value, rel_tol=1e-12), key


@pytest.mark.parametrize("preset,system,gpus", [("nemotron-h-56b", "gb200-nvl72", 8),
                                                ("gpt-oss-120b", "gh200", 16)])
def test_the_megatron_space_holds_only_plans_megatron_can_launch(preset, system, gpus):
    """On boxes with an offload tier, where memory is tight enough that offload is chosen, none of
    the solver's picks is dropped by the launch check (`planner.megatron.not_expressible`): the
    space encodes the same rules, so a plan dropped there is one the search wrongly offered (hybrid
    stacks' activation offload was, and left Nemotron-H 56B on 8 GB200 with no plan)."""
    from planner.megatron import not_expressible
    from planner.model import load_model
    model, job = load_model(preset), JobSpec(global_batch=64)
    found = plan(model, load_system(system, gpus), job, top_k=5)
    assert found.ranked and found.stats["not_expressible_dropped"] == 0
    assert all(not not_expressible(r.plan, model, job) for r in found.ranked)
