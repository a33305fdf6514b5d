"""The calibrated model against the published runs in ../shared/reference (regression guard)."""
import pytest

from planner.calibration import accuracy_rows, load_reference, summarize
from tests.conftest import REFERENCE

pytestmark = pytest.mark.skipif(not REFERENCE.exists(), reason="shared/reference not beside the repository")


@pytest.fixture(scope="module")
def rows():
    cases, skipped = load_reference(REFERENCE)
    assert len(cases) >= 200 and len(skipped) <= 20
    return accuracy_rows(cases)


def test_every_modelled_row_fits_or_is_known(rows):
    assert all(r["predicted_s"] > 0 for r in rows)


def test_accuracy_by_framework(rows):
    by_fw = summarize(rows, "framework")
    # Numbers as of the calibration in hardware/presets/accelerators (README, Accuracy).
    assert by_fw["Megatron/NeMo"]["mean_abs_error"] < 0.065
    by_source = summarize(rows, "source")
    assert by_source["dgxc_v24.11.1"]["mean_abs_error"] < 0.05
    assert by_source["nemo2407"]["mean_abs_error"] < 0.06


def test_narayanan_ptd_rows_within_five_percent(rows):
    ptd = [r for r in rows if r["id"].startswith("narayanan2021_t2_ptd")]
    assert len(ptd) == 6
    assert max(abs(r["error"]) for r in ptd) < 0.05


def test_published_runs_fit_in_hbm(rows):
    # A run that was measured must fit: our memory model may be conservative, never wildly so.
    over = [r for r in rows if not r["fits_hbm"]]
    assert len(over) <= 5, [r["id"] for r in over]
