"""GB300's compute rate against its fit group (bench/fit_gb300_rate.py): what it scales, which
held-out rows fit it, and that re-running the fit gives the preset's value."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from hardware.load import load_system
from planner.analytical import PlanArrays
from planner.analytical.time import layer_compute_fwd_s
from planner.model import load_model
from planner.plan import JobSpec, Plan

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import fit_gb300_rate  # noqa: E402


def test_rate_scales_gemm_and_attention_not_memory():
    """GB300 is GB200's fit at the fitted rate: GEMM and attention time divide by it, memory-bound
    element-wise work does not move (the HBM is the same 8 TB/s)."""
    gb300 = load_system("gb300-nvl72", 72)
    rate = gb300.accelerator.efficiency.compute_rate_vs_fit_group
    assert rate > 1
    acc = gb300.accelerator
    at_one = gb300.model_copy(update={"accelerator": acc.model_copy(update={
        "efficiency": acc.efficiency.model_copy(update={"compute_rate_vs_fit_group": 1.0})})})
    model = load_model("llama3-70b")
    P = PlanArrays.from_plans([Plan(tp=4, dp=18, micro_batch=1, global_batch=72)], model.layers)
    job = JobSpec(global_batch=72, dtype="fp8")
    fast, slow = layer_compute_fwd_s(model, gb300, job, P), layer_compute_fwd_s(model, at_one, job, P)
    for k in ("gemm", "attention"):
        assert float(fast[k][0]) == pytest.approx(float(slow[k][0]) / rate, rel=1e-12)
    assert float(fast["elementwise"][0]) == pytest.approx(float(slow["elementwise"][0]), rel=1e-12)


def test_fit_and_test_rows_are_split_by_release_and_by_models_the_reference_runs_on_gb200():
    cases = fit_gb300_rate.heldout_cases()
    in_reference, fit_rows, test_rows = fit_gb300_rate.split(cases)
    assert len(in_reference) == 1 and in_reference[0].id.startswith("mcore-modelzoo")
    assert len(fit_rows) == 6 and len(test_rows) >= 50
    assert all(fit_gb300_rate.release_of(c) == "25.11" for c in fit_rows)
    assert not any(fit_gb300_rate.release_of(c) == "25.11" for c in test_rows)
    assert all(c.system.accelerator.name == "GB300-288GB" for c in fit_rows + test_rows)
    # never-seen models are test rows only
    assert not any("GPT_OSS" in c.id or "30B_a3B" in c.id for c in fit_rows)
    assert {c.id.split("_")[2] for c in fit_rows} == {"DeepSeekV3", "LLAMA3", "LLAMA3.1", "Qwen3"}


def test_refit_reproduces_the_preset():
    in_reference, fit_rows, _ = fit_gb300_rate.split(fit_gb300_rate.heldout_cases())
    preset = load_system("gb300-nvl72", 72).accelerator.efficiency.compute_rate_vs_fit_group
    assert fit_gb300_rate.fit_rate(in_reference + fit_rows) == pytest.approx(preset, abs=0.002)
