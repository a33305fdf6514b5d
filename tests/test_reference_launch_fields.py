"""Records read on their own source's evidence. Fields a record leaves null that its source's
published launch sets (planner/reference_launch_fields.py): torchtitan's async-TP page prints
commands that start from train configs setting seq_len 8192, so its 12 records are read with that
sequence length and say so; a stated field is never replaced. Runs that page flags as slow are
reported apart and fit nothing. A printed batch that the record's own fields contradict is read
as they imply."""
import copy
import dataclasses

import pytest

from planner.calibration import accuracy_rows
from planner.fit import fit_torch_stack, prepare
from planner.reference import REFERENCE_DIR, _case_measured, _Record, load_reference, source_flagged_slow
from planner.reference_launch_fields import completed_record
from tests.conftest import reference_yaml

PAGE = "benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md"


@pytest.fixture(scope="module")
def page_records():
    recs = reference_yaml(REFERENCE_DIR / "fsdp_moe_runs.yaml")["records"]
    return [r for r in recs if r["source"].get("file") == PAGE]


def test_every_record_of_the_page_is_read_at_sequence_8192(page_records):
    assert len(page_records) == 12 and all(r["model"]["seq"] is None for r in page_records)
    cases, skipped = load_reference()
    ids = {r["id"] for r in page_records}
    assert not [s for s in skipped if s.id in ids]
    read = [c for c in cases if c.id in ids]
    assert len(read) == 12
    for c in read:
        assert c.model.seq_length == 8192
        assert any("model.seq = 8192" in a and "820504e" in a for a in c.assumptions)


def test_step_time_follows_from_the_filled_sequence():
    cases, _ = load_reference()
    c = next(c for c in cases if c.id == "torchtitan_llama3-70b_256gpu_fsdp32_tp8_vanillaTP_bf16")
    # local batch 16 on dp = 256 / tp 8 = 32 ranks: 512 sequences of 8192 tokens at 597.3 tokens/s
    # per GPU on 256 GPUs
    assert (c.plan.tp, c.plan.dp, c.plan.global_batch) == (8, 32, 512)
    assert c.measured_step_s == pytest.approx(512 * 8192 / (597.3 * 256))


def test_a_stated_field_is_kept_and_other_sources_are_untouched(page_records):
    stated = copy.deepcopy(page_records[0])
    stated["model"]["seq"] = 4096
    assert completed_record(stated) == (stated, [])
    other = copy.deepcopy(page_records[0])
    other["source"]["file"] = "some/other/page.md"
    assert completed_record(other) == (other, [])
    filled, notes = completed_record(page_records[0])
    assert filled["model"]["seq"] == 8192 and page_records[0]["model"]["seq"] is None  # a copy
    assert len(notes) == 1


def test_the_pages_rowwise_runs_are_reported_apart_and_fit_nothing():
    """The page flags its float8 rowwise runs as slow (torchtitan#1207): they are read and grouped
    as software their source flags as slow, and the torch-stack fit ignores their times."""
    cases, _ = load_reference()
    grand_teton = [c for c in cases if c.system.accelerator.name == "H100-GT-96GB"]
    flagged = {c.id for c in grand_teton if source_flagged_slow(c.id)}
    assert flagged == {f"torchtitan_llama3-{m}_tp8_{tp}TP_float8-rowwise"
                       for m in ("70b_256gpu_fsdp32", "8b_64gpu_fsdp8") for tp in ("vanilla", "async")}
    software = {r["id"]: r["software"] for r in accuracy_rows(grand_teton)}
    assert {i for i, s in software.items() if s == "dense, software its source flags as slow"} == flagged
    # halving the flagged rows' measured times leaves the Grand Teton clock fit where it was
    sped = [dataclasses.replace(c, measured_step_s=c.measured_step_s / 2) if c.id in flagged else c
            for c in grand_teton]
    base, moved = fit_torch_stack(prepare(grand_teton), {}, iters=6), fit_torch_stack(prepare(sped), {}, iters=6)
    assert base["H100-GT-96GB"]["sustained_clock_fraction"] == moved["H100-GT-96GB"]["sustained_clock_fraction"]


def test_a_printed_batch_its_own_record_contradicts_is_read_as_the_record_implies():
    """DGX Cloud v25.04.01 GPT-3 175B on 512 GPUs prints global batch 1204, not a multiple of
    micro-batch·dp = 16. Its own fields agree on 1024: micro-batch 1 · dp 16 · accumulation 64, and
    249,068 tokens/s × 8.42 s / 2048 tokens = 1024.0 sequences. Fields that disagree keep it skipped."""
    recs = reference_yaml(REFERENCE_DIR / "measured_runs.yaml")["records"]
    rec = next(r for r in recs if r["id"] == "dgxc_v25.04.01_GPT3-175B_bf16_512gpu")
    assert rec["parallel"]["global_batch"] == 1204
    assert 249068 * 8.42 / 2048 == pytest.approx(1024, abs=0.1)
    case = _case_measured(_Record(rec), False)
    assert case.plan.global_batch == 1024 and case.measured_step_s == 8.42
    assert any("not the printed 1204" in a for a in case.assumptions)
    off = copy.deepcopy(rec)
    off["measured"]["tokens_per_sec"] = 249068 * 1.05  # the throughput no longer confirms it
    skipped = _case_measured(_Record(off), False)
    assert not hasattr(skipped, "plan") and "not a multiple" in skipped.reason
