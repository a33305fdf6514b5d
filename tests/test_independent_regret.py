"""The search against an enumeration written here, independently of constraints/space.py: Plans
built knob by knob, scored with `estimate`, kept where the model finds them feasible and Megatron
can run them (`not_expressible`). The search's best must be at least as fast, within the tie
tolerance. Each job is one where the space had left the winner out (2026-11-29 audit)."""
from __future__ import annotations

import itertools

import numpy as np

from hardware import load_system
from planner import megatron as mg
from planner.analytical import PlanArrays, estimate
from planner.analytical.estimate import estimate_many
from planner.analytical.layer_kinds import dense_layer_spec
from planner.model import load_model
from planner.plan import JobSpec, Plan, applicable_recompute_modules
from planner.search import plan
from planner.ties import TIE_REL_TOL


def _best(model, system, job, plans, free=False):
    """Fastest feasible, expressible plan of `plans` (objective as the search's: time per token where
    the batch is free). Scored in one `estimate_many` call over the plans, the arrays `estimate` reads
    its one row from (the same numbers, bit for bit, at a hundredth of the time of ~900 `estimate`
    calls); the winner is scored again with `estimate` itself."""
    plans = [p for p in plans if not mg.not_expressible(p, model, job)]
    res = estimate_many(model, system, job, PlanArrays.from_plans(plans, model.layers, dense_layer_spec(model)))
    step = res["step_time_s"]
    tokens = np.array([p.global_batch * model.seq_length for p in plans], dtype=float)
    obj = np.where(res["violations"] == 0, step / tokens if free else step, np.inf)
    if not np.isfinite(obj).any():
        return None
    i = int(np.argmin(obj))  # the first of equal objectives, as a loop keeping strict improvements
    est = estimate(model, system, plans[i], job)
    assert est.feasible and est.step_time_s == step[i]
    return float(obj[i]), plans[i]


def test_shared_expert_module_sets_are_searched():
    """DeepSeek-V2-Lite on 8 B200, batch 128: every subset of the recompute modules that act on it,
    at ep 1 or 4, micro-batch 8 or 16, ZeRO-1 or 3. Recomputing the shared experts, the leading
    dense layer's mlp, the MLA up-projections, the norms and the routed experts' activation lets
    ep 1 run micro-batch 16 under ZeRO-3 (1.267 s); the search had no module set with
    shared_experts and returned ep 4 mb 8 (1.295 s, 2.3 % slower)."""
    model, system, job = load_model("deepseek-v2-lite"), load_system("b200", 8), JobSpec(global_batch=128)
    modules = [m for m, why in applicable_recompute_modules(model).items() if why is None and m != "core_attn"]
    subsets = [()] + [s for k in range(1, len(modules) + 1) for s in itertools.combinations(modules, k)]
    plans = [Plan(tp=1, pp=1, dp=8, ep=ep, micro_batch=mb, global_batch=128, zero_stage=zero,
                  cross_entropy_fusion=job.cross_entropy_fusion,
                  **({"recompute": "selective", "recompute_modules": s} if s else {}))
             for ep, mb, zero, s in itertools.product((1, 4), (8, 16), (1, 3), subsets)]
    want, enumerated = _best(model, system, job, plans)
    assert enumerated.ep == 1 and enumerated.micro_batch == 16 and "shared_experts" in enumerated.recompute_modules
    got = plan(model, system, job, top_k=1).best
    assert got.objective <= want * (1 + TIE_REL_TOL), (got.plan.short(), got.objective, enumerated.short(), want)
    assert mg.not_expressible(got.plan, model, job) == []


def test_free_batch_searches_micro_batches_that_are_not_powers_of_two():
    """Qwen3-14B on 8 H100, batch free up to 3072: tp 1/2/4/8 without a pipeline, every
    micro-batch 1..16 at the largest batch it allows, ZeRO 0-3, SP (+ TP overlap), recompute none or
    full. tp 2 dp 4 mb 3 (batch 3072) is 0.5 % faster per token than the search's tp 1 dp 8 mb 1
    when its free-batch micro-batches were powers of two only (mb 4 does not fit at tp 2)."""
    model, system, job = load_model("qwen3-14b"), load_system("h100-sxm", 8), JobSpec()
    cap = job.max_global_batch
    plans = []
    for tp, mb, zero, rc in itertools.product((1, 2, 4, 8), range(1, 17), (0, 1, 2, 3), ("none", "full")):
        dp = 8 // tp
        gb = cap // (mb * dp) * mb * dp
        for sp in ((False, True) if tp > 1 else (False,)):
            plans.append(Plan(tp=tp, dp=dp, micro_batch=mb, global_batch=gb, zero_stage=zero, recompute=rc,
                              sequence_parallel=sp, tp_comm_overlap=sp, cross_entropy_fusion=job.cross_entropy_fusion))
    want, enumerated = _best(model, system, job, plans, free=True)
    assert enumerated.micro_batch not in (1, 2, 4, 8, 16), enumerated.short()
    got = plan(model, system, job, top_k=1).best
    assert got.objective <= want * (1 + TIE_REL_TOL), (got.plan.short(), got.objective, enumerated.short(), want)
