"""bench/heldout_bridge.py: the held-out Megatron-Bridge rows build as the user would ask them."""
from __future__ import annotations

import csv
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import heldout_bridge  # noqa: E402


def _rows():
    return list(csv.DictReader(heldout_bridge.DATA.open()))


def test_every_row_has_its_source_and_builds_or_says_why():
    rows = _rows()
    assert len(rows) > 100
    built = 0
    for row in rows:
        assert row["commit"] and row["file"].startswith("docs/performance-summary") and int(row["line"]) > 0
        c = heldout_bridge.case(row)
        if isinstance(c, str):
            assert c.startswith(("no model preset", "no system preset", "not a valid plan")), c
            continue
        built += 1
        model, system, plan, job, measured_s, _ = c
        assert plan.gpus == int(row["gpus"]) and plan.global_batch == int(row["gbs"]) == job.global_batch
    assert built >= 120


def test_measured_step_time_from_tokens_per_second():
    """26.06 GPT-OSS 120B on 64 GB300, MXFP8, GBS 1280, seq 4096: 33,166 tokens/s/GPU
    (docs/performance-summary-archive.md) -> 1280·4096 / (33166·64) = 2.470 s."""
    row = next(r for r in _rows() if r["release"] == "26.06" and r["model"] == "GPT OSS 120B"
               and r["system"] == "DGX-GB300" and r["precision"] == "MXFP8")
    assert row["tokens_per_s_per_gpu"] == "33166"
    model, system, plan, job, measured_s, _ = heldout_bridge.case(row)
    assert measured_s == pytest.approx(1280 * 4096 / (33166 * 64), rel=1e-12)
    assert (plan.tp, plan.pp, plan.ep, plan.micro_batch, plan.dp) == (1, 1, 16, 4, 64)
    assert model.name.startswith("gpt-oss") and system.accelerator.name == "GB300-288GB" and job.dtype == "mxfp8"
