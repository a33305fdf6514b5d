"""Block recompute without a pipeline: the cost table costs full recompute at the fewest layers
that fit (constraints.cost_table.fewest_recompute_layers), the brute-force oracle tries every
count (planner.bruteforce.with_every_recompute_count)."""
import numpy as np
import pytest

from constraints.cost_table import evaluate
from constraints.space import at_batch, build_space, cross, layouts, options
from hardware.load import load_system
from planner.analytical import estimate
from planner.bruteforce import brute_force, with_every_offloaded_layer_count, with_every_recompute_count
from planner.model import load_model
from planner.plan import JobSpec
from planner.search import plan


def _same_ranking(model, system, job, k=3):
    searched = plan(model, system, job, top_k=k)
    oracle = brute_force(model, system, job, top_k=k)
    assert [r.plan for r in searched.ranked] == oracle.plans[:len(searched.ranked)]
    assert np.allclose([r.objective for r in searched.ranked], oracle.objectives[:len(searched.ranked)], rtol=1e-9)
    return searched.ranked


def test_zero3_without_a_pipeline_recomputes_only_the_layers_that_do_not_fit():
    """GPT-3 20B (44 layers) on 64 H100, batch 512, ZeRO-3 at micro-batch 4: an independent brute
    force found two recomputed layers 1 % faster than the planner's best (which recomputed all
    44 or none at micro-batch 2)."""
    model, system = load_model("gpt3-20b"), load_system("h100-sxm", 64)
    ranked = _same_ranking(model, system, JobSpec(global_batch=512, pins={"pp": 1, "tp": 1}))
    best = ranked[0].plan
    assert (best.recompute, best.recompute_num_layers, best.zero_stage, best.micro_batch) == ("full", 2, 3, 4)
    # the fewest that fit: one fewer does not, and every layer recomputed is slower
    job = JobSpec(global_batch=512)
    assert not estimate(model, system, best.model_copy(update={"recompute_num_layers": 1}), job).feasible
    every = estimate(model, system, best.model_copy(update={"recompute_num_layers": None}), job)
    assert every.feasible and every.step_time_s > ranked[0].estimate.step_time_s


def test_with_offload_every_layer_is_recomputed_and_the_search_still_matches_the_oracle():
    """With offload the transfers hide behind compute, so the fewest layers that fit need not be
    the fastest count: offloading rows keep every layer (the space's definition, the oracle's too).
    Mixtral 8x7B on 16 GH200 with 40 GiB reserved: offload and full recompute both in play."""
    model, system = load_model("mixtral-8x7b"), load_system("gh200", 16)
    job = JobSpec(global_batch=64, hbm_reserve_gib=40, pins={"pp": 1, "recompute": "full", "tp": 2, "ep": 8})
    ranked = _same_ranking(model, system, job)
    for r in ranked:
        assert (r.plan.recompute_num_layers is None) == r.plan.uses_offload, r.plan.short()


@pytest.mark.parametrize("system_name, gpus, reserve_gib", [("h100-sxm", 8, 50), ("gh200", 4, 50)])
def test_cost_table_count_is_the_oracles_fastest_fitting_count_on_every_row(system_name, gpus, reserve_gib):
    """Row by row over a whole space (every layout and option at its largest batch): the count
    the cost table costs each block-recompute row at equals the oracle's fastest fitting one; on
    GH200 the offloading rows keep every layer (count 0), as the oracle enumerates them, and are
    costed at their fewest offloaded layers, which the oracle enumerates too."""
    model, system = load_model("llama3-8b"), load_system(system_name, gpus)
    job = JobSpec(global_batch=64, hbm_reserve_gib=reserve_gib, framework="any", pins={"pp": 1, "recompute": "full"})
    space = build_space(model, system, job)
    lay = layouts(space)
    rows = cross(space, lay, options(space))
    rows = at_batch(rows, rows["m_max"])
    table = evaluate(space, rows)
    rows["row_id"] = np.arange(len(rows["tp"]), dtype=np.float64)
    every = with_every_recompute_count(rows, model.layers)
    every, res = with_every_offloaded_layer_count(space, every, evaluate(space, every, fewest_counts=False))
    source = every["row_id"].astype(np.int64)
    checked = 0
    for i in np.flatnonzero(table["violations"] == 0):
        mine = np.flatnonzero((source == i) & (res["violations"] == 0))
        best = mine[np.argmin(res["step_time_s"][mine])]
        k = every["recompute_layers"][best]
        assert table["recompute_layers"][i] == (0 if k == model.layers else k)
        assert np.isclose(table["step_time_s"][i], res["step_time_s"][best], rtol=1e-12)
        checked += 1
    assert checked > 10 and (table["recompute_layers"] > 0).any()


def test_pipelined_zero3_recomputes_the_fewest_layers_per_chunk_that_fit():
    """ZeRO-3 plans have no per-stage problem (memory is not linear in the layer counts), so their
    block count is bisected with the exact model: the same count as the fastest feasible one of
    every count per virtual stage, costed one by one."""
    from planner.pipeline_layout import plan_layout
    model, system = load_model("llama3-70b"), load_system("h100-sxm", 64)
    job = JobSpec(global_batch=128, framework="any", pins={"pp": 4, "zero_stage": 3, "recompute": "full"})
    best = plan(model, system, job, top_k=1).best
    p = best.plan
    assert p.recompute_num_layers is not None and p.zero_stage == 3
    every = [estimate(model, system, p.model_copy(update={"recompute_num_layers": k * p.vpp}), job)
             for k in range(1, max(plan_layout(p, model.layers)) + 1)]
    fastest = min((e for e in every if e.feasible), key=lambda e: e.step_time_s)
    assert fastest.plan.recompute_num_layers == p.recompute_num_layers
    assert np.isclose(fastest.step_time_s, best.estimate.step_time_s, rtol=1e-12)
    assert fastest.step_time_s < every[-1].step_time_s  # fewer than all layers pays
