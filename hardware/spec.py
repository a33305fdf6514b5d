"""Pydantic specs of a training system. Units are in the field names.

Conventions: GB and GB/s are SI (1e9 bytes), GiB is binary (2**30 bytes); bandwidths are per GPU
and per direction; FLOP/s are dense (no structured sparsity).
"""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveInt, field_validator, model_validator
from pydantic_core import PydanticCustomError

from hardware.errors import INCONSISTENT, VISIBLE_LINE_PATTERN, SpecError, in_range

GIB = 2**30
GB = 1e9

# Peak-FLOP keys of an accelerator. "fp8" is the per-tensor-scaled FP8 MMA (Hopper and later);
# "mxfp8" the block-scaled FP8 MMA (OCP MX, 32-element blocks; Blackwell only); "nvfp4" FP4 E2M1
# with 16-element E4M3 block scales (Blackwell only).
Dtype = Literal["fp32", "tf32", "fp16", "bf16", "fp8", "mxfp8", "nvfp4"]
# Compute dtypes whose GEMMs run in 8 bits or fewer: they take the low-precision GEMM curve.
LOW_PRECISION = ("fp8", "fp8-cs", "fp8-block", "mxfp8", "nvfp4")


# ---- physical bounds of a spec's numbers -----------------------------------------------------
# Finite is not enough: 1e308 or 1e-300 are finite, yet a step time built from them overflows
# (numpy RuntimeWarnings, exit 1, "cannot convert float NaN to integer"). Each number has a
# generous range, far beyond any real machine on both sides, that keeps every product and quotient
# of the cost model finite. What-if values must pass too: `planner sweep` varies hbm_gib (up to
# 1e6 GiB), offload_gib (up to 1e9 GiB) and offload_gb_per_s (up to its "infinite" 1e6 GB/s,
# planner/sweep.py MAX_VALUE, INFINITE_GB_PER_S); the infeasibility diagnosis adds a 4096 GiB tier.
# For scale, the presets span: peaks 1.57e13 (V100 fp32) to 1.5e16 (GB300 NVFP4) FLOP/s; HBM 32 to
# 277.5 GiB at 900 to 8000 GB/s; network tiers 6.25 to 900 GB/s at 3 to 8 us; offload 223.5 to 1024
# GiB at 100 to 450 GB/s; GEMM half-dims 140 to 170, attention half-seq 0 to 1110, layer overhead
# 4 to 194 us.

# Dense peak FLOP/s per GPU and dtype: 1 GFLOP/s is below any accelerator (V100 fp32, the slowest
# preset peak, is 1.57e13); 1e18 is ~67x the largest today (GB300 NVFP4 dense, 1.5e16).
PeakFlops = Annotated[float, in_range(1e9, 1e18)]
# HBM per GPU: 1e-3 GiB (~1 MiB) is below any GPU's memory; 1e6 GiB (~1 PiB, 3,600x GB300's 277.5 GiB) is the
# largest hbm_gib `planner sweep` accepts (sweep.MAX_VALUE), so a what-if HBM stays a valid spec.
HbmGib = Annotated[float, in_range(1e-3, 1e6)]
# HBM bandwidth per GPU: 1 GB/s is below one DDR channel (V100's 900 GB/s is the slowest preset);
# 1e6 GB/s (1 PB/s) is 125x B200/B300's 8 TB/s.
HbmGbPerS = Annotated[float, in_range(1.0, 1e6)]
# Network tier bandwidth per GPU and direction: 0.01 GB/s (10 MB/s) is below a per-GPU share of
# 1 GbE among 8 GPUs (15.6 MB/s), the slowest link anyone trains over; 1e6 GB/s is 1,100x NVLink 5
# (900 GB/s per direction).
LinkGbPerS = Annotated[float, in_range(0.01, 1e6)]
# Network latency: 0 (ideal) to 1e6 us (1 s; a NIC hop is 1-10 us, even a WAN round trip ~1e5 us).
LatencyUs = Annotated[float, in_range(0.0, 1e6)]
# Offload capacity per GPU: 1e-3 GiB (~1 MiB) up to 1e9 GiB, the largest offload_gib `planner sweep` accepts
# (a 1 TiB Grace/host DRAM share is the largest preset).
OffloadGib = Annotated[float, in_range(1e-3, 1e9)]
# Offload bandwidth per GPU: 0.01 GB/s (a slow disk's per-GPU share) up to exactly the "infinite"
# bandwidth of `planner sweep offload_gb_per_s=inf` (sweep.INFINITE_GB_PER_S = 1e6 GB/s).
OffloadGbPerS = Annotated[float, in_range(0.01, 1e6)]
# GPUs of a system as loaded: a million, also the cap of the CLI's --gpus (README "Limits").
# Checked by hardware.load, not by SystemSpec: the infeasibility diagnosis grows num_gpus past it
# on purpose (search.py, "fits on 64x GPUs").
MAX_GPUS = 1 << 20
# A name the output shows ("on 16× H100 (name)"): one line of visible text
Name = Annotated[str, Field(min_length=1, pattern=VISIBLE_LINE_PATTERN)]
# GEMM min-dimension at which efficiency halves: 0 up to 1e6 rows (presets 140-170; the fit's
# search bound is 1024; 1e6 is about the widest hidden a model may have, 2**20).
HalfDim = Annotated[float, in_range(0.0, 1e6)]
# Sequence length at which attention efficiency halves: 0 up to 1e6 tokens (presets 0-1110).
HalfSeq = Annotated[float, in_range(0.0, 1e6)]
# Fixed time per layer and microbatch: 0 up to 1e6 us (1 s; presets 4-194 us, the fit's bound 2000).
OverheadUs = Annotated[float, in_range(0.0, 1e6)]


class _Strict(BaseModel):
    # allow_inf_nan=False: every number of a spec must be finite. An infinite peak, capacity,
    # bandwidth or efficiency parameter is no machine: it turns step times into 0 or nan (numpy
    # RuntimeWarnings, "MFU 0.0%", "94.00 of inf usable"). A what-if "unlimited" tier is a large
    # finite number (planner/sweep.py INFINITE_GB_PER_S).
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


def _inconsistent(message: str) -> PydanticCustomError:
    """A cross-field error whose message names its fields itself (errors.one_line prints it as is)."""
    return PydanticCustomError(INCONSISTENT, message)


class ComputeEfficiency(_Strict):
    """Achieved fraction of peak for the pieces of a transformer layer.

    A few physical parameters per accelerator, calibrated against published runs (see
    planner/calibration.py), not one constant: large GEMMs approach `matmul_max`; a GEMM whose
    smallest dimension is `matmul_half_dim` runs at half of that (tile/wave quantisation and
    launch overhead dominate small GEMMs). Fused attention kernels have their own ceiling and
    reach half of it at `attention_half_seq` tokens.
    """

    matmul_max: float = Field(gt=0, le=1)
    matmul_max_fp8: float | None = Field(
        default=None, gt=0, le=1, description="fp8 GEMM ceiling (TE scaling/casts); default matmul_max")
    matmul_half_dim: HalfDim = Field(description="GEMM min-dimension at which efficiency halves")
    matmul_half_dim_fp8: HalfDim | None = Field(default=None, description="fp8 GEMMs; default matmul_half_dim")
    attention_max: float = Field(gt=0, le=1)
    attention_half_seq: HalfSeq = Field(default=0.0, description="sequence length at which attention efficiency halves")
    # FlashAttention-2 (flash-attn 2, PyTorch SDPA's flash backend), what the PyTorch-native stacks
    # (torchtitan, llm-foundry) run; written for Ampere, it does not use Hopper's TMA/wgmma, so on
    # H100 it reaches 0.59x of cuDNN's fused attention (planner/data/h100_attention.csv). None = the
    # fused curve above (no separate measurement for this accelerator).
    attention_max_fa2: float | None = Field(default=None, gt=0, le=1)
    attention_half_seq_fa2: HalfSeq | None = None
    # MPT's Triton FlashAttention (llm-foundry attn_impl "triton", llmfoundry/models/layers/
    # flash_attn_triton.py, a port of the 2022 Triton tutorial kernel), what llm-foundry's
    # benchmark tables ran by default before 2024: its own in-training ceiling, with FA2's
    # half-efficiency sequence. None = FlashAttention-2's curve (no rows of it measured).
    attention_max_triton: float | None = Field(default=None, gt=0, le=1)
    # In-training GEMM ceiling of the PyTorch-native stacks where it differs from `matmul_max`,
    # which the Megatron rows fit: on the A100 those are 2020-21 fp16 runs (Narayanan et al. SC'21,
    # the Megatron-LM README), its torch rows 2023-24 bf16 ones (llm-foundry, torchtitan) on newer
    # cuBLAS. None = `matmul_max`.
    matmul_max_torch: float | None = Field(default=None, gt=0, le=1)
    # Sustained SM clock under the system's power limit, as a fraction of the clock the peaks
    # assume: a GPU capped below its rated board power (Meta's Grand Teton H100 at 500 W instead
    # of 700 W) lowers its clock under dense GEMM load. Scales GEMM and attention time, not
    # HBM-bound work. 1 = runs at the rated clock.
    sustained_clock_fraction: float = Field(default=1.0, gt=0, le=1)
    # Tensor-core and attention rate relative to the accelerator whose fit this preset takes
    # (planner.fit.FIT_GROUPS), for a part that runs the same kernels faster than its fit group at
    # equal datasheet peaks: GB300 against GB200 (160 SMs instead of 148, 1,400 W instead of
    # 1,200 W, twice the softmax-exponent rate). Scales GEMM and attention time like the clock above.
    compute_rate_vs_fit_group: float = Field(default=1.0, gt=0, le=2)
    # Memory-bound element-wise work (norms, activations, dropout, residuals, optimizer) as
    # bytes moved per activation element, run at `hbm_efficiency` of HBM bandwidth.
    hbm_efficiency: float = Field(default=0.8, gt=0, le=1)
    # Fixed time per layer and microbatch in forward (backward twice that): kernel launches and
    # host synchronisation that do not shrink with the layer's size.
    layer_overhead_us: OverheadUs = 0.0

    @property
    def compute_rate(self) -> float:
        """Factor on the GEMM and attention rates (power-capped clock, rate against the fit group)."""
        return self.sustained_clock_fraction * self.compute_rate_vs_fit_group

    def matmul_ceiling(self, dtype: str) -> float:
        """GEMM ceiling for a compute dtype; every 8-bit-or-less recipe shares the fp8 one (the
        same fraction of its own, higher, peak): one fitted parameter, not one per recipe."""
        return self.matmul_max_fp8 if dtype in LOW_PRECISION and self.matmul_max_fp8 else self.matmul_max

    def attention_curve(self, kernels: str) -> tuple[float, float]:
        """(ceiling, half-efficiency sequence) of the attention kernel a kernel stack runs:
        Transformer Engine's fused (cuDNN) attention ("te"), or FlashAttention-2 for the torch
        stacks and for "flash-attn" (TE's flash-attn backend), MPT's Triton kernel for
        "triton-flash" where this accelerator has its ceiling (else FlashAttention-2's)."""
        if kernels == "triton-flash" and self.attention_max_triton is not None:
            return self.attention_max_triton, self.attention_curve("flash-attn")[1]
        if kernels != "te" and self.attention_max_fa2 is not None:
            half = self.attention_half_seq if self.attention_half_seq_fa2 is None else self.attention_half_seq_fa2
            return self.attention_max_fa2, half
        return self.attention_max, self.attention_half_seq

    def matmul_half(self, dtype: str) -> float:
        fp8 = dtype in LOW_PRECISION and self.matmul_half_dim_fp8 is not None
        return self.matmul_half_dim_fp8 if fp8 else self.matmul_half_dim


ComputeCapability = Annotated[float, in_range(1.0, 99.0)]


class Accelerator(_Strict):
    name: Name
    peak_flops: dict[Dtype, PeakFlops] = Field(description="dense peak FLOP/s per dtype")
    hbm_capacity_gib: HbmGib
    hbm_bandwidth_gb_per_s: HbmGbPerS
    efficiency: ComputeEfficiency
    # What the kernels and Megatron's recipes may use: fused attention from 8.0, FP8 from 9.0,
    # MXFP8/NVFP4 from 10.0 (planner.megatron.launch.gpu_arch_major). Unset: read from an NVIDIA
    # product name (V100, A100, H100, B200, ...), else assumed 9.0 and said so.
    compute_capability: ComputeCapability | None = Field(
        default=None, description="CUDA compute capability (H100: 9.0); default: from an NVIDIA product name")

    @property
    def hbm_capacity_bytes(self) -> float:
        return self.hbm_capacity_gib * GIB

    @property
    def hbm_bandwidth_bytes_per_s(self) -> float:
        return self.hbm_bandwidth_gb_per_s * GB

    @field_validator("compute_capability")
    @classmethod
    def _major_minor(cls, cc: float | None) -> float | None:
        # CUDA's compute capabilities are major.minor with one minor digit (8.9, 10.3)
        if cc is not None and abs(cc * 10 - round(cc * 10)) > 1e-9:
            raise _inconsistent(f"must be major.minor with one minor digit (e.g. 9.0, 8.9, "
                                f"10.3), got {cc:g}")
        # nvcc's sm_90 / compute_90 written as 90: no CUDA GPU has a major version near 20 (12.x on
        # 2026-11-29), and 90 read as 90.0 passed every architecture check (MXFP8 launched on an H100)
        if cc is not None and cc >= 20 and float(cc).is_integer():
            raise _inconsistent(f"must be major.minor (e.g. 9.0, 8.9, 10.3), got {cc:g}; "
                                f"sm_{int(cc)} is written {int(cc) // 10}.{int(cc) % 10}")
        return cc

    @field_validator("peak_flops")
    @classmethod
    def _has_16_bit_peak(cls, peaks: dict) -> dict:
        # Every training dtype needs a 16-bit peak: bf16/fp16 jobs run their GEMMs at it, and the
        # fp8/fp4 recipes keep the attention core and LM head there (precision.high_precision_dtype,
        # cli.common.training_dtypes); without one no job can be priced, which would surface later
        # as a confusing "dtype: ... has no fp16 peak; allowed:" with an empty list.
        if "bf16" not in peaks and "fp16" not in peaks:
            raise _inconsistent(f"needs a bf16 or fp16 peak (FLOP/s) for training; got: "
                                f"{', '.join(sorted(peaks)) or 'none'}")
        return peaks

    def peak(self, dtype: str) -> float:
        if dtype not in self.peak_flops:
            raise SpecError(
                f"dtype: {self.name} has no {dtype} peak; allowed: {', '.join(sorted(self.peak_flops))}")
        return self.peak_flops[dtype]


class NetworkTier(_Strict):
    """GPUs within `domain_gpus` of each other talk at this tier's bandwidth (per GPU, per direction)."""

    name: Name
    domain_gpus: PositiveInt
    bandwidth_gb_per_s: LinkGbPerS
    latency_us: LatencyUs
    efficiency: float = Field(default=0.8, gt=0, le=1, description="achieved / nominal bus bandwidth")

    @property
    def bandwidth_bytes_per_s(self) -> float:
        return self.bandwidth_gb_per_s * GB * self.efficiency

    @property
    def latency_s(self) -> float:
        return self.latency_us * 1e-6


class MemoryTier(_Strict):
    """Secondary memory a GPU can offload to (host DRAM, LPDDR, CXL pool); per GPU."""

    name: Name
    capacity_gib: OffloadGib
    bandwidth_gb_per_s: OffloadGbPerS

    @property
    def capacity_bytes(self) -> float:
        return self.capacity_gib * GIB

    @property
    def bandwidth_bytes_per_s(self) -> float:
        return self.bandwidth_gb_per_s * GB


class SystemSpec(_Strict):
    name: Name
    description: str = ""
    source: str = Field(default="", description="datasheet / product page the figures come from")
    accelerator: Accelerator
    num_gpus: PositiveInt
    gpus_per_node: Annotated[int, in_range(1, MAX_GPUS, integer=True)]  # (as many as --gpus allows at most)
    network: list[NetworkTier] = Field(min_length=1, description="innermost (NVLink) tier first")
    offload: MemoryTier | None = None

    # Not checked here, on purpose: num_gpus is the GPUs the job gets, not the machine's size, so
    # it may be smaller than a node (the published runs include 1-4 GPUs of an 8-GPU node; the
    # Megatron launch then runs one node with that many processes) or end in a partial node (12
    # GPUs of 8-GPU nodes: the rank-order network model fills domains consecutively, so the last
    # node is simply half used; torchrun cannot launch that, and `planner megatron` refuses it
    # in megatron.expressible.launch_problems). gpus_per_node > num_gpus is the first case.
    # That the outermost tier spans every GPU depends on num_gpus, which the infeasibility
    # diagnosis grows on purpose (search.py: "fits on 2x GPUs"): hardware.load checks it on the
    # system as loaded (check_spans_system).

    @model_validator(mode="after")
    def _tiers_nested(self) -> "SystemSpec":
        domains = [t.domain_gpus for t in self.network]
        if domains != sorted(set(domains)):
            # two tiers of one domain size: only one could carry a transfer of that span
            raise _inconsistent("network: tiers must be listed innermost first, each domain_gpus larger than "
                                "the one before (no two tiers of one size), got "
                                + ", ".join(str(d) for d in domains))
        # A tier's domain is a block of domain_gpus consecutive ranks (analytical/comm.py
        # group_link), and a node is a block of gpus_per_node consecutive ranks (the torchrun
        # launch): a domain must be whole nodes (NVL72: 72 GPUs = 18 trays of 4, NVL32: 8 of 4;
        # a leaf switch: N nodes) or split a node evenly (NVLink-bridged pairs in a PCIe box).
        # Otherwise a domain would hold part of a node plus part of another, which no fabric
        # wires. Not for the outermost tier: the model treats it as spanning everything, so its
        # domain_gpus is only an upper bound (the presets write 1048576).
        node = self.gpus_per_node
        for i, tier in enumerate(self.network[:-1]):
            d = tier.domain_gpus
            if d % node and node % d:
                raise _inconsistent(
                    f"network.{i}.domain_gpus {d} (tier {tier.name!r}) and gpus_per_node {node} disagree: a "
                    f"domain is whole nodes or splits one evenly; allowed domain_gpus: a multiple of {node} "
                    f"or a divisor of {node}")
        return self

    def check_spans_system(self) -> None:
        """The outermost tier must connect every GPU: the model runs any group that leaves the inner
        domains over it (tier_for_span, comm.group_link), so a smaller domain_gpus there (16 on a
        256-GPU system) describes a machine whose other GPUs have no link, not the one costed."""
        outer = self.network[-1]
        if outer.domain_gpus < self.num_gpus:
            raise SpecError(
                f"network.{len(self.network) - 1}.domain_gpus: the outermost tier {outer.name!r} spans "
                f"{outer.domain_gpus} GPUs but the system has {self.num_gpus} (num_gpus or --gpus); "
                f"it must connect all of them: allowed >= {self.num_gpus}")

    @property
    def nvlink_domain_gpus(self) -> int:
        return self.network[0].domain_gpus

    def inside_nvlink(self, span: int) -> bool:
        """Whether every group of `span` consecutive ranks stays inside one NVLink domain: at most
        the domain's size and, where the domain is one node's own fabric (a DGX's 8 GPUs), a
        divisor of it: ranks fill nodes in order, so tp 6 groups the ranks 6-11 across two nodes.
        A domain of several nodes (NVL72's 18 trays of 4) is allocated in node segments that a
        group can align with (SLURM --segment, as NVIDIA's NVL72 benchmark launches set it)."""
        d = self.nvlink_domain_gpus
        return span <= d and (d > self.gpus_per_node or d % span == 0)

    def tier_for_span(self, span_gpus: int) -> NetworkTier:
        """Slowest tier a group spanning `span_gpus` consecutive ranks must cross."""
        for tier in self.network:
            if span_gpus <= tier.domain_gpus:
                return tier
        return self.network[-1]

    def with_changes(self, **changes) -> "SystemSpec":
        """Copy with top-level fields replaced, re-validated (used by sweeps and CLI overrides)."""
        return SystemSpec.model_validate({**self.model_dump(), **changes})
