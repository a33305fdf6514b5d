"""Leave-one-family-out: a family's LOFO prediction must not depend on its own measurements,
while the in-sample fit does; families with no fitted rows keep the full fit."""
import dataclasses

import pytest
from typer.testing import CliRunner

from planner.cli import app
from planner.fit import fit_all, fit_torch_stack, lofo_predictions, prepare, with_torch_stack
from planner.reference import load_reference

runner = CliRunner()


@pytest.fixture(scope="module")
def small():
    cases, _ = load_reference()
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
    parameters refitted without MPT (planner/fit.py TORCH_STACK_FITS)."""
    prepared, full, lofo = base_fit
    without_mpt = fit_torch_stack(prepared, full, lambda c: c.family != "MPT")
    for p in prepared:
        if p.case.family == "MPT":
            assert not p.case.fit
            assert lofo[p.case.id] == pytest.approx(p.predict_s(with_torch_stack(p, full, without_mpt)), rel=1e-12)


def test_validate_lofo_prints_both_columns():
    result = runner.invoke(app, ["validate", "--source", "nemo2407", "--summary", "--lofo"])
    assert result.exit_code == 0, result.output
    assert "leave-one-family-out" in result.output and "LOFO mean" in result.output
