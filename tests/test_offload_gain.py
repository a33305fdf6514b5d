"""The search without offload that `planner plan` runs to say what a plan's offload buys starts
from the bounds of the search with offload (constraints.no_offload): it must return exactly what
the full search without offload returns (plans, objectives, order), and skip layouts doing so."""
from __future__ import annotations

import numpy as np
import pytest

from constraints.cost_table import tabulate
from constraints.no_offload import NoOffloadBounds, kth_best, layout_ids, option_ids
from constraints.space import build_space, layouts, options
from hardware import load_system
from planner.model import load_model
from planner.plan import JobSpec
from planner.recommend import recommend
from planner.search import plan

# (model, system, GPUs, job, top K asked of the search without offload): jobs whose best plan
# offloads (the case the bound is for), fixed and free batch, dense and MoE, Grace and a pooled
# offload tier, with pins and a memory reserve; top 1 is what `planner plan` asks, top 3 tries the
# K-th bound and its ties. Mixtral is the free-batch case (batch <= 3072), on 8 GPUs (2 nodes; its
# best plan offloads activations there too; 32 GPUs took three times as long). GPT-3 175B on the
# pooled tier runs on 128 GPUs, batch 256 (its best plan offloads activations, as on 1024 at batch
# 1536, which took half as long again)
CASES = [
    ("llama3-70b", "gb200-nvl72", 64, JobSpec(global_batch=256, dtype="fp8"), (1, 3)),
    ("llama3-8b", "gb200-nvl72", 16, JobSpec(global_batch=256), (1,)),
    ("qwen3-30b-a3b", "gb200-nvl72", 16, JobSpec(global_batch=256), (1, 3)),
    ("mixtral-8x7b", "gb200-nvl72", 8, JobSpec(), (1,)),
    ("gpt3-175b", "h100-offload-1tib", 128, JobSpec(global_batch=256), (1, 3)),
    ("llama3-8b", "gb300-nvl72", 8, JobSpec(global_batch=128, pins={"tp": 1}), (1,)),
    ("qwen3-30b-a3b", "gb200-nvl72", 8, JobSpec(global_batch=128, hbm_reserve_gib=40.0), (1, 3)),
]


def _without_offload(job: JobSpec) -> JobSpec:
    return job.model_copy(update={"allow_offload": False})


_FIRST: dict = {}


def _first_search(name: str, sysname: str, gpus: int, job: JobSpec):
    """The search with offload, top 5, of a case: computed once per test process (two tests
    search Qwen3-30B-A3B on 16 GB200 alike, ~1 s). Read-only: the tests read it and pass its
    `no_offload` bounds on, which the bounded search only reads."""
    key = (name, sysname, gpus, job.model_dump_json())
    if key not in _FIRST:
        _FIRST[key] = plan(load_model(name), load_system(sysname, gpus), job, top_k=5)
    return _FIRST[key]


@pytest.mark.parametrize("name, sysname, gpus, job, tops", CASES, ids=[f"{c[0]}-{c[1]}-{c[2]}" for c in CASES])
def test_bounded_search_without_offload_equals_the_full_one(name, sysname, gpus, job, tops):
    model, system = load_model(name), load_system(sysname, gpus)
    first = _first_search(name, sysname, gpus, job)
    assert first.best is not None and first.best.plan.uses_offload, "a case whose best plan offloads"
    assert first.no_offload is not None
    alone = _without_offload(job)
    for k in tops:
        full = plan(model, system, alone, top_k=k)
        bounded = plan(model, system, alone, top_k=k, no_offload_bounds=first.no_offload)
        assert [(r.plan, r.objective) for r in bounded.ranked] == [(r.plan, r.objective) for r in full.ranked]
        assert bounded.stats["layouts_bounded_out"] > 0  # the bound did skip layouts


def test_the_kept_layouts_hold_every_layout_of_the_full_table():
    """What the bound keeps covers the full table's layouts, and the bound is below every
    no-offload row's objective (rows of the full table, at every batch it holds)."""
    model, system = load_model("qwen3-30b-a3b"), load_system("gb200-nvl72", 16)
    job = JobSpec(global_batch=256)
    first = _first_search("qwen3-30b-a3b", "gb200-nvl72", 16, job).no_offload
    space = build_space(model, system, _without_offload(job))
    full = tabulate(space, top_k=5, tie_rel_tol=0.0)
    lay = layouts(space)
    keep = first.needed(space, lay, 5, 0.0)
    assert keep is not None and not keep.all()
    in_table = np.unique(full.rows["group"])
    assert keep[in_table].all()
    ids = layout_ids(lay)
    index = {key: i for i, key in enumerate(layout_ids(first.layouts))}
    for g, obj in zip(full.rows["group"], full.res["objective"]):
        assert first.lower[index[ids[int(g)]]] <= obj * (1 + 1e-12)


def test_no_bound_where_the_first_search_had_no_plan_without_offload_or_offload_was_pinned():
    """Where nothing fits without offload (fewer fitting layouts than asked) the bound keeps every
    layout; where the first search pinned offload, it costed no row without it: no bound."""
    model = load_model("llama3-405b")
    system = load_system("gh200", 64)
    job = JobSpec(global_batch=512)
    first = plan(model, system, job, top_k=5)
    space = build_space(model, system, _without_offload(job))
    assert first.no_offload is not None and first.no_offload.needed(space, layouts(space), 5, 0.0) is None
    pinned = plan(load_model("llama3-8b"), load_system("gb200-nvl72", 16),
                  JobSpec(global_batch=256, pins={"offload_activations": 0.5}), top_k=1)
    assert pinned.no_offload is None


def test_a_layout_the_first_search_did_not_have_is_kept():
    """A layout the bounds do not know is kept; option rows the bounds did not see mean no bound."""
    model, system = load_model("llama3-8b"), load_system("gb200-nvl72", 8)
    space = build_space(model, system, JobSpec(global_batch=64, allow_offload=False))
    lay = layouts(space)
    known = option_ids(options(space))
    # the first layout known, far beyond the bound; the others unknown
    first = {k: v[:1] for k, v in lay.items()}
    bounds = NoOffloadBounds(first, np.array([5.0]), np.array([1.0]), known)
    keep = bounds.needed(space, lay, 1, 0.0)
    assert not keep[0] and keep[1:].all()
    assert NoOffloadBounds(first, np.array([5.0]), np.array([1.0]), frozenset()).needed(space, lay, 1, 0.0) is None


def test_kth_best_counts_finite_values_only():
    assert kth_best(np.array([3.0, np.inf, 1.0, 2.0]), 2) == 2.0
    assert kth_best(np.array([3.0, np.inf]), 2) == np.inf
    assert kth_best(np.array([3.0]), None) == np.inf


def test_plan_reports_the_same_offload_gain_as_a_full_search():
    """`planner plan`'s note: the plan without offload and its advantage, as the full search says."""
    model, system = load_model("llama3-8b"), load_system("gb200-nvl72", 16)
    job = JobSpec(global_batch=256)
    gain = recommend(model, system, job, top_k=1).stats["offload_gain"]
    full = plan(model, system, _without_offload(job), top_k=1).best
    assert gain["plan_without_offload"] == full.plan.short()
    assert gain["objective"] == full.objective
