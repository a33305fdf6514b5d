"""Expert weight-gradient GEMMs against the roofline with fp32 main-gradient accumulation
(planner/analytical/time.py: expert_wgrad_memory_excess_s), by hand."""
from __future__ import annotations

import pytest

from planner.analytical import PlanArrays
from planner.analytical import time as tm
from planner.model import load_model
from planner.plan import JobSpec, Plan

QWEN3 = load_model("qwen3-235b-a22b")  # h 4096, expert FFN 1536 (SwiGLU), 128 experts


def _plan(ep: int) -> PlanArrays:
    plan = Plan(tp=4, pp=8, dp=8, ep=ep, etp=1, micro_batch=1, global_batch=2048, sequence_parallel=True)
    return PlanArrays.from_plans([plan], QWEN3.layers)


def test_wgrad_bytes_by_hand():
    # ep 8: 16 local experts, 512 rows each. FC1: rows·(h + 2·ffn)·2 B operands + 8 B·h·2ffn fp32 dW
    # read+write = 512·7168·2 + 8·4096·3072 = 108,003,328 B; FC2: 512·(1536 + 4096)·2 + 8·1536·4096
    # = 56,098,816 B; 16 experts: 2,625,634,304 B.
    hbm = 1.76e12
    excess = tm.expert_wgrad_memory_excess_s(QWEN3, JobSpec(), _plan(8), 512.0, 0.5e-3, hbm)
    assert excess[0] == pytest.approx(2_625_634_304 / hbm - 0.5e-3, rel=1e-12)


def test_compute_bound_wgrad_costs_nothing_extra():
    # ep 32: 4 local experts of 4096 rows; the same memory time is far below a compute time that
    # large, so the roofline's max is the compute already charged
    assert tm.expert_wgrad_memory_excess_s(QWEN3, JobSpec(), _plan(32), 4096.0, 1.0, 1.76e12)[0] == 0.0


def test_fp8_operands_are_one_byte():
    hbm = 1.76e12
    bf16 = tm.expert_wgrad_memory_excess_s(QWEN3, JobSpec(), _plan(8), 512.0, 0.0, hbm)[0]
    fp8 = tm.expert_wgrad_memory_excess_s(QWEN3, JobSpec(dtype="fp8"), _plan(8), 512.0, 0.0, hbm)[0]
    operands = 16 * 512 * ((4096 + 3072) + (1536 + 4096))  # elements, 1 byte saved each
    assert (bf16 - fp8) * hbm == pytest.approx(operands, rel=1e-12)
