"""What each compute dtype means for time: which peak its GEMMs use, which GEMMs run in it, and
what its scaling (quantisation) passes cost.

Which GEMMs: Transformer Engine's autocast covers the linear layers of the transformer block
(QKV, attention projection, MLP/expert FC1 and FC2); the attention core (softmax(QK^T)V) and the
LM head (Megatron's output layer is not a TE module) stay in bf16 (fp16 with fp16 training).

Scaling overhead: before a GEMM can run in 8 or 4 bits, each input is read in 16 bits and written
in the low-precision format, once row-wise (forward / dgrad operand) and once column-wise (wgrad
operand), plus its scales. Memory-bound, so it costs bytes / (HBM bandwidth · hbm_efficiency).
Bytes per quantised element, from the recipes' definitions:
- fp8 (delayed scaling): read 2 + write 1 + 1; the amax is recorded in the same cast kernel and
  used next step (TE docs, "Using FP8 with Transformer Engine": DelayedScaling, amax history).
- fp8-cs (per-tensor current scaling): the tensor's own amax is needed before the cast, one more
  2-byte read (TE Float8CurrentScaling).
- fp8-block (DeepSeek-V3 §3.3.2 fine-grained quantisation, TE Float8BlockScaling): each 1x128 tile
  of an activation (128x128 of a weight) gets its own fp32 scale from its own amax, computed in
  the cast kernel that reads the tile: read 2 + write 1 + 1 (row- and column-wise copies) and one
  4-byte scale per 128 elements each way.
- mxfp8: one E8M0 scale per 32 elements computed inside the cast, row- and column-wise blocks
  (OCP Microscaling Formats (MX) Specification v1.0, §5: block size 32, 8-bit shared scale).
- nvfp4: FP4 E2M1 values (0.5 B) with one E4M3 scale per 16 elements, and a second-level fp32
  per-tensor scale that needs a global amax pass (NVIDIA, "Pretraining LLMs with NVFP4",
  arXiv:2509.25149 §2; TE NVFP4BlockScaling). The column-wise (wgrad) copy is Random-Hadamard
  transformed before it is quantised (same paper, §4: RHT on the Wgrad inputs; TE's NVFP4 recipe),
  so its per-tensor amax is of the transformed tensor: one more 2-byte read of the input.
Weight casts happen once per step (TE caches them across microbatches) and are not charged.

The column-wise copy of a per-tensor-scaled tensor (fp8, fp8-cs) is its transpose, which only a
GPU whose FP8 GEMMs are TN-only (Hopper) needs. On Blackwell the GEMM reads the row-wise data in
either layout, and TE's Float8Quantizer / Float8CurrentScalingQuantizer write no transpose
(transformer_engine/pytorch/csrc/quantizer.cpp @ d0067d0: `with_transpose = columnwise_usage &&
!is_non_tn_fp8_gemm_supported`; hardware.arch.non_tn_fp8_gemm): one 1-byte write fewer. Block
scales are along one direction, so MXFP8, NVFP4 and fp8-block keep both copies everywhere.
"""
from __future__ import annotations

# Accelerator peak used by the block's GEMMs (hardware.spec.Dtype keys).
GEMM_PEAK_KEY = {"bf16": "bf16", "fp16": "fp16", "fp8": "fp8", "fp8-cs": "fp8", "fp8-block": "fp8", "mxfp8": "mxfp8",
                 "nvfp4": "nvfp4"}

QUANTISE_BYTES_PER_ELEMENT = {
    "bf16": 0.0,
    "fp16": 0.0,
    "fp8": 2.0 + 1.0 + 1.0,
    "fp8-cs": 2.0 + 2.0 + 1.0 + 1.0,
    "fp8-block": 2.0 + 1.0 + 1.0 + 2 * 4.0 / 128,
    "mxfp8": 2.0 + 1.0 + 1.0 + 2 * 1.0 / 32,
    "nvfp4": 2.0 + 2.0 + 2.0 + 0.5 + 0.5 + 2 * 1.0 / 16,  # amax, RHT'd amax, cast reads; two 4-bit copies
}

# The transposed copy that TN-only FP8 GEMMs need of a per-tensor-scaled tensor (in
# QUANTISE_BYTES_PER_ELEMENT above, which is Hopper's), left out where any layout is taken.
PER_TENSOR_TRANSPOSE_BYTES = {"fp8": 1.0, "fp8-cs": 1.0}


def quantise_bytes(dtype: str, non_tn_fp8_gemm: bool) -> float:
    """Bytes moved per quantised element by Transformer Engine's casts of `dtype`, on a GPU whose
    FP8 GEMMs take any layout (`non_tn_fp8_gemm`) or only TN."""
    transpose = PER_TENSOR_TRANSPOSE_BYTES.get(dtype, 0.0) if non_tn_fp8_gemm else 0.0
    return QUANTISE_BYTES_PER_ELEMENT[dtype] - transpose


# Bytes per GEMM operand element as the kernel reads it (the quantised copy; block scales
# included: MX one E8M0 per 32, NVFP4 one E4M3 per 16, as above).
GEMM_OPERAND_BYTES = {"bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "fp8-cs": 1.0, "fp8-block": 1.0 + 4.0 / 128,
                      "mxfp8": 1.0 + 1.0 / 32,
                      "nvfp4": 0.5 + 1.0 / 16}


def gemm_peak_key(dtype: str) -> str:
    return GEMM_PEAK_KEY[dtype]


def attention_peak_key(dtype: str, fp8_attention: bool) -> str:
    """Peak the attention core (softmax(QK^T)V) runs at: FP8 with --fp8-dot-product-attention
    (TE/cuDNN FP8 attention, per-tensor scaled whatever the GEMM recipe), else 16-bit."""
    return "fp8" if fp8_attention else high_precision_dtype(dtype)


def high_precision_dtype(dtype: str) -> str:
    """Dtype of the GEMMs left out of low-precision autocast (attention core, LM head)."""
    return "fp16" if dtype == "fp16" else "bf16"


def module_dtype(job, group: str) -> str:
    """The dtype the module group's GEMMs run in (JobSpec.module_dtypes, else the job's)."""
    return job.module_dtypes.get(group, job.dtype)


def attention_quantised_elements(hidden: int, qkv_width: float) -> float:
    """The attention's share of `quantised_elements_per_token`: the inputs of QKV and the
    projection, the output gradients of QKV and the projection."""
    return (hidden + hidden) + (qkv_width + hidden)


def latent_quantised_elements(hidden: int, row_width: float | None) -> float:
    """LatentMoE's two projections' share of `quantised_elements_per_token` (h -> latent and
    latent -> h, quantised like a dense MLP's GEMMs)."""
    return (hidden + row_width) + (row_width + hidden) if row_width else 0.0


def quantised_elements_per_token(hidden: int, qkv_width: float, mlp_width: float, ffn: float,
                                 rows_per_token: float, fused_mlp: bool = False, shared_mlp_width: float = 0.0,
                                 shared_ffn: float = 0.0, row_width: float | None = None) -> float:
    """Elements quantised per token and layer, forward + backward (whole layer, before TP split):
    forward the inputs of QKV, projection, FC1 (h each) and FC2 (ffn); backward the output
    gradients of QKV (qkv_width), projection (h), FC1 (mlp_width) and FC2 (h). MLP terms count
    once per routed copy of the token (`rows_per_token` = top-k for MoE). `fused_mlp`: the MLP's
    FC1 epilogue applies the activation and writes FC2's quantised input, and the backward's
    dactivation writes FC1's quantised output gradient (Transformer Engine's op fuser,
    Megatron-Core use_transformer_engine_op_fuser), so those two casts are not separate passes.
    A MoE layer's shared experts (`shared_mlp_width`, `shared_ffn`: all shared experts together)
    are linear layers in the same autocast (Megatron-Core moe/shared_experts.py; torchtitan's
    FeedForward under its float8/MX converters) and see every token once: their FC1/FC2 inputs
    and output gradients are quantised like a dense MLP's (never op-fused: the fuser is the
    routed experts' grouped MLP)."""
    return (attention_quantised_elements(hidden, qkv_width)
            + mlp_quantised_elements(hidden, mlp_width, ffn, rows_per_token, fused_mlp, shared_mlp_width, shared_ffn,
                                     row_width)
            + latent_quantised_elements(hidden, row_width))


def mlp_quantised_elements(hidden: int, mlp_width: float, ffn: float, rows_per_token: float, fused_mlp: bool = False,
                           shared_mlp_width: float = 0.0, shared_ffn: float = 0.0,
                           row_width: float | None = None) -> float:
    """The MLP's share of `quantised_elements_per_token`: its routed (or dense) GEMMs and the
    shared experts, LatentMoE's projections apart (`latent_quantised_elements`)."""
    # the MLP's rows: `row_width` wide for LatentMoE's routed experts, else hidden
    w = row_width or hidden
    mlp = w + w if fused_mlp else (w + ffn) + (mlp_width + w)
    shared = (hidden + shared_ffn) + (shared_mlp_width + hidden) if shared_ffn else 0.0
    return rows_per_token * mlp + shared


def training_dtypes(system=None) -> list[str]:
    """The precisions a job may name (JobSpec.dtype); with `system`, those its GPU has the peaks
    for: the GEMMs' (fp8-cs and fp8-block run at the fp8 peak) and the 16-bit one the attention core
    and LM head keep."""
    if system is None:
        return list(GEMM_PEAK_KEY)
    peaks = system.accelerator.peak_flops
    return [d for d, key in GEMM_PEAK_KEY.items() if key in peaks and high_precision_dtype(d) in peaks]
