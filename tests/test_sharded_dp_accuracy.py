"""Sharded data parallel against the published FSDP / ZeRO-3 runs: what each implementation's
mechanisms were fitted to, so that a regression in any of them shows (in-sample; the
leave-one-family-out figures are `planner validate --summary --lofo`, README)."""
from __future__ import annotations

import numpy as np
import pytest

from planner.analytical import data_parallel as dpc
from planner.analytical.time import overlapped_collective_s
from planner.calibration import accuracy_rows, predict
from planner.reference import load_reference

# mean |error| measured 2026-11-23 (planner validate --json) plus a small margin: after the FSDP/
# dense round DeepSpeed 4.0 %, Megatron-FSDP 5.3 %, torchtitan 10.1 %, llm-foundry 5.6 %; torchtitan
# 10.8 % with the async-TP page's 12 records read (2026-11-26)
GROUP_MEAN_ABS_ERROR = {"DeepSpeed ZeRO-3": 0.045, "Megatron-FSDP": 0.058, "torchtitan FSDP2": 0.113,
                        "llm-foundry FSDP": 0.061}


@pytest.fixture(scope="module")
def cases():
    return [c for c in load_reference()[0] if c.framework in GROUP_MEAN_ABS_ERROR]


def test_each_sharded_dp_framework_meets_its_measured_accuracy(cases):
    rows = accuracy_rows(cases)
    for framework, bound in GROUP_MEAN_ABS_ERROR.items():
        errors = [abs(r["error"]) for r in rows if r["framework"] == framework]
        assert errors, framework
        assert np.mean(errors) <= bound, (framework, np.mean(errors))


def test_deepspeed_gather_bound_steps_do_not_shrink_with_more_gpus(cases):
    """Narayanan et al. SC'21 Table 2: 174B on 768 and 1536 GPUs both ran 66.75 s (88 and 44
    TFLOP/s): per-layer gathers, whose bytes per GPU do not shrink with dp, bound the step. The
    model must reproduce that flatness (it predicted -4 % / -23 % before the contention model)."""
    by_id = {c.id: c for c in cases}
    t768 = predict(by_id["narayanan2021_t2_zero3_174B_768gpu"])["step_time_s"]
    t1536 = predict(by_id["narayanan2021_t2_zero3_174B_1536gpu"])["step_time_s"]
    assert t1536 == pytest.approx(t768, rel=0.05)
    assert t768 == pytest.approx(66.75, rel=0.08)


def test_megatron_fsdp_moe_row_reduces_in_bf16_and_hides_behind_its_all_to_all(cases):
    """The ModelZoo Qwen3-235B Megatron-FSDP run (tp2 ep8, expert DP 32 over the NICs, 17.6 s):
    +57 % with fp32 gradient reduce-scatters hidden behind compute only; with the Megatron-FSDP
    guide's bf16 reduce and the intra-node all-to-all as part of the prefetch window, +15 % (it was
    +4 % while the loader took Qwen3's heads as hidden/heads = 64 wide instead of 128); the bound
    is the issue's MoE maximum, 20 %."""
    case = next(c for c in cases if "fsdp_deepep_3" in c.id)
    assert case.plan.grad_reduce_in_bf16
    assert any("grad-reduce-in-bf16" in a for a in case.assumptions)
    assert predict(case)["step_time_s"] == pytest.approx(17.6, rel=0.20)


def test_model_parallel_comm_widens_the_zero3_prefetch_window():
    """dp_comm_exposed_s with a microbatch's TP/EP communication on other links (mp_fwd, mp_bwd)
    = zero3_exposed_s over the windows compute + that communication. One group: AG 0.4 s, RS
    0.8 s per stage, 4 layers, 2 microbatches, fwd 0.2 s + 0.1 s comm, bwd 0.4 s + 0.2 s comm,
    s = the implementation's contention (Megatron-FSDP for dp_impl 0, PyTorch FSDP for 1). By hand
    (x_f = 0.075, x_b = 0.15 per layer): fwd 0.1 + 3·max(0.025, 0.1s), bwd 0.3 + 3·max(0.15, 0.3s)."""
    s = dpc.MEGATRON_FSDP_COMPUTE_CONTENTION
    n = 8.0
    # ring volumes that give AG 0.4 s and RS 0.8 s at 100 GB/s over 8 ranks
    ag_bytes = 0.4 * 100e9 * n / (n - 1)
    groups = [(2 * ag_bytes, ag_bytes, n, 100e9, 0.0)]
    got = dpc.dp_comm_exposed_s(groups, np.array([3]), np.array([0]), 2.0, 0.2, 0.4, 1, 1, 4.0,
                                np.array([True]), overlapped_collective_s, 0.1, 0.2)
    fwd = 0.1 + 3 * max(0.1 - 0.075, s * 0.1)
    bwd = 0.3 + 3 * max(0.3 - 0.15, s * 0.3)
    assert float(got[0]) == pytest.approx(2 * (fwd + bwd))
    without = dpc.dp_comm_exposed_s(groups, np.array([3]), np.array([0]), 2.0, 0.2, 0.4, 1, 1, 4.0,
                                    np.array([True]), overlapped_collective_s)
    assert float(without[0]) > float(got[0])
    s = dpc.FSDP_COMPUTE_CONTENTION
    torch_fsdp = dpc.dp_comm_exposed_s(groups, np.array([3]), np.array([1]), 2.0, 0.2, 0.4, 1, 1, 4.0,
                                       np.array([True]), overlapped_collective_s, 0.1, 0.2)
    fwd = 0.1 + 3 * max(0.1 - 0.075, s * 0.1)
    bwd = 0.3 + 3 * max(0.3 - 0.15, s * 0.3)
    assert float(torch_fsdp[0]) == pytest.approx(2 * (fwd + bwd))


def test_fsdp_shard_grad_op_gathers_in_forward_and_reduces_in_backward_per_layer():
    """PyTorch FSDP SHARD_GRAD_OP (ZeRO-2 as llm-foundry runs it): per layer a prefetched gather
    before forward and a reduce-scatter after backward, no backward gather. By hand, 4 layers,
    stage AG 0.4 s and RS 0.8 s, 2 microbatches of fwd 0.2 s / bwd 0.4 s, s = 0.1: forward
    0.1 + 3·max(0.1 − 0.05, 0.01) = 0.25, backward 0.2 + 3·max(0.2 − 0.1, 0.02) = 0.5, per
    microbatch; not hidden: 2 · 4 · (0.1 + 0.2)."""
    args = (0.8, 0.4, 0.0, 2, 0.2, 0.4, np.array([4.0, 4.0]), np.array([True, False]), 0.1)
    hidden, exposed = dpc.fsdp_zero2_exposed_s(*args)
    assert hidden == pytest.approx(2 * (0.25 + 0.5))
    assert exposed == pytest.approx(2 * 4 * 0.3)
    # ZeRO-3 on the same numbers adds the backward gather: strictly more
    assert dpc.zero3_exposed_s(*args)[0] > hidden


def test_llm_foundry_shard_grad_op_rows_are_zero2_under_fsdp(cases):
    """The Large Scale H100 table's 1b and 3b rows ran SHARD_GRAD_OP: ZeRO-2 as PyTorch FSDP
    runs it (they were read as FULL_SHARD before)."""
    rows = [c for c in cases if c.framework == "llm-foundry FSDP" and "zero2" in c.id]
    assert len(rows) == 6
    assert all((c.plan.zero_stage, c.plan.dp_impl) == (2, "torch-fsdp2") for c in rows)
    assert all(c.plan.zero_stage == 3 for c in cases if c.framework == "llm-foundry FSDP" and "zero2" not in c.id)
