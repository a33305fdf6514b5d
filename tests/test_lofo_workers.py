"""`planner validate --lofo --workers N`: the families' refits run in worker processes and give
exactly the predictions of the one-process loop (each family's refit is independent)."""
from typer.testing import CliRunner

from planner.cli import app
from planner.fit import fit_all, lofo_predictions, prepare
from planner.reference import load_reference


def test_worker_processes_give_the_same_lofo_predictions():
    by_family: dict[str, list] = {}
    for case in load_reference()[0]:
        if case.source == "nemo2407":
            by_family.setdefault(case.family, []).append(case)
    cases = [case for family in sorted(by_family) for case in by_family[family][:2]]  # two rows each: quick fits
    prepared = prepare(cases)
    full = fit_all(prepared)
    families = {c.family for c in cases}
    assert len(families) >= 2
    alone = lofo_predictions(prepared, full, families=families)
    side_by_side = lofo_predictions(prepared, full, families=families, workers=2)
    assert alone == side_by_side  # bit for bit
    assert set(alone) == {c.id for c in cases}


def test_workers_must_be_positive():
    result = CliRunner().invoke(app, ["validate", "--lofo", "--workers", "0"])
    assert result.exit_code == 2
    assert "workers: must be an integer from 1 to 256, got 0" in result.output
