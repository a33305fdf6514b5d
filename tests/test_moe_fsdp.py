"""Issue 9 mechanisms: MoE layer costs, MoE parallel folding, sharded data parallel per stage and
implementation. Numbers are derived by hand from the formulas' sources, not read back."""
from __future__ import annotations

import math

import numpy as np
import pytest

from hardware import load_system
from planner import megatron as mg
from planner.analytical import PlanArrays, comm, estimate, estimate_many
from planner.analytical import data_parallel as dpc
from planner.analytical import time as tm
from planner.analytical.memory import memory_breakdown, stage_params
from planner.analytical.time import overlapped_collective_s
from planner.model import ModelSpec
from planner.plan import JobSpec, Plan

# Qwen3-235B-A22B shape (Hugging Face config.json: 94 layers, hidden 4096, 64 heads of 128, 4 KV
# groups, 128 experts top-8 of width 1536, vocab 151936)
QWEN3 = ModelSpec(name="qwen3-235b", layers=94, hidden=4096, heads=64, head_dim=128, query_groups=4,
                  ffn=12288, seq_length=4096, vocab=151936, activation="swiglu", tied_embeddings=False,
                  position_embedding="rope", biases=False, dropout=False,
                  moe={"num_experts": 128, "top_k": 8, "expert_ffn": 1536})


def _pa(model, **cols):
    n = max(len(np.atleast_1d(v)) for v in cols.values())
    return PlanArrays.from_columns(n, model.layers, **cols)


# --- sharded data parallel --------------------------------------------------------------------

def test_zero2_reduce_scatters_every_microbatch():
    """Without overlap: ZeRO-1 = one RS + one AG per step; ZeRO-2 = m RS + one AG (ZeRO §5.2)."""
    rs, ag, m = 0.3, 0.2, np.array([1.0, 8.0])
    no = np.array([False, False])
    z2 = dpc.zero2_exposed_s(rs, ag, m, 1.0, 2.0, 1.0, 1.0, no, overlapped_collective_s)
    assert z2 == pytest.approx([0.5, 8 * 0.3 + 0.2])
    # with overlap each microbatch's RS hides behind its own backward (2 s here): only the last
    # one's tail after the final bucket shows, like ZeRO-1's
    z2o = dpc.zero2_exposed_s(rs, ag, m, 1.0, 2.0, 1.0, 1.0, ~no, overlapped_collective_s)
    assert z2o == pytest.approx([0.0, 0.0])
    z2slow = dpc.zero2_exposed_s(3.0, 0.0, np.array([4.0]), 1.0, 2.0, 1.0, 1.0, np.array([True]),
                                 overlapped_collective_s)
    assert z2slow == pytest.approx([3 * (3.0 - 2.0) + (3.0 - 2.0)])


def test_zero2_costs_more_than_zero1_with_accumulation(gpt3, a100):
    base = dict(tp=8, pp=8, dp=16, global_batch=1536, dp_comm_overlap=False)
    z1 = estimate(gpt3, a100, Plan(**base, zero_stage=1)).time_breakdown_s["dp_comm_exposed_s"]
    z2 = estimate(gpt3, a100, Plan(**base, zero_stage=2)).time_breakdown_s["dp_comm_exposed_s"]
    # hand: the stage's parameters (fp32 grads on the wire) reduce-scattered over dp 16 at stride
    # 8: one member per node, so the ring runs at one GPU's IB HDR link (25 GB/s × 0.8)
    elems = memory_breakdown(gpt3, a100, JobSpec(), PlanArrays.from_plans([Plan(**base)], gpt3.layers))["params_elems"][0]
    rs = 15 / 16 * elems * 4 / (25e9 * 0.8) + 15 * 8e-6
    m = 1536 // 16
    assert z2 - z1 == pytest.approx((m - 1) * rs, rel=1e-6)


def test_zero3_per_layer_hand_derived():
    """4 layers, AG 0.4 s, RS 0.8 s per stage, no latency; layer fwd 0.05 s, bwd 0.1 s, contention
    s = 0.25: a prefetched layer takes max(c, x + s·c), so it shows max(c − x, s·c) beyond x;
    fwd = 0.1 + 3·max(0.1 − 0.05, 0.025) = 0.25; bwd = 0.3 + 3·max(0.3 − 0.1, 0.075) = 0.9."""
    got = dpc.zero3_exposed_s(0.8, 0.4, 0.0, 2.0, 0.2, 0.4, 4.0, np.array([True, False]), 0.25)
    assert got[0] == pytest.approx(2 * (0.25 + 0.9))
    assert got[1] == pytest.approx(2 * 4 * (2 * 0.1 + 0.2))
    # compute-bound layers (x = 1 s per layer) still pay the contention: s·c per later layer
    slow = dpc.zero3_exposed_s(0.8, 0.4, 0.0, 1.0, 4.0, 4.0, 4.0, np.array([True]), 0.25)
    assert slow[0] == pytest.approx((0.1 + 3 * 0.25 * 0.1) + (0.3 + 3 * 0.25 * 0.3))


def test_prefetched_layer_is_max_of_collective_and_slowed_compute():
    """Layer time max(c, x + s·c) minus the compute x: the exposed part, by hand."""
    for c, x, s in ((0.3, 0.1, 0.5), (0.1, 0.3, 0.5), (0.2, 0.2, 0.0)):
        exposed = dpc.prefetched_layers_s(c, x, 2.0, s) - c  # the second layer's share
        assert exposed == pytest.approx(max(c, x + s * c) - x)


def test_data_parallel_parameters_are_restored():
    before = dpc.FSDP_COMPUTE_CONTENTION
    with dpc.parameters(FSDP_COMPUTE_CONTENTION=0.7):
        assert dpc.FSDP_COMPUTE_CONTENTION == 0.7
    assert dpc.FSDP_COMPUTE_CONTENTION == before
    with pytest.raises(KeyError):
        with dpc.parameters(NOT_A_PARAMETER=1.0):
            pass


def test_deepspeed_zero3_slower_than_fsdp(gpt3, a100):
    base = dict(tp=1, pp=1, dp=1024, global_batch=1024, zero_stage=3, recompute="full")
    fsdp = estimate(gpt3, a100, Plan(**base, dp_impl="torch-fsdp2"))
    ds = estimate(gpt3, a100, Plan(**base, dp_impl="deepspeed"))
    assert ds.time_breakdown_s["dp_comm_exposed_s"] > fsdp.time_breakdown_s["dp_comm_exposed_s"]
    assert ds.plan.short().endswith("deepspeed")


# --- all-to-all placement ---------------------------------------------------------------------

def test_all_to_all_placed_on_links():
    """DGX H100: ep 16 at stride 1 = 2 nodes: 7/16 of the bytes to NVLink peers (450 GB/s × 0.8),
    8/16 through the GPU's own NIC (50 GB/s × 0.8), concurrently; + 15 steps of IB latency."""
    s = load_system("h100-sxm", 64)
    B, eff = 1e9, 0.5
    got = comm.all_to_all_placed_s(s, B, 16, 1, eff)
    nic = B * 8 / 16 / (50e9 * 0.8 * eff)
    assert float(got) == pytest.approx(nic + 15 * 8e-6)
    inside = comm.all_to_all_placed_s(s, B, 8, 1, eff)  # one node: NVLink only
    assert float(inside) == pytest.approx(B * 7 / 8 / (450e9 * 0.8 * eff) + 7 * 3e-6)
    # stride 2 (etp 2): only 4 ep peers share a node
    strided = comm.all_to_all_placed_s(s, B, 16, 2, eff)
    assert float(strided) == pytest.approx(B * 12 / 16 / (50e9 * 0.8 * eff) + 15 * 8e-6)


# --- MoE layer mechanisms ---------------------------------------------------------------------

def test_moe_layer_mechanisms_hand_derived():
    s = load_system("h100-sxm", 256)
    job = JobSpec()
    P = _pa(QWEN3, tp=2, pp=8, dp=16, ep=32, sequence_parallel=1, micro_batch=1, global_batch=2048)
    parts = tm.moe_mlp_fwd_s(QWEN3, s, job, P)
    hbm = 3350e9 * s.accelerator.efficiency.hbm_efficiency
    routed = 4096 / 2  # SP shards the microbatch's tokens over tp 2
    assert float(parts["permute_s"][0]) == pytest.approx(tm.PERMUTE_PASSES * 2 * routed * 8 * 4096 / hbm)
    # rows per local expert: tokens·top_k·etp·ep/(E·t) = 4096·8·2·32/(128·2) = 8192
    eff = s.accelerator.efficiency
    rows = 4096 * 8 * 2 * 32 / (128 * 2)
    fc1_eff = tm.gemm_efficiency(eff.matmul_max, eff.matmul_half_dim, np.array([min(rows, 4096, 3072 / 2)]))[0]
    fc2_eff = tm.gemm_efficiency(eff.matmul_max, eff.matmul_half_dim, np.array([min(rows, 1536 / 2, 4096)]))[0]
    peak = 989.4e12
    gemm = 2 * 4096 * 8 * 4096 * 3072 / 2 / (peak * fc1_eff) + 2 * 4096 * 8 * 1536 * 4096 / 2 / (peak * fc2_eff)
    # balanced routing: only the sampling spread, 1 + sqrt(2·ln 32 / (2048·8)) (rows per rank)
    spread = 1 + math.sqrt(2 * math.log(32) / (routed * 8))
    assert float(parts["expert_gemm_s"][0]) == pytest.approx(spread * gemm)


def test_load_imbalance_job_skew_sampling_spread_and_capacity_cap():
    P = _pa(QWEN3, tp=2, pp=8, dp=16, ep=32, sequence_parallel=1, micro_batch=1, global_batch=2048)
    spread = 1 + math.sqrt(2 * math.log(32) / (2048 * 8))
    assert float(tm.moe_load_imbalance(QWEN3, JobSpec(), P)[0]) == pytest.approx(spread)
    assert float(tm.moe_load_imbalance(QWEN3, JobSpec(moe_load_imbalance=1.5), P)[0]) == pytest.approx(1.5 * spread)
    # ep 1: a single rank, no spread
    P1 = _pa(QWEN3, tp=1, dp=8, ep=1, micro_batch=1, global_batch=8)
    assert float(tm.moe_load_imbalance(QWEN3, JobSpec(), P1)[0]) == 1.0
    drop = QWEN3.model_copy(update={"moe": QWEN3.moe.model_copy(update={"capacity_factor": 1.0})})
    assert float(tm.moe_load_imbalance(drop, JobSpec(moe_load_imbalance=1.5), P)[0]) == 1.0
    with pytest.raises(ValueError):
        JobSpec(moe_load_imbalance=0.9)


def test_a2a_overlap_hides_behind_the_other_microbatch():
    """Combined 1F1B (Megatron combined_1f1b.py): pp 8, vpp 4, m = 128 microbatches on rank 0:
    warm-up 2·7 + 3·8 + 1 = 39 of 512 chunk passes unpaired; the paired rest exposes
    2a − eff·min(2a, fwd + bwd compute)."""
    base = dict(tp=2, pp=8, dp=16, ep=32, etp=1, vpp=4, sequence_parallel=1, micro_batch=1, global_batch=2048)
    P0 = _pa(QWEN3, **base)
    P1 = _pa(QWEN3, **base, moe_a2a_overlap=1)
    u = 39 / 512
    assert float(tm.unpaired_microbatch_fraction(P1)[0]) == pytest.approx(u)
    a, f, b = 0.004, 0.003, 0.006
    fwd0, bwd0 = tm.a2a_overlap_exposed_s(np.array([a]), np.array([f]), np.array([b]), P0)
    assert (fwd0[0], bwd0[0]) == (a, a)
    fwd1, bwd1 = tm.a2a_overlap_exposed_s(np.array([a]), np.array([f]), np.array([b]), P1)
    eff = tm.A2A_OVERLAP_EFFICIENCY
    assert fwd1[0] == pytest.approx(u * a)
    assert bwd1[0] == pytest.approx(u * a + (1 - u) * (2 * a - eff * min(2 * a, f + b)))
    # no pipelining: only the first forward and the last backward are unpaired (1/m)
    Pn = _pa(QWEN3, tp=1, pp=1, dp=64, ep=64, micro_batch=1, global_batch=1024, moe_a2a_overlap=1)
    assert float(tm.unpaired_microbatch_fraction(Pn)[0]) == pytest.approx(1 / 16)
    # the whole step gets faster, and one more LAYER is in flight: the extra warm-up forward
    # stands for the steady state's, whose layers pair with the previous microbatch's backward
    # layer by layer (model_chunk_schedule_plan.py), so the pair holds one layer beyond the plain
    # schedule's 2·7 + 3·8 + 1 = 39 chunks of rank 0
    s = load_system("h100-sxm", 256)
    r0 = estimate_many(QWEN3, s, JobSpec(global_batch=2048), P0)
    r1 = estimate_many(QWEN3, s, JobSpec(global_batch=2048), P1)
    assert r1["step_time_s"][0] < r0["step_time_s"][0]
    from planner.analytical.memory import in_flight_microbatches
    rank0 = P0.rank_index[0] == 0
    layers0 = P1.rank_layers[0][rank0][0]
    assert in_flight_microbatches(P0)[0][rank0][0] == pytest.approx(39 / 4)
    assert in_flight_microbatches(P1)[0][rank0][0] == pytest.approx(39 / 4 + 1 / layers0)
    assert r1["activations_bytes"][0] > r0["activations_bytes"][0]
    # without pipelining: one microbatch and the pair's one layer, not two microbatches
    Pn0 = _pa(QWEN3, tp=1, pp=1, dp=64, ep=64, micro_batch=1, global_batch=1024)
    assert in_flight_microbatches(Pn0)[0][0] == 1.0
    assert in_flight_microbatches(Pn)[0][0] == pytest.approx(1 + 1 / QWEN3.layers)


def test_shared_experts_cost_a_dense_mlp():
    s = load_system("h100-sxm", 64)
    shared = QWEN3.model_copy(update={"moe": QWEN3.moe.model_copy(update={"shared_experts": 1})})
    P = _pa(QWEN3, tp=2, dp=32, ep=8, sequence_parallel=1, micro_batch=1, global_batch=64)
    a = tm.moe_mlp_fwd_s(QWEN3, s, JobSpec(), P)
    b = tm.moe_mlp_fwd_s(shared, s, JobSpec(), P)
    hbm = 3350e9 * s.accelerator.efficiency.hbm_efficiency
    dense_g, dense_e = tm.dense_mlp_fwd_s(QWEN3, 1536, 4096, P.tp, 989.4e12, s.accelerator.efficiency, "bf16", hbm)
    assert float((b["gemm"] - a["gemm"])[0]) == pytest.approx(float(dense_g[0]))
    assert float((b["elementwise"] - a["elementwise"])[0]) == pytest.approx(float(np.asarray(dense_e)[0]))


# --- MoE parallel folding ---------------------------------------------------------------------

def test_folding_accepts_bridge_qwen3_layout():
    """The Bridge Qwen3-235B H100 recipe tp2 pp8 dp16 ep32 (ep > dp·cp) satisfies Megatron's
    world % (etp·ep·pp) == 0; the old 'ep divides dp·cp' rejected it."""
    s = load_system("h100-sxm", 256)
    ok = QWEN3.model_copy(update={"layers": 96})  # even split: the uneven layout is issue 8's
    plan = Plan(tp=2, pp=8, dp=16, ep=32, etp=1, global_batch=2048, sequence_parallel=True)
    est = estimate(ok, s, plan)
    assert "experts_ep" not in est.violations  # 1·32·8 = 256 divides 256
    assert not [r for r in mg.not_expressible(plan, ok, JobSpec()) if r.startswith(("ep", "etp"))]
    # etp defaulting to tp 2: 2·32·8 = 512 does not divide 256, so the recipe must fold etp to 1
    bad = estimate(ok, s, Plan(tp=2, pp=8, dp=16, ep=32, global_batch=2048, sequence_parallel=True))
    assert "experts_ep" in bad.violations
    assert any(r.startswith("ep") for r in mg.not_expressible(bad.plan, ok, JobSpec()))


def test_folding_emits_expert_tensor_parallel_and_parser_accepts():
    s = load_system("h100-sxm", 256)
    ok = QWEN3.model_copy(update={"layers": 96})
    plan = Plan(tp=2, pp=8, dp=16, ep=32, etp=1, global_batch=2048, sequence_parallel=True)
    launch = mg.megatron_args(plan, ok, JobSpec(), s)
    argv = launch.argv()
    assert "--expert-tensor-parallel-size" in argv and argv[argv.index("--expert-tensor-parallel-size") + 1] == "1"
    assert mg.validate_launch(launch) == []


def test_expert_state_sharded_over_etp_ep_and_expert_dp():
    s = load_system("h100-sxm", 256)
    P = _pa(QWEN3, tp=np.array([2, 2]), pp=8, dp=16, ep=np.array([32, 16]), etp=np.array([1, 2]),
            micro_batch=1, global_batch=2048, zero_stage=1)
    _, _, expert = stage_params(QWEN3, P)  # (plans, representative pipeline ranks)
    per_layer = QWEN3.expert_params_per_layer
    # each rank holds its own layers' experts, 1/32 of each (94 layers over pp 8: 11 or 12 a rank)
    assert expert[0] == pytest.approx(P.rank_layers[0] * per_layer / 32)
    assert expert[1] == pytest.approx(P.rank_layers[1] * per_layer / 32)  # etp 2 · ep 16 = 32 shards too
    assert sorted(set(P.rank_layers[0])) == [11, 12]
    mem = memory_breakdown(QWEN3, s, JobSpec(), P)
    # distributed optimizer: experts' state over expert-DP = tp·dp·cp/(etp·ep) = 1 (ep32, etp1);
    # the optimizer step waits for the rank with the most parameters
    blocks, vocab, _ = stage_params(QWEN3, P)
    opt = (blocks + vocab) / 16 + expert / 1
    assert mem["opt_elems"][0] == pytest.approx(opt[0].max())
    assert mem["opt_elems"][1] == pytest.approx(opt[1].max())


def test_dispatcher_and_fsdp2_emission():
    s = load_system("h100-sxm", 256)
    ok = QWEN3.model_copy(update={"layers": 96})
    plan = Plan(tp=2, pp=8, dp=16, ep=32, etp=1, global_batch=2048, sequence_parallel=True, moe_dispatcher="deepep")
    argv = mg.megatron_args(plan, ok, JobSpec(), s).argv()
    i = argv.index("--moe-token-dispatcher-type")
    assert argv[i + 1] == "flex" and argv[argv.index("--moe-flex-dispatcher-backend") + 1] == "deepep"
    # DeepSpeed is not Megatron; FSDP2 inside Megatron has Megatron's own restrictions
    assert mg.not_expressible(Plan(dp=8, global_batch=8, zero_stage=3, dp_impl="deepspeed"), ok, JobSpec())
    assert any("pipeline or expert" in r for r in mg.not_expressible(
        Plan(pp=2, dp=4, global_batch=8, zero_stage=3, dp_impl="torch-fsdp2"), ok, JobSpec()))


def test_deepep_crosses_each_remote_domain_once():
    """ep 32 at stride 1 on DGX H100: G = 4 nodes of 32 experts each; a token's 8 distinct experts
    reach 4·(1 − C(96,8)/C(128,8)) nodes on average, 3/4 of them remote: 2.72 remote nodes (the
    with-replacement 3·(1 − (3/4)^8) = 2.70 undercounts), instead of 8·24/32 = 6 copies off-node."""
    import math
    s = load_system("h100-sxm", 256)
    base = dict(tp=2, pp=8, dp=16, ep=32, etp=1, sequence_parallel=1, micro_batch=1, global_batch=2048)
    job = JobSpec()
    a2a = tm.moe_dispatch_s(QWEN3, s, job, _pa(QWEN3, **base, moe_dispatcher=0))
    dep = tm.moe_dispatch_s(QWEN3, s, job, _pa(QWEN3, **base, moe_dispatcher=1))
    routed = 4096 / 2
    imb, eff = float(tm.moe_load_imbalance(QWEN3, job, _pa(QWEN3, **base))[0]), tm.A2A_BW_EFFICIENCY
    nic = 50e9 * 0.8 * eff
    lat = 31 * 8e-6
    assert a2a[0] == pytest.approx(2 * (routed * 8 * 4096 * 2 * imb * 24 / 32 / nic + lat))
    remote = 4 * (1 - math.comb(96, 8) / math.comb(128, 8)) * 3 / 4
    assert remote == pytest.approx(2.72, abs=0.005)
    assert dep[0] == pytest.approx(2 * (routed * 4096 * 2 * imb * remote / nic + lat))


def test_moe_activation_coefficients_hand_derived():
    """Qwen3-235B per token and layer, in units of h bytes: attention (2·a·d + 4·g·d + 2·a·d)/h =
    (16384 + 2048 + 16384)/4096 = 8.5; MoE: 6·top_k·ffn_e/h = 18, permuted inputs 2·top_k = 16,
    router fp32 logits + probs 8·E/h = 0.25."""
    from planner.analytical.memory import activation_coefficients
    unsharded, sharded, _ = activation_coefficients(QWEN3)
    assert unsharded == 8.0  # no dropout
    assert sharded == pytest.approx(8.5 + 18 + 16 + 0.25)
    # leading dense layers are their own kind (no averaging): the MoE layer keeps its
    # coefficients, the dense twin has the dense SwiGLU MLP 6·ffn/h = 6·12288/4096 = 18
    from planner.analytical.layer_kinds import lead_layer_model
    dense47 = QWEN3.model_copy(update={"moe": QWEN3.moe.model_copy(update={"first_dense_layers": 47})})
    assert activation_coefficients(dense47)[1] == pytest.approx(8.5 + 18 + 16 + 0.25)
    assert activation_coefficients(lead_layer_model(dense47))[1] == pytest.approx(8.5 + 6 * 12288 / 4096)


def test_cli_flags_for_folding_dispatcher_and_dp_impl():
    from typer.testing import CliRunner
    from planner.cli import app
    r = CliRunner().invoke(app, ["megatron", "-m", "qwen3-235b-a22b", "-s", "h100-sxm", "-g", "256", "-b", "2048",
                                 "--tp", "2", "--pp", "2", "--ep", "32", "--etp", "1", "--sequence-parallel",
                                 "--moe-dispatcher", "deepep", "--recompute", "full", "--format", "args"])
    assert r.exit_code == 0, r.output
    assert "--expert-tensor-parallel-size 1" in r.output and "--moe-token-dispatcher-type flex" in r.output
    bad = CliRunner().invoke(app, ["estimate", "-m", "qwen3-235b-a22b", "-s", "h100-sxm", "-g", "256",
                                   "--dp-impl", "fsdp9"])
    assert bad.exit_code == 2 and "dp-impl" in bad.output and "torch-fsdp2" in bad.output
    assert "Traceback" not in bad.output


def test_a2a_overlap_pairs_each_all_to_all_with_one_compute_piece():
    """Megatron's schedule_layer_1f1b (with --delay-wgrad-compute, as the launch sets it) runs
    four pairs per layer: forward attention beside the backward's combine, the backward MLP's
    input gradient beside the forward's dispatch, forward MLP + the delayed weight gradient beside
    the backward's dispatch, backward attention beside the forward's combine; each all-to-all
    moves one direction (a/2 of the pass's dispatch + combine a). Hand count: a = 4 ms, forward
    3 ms of which the MLP 2 ms (attention 1 ms), backward 6 ms of which the MLP 4 ms (input
    gradient 2, weight gradient 2; attention 2 ms): hideable min(2, 1) + min(2, 2) + min(2, 2 + 2)
    + min(2, 2) = 7 ms, where pooling the pair's compute (the old rule) hid min(8, 9) = 8 ms: the
    short forward attention leaves 1 ms of its combine exposed whatever the MLP's length."""
    base = dict(tp=2, pp=8, dp=16, ep=32, etp=1, vpp=4, sequence_parallel=1, micro_batch=1, global_batch=2048,
                moe_a2a_overlap=1)
    P = _pa(QWEN3, **base)
    u = float(tm.unpaired_microbatch_fraction(P)[0])
    a, f, b, mlp_f, mlp_b = 0.004, 0.003, 0.006, 0.002, 0.004
    eff = tm.A2A_OVERLAP_EFFICIENCY
    fwd, bwd = tm.a2a_overlap_exposed_s(np.array([a]), np.array([f]), np.array([b]), P,
                                        mlp_fwd_s=np.array([mlp_f]), mlp_bwd_s=np.array([mlp_b]))
    assert fwd[0] == pytest.approx(u * a)
    assert bwd[0] == pytest.approx(u * a + (1 - u) * (2 * a - eff * 0.007))
    _, pooled = tm.a2a_overlap_exposed_s(np.array([a]), np.array([f]), np.array([b]), P)
    assert pooled[0] == pytest.approx(u * a + (1 - u) * (2 * a - eff * 0.008))
    # balanced pieces that each outlast a/2: the pairs hide all of it, as pooling does
    fwd2, bwd2 = tm.a2a_overlap_exposed_s(np.array([a]), np.array([0.008]), np.array([0.016]), P,
                                          mlp_fwd_s=np.array([0.004]), mlp_bwd_s=np.array([0.008]))
    assert bwd2[0] == pytest.approx(u * a + (1 - u) * (2 * a - eff * 2 * a))


def test_dense_and_expert_groups_share_one_overlap_window():
    """The dense (dp·cp) and expert-DP groups' reduce-scatters run one after the other on the same
    links, behind one backward: each had been given the whole window (a randomized regret audit found
    recomputing more layers "faster" because the longer window hid the transfer twice). Hand-derived:
    ZeRO-1, one microbatch, window 1.0 s; each group's reduce-scatter 0.8 s, no gather."""
    from planner.plan import DP_IMPL_CODES
    n, bw = 8.0, 100e9
    grad_bytes = 0.8 * bw * n / (n - 1)  # reduce_scatter_s = bytes·(n-1)/n / bw (latency 0)
    assert comm.reduce_scatter_s(grad_bytes, n, bw, 0.0) == pytest.approx(0.8)
    groups = [(grad_bytes, 0.0, n, bw, 0.0), (grad_bytes, 0.0, n, bw, 0.0)]
    one = np.array([1.0])
    exposed = dpc.dp_comm_exposed_s(groups, np.array([1]), np.array([DP_IMPL_CODES["megatron"]]), one, one,
                                    one, one, one, one, np.array([True]), overlapped_collective_s)
    assert exposed == pytest.approx([0.8 + 0.8 - 1.0])  # not 2 x max(0, 0.8 - 1.0) = 0
