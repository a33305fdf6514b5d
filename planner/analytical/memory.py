"""Per-GPU memory of many plans at once (numpy columns); bytes unless the name says otherwise.

The worst pipeline stage is the first one: it holds the embedding and, under 1F1B, the most
microbatches in flight (Korthikanti et al. 2022 §4.2.3); the last stage's LM-head workspace is
added as a transient buffer.
"""
from __future__ import annotations

import numpy as np

from hardware.spec import SystemSpec
from planner.analytical import layer_kinds
from planner.analytical.flops import attention_out_width
from planner.analytical.kernels import per_op_checkpointing
from planner.analytical.offload import offloaded_layers
from planner.analytical.precision import GEMM_OPERAND_BYTES, high_precision_dtype
from planner.analytical.plans import (PlanArrays, module_selected, rank_argmax, rank_max, sequence_parallel_on,
                                     with_every_rank)
from planner.model import HYBRID_BLOCKS, ModelSpec
from planner.pipeline_layout import vp_microbatch_group
from planner.plan import DP_IMPL_CODES, JobSpec


def activation_parts(model: ModelSpec, gemm_input_bytes: float = 2.0, proj_copy_bytes: float = 0.0,
                     module_bytes: dict[str, float] | None = None) -> dict[str, float]:
    """Stored activations of one layer per token, by what stores them, in units of s·b·h bytes
    (Korthikanti et al. 2022 §4.1, Table 2 first row: sbh(34 + 5as/h)), of the repeated layer (the
    MoE layer of a MoE model; its leading dense layers are their own kind,
    layer_kinds.lead_layer_model, costed with this function on the dense twin).

    Not sharded by tensor parallelism (only by sequence parallelism): `norm_inputs` the two
    layer-norm inputs (4), `qkv_input` / `mlp_input` the normed inputs of the QKV and first MLP
    GEMMs (2 + 2), `dropout_masks` (2, only with dropout). Sharded by tp: `qkv` Q, K and V
    (2 + 2 + 2; K,V g/a as wide with GQA; MLA: heads·(nope+rope) keys, heads·v values),
    `proj_input` the output projection's input (2), `dense_mlp` the MLP's inner activations
    (16 for GeLU at 4h: fc1 output and GeLU output; SwiGLU stores the fused gate+up output 2f
    and the product f: 6f/h), `moe_routed` a MoE layer's per token top_k expert MLPs, the
    permuted expert inputs (one bf16 copy per routed expert, kept for FC1's weight gradient:
    2·top_k) and the router's fp32 logits and probabilities (8·E/h), `moe_shared` its shared
    experts' MLP terms (Megatron-Core moe/: token_dispatcher permute, router.py,
    shared_experts.py). `mla_latents` (not sharded by tp): MLA's q and kv latents and their
    normed copies (multi_latent_attention.py). `score` is the s² attention term 5as/h (never
    stored by fused attention).

    Low-precision GEMMs (`gemm_input_bytes`, 2 = bf16): Transformer Engine's Linear,
    LayerNormLinear and GroupedLinear keep the input of a GEMM for its weight gradient as the
    quantised copy they made for the forward GEMM (columnwise usage; `save_original_input` off by
    default: transformer_engine/pytorch/module/linear.py, layernorm_linear.py, grouped_linear.py),
    so the inputs only a GEMM keeps shrink to that format: the QKV GEMM's normed input (not with
    MLA, whose down-projections keep the original: Megatron-Core multi_latent_attention.py
    set_save_original_input), a dense MLP's normed input and the input of every second MLP GEMM
    (the activation's output), the experts' permuted inputs. What a non-GEMM op also keeps stays
    16-bit: the norms' inputs, Q/K/V and the output the attention core keeps, the activation's
    input, a MoE layer's normed input (the router's). The output projection's input is the
    attention output the core keeps; Megatron lets linear_proj keep that original except under
    FP8 delayed scaling (attention.py), where the quantised copy comes on top (`proj_copy_bytes`).
    `module_bytes`: the GEMM-input bytes of module groups a per-module recipe runs in another
    format (JobSpec.module_dtypes: attention's QKV input, the latent up-projection's input, the
    Mamba out_proj's input), else `gemm_input_bytes`."""
    h = model.hidden
    g = gemm_input_bytes
    g_of = {group: (module_bytes or {}).get(group, g) for group in ("attention", "latent_proj", "mamba_out_proj")}
    act = (4.0 if model.activation == "swiglu" else 2.0) + g  # activation input (+ up) 16-bit, output as fc2 keeps it
    f_moe = 1.0 if model.moe else 0.0  # the repeated layer is a MoE layer or a dense one
    parts = {"mamba_input": 0.0, "mamba": 0.0,
        "norm_inputs": 4.0, "qkv_input": 2.0 if model.mla else g_of["attention"], "mlp_input": 2.0 if model.moe else g,
        # two 1-byte dropout masks (after attention and after the MLP) exist only with dropout
        "dropout_masks": 2.0 if model.dropout else 0.0,
        "qkv": (2.0 * model.q_hidden + 4.0 * model.kv_hidden) / h,
        "proj_input": (2.0 + proj_copy_bytes) * attention_out_width(model) / h,
        "dense_mlp": (1 - f_moe) * act * model.ffn_hidden / h,
        "moe_routed": 0.0, "moe_shared": 0.0,
        "score": 5.0 * model.heads * model.seq_length / h,
        "mla_latents": 0.0,
    }
    if model.mla:
        # MLA's latents (multi_latent_attention.py): the down-projections' outputs, q_compressed
        # and kv_combined (kv latent + the shared RoPE key), kept 16-bit as the inputs of the
        # up-projections' fused latent norms (TELayerNormColumnParallelLinear), and those norms'
        # outputs, the up-projection GEMMs' inputs, in the GEMM's format; sequence-sharded, as
        # the down-projections run on the layer's SP shard
        kept, normed = mla_latent_widths(model)
        parts["mla_latents"] = (2.0 * kept + g_of["attention"] * normed) / h
    if model.moe:
        moe = model.moe
        # the permuted rows are the experts' width (LatentMoE: latent), plus, with LatentMoE, the
        # up-projection's input (the combined latent rows) in the GEMM's format
        w = model.expert_hidden / h
        parts["moe_routed"] = f_moe * (act * moe.top_k * model.expert_ffn_hidden / h + permuted_row_bytes(model, g)
                                       + 8.0 * moe.num_experts / h + (g_of["latent_proj"] * w if moe.latent_size else 0.0))
        parts["moe_shared"] = f_moe * act * moe.shared_experts * model.shared_expert_ffn_hidden / h
    if model.hybrid_pattern:
        return _hybrid_parts(model, parts, g, act, g_of["mamba_out_proj"])
    return parts


def _hybrid_parts(model: ModelSpec, layer: dict[str, float], g: float, act: float,
                  out_proj_g: float) -> dict[str, float]:
    """A hybrid stack's mean block (planner.analytical.hybrid): each block keeps its one norm's
    input (2) and dropout mask, an attention block its transformer-layer attention terms, a
    dense-MLP block its GEMM input and activations, a MoE block its routed and shared terms, and a
    Mamba-2 block (mamba_ssm's memory-efficient path, MambaSplitConv1dScanCombinedFn: the conv and
    scan are recomputed in the backward) in_proj's input (`mamba_input`, the GEMM's format), its
    output z, x, B, C, dt (16-bit), the scan output y (16-bit) and out_proj's input (the GEMM's
    format) (`mamba`), weighted by the blocks' share of the layers."""
    f = {k: model.blocks(k) / model.layers for k in ("M", "*", "-", "E")}
    h, m = model.hidden, model.mamba
    mamba = (2.0 * m.in_proj_width + 2.0 * m.d_inner + out_proj_g * m.d_inner) / h if m else 0.0
    return {"norm_inputs": 2.0, "dropout_masks": 1.0 if model.dropout else 0.0,
            "mla_latents": f["*"] * layer["mla_latents"],
            "qkv_input": f["*"] * layer["qkv_input"], "qkv": f["*"] * layer["qkv"],
            "proj_input": f["*"] * layer["proj_input"], "score": f["*"] * layer["score"],
            "mlp_input": f["-"] * g + f["E"] * 2.0, "dense_mlp": f["-"] * act * model.ffn_hidden / h,
            "moe_routed": f["E"] * layer["moe_routed"], "moe_shared": f["E"] * layer["moe_shared"],
            "mamba_input": f["M"] * g, "mamba": f["M"] * mamba}


def bf16_layer_share(model: ModelSpec, job: JobSpec) -> float:
    """Share of the model's layers that JobSpec.bf16_layers keeps in bf16."""
    return min(sum(job.bf16_layers), model.layers) / model.layers


def without_bf16_layers(job: JobSpec) -> JobSpec:
    """The job as its other layers run it (its recipe, no layer kept in bf16)."""
    return job.model_copy(update={"bf16_layers": (0, 0)})


def bf16_job(job: JobSpec) -> JobSpec:
    """The job as its bf16-kept layers run it: 16-bit GEMMs and attention, no quantisation."""
    return job.model_copy(update={"dtype": high_precision_dtype(job.dtype), "fp8_attention": False,
                                  "bf16_layers": (0, 0), "module_dtypes": {}})


def saved_gemm_input_bytes(job: JobSpec) -> tuple[float, float]:
    """(bytes per element of a GEMM input kept for the weight gradient, bytes of the output
    projection's extra quantised copy) under the job's recipe (see `activation_parts`): the
    low-precision format with Transformer Engine, 16-bit under the torch stacks."""
    if job.kernels != "te":
        return 2.0, 0.0
    g = GEMM_OPERAND_BYTES[job.dtype]
    return g, (g if job.dtype == "fp8" else 0.0)


def module_gemm_input_bytes(job: JobSpec) -> dict[str, float]:
    """The saved GEMM-input bytes of the module groups JobSpec.module_dtypes runs apart."""
    if job.kernels != "te":
        return {}
    return {group: GEMM_OPERAND_BYTES[dtype] for group, dtype in job.module_dtypes.items()}


def mla_latent_widths(model: ModelSpec) -> tuple[int, int]:
    """MLA's latents a layer keeps per token (`activation_parts`' mla_latents): the widths of the
    down-projections' outputs (q_compressed, kv_combined with the shared RoPE key) and of their
    normed copies (q and kv latents)."""
    x = model.mla
    ql = x.q_lora_rank or 0
    return ql + x.kv_lora_rank + x.qk_rope_head_dim, ql + x.kv_lora_rank


def permuted_row_bytes(model: ModelSpec, gemm_input_bytes: float) -> float:
    """One MoE layer's permuted expert inputs, g·top_k·w (w: the expert width over h; one copy
    per routed expert, kept for FC1's weight gradient), in units of s·b·h bytes."""
    return gemm_input_bytes * model.moe.top_k * (model.expert_hidden / model.hidden)


def permuted_input_coefficient(model: ModelSpec, gemm_input_bytes: float = 2.0) -> float:
    """The routed experts' permuted inputs in `activation_parts`' moe_routed (`permuted_row_bytes`)
    per layer of the mean layer (a hybrid stack's MoE-block share): one copy per routed expert at
    etp 1."""
    if not model.moe:
        return 0.0
    per_moe_layer = permuted_row_bytes(model, gemm_input_bytes)
    if model.hybrid_pattern:
        return model.blocks("E") / model.layers * per_moe_layer
    return per_moe_layer


UNSHARDED_PARTS = ("norm_inputs", "qkv_input", "mlp_input", "dropout_masks", "mamba_input", "mla_latents")
SHARDED_PARTS = ("qkv", "proj_input", "dense_mlp", "moe_routed", "moe_shared", "mamba")


def activation_coefficients(model: ModelSpec, gemm_input_bytes: float = 2.0,
                            proj_copy_bytes: float = 0.0,
                            module_bytes: dict[str, float] | None = None) -> tuple[float, float, float]:
    """Korthikanti et al. 2022 Table 2's sbh(34 + 5as/h) as the terms tensor parallelism does not
    shard (10), the terms it shards (24) and the s² score term (5as/h), in units of s·b·h bytes,
    generalised (see `activation_parts`)."""
    parts = activation_parts(model, gemm_input_bytes, proj_copy_bytes, module_bytes)
    return (sum(parts[k] for k in UNSHARDED_PARTS), sum(parts[k] for k in SHARDED_PARTS), parts["score"])


def selective_freed_coefficients(model: ModelSpec, modules: np.ndarray, gemm_input_bytes: float = 2.0,
                                 module_bytes: dict[str, float] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(not tp-sharded, tp-sharded) activations per layer, in s·b·h bytes, that selective recompute
    of the module set `modules` (bit masks, planner.plan.RECOMPUTE_MODULE_BITS) does not store.
    Which tensors each module frees (Megatron-Core 0.19, transformer_layer.py, attention.py,
    multi_latent_attention.py, moe/moe_layer.py, moe/experts.py; layer structure from
    models/gpt/gpt_layer_specs.py with Transformer Engine):
      core_attn       the s² score term only (handled by the caller; nothing with fused attention:
                      the checkpoint keeps Q, K, V, the projection keeps the output)
      layernorm       output-discarding: the normed outputs of the norms that are modules of their
                      own: the input norm with MLA (otherwise fused into linear_qkv, a
                      LayerNormColumnParallelLinear that keeps its own output) and the pre-MLP
                      norm of MoE layers (dense MLPs fuse it into linear_fc1): 2 each
      mla_up_proj     output-discarding: the up-projected Q, K, V (with RoPE) the attention core
                      keeps, and the latent norms' outputs inside the checkpoint (MLA only)
      mlp             dense (non-MoE) layers' MLP checkpointed whole: its fused norm output (2)
                      and its inner activations
      moe             MoE layers' MLP checkpointed whole: routed experts, permuted copies, router,
                      shared experts (its input, the pre-MLP norm output, stays)
      moe_act         output-discarding: the expert activation's output (fc2's input, as fc2
                      keeps it: `gemm_input_bytes`), g·k·f/h of the routed experts' act·k·f/h
                      (inside `moe` when both are set)
      shared_experts  the shared experts checkpointed whole (inside `moe` when both are set)"""
    parts = activation_parts(model, gemm_input_bytes, module_bytes=module_bytes)
    h = model.hidden
    f_moe = 1.0 if model.moe else 0.0  # the repeated layer is a MoE layer or a dense one

    def has(name):
        return module_selected(modules, name)
    norms = 2.0 * (model.mla is not None) + 2.0 * f_moe
    moe_act = f_moe * gemm_input_bytes * model.moe.top_k * model.expert_ffn_hidden / h if model.moe else 0.0
    routed = np.where(has("moe"), parts["moe_routed"], np.where(has("moe_act"), moe_act, 0.0))
    shared = np.where(has("moe") | has("shared_experts"), parts["moe_shared"], 0.0)
    # mla_up_proj's checkpoint (CheckpointWithoutOutput) runs the fused latent norms + up-projections
    # without autograd: their norm outputs (the GEMM inputs) are not kept; the latents, its inputs, are
    up_norm_out = 0.0
    if model.mla:
        up_norm_out = parts["mla_latents"] - 2.0 * mla_latent_widths(model)[0] / h
    unsharded = (has("layernorm") * norms + has("mlp") * (1 - f_moe) * parts["mlp_input"]
                 + has("mla_up_proj") * up_norm_out)
    sharded = (has("mla_up_proj") * (parts["qkv"] if model.mla else 0.0) + has("mlp") * parts["dense_mlp"]
               + routed + shared)
    return unsharded, sharded


def op_sac_saved_per_layer(model: ModelSpec, P: PlanArrays) -> np.ndarray:
    """Bytes per s·b·h one dense layer keeps under torchtitan's per-op selective checkpointing (the
    torch stacks' "selective"; time.OP_SAC_ATTENTION_PROJ_RERUN names the policy): the layer's
    input (sequence-sharded under SP), the outputs of the odd mms in forward order (wq, wv, w1 and,
    in a SwiGLU MLP, w2, whose output before the reduce-scatter is a full-width partial sum), SDPA's
    output and fp32 log-sum-exp, and the tensor-parallel reduce-scatters' outputs. All 16-bit: a
    float8 / MX linear's mm returns bf16. Nothing else is kept; the rest is rerun."""
    h, t = model.hidden, P.tp
    sp = sequence_parallel_on(P)
    q, kv = model.q_hidden, model.kv_hidden
    col = (2.0 * q + 2.0 * kv + 2.0 * q + 4.0 * model.heads + 2.0 * model.ffn_hidden) / h  # sharded by t
    w2_out = 2.0 if model.activation == "swiglu" else 0.0  # mm 7 of 7; a GeLU MLP's w2 is mm 6
    reduce_scatters = np.where(sp & (t > 1), 2 * 2.0 / t, 0.0)
    return np.where(sp, 2.0 / t, 2.0) + col / t + w2_out + reduce_scatters


def activation_bytes_per_layer(model: ModelSpec, job: JobSpec, P: PlanArrays) -> np.ndarray:
    """Stored activations of one layer for one microbatch, per GPU (Korthikanti Table 2):
    none: sbh(10 + 24/t + 5as/(ht)); TP+SP: sbh/t·(34 + 5as/h); selective: what the recomputed
    modules free is not stored (`selective_freed_coefficients`; core_attn, the default, drops the
    5as/h term, which fused/flash attention never stores); full: only the 2sbh layer input
    (sharded by SP). Context parallelism splits s by cp. Layers kept in bf16 under a
    low-precision recipe (JobSpec.bf16_layers) keep 16-bit GEMM inputs: the mean layer is
    weighted by their share (exact at pp 1; a stage holding more of them stores more)."""
    share = bf16_layer_share(model, job)
    if share:
        low = activation_bytes_per_layer(model, without_bf16_layers(job), P)
        wide = activation_bytes_per_layer(model, bf16_job(job), P)
        return tuple((1 - share) * a + share * b for a, b in zip(low, wide))
    g, proj_copy = saved_gemm_input_bytes(job)
    module_bytes = module_gemm_input_bytes(job)
    unsharded, sharded, score = activation_coefficients(model, g, proj_copy, module_bytes)
    t = P.tp
    sp = sequence_parallel_on(P)
    sbh = P.micro_batch * model.seq_length / P.cp * model.hidden
    selective = P.recompute == 1
    freed_u, freed_s = selective_freed_coefficients(model, np.where(selective, P.recompute_modules, 0.0), g,
                                                    module_bytes)
    keeps_scores = ((P.recompute == 0) | (selective & ~module_selected(P.recompute_modules, "core_attn"))) \
        & (not job.flash_attention)
    # Expert tensor parallelism: the AlltoAll dispatcher all-gathers the permuted rows over the
    # expert-TP group after the EP all-to-all (token_dispatcher.py dispatch_postprocess,
    # gather_from_sequence_parallel_region(group=expt_tp)), so each GPU's grouped FC1 keeps
    # etp·top_k rows of the expert width per local token, not top_k: etp − 1 more copies of the
    # `moe_routed` permuted-input term (the FFN activations are etp× the rows at 1/etp the width,
    # unchanged). Freed with the whole MoE MLP under `moe` recompute.
    moe_freed = selective & module_selected(P.recompute_modules, "moe")
    rows = (P.etp - 1.0) * np.where(moe_freed, 0.0, permuted_input_coefficient(model, g))
    per_layer = sbh * (np.where(sp, (unsharded - freed_u) / t, unsharded - freed_u) + (sharded - freed_s + rows) / t
                       + np.where(keeps_scores, score / t, 0.0))
    if per_op_checkpointing(model, job):
        per_layer = np.where(selective, sbh * op_sac_saved_per_layer(model, P), per_layer)
    input_only = np.where(sp, 2.0 * sbh / t, 2.0 * sbh)
    return np.where(P.recompute == 2, input_only, per_layer), per_layer


class RankColumns:
    """P's 1-D columns as (n, 1), so that per-layer functions broadcast against the (n, R)
    representative-rank columns without changing their signatures."""

    def __init__(self, P: PlanArrays):
        self._P = P

    def __getattr__(self, name):
        value = getattr(self._P, name)
        return value[:, None] if isinstance(value, np.ndarray) and value.ndim == 1 else value

    def __len__(self) -> int:
        return len(self._P)


def in_flight_microbatches(P: PlanArrays) -> np.ndarray:
    """Microbatches (in units of a whole rank's activations) that each representative rank r
    holds at its peak, (n, R). 1F1B: min(pp − r, m) (rank r warms up with pp − r − 1 forwards,
    Narayanan et al. SC'21 §2.2). Interleaved (Megatron's schedule: 2(pp − r − 1) + (v − 1)·N
    warm-up chunk-forwards plus one, each 1/v of the rank, N = pp unless pp does not divide m:
    pipeline_layout.vp_microbatch_group): (2(p−r−1) + (v−1)N + 1)/v, which for r = 0 and N = p
    is Korthikanti et al. 2022 §4.2.3's p·(1 + (p−1)/(p·v)); scaled by min(1, m/p).
    MoE all-to-all overlap (combined 1F1B) adds one LAYER: it runs one more warm-up forward
    (megatron/core/pipeline_parallel/schedules.py get_pp_rank_microbatches, +1 with
    overlap_moe_expert_parallel_comm; without pipelining the next microbatch's forward), but that
    forward stands for the steady state's own: each combined step runs the next microbatch's layer
    i beside the backward of the previous one's last unreleased layer (models/common/
    model_chunk_schedule_plan.py TransformerModelChunkSchedulePlan.run: get_layer(i) with
    pop_layer()), freeing a layer for each layer it stores, so the peak is the plain schedule's
    plus the pair's one layer."""
    C = RankColumns(P)
    m = C.global_batch / (C.micro_batch * C.dp)
    p, v, r = C.pp, C.vpp, P.rank_index
    plain = np.minimum(p - r, m)
    paired_layer = (C.moe_a2a_overlap > 0) / np.maximum(P.rank_layers, 1.0)  # in units of the rank
    if not np.any(v > 1):  # no interleaved row: its form is not computed
        return np.where(v > 1, 0.0, plain) + paired_layer
    n_group = vp_microbatch_group(m, p)
    interleaved = (2.0 * (p - r - 1.0) + (v - 1.0) * n_group + 1.0) / v * np.minimum(1.0, m / p)
    return np.where(v > 1, interleaved, plain) + paired_layer


def rank_layer_sum(model: ModelSpec, per_layer, n, lead):
    """Σ over n layers of a rank, `lead` of them a MoE model's leading dense layers, of
    per_layer(model of that layer kind) (layer_kinds); n·per_layer(model) with one kind."""
    if not layer_kinds.lead_layers(model):
        return n * per_layer(model)
    return (n - lead) * per_layer(model) + lead * per_layer(layer_kinds.lead_layer_model(model))


def stage_params(model: ModelSpec, P: PlanArrays, by_block: bool = False,
                 counts=None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(transformer-block dense, vocabulary, expert) parameters held by one GPU of each
    representative rank, (n, R). TP shards every matrix but those Megatron keeps whole on every
    TP rank (ModelSpec.tp_replicated_params_by_block: MLA's down-projections, the router, the
    row-parallel linears' biases; norms are replicated too: negligible and ignored); EP shards the
    experts over etp·ep (Megatron parallel folding; etp = tp by default), their fc2 biases over ep
    only (expert_tp_replicated_params_per_layer); the first rank holds
    the embedding and the last the LM head (Megatron keeps a copy of a tied embedding there when
    pp > 1; with pp = 1 untied embeddings are two matrices on the one rank; a model with MTP
    modules keeps one more, the MTP stage's own embedding, on the last rank when pp > 1); learned
    position embeddings are whole on every TP rank of an embedding's stage. `by_block`: a hybrid
    stack's ranks hold the blocks their layout gives them (P's columns are real ranks with their
    layouts' layer counts), not their layer count of mean blocks; rank_memory's activations
    likewise. `counts`: the blocks per rank,
    `layer_kinds.rank_block_counts(model, P)` unless given (the stage search probes with its own)."""
    C = RankColumns(P)
    n, lead = P.rank_layers, P.rank_lead_layers
    if by_block and layer_kinds.by_block(model):
        # a hybrid stack: the blocks each rank holds (a MoE block's experts are all the stack's)
        counts = counts or layer_kinds.rank_block_counts(model, P)
        replicated = layer_kinds.rank_block_sum(model, P, model.tp_replicated_params_by_block, counts)
        blocks = (layer_kinds.rank_block_sum(model, P, model.non_expert_params_by_block, counts)
                  - replicated) / C.tp + replicated
        per_moe_block = model.layers / max(model.blocks("E"), 1)
        expert_all, expert_replicated = (layer_kinds.rank_block_sum(model, P, {"E": per_moe_block * v}, counts)
                                         for v in (model.expert_params_per_layer,
                                                   model.expert_tp_replicated_params_per_layer))
    else:
        # leading dense layers: the dense layer's parameters, no experts (lead_layer_model)
        replicated = rank_layer_sum(model, lambda m: m.tp_replicated_params_per_layer, n, lead)
        blocks = (rank_layer_sum(model, lambda m: m.non_expert_params_per_layer, n, lead) - replicated) / C.tp \
            + replicated
        expert_all = rank_layer_sum(model, lambda m: m.expert_params_per_layer, n, lead)
        expert_replicated = rank_layer_sum(model, lambda m: m.expert_tp_replicated_params_per_layer, n, lead)
    # the experts' fc2 biases are whole on every expert-TP rank (expert_tp_replicated_params_per_layer)
    expert = (expert_all - expert_replicated) / (C.etp * C.ep) + expert_replicated / C.ep
    first = P.rank_index == 0
    last = P.rank_index == C.pp - 1
    heads = last * np.where((C.pp > 1) | (not model.tied_embeddings), 1.0, 0.0)
    embeddings = first * 1.0
    if model.mtp_layers:
        # a pipelined MTP stage builds its own word embedding beside the LM head (gpt_model.py and
        # hybrid_model.py: `if self.pre_process or self.mtp_process: self.embedding = ...`), a
        # trained copy kept in step with the first stage's; at pp 1 the one embedding serves both
        embeddings = embeddings + last * np.where(C.pp > 1, 1.0, 0.0)
    # learned positions (GPT-3): LanguageModelEmbedding's position_embeddings is a plain
    # torch.nn.Embedding of seq_length x h, whole on every TP rank (only the word embedding is
    # vocab-parallel); an embedding holder holds it
    positions = model.embedding_params - model.vocab * model.hidden
    vocab = (embeddings + heads) * model.vocab * model.hidden / C.tp + embeddings * positions
    if model.mtp_layers:
        # the MTP modules live on the last stage with the loss (DeepSeek-V3 §2.2; Megatron's layout
        # places 'm' before 'L'): each a repeated layer + the 2h→h projection + norms (mtp_params)
        mtp_experts = model.mtp_weight_modules * model.mtp_layer_expert_params
        mtp_replicated = model.mtp_weight_modules * model.mtp_layer_tp_replicated_params
        mtp_expert_replicated = model.mtp_weight_modules * model.mtp_layer_expert_tp_replicated_params
        blocks = blocks + last * ((model.mtp_params - mtp_experts - mtp_replicated) / C.tp + mtp_replicated)
        expert = expert + last * ((mtp_experts - mtp_expert_replicated) / (C.etp * C.ep)
                                  + mtp_expert_replicated / C.ep)
    return blocks, vocab, expert


def stage_router_params(model: ModelSpec, P: PlanArrays, by_block: bool = False, counts=None) -> np.ndarray:
    """(n, R): the routers' own parameters (ModelSpec.router_gate_params, whole on every TP rank)
    that one GPU of each representative rank holds, part of stage_params' transformer blocks;
    `by_block`, `counts` as there."""
    if not model.moe:
        return np.zeros(P.rank_index.shape)
    if by_block and layer_kinds.by_block(model):
        router = layer_kinds.rank_block_sum(model, P, {"E": model.router_gate_params}, counts)
    else:
        router = rank_layer_sum(model, lambda m: m.router_params_per_layer, P.rank_layers, P.rank_lead_layers)
    last = P.rank_index == RankColumns(P).pp - 1
    return router + last * model.mtp_weight_modules * model.router_gate_params


def expert_dp(P: PlanArrays) -> np.ndarray:
    """Expert-data-parallel size: world / (etp·ep·pp) (Megatron MoE parallel folding)."""
    return P.tp * P.dp * P.cp / (P.etp * P.ep)


def model_state_elems(dense, expert, P: PlanArrays) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Elements of (weights, grads, optimizer state) one GPU keeps. ZeRO / distributed-optimizer
    sharding (Rajbhandari et al. 2020, ZeRO §5; Megatron's distributed optimizer = stage 1:
    6 + 12/d bytes per parameter): dense weights are replicated over dp·cp, experts over the
    expert-data-parallel group world/(etp·ep·pp) = tp·dp·cp/(etp·ep) (megatron/core/parallel_state.py)."""
    sharded = dense / (P.dp * P.cp) + expert / np.maximum(expert_dp(P), 1.0)
    params = dense + expert
    z = P.zero_stage
    return np.where(z >= 3, sharded, params), np.where(z >= 2, sharded, params), np.where(z >= 1, sharded, params)


# Bytes per element of the model state that two Megatron switches change. Source: Megatron-LM
# megatron/core/distributed/param_and_grad_buffer.py (group_params_for_buffers): the parameter
# buffer stores FP8 parameters as torch.uint8 (1 B) when --fp8-param-gather keeps the compute
# weights in FP8, and the gradient buffer is fp32 only while grad_reduce_in_fp32 holds, which
# --grad-reduce-in-bf16 turns off (megatron/training/arguments.py) -> 2-byte gradients, reduced
# in 16 bits. Embedding and LM head are never FP8 (Transformer Engine quantises the transformer
# blocks' Linear layers only), so they keep `bpp.weights`.
FP8_WEIGHT_BYTES = 1.0
BF16_GRAD_BYTES = 2.0
# FSDP2 accumulates the unsharded gradients of no-sync microbatches in its reduce dtype, fp32 under
# torchtitan's mixed-precision policy (param bf16, reduce fp32; FSDPParam.to_accumulated_grad_if_needed).
FSDP2_ACCUMULATED_GRAD_BYTES = 4.0


def block_weight_bytes_per_elem(job: JobSpec, P: PlanArrays) -> np.ndarray:
    """Bytes per transformer-block weight element on the GPU (and in the DP parameter gather)."""
    return np.where(P.fp8_param_gather > 0, FP8_WEIGHT_BYTES, job.bytes_per_param.weights)


def grad_bytes_per_elem(job: JobSpec, P: PlanArrays) -> tuple[np.ndarray, np.ndarray]:
    """(bytes per gradient element kept, bytes per gradient element on the DP wire)."""
    bpp = job.bytes_per_param
    bf16 = P.grad_reduce_in_bf16 > 0
    return np.where(bf16, BF16_GRAD_BYTES, bpp.grads), np.where(bf16, BF16_GRAD_BYTES, bpp.grad_reduce)


def at_rank(values, index: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    """Row i's entry in column index[i] of `values` broadcast to the (n, R) rank shape."""
    values = np.asarray(values, dtype=np.float64)
    if values.shape == (shape[0], 1):  # one value per row, the same on every rank: no gather
        return values[:, 0].copy()
    if values.shape == shape and values.flags.c_contiguous:  # flat indices: ~3x faster, same elements
        return values.ravel()[np.arange(shape[0]) * shape[1] + index]
    full = np.broadcast_to(values, shape)
    # fancy indexing, not take_along_axis: the same elements, without its per-call index setup
    # (the fit calls this ~10^5 times on a few rows each)
    return full[np.arange(shape[0]), index]


def rank_memory(model: ModelSpec, system: SystemSpec, job: JobSpec, P: PlanArrays,
                by_block: bool = False, counts=None) -> dict[str, np.ndarray]:
    """Bytes per GPU of every representative pipeline rank, (n, R) arrays by category
    (`by_block`, `counts`: see stage_params)."""
    C = RankColumns(P)
    bpp = job.bytes_per_param
    by_block = by_block and layer_kinds.by_block(model)
    if by_block:
        counts = counts or layer_kinds.rank_block_counts(model, P)
    blocks, vocab, expert = stage_params(model, P, by_block, counts)
    params = blocks + vocab + expert
    weight_elems, grad_elems, opt_elems = model_state_elems(blocks + vocab, expert, C)
    vocab_w, vocab_g, vocab_o = model_state_elems(vocab, 0.0, C)
    # the routers keep their weights in bpp.weights under --fp8-param-gather, like the embedding:
    # fp8_model_init quantises Transformer Engine modules' weights only, and the parameter buffer
    # stores a non-FP8 parameter in its own dtype (param_and_grad_buffer.py: torch.uint8 only
    # where is_float8tensor); TopKRouter's weight is a plain Parameter (moe/router.py)
    router = stage_router_params(model, P, by_block, counts)
    router_w = model_state_elems(router, 0.0, C)[0]

    layers_here = P.rank_layers
    some_layers = np.maximum(layers_here, 1.0)
    # ZeRO-3 gathers two layers at a time (the one computing, the one prefetching).
    block_wb = block_weight_bytes_per_elem(job, C)
    grad_b, grad_wire_b = grad_bytes_per_elem(job, C)
    gathered = np.where(C.zero_stage >= 3, 2.0 * params / some_layers * block_wb, 0.0)

    # torchtitan's FSDP2 under pipeline parallelism: its default reshard policy keeps a stage's
    # parameters gathered after forward when pp > 1 (parallelize.py, reshard_after_forward_policy
    # "default" = not pp_enabled), and PyTorch's pipeline schedules turn off gradient sync and
    # reshard-after-backward for every backward microbatch but the last (torch.distributed.
    # pipelining), so the stage accumulates unsharded gradients in the fp32 reduce dtype. Not
    # Megatron's own schedule (the "te" stack), which reduces as it goes.
    unsharded_stage = ((C.dp_impl == DP_IMPL_CODES["torch-fsdp2"]) & (C.zero_stage >= 2) & (C.pp > 1)
                       & (job.kernels != "te"))
    weight_elems = np.where(unsharded_stage, params, weight_elems)
    vocab_w = np.where(unsharded_stage, vocab, vocab_w)
    router_w = np.where(unsharded_stage, router, router_w)
    accumulated_grad_b = np.where(unsharded_stage, FSDP2_ACCUMULATED_GRAD_BYTES, 0.0)

    weights = weight_elems * block_wb + (vocab_w + router_w) * (bpp.weights - block_wb)
    grads = grad_elems * grad_b + params * accumulated_grad_b
    optimizer = opt_elems * bpp.optimizer_total

    stored_per_layer, full_per_layer = activation_bytes_per_layer(model, job, C)
    # Partial full recompute: k of the rank's layers keep only their input (the leading dense
    # layers, a rank's first, are recomputed first: rank_lead_recompute of them).
    k, lead, lead_k = P.rank_recompute, P.rank_lead_layers, P.rank_lead_recompute
    if layer_kinds.lead_layers(model):
        lead_stored, lead_full = activation_bytes_per_layer(layer_kinds.lead_layer_model(model), job, C)
        not_recomputed = np.where(C.recompute == 2, full_per_layer, stored_per_layer)
        lead_not_recomputed = np.where(C.recompute == 2, lead_full, lead_stored)
        act_mb = ((k - lead_k) * stored_per_layer + lead_k * lead_stored
                  + (layers_here - lead - (k - lead_k)) * not_recomputed + (lead - lead_k) * lead_not_recomputed)
    elif by_block and not any(job.bf16_layers):
        # a hybrid rank's own blocks: each kind's activations (the stack cut down to that one
        # block kind is its block), the layers it recomputes in full keeping their input only.
        # Not with bf16 first/last layers: their share is the whole stack's (mean block, as time)
        kept = {kind: np.ravel(np.where(C.recompute == 2, *reversed(activation_bytes_per_layer(
                    model.model_copy(update={"hybrid_pattern": kind, "layers": 1}), job, C))))
                for kind in HYBRID_BLOCKS if model.blocks(kind)}
        own = layer_kinds.rank_block_sum(model, P, kept, counts) \
            - layer_kinds.rank_block_sum(model, P, kept, counts, recomputed=True)
        act_mb = k * stored_per_layer + own
    else:
        act_mb = k * stored_per_layer + (layers_here - k) * np.where(C.recompute == 2, full_per_layer,
                                                                     stored_per_layer)
    if model.mtp_layers:
        # last rank: each MTP module's layer keeps its activations (not in the recompute blocks),
        # plus its projection's input [norm(h); norm(emb)], 2h wide in 2 bytes (DeepSeek-V3 §2.2
        # eq. 21), sharded like the layer inputs under sequence parallelism
        sp = sequence_parallel_on(C)
        sbh = C.micro_batch * model.seq_length / C.cp * model.hidden
        blocks_per_module = 2.0 if model.hybrid_pattern else 1.0  # a hybrid module: two mean blocks
        mtp_act = model.mtp_layers * (blocks_per_module * np.where(C.recompute == 2, full_per_layer, stored_per_layer)
                                      + 4.0 * sbh / np.where(sp, C.tp, 1.0))
        act_mb = act_mb + (P.rank_index == C.pp - 1) * mtp_act
    activations = act_mb * in_flight_microbatches(P)

    # Offload: the fraction moved out (activations: in whole layers, below); HBM keeps at least
    # two layers' worth (one computing, one in transfer) of whatever is offloaded (DESIGN.md, Offload).
    # (where no row offloads weights, or activations, their terms are the totals as they are: not
    # computed, the search's tables mostly have no offload tier)
    at_least_two = np.minimum(2.0 / some_layers, 1.0)
    weights_out = bool(np.any(C.offload_weights > 0))
    def _kept(total, frac):
        if not weights_out:
            return total
        return np.where(frac > 0, total * np.maximum(1.0 - frac, at_least_two), total)
    hbm_weights = _kept(weights, C.offload_weights)
    hbm_grads = _kept(grads, C.offload_weights)
    hbm_optimizer = optimizer * (1.0 - C.offload_optimizer)
    # activations leave in whole layers: the count the offload schedule times and Megatron
    # launches (offload.offloaded_layers), not the fraction as written
    hbm_activations = activations
    if np.any(C.offload_activations > 0):
        moved_layers = offloaded_layers(C.offload_activations, layers_here)
        hbm_activations = np.where(C.offload_activations > 0,
                                   activations * np.maximum(1.0 - moved_layers / some_layers, at_least_two),
                                   activations)
    offloaded = {"weights_grads": (weights - hbm_weights) + (grads - hbm_grads),
                 "optimizer": optimizer - hbm_optimizer,
                 "activations": activations - hbm_activations}
    offload_bytes = sum(offloaded.values())
    # the embedding / LM-head share of the model state in HBM, reported on its own line
    vocab_hbm_w = _kept(vocab_w * bpp.weights, C.offload_weights)
    vocab_hbm_g = _kept(vocab_g * grad_b + vocab * accumulated_grad_b, C.offload_weights)
    vocab_hbm_o = vocab_o * bpp.optimizer_total * (1.0 - C.offload_optimizer)

    # Transient buffers: one layer recomputed in full, and the fp32 logits of the LM head
    # (4·s·b·V/t, Korthikanti et al. 2022 §4.3). The logits buffer is charged to every rank
    # (conservatively, as before per-rank costing), so even splits keep their numbers.
    sbV = C.micro_batch * model.seq_length / C.cp * model.vocab
    workspace = gathered + np.where(C.recompute == 2, full_per_layer, 0.0) + 4.0 * sbV / C.tp

    hbm_total = hbm_weights + hbm_grads + hbm_optimizer + hbm_activations + workspace
    shape = hbm_total.shape
    full = lambda x: np.broadcast_to(np.asarray(x, dtype=np.float64), shape)  # noqa: E731
    return {"hbm": hbm_total, "weights": full(hbm_weights - vocab_hbm_w), "grads": full(hbm_grads - vocab_hbm_g),
            "optimizer": full(hbm_optimizer - vocab_hbm_o),
            "embeddings": full(vocab_hbm_w + vocab_hbm_g + vocab_hbm_o), "activations": full(hbm_activations),
            "workspace": full(workspace), "offload": full(offload_bytes),
            **{f"offload_{k}": full(v) for k, v in offloaded.items()},
            "activations_per_microbatch": full(act_mb), "opt_elems": full(opt_elems), "params_elems": full(params),
            "expert_params_elems": full(expert),
            "grad_reduce": full(params * grad_wire_b),
            "param_gather": full((blocks + expert - router) * block_wb + (vocab + router) * bpp.weights)}


RANK_DP_PREFIX = "rank_dp_"


def memory_breakdown(model: ModelSpec, system: SystemSpec, job: JobSpec, P: PlanArrays) -> dict[str, np.ndarray]:
    """Bytes per GPU of the plan's fullest pipeline rank: HBM by category, offload-tier use by
    category, and the HBM budget. Every representative rank is costed ((n, R) arrays) and the
    one with the most HBM is reported (`memory_rank`). The optimizer step and the DP gradient
    reduce wait for the rank with the MOST parameters, so those counts are the max over ranks."""
    by_block = layer_kinds.by_block(model) and bool(np.any(P.pp > 1))
    if by_block:
        P = with_every_rank(P, model.layers)  # which blocks a rank holds: every rank costed
    r = rank_memory(model, system, job, P, by_block)
    worst = rank_argmax(r["hbm"])
    def at(x):
        return at_rank(x, worst, r["hbm"].shape)
    capacity = system.accelerator.hbm_capacity_bytes - job.hbm_reserve_gib * 2**30
    offload_capacity = system.offload.capacity_bytes if system.offload else 0.0
    return {
        "weights_bytes": at(r["weights"]), "grads_bytes": at(r["grads"]), "optimizer_bytes": at(r["optimizer"]),
        "embeddings_bytes": at(r["embeddings"]), "activations_bytes": at(r["activations"]),
        "workspace_bytes": at(r["workspace"]),
        **{f"offload_{k}_bytes": at(r[f"offload_{k}"]) for k in ("weights_grads", "optimizer", "activations")},
        "hbm_bytes": at(r["hbm"]), "hbm_capacity_bytes": np.full(len(P), capacity),
        "offload_bytes": rank_max(r["offload"]),
        "offload_capacity_bytes": np.full(len(P), float(offload_capacity)),
        "activations_per_microbatch_bytes": at(r["activations_per_microbatch"]),
        "opt_elems": rank_max(r["opt_elems"]), "params_elems": rank_max(r["params_elems"]),
        "expert_params_elems": rank_max(r["expert_params_elems"]),
        "memory_rank": at(P.rank_index),
        # what one DP gradient reduce / parameter all-gather moves per GPU's model copy: the rank
        # with the most parameters
        "grad_reduce_bytes": rank_max(r["grad_reduce"]),
        "param_gather_bytes": rank_max(r["param_gather"]),
        # per representative rank ((n, R), step_time's DP collectives: each rank reduces its own
        # parameters behind its own backward); estimate_many keeps them out of its results
        **{f"{RANK_DP_PREFIX}{k}": r[k] for k in ("grad_reduce", "param_gather", "params_elems", "expert_params_elems")},
    }
