"""torchtitan records read with what the run's torchtitan did where the record is silent: Float8
records take the FSDP recipe of their model's train config (llama3_405b.toml gathers fp8 weights at
both commits the 405B tables ran, 9dec370 and 4d88a8a4; the 8B / 70B configs leave Float8 to the
command line, whose --float8.enable_fsdp_float8_all_gather defaults off); pipeline records without
split points take generate_split_points' stages (2 per rank for Interleaved 1F1B)."""
import pytest

from planner.analytical import PlanArrays, estimate_many
from planner.reference import load_reference


@pytest.fixture(scope="module")
def torchtitan_float8():
    cases, _ = load_reference()
    return {c.id: c for c in cases if c.source == "torchtitan" and c.job.dtype == "fp8-cs"}


def test_405b_float8_rows_gather_fp8_weights(torchtitan_float8):
    rows = [c for i, c in torchtitan_float8.items() if "405b" in i]
    assert len(rows) == 8
    for c in rows:
        assert c.plan.fp8_param_gather, c.id
        assert any("llama3_405b.toml" in a and "enable_fsdp_float8_all_gather" in a for a in c.assumptions)


def test_8b_and_70b_float8_rows_keep_bf16_gathers(torchtitan_float8):
    rows = [c for i, c in torchtitan_float8.items() if "llama3-8b" in i or "llama3-70b" in i]
    unstated = [c for c in rows if not c.id.startswith("torchtitan-trainy")]  # trainy states its recipe
    assert unstated and not any(c.plan.fp8_param_gather for c in unstated)


def test_405b_gather_bytes_by_hand(torchtitan_float8):
    c = torchtitan_float8["torchtitan2024_llama31-405b_128gpu_fsdp16_tp8_float8"]
    r = estimate_many(c.model, c.system, c.job, PlanArrays.from_plans([c.plan], c.model.layers))
    h, kv, ffn, vocab, layers, tp = 16384, 8 * 128, 53248, 128256, 126, 8
    per_layer = h * (h + 2 * kv) + h * h + 3 * h * ffn + 2 * h       # QKV, output, SwiGLU MLP, two norms
    # block weights gathered in fp8 (1 B), embedding and LM head (untied, never fp8) in bf16
    assert float(r["param_gather_bytes"][0]) == pytest.approx(layers * per_layer / tp * 1 + 2 * vocab * h / tp * 2)


def test_torchtitan_default_pipeline_split_by_hand():
    from planner.reference import torchtitan_default_split
    # generate_split_points @ 9dec370: 126 layers over 8 stages: base 15, remainder 6 to the middle
    assert torchtitan_default_split(126, 8, 1) == (15,) + (16,) * 6 + (15,)
    # Interleaved 1F1B: 2 stages per rank, 16 stages: base 7, remainder 14, all to the middle
    assert torchtitan_default_split(126, 8, 2) == (7,) + (8,) * 14 + (7,)
    assert sum(torchtitan_default_split(126, 8, 2)) == 126


def test_interleaved_405b_row_runs_two_stages_per_rank(torchtitan_float8):
    c = torchtitan_float8["torchtitan_llama31-405b_512gpu_fsdp8_tp8_pp8_i1f1b"]
    assert (c.plan.pp, c.plan.vpp) == (8, 2)
    assert c.plan.stage_layers == (7,) + (8,) * 14 + (7,)
    assert any("generate_split_points" in a for a in c.assumptions)
