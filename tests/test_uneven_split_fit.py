"""A job that fits only with an uneven pipeline split (planner.search.uneven_split_plans).

DeepSeek-V3 on 160 H100 at batch 256: every plan misses HBM at Megatron's default stage split
(the smallest, tp8 pp5 cp4 ep4 at [12,13,12,12,12], takes 79.8 GiB of 77.6 usable), but the
early pipeline ranks hold more microbatches in flight, so fewer layers there fit: `check` had
answered no, `plan` "No plan fits", and the what-if said 168 GPUs where 160 do. An independent
audit of `check` found it by re-checking its claims with `planner estimate --pipeline-layout`."""
from __future__ import annotations

from typer.testing import CliRunner

from constraints.space import build_space
from hardware import load_system
from planner.analytical import estimate
from planner.cli import app
from planner.model import load_model
from planner.plan import JobSpec
from planner.search import check, memory_floor, plan

GIB = 2**30
runner = CliRunner()


def _job(**pins) -> tuple:
    return load_model("deepseek-v3"), load_system("h100-sxm", 160), JobSpec(global_batch=256, pins=pins)


def test_check_says_yes_with_a_split_that_fits_where_no_default_split_does():
    model, system, job = _job()
    floor = memory_floor(build_space(model, system, job))
    assert floor.hbm_bytes > floor.usable_hbm_bytes  # the default splits: none fits
    res = check(model, system, job)
    assert res.feasible and "uneven pipeline split" in res.reasons[0]
    p = res.best.plan
    assert p.pp > 1 and p.stage_layers is not None and len(set(p.stage_layers)) > 1
    est = estimate(model, system, p, job)  # the exact model, independently of the search
    assert est.feasible and est.hbm_bytes <= floor.usable_hbm_bytes
    assert est.step_time_s == res.best.estimate.step_time_s
    # the same layout at the default split does not fit: the split is what makes it fit
    even = p.model_copy(update={"stage_layers": None, "stage_recompute_layers": None})
    assert estimate(model, system, even, job).hbm_bytes > floor.usable_hbm_bytes


def test_plan_finds_it_and_says_how():
    model, system, job = _job(tp=8, pp=5)  # the pins keep the search small; the same path
    res = plan(model, system, job, top_k=2)
    assert res.ranked and "uneven pipeline split" in res.stats["uneven_split_note"]
    assert [r.objective for r in res.ranked] == sorted(r.objective for r in res.ranked)
    for r in res.ranked:
        assert r.plan.pp == 5 and r.plan.stage_layers is not None and r.estimate.feasible


def test_the_cli_check_prints_the_plan_and_the_note():
    result = runner.invoke(app, ["check", "-m", "deepseek-v3", "-s", "h100-sxm", "-g", "160", "-b", "256"])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert text.startswith("yes:") and "layers per virtual stage" in text
    assert "fits only with an uneven pipeline split" in text and "a faster plan may exist" in text
