"""Issue 8: uneven pipeline layouts go through Megatron-LM's own parser and TransformerConfig
(megatron-core 0.19.2 on CPU, ../shared/tools/megatron_check); skips with the reason when that
environment is missing. Each case checks that Megatron accepts the flags `planner megatron`
emits and builds the layers per pipeline rank the plan says."""
from __future__ import annotations

import pytest

from constraints.stages import best_stages
from hardware import load_system
from planner.model import load_model
from planner.pipeline_layout import plan_layout, rank_layers
from planner.plan import JobSpec, Plan
from tests.megatron_parser import checker_batch
from tests.test_megatron_parser import _checker_case

CASES = [
    # 126 layers on pp8 × vpp8: the balanced split is account-for-embedding-and-loss
    ("llama3.1-405b", "h100-sxm", 1024, "fp8",
     dict(tp=8, pp=8, cp=2, dp=8, vpp=8, micro_batch=1, global_batch=1536, sequence_parallel=True),
     "--account-for-embedding-in-pipeline-split"),
    # 96 layers on pp 7: (96 + 2)/7 = 14, first and last rank 13
    ("gpt3-175b", "a100-80g", 112, "bf16",
     dict(tp=8, pp=7, dp=2, micro_batch=1, global_batch=64, sequence_parallel=True),
     "--account-for-loss-in-pipeline-split"),
    # 80 layers on pp3 × vpp2: no named form fits, the layout string
    ("llama3-70b", "h100-sxm", 48, "bf16",
     dict(tp=8, pp=3, dp=2, vpp=2, micro_batch=1, global_batch=48, sequence_parallel=True),
     "--pipeline-model-parallel-layout"),
    # an explicit split with a lighter first and last rank: decoder-first/last
    ("llama3-8b", "h100-sxm", 32, "bf16",
     dict(tp=8, pp=4, dp=1, micro_batch=1, global_batch=16, sequence_parallel=True,
          stage_layers=(6, 9, 9, 8)),
     "--decoder-first-pipeline-num-layers"),
]


def _solver_case():
    """The per-stage CP-SAT answer where memory binds: a free layout with block recompute, per
    virtual stage, on an interleaved pipeline (Llama-3 70B bf16, pp4 x vpp2, 50 GiB reserve: proven
    optimal in well under a second; in FP8, whose GEMM inputs take less memory, the same reserve
    is not proven within the 10 s limit (a feasible layout of the same kind comes back); the 405B pp8 x vpp8 case of bench/search_speed.py STAGE_CASES
    takes ~10 s and goes through the same emission path)."""
    model, system = load_model("llama3-70b"), load_system("h100-sxm", 64)
    plan = Plan(tp=8, pp=4, dp=2, vpp=2, micro_batch=1, global_batch=64, sequence_parallel=True, recompute="full")
    chosen, sol = best_stages(model, system, JobSpec(global_batch=64, dtype="bf16", hbm_reserve_gib=50), plan)
    assert chosen is not None and chosen.stage_recompute_layers and sol.proven_optimal
    assert len(set(chosen.stage_layers)) > 1 and len(set(chosen.stage_recompute_layers)) > 1  # uneven both
    return ("llama3-70b", "h100-sxm", 64, "bf16", chosen.model_dump(), "--pipeline-model-parallel-layout")


@checker_batch("pipeline_megatron")
def _checker_cases(tmp_path_factory):
    built = [(_checker_case(*c[:5])[:3], c[5]) for c in CASES + [_solver_case()]]
    return built, [b[0][0] for b in built]


@pytest.fixture(scope="module")
def parsed(megatron_checked):
    """This module's argument lists through the shared checker process (tests/conftest.py)."""
    built, results = megatron_checked.get("pipeline_megatron")
    return list(zip(built, results))


def test_megatron_builds_the_uneven_layouts(parsed):
    assert len(parsed) == 5
    for ((case, model, plan), flag), res in parsed:
        label = f"{model.name} {plan.short()}"
        assert flag in case["argv"], (label, case["argv"])
        assert res["ok"], (label, res.get("error"))
        cfg = res["cfg"]
        assert (cfg["pipeline_model_parallel_size"], cfg["virtual_pipeline_model_parallel_size"] or 1) == \
            (plan.pp, plan.vpp), label
        if plan.stage_recompute_layers:
            assert cfg["recompute_method"] == "block"
            assert cfg["recompute_num_layers"] == max(plan.stage_recompute_layers), label
        loads = rank_layers(plan_layout(plan, model.layers), plan.pp)
        first, last = cfg.get("num_layers_in_first_pipeline_stage"), cfg.get("num_layers_in_last_pipeline_stage")
        if first is not None:
            assert first == loads[0], label
        if last is not None:
            assert last == loads[-1], label
