"""Plan -> Megatron-LM `pretrain_gpt.py` flags, environment and torchrun geometry (MA 3).

Every field the analytical model uses is emitted explicitly, so that Megatron's defaults never
decide it: shape, vocabulary, dropout, parallel sizes, batch, precision recipe, recompute (per
virtual chunk, as Megatron counts), MoE dispatcher / grouped GEMM / router dtype, sharding and
overlap, offload, the performance switches a Plan carries, and the environment.
Section numbers ("MA 2a") refer to shared/reference/megatron_args.md; other facts cite the
megatron-core 0.19.2 source file they come from.
"""
from __future__ import annotations

import math
from typing import Callable

from hardware.spec import SystemSpec
from planner.pipeline_layout import fullest_rank_layers, pipeline_args, plan_layout, recompute_per_chunk
from planner.megatron.expressible import (cpu_offload_layers, grouped_gemm, has_dense_mlp_layers,
                                          offload_fraction_of_layers)
from planner.megatron import hybrid, te_precision
from planner.megatron.rules import DEFAULT_NORM_EPSILON, DEFAULT_ROPE_SCALING_FACTOR, DEFAULT_ROTARY_BASE
from planner.megatron.launch import ENTRYPOINT, Arg, MegatronLaunch, arch_is_assumed, gpu_arch_major
from planner.model import ModelSpec
from planner.plan import JobSpec, Plan

# Megatron's default dropout (arguments.py: --attention-dropout / --hidden-dropout 0.1), which
# the model's `dropout: true` means (GPT-3); `dropout: false` (Llama, Mixtral) must emit 0.
DROPOUT_PROBABILITY = 0.1

# Precision name (planner.plan.ComputeDtype) -> Megatron flags (megatron/training/arguments.py
# --fp8-format/--fp8-recipe/--fp4-format/--fp4-recipe, accepted by megatron-core 0.19.2's parser).
# fp8: delayed scaling with the hybrid format (E4M3 forward, E5M2 gradients); fp8-cs: per-tensor
# current scaling ("tensorwise"); mxfp8: E4M3 with 32-element block scales (Transformer Engine's
# MXFP8BlockScaling uses E4M3 for every tensor); nvfp4: E2M1 with NVFP4 block scales.
PRECISION_FLAGS: dict[str, list[Arg]] = {
    "bf16": [("--bf16", None)],
    "fp16": [("--fp16", None)],
    "fp8": [("--bf16", None), ("--fp8-format", "hybrid"), ("--fp8-recipe", "delayed")],
    "fp8-cs": [("--bf16", None), ("--fp8-format", "hybrid"), ("--fp8-recipe", "tensorwise")],
    # E4M3 throughout, as DeepSeek-V3 trained (§3.3.2) and Megatron passes it to Float8BlockScaling
    "fp8-block": [("--bf16", None), ("--fp8-format", "e4m3"), ("--fp8-recipe", "blockwise")],
    "mxfp8": [("--bf16", None), ("--fp8-format", "e4m3"), ("--fp8-recipe", "mxfp8")],
    "nvfp4": [("--bf16", None), ("--fp4-format", "e2m1"), ("--fp4-recipe", "nvfp4")],
}
# Tuned NVIDIA recipes run Python's garbage collector by hand every 100 steps (--manual-gc
# --manual-gc-interval 100); the analytical model has no term for automatic GC pauses.
MANUAL_GC_INTERVAL = 100
FP32_BYTES = 4.0
LOG_INTERVAL = 10

# Not emitted: --use-nccl-ub (NCCL user buffers free SMs during collectives; the model has no
# SM-contention term, so it could not say what the flag buys) and --tp-comm-overlap-cfg tuning.

# Extra argument groups other parts of the planner contribute (e.g. uneven pipeline layouts):
# each is called with (plan, model) and returns flags appended after the parallel sizes.
EXTRA_ARG_GROUPS: list[Callable[[Plan, ModelSpec], list[Arg]]] = []


def vocab_divisor(vocab: int, tp: int) -> int:
    """--make-vocab-size-divisible-by d: Megatron pads the vocabulary to a multiple of d·tp
    (megatron/core/tokenizers/utils/build_tokenizer.py, vocab_size_with_padding). The largest power of two <= 128
    (Megatron's default) that leaves the model's vocabulary unpadded; 1 if none does, which pads
    by fewer than tp rows."""
    for d in (128, 64, 32, 16, 8, 4, 2, 1):
        if vocab % (d * tp) == 0:
            return d
    return 1


def recompute_layers_per_chunk(plan: Plan, model: ModelSpec) -> int:
    """--recompute-num-layers: Megatron counts per virtual chunk (transformer_block.py, block
    method: the first k layers of each chunk); the Plan counts per pipeline stage."""
    per_chunk = max(plan_layout(plan, model.layers))  # the fullest virtual stage (issue 8: uneven)
    if recompute_per_chunk(plan) is not None:  # an explicit per-stage recompute (issue 8)
        return recompute_per_chunk(plan)
    # a count that covers the fullest rank is every layer, as the model costs it (PlanArrays): k//vpp
    # of every chunk would leave a rank of uneven chunks some (3 + 8 of 3 + 14 at k 17, vpp 2)
    if plan.recompute_num_layers is None or plan.recompute_num_layers >= fullest_rank_layers(plan, model.layers):
        return per_chunk
    return min(plan.recompute_num_layers // plan.vpp, per_chunk)


def attention_args(model: ModelSpec) -> list[Arg]:
    """The attention the model costs, beyond heads and groups: the head width when it is not
    hidden/heads (Qwen3, GPT-OSS), q/k norms, and multi-latent attention. Megatron names the MLA
    widths after the checkpoint's (arguments.py _add_mla_args): --qk-head-dim is the no-position
    part (DeepSeek's qk_nope_head_dim), --qk-pos-emb-head-dim the decoupled RoPE part."""
    a: list[Arg] = []
    if model.mla is not None:
        # Megatron's MLA uses YaRN RoPE; at --rotary-scaling-factor 1 (its default) YaRN is plain
        # RoPE (yarn_rotary_pos_embedding.py). The checkpoint's own scaling (DeepSeek-V3: factor
        # 40, mscale 1, mscale_all_dim 1, which Megatron-Bridge's recipe sets too) is launched
        # where the model has it: it also scales the softmax (multi_latent_attention.py).
        mla = model.mla
        a.append(("--multi-latent-attention", None))
        if mla.q_lora_rank is not None:  # Megatron's default None: queries not compressed
            a.append(("--q-lora-rank", str(mla.q_lora_rank)))
        a += [("--kv-lora-rank", str(mla.kv_lora_rank)), ("--qk-head-dim", str(mla.qk_nope_head_dim)),
              ("--qk-pos-emb-head-dim", str(mla.qk_rope_head_dim)), ("--v-head-dim", str(mla.v_head_dim))]
        for flag, value in (("--rotary-scaling-factor", mla.yarn_factor), ("--mscale", mla.mscale),
                            ("--mscale-all-dim", mla.mscale_all_dim)):
            if value is not None:
                a.append((flag, f"{value:g}"))
        # DeepSeek's MLA normalises its compressed query and KV latents (q_a_layernorm,
        # kv_a_layernorm); Megatron builds those norms only with --qk-layernorm
        # (gpt_layer_specs.py: the up-projections become LayerNormLinear)
        a.append(("--qk-layernorm", None))
        if model.hidden % model.heads:
            # validate_args asserts hidden % heads without --kv-channels; MLA's projections read
            # their own widths, so the value only stands for the per-head output (GLM-4.7-Flash:
            # hidden 2048 over 20 heads)
            a.append(("--kv-channels", str(mla.v_head_dim)))
    elif model.hidden % model.heads or model.head_dim != model.hidden // model.heads:
        # Megatron's default kv_channels is hidden // heads (arguments.py validate_args)
        a.append(("--kv-channels", str(model.head_dim)))
    if model.qk_l2_norm:
        a.append(("--qk-l2-norm", None))  # Llama 4: weightless L2 norm of each query and key head
    if model.no_rope_every is not None:
        a.append(("--no-rope-freq", str(model.no_rope_every)))  # Llama 4: every n-th layer NoPE
    if model.qk_norm and model.mla is None:
        a.append(("--qk-layernorm", None))  # Megatron applies --normalization to q and k heads
    return a


def moe_layer_pattern(model: ModelSpec) -> str:
    """--moe-layer-freq as Megatron's Python-list pattern (arguments.py moe_freq_type: 1 = MoE
    layer, 0 = dense): the model's leading dense layers, then MoE layers, every layer_step-th of
    them MoE where they interleave (Llama 4 Maverick: ([0,1]*24)), any dense rest at the end."""
    k, step = model.moe.first_dense_layers, model.moe.layer_step
    repeats, rest = divmod(model.layers - k, step)
    parts = [f"[0]*{k}"] if k else []
    parts.append(f"[1]*{repeats}" if step == 1 else f"[{','.join(['0'] * (step - 1) + ['1'])}]*{repeats}")
    if rest:
        parts.append(f"[0]*{rest}")
    return f"({'+'.join(parts)})"


def moe_args(model: ModelSpec, dispatcher: str = "alltoall", system: SystemSpec | None = None) -> list[Arg]:
    """The experts as the model costs them (empty for dense models); `dispatcher` is
    Plan.moe_dispatcher, `system` picks the flex dispatcher's backend."""
    moe = model.moe
    if moe is None:
        return []
    a: list[Arg] = [("--num-experts", str(moe.num_experts)), ("--moe-router-topk", str(moe.top_k)),
                    ("--moe-ffn-hidden-size", str(model.expert_ffn_hidden))]
    if moe.router_pre_softmax:  # the checkpoint's routing: softmax over all experts, not renormalised
        a.append(("--moe-router-pre-softmax", None))
    elif moe.top_k == 1 and moe.router_score == "softmax":
        # a softmax over the one chosen logit is 1 with zero gradient, so Megatron refuses top-1
        # softmax routing unless the softmax runs over all experts first (transformer_config.py:
        # "Please use --moe-router-pre-softmax when topk is 1"; Switch Transformer routing,
        # Fedus et al. 2021 §2.1). The router's arithmetic is not costed either way.
        a.append(("--moe-router-pre-softmax", None))
    if moe.apply_probs_on_input:  # Llama 4: the router score scales the expert's input
        a.append(("--moe-apply-probs-on-input", None))
    if model.dense_layers:
        a.append(("--moe-layer-freq", moe_layer_pattern(model)))
    if moe.shared_experts:
        # Megatron builds the shared experts as ONE MLP of the summed width (transformer_config.py
        # moe_shared_expert_intermediate_size); same weights and FLOPs as n MLPs of width w.
        a.append(("--moe-shared-expert-intermediate-size",
                  str(moe.shared_experts * model.shared_expert_ffn_hidden)))
        if moe.shared_expert_gate:  # Qwen2-MoE: sigmoid gate on the shared expert's output
            a.append(("--moe-shared-expert-gate", None))
    if moe.latent_size:
        # LatentMoE (Nemotron 3 Super): routed rows projected h -> latent and back (time.py)
        a.append(("--moe-latent-size", str(moe.latent_size)))
    # the router the model was trained with (not costed: MoESpec.router_score)
    if moe.router_score != "softmax":
        a.append(("--moe-router-score-function", moe.router_score))
    if moe.router_expert_bias:
        a.append(("--moe-router-enable-expert-bias", None))
    if moe.router_topk_scale is not None:
        a.append(("--moe-router-topk-scaling-factor", f"{moe.router_topk_scale:g}"))
    if moe.router_groups is not None:
        # group-limited routing (DeepSeek-V3 §3.2.2), which the dispatch traffic is costed with
        # (time.group_limited_remote_domains); TransformerConfig moe_router_num_groups / group_topk
        a += [("--moe-router-num-groups", str(moe.router_groups)),
              ("--moe-router-group-topk", str(moe.router_group_topk))]
    if moe.capacity_factor is not None:
        # Tokens over capacity are dropped by lowest router probability (Megatron's default
        # policy, emitted so it cannot change). No --moe-pad-expert-input-to-capacity: padding
        # would run capacity_factor x the top_k tokens the model costs through every expert.
        a += [("--moe-expert-capacity-factor", f"{moe.capacity_factor:g}"),
              ("--moe-token-drop-policy", "probs")]
    # The model costs an all-to-all dispatch and grouped expert GEMMs (time.py); Megatron's
    # defaults are the allgather dispatcher and one GEMM per expert.
    if dispatcher == "deepep":  # megatron-core 0.19: the flex dispatcher
        a += [("--moe-token-dispatcher-type", "flex"), ("--moe-flex-dispatcher-backend", flex_backend(system))]
    else:
        a.append(("--moe-token-dispatcher-type", "alltoall"))
    # The router is costed as fused (time.ROUTER_PASSES fp32 passes over tokens x experts): the
    # unfused PyTorch path ran at 48-240 GB/s of those bytes on an H100, launch-bound
    # (planner/data/h100_moe_kernels.csv), so the launch fuses it (TE >= 2.6 at run time, the
    # TE 2.10 the launches target), as NVIDIA's recipes do (bridge_recipe_knobs.yaml
    # moe_router_fusion); fp32 router logits as they do too.
    if system is None or grouped_gemm(system):  # before Ampere: one GEMM per expert
        a.append(("--moe-grouped-gemm", None))
    a += [("--moe-router-dtype", "fp32"), ("--moe-router-fusion", None)]
    # A load-balancing loss: Megatron's default aux-loss coefficient is 0, i.e. no balancing, and
    # learned routing then drifts from the balance the cost assumes (JobSpec.moe_load_imbalance).
    # 1e-2, the starting value Megatron's own --moe-aux-loss-coeff help recommends (arguments.py
    # 0.19.2); with the expert bias balancing, DeepSeek-V3's complementary sequence-wise loss at
    # α = 1e-4 (DeepSeek-V3 §2.1.2; Megatron-Bridge's DeepSeek-V3 provider). Its arithmetic is
    # negligible and not costed.
    # A model that names its coefficient (config.json router_aux_loss_coef) trains with it.
    a += [("--moe-router-load-balancing-type", "seq_aux_loss" if moe.router_expert_bias else "aux_loss"),
          ("--moe-aux-loss-coeff", f"{aux_loss_coeff(moe):g}")]
    return a


def aux_loss_coeff(moe) -> float:
    """The load-balancing loss coefficient a MoE launch trains with (`moe_args`)."""
    if moe.router_aux_loss_coeff is not None:
        return moe.router_aux_loss_coeff
    return 1e-4 if moe.router_expert_bias else 1e-2


def launched_dispatcher(plan: Plan) -> str:
    """The dispatcher the launch names for Plan.moe_dispatcher. Without an expert-parallel group
    (etp·ep = 1) no token leaves its rank and the cost has no all-to-all for either dispatcher
    (time.moe_dispatch_s), but Megatron's flex dispatcher asserts "DeepEP dispatcher requires
    TPxEP > 1" when it builds the MoE layer (moe/token_dispatcher.py MoEFlexTokenDispatcher,
    megatron-core 0.19.2): such a plan is launched with the alltoall dispatcher, which then only
    permutes locally."""
    return plan.moe_dispatcher if plan.expert_tp * plan.ep > 1 else "alltoall"


def flex_backend(system: SystemSpec | None) -> str:
    """The flex dispatcher's backend the cost's DeepEP/HybridEP dispatch runs on: DeepEP's
    training kernels split a node's 8 NVLink GPUs from the RDMA network and do not run on 4-GPU
    nodes (deepseek-ai/DeepEP issues 392, 579); on a multi-node NVLink domain (GB200/GB300 NVL72,
    4 GPUs a node) NVIDIA's recipes run HybridEP (Megatron-Bridge perf_recipes, e.g.
    qwen3_235b_a22b_pretrain_64gpu_gb200_fp8mx_config: moe_flex_dispatcher_backend 'hybridep';
    planner/data/bridge_recipe_knobs.yaml)."""
    if system is not None and (system.gpus_per_node < 8 or system.nvlink_domain_gpus > system.gpus_per_node):
        return "hybridep"
    return "deepep"


def cuda_max_connections(plan: Plan, arch_major: int) -> tuple[dict[str, str], list[str]]:
    """(exported env, unset env). Megatron-FSDP asserts CUDA_DEVICE_MAX_CONNECTIONS is unset or
    > 1 (arguments.py). The MoE all-to-all overlap wants more than one connection, so that the
    communication stream's kernels run beside the compute stream's (arguments.py's warning; the
    MoE ModelZoo's launch script sets 32 with the overlap on): 32, unless TP communication overlap
    runs before Blackwell, whose userbuffers need 1. Everything else runs with 1 (required with
    tp/cp > 1 before Blackwell, MA 2a, and what NVIDIA's launch scripts set)."""
    if plan.zero_stage >= 2:
        return {}, ["CUDA_DEVICE_MAX_CONNECTIONS"]
    if plan.moe_a2a_overlap and not (plan.tp_comm_overlap and arch_major < 10):
        return {"CUDA_DEVICE_MAX_CONNECTIONS": "32"}, []
    return {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}, []


def megatron_args(plan: Plan, model: ModelSpec, job: JobSpec, system: SystemSpec,
                  save_interval: int | None = None) -> MegatronLaunch:
    """The Megatron-LM flags, env and torchrun geometry for `plan`. It does not refuse plans:
    call `not_expressible` / `launch_refusals` first (and `validate_megatron_args` on the
    result). `save_interval`: iterations between checkpoints (`planner checkpoint`'s interval)."""
    a: list[Arg] = []

    def add(flag: str, value: object = None) -> None:
        a.append((flag, None if value is None else str(value)))

    # Model shape (MA 1) and vocabulary (the LM head the model costs).
    add("--num-layers", model.layers)
    add("--hidden-size", model.hidden)
    add("--ffn-hidden-size", model.ffn_hidden)
    add("--num-attention-heads", model.heads)
    if model.kv_groups < model.heads:
        add("--group-query-attention")  # MA 0.4: --num-query-groups is ignored without it
        add("--num-query-groups", model.kv_groups)
    add("--seq-length", model.seq_length)
    add("--max-position-embeddings", model.seq_length)
    if model.position_embedding == "rope":
        add("--position-embedding-type", "rope")
        if model.rope_scaling == "llama3":
            # Llama 3.x's long-context frequencies (rotary_pos_embedding.py _apply_scaling: low/high
            # frequency factors 1 and 4 over an original 8192 context, Llama 3.1's values)
            add("--use-rope-scaling")
            add("--rope-scaling-factor", f"{model.rope_scaling_factor or DEFAULT_ROPE_SCALING_FACTOR:g}")
        if model.rope_scaling == "linear":  # positions divided by the factor (position interpolation)
            add("--rotary-seq-len-interpolation-factor", int(model.rope_scaling_factor))
        if model.rope_scaling == "yarn":
            # costed as Megatron-Bridge runs YaRN: unfused RoPE (kernels.UNFUSED_ROPE_BYTES); the
            # launch runs that kernel path, with plain RoPE frequencies (YaRN's are not in the spec)
            add("--no-rope-fusion")
    elif model.position_embedding == "none":
        add("--position-embedding-type", "none")
    if model.activation == "swiglu" and model.activation_clamp is not None:
        # GPT-OSS's clamped gated activation, the path its eager clamp is costed on
        # (kernels.CLAMP_GLU_BYTES): Megatron-Core's quick-GeGLU with the linear half offset by 1
        # and both halves clamped at the limit (fusions/fused_bias_geglu.py)
        add("--quick-geglu")
        add("--glu-linear-offset", "1.0")
        add("--activation-func-clamp-value", f"{model.activation_clamp:g}")
    elif model.activation == "swiglu":
        add("--swiglu")
    elif model.activation == "squared_relu":
        add("--squared-relu")
    if model.rms_norm:  # the norm the cost runs (GPT-OSS: RMSNorm beside its biases)
        add("--normalization", "RMSNorm")
    if not model.biases:
        add("--disable-bias-linear")
    if model.attention_window is not None:
        # costed as full causal attention; launched so the trained model is the named one
        # (transformer/utils.py is_layer_window_attention: 1-based layer n is full when n % N == 0)
        add("--window-size", f"{model.attention_window},0")
        if model.window_full_every is not None:
            add("--window-attn-skip-freq", model.window_full_every)
    if model.attention_sinks:
        add("--softmax-type", "learnable")  # GPT-OSS's per-head sink logits
    if model.qkv_bias:
        add("--add-qkv-bias")  # Qwen2, GLM-4.5: the q/k/v projections keep theirs
    if model.rotary_percent != 1.0:
        add("--rotary-percent", model.rotary_percent)
    if model.rope_base is not None:
        add("--rotary-base", model.rope_base)
    if model.norm_epsilon is not None:
        add("--norm-epsilon", f"{model.norm_epsilon:g}")
    if not model.tied_embeddings:
        add("--untie-embeddings-and-output-weights")
    add("--vocab-size", model.vocab)
    add("--make-vocab-size-divisible-by", vocab_divisor(model.vocab, plan.tp))
    dropout = DROPOUT_PROBABILITY if model.dropout else 0.0
    add("--attention-dropout", f"{dropout:g}")
    add("--hidden-dropout", f"{dropout:g}")
    a.extend(attention_args(model))
    a.extend(moe_args(model, launched_dispatcher(plan), system))
    if model.mtp_layers:
        add("--mtp-num-layers", model.mtp_layers)  # DeepSeek-V3 §2.2 modules, costed in flops.py
        if model.mtp_shared_weights:  # one module's weights run at every depth (ModelSpec)
            add("--mtp-use-repeated-layer")
    if model.hybrid_pattern:
        a.extend(hybrid.hybrid_args(plan, model))

    # Parallelism (MA 3): DP is derived by Megatron from WORLD_SIZE, never emitted.
    add("--tensor-model-parallel-size", plan.tp)
    add("--pipeline-model-parallel-size", plan.pp)
    # vpp + layout (issue 8); a layout string names the MTP modules ('m' before 'L'): Megatron
    # asserts their count equals --mtp-num-layers (pipeline_parallel_layer_layout.py,
    # validate_layer_layout, megatron-core 0.19.2)
    for flag, value in pipeline_args(plan, model.layers, model.mtp_layers):
        if not (model.hybrid_pattern and flag in hybrid.LAYOUT_FLAGS):  # a hybrid's pattern holds its layout
            add(flag, value)
    if plan.cp > 1:
        add("--context-parallel-size", plan.cp)
    if model.moe is not None or plan.ep > 1:
        add("--expert-model-parallel-size", plan.ep)
        if plan.etp is not None:  # None = tp, Megatron's default
            add("--expert-tensor-parallel-size", plan.etp)
    sp = plan.sequence_parallel and plan.tp > 1  # MA 2a: SP at tp=1 is dropped by Megatron
    if sp:
        add("--sequence-parallel")
    for group in EXTRA_ARG_GROUPS:  # e.g. uneven pipeline layouts
        a.extend(group(plan, model))

    # Batch.
    add("--micro-batch-size", plan.micro_batch)
    add("--global-batch-size", plan.global_batch)

    # Recompute (MA 1, 3): block recomputes the first k layers of every virtual chunk.
    if plan.recompute == "selective":
        add("--recompute-granularity", "selective")
        if plan.recompute_modules is not None:  # None: Megatron's default, core_attn
            add("--recompute-modules", " ".join(plan.recompute_modules))
    elif plan.recompute == "full":
        add("--recompute-granularity", "full")
        add("--recompute-method", "block")
        add("--recompute-num-layers", recompute_layers_per_chunk(plan, model))

    # Optimizer sharding and DP overlap (MA 1, 2a). Megatron-FSDP (ZeRO-2/3) forces the overlap
    # on (megatron_fsdp.py); the flags are emitted so that the parsed arguments say so too.
    torch_fsdp2 = plan.dp_impl == "torch-fsdp2"
    fsdp = plan.zero_stage >= 2 and not torch_fsdp2
    if torch_fsdp2:
        add("--use-torch-fsdp2")
        add("--ckpt-format", "torch_dist")  # --use-torch-fsdp2 requires torch_dist or torch_dcp
        # arguments.py asserts FSDP2 runs without the fused wgrad accumulation into main_grad
        add("--no-gradient-accumulation-fusion")
        # Build the weights on the host: otherwise Transformer Engine allocates every layer on the
        # GPU (extensions/transformer_engine.py _get_extra_te_kwargs) and the whole unsharded model
        # sits there before fully_shard cuts it (training.py get_model skips .cuda() for FSDP2 only
        # with CPU initialization; FSDP2 then moves each layer's shards; its wrapper has no
        # meta-device path), a start-up peak the plan's memory never has (70B at tp 1: 141 GB)
        add("--use-cpu-initialization")
    if plan.zero_stage == 1:
        add("--use-distributed-optimizer")
    if fsdp:
        add("--use-megatron-fsdp")
        add("--data-parallel-sharding-strategy",
            "optim_grads_params" if plan.zero_stage == 3 else "optim_grads")
        add("--ckpt-format", "fsdp_dtensor")  # Megatron FSDP checkpoints only in this format
        if plan.zero_stage == 3:
            # ZeRO-3 keeps 1/dp of the weights: build them on the meta device and materialise the
            # shards, never the whole stage (otherwise the start-up peak is the unsharded model).
            add("--init-model-with-meta-device")
    # PyTorch FSDP2 overlaps its own per-layer gathers and reduce-scatters (prefetch); Megatron's
    # DDP overlap flags belong to its own buffers, and --overlap-param-gather is refused without
    # the distributed optimizer or Megatron-FSDP (arguments.py)
    if (plan.dp_comm_overlap or fsdp) and not torch_fsdp2:
        add("--overlap-grad-reduce")
        if plan.zero_stage == 1 or plan.zero_stage == 3:
            add("--overlap-param-gather")
    if plan.tp_comm_overlap and sp:
        add("--tp-comm-overlap")
    if plan.moe_a2a_overlap:
        # combined 1F1B: one microbatch's all-to-all behind another's compute (time.py); the
        # weight-gradient GEMMs are delayed to cover the backward dispatch, as NVIDIA's recipes do
        add("--overlap-moe-expert-parallel-comm")
        add("--delay-wgrad-compute")

    # Offload (MA 1, 2a, 2b).
    if plan.offload_activations > 0:
        k = cpu_offload_layers(plan, model)
        add("--cpu-offloading-num-layers", k)
    if plan.offload_optimizer > 0:
        add("--optimizer-cpu-offload")
        add("--optimizer-offload-fraction", f"{plan.offload_optimizer:g}")
    # TE's FusedAdam behind the precision-aware optimizer: needed by the CPU offload (MA 2a) and
    # what keeps Adam's moments in bf16 (JobSpec.adam_moments, the bytes the memory model counts)
    if plan.offload_optimizer > 0 or job.adam_moments == "bf16":
        add("--use-precision-aware-optimizer")
    if job.adam_moments == "bf16":
        add("--exp-avg-dtype", "bf16")
        add("--exp-avg-sq-dtype", "bf16")

    # Precision (MA 1, 3) and the switches the model costs.
    a.extend(PRECISION_FLAGS[job.dtype])
    if any(job.bf16_layers):
        # layers kept out of the low-precision recipe (megatron/core/fp8_utils.py
        # is_first_last_bf16_layer), as the model costs them
        add("--first-last-layers-bf16")
        add("--num-layers-at-start-in-bf16", job.bf16_layers[0])
        add("--num-layers-at-end-in-bf16", job.bf16_layers[1])
    files = {}
    if job.module_dtypes:  # a per-module recipe: the file Megatron reads it from, written beside the launch
        add("--te-precision-config-file", te_precision.FILE_NAME)
        files[te_precision.FILE_NAME] = te_precision.precision_file(job)
    if plan.fp8_param_gather:
        add("--fp8-param-gather")
        if job.dtype == "mxfp8" and not fsdp:
            # MXFP8 parameters cannot live in the contiguous parameter buffer, so without this the
            # distributed optimizer keeps a second one and Megatron warns of "significant additional
            # GPU memory" (core/optimizer/optimizer_config.py); the memory model costs 1 B per
            # weight and no such buffer. Megatron-Bridge's MXFP8 recipe sets both
            # (training/mixed_precision.py bf16_with_mxfp8_mixed). Megatron-FSDP turns it off.
            add("--reuse-grad-buf-for-mxfp8-param-ag")
    if plan.grad_reduce_in_bf16:
        add("--grad-reduce-in-bf16")
    elif job.bytes_per_param.grads == FP32_BYTES:
        # the fp32 gradients the memory and DP models cost (memory.grad_bytes_per_elem), where
        # Megatron would keep them otherwise: Megatron-FSDP's main gradients default to the
        # parameters' dtype ('auto': megatron_fsdp/param_and_grad_buffer.py
        # _resolve_group_grad_dtype; the communication follows them), and under --fp16 the DDP
        # buffer and its all-reduce are fp16 unless asked (training/arguments.py forces fp32
        # accumulation for --bf16 only)
        if fsdp:
            add("--megatron-fsdp-main-grads-dtype", "fp32")
        if job.dtype == "fp16" and not torch_fsdp2:
            add("--accumulate-allreduce-grads-in-fp32")
    if plan.cross_entropy_fusion:
        add("--cross-entropy-loss-fusion")
        add("--cross-entropy-fusion-impl", "native")  # 0.19.2 refuses 'te' (stability)
    # The attention the model costs: cuDNN fused attention (the measured curve) or, without
    # flash attention, the unfused kernel that stores the s² scores.
    add("--attention-backend", "fused" if job.flash_attention else "unfused")
    if job.full_iteration_cuda_graph:
        # The forward-backward replayed as one graph (what the model costs: no per-layer launch or
        # host time). Megatron requires the NaN check off with it (training/arguments.py).
        add("--cuda-graph-impl", "full_iteration")
        add("--no-check-for-nan-in-loss-and-grad")
    elif job.cuda_graph_modules:
        # per-layer graphs of the static modules this model has (enums.CudaGraphModule: mlp is a
        # dense layer's, moe_router / moe_preprocess a MoE layer's)
        has = {"attn": True, "mlp": has_dense_mlp_layers(model),
               "moe": model.moe is not None, "moe_router": model.moe is not None,
               "moe_preprocess": model.moe is not None, "mamba": model.mamba is not None}
        modules = [m for m in job.cuda_graph_modules if has[m]]
        if modules:
            add("--cuda-graph-impl", "transformer_engine")
            add("--cuda-graph-modules", " ".join(modules))
    add("--manual-gc")
    add("--manual-gc-interval", MANUAL_GC_INTERVAL)

    # Logging and checkpoints.
    add("--log-interval", LOG_INTERVAL)
    add("--log-throughput")
    if save_interval is not None:
        add("--save-interval", save_interval)

    env, unset_env = cuda_max_connections(plan, gpu_arch_major(system))
    gpus = plan.gpus
    notes = []
    if arch_is_assumed(system):  # fused attention, FP8 and the flex backend follow from it
        notes.append(f"{system.accelerator.name} is no NVIDIA product name the planner reads and its file gives no "
                     f"compute_capability: {gpu_arch_major(system)}.0 was assumed (set accelerator.compute_capability)")
    unstated = [(flag, default) for field, flag, default in (("rope_base", "rotary-base", DEFAULT_ROTARY_BASE),
                                                             ("norm_epsilon", "norm-epsilon", DEFAULT_NORM_EPSILON))
                if getattr(model, field) is None and (field != "rope_base" or model.position_embedding == "rope")]
    if model.rope_scaling == "llama3":  # the model spec has the factor, not the bands
        notes.append("Llama 3.x RoPE scaling is launched with Megatron's fixed frequency bands (low 1, high 4 over "
                     "8192 tokens: Llama 3.1's and 3.2's); a checkpoint with other bands (Llama 4 Scout's config: "
                     "1 and 1) trains other frequencies there")
    if unstated:  # numbers the cost does not read but the trained model does
        notes.append(f"the model spec gives no {' or '.join(flag for flag, _ in unstated)}: Megatron's "
                     f"default{'s' if len(unstated) > 1 else ''} "
                     f"({', '.join(f'--{flag} {default:g}' for flag, default in unstated)}) "
                     f"{'are' if len(unstated) > 1 else 'is'} launched; a checkpoint trained with others needs "
                     "them (rope_base / norm_epsilon in a model file; config.json's rope_theta / rms_norm_eps)")
    if plan.offload_weights > 0:
        notes.append("offload_weights is not expressible in Megatron-LM and was left out")
    if model.moe is not None:
        notes.append(f"routing balance: the cost assumes the busiest expert gets {job.moe_load_imbalance:g}x the "
                     "mean token load (1 = balanced, what NVIDIA's published MoE benchmarks force with "
                     "--moe-router-force-load-balancing, a benchmarking switch that ignores the router); the "
                     "launch trains the router with "
                     + ("its expert bias and a sequence-wise aux loss" if model.moe.router_expert_bias
                        else "an aux loss") + f" (--moe-aux-loss-coeff {aux_loss_coeff(model.moe):g})"
                     + ", so a step can run slower while routing is uneven: `planner plan --moe-imbalance 1.6` "
                     "costs that")
        notes.append("token permutation: the cost assumes Transformer Engine's fused permute/unpermute kernels; "
                     "add --moe-permute-fusion (TE >= 2.1), as NVIDIA's recipes do. It is not emitted because "
                     "Megatron's argument check refuses it where Transformer Engine is not installed; unfused, "
                     "the unpermute's scatter-add ran at ~600 GB/s on an H100 against the ~2,000 GB/s costed "
                     "(planner/data/h100_moe_kernels.csv)")
    if model.moe is not None and launched_dispatcher(plan) != plan.moe_dispatcher:
        notes.append(f"moe_dispatcher {plan.moe_dispatcher} is launched as alltoall: with expert tensor x expert "
                     f"parallel {plan.expert_tp}x{plan.ep} no token leaves its rank, and Megatron's flex dispatcher "
                     "refuses a group of one (DeepEP: 'requires TPxEP > 1'); the step costs the same either way")
    if attention := model.uncosted_attention():
        notes.append(f"attention: {attention}")
    if model.rope_scaling == "yarn":
        notes.append("YaRN RoPE is launched as plain RoPE without the fused kernel (--no-rope-fusion, the unfused "
                     "path that was costed); its frequency scaling is not part of the model spec: add "
                     "--position-embedding-type yarn and its parameters by hand")
    if job.full_iteration_cuda_graph:
        notes.append("full-iteration CUDA graph: Megatron requires --no-check-for-nan-in-loss-and-grad with it, "
                     "so a NaN loss or gradient is not caught by that check")
    if plan.offload_activations > 0:
        ran = offload_fraction_of_layers(cpu_offload_layers(plan, model), model.layers)
        if ran != plan.offload_activations:
            notes.append(f"offload_activations {plan.offload_activations:g} of {model.layers} layers runs as "
                         f"{cpu_offload_layers(plan, model)} whole layers ({ran:.4g})")
    return MegatronLaunch(args=a, env=env, unset_env=unset_env,
                          nnodes=math.ceil(gpus / system.gpus_per_node),
                          gpus_per_node=min(gpus, system.gpus_per_node), world_size=gpus, notes=notes,
                          files=files, entrypoint=hybrid.ENTRYPOINT if model.hybrid_pattern else ENTRYPOINT)
