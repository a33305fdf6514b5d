"""Adam's moments in bf16 (JobSpec.adam_moments, Megatron's precision-aware optimizer): the
optimizer state and the optimizer step, hand-derived from the bytes per parameter."""
from __future__ import annotations

import pytest
from typer.testing import CliRunner

from hardware import load_system
from planner.analytical import estimate
from planner.analytical.time import optimizer_step_bytes_per_param
from planner.cli import app
from planner.model import load_model
from planner.plan import BytesPerParam, JobSpec, Plan


def test_bytes_per_param_hand_derived():
    # Megatron's mixed-precision Adam: 4 B master + 8 B moments; bf16 moments 4 B
    assert JobSpec().bytes_per_param.optimizer_total == 12.0
    assert JobSpec(adam_moments="bf16").bytes_per_param.optimizer_total == 8.0
    # the step reads the fp32 gradient, reads and writes master and moments, writes the weight
    assert optimizer_step_bytes_per_param(JobSpec()) == 4 + 2 * 12 + 2 == 30.0
    assert optimizer_step_bytes_per_param(JobSpec(adam_moments="bf16")) == 4 + 2 * 8 + 2 == 22.0
    # other bytes_per_param fields survive; a contradicting optimizer byte count is refused
    assert JobSpec(adam_moments="bf16", bytes_per_param={"grads": 2.0}).bytes_per_param.grads == 2.0
    with pytest.raises(ValueError, match="contradicts bytes_per_param.optimizer"):
        JobSpec(adam_moments="bf16", bytes_per_param={"optimizer": 6.0})


def test_bytes_per_param_for_adam_moments():
    # the one mapping `planner checkpoint` and `planner megatron`'s save interval use: Megatron's
    # 18 B/param with fp32 moments (2 + 4 + 4 + 8), 14 with bf16 ones (2 + 4 + 4 + 4), as JobSpec's
    assert BytesPerParam.for_adam_moments("fp32").total == 18.0
    assert BytesPerParam.for_adam_moments("bf16").total == 14.0
    assert BytesPerParam.for_adam_moments("bf16") == JobSpec(adam_moments="bf16").bytes_per_param
    with pytest.raises(ValueError, match="^adam moments 'fp8': expected one of fp32, bf16$"):
        BytesPerParam.for_adam_moments("fp8")


def test_optimizer_state_and_step_scale_by_the_bytes():
    """Same plan, fp32 vs bf16 moments: optimizer-state memory 8/12, optimizer step 22/30, and
    nothing else moves (weights, gradients, activations, compute)."""
    model, system = load_model("llama3-8b"), load_system("h100-sxm", 8)
    plan = Plan(tp=1, pp=1, dp=8, micro_batch=1, global_batch=64, recompute="full", zero_stage=1)
    fp32 = estimate(model, system, plan, JobSpec(global_batch=64))
    bf16 = estimate(model, system, plan, JobSpec(global_batch=64, adam_moments="bf16"))
    m32, m16 = fp32.memory_breakdown_bytes, bf16.memory_breakdown_bytes
    assert m16["optimizer_bytes"] / m32["optimizer_bytes"] == pytest.approx(8 / 12, rel=1e-12)
    for key in ("weights_bytes", "grads_bytes", "activations_bytes"):
        assert m16[key] == m32[key], key
    t32, t16 = fp32.time_breakdown_s, bf16.time_breakdown_s
    assert t16["optimizer_step_s"] / t32["optimizer_step_s"] == pytest.approx(22 / 30, rel=1e-12)
    assert t16["forward_s"] == t32["forward_s"] and t16["backward_s"] == t32["backward_s"]


def test_cli_takes_the_two_dtypes_only():
    runner = CliRunner()
    bad = runner.invoke(app, ["estimate", "-m", "llama3-8b", "-s", "h100-sxm", "-g", "8", "--tp", "1", "--pp", "1",
                              "--adam-moments", "fp16"])
    assert bad.exit_code == 2 and "adam-moments: must be one of fp32, bf16, got 'fp16'" in bad.output
    # ZeRO-0 has no distributed optimizer to run the precision-aware one on: refused for Megatron
    out = runner.invoke(app, ["megatron", "-m", "llama3-8b", "-s", "h100-sxm", "-g", "8", "-b", "64", "--tp", "1",
                              "--pp", "1", "--zero-stage", "0", "--adam-moments", "bf16", "--format", "args"])
    assert out.exit_code == 2 and "bf16 moments need Megatron's precision-aware optimizer" in out.output

