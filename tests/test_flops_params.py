"""FLOPs and parameter counts against the papers' own formulas and tables."""
import pytest

from planner.analytical import flops
from planner.analytical.flops import narayanan_eq3_flops
from planner.model import ModelSpec, load_model
from tests.conftest import REFERENCE, reference_yaml

# Narayanan et al. SC'21 Table 1: (params in billions, layers, hidden, heads)
TABLE1 = [(1.7, 24, 2304, 24), (3.6, 30, 3072, 32), (7.5, 36, 4096, 32), (18.4, 40, 6144, 48),
          (39.1, 48, 8192, 64), (76.1, 60, 10240, 80), (145.6, 80, 12288, 96), (310.1, 96, 16384, 128),
          (529.6, 105, 20480, 128), (1008.0, 128, 25600, 160)]


def gpt(layers, hidden, heads, seq=2048, vocab=51200):
    return ModelSpec(layers=layers, hidden=hidden, heads=heads, seq_length=seq, vocab=vocab)


@pytest.mark.parametrize("billions,layers,hidden,heads", TABLE1)
def test_param_count_matches_narayanan_table1(billions, layers, hidden, heads):
    # the table prints one decimal: agree to its rounding
    assert gpt(layers, hidden, heads).num_params / 1e9 == pytest.approx(billions, abs=0.05)


@pytest.mark.parametrize("billions,layers,hidden,heads", TABLE1)
def test_hardware_flops_with_full_recompute_equal_eq3(billions, layers, hidden, heads):
    m = gpt(layers, hidden, heads)
    batch = 512
    ours = flops.hardware_flops_per_token(m, "full") * batch * m.seq_length
    assert ours == pytest.approx(narayanan_eq3_flops(batch, m.seq_length, layers, hidden, m.vocab), rel=1e-12)
    ours_no_rc = flops.model_flops_per_token(m) * batch * m.seq_length
    assert ours_no_rc == pytest.approx(
        narayanan_eq3_flops(batch, m.seq_length, layers, hidden, m.vocab, recompute=False), rel=1e-12)


def test_eq3_reproduces_narayanan_34_day_gpt3_estimate(gpt3):
    # Narayanan SC'21 §5.1 / eq. (4): 300B tokens on 1024 A100 at 140 TFLOP/s -> ~34 days,
    # with ~8·P FLOPs per token under full recompute.
    per_token = flops.hardware_flops_per_token(gpt3, "full")
    assert per_token == pytest.approx(8 * gpt3.num_params, rel=0.05)
    days = 300e9 * per_token / (1024 * 140e12) / 86400
    assert days == pytest.approx(34, abs=1.5)


def test_reference_records_param_counts_match():
    """Every dense GPT record in the reference with params_b: our count within 1 %."""
    records = reference_yaml(REFERENCE)["records"] if REFERENCE.exists() else []
    if not records:
        pytest.skip("shared/reference not beside the repository")
    checked = 0
    for rec in records:
        m = rec["model"]
        if rec["id"].startswith("narayanan2021_t1") and m.get("params_b"):
            ours = gpt(m["layers"], m["hidden"], m["heads"], m["seq"], m["vocab"]).num_params / 1e9
            assert ours == pytest.approx(m["params_b"], abs=0.05), rec["id"]
            checked += 1
    assert checked == 10


@pytest.mark.parametrize("preset,total_b,active_b", [
    ("llama3-8b", 8.03, 8.03), ("llama3-70b", 70.6, 70.6), ("llama3-405b", 405.9, 405.9),
    ("mixtral-8x7b", 46.7, 12.9),  # Jiang et al. 2024: 47B total, 13B active
])
def test_preset_param_counts_match_published(preset, total_b, active_b):
    m = load_model(preset)
    assert m.num_params / 1e9 == pytest.approx(total_b, rel=0.01)
    assert m.active_params / 1e9 == pytest.approx(active_b, rel=0.01)


@pytest.mark.parametrize("preset,embedding_b,non_embedding_b", [
    ("nemotron4-15b", 3.2, 12.5),    # Parmar et al. 2024, Nemotron-4 15B Technical Report, Table 1
    ("nemotron4-340b", 9.4, 331.6),  # NVIDIA 2024, Nemotron-4 340B Technical Report, Table 1
])
def test_nemotron4_presets_match_the_reports_parameter_split(preset, embedding_b, non_embedding_b):
    """The reports give embedding and non-embedding parameters to 0.1B: untied input and output
    matrices (vocab·h each), and squared-ReLU MLPs of two matrices with GQA attention. The 15B
    report's 3.2B embedding is 2·256000·6144 = 3.146B rounded up, hence 2 % there."""
    m = load_model(preset)
    embedding = m.vocab * m.hidden * (1 if m.tied_embeddings else 2)
    assert embedding / 1e9 == pytest.approx(embedding_b, rel=0.02)
    assert (m.num_params - embedding) / 1e9 == pytest.approx(non_embedding_b, abs=0.05)


def test_gqa_and_swiglu_flops_by_hand():
    m = load_model("llama3-8b")
    h, kv, f = 4096, 1024, 14336
    assert flops.layer_matmul_flops_per_token(m) == 2 * (h * (h + 2 * kv) + h * h + 3 * h * f)


def test_moe_counts_top_k_experts_and_router():
    m = load_model("mixtral-8x7b")
    h, f = 4096, 14336
    assert flops.mlp_matmul_flops_per_token(m) == 2 * 3 * h * f * 2 + 2 * h * 8
