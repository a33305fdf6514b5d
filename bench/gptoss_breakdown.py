"""Where the model's GPT-OSS 120B step time goes, and what each GPT-OSS-specific mechanism adds.

For the held-out Megatron-Bridge GPT-OSS rows (bench/heldout_bridge.py, each with its recipe's
knobs): the step-time parts (time.step_time), and the seconds per step that each mechanism the
model costs for GPT-OSS adds (the model with that field switched off, everything else equal):
  rope_scaling yarn   Megatron's unfused RoPE (kernels.UNFUSED_ROPE_BYTES)
  activation_clamp    the eager clamp before the experts' fused activation (kernels.CLAMP_GLU_BYTES)
  biases              the experts' eager FC2 bias (kernels.EXPERT_FC2_BIAS_BYTES)
and two that it does not cost, as what-ifs on the same row: the 18 sliding-window layers
(window 128) if the attention kernel skipped the masked tiles, and the unfused attention path
(TE's UnfusedDotProductAttention) if learnable sinks had forced it. Nothing here is fitted.

    PYTHONPATH=. python bench/gptoss_breakdown.py [ROW-ID-SUBSTRING ...]
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import heldout_bridge  # noqa: E402

from planner.analytical import PlanArrays, time  # noqa: E402
from planner.analytical.layer_kinds import lead_layers  # noqa: E402
from planner.calibration import predict  # noqa: E402

DEFAULT_ROWS = ("26.04_GPT_OSS_120B_DGX-H100", "26.06_GPT_OSS_120B_DGX-GB200")
OFF = {"rope_scaling": {"rope_scaling": "none"}, "activation_clamp": {"activation_clamp": None},
       "biases (expert FC2)": {"biases": False}}
SLIDING_LAYERS, WINDOW = 18, 128  # HF config layer_types: every other layer; sliding_window 128


def _step(case, model=None) -> float:
    return predict(case if model is None else type(case)(**{**case.__dict__, "model": model}))["step_time_s"]


def attention_share_s(case) -> float:
    """Seconds per step the slowest rank spends in the attention core (forward, backward at
    time.BACKWARD_FACTOR, and a selective recompute of core_attn if any), one layer kind."""
    P = PlanArrays.from_plans([case.plan], case.model.layers, lead_layers(case.model))
    terms = time.per_layer_terms(case.model, case.system, case.job, P)
    attn = float(terms["attention"][0]) * (1 + time.BACKWARD_FACTOR)
    if case.plan.recompute == "selective" and (case.plan.recompute_modules is None
                                               or "core_attn" in case.plan.recompute_modules):
        attn += float(terms["attention"][0])
    m = case.plan.global_batch / (case.plan.micro_batch * case.plan.dp)
    return attn * m * case.model.layers / case.plan.pp


def main() -> None:
    wanted = sys.argv[1:] or DEFAULT_ROWS
    cases, _ = heldout_bridge.read_back(heldout_bridge.records()[0])
    for case in (c for c in cases if any(w in c.id for w in wanted)):
        pred = predict(case)
        print(f"{case.id}  {case.plan.short()}  {case.job.dtype}")
        print(f"  measured {case.measured_step_s:.3f} s, predicted {pred['step_time_s']:.3f} s "
              f"({pred['step_time_s'] / case.measured_step_s - 1:+.1%})")
        for key, value in pred.items():
            if key.endswith("_s") and key not in ("step_time_s", "tokens_per_s") and value:
                print(f"    {key:24s} {value:8.3f} s")
        print("  mechanisms costed (seconds per step they add):")
        for name, update in OFF.items():
            print(f"    {name:24s} {pred['step_time_s'] - _step(case, case.model.model_copy(update=update)):+8.3f}")
        s = case.model.seq_length
        # keys per query under the window vs causal: (W·s − W²/2) / (s²/2)
        kept = (WINDOW * s - WINDOW ** 2 / 2) / (s * s / 2)
        swa = -attention_share_s(case) * SLIDING_LAYERS / case.model.layers * (1 - kept)
        print("  not costed (what-if, seconds per step):")
        print(f"    {'sliding window skipped':24s} {swa:+8.3f}   (attention core {attention_share_s(case):.3f} s)")
        unfused = type(case.job)(**{**case.job.model_dump(), "flash_attention": False})
        print(f"    {'unfused attention':24s} {predict(type(case)(**{**case.__dict__, 'job': unfused}))['step_time_s'] - pred['step_time_s']:+8.3f}")
        print()


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
