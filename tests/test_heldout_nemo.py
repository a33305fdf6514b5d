"""bench/heldout_nemo.py: the held-out NeMo performance-summary rows become measured_runs.yaml
records that the reference loader reads."""
from __future__ import annotations

import csv
import re
import sys
from pathlib import Path

import pytest

from planner.reference import REFERENCE_DIR, load_reference

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import heldout_bridge  # noqa: E402
import heldout_nemo  # noqa: E402
from tests.test_heldout_bridge import assert_read_back_as_written  # noqa: E402
from tests.conftest import reference_copy


def _rows():
    return list(csv.DictReader(heldout_nemo.DATA.open()))


def test_every_row_has_its_source_and_becomes_a_record_or_says_why():
    rows = _rows()
    assert len(rows) >= 30 and all(re.fullmatch(r"[0-9a-f]{40}", r["commit"]) and int(r["line"]) > 0
                                   and r["file"].startswith("docs/source/performance/performance_") for r in rows)
    docs = list(csv.DictReader(heldout_nemo.DOCS_DATA.open()))
    assert docs and all(r["url"].startswith("https://docs.nvidia.com/nemo-framework/") for r in docs)
    # the hand-typed rows check themselves: GA = GBS / (MBS · dp) wherever the page prints GA
    for r in docs:
        dp = int(r["gpus"]) // (int(r["tp"]) * int(r["pp"]) * int(r["cp"]))
        assert int(r["gbs"]) == int(r["mbs"]) * dp * int(r["ga"]), r
    recs, skipped = heldout_nemo.records()
    assert set(skipped) <= {"no model preset", "no system preset", "global batch not printed",
                            "FSDP row (a measured_runs record states no FSDP)"} and len(recs) >= 40
    assert_read_back_as_written(recs)


def test_no_row_is_a_reference_record():
    """A 24.07 row with a nemo2407 record's configuration and numbers is in the reference, not held out."""
    ref = reference_copy(REFERENCE_DIR / "measured_runs.yaml")["records"]
    published = {(r["model"]["name"], r["system"]["gpus"], r["parallel"]["global_batch"],
                  float(r["measured"]["tokens_per_sec_per_gpu"])) for r in ref if r["id"].startswith("nemo2407")}
    assert len(published) == 12
    held = {(r["model"], int(r["gpus"]), int(r["gbs"]), float(r["tokens_per_s_per_gpu"]))
            for r in _rows() if r["table"] == "summary"}
    assert held and not held & published


def test_measured_step_time_from_tokens_per_second(tmp_path):
    """24.07 GPT3-175B on 512 H100, GBS 2048, seq 2048, at the 'vboost' revision 141aa8e2: 832
    tokens/s/GPU -> 2048·2048 / (832·512) = 9.846 s (the final revision, in the reference, prints 825)."""
    row = next(r for r in _rows() if r["model"] == "GPT3-175B" and r["gpus"] == "512"
               and r["commit"].startswith("141aa8e2"))
    assert row["tokens_per_s_per_gpu"] == "832"
    path = tmp_path / "one.yaml"
    heldout_bridge.write_yaml(path, [heldout_nemo.record(row)])
    (case,), _ = load_reference([path])
    assert case.measured_step_s == pytest.approx(2048 * 2048 / (832 * 512), rel=1e-4)
    assert (case.plan.tp, case.plan.pp, case.plan.vpp, case.plan.dp, case.plan.micro_batch) == (4, 8, 6, 16, 2)
    assert case.job.dtype == "fp8" and case.model.tied_embeddings


def test_long_sequence_step_time_from_nemo_flop_count(tmp_path):
    """NeMo's llama FLOP count is the one its 24.07 table used: LLAMA3-8B, 711 TFLOP/s at 12273
    tokens/s = 57.93 GFLOP/token at seq 8192. The 25.04 B200 long-sequence row at 8K (2 GPUs,
    batch 512, 1671 TFLOP/s) is then 512·8192·F / (1671e12·2) s."""
    per_token = heldout_nemo.nemo_model_flops_per_token(32, 4096, 32, 8, 14336, 128256, 8192)
    assert per_token == pytest.approx(711e12 / 12273, rel=5e-3)
    # by hand: 32·4096²·(12 + 12·8/32 + 18·14336/4096 + 12·8192/4096 + 6·128256/(32·4096))
    assert per_token == pytest.approx(32 * 4096**2 * (12 + 3 + 63 + 24 + 5.87109375))
    row = next(r for r in _rows() if r["table"] == "long-sequence" and r["system"] == "DGX-B200"
               and r["seq"] == "8192")
    assert (row["gpus"], row["gbs"], row["model_tflops_per_gpu"]) == ("2", "512", "1671")
    path = tmp_path / "one.yaml"
    heldout_bridge.write_yaml(path, [heldout_nemo.record(row)])
    (case,), _ = load_reference([path])
    assert case.measured_step_s == pytest.approx(512 * 8192 * per_token / (1671e12 * 2), rel=1e-4)
    assert case.system.accelerator.name.startswith("B200")


def test_nemo2_docs_rows_gather_fp8_weights_and_the_older_tables_do_not(tmp_path):
    """The docs pages' FP8 rows (NeMo 2.x scripts/performance: 25.02 bf16_with_fp8_mixed
    fp8_params=True, 25.04 fp8_param_gather=True) are read with FP8 primary weights: the DP
    all-gather moves 1 B per weight instead of 2 (memory.py FP8_WEIGHT_BYTES), so the same row
    without the field weighs more per GPU. The NeMo 1 24.07 table and the long-sequence tables,
    whose recipes are not stated, keep bf16 weights."""
    docs = list(csv.DictReader(heldout_nemo.DOCS_DATA.open()))
    row = next(r for r in docs if r["release"] == "25.02" and r["model"] == "LLAMA3-70B")
    rec = heldout_nemo.record(row)
    assert rec["parallel"]["fp8_param_gather"] is True
    without = {**rec, "id": rec["id"] + "_bf16w", "parallel": {k: v for k, v in rec["parallel"].items()
                                                             if k != "fp8_param_gather"}}
    path = tmp_path / "two.yaml"
    heldout_bridge.write_yaml(path, [rec, without])
    cases, _ = load_reference([path])
    fp8w, bf16w = sorted(cases, key=lambda c: c.id)
    assert fp8w.plan.fp8_param_gather and not bf16w.plan.fp8_param_gather
    assert "fp8 parameter all-gather (record)" in fp8w.assumptions
    from planner.calibration import predict
    a, b = predict(fp8w), predict(bf16w)
    assert a["hbm_bytes"] < b["hbm_bytes"]
    for r in _rows():  # the repository's tables: NeMo 1 summary and the long-sequence tables
        built = heldout_nemo.record(r)
        assert isinstance(built, str) or "fp8_param_gather" not in built["parallel"]
