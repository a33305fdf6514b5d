"""An accelerator's CUDA compute capability, and what the kernels do differently by it."""
from __future__ import annotations

import re

from hardware.spec import Accelerator

# NVIDIA data-center product names and their compute-capability major (CUDA programming guide,
# "Compute Capabilities"): Volta 7, Ampere 8, Hopper 9, Blackwell 10. Matched as a word in the
# accelerator's name ("GB200-186GB", "H100-SXM5-80GB"), never by a first letter alone.
NVIDIA_ARCH_BY_NAME = (
    (re.compile(r"(?<![A-Z0-9])V100"), 7),
    (re.compile(r"(?<![A-Z0-9])A(100|800|40|30|10)(?![0-9])"), 8),
    (re.compile(r"(?<![A-Z0-9])G?H(100|200|800|20)(?![0-9])"), 9),
    (re.compile(r"(?<![A-Z0-9])G?B(100|200|300)(?![0-9])"), 10),
)
ASSUMED_ARCH = 9


def arch_from_name(name: str) -> int | None:
    """The compute-capability major of an NVIDIA product name in `name`, or None."""
    return next((arch for pattern, arch in NVIDIA_ARCH_BY_NAME if pattern.search(name.upper())), None)


def compute_capability(acc: Accelerator) -> float:
    """The accelerator's compute capability: its `compute_capability`, else read from an NVIDIA
    product name (V100 7.0, A100 8.0, H100/H200/GH200 9.0, B200/GB200/B300 10.0), else
    ASSUMED_ARCH."""
    if acc.compute_capability is not None:
        return float(acc.compute_capability)
    return float(arch_from_name(acc.name) or ASSUMED_ARCH)


def non_tn_fp8_gemm(acc: Accelerator) -> bool:
    """Whether FP8 GEMMs take any operand layout, so that a per-tensor-scaled FP8 tensor needs no
    transposed copy for the backward: Transformer Engine's is_non_tn_fp8_gemm_supported
    (transformer_engine/pytorch/utils.py @ d0067d0: compute capability 10.x-11.x or 13.0 and up;
    Hopper's FP8 GEMMs are TN-only)."""
    cc = compute_capability(acc)
    return 10.0 <= cc < 12.0 or cc >= 13.0
