"""The calibrated model against the packaged published runs (regression guard)."""
import pytest

from planner.calibration import load_reference, summarize


@pytest.fixture(scope="module")
def rows(reference_accuracy_rows):
    cases, skipped = load_reference()
    assert len(cases) >= 470 and len(cases) + len(skipped) == 224 + 86 + 306
    assert [r["id"] for r in reference_accuracy_rows] == [c.id for c in cases]
    return reference_accuracy_rows


def test_every_modelled_row_is_predicted(rows):
    assert all(r["predicted_s"] > 0 for r in rows)


def test_accuracy_of_the_fitted_frameworks(rows):
    # Numbers as of the calibration in hardware/presets/accelerators (README, Accuracy).
    by_fw = summarize(rows, "framework")
    assert by_fw["Megatron/NeMo"]["mean_abs_error"] < 0.065
    # Bridge's dense rows; its MoE rows (DeepSeek-V3, Qwen3 on uneven layouts, in since issue 8's
    # layouts entered the loader) miss by the unmodelled EP all-to-all overlap, 15-270 % (README)
    dense_fw = summarize([r for r in rows if r["kind"] == "dense"], "framework")
    assert dense_fw["Megatron-Bridge"]["mean_abs_error"] < 0.08
    by_source = summarize(rows, "source")
    assert by_source["dgxc_v24.11.1"]["mean_abs_error"] < 0.05
    assert by_source["nemo2407"]["mean_abs_error"] < 0.06


def test_narayanan_ptd_rows_within_five_percent(rows):
    ptd = [r for r in rows if r["id"].startswith("narayanan2021_t2_ptd")]
    assert len(ptd) == 6
    assert max(abs(r["error"]) for r in ptd) < 0.05


def test_published_megatron_runs_fit_in_hbm(rows):
    # A run that was measured must fit: our memory model may be conservative, never wildly so.
    over = [r for r in rows if not r["fits_hbm"] and r["source"].startswith(("narayanan", "megatron", "nemo", "dgxc"))]
    dense_over = [r["id"] for r in over if r["kind"] == "dense"]
    assert len(dense_over) <= 5, dense_over
    # Qwen3-235B ModelZoo rows (94 layers, read since uneven layouts landed): our MoE memory is
    # conservative on 9 of them (README, Accuracy); a guard that this does not grow
    moe_over = [r["id"] for r in over if r["kind"] == "MoE"]
    assert len(moe_over) <= 9 and all("qwen3" in i for i in moe_over), moe_over
