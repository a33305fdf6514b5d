"""The attention kernel's head-width factor (planner/analytical/kernels.py) against the H100
measurement it is fitted on (planner/data/h100_attention.csv)."""
from __future__ import annotations

import csv
import math
import statistics
from pathlib import Path

import pytest

from hardware import load_system
from planner.analytical import estimate, kernels
from planner.model import load_model
from planner.plan import JobSpec, Plan

CSV = Path(__file__).resolve().parents[1] / "planner" / "data" / "h100_attention.csv"


@pytest.mark.parametrize("backend", ["cudnn", "flash"])
def test_exponent_is_the_measured_96_vs_128_ratio(backend):
    rows = list(csv.DictReader(CSV.open()))
    exps = []
    for seq in ("2048", "4096", "8192"):
        d128 = [float(r["planner_equiv_tflops"]) for r in rows if r["backend"] == backend and r["seq"] == seq
                and r["head_dim"] == "128"]
        d96 = next(float(r["planner_equiv_tflops"]) for r in rows if r["backend"] == backend and r["seq"] == seq
                   and r["head_dim"] == "96")
        exps.append(math.log(d96 / statistics.mean(d128)) / math.log(96 / 128))
    assert kernels.ATTENTION_HEAD_DIM_EXPONENT[backend] == pytest.approx(statistics.mean(exps), abs=5e-4)


def test_factor_by_head_width():
    gpt_oss, llama, dsv3 = (load_model(m) for m in ("gpt-oss-120b", "llama3-8b", "deepseek-v3"))
    assert gpt_oss.head_dim == 64 and llama.head_dim == 128
    assert kernels.attention_head_dim_factor(gpt_oss, "cudnn") == pytest.approx(0.5 ** 0.784)
    assert kernels.attention_head_dim_factor(gpt_oss, "flash") == pytest.approx(0.5 ** 0.417)
    assert kernels.attention_head_dim_factor(llama, "cudnn") == 1.0
    assert kernels.attention_head_dim_factor(dsv3, "cudnn") == 1.0  # MLA: 192-wide queries/keys


def test_narrow_heads_cost_attention_time_in_the_step():
    """The same model with 64-wide heads (twice the heads, same widths) spends 1/0.5^0.784 the
    attention-core time of its 128-wide twin; nothing else changes."""
    base = load_model("llama3-8b")
    narrow = base.model_copy(update={"heads": 64, "head_dim": 64, "query_groups": 16})
    system, job = load_system("h100-sxm", 8), JobSpec(global_batch=8)
    plan = Plan(dp=8, micro_batch=1, global_batch=8)
    from planner.analytical.layer_kinds import lead_layers
    from planner.analytical.plans import PlanArrays
    from planner.analytical.time import layer_compute_fwd_s

    def attention_s(m):
        return float(layer_compute_fwd_s(m, system, job, PlanArrays.from_plans([plan], m.layers, lead_layers(m)))
                     ["attention"][0])
    wide_t, narrow_t = attention_s(base), attention_s(narrow)
    assert narrow_t == pytest.approx(wide_t / 0.5 ** 0.784, rel=1e-9)
    assert estimate(narrow, system, plan, job).step_time_s > estimate(base, system, plan, job).step_time_s
