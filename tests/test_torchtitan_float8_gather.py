"""torchtitan Float8 records that do not say how FSDP gathered the weights take the run's model
train config: llama3_405b.toml turns on torchao's fp8 all-gather at both commits the 405B tables
ran (9dec370, 4d88a8a4); the 8B / 70B configs leave Float8 to the command line, whose
--float8.enable_fsdp_float8_all_gather defaults off."""
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
