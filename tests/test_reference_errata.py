"""Record errata (planner/reference_errata.py): a record whose stated layout cannot fit its GPUs is
read as a second publication of the same authors states it, only while the published one does
not fit, and says so among its assumptions."""
import pytest

from planner.analytical.memory import activation_parts
from planner.reference import REFERENCE_DIR, _case_fsdp, _hbm_gib, _Record, _with_erratum, load_reference
from planner.reference_errata import ERRATA, corrected_record
from tests.conftest import reference_yaml

SCOUT = "torchtitan_llama4-scout_256gpu_fsdp256_ep16_bf16"


@pytest.fixture(scope="module")
def scout_record():
    recs = reference_yaml(REFERENCE_DIR / "fsdp_moe_runs.yaml")["records"]
    return next(r for r in recs if r["id"] == SCOUT)


def test_scout_as_published_cannot_fit_a_gb200(scout_record):
    published = _case_fsdp(_Record(scout_record))
    assert (published.plan.micro_batch, published.plan.recompute) == (10, "none")
    # Korthikanti et al. 2022 Table 2 generalised (memory.activation_parts), by hand for Scout
    # (h 5120, 40 heads of 128, 8 KV heads, top-1 of 16 experts of 8192, one shared expert of
    # 8192, SwiGLU): norms 4 + QKV input 2 + MLP input 2 + Q,K,V (2·5120 + 4·1024)/5120 + output
    # projection input 2 + routed (6·8192/5120 + 2 + 8·16/5120) + shared 6·8192/5120
    per_token_layer = 4 + 2 + 2 + (2 * 5120 + 4 * 1024) / 5120 + 2 + (6 * 8192 / 5120 + 2 + 8 * 16 / 5120) \
        + 6 * 8192 / 5120
    assert sum(v for k, v in activation_parts(published.model).items() if k != "score") \
        == pytest.approx(per_token_layer)
    activations_gib = 48 * per_token_layer * 10 * 8192 * 5120 / 2**30
    assert activations_gib == pytest.approx(637.97, abs=0.01)  # the model: 685,013,729,280 B
    need, have = _hbm_gib(published)
    assert have == pytest.approx(184.0) and need > activations_gib > have


def test_scout_is_read_with_the_blog_batch(scout_record):
    cases, _ = load_reference()
    c = next(c for c in cases if c.id == SCOUT)
    assert (c.plan.micro_batch, c.plan.global_batch, c.plan.recompute) == (1, 256, "none")
    # the measured throughput converts with the corrected batch: 256·8192 / (6169 tokens/s · 256)
    assert c.measured_step_s == pytest.approx(256 * 8192 / (6169 * 256))
    note = c.assumptions[-1]
    assert "local batch 1" in note and "708 GiB of 184 GiB" in note and "PyTorch blog" in note
    need, have = _hbm_gib(c)
    assert need < have


def test_an_erratum_is_not_applied_while_the_published_record_fits(scout_record):
    published = _case_fsdp(_Record(scout_record))
    acc = published.system.accelerator
    roomy = published.system.model_copy(update={"accelerator": acc.model_copy(update={"hbm_capacity_gib": 1024.0})})
    from dataclasses import replace
    kept = _with_erratum(scout_record, replace(published, system=roomy, assumptions=list(published.assumptions)))
    assert kept.plan.micro_batch == 10 and "erratum not applied" in kept.assumptions[-1]


def test_corrected_record_leaves_the_source_record_alone(scout_record):
    fixed = corrected_record(scout_record, ERRATA[SCOUT])
    assert fixed["parallel"]["microbatch"] == 1 and fixed["parallel"]["global_batch"] == 256
    assert scout_record["parallel"]["microbatch"] == 10 and scout_record["parallel"]["global_batch"] == 2560
