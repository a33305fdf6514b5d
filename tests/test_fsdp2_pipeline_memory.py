"""torchtitan's FSDP2 under pipeline parallelism keeps each stage's parameters gathered and
accumulates its gradients unsharded in fp32 between microbatches (planner/analytical/memory.py);
Megatron's own schedule (the "te" stack) does not."""
from __future__ import annotations

import pytest

from hardware import load_system
from planner.analytical import PlanArrays
from planner.analytical.memory import rank_memory
from planner.model import load_model
from planner.plan import JobSpec, Plan


def _rank0(plan: Plan, kernels: str) -> dict:
    model, system = load_model("llama3-8b"), load_system("h100-sxm", 64)
    P = PlanArrays.from_plans([plan], model.layers)
    mem = rank_memory(model, system, JobSpec(global_batch=plan.global_batch, kernels=kernels), P)
    return {k: float(v[0, 0]) for k, v in mem.items() if getattr(v, "ndim", 0) == 2}


def test_unsharded_stage_hand_derived():
    """Llama-3 8B, pp 2, FSDP 32, rank 0 (16 layers + embedding): its parameters in bf16 instead of
    1/32 of them, and 4 B per parameter of accumulated gradient on top of the sharded fp32 one."""
    plan = Plan(pp=2, dp=32, micro_batch=1, global_batch=64, zero_stage=3, dp_impl="torch-fsdp2")
    titan, megatron = _rank0(plan, "torch-compile"), _rank0(plan, "te")
    model = load_model("llama3-8b")
    h, ffn, kv = model.hidden, model.ffn_hidden, model.kv_groups * model.head_dim
    per_layer = h * (h + 2 * kv) + h * h + 3 * h * ffn + 2 * h  # attention, MLP, two RMSNorms
    stage = 16 * per_layer + model.vocab * h  # + the embedding on the first stage
    assert titan["params_elems"] == pytest.approx(stage, rel=1e-9)
    blocks = 16 * per_layer
    # the blocks' weights line: bf16 gathered instead of 1/32; grads line: + fp32 accumulation
    assert titan["weights"] - megatron["weights"] == pytest.approx(2.0 * blocks * (1 - 1 / 32), rel=1e-9)
    assert titan["grads"] - megatron["grads"] == pytest.approx(4.0 * blocks, rel=1e-9)
    # in all (the embedding line takes the vocabulary's share of both)
    assert titan["hbm"] - megatron["hbm"] == pytest.approx(2.0 * stage * (1 - 1 / 32) + 4.0 * stage, rel=1e-9)


def test_no_change_without_pipelining_or_fsdp2():
    for plan in (Plan(pp=1, dp=64, micro_batch=1, global_batch=64, zero_stage=3, dp_impl="torch-fsdp2"),
                 Plan(pp=2, dp=32, micro_batch=1, global_batch=64, zero_stage=1)):
        assert _rank0(plan, "torch-compile")["hbm"] == pytest.approx(_rank0(plan, "te")["hbm"], rel=1e-12)
