"""What would close the held-out GPT-OSS 120B gap on Blackwell: candidate mechanisms as what-ifs.

The held-out Megatron-Bridge GPT-OSS rows (bench/heldout_bridge.py) are predicted 13-26 % fast on
B200, B300, GB200 and GB300 but 5 % on H100. Each line below predicts every GPT-OSS row with one
candidate switched on, everything else equal, and prints the mean signed error by GPU (the same
rows as heldout_bridge's summary; then without the two 26.06.01 rows, which ran the grouped dGeGLU
kernel that the table's footnote says regressed 10x, NVIDIA/cudnn-frontend issue #256). None of
these is in the model: each either lacks a source that says the runs behaved so, or moves H100 or
the other held-out models away from their measurements (docs/history.md, 2026-11-29 audit).

  DP collectives exposed     the distributed optimizer's gradient reduce-scatter and parameter
                             all-gather with no overlap (the recipes set --overlap-grad-reduce and
                             --overlap-param-gather; Megatron-Core overlaps them bucket by bucket)
  no a2a-overlap credit      the combined-1F1B expert all-to-all overlap hiding nothing (the
                             README's "recipes that ran the overlap measured no faster")
  outer NIC at 50 GB/s       DGX B300's ConnectX-8 at B200's 400 Gb/s (the datasheet gives 800)
  eager streams at 0.35      Megatron's op-by-op GPT-OSS kernels (YaRN RoPE, clamp, FC2 bias) at
                             half kernels.STREAMING_HBM_EFFICIENCY
  d=64 attention at 0.766    cuDNN's 64-wide heads at the H100 measurement's ratio
                             (planner/data/h100_attention_head_dims.csv) instead of the power law's 0.58
  a2a at 0.74 of the link    every expert all-to-all at DeepEP's Hybrid-EP measurement on 8 B200
                             (docs/README_Hybrid-EP.md: BF16 dispatch 536, combine 531 GB/s through the
                             torch API with 16 SMs, against the 720 GB/s the NVLink tier gives)

The audit's eighth candidate, the experts' wgrad accumulating into 16-bit main gradients (the
recipes' grad_reduce_in_fp32=False), is in the model since 2cdfd50: the baseline has it.

    PYTHONPATH=.:bench python bench/gptoss_whatif.py
"""
from __future__ import annotations

import contextlib
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import heldout_bridge  # noqa: E402

from planner.analytical import kernels  # noqa: E402
from planner.analytical import time as tm  # noqa: E402
from planner.calibration import predict  # noqa: E402


@contextlib.contextmanager
def patched(obj, name, value):
    old = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, old)


def with_plan(case, **update):
    return type(case)(**{**case.__dict__, "plan": case.plan.model_copy(update=update)})


def with_outer_bandwidth(case, gb_per_s: float, accelerator: str):
    if not case.system.accelerator.name.startswith(accelerator):
        return case
    network = list(case.system.network)
    network[-1] = network[-1].model_copy(update={"bandwidth_gb_per_s": gb_per_s})
    return type(case)(**{**case.__dict__, "system": case.system.model_copy(update={"network": network})})


def _head_dim_measured(original):
    return lambda model, backend: 0.766 if model.head_dim == 64 and not model.mla else original(model, backend)


WHAT_IFS = {
    "baseline": (lambda c: c, contextlib.nullcontext),
    "DP collectives exposed": (lambda c: with_plan(c, dp_comm_overlap=False), contextlib.nullcontext),
    "no a2a-overlap credit": (lambda c: with_plan(c, moe_a2a_overlap=False) if c.plan.moe_a2a_overlap else c,
                              contextlib.nullcontext),
    "outer NIC at 50 GB/s on B300": (lambda c: with_outer_bandwidth(c, 50.0, "B300"), contextlib.nullcontext),
    "eager streams at 0.35 of HBM": (lambda c: c, lambda: patched(kernels, "STREAMING_HBM_EFFICIENCY", 0.35)),
    "d=64 attention at 0.766 (H100 measured)": (
        lambda c: c, lambda: patched(kernels, "attention_head_dim_factor",
                                     _head_dim_measured(kernels.attention_head_dim_factor))),
    "a2a at 0.74 of the link (Hybrid-EP, B200)": (lambda c: c, lambda: patched(tm, "A2A_BW_EFFICIENCY", 0.74)),
}


def summary(cases, transform, context) -> dict[str, float]:
    errors: dict[str, list[float]] = {}
    with context():
        for case in cases:
            err = predict(transform(case))["step_time_s"] / case.measured_step_s - 1
            errors.setdefault(case.system.accelerator.name.split("-")[0], []).append(err)
    return {gpu: statistics.mean(v) for gpu, v in sorted(errors.items())}


def main() -> None:
    cases = [c for c in heldout_bridge.read_back(heldout_bridge.records()[0])[0] if "GPT_OSS" in c.id]
    for title, rows in (("all GPT-OSS rows", cases),
                        ("without the 26.06.01 rows", [c for c in cases if "26.06.01" not in c.id])):
        print(f"mean signed error by GPU, {title} ({len(rows)})")
        for name, (transform, context) in WHAT_IFS.items():
            means = summary(rows, transform, context)
            print(f"  {name:42s} " + "  ".join(f"{gpu} {e:+6.1%}" for gpu, e in means.items()))


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
