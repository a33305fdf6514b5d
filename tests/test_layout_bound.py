"""The cost table's per-layout bound (constraints.cost_table.layout_lower_bounds: compute and the
least exposed TP/CP/EP communication): below every row of its layout, in the full space the
oracle enumerates, and a table built with it is the table built without it (it only skips
layouts rule 3 drops anyway)."""
from __future__ import annotations

import numpy as np
import pytest

import constraints.cost_table as cost_table
from constraints.space import build_space, cross, expand_batches, layouts, options, pair_mask
from hardware import load_system
from planner.bruteforce import with_every_recompute_count
from planner.model import load_model
from planner.plan import JobSpec
from planner.search import plan
from tests.test_overlap_dominance import TINY_MOE, TINY_MOE_LEAD

# (model, system, gpus, job): dense fixed batch; MoE with a leading dense layer and MTP, free
# batch, the all-to-all overlap; a pipelined hybrid stack (every rank its own blocks); weight,
# activation and optimizer offload with ZeRO 1-3 (framework any); a torch stack's own kernels;
# the all-to-all overlap on an interleaved pipeline at every free batch (its unpaired share of
# the microbatches varies with m)
CASES = [
    ("llama3-8b", "h100-sxm", 8, JobSpec(global_batch=32)),
    (TINY_MOE_LEAD, "h100-sxm", 8, JobSpec(max_global_batch=8, pins={"cp": 1})),
    ("nemotron-3-nano", "h100-sxm", 8, JobSpec(global_batch=16)),
    ("llama3-8b", "h100-offload-1tib", 8, JobSpec(global_batch=16, framework="any")),
    ("llama3-8b", "h100-sxm", 8, JobSpec(global_batch=16, framework="any", kernels="torch-eager")),
    (TINY_MOE, "h100-sxm", 8, JobSpec(max_global_batch=16, pins={"cp": 1, "pp": 2})),
]
IDS = ["dense", "moe-lead-mtp-free", "hybrid", "offload", "torch-eager", "a2a-overlap-interleaved-free"]


def _space(model, system, gpus, job):
    model = model if not isinstance(model, str) else load_model(model)
    return build_space(model, load_system(system, gpus), job)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_the_bound_is_below_every_row_of_its_layout(case):
    space = _space(*case)
    lay, opt = layouts(space), options(space)
    live = pair_mask(space, lay, opt).any(axis=0)
    lower = cost_table.layout_lower_bounds(space, lay, opt, live)
    lay["layout_id"] = np.arange(len(lay["tp"]), dtype=np.float64)
    # the oracle's rows: every batch, every block-recompute and offloaded-layer count
    rows = with_every_recompute_count(cross(space, expand_batches(lay), opt), space.model.layers)
    res = cost_table.evaluate(space, rows, fewest_counts=False)
    ok = (res["violations"] & ~cost_table.MEMORY_BITS) == 0  # every structurally valid row, fitting or not
    assert ok.sum() > 100
    layout = rows["layout_id"].astype(np.int64)
    assert np.all(res["objective"][ok] >= lower[layout[ok]])
    # and it is not vacuous: typically within 20 % of the layout's fastest row (0.83-0.96 here)
    fastest = np.full(len(lower), np.inf)
    np.minimum.at(fastest, layout[ok], res["objective"][ok])
    seen = np.isfinite(fastest)
    assert np.median(lower[seen] / fastest[seen]) > 0.8
    if case[0] is TINY_MOE:
        assert (rows["moe_a2a_overlap"][ok] > 0).any() and (rows["vpp"][ok] > 1).any()


@pytest.mark.parametrize("case", [CASES[1], CASES[3]], ids=["moe-lead-mtp-free", "offload"])
def test_the_table_is_the_same_without_the_bound(monkeypatch, case):
    """Small blocks (FIRST_BLOCK_ROWS 64) make the bound skip layouts even in these small spaces."""
    space = _space(*case)
    monkeypatch.setattr(cost_table, "FIRST_BLOCK_ROWS", 64)
    monkeypatch.setattr(cost_table, "CHUNK", 256)
    tables = {}
    for on in (True, False):
        monkeypatch.setattr(cost_table, "LAYOUT_BOUND", on)
        tables[on] = cost_table.tabulate(space, top_k=5, tie_rel_tol=1e-3)
    bounded, full = tables[True], tables[False]
    assert bounded.stats["evaluated"] < full.stats["evaluated"]
    assert bounded.rows.keys() == full.rows.keys() and bounded.res.keys() == full.res.keys()
    for key in full.rows:
        np.testing.assert_array_equal(bounded.rows[key], full.rows[key], err_msg=key)
    for key in full.res:
        np.testing.assert_array_equal(bounded.res[key], full.res[key], err_msg=key)
    # what it tells a search without offload: each layout's bound is still below its rows
    if full.no_offload is not None:
        assert np.all(bounded.no_offload.lower <= full.no_offload.lower)
        np.testing.assert_array_equal(bounded.no_offload.best_fit[np.isfinite(bounded.no_offload.best_fit)],
                                      full.no_offload.best_fit[np.isfinite(bounded.no_offload.best_fit)])


def test_a_search_without_offload_from_the_bounded_search_finds_the_same_plans(monkeypatch):
    """planner.recommend's offload-gain search starts from the first search's no-offload bounds;
    a layout the compute bound left uncosted there must not be bounded out here."""
    monkeypatch.setattr(cost_table, "FIRST_BLOCK_ROWS", 64)
    monkeypatch.setattr(cost_table, "CHUNK", 256)
    model, system = load_model("llama3-8b"), load_system("h100-offload-1tib", 8)
    job = JobSpec(global_batch=16, framework="any")
    first = plan(model, system, job, top_k=3)
    alone = job.model_copy(update={"allow_offload": False})
    bounded = plan(model, system, alone, top_k=3, no_offload_bounds=first.no_offload)
    fresh = plan(model, system, alone, top_k=3)
    assert [(r.plan, r.objective) for r in bounded.ranked] == [(r.plan, r.objective) for r in fresh.ranked]
