"""Leave-one-family-out: a family's LOFO prediction must not depend on its own measurements,
while the in-sample fit does; families with no fitted rows keep the full fit."""
import dataclasses

import pytest
from typer.testing import CliRunner

from planner import fit
from planner.cli import app
from planner.analytical import data_parallel
from planner.fit import (fit_all, fit_sharded_dp, fit_torch_stack, lofo_predictions, prepare,
                         with_torch_stack)
from planner.reference import load_reference

runner = CliRunner()


@pytest.fixture(scope="module", autouse=True)
def quick_fits():
    """What these tests assert (which measurements a LOFO prediction depends on, which parameters
    a family's rows move) holds at any number of golden-section steps: 4 instead of the fit's
    11-12 keeps the module's many refits fast. Fit quality is tested where the fit is reproduced
    (tests/test_blackwell_precision.py) and in the accuracy tests."""
    golden = fit._golden
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(fit, "_golden", lambda f, lo, hi, x0, iters, f_x0=None: golden(f, lo, hi, x0, min(iters, 4), f_x0))
        yield


@pytest.fixture(scope="module")
def all_cases():
    return load_reference()[0]


@pytest.fixture(scope="module")
def small(all_cases):
    cases = all_cases
    # Llama-3 a majority of the fitted rows, so that the in-sample fit must follow its measurements
    picked = [c for c in cases if c.source == "nemo2407"]
    picked += [c for c in cases if c.source == "dgxc_v24.11.1" and c.family == "Llama-3"][:8]
    picked += [c for c in cases if c.family == "MPT" and c.system.accelerator.name == "H100-SXM5-80GB"][:2]
    assert {c.family for c in picked} >= {"GPT", "Llama-3", "Nemotron-4", "MPT"}
    return picked


@pytest.fixture(scope="module")
def base_fit(small):
    """(prepared rows, full fit, LOFO predictions of the two families the tests read) of `small`,
    fitted once for both tests."""
    prepared = prepare(small)
    full = fit_all(prepared)
    return prepared, full, lofo_predictions(prepared, full, families={"Llama-3", "MPT"})


def test_lofo_prediction_ignores_the_familys_own_measurements(small, base_fit):
    base, full_base, lofo = base_fit
    # the Llama-3 rows measured twice as slow: their LOFO predictions must not move,
    # the in-sample fit must
    slowed = [dataclasses.replace(c, measured_step_s=2 * c.measured_step_s) if c.family == "Llama-3" else c
              for c in small]
    moved = prepare(slowed)
    full_moved = fit_all(moved)
    lofo_moved = lofo_predictions(moved, full_moved, families={"Llama-3"})
    llama = [c.id for c in small if c.family == "Llama-3"]
    assert llama and all(lofo_moved[i] == pytest.approx(lofo[i], rel=1e-12) for i in llama)
    assert set(lofo_moved) == set(llama)  # only the family asked for was refitted
    assert full_moved["H100-SXM5-80GB"] != full_base["H100-SXM5-80GB"]


def test_family_without_fitted_rows_keeps_the_full_hardware_fit(base_fit):
    """MPT has no fitted hardware rows: its rows keep the full hardware fit, with the torch-stack
    parameters (planner/fit.py TORCH_STACK_FITS) and the sharded-DP ones (SHARDED_DP_FITS)
    refitted without MPT."""
    prepared, full, lofo = base_fit
    keep = lambda c: c.family != "MPT"  # noqa: E731
    without_mpt = fit_torch_stack(prepared, full, keep)
    dp = fit_sharded_dp(prepared, lambda p: with_torch_stack(p, full, without_mpt), keep)
    # no other sharded rows in this sample: nothing is known, no contention
    assert dp["FSDP_COMPUTE_CONTENTION"] == 0.0
    with data_parallel.parameters(**dp):
        for p in prepared:
            if p.case.family == "MPT":
                assert not p.case.fit
                assert lofo[p.case.id] == pytest.approx(p.predict_s(with_torch_stack(p, full, without_mpt)),
                                                        rel=1e-12)


def test_sharded_dp_lofo_ignores_the_familys_own_measurements(all_cases):
    """The DeepSpeed ZeRO-3 rows are all GPT: measured twice as slow, their in-sample DeepSpeed fit
    moves, their leave-one-family-out prediction does not (no DeepSpeed rows remain: the NCCL ring
    at the FSDP contention fitted on the other families' FSDP rows)."""
    cases = all_cases
    picked = [c for c in cases if c.framework == "DeepSpeed ZeRO-3"]
    picked += [c for c in cases if c.framework == "torchtitan FSDP2" and c.system.num_gpus <= 8][:5]
    slowed = [dataclasses.replace(c, measured_step_s=2 * c.measured_step_s) if c.family == "GPT" else c
              for c in picked]
    base, moved = prepare(picked), prepare(slowed)
    fit_base, fit_moved = fit_sharded_dp(base), fit_sharded_dp(moved)
    assert fit_moved["DEEPSPEED_ZERO3_BW_EFFICIENCY"] < fit_base["DEEPSPEED_ZERO3_BW_EFFICIENCY"]
    assert fit_moved["FSDP_COMPUTE_CONTENTION"] == fit_base["FSDP_COMPUTE_CONTENTION"]
    lofo, lofo_moved = lofo_predictions(base, fit_all(base)), lofo_predictions(moved, fit_all(moved))
    gpt = [c.id for c in picked if c.family == "GPT"]
    assert len(gpt) == 6 and all(lofo_moved[i] == pytest.approx(lofo[i], rel=1e-12) for i in gpt)


def test_validate_lofo_prints_both_columns():
    result = runner.invoke(app, ["validate", "--source", "nemo2407", "--summary", "--lofo"])
    assert result.exit_code == 0, result.output
    assert "leave-one-family-out" in result.output and "LOFO mean" in result.output


def test_moe_parameters_are_refitted_without_the_family(all_cases):
    """The fitted MoE constant (all-to-all overlap efficiency) follows the rows it is fitted on, and
    a MoE family's LOFO prediction does not depend on its own measurements. The expert host time is
    a kernel measurement: no refit moves it."""
    from planner.analytical import time as tm
    from planner.fit import fit_moe
    grok = [c for c in all_cases if c.family == "Grok-1"][:10]  # enough rows to fit both without Qwen3
    qwen = [c for c in all_cases if c.family == "Qwen3" and c.source.startswith("bridge")][:3]
    picked = grok + qwen
    slowed = [dataclasses.replace(c, measured_step_s=1.5 * c.measured_step_s) if c.family == "Qwen3" else c
              for c in picked]
    base, moved = prepare(picked), prepare(slowed)
    assert fit_moe(moved) != fit_moe(base)
    assert set(fit_moe(moved)) == {"A2A_OVERLAP_EFFICIENCY"}  # EXPERT_GEMM_HOST_US is measured
    saved = {n: getattr(tm, n) for n in tm.MOE_FITTED_PARAMETERS}
    lofo = lofo_predictions(base, fit_all(base), families={"Qwen3"})
    lofo_moved = lofo_predictions(moved, fit_all(moved), families={"Qwen3"})
    assert {n: getattr(tm, n) for n in tm.MOE_FITTED_PARAMETERS} == saved  # constants restored
    assert all(lofo_moved[c.id] == pytest.approx(lofo[c.id], rel=1e-12) for c in qwen)


def test_validate_keeps_the_ladder_steps_apart():
    """The DeepSeek-V3 GB200 guide's 13 rows: its 12 untuned steps are their own group, its tuned
    end state (step 12) counts with the tuned MoE runs."""
    import json
    result = runner.invoke(app, ["validate", "--source", "mcore-dsv3", "--json"])
    assert result.exit_code == 0, result.output
    groups = json.loads(result.output)["summary"]["software"]
    assert groups["MoE, untuned optimisation-ladder step"]["rows"] == 12
    assert groups["MoE, tuned"]["rows"] == 1


def test_a_group_left_without_fitted_rows_takes_the_h100_fit_not_its_own_preset(all_cases):
    """Every fitted A100 row is GPT, and the A100 preset was fitted on them: holding GPT out, the
    A100 rows take the H100 fit made without GPT plus the H100's measured kernel shapes, never the
    A100 preset (that would be an in-sample prediction under a LOFO label)."""
    from hardware.load import load_accelerator
    from planner.fit import MEASURED, fit_groups
    picked = [c for c in all_cases if c.source == "narayanan2021" and c.fit][:3]
    picked += [c for c in all_cases if c.source == "nemo2407"]
    prepared = prepare(picked)
    lofo = lofo_predictions(prepared, fit_all(prepared), families={"GPT"})
    h100_without_gpt = fit_groups(prepared, lambda c: c.family != "GPT")["H100-SXM5-80GB"][0]
    h100 = load_accelerator("h100-sxm5-80gb").efficiency
    expected = {**{n: getattr(h100, n) for n in MEASURED if getattr(h100, n) is not None}, **h100_without_gpt}
    a100 = [p for p in prepared if p.group == "A100-SXM4-80GB"]
    assert len(a100) == 3
    for p in a100:
        assert lofo[p.case.id] == pytest.approx(p.predict_s(expected), rel=1e-12)
        assert abs(lofo[p.case.id] / p.predict_s(None) - 1) > 0.01  # not the GPT-fitted preset



def test_a_group_left_without_megatron_rows_keeps_its_own_torch_gemm_ceiling(all_cases):
    """Holding GPT out leaves the A100 without Megatron rows, but its PyTorch-stack rows (MPT,
    torchtitan Llama) still measure its GEMM ceiling: the A100's GPT rows take the H100 fit made
    without GPT for everything but that, and `matmul_max_torch` fitted without GPT for it."""
    from hardware.load import load_accelerator
    from planner.fit import MEASURED, fit_groups, fit_torch_stack, torch_stack_row
    picked = [c for c in all_cases if c.source == "narayanan2021" and c.fit][:3]
    picked += [c for c in all_cases if c.source == "nemo2407"]
    a100_torch = [c for c in all_cases if torch_stack_row(c) and c.system.accelerator.name == "A100-SXM4-80GB"]
    picked += a100_torch[::12]
    prepared = prepare(picked)
    keep = lambda c: c.family != "GPT"  # noqa: E731
    lofo = lofo_predictions(prepared, fit_all(prepared), families={"GPT"})
    h100_without_gpt = fit_groups(prepared, keep)["H100-SXM5-80GB"][0]
    h100 = load_accelerator("h100-sxm5-80gb").efficiency
    borrowed = {**{n: getattr(h100, n) for n in MEASURED if getattr(h100, n) is not None}, **h100_without_gpt}
    own = fit_torch_stack(prepared, {g: v[0] for g, v in fit_groups(prepared, keep).items()}, keep)
    ceiling = own["A100-SXM4-80GB"]["matmul_max_torch"]
    assert ceiling is not None
    a100 = [p for p in prepared if p.group == "A100-SXM4-80GB" and p.case.family == "GPT"]
    assert len(a100) == 3
    for p in a100:
        assert lofo[p.case.id] == pytest.approx(p.predict_s({**borrowed, "matmul_max": ceiling}), rel=1e-12)
        assert abs(lofo[p.case.id] / p.predict_s(borrowed) - 1) > 0.01  # not the borrowed ceiling


def test_the_v100_inherits_the_a100_set_as_mended_with_its_torch_ceiling(all_cases):
    """The V100 (GPT-style rows only) inherits the A100's parameters. Holding GPT out, the A100's
    set is the H100's with the A100's own torch GEMM ceiling; the V100 had been fitted before that
    ceiling was put in, and took the H100's (0.667 against the A100's 0.81: 29 % off). With no
    V100 row left to fit, its prediction now uses exactly the A100's mended set."""
    from hardware.load import load_accelerator
    from planner.fit import MEASURED, fit_groups, fit_torch_stack, torch_stack_row
    picked = [c for c in all_cases if c.source == "narayanan2021" and c.fit][:3]
    picked += [c for c in all_cases if c.source == "nemo2407"]
    picked += [c for c in all_cases if torch_stack_row(c) and c.system.accelerator.name == "A100-SXM4-80GB"][::12]
    v100 = [c for c in all_cases if c.system.accelerator.name.startswith("V100")]
    assert v100 and all(c.family == "GPT" for c in v100)
    prepared = prepare(picked + v100)
    keep = lambda c: c.family != "GPT"  # noqa: E731
    lofo = lofo_predictions(prepared, fit_all(prepared), families={"GPT"})
    groups = fit_groups(prepared, keep)
    h100 = load_accelerator("h100-sxm5-80gb").efficiency
    borrowed = {**{n: getattr(h100, n) for n in MEASURED if getattr(h100, n) is not None},
                **groups["H100-SXM5-80GB"][0]}
    ceiling = fit_torch_stack(prepared, {g: v[0] for g, v in groups.items()}, keep)["A100-SXM4-80GB"]["matmul_max_torch"]
    assert ceiling is not None and abs(ceiling - borrowed.get("matmul_max", h100.matmul_max)) > 0.05
    for p in (p for p in prepared if p.group == "V100-SXM3-32GB"):
        assert lofo[p.case.id] == pytest.approx(p.predict_s({**borrowed, "matmul_max": ceiling}), rel=1e-12)
        assert abs(lofo[p.case.id] / p.predict_s(borrowed) - 1) > 0.01  # not the set as borrowed


def test_batched_scoring_predicts_every_row_as_alone(prepared_reference):
    """The fit scores rows in batches (planner.fit.Batched: one step_time call for the rows that
    share a model, system and job but for the global batch and GPU count); each prediction equals
    the row costed alone, at efficiencies away from the presets'."""
    from planner.fit import Batched
    rows = [p for p in prepared_reference if p.group and p.case.fit]
    batched = Batched(rows)
    assert len(batched.groups) < len(rows)
    params = {"matmul_max": 0.61, "hbm_efficiency": 0.55, "layer_overhead_us": 120.0}
    assert batched.predict_s(params) == pytest.approx([p.predict_s(params) for p in rows], rel=1e-12)
