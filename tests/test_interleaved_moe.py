"""Dense and MoE layers interleaved (MoESpec.layer_step; Llama 4 Maverick: MoE every second layer,
Megatron --moe-layer-freq ([0,1]*24)). Each pipeline rank is costed with the dense and MoE layers
its stages hold, counted here by hand from the stage bounds; without a pipeline the positions
cannot matter, so the model must equal the same counts as leading dense layers."""
from __future__ import annotations

import numpy as np
import pytest

import planner.analytical.plans as plans
from hardware import load_system
from planner.analytical import PlanArrays
from planner.analytical.estimate import estimate, estimate_many
from planner.analytical.layer_kinds import dense_layer_spec
from planner.megatron.emit import moe_layer_pattern
from planner.model import ModelSpec, load_model
from planner.plan import JobSpec, Plan

MAVERICK = load_model("llama4-maverick")
H100 = load_system("h100-sxm", 256)


def _counts(plan: Plan, model: ModelSpec = MAVERICK) -> dict[str, list[int]]:
    """Per pipeline rank (every rank: an explicit layout keeps them all): layers, dense layers,
    recomputed layers, recomputed dense layers."""
    P = PlanArrays.from_plans([plan], model.layers, dense_layer_spec(model))
    by_rank = {}
    for j, r in enumerate(P.rank_index[0].astype(int)):
        by_rank.setdefault(r, (P.rank_layers[0, j], P.rank_lead_layers[0, j], P.rank_recompute[0, j],
                               P.rank_lead_recompute[0, j]))
    return {name: [int(by_rank[r][i]) for r in sorted(by_rank)]
            for i, name in enumerate(("layers", "dense", "recomputed", "dense_recomputed"))}


def test_dense_positions_follow_the_step():
    assert MAVERICK.dense_layer_positions == tuple(range(0, 48, 2))
    m = MAVERICK.model_copy(update={"layers": 11, "moe": MAVERICK.moe.model_copy(
        update={"first_dense_layers": 2, "layer_step": 3})})
    # 2 leading dense, then of layers 2..10 every third (4, 7, 10) MoE
    assert m.dense_layer_positions == (0, 1, 2, 3, 5, 6, 8, 9)
    assert (m.dense_layers, m.moe_layers) == (8, 3)
    assert moe_layer_pattern(m) == "([0]*2+[0,0,1]*3)" and eval(moe_layer_pattern(m)) == [
        0, 0, 0, 0, 1, 0, 0, 1, 0, 0, 1]
    assert moe_layer_pattern(MAVERICK) == "([0,1]*24)"


def test_uneven_stages_hold_the_dense_layers_their_bounds_cover():
    # stages [0, 13), [13, 25), [25, 37), [37, 48): even positions 0..12 (7), 14..24 (6), 26..36 (6), 38..46 (5)
    plan = Plan(tp=2, pp=4, dp=32, ep=8, global_batch=256, stage_layers=(13, 12, 12, 11))
    c = _counts(plan)
    assert c["layers"] == [13, 12, 12, 11] and c["dense"] == [7, 6, 6, 5]


def test_interleaved_chunks_and_block_recompute_by_hand():
    # pp 2, vpp 2, stages of 12: rank 0 holds [0, 12) and [24, 36), rank 1 [12, 24) and [36, 48)
    plan = Plan(tp=2, pp=2, vpp=2, dp=64, ep=8, global_batch=256, recompute="full", recompute_num_layers=3)
    c = _counts(plan)
    assert c["layers"] == [24, 24] and c["dense"] == [12, 12]
    # each rank's first 3 layers in chunk order: 0, 1, 2 (dense 0, 2) and 12, 13, 14 (dense 12, 14)
    assert c["recomputed"] == [3, 3] and c["dense_recomputed"] == [2, 2]
    # per-stage counts: stage s recomputes its first r_s layers; stage 1 starts at 12 (dense),
    # stage 2's first two are 24 (dense), 25
    staged = plan.model_copy(update={"recompute_num_layers": None, "stage_layers": (12, 12, 12, 12),
                                     "stage_recompute_layers": (1, 1, 2, 0)})
    c = _counts(staged)
    assert c["recomputed"] == [3, 1] and c["dense_recomputed"] == [2, 1]


def test_one_recompute_count_is_the_first_k_over_vpp_of_every_chunk():
    """Megatron's block method with --recompute-num-layers 2 (4 a stage at vpp 2) over stages
    (1, 12, 23, 12): rank 0's chunks [0, 1) and [13, 36) rerun layer 0 (dense) and 13, 14 (14
    dense): 3 layers, 2 dense, not its first 4 in chunk order; rank 1's [1, 13) and [36, 48) rerun
    1, 2 and 36, 37 (dense 2, 36). As the per-stage counts (1, 2, 2, 2) say."""
    plan = Plan(tp=2, pp=2, vpp=2, dp=64, ep=8, global_batch=256, recompute="full", recompute_num_layers=4,
                stage_layers=(1, 12, 23, 12))
    c = _counts(plan)
    assert c["recomputed"] == [3, 4] and c["dense_recomputed"] == [2, 2]
    staged = plan.model_copy(update={"recompute_num_layers": None, "stage_recompute_layers": (1, 2, 2, 2)})
    assert _counts(staged) == c


def test_without_a_pipeline_positions_do_not_matter():
    """pp 1: one rank holds every layer, so the interleaved model must cost exactly what the same
    model with its 24 dense layers leading costs (the leading-layer path is independent code)."""
    leading = MAVERICK.model_copy(update={"moe": MAVERICK.moe.model_copy(
        update={"first_dense_layers": 24, "layer_step": 1})})
    assert leading.dense_layers == MAVERICK.dense_layers == 24
    for plan in (Plan(tp=2, dp=128, ep=64, global_batch=1024, sequence_parallel=True),
                 Plan(tp=4, dp=64, ep=16, global_batch=512, recompute="full", zero_stage=1,
                      sequence_parallel=True)):
        a, b = estimate(MAVERICK, H100, plan), estimate(leading, H100, plan)
        assert a.step_time_s == pytest.approx(b.step_time_s, rel=1e-12)
        assert a.hbm_bytes == pytest.approx(b.hbm_bytes, rel=1e-12)


def test_representative_ranks_give_the_every_rank_answer(monkeypatch):
    """A default split keeps rank 0, the last rank and one rank per distinct middle rank; the
    step time and worst HBM must equal those with every rank kept."""
    # uneven splits too (48 layers over 5, 7 or 3·2 stages): middle ranks that differ
    rows = [Plan(tp=2, pp=pp, vpp=vpp, dp=16, ep=8, global_batch=512, recompute=rc,
                 recompute_num_layers=k, sequence_parallel=True)
            for pp, vpp in ((2, 1), (3, 2), (4, 3), (5, 1), (7, 1), (8, 2), (16, 1))
            for rc, k in (("none", None), ("full", None), ("full", 1), ("selective", None))]
    P = PlanArrays.from_plans(rows, MAVERICK.layers, dense_layer_spec(MAVERICK))
    assert P.rank_index.shape[1] < 16  # the reduction happened
    job = JobSpec()
    reduced = estimate_many(MAVERICK, H100, job, P)
    every = plans._interleaved_ranks.__wrapped__
    monkeypatch.setattr(plans, "_interleaved_ranks",
                        lambda *a, **k: every(*a, **{**k, "every_rank": True}))
    P_all = PlanArrays.from_plans(rows, MAVERICK.layers, dense_layer_spec(MAVERICK))
    assert P_all.rank_index.shape[1] == 16
    full = estimate_many(MAVERICK, H100, job, P_all)
    np.testing.assert_allclose(reduced["step_time_s"], full["step_time_s"], rtol=1e-12)
    np.testing.assert_allclose(reduced["hbm_bytes"], full["hbm_bytes"], rtol=1e-12)


def test_a_step_leaving_no_moe_layer_is_refused():
    with pytest.raises(ValueError, match=r"moe.layer_step \(48\) leaves no MoE layer"):
        MAVERICK.model_copy(update={"moe": MAVERICK.moe.model_copy(update={"layer_step": 48})}).model_validate(
            {**MAVERICK.model_dump(), "moe": {**MAVERICK.moe.model_dump(), "first_dense_layers": 1, "layer_step": 48}})
