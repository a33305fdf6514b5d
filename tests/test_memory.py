"""Per-GPU memory against hand-derived numbers (Megatron's 18 B/param, Korthikanti Table 2)."""
import pytest

from hardware import load_system
from planner.analytical import estimate
from planner.model import ModelSpec
from planner.plan import JobSpec, Plan

H, L, A, S, V = 12288, 96, 96, 2048, 51200
GPT3 = ModelSpec(layers=L, hidden=H, heads=A, seq_length=S, vocab=V)
UNFUSED = JobSpec(flash_attention=False)


def state_bytes(est):
    m = est.memory_breakdown_bytes
    return m["weights_bytes"] + m["grads_bytes"] + m["optimizer_bytes"] + m["embeddings_bytes"]


def params_per_gpu(tp, pp):
    # hand count: 12h² + 13h per layer (Narayanan §3.2), one V×h embedding per stage, / tp, and
    # the first stage's S×h learned positions, whole on every TP rank (Megatron's
    # position_embeddings is a plain torch.nn.Embedding)
    return (L // pp * (12 * H * H + 13 * H) + V * H) / tp + S * H


def test_megatron_18_bytes_per_param_without_distributed_optimizer(a100):
    plan = Plan(tp=8, pp=8, dp=16, global_batch=1536, zero_stage=0)
    est = estimate(GPT3, a100, plan)
    assert state_bytes(est) == pytest.approx(18 * params_per_gpu(8, 8), rel=1e-3)


@pytest.mark.parametrize("dp", [2, 16, 64])
def test_distributed_optimizer_6_plus_12_over_dp(dp):
    system = load_system("a100-80g", 8 * 8 * dp)
    est = estimate(GPT3, system, Plan(tp=8, pp=8, dp=dp, global_batch=64 * dp, zero_stage=1))
    assert state_bytes(est) == pytest.approx((6 + 12 / dp) * params_per_gpu(8, 8), rel=1e-3)


def test_zero3_shards_everything_over_dp():
    system = load_system("a100-80g", 64)
    est = estimate(GPT3, system, Plan(tp=8, pp=1, dp=8, global_batch=64, zero_stage=3))
    assert state_bytes(est) == pytest.approx(18 / 8 * params_per_gpu(8, 1), rel=1e-3)


def test_bytes_per_param_is_configurable():
    system = load_system("a100-80g", 8)
    job = JobSpec(bytes_per_param={"grads": 6.0})  # SageMaker-style 20 B/param accounting
    est = estimate(GPT3, system, Plan(tp=8, global_batch=8, zero_stage=0), job)
    assert state_bytes(est) == pytest.approx(20 * params_per_gpu(8, 1), rel=1e-3)


def act_per_layer(t, sp, recompute, b=1):
    sbh = S * b * H
    five = 5 * A * S / H
    # Korthikanti et al. 2022, Table 2
    return {
        ("none", False): sbh * (10 + 24 / t + five / t),
        ("none", True): sbh / t * (34 + five),
        ("selective", False): sbh * (10 + 24 / t),
        ("selective", True): sbh / t * 34,
        ("full", False): 2 * sbh,
        ("full", True): 2 * sbh / t,
    }[(recompute, sp)]


@pytest.mark.parametrize("tp,sp", [(1, False), (2, False), (8, False), (2, True), (8, True)])
@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_korthikanti_table2_activations(tp, sp, recompute):
    system = load_system("a100-80g", tp)
    plan = Plan(tp=tp, pp=1, dp=1, micro_batch=1, global_batch=1, sequence_parallel=sp, recompute=recompute)
    est = estimate(GPT3, system, plan, UNFUSED)
    assert est.memory_breakdown_bytes["activations_bytes"] == pytest.approx(L * act_per_layer(tp, sp, recompute), rel=1e-9)


def test_1f1b_first_stage_holds_all_layers_worth_and_interleaving_factor():
    system = load_system("a100-80g", 8 * 4 * 4)
    base = dict(tp=8, pp=4, dp=4, micro_batch=1, global_batch=64, sequence_parallel=True, recompute="selective")
    plain = estimate(GPT3, system, Plan(**base), UNFUSED).memory_breakdown_bytes["activations_bytes"]
    # pp microbatches in flight × L/pp layers = L layers of one microbatch (Korthikanti §4.2.3)
    assert plain == pytest.approx(L * act_per_layer(8, True, "selective"), rel=1e-9)
    inter = estimate(GPT3, system, Plan(**base, vpp=3), UNFUSED).memory_breakdown_bytes["activations_bytes"]
    assert inter / plain == pytest.approx(1 + (4 - 1) / (4 * 3), rel=1e-12)


def test_fewer_microbatches_than_stages_hold_fewer():
    system = load_system("a100-80g", 64)
    plan = Plan(tp=8, pp=8, dp=1, micro_batch=1, global_batch=2, sequence_parallel=True, recompute="selective")
    act = estimate(GPT3, system, plan, UNFUSED).memory_breakdown_bytes["activations_bytes"]
    assert act == pytest.approx(2 * L / 8 * act_per_layer(8, True, "selective"), rel=1e-9)


def test_flash_attention_drops_the_score_term():
    system = load_system("a100-80g", 8)
    plan = Plan(tp=8, global_batch=1, sequence_parallel=True)
    act = estimate(GPT3, system, plan, JobSpec(flash_attention=True)).memory_breakdown_bytes["activations_bytes"]
    assert act == pytest.approx(L * act_per_layer(8, True, "selective"), rel=1e-9)


def test_offload_moves_bytes_to_the_tier_and_keeps_two_layers():
    system = load_system("h100-offload-1tib", 8)
    plan = Plan(tp=8, global_batch=8, micro_batch=1, zero_stage=1, offload_optimizer=1.0, offload_activations=1.0)
    on = estimate(GPT3, system, plan.model_copy(update={"offload_optimizer": 0.0, "offload_activations": 0.0}))
    off = estimate(GPT3, system, plan)
    assert off.memory_breakdown_bytes["optimizer_bytes"] == 0
    assert off.memory_breakdown_bytes["activations_bytes"] == pytest.approx(
        on.memory_breakdown_bytes["activations_bytes"] * 2 / L, rel=1e-9)
    optimizer = 12 * params_per_gpu(8, 1)  # fp32 master + Adam m, v of every local parameter (dp = 1)
    assert off.offload_breakdown_bytes["offload_optimizer_bytes"] == pytest.approx(optimizer, rel=1e-3)
    moved_activations = on.memory_breakdown_bytes["activations_bytes"] * (1 - 2 / L)
    assert off.offload_breakdown_bytes["offload_activations_bytes"] == pytest.approx(moved_activations, rel=1e-9)
    assert off.offload_bytes == pytest.approx(sum(off.offload_breakdown_bytes.values()), rel=1e-12)


def test_hbm_and_offload_violations():
    small = load_system("a100-80g", 8)
    est = estimate(GPT3, small, Plan(tp=8, global_batch=8))
    assert "hbm" in est.violations
    plan = Plan(tp=8, global_batch=8, offload_optimizer=0.5)
    assert "offload_capacity" in estimate(GPT3, small, plan).violations  # no offload tier at all


def test_no_dropout_drops_the_two_mask_bytes():
    # Korthikanti's 34 counts two 1-byte dropout masks (sbh each); Llama-style models have none.
    model = GPT3.model_copy(update={"dropout": False})
    system = load_system("a100-80g", 8)
    plan = Plan(tp=8, global_batch=1, sequence_parallel=True, recompute="selective")
    act = estimate(model, system, plan, UNFUSED).memory_breakdown_bytes["activations_bytes"]
    assert act == pytest.approx(L * S * H / 8 * 32, rel=1e-9)
