"""The kernel-level settings of NVIDIA's tuned MoE recipes (JobSpec.full_iteration_cuda_graph,
fp8_attention, fused_grouped_mlp) against hand arithmetic: what each removes or speeds up, and
that each leaves everything else as it was."""
import math

import pytest

from hardware import load_system
from planner.analytical import PlanArrays
from planner.analytical.precision import QUANTISE_BYTES_PER_ELEMENT
from planner.analytical.time import ELEMENTWISE_PASSES_FFN, layer_compute_fwd_s
from planner.model import load_model
from planner.plan import JobSpec, Plan
from pydantic import ValidationError


def _layer(model, system, plan, **job):
    P = PlanArrays.from_plans([plan], model.layers)
    return {k: float(v[0]) if hasattr(v, "__len__") else float(v)
            for k, v in layer_compute_fwd_s(model, system, JobSpec(**job), P).items()}


@pytest.fixture(scope="module")
def qwen3_gb200():
    return load_model("qwen3-235b-a22b"), load_system("gb200-nvl72", 32), Plan(ep=32, dp=32, global_batch=32)


def test_full_iteration_graph_drops_the_per_layer_overhead(qwen3_gb200):
    model, system, plan = qwen3_gb200
    base = _layer(model, system, plan, dtype="mxfp8")
    graph = _layer(model, system, plan, dtype="mxfp8", full_iteration_cuda_graph=True)
    overhead_s = system.accelerator.efficiency.layer_overhead_us * 1e-6
    assert overhead_s > 0
    assert base["elementwise"] - graph["elementwise"] == pytest.approx(overhead_s, rel=1e-12)
    assert (base["gemm"], base["attention"]) == (graph["gemm"], graph["attention"])


def test_fp8_attention_runs_the_core_at_the_fp8_peak(qwen3_gb200):
    """GB200: FP8 dense 5 PF, BF16 2.5 PF (NVL72 datasheet): the same kernel curve at twice the
    peak halves the attention core; nothing else moves."""
    model, system, plan = qwen3_gb200
    base = _layer(model, system, plan, dtype="mxfp8")
    fp8 = _layer(model, system, plan, dtype="mxfp8", fp8_attention=True)
    acc = system.accelerator
    assert acc.peak("fp8") / acc.peak("bf16") == pytest.approx(2.0)
    assert fp8["attention"] == pytest.approx(base["attention"] / 2.0, rel=1e-12)
    assert (fp8["gemm"], fp8["elementwise"]) == (base["gemm"], base["elementwise"])


def test_fused_grouped_mlp_drops_the_activation_and_two_casts_per_routed_copy(qwen3_gb200):
    """Hand count for Qwen3-235B (h 4096, expert FFN 1536, SwiGLU, top-8) at micro-batch 1,
    sequence 4096, tp 1: the fused MLP saves, per routed copy, the activation's
    2·ELEMENTWISE_PASSES_FFN bytes per FFN element and the quantisation of FC2's input (ffn
    elements) and of FC1's output gradient (2·ffn elements), a third of that charged forward. The
    activation waits on the busiest expert rank: balanced routing's sampling spread
    1 + sqrt(2 ln ep / rows) (time.moe_load_imbalance) at ep 32 and 4096·8 rows."""
    model, system, plan = qwen3_gb200
    base = _layer(model, system, plan, dtype="mxfp8")
    fused = _layer(model, system, plan, dtype="mxfp8", fused_grouped_mlp=True)
    tokens, k, ffn = 4096, 8, 1536
    hbm = system.accelerator.hbm_bandwidth_bytes_per_s * system.accelerator.efficiency.hbm_efficiency
    spread = 1.0 + math.sqrt(2.0 * math.log(32) / (tokens * k))
    activation_s = spread * tokens * k * 2.0 * ELEMENTWISE_PASSES_FFN * ffn / hbm
    casts_s = QUANTISE_BYTES_PER_ELEMENT["mxfp8"] * tokens * k * (ffn + 2 * ffn) / 3 / hbm
    assert base["elementwise"] - fused["elementwise"] == pytest.approx(activation_s + casts_s, rel=1e-9)
    assert fused["moe_act_s"] == 0.0 and base["moe_act_s"] > 0.0
    assert fused["gemm"] == base["gemm"]


def test_fused_grouped_mlp_leaves_a_dense_model_alone():
    model, system = load_model("llama3-8b"), load_system("h100-sxm", 8)
    plan = Plan(tp=2, dp=4, global_batch=4, sequence_parallel=True)
    assert _layer(model, system, plan, dtype="fp8") == _layer(model, system, plan, dtype="fp8", fused_grouped_mlp=True)


def test_fp8_attention_needs_a_low_precision_dtype():
    with pytest.raises(ValidationError, match=r"fp8_attention \(--fp8-attention\) needs a low-precision dtype"):
        JobSpec(dtype="bf16", fp8_attention=True)


def test_expert_host_time_beyond_the_experts_gpu_time_is_exposed():
    """Qwen3-235B (128 experts) at ep 8 on DGX B200, micro-batch 1, tp 1: 16 local experts, two
    GEMMs each in forward, EXPERT_GEMM_HOST_US of host time per GEMM; the forward waits for what
    exceeds the experts' GPU time. A full-iteration CUDA graph or the fused grouped MLP (one
    kernel for all experts) issue no per-expert launches."""
    from planner.analytical import time as tm
    model, system = load_model("qwen3-235b-a22b"), load_system("b200", 8)
    plan = Plan(ep=8, dp=8, global_batch=8)
    P = PlanArrays.from_plans([plan], model.layers)
    job = JobSpec(dtype="mxfp8")
    moe = tm.moe_mlp_fwd_s(model, system, job, P)
    host_s = 16 * 2 * tm.EXPERT_GEMM_HOST_US * 1e-6
    gpu_s = float(moe["expert_gemm_s"][0] + moe["expert_act_s"][0])
    assert float(moe["expert_host_exposed_s"][0]) == pytest.approx(max(0.0, host_s - gpu_s), rel=1e-12)
    assert host_s > gpu_s  # 16 experts of 2048 rows: host-bound, as the B200 ep8 recipes run
    for knob in ("full_iteration_cuda_graph", "fused_grouped_mlp"):
        other = tm.moe_mlp_fwd_s(model, system, job.model_copy(update={knob: True}), P)
        assert float(other["expert_host_exposed_s"][0]) == 0.0
    # ep 32 on NVL72: 4 local experts of 8192 rows, the GPU outlasts the host
    big = Plan(ep=32, dp=32, global_batch=32)
    moe32 = tm.moe_mlp_fwd_s(model, load_system("gb200-nvl72", 32), job,
                             PlanArrays.from_plans([big], model.layers))
    assert float(moe32["expert_host_exposed_s"][0]) == 0.0
