"""bench/heldout_bridge.py: the held-out Megatron-Bridge rows become bridge_runs.yaml records that
the reference loader reads."""
from __future__ import annotations

import csv
import sys
from pathlib import Path

import pytest

from planner.reference import load_reference

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import heldout_bridge  # noqa: E402


def _rows():
    return list(csv.DictReader(heldout_bridge.DATA.open()))


def assert_read_back_as_written(recs: list[dict]) -> None:
    """Every held-out record is read by the reference loader, with the GPUs and global batch it
    was written with (also used by tests/test_heldout_nemo.py)."""
    cases, not_read = heldout_bridge.read_back(recs)
    assert not not_read and len(cases) == len(recs)
    by_id = {c.id: c for c in cases}
    for r in recs:
        c = by_id[r["id"]]
        assert c.plan.gpus == r["system"]["gpus"] and c.plan.global_batch == r["parallel"]["global_batch"]


def test_every_row_has_its_source_and_becomes_a_record_or_says_why():
    rows = _rows()
    assert len(rows) > 100 and all(r["commit"] and r["file"].startswith("docs/performance-summary")
                                   and int(r["line"]) > 0 for r in rows)
    recs, skipped = heldout_bridge.records()
    assert set(skipped) <= {"no model preset", "no system preset"} and len(recs) >= 120
    assert_read_back_as_written(recs)


def test_measured_step_time_from_tokens_per_second(tmp_path):
    """26.06 GPT-OSS 120B on 64 GB300, MXFP8, GBS 1280, seq 4096: 33,166 tokens/s/GPU
    (docs/performance-summary-archive.md) -> 1280·4096 / (33166·64) = 2.470 s; a B300 record
    reads as the b300 preset."""
    row = next(r for r in _rows() if r["release"] == "26.06" and r["model"] == "GPT OSS 120B"
               and r["system"] == "DGX-GB300" and r["precision"] == "MXFP8")
    assert row["tokens_per_s_per_gpu"] == "33166"
    rec = heldout_bridge.record(row)
    path = tmp_path / "one.yaml"
    b300 = heldout_bridge.record(next(r for r in _rows() if r["system"] == "DGX-B300" and r["model"] == "GPT OSS 120B"))
    heldout_bridge.write_yaml(path, [rec, b300])
    (case, case_b300), _ = load_reference([path])
    assert case.measured_step_s == pytest.approx(1280 * 4096 / (33166 * 64), rel=1e-4)
    assert (case.plan.tp, case.plan.pp, case.plan.ep, case.plan.micro_batch, case.plan.dp) == (1, 1, 16, 4, 64)
    assert case.system.accelerator.name == "GB300-288GB" and case.job.dtype == "mxfp8"
    assert case.model.head_dim == 64 and case.model.moe.num_experts == 128
    assert case_b300.system.accelerator.name == "B300-288GB"


def test_dispatcher_follows_the_workload_backend_from_release_26_04(tmp_path):
    """Megatron-Bridge >= 26.04 (scripts/performance/utils/overrides.py set_workload_base_configs,
    0fbfe7d3) applies the workload config's flex backend after the system function; the knob table
    names the backend only. Qwen3-30B-A3B on 16 H100, 26.04: HybridEP, so the flex (DeepEP-style)
    dispatcher; the 26.02 row, whose release decided it in the system function, is not switched."""
    from planner.reference_moe import backend_runs_flex
    assert backend_runs_flex("hybridep", "GB200") and backend_runs_flex("hybridep", "H100")
    assert backend_runs_flex("deepep", "B300") and not backend_runs_flex("deepep", "GB300")
    rows = [r for r in _rows() if r["model"] == "Qwen3_30B_a3B" and r["system"] == "DGX-H100"
            and r["release"] in ("26.04", "26.02")]
    path = tmp_path / "h100.yaml"
    heldout_bridge.write_yaml(path, [heldout_bridge.record(r) for r in rows])
    cases, _ = load_reference([path])
    by_release = {c.id.split("_")[1]: c for c in cases}
    assert by_release["26.04"].plan.moe_dispatcher == "deepep"
    assert any("set_workload_base_configs" in a for a in by_release["26.04"].assumptions)
    assert by_release["26.02"].plan.moe_dispatcher == "alltoall"
