"""A pin may ask for any interleaving depth (constraints.space: deep_vpp_ok limits only what is
searched unpinned): pp 2 vpp 22 over Llama-3 70B's 80 layers (44 virtual stages, not all of equal
layer count) had been refused as "no valid layout" while `planner estimate` costs it."""
import math

from hardware import load_system
from planner.bruteforce import brute_force
from planner.model import load_model
from planner.plan import JobSpec
from planner.search import plan as search_plan


def test_a_pinned_deep_vpp_that_splits_unevenly_is_searched_and_the_oracle_agrees():
    model, system = load_model("llama3-70b"), load_system("h100-sxm", 64)
    job = JobSpec(global_batch=128, pins={"tp": 4, "pp": 2, "vpp": 22, "micro_batch": 1})
    found = search_plan(model, system, job, top_k=3)
    assert found.ranked and all(r.plan.vpp == 22 and r.plan.pp == 2 for r in found.ranked)
    oracle = brute_force(model, system, job, top_k=3)
    assert oracle.stats["structural_rejects"] == 0
    assert math.isclose(found.ranked[0].objective, oracle.objectives[0], rel_tol=1e-9)
    assert found.ranked[0].plan == oracle.plans[0]
