"""The three Megatron performance switches a Plan carries, costed against hand-derived numbers:
--grad-reduce-in-bf16 (2-byte gradient buffers and DP reduce), --fp8-param-gather (1-byte FP8
block weights, gathered in FP8) and --cross-entropy-loss-fusion (22 of 38 bytes per fp32 logit
moved in forward; counted from Megatron's cross_entropy.py / fused_cross_entropy.py)."""
from __future__ import annotations

import pytest

from hardware import load_system
from planner.analytical import comm, estimate
from planner.analytical.memory import memory_breakdown
from planner.analytical.plans import PlanArrays
from planner.analytical.time import CROSS_ENTROPY_FUSED_SHARE
from planner.model import load_model
from planner.plan import JobSpec, Plan

MODEL, SYSTEM = load_model("llama3-8b"), load_system("h100-sxm", 8)
BASE = dict(dp=8, micro_batch=1, global_batch=32, zero_stage=0, dp_comm_overlap=False)


def _est(dtype="bf16", **knobs):
    return estimate(MODEL, SYSTEM, Plan(**{**BASE, **knobs}), JobSpec(dtype=dtype))


def _mem(dtype="bf16", **knobs):
    return memory_breakdown(MODEL, SYSTEM, JobSpec(dtype=dtype),
                            PlanArrays.from_plans([Plan(**{**BASE, **knobs})], MODEL.layers))


def test_fused_cross_entropy_share_is_the_byte_count_of_both_paths():
    unfused = (2 + 4) + 4 + (4 + 4) + (4 + 4) + 4 + (4 + 4)   # cast, max, subtract, exp, sum, divide
    fused = (2 + 4) + (4 + 4) + (4 + 4)                       # cast+max, subtract+exp+sum, divide
    assert (unfused, fused) == (38, 22) and CROSS_ENTROPY_FUSED_SHARE == fused / unfused


def test_bf16_grad_reduce_halves_gradient_memory_and_dp_traffic():
    off, on = _est(), _est(grad_reduce_in_bf16=True)
    assert on.memory_breakdown_bytes["grads_bytes"] == pytest.approx(off.memory_breakdown_bytes["grads_bytes"] / 2)
    # zero 0, no overlap: the DP step is one ring all-reduce of every gradient: 2(n-1)/n·B/bw + 2(n-1)α
    params = _mem()["params_elems"][0]
    bw, lat = comm.group_link(SYSTEM, 8, 1)
    ring = lambda nbytes: 2 * 7 / 8 * nbytes / float(bw) + 2 * 7 * float(lat)  # noqa: E731
    assert off.time_breakdown_s["dp_comm_exposed_s"] == pytest.approx(ring(4 * params))
    assert on.time_breakdown_s["dp_comm_exposed_s"] == pytest.approx(ring(2 * params))


def test_fp8_param_gather_stores_and_gathers_block_weights_in_one_byte():
    off, on = _mem("fp8", zero_stage=1), _mem("fp8", zero_stage=1, fp8_param_gather=True)
    # block weights 2 -> 1 byte, the embedding / LM head stays 16-bit
    assert on["weights_bytes"][0] == pytest.approx(off["weights_bytes"][0] / 2)
    assert on["embeddings_bytes"][0] == pytest.approx(off["embeddings_bytes"][0])
    vocab_elems = 2 * MODEL.vocab * MODEL.hidden  # pp 1, untied: embedding + LM head, tp 1
    blocks = off["params_elems"][0] - vocab_elems
    assert on["param_gather_bytes"][0] == pytest.approx(blocks * 1 + vocab_elems * 2)
    assert off["param_gather_bytes"][0] == pytest.approx((blocks + vocab_elems) * 2)


def test_fp8_param_gather_keeps_the_router_in_sixteen_bits():
    # Mixtral 8x7B, pp 1 ep 8: 32 routers of 8×4096 (plain Parameters, moe/router.py: not FP8)
    # stay 2-byte beside the 1-byte block weights, in the buffer and in the gather
    model = load_model("mixtral-8x7b")
    plan = PlanArrays.from_plans([Plan(**{**BASE, "ep": 8, "zero_stage": 1})], model.layers)
    fp8 = PlanArrays.from_plans([Plan(**{**BASE, "ep": 8, "zero_stage": 1, "fp8_param_gather": True})],
                                model.layers)
    off, on = (memory_breakdown(model, SYSTEM, JobSpec(dtype="fp8"), P) for P in (plan, fp8))
    router = 32 * 8 * 4096
    blocks = off["params_elems"][0] - 2 * model.vocab * model.hidden  # untied embedding + LM head
    assert off["weights_bytes"][0] == pytest.approx(2 * blocks)
    assert on["weights_bytes"][0] == pytest.approx((blocks - router) * 1 + router * 2)
    assert on["param_gather_bytes"][0] - off["param_gather_bytes"][0] == pytest.approx(-(blocks - router))


def test_cross_entropy_fusion_saves_its_share_of_the_element_wise_passes():
    off, on = _est(), _est(cross_entropy_fusion=True)
    acc = SYSTEM.accelerator
    tokens, m = BASE["micro_batch"] * MODEL.seq_length, BASE["global_batch"] // (BASE["micro_batch"] * 8)
    # forward: 3 passes over 4-byte logits at the element-wise HBM bandwidth, per microbatch
    passes_s = 3 * 4.0 * tokens * MODEL.vocab / (acc.hbm_bandwidth_bytes_per_s * acc.efficiency.hbm_efficiency)
    saved = m * (1 - CROSS_ENTROPY_FUSED_SHARE) * passes_s
    assert off.time_breakdown_s["forward_s"] - on.time_breakdown_s["forward_s"] == pytest.approx(saved)
    assert off.hbm_bytes == on.hbm_bytes  # the fused path keeps the fp32 softmax
    assert off.time_breakdown_s["backward_s"] == on.time_breakdown_s["backward_s"]  # same gradient kernel
