"""Activation offload without a pipeline is costed at the fewest whole layers whose HBM fits
(constraints.cost_table.fewest_offloaded_layers), not only at the grid fractions 0, ½ and 1: HBM
never rises, host bytes and time never fall as a layer more is offloaded, so the fewest that fit
HBM is a row's best count, and if the host cannot take it no count fits. An independent brute
force found plans between the grid points up to 4.9 % faster (audit of 2026-11-28)."""
from __future__ import annotations

import time

from hardware import load_system
from planner.analytical import estimate
from planner.bruteforce import brute_force
from planner.model import load_model
from planner.plan import JobSpec
from planner.search import check, memory_floor, plan
from constraints.space import build_space

# Llama-3 8B on 16 GB200 at micro-batch 8 without recompute: offloading 16 of 32 layers (½)
# leaves too much in HBM, 31 (the grid's 1) is more than Grace's 223.5 GiB per GPU takes, 17 fits.
MODEL, SYSTEM = load_model("llama3-8b"), load_system("gb200-nvl72", 16)
PINS = {"tp": 1, "pp": 1, "cp": 1, "micro_batch": 8, "zero_stage": 2, "recompute": "none"}
JOB = JobSpec(global_batch=128, pins=PINS)


def test_a_count_between_the_grid_points_is_found_where_neither_grid_point_fits():
    best = plan(MODEL, SYSTEM, JOB, top_k=1).best
    assert best.plan.offload_activations == 17 / 32
    for layers, why in ((16, "hbm"), (31, "offload")):
        other = best.plan.model_copy(update={"offload_activations": 1.0 if layers == 31 else layers / 32})
        e = estimate(MODEL, SYSTEM, other, JOB)
        assert not e.feasible and any(why in v for v in e.violations), (layers, e.violations)
    assert check(MODEL, SYSTEM, JOB).feasible  # the memory floor sees the count too
    floor = memory_floor(build_space(MODEL, SYSTEM, JOB))
    assert floor.fits and floor.offload_plan.offload_activations == 17 / 32


def test_the_search_equals_the_brute_force_over_every_count():
    job = JobSpec(global_batch=128, pins={"tp": 1, "pp": 1, "cp": 1, "micro_batch": 8})
    found = plan(MODEL, SYSTEM, job, top_k=3)
    oracle = brute_force(MODEL, SYSTEM, job, top_k=3)
    assert [r.plan for r in found.ranked] == oracle.plans
    assert [round(r.objective, 12) for r in found.ranked] == [round(o, 12) for o in oracle.objectives]
