"""`planner check`'s up-front memory bound (issue 10 item 4) must never change the answer: where it
answers 'no' without searching, the full exact table has no fitting row either (brute force)."""
from __future__ import annotations

import pytest

from constraints.cost_table import tabulate
from constraints.space import build_space
from hardware import load_system
from planner.model import load_model
from planner.plan import JobSpec
from planner.search import _min_footprint, check


@pytest.mark.parametrize(("model", "system", "gpus", "batch"), [
    ("gpt3-175b", "a100-80g", 8, 64),      # 175e9 params · 16 B of weights+grads+Adam state per param > 8 · 80 GB
    ("llama3-70b", "h100-sxm", 2, 16),
])
def test_bound_says_no_only_when_no_plan_fits(model, system, gpus, batch):
    m, s = load_model(model), load_system(system, gpus)
    job = JobSpec(global_batch=batch)
    space = build_space(m, s, job)
    hbm_min, _, small_plan, cap = _min_footprint(space)
    assert small_plan is not None and hbm_min > cap  # the bound applies here
    table = tabulate(space, top_k=None)  # every valid plan, evaluated exactly
    assert not table.fits.any()
    result = check(m, s, job)
    assert not result.feasible
    assert "memory_fit_hbm" in result.binding_rules
    assert result.numbers["min_hbm_bytes"] == pytest.approx(hbm_min)


def test_bound_does_not_fire_when_a_plan_fits():
    m, s = load_model("llama3-8b"), load_system("h100-sxm", 8)
    job = JobSpec(global_batch=64)
    hbm_min, _, _, cap = _min_footprint(build_space(m, s, job))
    assert hbm_min <= cap
    assert check(m, s, job).feasible
