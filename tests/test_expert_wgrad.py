"""Expert weight-gradient GEMMs against the roofline with main-gradient accumulation in the
gradient buffer's dtype (planner/analytical/time.py: expert_wgrad_memory_excess_s), by hand."""
from __future__ import annotations

import pytest

from planner.analytical import PlanArrays
from planner.analytical import time as tm
from planner.model import load_model
from planner.plan import JobSpec, Plan

QWEN3 = load_model("qwen3-235b-a22b")  # h 4096, expert FFN 1536 (SwiGLU), 128 experts


def _plan(ep: int, grad_reduce_in_bf16: bool = False) -> PlanArrays:
    plan = Plan(tp=4, pp=8, dp=8, ep=ep, etp=1, micro_batch=1, global_batch=2048, sequence_parallel=True,
                grad_reduce_in_bf16=grad_reduce_in_bf16)
    return PlanArrays.from_plans([plan], QWEN3.layers)


def test_wgrad_bytes_by_hand():
    # ep 8: 16 local experts, 512 rows each. FC1: rows·(h + 2·ffn)·2 B operands + 8 B·h·2ffn fp32 dW
    # read+write = 512·7168·2 + 8·4096·3072 = 108,003,328 B; FC2: 512·(1536 + 4096)·2 + 8·1536·4096
    # = 56,098,816 B; 16 experts: 2,625,634,304 B.
    hbm = 1.76e12
    excess = tm.expert_wgrad_memory_excess_s(QWEN3, JobSpec(), _plan(8), 512.0, 0.5e-3, hbm)
    assert excess[0] == pytest.approx(2_625_634_304 / hbm - 0.5e-3, rel=1e-12)


def test_bf16_gradient_buffer_halves_the_accumulation_traffic():
    # grad_reduce_in_fp32=False: Megatron-Core's DDP allocates main_grad in the parameters' bf16,
    # so dW is read and written at 2 + 2 B. FC1: 512·7168·2 + 4·4096·3072 = 57,671,680 B; FC2:
    # 512·5632·2 + 4·1536·4096 = 30,932,992 B; 16 experts: 1,417,674,752 B.
    hbm = 1.76e12
    excess = tm.expert_wgrad_memory_excess_s(QWEN3, JobSpec(), _plan(8, grad_reduce_in_bf16=True), 512.0, 0.5e-3, hbm)
    assert excess[0] == pytest.approx(1_417_674_752 / hbm - 0.5e-3, rel=1e-12)


def test_compute_bound_wgrad_costs_nothing_extra():
    # ep 32: 4 local experts of 4096 rows; the same memory time is far below a compute time that
    # large, so the roofline's max is the compute already charged
    assert tm.expert_wgrad_memory_excess_s(QWEN3, JobSpec(), _plan(32), 4096.0, 1.0, 1.76e12)[0] == 0.0


def test_fp8_operands_are_one_byte():
    hbm = 1.76e12
    bf16 = tm.expert_wgrad_memory_excess_s(QWEN3, JobSpec(), _plan(8), 512.0, 0.0, hbm)[0]
    fp8 = tm.expert_wgrad_memory_excess_s(QWEN3, JobSpec(dtype="fp8"), _plan(8), 512.0, 0.0, hbm)[0]
    operands = 16 * 512 * ((4096 + 3072) + (1536 + 4096))  # elements, 1 byte saved each
    assert (bf16 - fp8) * hbm == pytest.approx(operands, rel=1e-12)


def _touched_domains_by_enumeration(groups: int, group_topk: int, domains: int) -> float:
    """Mean number of domains the chosen groups cover, over every choice of group_topk groups
    (domains hold groups/domains whole groups each, in order)."""
    import itertools
    per = groups // domains
    choices = list(itertools.combinations(range(groups), group_topk))
    return sum(len({g // per for g in c}) for c in choices) / len(choices)


@pytest.mark.parametrize("domains", [2, 4, 8])
def test_group_limited_routing_against_enumeration(domains):
    import numpy as np
    ds = load_model("deepseek-v3").moe  # 8 groups, top-4 groups (node-limited routing)
    G = np.array([float(domains)])
    touched = _touched_domains_by_enumeration(8, 4, domains)
    assert tm.group_limited_remote_domains(ds, G)[0] == pytest.approx(touched * (domains - 1) / domains, rel=1e-12)


def test_group_limited_routing_at_ep64_on_8_gpu_nodes():
    import numpy as np
    # 8 nodes, one group each: 4 nodes touched, 3.5 of them remote, against 7·(1 − (7/8)^8) = 4.59
    # for unlimited top-8 routing (DeepSeek-V3 §3.2.2: at most 4 nodes per token)
    ds = load_model("deepseek-v3").moe
    assert tm.group_limited_remote_domains(ds, np.array([8.0]))[0] == pytest.approx(3.5, rel=1e-12)
    # groups wider than domains (16 domains of 16 experts, groups of 32): the 8 experts fall in the
    # 8 domains the 4 chosen groups span
    assert tm.group_limited_remote_domains(ds, np.array([16.0]))[0] == pytest.approx(
        8 * (1 - (7 / 8) ** 8) * 15 / 16, rel=1e-12)
    assert np.isinf(tm.group_limited_remote_domains(QWEN3.moe, np.array([8.0]))[0])


def _ranks_reached_by_enumeration(experts: int, top_k: int, ep: int) -> float:
    """Mean number of ranks holding >= 1 of the chosen experts, over every choice of top_k distinct
    experts (experts sit on ranks in order, experts/ep each)."""
    import itertools
    per = experts // ep
    choices = list(itertools.combinations(range(experts), top_k))
    return sum(len({e // per for e in c}) for c in choices) / len(choices)


@pytest.mark.parametrize("experts,top_k,ep", [(16, 4, 4), (16, 4, 8), (20, 3, 5), (12, 6, 2), (8, 2, 8)])
def test_ranks_reached_against_enumeration(experts, top_k, ep):
    import numpy as np
    from types import SimpleNamespace
    moe = SimpleNamespace(num_experts=experts, top_k=top_k)
    assert tm.ranks_reached(moe, np.array([float(ep)]))[0] == pytest.approx(
        _ranks_reached_by_enumeration(experts, top_k, ep), rel=1e-12)


def test_deepep_sends_a_token_once_per_rank_inside_the_domain():
    """Inside one NVLink domain (ep 8 on an 8-GPU node, nothing crosses the NICs) DeepEP's dispatch
    moves routed_tokens x ranks_reached rows where NCCL's alltoall moves routed_tokens x top_k: for
    Qwen3-235B (128 experts, top-8, 16 per rank) 8 (1 - C(112,8)/C(128,8)) = 5.34 of 8 rows."""
    import math
    from hardware.load import load_system
    system = load_system("h100-sxm", 8)
    missed = math.comb(112, 8) / math.comb(128, 8)
    assert tm.ranks_reached(QWEN3.moe, 8.0) == pytest.approx(8 * (1 - missed), rel=1e-12)

    def a2a(dispatcher):
        P = PlanArrays.from_plans([Plan(dp=8, ep=8, micro_batch=1, global_batch=8, moe_dispatcher=dispatcher)],
                                  QWEN3.layers)
        return float(tm.moe_dispatch_s(QWEN3, system, JobSpec(global_batch=8), P)[0])
    # the latency steps are the same for both; the bytes scale by ranks reached / top_k
    lat = 2.0 * 7 * system.network[0].latency_s  # dispatch + combine, one step per peer each
    assert (a2a("deepep") - lat) / (a2a("alltoall") - lat) == pytest.approx(8 * (1 - missed) / 8, rel=1e-9)


def _remote_domains_by_enumeration(experts: int, top_k: int, domains: int) -> float:
    """Mean number of domains other than the token's own that hold >= 1 of its chosen experts, over
    every choice of top_k distinct experts and every source domain (experts in order, experts/domains
    each)."""
    import itertools
    per = experts // domains
    choices = list(itertools.combinations(range(experts), top_k))
    return sum(len({e // per for e in c} - {own}) for c in choices for own in range(domains)) \
        / (len(choices) * domains)


@pytest.mark.parametrize("experts,top_k,domains", [(16, 4, 4), (16, 8, 2), (24, 6, 8), (12, 1, 3), (8, 2, 8)])
def test_remote_domains_against_enumeration(experts, top_k, domains):
    """DeepEP crosses the NICs once per remote domain a token reaches: the exact (without
    replacement) count, which the with-replacement (G-1)(1-(1-1/G)^k) understates."""
    import numpy as np
    from types import SimpleNamespace
    moe = SimpleNamespace(num_experts=experts, top_k=top_k)
    exact = _remote_domains_by_enumeration(experts, top_k, domains)
    assert tm.remote_domains_reached(moe, np.array([float(domains)]))[0] == pytest.approx(exact, rel=1e-12)
