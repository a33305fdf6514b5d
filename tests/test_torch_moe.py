"""torchtitan's MoE layer under the torch stacks (kernels.torch_moe_bytes): the eager routing glue,
permutations and expert SwiGLU, counted op by op from torchtitan's MoE.forward and ExpertParallel
hooks, each a streaming pass; checked by hand on Llama-4 Scout at local batch 1 on a GB200."""
import numpy as np
import pytest

from planner.analytical import PlanArrays, kernels
from planner.analytical import time as tm
from planner.reference import load_reference

SCOUT = "torchtitan_llama4-scout_256gpu_fsdp256_ep16_bf16"


@pytest.fixture(scope="module")
def scout():
    cases, _ = load_reference()
    return next(c for c in cases if c.id == SCOUT)


def _moe(case, kernels_name):
    job = case.job.model_copy(update={"kernels": kernels_name})
    P = PlanArrays.from_plans([case.plan], case.model.layers)
    return tm.moe_mlp_fwd_s(case.model, case.system, job, P), tm.moe_load_imbalance(case.model, job, P)


def test_op_by_op_bytes_of_torchtitan_moe_forward():
    # gather 2+2, float 2+4, score multiply 4+4, cast 4+2, zeros 2, index_put 2+2, sum read 2
    assert kernels.TORCHTITAN_MOE_ROUTED_ROW_BYTES == 4 + 6 + 8 + 6 + 2 + 4 + 2
    # _permute gather 2+2, _unpermute index_put 2+2
    assert kernels.TORCHTITAN_MOE_RECEIVED_ROW_BYTES == 4 + 4
    # sum write 2, shared + routed add 2+2+2
    assert kernels.TORCHTITAN_MOE_TOKEN_BYTES == 2 + 6


def test_scout_moe_elementwise_by_hand(scout):
    assert (scout.plan.micro_batch, scout.plan.ep, scout.job.kernels) == (1, 16, "torch-compile")
    moe, imb = _moe(scout, "torch-compile")
    imb = float(imb[0])
    tokens, h, f = 8192, 5120, 8192          # local batch 1 x 8192, hidden, expert / shared FFN
    stream = 8000e9 * 0.70                    # GB200 HBM 8 TB/s at the streaming efficiency
    permute = ((32 * tokens + 8 * tokens) * h + imb * 8 * tokens * h) / stream
    assert float(moe["permute_s"][0]) == pytest.approx(permute)
    # the experts' SwiGLU runs eager (silu then multiply, 10 B per element) on the busiest rank's rows
    assert float(moe["expert_act_s"][0]) == pytest.approx(imb * 10 * tokens * f / stream)
    # the shared expert is compiled under torch.compile (one fused SwiGLU kernel, 6 B per element)
    # and eager otherwise (silu then multiply, 10 B): the same GEMMs, 4 B per element apart
    eager, _ = _moe(scout, "torch-eager")
    assert float(eager["shared_expert_s"][0] - moe["shared_expert_s"][0]) == pytest.approx((10 - 6) * tokens * f / stream)


def test_te_stack_keeps_megatron_permutation_passes(scout):
    te, imb = _moe(scout, "te")
    hbm = 8000e9 * scout.system.accelerator.efficiency.hbm_efficiency
    # Megatron's permute + unpermute: PERMUTE_PASSES 2-byte passes over the routed rows
    assert float(te["permute_s"][0]) == pytest.approx(tm.PERMUTE_PASSES * 2 * 8192 * 5120 / hbm)
    torch_moe, _ = _moe(scout, "torch-compile")
    assert np.all(torch_moe["permute_s"] > te["permute_s"])


def test_shared_experts_are_quantised_like_a_dense_mlp():
    from planner.analytical import precision
    # Llama-4 Scout (h 5120, QKV 5120 + 2·1024, SwiGLU expert and shared FFN 8192, top-1):
    # attention 5120 + 5120 + 7168 + 5120, routed (5120 + 8192) + (16384 + 5120), shared the same
    without = precision.quantised_elements_per_token(5120, 7168, 16384, 8192, 1)
    with_shared = precision.quantised_elements_per_token(5120, 7168, 16384, 8192, 1, shared_mlp_width=16384,
                                                         shared_ffn=8192)
    assert without == 22528 + 34816
    assert with_shared == 22528 + 34816 + 34816
    # DeepSeek-V3's one shared expert (h 7168, FFN 2048): (7168 + 2048) + (4096 + 7168)
    assert precision.quantised_elements_per_token(7168, 0, 0, 0, 0, shared_mlp_width=4096, shared_ffn=2048) \
        == (7168 + 7168) + 7168 + 20480
