"""Hybrid stacks (Nemotron-H, Nemotron-3; Megatron-Core MambaModel with --hybrid-layer-pattern,
formerly --hybrid-override-pattern): each layer is ONE block, a Mamba-2 mixer (M), attention (*), a dense MLP (-) or a MoE MLP (E),
with its own pre-norm and residual add, instead of attention followed by an MLP.

A layer is costed as the pattern's mean block: exact for a rank that holds the whole stack
(pp = 1, every Nemotron-3 Nano recipe) and for stages whose blocks mix as the whole pattern does.
With pipelining, each rank's time adds what its own blocks cost beyond that (`rank_excess_s`),
the blocks it recomputes in full included, and its memory is its own blocks' (memory.rank_memory
with by_block); the stage search prices each block at its kind too (constraints/stages.py).

The attention, dense-MLP and MoE blocks are the halves of a transformer layer (time.py) with half
of its element-wise lump and launch overhead each. The Mamba-2 block (Megatron-Core
ssm/mamba_mixer.py, mamba_ssm's chunked SSD kernels; Dao & Gu 2024, "Transformers are SSMs", §6-7):
in_proj and out_proj GEMMs; the causal depthwise conv1d over x, B, C (rerun in the backward), the
gated RMSNorm and the mixer's two layout copies as streaming passes
(kernels.STREAMING_HBM_EFFICIENCY); the SSD scan as its small matmuls (smallest
dimension min(chunk, head_dim, state)) at the 16-bit GEMM curve plus its memory traffic (x, B, C,
dt in, y out, and each chunk's fp32 state written and read back), the two not overlapped, as
mamba_ssm runs them as separate kernels, scaled to the scan's time measured on an H100
(SSD_FWD_VS_MODEL, SSD_BACKWARD_FACTOR). Nothing here is fitted to training runs.
"""
from __future__ import annotations

import numpy as np

from hardware.spec import SystemSpec
from planner.analytical import flops, kernels, precision
from planner.analytical import time as tm
from planner.analytical.layer_kinds import by_block, dense_layer_spec, rank_block_counts, rank_block_sum
from planner.analytical.plans import PlanArrays, sequence_parallel_on
from planner.model import HYBRID_BLOCKS, ModelSpec
from planner.pipeline_layout import plan_layout
from planner.plan import JobSpec

# The pieces layer_compute_fwd_s returns; a block lacking one has 0.
LAYER_KEYS = ("gemm", "attention", "elementwise", "wgrad_extra", "dense_mlp_s", "moe_mlp_s", "moe_act_s",
              "shared_expert_s", "mla_up_proj_s", "norm_s")
# Bytes per token and channel of the Mamba-2 block's streaming passes: the conv1d reads and writes
# x, B, C (2 + 2, SiLU fused).
CONV_BYTES = 4.0
# The gated RMSNorm (mamba_ssm's Triton rmsnorm_fn with the z gate) reads y and z and writes its
# output, 2 + 2 + 2 bytes forward; measured on an H100 (planner/data/h100_mamba_norm.csv,
# bench/gpu/mamba_norm_table.py, kernel device time) its forward runs at 4.9 bytes' worth of the
# streaming bandwidth and its backward 5.8x its forward (it recomputes the norm and reduces the
# weight gradient per group): 33 bytes' worth forward + backward, charged as 11 in the forward
# so that forward + BACKWARD_FACTOR x forward carries the measured total (as the SSD scan is).
GATED_NORM_BYTES = 11.0
SSD_STATE_BYTES = 4.0  # chunk states are fp32 (mamba_ssm chunk_state / state_passing)
# The SSD scan measured on an H100 (planner/data/h100_ssd_scan.csv, bench/gpu/ssd_scan_table.py:
# mamba_ssm's Triton mamba_chunk_scan_combined, what MambaMixer runs, on the Nemotron 3 Nano and
# Super mixers at tp 1/2/4 and 8192-16384 tokens, the kernels' device time): its forward takes
# 1.25x (1.18-1.42) what the small-matmul and memory terms below give, and its backward 3.9x
# (3.6-4.3) its forward, against the layer model's BACKWARD_FACTOR of 2 (the backward recomputes
# the chunk states and runs some fifteen kernels). Charged in the block's forward so that
# forward + BACKWARD_FACTOR x forward carries the measured total, as the conv1d rerun is; a
# recomputed Mamba block is then charged the same excess again (no recipe recomputes one).
SSD_FWD_VS_MODEL = 1.25
SSD_BACKWARD_FACTOR = 3.9
# Megatron-Core MambaMixer._ssm_training turns in_proj's output z, x, B, C, dt from sequence-first
# to batch-first and the scan's output y back, each with .contiguous(): a copy, read 2 + write 2
# per element, forward (and its gradient's copy backward). Measured the same way
# (h100_mamba_norm.csv, layout_copy), a transposing copy forward + backward takes 14.7 bytes' worth
# of the streaming bandwidth (forward 6.2: a transpose reaches ~1.5 TB/s), charged as 4.9.
TRANSPOSE_BYTES = 4.9


def block_fractions(model: ModelSpec) -> dict[str, float]:
    return {k: model.blocks(k) / model.layers for k in HYBRID_BLOCKS}


def ssd_scan_fwd_s(model: ModelSpec, system: SystemSpec, job: JobSpec, P: PlanArrays) -> tuple:
    """(matmul, memory) seconds charged to one Mamba-2 block's forward for its SSD scan, one
    microbatch, one GPU: 16-bit small matmuls at the GEMM curve (the fp8 recipes quantise only the
    projections) and the scan's memory traffic, scaled to the measured scan forward and backward
    (SSD_FWD_VS_MODEL, SSD_BACKWARD_FACTOR)."""
    m, t = model.mamba, P.tp
    acc = system.accelerator
    stream = acc.hbm_bandwidth_bytes_per_s * kernels.STREAMING_HBM_EFFICIENCY
    tokens = P.micro_batch * model.seq_length / P.cp
    dtype = precision.high_precision_dtype(job.dtype)
    matmul = tm._gemm_time(flops.ssd_flops_per_token(model) * tokens / t, float(min(model.ssd_chunk_tokens, m.head_dim, m.state_dim)),
                           acc.peak(dtype), acc.efficiency, dtype)
    ssd_bytes = 2.0 * (m.conv_channels + m.num_heads) + 2.0 * m.d_inner \
        + 2 * SSD_STATE_BYTES * m.num_heads * m.head_dim * m.state_dim / model.ssd_chunk_tokens
    measured = SSD_FWD_VS_MODEL * (1 + SSD_BACKWARD_FACTOR) / (1 + tm.BACKWARD_FACTOR)
    return measured * matmul, measured * tokens * ssd_bytes / t / stream


def mamba_block_fwd_s(model: ModelSpec, system: SystemSpec, job: JobSpec, P: PlanArrays) -> dict:
    """(gemm, elementwise) seconds of one Mamba-2 block's mixer, one microbatch, one GPU, forward."""
    m, h, t = model.mamba, model.hidden, P.tp
    acc = system.accelerator
    eff = acc.efficiency
    peak = acc.peak(precision.gemm_peak_key(job.dtype))
    stream = acc.hbm_bandwidth_bytes_per_s * kernels.STREAMING_HBM_EFFICIENCY
    tokens = P.micro_batch * model.seq_length / P.cp
    width = m.in_proj_width
    out_dtype = precision.module_dtype(job, "mamba_out_proj")  # a per-module recipe may run it apart
    gemm = (tm._gemm_time(2 * tokens * h * width / t, np.minimum(np.minimum(tokens, h), width / t), peak, eff, job.dtype)
            + tm._gemm_time(2 * tokens * m.d_inner * h / t, np.minimum(np.minimum(tokens, m.d_inner / t), h),
                            acc.peak(precision.gemm_peak_key(out_dtype)), eff, out_dtype))
    ssd_matmul, ssd_memory = ssd_scan_fwd_s(model, system, job, P)
    # the memory-efficient path (mamba_split_conv1d_scan_combined) reruns the conv1d in the
    # backward: its bytes once more, charged so that forward + BACKWARD_FACTOR·forward carries them
    conv_bytes = CONV_BYTES * m.conv_channels * (1 + 1 / (1 + tm.BACKWARD_FACTOR))
    stream_bytes = conv_bytes + GATED_NORM_BYTES * m.d_inner + TRANSPOSE_BYTES * (width + m.d_inner)
    return {"gemm": gemm + ssd_matmul, "elementwise": tokens * stream_bytes / t / stream + ssd_memory}


def block_fwd_s(model: ModelSpec, system: SystemSpec, job: JobSpec, P: PlanArrays) -> dict[str, dict]:
    """Per block kind of the pattern: the pieces of layer_compute_fwd_s for one block."""
    acc = system.accelerator
    eff = acc.efficiency
    peak = acc.peak(precision.gemm_peak_key(job.dtype))
    hbm = acc.hbm_bandwidth_bytes_per_s * eff.hbm_efficiency
    stream = acc.hbm_bandwidth_bytes_per_s * kernels.STREAMING_HBM_EFFICIENCY
    h, t = model.hidden, P.tp
    tokens = P.micro_batch * model.seq_length / P.cp
    sp = sequence_parallel_on(P)
    # half a transformer layer's element-wise lump and launch overhead per block (one pre-norm,
    # one residual add each)
    hidden_s = tokens * 2.0 * tm.ELEMENTWISE_PASSES_HIDDEN * h / 2 / np.where(sp, t, 1.0) / hbm

    def common(kind: str):
        # the block's share of the lump, and its launches unless its module's graph captures them
        return hidden_s + (0.0 if kernels.block_launches_captured(kind, job) else eff.layer_overhead_us * 1e-6 / 2)
    norm_s = tokens * tm.LAYERNORM_PASSES * h / np.where(sp, t, 1.0) / hbm
    def quant_s(group=None):  # seconds per quantised element, in the module group's dtype
        return tm.quantise_s_per_element(system, job, group, tokens, t, hbm)
    quant_per_element = quant_s()
    out: dict[str, dict] = {}
    if model.blocks("*"):
        qkv_w = flops.qkv_out_width(model)
        rope_s = tokens * kernels.unfused_rope_extra_bytes_per_token(model, job.kernels) / t / stream
        out["*"] = {"gemm": tm.attention_gemm_fwd_s(model, system, job, P),
                    "attention": tm.attention_core_fwd_s(model, system, job, P),
                    "elementwise": common("*") + rope_s
                    + quant_s("attention") * precision.attention_quantised_elements(h, qkv_w), "norm_s": norm_s}
    if model.blocks("-"):
        ffn = model.ffn_hidden
        up_w = (2 if model.activation == "swiglu" else 1) * ffn
        gemm, elem = tm.dense_mlp_fwd_s(model, ffn, tokens, t, peak, eff, job.dtype, hbm)
        out["-"] = {"gemm": gemm,
                    "elementwise": common("-") + elem + quant_per_element * precision.mlp_quantised_elements(h, up_w, ffn, 1),
                    "dense_mlp_s": gemm + elem, "norm_s": norm_s}
    if model.blocks("E"):
        moe = tm.moe_mlp_fwd_s(model, system, job, P)
        quant = quant_per_element * tm.layer_mlp_quantised_elements(model, job) \
            + quant_s("latent_proj") * precision.latent_quantised_elements(h, model.moe.latent_size)
        out["E"] = {"gemm": moe["gemm"], "elementwise": common("E") + moe["elementwise"] + quant,
                    "wgrad_extra": moe["wgrad_extra_s"], "moe_mlp_s": moe["gemm"] + moe["elementwise"],
                    "moe_act_s": moe["expert_act_s"], "shared_expert_s": moe["shared_expert_s"], "norm_s": norm_s}
    if model.blocks("M"):
        mamba = mamba_block_fwd_s(model, system, job, P)
        m = model.mamba
        out["M"] = {"gemm": mamba["gemm"],
                    "elementwise": common("M") + mamba["elementwise"]
                    # in_proj: its input and output gradient; out_proj the same, in its own dtype
                    + quant_per_element * (h + m.in_proj_width) + quant_s("mamba_out_proj") * (m.d_inner + h),
                    "norm_s": norm_s}
    return out


def block_forward_s(block: dict):
    """A block's forward seconds: its GEMMs, attention core (if any) and element-wise passes."""
    return block["gemm"] + block.get("attention", 0.0) + block["elementwise"]


def mean_layer_fwd_s(model: ModelSpec, system: SystemSpec, job: JobSpec, P: PlanArrays) -> dict:
    """layer_compute_fwd_s of a hybrid stack: its blocks' pieces, weighted by their share of
    the layers."""
    blocks = block_fwd_s(model, system, job, P)
    share = block_fractions(model)
    return {key: sum(share[k] * np.asarray(b.get(key, 0.0), dtype=np.float64) for k, b in blocks.items())
            for key in LAYER_KEYS}


def busiest_rank_excess(model: ModelSpec, system: SystemSpec, job: JobSpec, plan) -> tuple[int, float]:
    """(pipeline rank, share) of a pipelined hybrid stack: the rank whose own blocks (the pattern cut
    at the plan's layout, `rank_block_counts`) cost the most forward compute per microbatch, and how
    much more that is than its layer count at the pattern's mean block. (0, 0.0) without
    pipelining, where the mean block is exact."""
    if not model.hybrid_pattern or plan.pp == 1:
        return 0, 0.0
    explicit = plan.model_copy(update={"stage_layers": plan_layout(plan, model.layers)})
    P = PlanArrays.from_plans([explicit], model.layers, dense_layer_spec(model))
    blocks = block_fwd_s(model, system, job, P)
    kinds, [(_, counts, _)] = rank_block_counts(model, P)
    cost = np.array([float(np.ravel(block_forward_s(blocks[k]))[0]) for k in kinds])
    mean = sum(cost[kinds.index(c)] for c in model.hybrid_pattern) / model.layers
    own = counts @ cost  # per representative column: every rank, in order, then repeats
    j = int(np.argmax(own))
    layers = P.rank_layers[0, j]
    return int(P.rank_index[0, j]), float(own[j] / (layers * mean) - 1.0) if layers else 0.0


def rank_excess_s(model: ModelSpec, system: SystemSpec, job: JobSpec, P: PlanArrays, terms: dict,
                  counts=None) -> dict | None:
    """What each representative rank of a pipelined hybrid stack costs per microbatch beyond its
    layer count at the mean block (the layer the per-layer terms describe): (n, R) seconds of its
    forward and backward compute and of its blocks' expert all-to-all, forward and backward, from
    the blocks it really holds, and of the forward and all-to-all it reruns for the blocks it
    recomputes in full ("rc_fwd", "rc_ep_fwd"; `rank_block_counts`). Zero for a rank holding the
    pattern's mix. None where the mean block is exact (no pipelining) or not the terms' layer
    (bf16 first/last layers: the terms mix two precisions' blocks). `counts`: the blocks per
    rank, `rank_block_counts(model, P)` unless given (the stage search probes with its own)."""
    if not by_block(model) or not np.any(P.pp > 1) or any(job.bf16_layers):
        return None
    blocks = block_fwd_s(model, system, job, P)
    share_e = model.layers / model.blocks("E") if model.blocks("E") else 0.0
    fwd = {k: block_forward_s(b) for k, b in blocks.items()}
    ep_fwd = {"E": terms["ep_fwd"] * share_e}
    # per block of each kind (rank_block_sum broadcasts a number or one value per row), the mean
    # block's per-layer term, and whether the rank's recomputed blocks count instead of its held
    cost = {
        "fwd": (fwd, terms["fwd_compute"], False),
        "bwd": ({k: tm.BACKWARD_FACTOR * block_forward_s(b) + b.get("wgrad_extra", 0.0) for k, b in blocks.items()},
                terms["bwd_compute"], False),
        "ep_fwd": (ep_fwd, terms["ep_fwd"], False),
        "ep_bwd": ({"E": terms["ep_bwd"] * share_e}, terms["ep_bwd"], False),
        "rc_fwd": (fwd, terms["fwd_compute"], True),
        "rc_ep_fwd": (ep_fwd, terms["ep_fwd"], True)}
    pipelined = (P.pp > 1)[:, None]
    counts = counts or rank_block_counts(model, P)
    return {key: np.where(pipelined, rank_block_sum(model, P, per_block, counts, recomputed)
                          - (P.rank_recompute if recomputed else P.rank_layers)
                          * np.broadcast_to(mean, (len(P),))[:, None], 0.0)
            for key, (per_block, mean, recomputed) in cost.items()}
