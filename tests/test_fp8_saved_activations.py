"""Under low-precision recipes Transformer Engine keeps a GEMM's input for the weight gradient as
the quantised copy of the forward GEMM (memory.activation_parts, saved_gemm_input_bytes)."""
from __future__ import annotations

import pytest

from planner.analytical.memory import activation_coefficients, saved_gemm_input_bytes
from planner.model import load_model
from planner.plan import JobSpec


def test_llama3_8b_layer_by_hand():
    """Llama-3 8B (h 4096, SwiGLU ffn 14336, 8 KV groups): bf16 keeps sbh·(10 + 24-ish); FP8
    current scaling halves the QKV and MLP normed inputs (2 → 1 each, not TP-sharded) and fc2's
    input (the SwiGLU product, 2f/h → f/h = 3.5); delayed scaling adds the output projection's
    quantised copy (1 byte per attention-output element: q width / h = 1)."""
    model = load_model("llama3-8b")
    bf16 = activation_coefficients(model)
    cs = activation_coefficients(model, *saved_gemm_input_bytes(JobSpec(global_batch=8, dtype="fp8-cs")))
    delayed = activation_coefficients(model, *saved_gemm_input_bytes(JobSpec(global_batch=8, dtype="fp8")))
    assert bf16[0] - cs[0] == pytest.approx(2.0)
    assert bf16[1] - cs[1] == pytest.approx(14336 / 4096)
    assert delayed[1] - cs[1] == pytest.approx(1.0)
    assert cs[2] == bf16[2]  # the s² score term is not a GEMM input


def test_moe_routed_inputs_and_torch_stacks():
    """Qwen3-30B-A3B (top 8 of 128, expert ffn 768, h 2048): the permuted expert inputs (2·k → g·k)
    and fc2's inputs (2·k·f/h → g·k·f/h) in MXFP8 (1 + 1/32 bytes); the MoE layer's normed input
    stays bf16 (the router keeps it). The torch stacks keep 16-bit copies."""
    model = load_model("qwen3-30b-a3b")
    g = 1.0 + 1.0 / 32
    bf16 = activation_coefficients(model)
    mx = activation_coefficients(model, *saved_gemm_input_bytes(JobSpec(global_batch=8, dtype="mxfp8")))
    k, f, h = 8, 768, 2048
    assert bf16[1] - mx[1] == pytest.approx((2 - g) * k + (2 - g) * k * f / h)
    assert bf16[0] - mx[0] == pytest.approx(2 - g)  # only the QKV normed input
    assert saved_gemm_input_bytes(JobSpec(global_batch=8, dtype="mxfp8", kernels="torch-compile")) == (2.0, 0.0)
