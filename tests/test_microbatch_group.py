"""Interleaving when pp does not divide the microbatches: Megatron's microbatch group N
(--microbatch-group-size-per-virtual-pipeline-stage), chosen, costed and launched."""
import numpy as np
import pytest

from constraints.space import build_space, layouts
from hardware import load_system
from planner.analytical import PlanArrays
from planner.analytical.memory import in_flight_microbatches
from planner.megatron.rules import validate_launch
from planner import megatron as mg
from planner.model import load_model
from planner.pipeline_layout import vp_microbatch_group
from planner.plan import JobSpec, Plan


def _megatron_accepts(m: int, pp: int, n: int) -> bool:
    """schedules.py, forward_backward_pipelining_with_interleaving: N in [pp, m], and the last
    group m % N either empty or at least pp."""
    return pp <= n <= m and (m % n == 0 or m % n >= pp)


@pytest.mark.parametrize("m,pp", [(120, 16), (64, 12), (10, 4), (128, 16), (7, 3), (257, 8)])
def test_group_is_the_smallest_megatron_accepts(m, pp):
    n = vp_microbatch_group(m, pp)
    assert _megatron_accepts(m, pp, n)
    assert not any(_megatron_accepts(m, pp, k) for k in range(pp, int(n)))
    assert (n == pp) == (m % pp == 0)


def test_vectorised_matches_scalar():
    m, p = np.array([120, 64, 128, 10]), np.array([16, 12, 16, 4])
    assert list(vp_microbatch_group(m, p)) == [vp_microbatch_group(a, b) for a, b in zip(m, p)] == [20, 13, 16, 5]


def test_a_microbatch_count_that_is_not_whole_keeps_pp():
    """A global batch that micro_batch·dp does not divide (a plan the batch rule refuses, still
    costed) runs no schedule: N stays pp, beside whole counts in the same call (the one-pass
    grouping by (m, pp) must not round 7.5 to 7)."""
    m, p = np.array([7.0, 7.5, 12.0, 7.0]), np.array([3.0, 3.0, 5.0, 3.0])
    assert list(vp_microbatch_group(m, p)) == [4.0, 3.0, 6.0, 4.0]


def test_warm_up_holds_v_minus_one_groups():
    """Rank 0 warms up with 2(p−1) + (v−1)·N + 1 chunk-forwards, each 1/v of its layers
    (get_pp_rank_microbatches): pp 4, vpp 5, 10 microbatches -> N 5: (6 + 20 + 1)/5; 12
    microbatches -> N 4: (6 + 16 + 1)/5."""
    model = load_model("llama3-70b")
    rows = dict(tp=8, pp=4, dp=3, vpp=5, micro_batch=1)
    ten = PlanArrays.from_columns(1, model.layers, global_batch=30, **rows)
    twelve = PlanArrays.from_columns(1, model.layers, global_batch=36, **rows)
    rank0 = ten.rank_index[0] == 0
    assert in_flight_microbatches(ten)[0][rank0][0] == pytest.approx(27 / 5)
    assert in_flight_microbatches(twelve)[0][rank0][0] == pytest.approx(23 / 5)


def test_fixed_batch_may_interleave_when_pp_does_not_divide_it():
    """Llama-3 70B on 96 H100, tp 8 pp 4 dp 3, batch 30 (10 microbatches): interleaving is in
    the space, and its launch passes Megatron's run-time group check."""
    model, system = load_model("llama3-70b"), load_system("h100-sxm", 96)
    space = build_space(model, system, JobSpec(global_batch=30, pins={"tp": 8, "pp": 4, "micro_batch": 1}))
    lay = layouts(space)
    assert (lay["vpp"] > 1).any()
    plan = Plan(tp=8, pp=4, dp=3, vpp=5, micro_batch=1, global_batch=30, sequence_parallel=True, recompute="full")
    launch = mg.megatron_args(plan, model, JobSpec(), system)
    assert validate_launch(launch, mg.gpu_arch_major(system)) == []
    text = mg.render(launch, "args")
    assert "--microbatch-group-size-per-virtual-pipeline-stage 5" in text
    even = Plan(tp=8, pp=4, dp=3, vpp=5, micro_batch=1, global_batch=36, sequence_parallel=True, recompute="full")
    assert "--microbatch-group-size" not in mg.render(mg.megatron_args(even, model, JobSpec(), system), "args")
