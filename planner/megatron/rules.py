"""Megatron-LM's own rules on an argument list, with Megatron's own messages (MA 2a validate_args,
2b TransformerConfig, 2c runtime; shared/reference/megatron_args.md). A fast, dependency-free
re-implementation; the real parser (../shared/tools/megatron_check) checks it in the tests."""
from __future__ import annotations

import argparse
from typing import Iterable, Mapping

from planner.pipeline_layout import layout_string_stages
from planner.megatron.launch import ENTRYPOINT, MegatronLaunch, flag_words

class _ArgError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse would print and exit(2)
        raise _ArgError(message)


# Megatron-LM 0.19.2's defaults for what a launch leaves out (training/arguments.py --rotary-base,
# --rope-scaling-factor; transformer_config.py layernorm_epsilon)
DEFAULT_ROTARY_BASE = 10000
DEFAULT_NORM_EPSILON = 1e-5
DEFAULT_ROPE_SCALING_FACTOR = 8.0


def _build_parser() -> _Parser:
    # Megatron's parser is built with allow_abbrev=False: `--fp8` is NOT `--fp8-format`.
    p = _Parser(prog=ENTRYPOINT, allow_abbrev=False, add_help=False)
    flag = lambda name: p.add_argument(name, action="store_true")  # noqa: E731
    for name in ("--group-query-attention", "--swiglu", "--squared-relu", "--disable-bias-linear",
                 "--untie-embeddings-and-output-weights", "--sequence-parallel",
                 "--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather",
                 "--tp-comm-overlap", "--optimizer-cpu-offload", "--use-precision-aware-optimizer",
                 "--bf16", "--fp16", "--use-megatron-fsdp", "--use-torch-fsdp2", "--use-cpu-initialization",
                 "--mock-data", "--moe-grouped-gemm",
                 "--init-model-with-meta-device", "--fp8-param-gather", "--grad-reduce-in-bf16",
                 "--cross-entropy-loss-fusion", "--manual-gc", "--log-throughput",
                 "--multi-latent-attention", "--qk-layernorm", "--moe-shared-expert-overlap",
                 "--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split",
                 "--overlap-moe-expert-parallel-comm", "--delay-wgrad-compute", "--moe-router-pre-softmax",
                 "--moe-router-enable-expert-bias", "--use-rope-scaling",
                 "--first-last-layers-bf16", "--mtp-use-repeated-layer", "--moe-router-fusion",
                 "--accumulate-allreduce-grads-in-fp32", "--quick-geglu", "--add-qkv-bias",
                 "--qk-l2-norm", "--reuse-grad-buf-for-mxfp8-param-ag", "--moe-apply-probs-on-input",
                 "--moe-shared-expert-gate"):
        flag(name)
    p.add_argument("--no-overlap-p2p-communication", dest="overlap_p2p_comm", action="store_false")
    p.add_argument("--no-rope-fusion", dest="apply_rope_fusion", action="store_false")
    p.add_argument("--no-gradient-accumulation-fusion", dest="gradient_accumulation_fusion", action="store_false")
    p.add_argument("--no-check-for-nan-in-loss-and-grad", dest="check_for_nan_in_loss_and_grad",
                   action="store_false")
    ints = {"--num-layers": None, "--hidden-size": None, "--ffn-hidden-size": None,
            "--num-attention-heads": None, "--num-query-groups": 1, "--kv-channels": None,
            "--seq-length": None, "--max-position-embeddings": None, "--num-experts": None,
            "--moe-router-topk": 2, "--moe-ffn-hidden-size": None, "--no-rope-freq": None,
            "--rotary-seq-len-interpolation-factor": None, "--expert-model-parallel-size": 1,
            "--expert-tensor-parallel-size": None, "--tensor-model-parallel-size": 1,
            "--pipeline-model-parallel-size": 1, "--num-layers-per-virtual-pipeline-stage": None,
            "--num-virtual-stages-per-pipeline-rank": None,
            "--microbatch-group-size-per-virtual-pipeline-stage": None,
            "--decoder-first-pipeline-num-layers": None, "--decoder-last-pipeline-num-layers": None,
            "--context-parallel-size": 1, "--micro-batch-size": None, "--global-batch-size": None,
            "--recompute-num-layers": None, "--cpu-offloading-num-layers": 0, "--vocab-size": None,
            "--make-vocab-size-divisible-by": 128, "--manual-gc-interval": 0, "--log-interval": 100,
            "--save-interval": None, "--q-lora-rank": None, "--kv-lora-rank": 32, "--qk-head-dim": 128,
            "--qk-pos-emb-head-dim": 64, "--v-head-dim": 128, "--moe-shared-expert-intermediate-size": None,
            "--mtp-num-layers": None,
            # TransformerConfig fields (ArgumentGroupFactory); 1 is the dataclass default
            "--num-layers-at-start-in-bf16": 1, "--num-layers-at-end-in-bf16": 1,
            "--mamba-num-heads": None, "--mamba-head-dim": 64, "--mamba-state-dim": 128,
            "--mamba-num-groups": 8, "--moe-latent-size": None, "--moe-router-num-groups": None,
            "--moe-router-group-topk": None}
    for name, default in ints.items():
        p.add_argument(name, type=int, default=default)
    choices = {"--recompute-granularity": ("full", "selective"),
               "--recompute-method": ("uniform", "block"),
               "--normalization": ("LayerNorm", "RMSNorm"),
               "--position-embedding-type": ("learned_absolute", "rope", "yarn", "mrope", "relative",
                                             "none"),
               "--data-parallel-sharding-strategy": ("no_shard", "optim", "optim_grads",
                                                     "optim_grads_params"),
               "--fp8-format": ("e4m3", "hybrid"),
               "--fp8-recipe": ("tensorwise", "delayed", "mxfp8", "blockwise", "custom"),
               "--fp4-format": ("e2m1",), "--fp4-recipe": ("nvfp4", "custom"),
               "--moe-token-dispatcher-type": ("allgather", "alltoall", "flex"),
               "--moe-flex-dispatcher-backend": ("deepep", "hybridep", "ncclep"),
               "--moe-router-dtype": ("fp32", "fp64"),
               "--moe-token-drop-policy": ("probs", "position"),
               "--cross-entropy-fusion-impl": ("native", "te"),
               "--attention-backend": ("flash", "fused", "unfused", "local", "auto"),
               "--cuda-graph-impl": ("none", "local", "transformer_engine", "full_iteration"),
               "--exp-avg-dtype": ("fp32", "fp16", "bf16", "fp8"), "--exp-avg-sq-dtype": ("fp32", "fp16", "bf16", "fp8"),
               "--megatron-fsdp-main-grads-dtype": ("fp32", "bf16", "fp16", "auto")}
    for name, allowed in choices.items():
        p.add_argument(name, choices=allowed, default=None)
    p.add_argument("--optimizer-offload-fraction", type=float, default=1.0)
    p.add_argument("--moe-expert-capacity-factor", type=float, default=None)
    # arguments.py 0.19.2: one value per load-balancing type (nargs='+')
    p.add_argument("--moe-router-load-balancing-type", nargs="+", default=["aux_loss"],
                   choices=("aux_loss", "seq_aux_loss", "global_aux_loss", "sinkhorn", "quantile_balancing", "none"))
    p.add_argument("--moe-aux-loss-coeff", nargs="+", type=float, default=[0.0])
    p.add_argument("--moe-router-score-function", default="softmax", choices=("softmax", "sigmoid", "sqrtsoftplus"))
    p.add_argument("--moe-router-topk-scaling-factor", type=float, default=None)
    p.add_argument("--glu-linear-offset", type=float, default=0.0)
    p.add_argument("--rotary-percent", type=float, default=1.0)
    p.add_argument("--rotary-base", type=int, default=DEFAULT_ROTARY_BASE)
    p.add_argument("--rope-scaling-factor", type=float, default=DEFAULT_ROPE_SCALING_FACTOR)
    p.add_argument("--rotary-scaling-factor", type=float, default=1.0)  # MLA's YaRN (arguments.py _add_mla_args)
    p.add_argument("--mscale", type=float, default=1.0)
    p.add_argument("--mscale-all-dim", type=float, default=0.0)
    p.add_argument("--window-size", default=None)  # "W,0": Megatron's tuple_type
    p.add_argument("--window-attn-skip-freq", default=None)  # an int or a Python-list pattern
    p.add_argument("--softmax-type", default="vanilla", choices=("vanilla", "off-by-one", "learnable"))
    p.add_argument("--norm-epsilon", type=float, default=DEFAULT_NORM_EPSILON)
    p.add_argument("--activation-func-clamp-value", type=float, default=None)
    p.add_argument("--moe-layer-freq", default="1")  # an int or a Python-list pattern
    p.add_argument("--attention-dropout", type=float, default=0.1)
    p.add_argument("--hidden-dropout", type=float, default=0.1)
    # Free-form values (placeholders in the script may hold unexpanded "$VARS").
    for name in ("--pipeline-model-parallel-layout", "--ckpt-format", "--tokenizer-type",
                 "--tokenizer-model", "--split", "--train-iters", "--lr", "--save", "--load",
                 "--te-precision-config-file", "--hybrid-layer-pattern"):
        p.add_argument(name, default=None)
    p.add_argument("--data-path", nargs="*", default=None)
    p.add_argument("--recompute-modules", nargs="*", default=None)
    p.add_argument("--cuda-graph-modules", nargs="*", default=None)
    return p


_PARSER = _build_parser()

# Messages (MA sections given where each is checked).
MSG_VPP_ONE_OF = ("No more than one of the following arguments can be set at the same time: "
                  "--num-layers-per-virtual-pipeline-stage, --num-virtual-stages-per-pipeline-rank,"
                  "--pipeline-model-parallel-layout. ")
MSG_VPP_UNEVEN = ("please use --num-virtual-stages-per-pipeline-rank to specify virtual pipeline "
                  "parallel degree when enable uneven pipeline parallelism")
MSG_VPP_LAYERS_PP = "number of layers of the model must be divisible pipeline model parallel size"
MSG_VPP_LAYERS_STAGE = ("number of layers per pipeline stage must be divisible number of layers per "
                        "virtual pipeline stage")
MSG_LAYERS_PP = "Number of layers should be divisible by the pipeline-model-parallel size"
MSG_INTERLEAVED_PP = ("When interleaved schedule is used, pipeline-model-parallel size should be "
                      "greater than 1")
MSG_INTERLEAVED_PP_NO_OVERLAP = (
    "When interleaved schedule is used and p2p communication overlap is disabled, "
    "pipeline-model-parallel size should be greater than 2 to avoid having multiple "
    "p2p sends and recvs between same 2 ranks per communication batch")
MSG_PARAM_GATHER_DISTOPT = ("--overlap-param-gather only supported with distributed optimizer, "
                            "megatron fsdp, or dist_muon")
MSG_PARAM_GATHER_GRAD_REDUCE = "Must use --overlap-param-gather with --overlap-grad-reduce"
MSG_FP16_BF16 = "--fp16 and --bf16 are mutually exclusive (bare `assert not args.bf16` in Megatron)"
MSG_CP_SEQ = "seq-length should be a multiple of 2 * context-parallel-size if context-parallel-size > 1."
MSG_RECOMPUTE_SELECTIVE_METHOD = ("recompute method is not yet supported for selective recomputing "
                                  "granularity")
MSG_TP_COMM_OVERLAP = ("Tensor parallel communication/GEMM overlap can happen only when sequence "
                       "parallelism is enabled")
MSG_CUDA_MAX_CONN = ("Using tensor model parallelism or context parallelism require setting the "
                     "environment variable CUDA_DEVICE_MAX_CONNECTIONS to 1")
# Megatron-FSDP block of validate_args (the Torch-FSDP2 block words it differently)
MSG_FSDP_MAX_CONN = "FSDP requires CUDA_DEVICE_MAX_CONNECTIONS > 1 or unset."
MSG_EP_NEEDS_EXPERTS = "num_experts must be non None to use expert model parallelism"
MSG_EXPERTS_EP = "Number of experts should be a multiple of expert model parallel_size."
# core/transformer/transformer_config.py __post_init__ (0.19.2; softmax scores, not sinkhorn)
MSG_TOP1_PRE_SOFTMAX = "Please use --moe-router-pre-softmax when topk is 1."
MSG_EXPERT_BIAS_SCORE = ("Expert bias for aux-loss-free routing only supports 'sigmoid' and 'sqrtsoftplus' score "
                         "functions.")
MSG_OPT_OFFLOAD = ("The optimizer cpu offload must be used in conjunction with "
                   "`--use-precision-aware-optimizer`, as the hybrid device optimizer reuses the "
                   "code path of this flag.")
MSG_PRECISION_AWARE_DIST_OPT = "--use-precision-aware-optimizer only supported with distributed optimizer"
MSG_CPU_OFFLOAD_PP = "Currently there is no support for Pipeline parallelism with CPU offloading"
MSG_OPT_OFFLOAD_FP8_PARAM = ("When `--fp8-param-gather` is enabled, the optimizer cpu offload must be used in "
                             "conjunction with `--fp8-recipe delayed`.")
MSG_FP8_PARAM_GATHER = ("--fp8-param-gather only supported with distributed optimizer, torch fsdp2, "
                        "megatron fsdp, or inference mode")
MSG_REUSE_GRAD_BUF = "Reuse grad buffer only when keeping params in MXFP8."
MSG_FP4_FP8 = "--fp4-format and --fp8-format cannot be used simultaneously. Please choose one."
MSG_CE_TE = ("Transformer Engine cross entropy loss fusion is disabled due to stability issues. Use "
             "--cross-entropy-fusion-impl native, or omit --cross-entropy-loss-fusion.")
MSG_MOE_BIAS_ETP = "Bias in Moe is only supported when ETP==1"
MSG_GRAPH_DELAY_WGRAD_TE = "CUDA graph with delay_wgrad_compute requires TE version >= 2.12.0."
MSG_MLA_GQA = "Group query attention is mutually exclusive with multi latent attention."
# core/transformer/transformer_config.py (__post_init__), overlap_moe_expert_parallel_comm checks
MSG_A2A_VPP = ("If enabling EP A2A overlap, virtual_pipeline_model_parallel_size must be specified when "
               "pipeline_model_parallel_size > 1")
MSG_A2A_EP = "overlap_moe_expert_parallel_comm is only supported with expert model parallelism"
MSG_A2A_DISPATCHER = "overlap_moe_expert_parallel_comm is supported with alltoall/flex token dispatcher"
MSG_A2A_FULL = "disable full recomputation when enabling overlap_moe_expert_parallel_comm"
MSG_A2A_METHOD = "disable recomputation method when enabling overlap_moe_expert_parallel_comm"
MSG_A2A_PRECISION = "overlap_moe_expert_parallel_comm is only supported with bf16 or fp16 model"
MSG_A2A_MTP = "MTP supports at most one layer when enabling overlap_moe_expert_parallel_comm."
MSG_DELAY_WGRAD = "overlap_moe_expert_parallel_comm must be enabled when enabling delay_wgrad_compute"
# TransformerConfig.__post_init__ (transformer_config.py), selective recompute modules.
RECOMPUTE_MODULES_ALLOWED = ("core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts",
                             "gdn_norm_out")
MSG_MOE_ACT_GROUPED = "moe_act in recompute_modules is only supported with moe_grouped_gemm."
# GroupedGEMM kernels need Ampere or later (validate_args, megatron-core 0.19.2 arguments.py:
# `assert dc[0] >= 8`): before it the experts run one GEMM each (SequentialMLP).
GROUPED_GEMM_MIN_ARCH = 8
MSG_GROUPED_GEMM_ARCH = "Unsupported compute capability for GroupedGEMM kernels."
MSG_MLA_UP_PROJ = "mla_up_proj in recompute_modules is only supported with multi_latent_attention."
MSG_SHARED_EXPERTS_OVERLAP = "shared_experts recompute cannot work with --moe-shared-expert-overlap."
MSG_FP8_DELAYED_MODULES = "Delayed scaling does not support moe_act and layernorm recompute for fp8."
MSG_MOE_A2A_OVERLAP_MOE = "disable moe in recompute_modules when enabling overlap_moe_expert_parallel_comm"
MSG_CPU_OFFLOAD_RECOMPUTE = "CPU offloading does not work when activation recomputation is enabled"
MSG_BF16_LAYERS_DELAYED = "Delayed scaling does not support first / last layer in BF16."
MSG_FULL_ITER_NAN = ("--no-check-for-nan-in-loss-and-grad should be set with --cuda-graph-impl=full_iteration "
                     "for training.")


def _to_argv(args: Iterable[str] | Mapping[str, object] | MegatronLaunch) -> list[str]:
    if isinstance(args, MegatronLaunch):
        return args.argv()
    if isinstance(args, Mapping):
        argv: list[str] = []
        for key, value in args.items():
            flag = key if key.startswith("-") else "--" + key.replace("_", "-")
            if value is False:
                continue
            if value is None or value is True:
                argv.append(flag)
            elif isinstance(value, (list, tuple)):
                argv.extend([flag, *(str(v) for v in value)])
            else:
                argv.extend(flag_words(flag, str(value)))
        return argv
    argv = []
    for item in args:
        if isinstance(item, tuple):
            argv.extend(flag_words(item[0], None if item[1] is None else str(item[1])))
        else:
            argv.append(str(item))
    return argv


def parse_megatron_args(args) -> argparse.Namespace:
    """Parse with the supported flags; raises ValueError with argparse's message."""
    argv = _to_argv(args)
    try:
        ns, extras = _PARSER.parse_known_args(argv)
    except _ArgError as err:
        raise ValueError(str(err)) from None
    if extras:
        raise ValueError("unrecognized arguments: " + " ".join(extras))
    return ns


def validate_megatron_args(args, world_size: int, env: Mapping[str, str] | None = None,
                           gpu_arch_major: int = 9) -> list[str]:
    """Megatron's checks (MA 2a validate_args, 2b TransformerConfig, 2c runtime) on an argument
    list or {flag: value} dict. Returns the violated messages; empty means Megatron accepts it."""
    env = env or {}
    try:
        a = parse_megatron_args(args)
    except ValueError as err:  # argparse exits before any other check runs
        return [str(err)]
    errors: list[str] = []
    err = errors.append

    for name in ("num_layers", "hidden_size", "num_attention_heads", "max_position_embeddings"):
        if getattr(a, name) is None:  # MA 2a required args
            err(f"{name} argument is None")
    if a.save is not None and a.save_interval is None:  # training/arguments.py: asserted whenever --save is set
        err("--save needs --save-interval (args.save_interval is None)")
    if a.micro_batch_size is None:  # MA 2a (bare assert)
        err("micro_batch_size argument is None")
    if errors:
        return errors

    tp, pp, cp = a.tensor_model_parallel_size, a.pipeline_model_parallel_size, a.context_parallel_size
    layers = a.num_layers
    if a.hybrid_layer_pattern is not None:  # Megatron takes the count from the pattern, whatever --num-layers says
        layers = len(hybrid_main_pattern(a).replace("|", ""))

    # MA 2a: world size and DP; CP counts toward the model size.
    total_model_size = tp * pp * cp
    dp = None
    if world_size % total_model_size:
        err(f"world size ({world_size}) is not divisible by total_model_size ({total_model_size=})")
    else:
        dp = world_size // total_model_size

    # MA 2a / microbatch calculator: GBS % (mbs * dp).
    num_microbatches = None
    if dp is not None:
        gbs = a.global_batch_size if a.global_batch_size is not None else a.micro_batch_size * dp
        mbs_dp = a.micro_batch_size * dp
        if gbs % mbs_dp:
            err(f"global batch size ({gbs}) is not divisible by micro batch size "
                f"({a.micro_batch_size}) times data parallel size ({dp})")
        else:
            num_microbatches = gbs // mbs_dp

    # MA 2a: virtual pipeline.
    vpp_sources = [a.num_layers_per_virtual_pipeline_stage, a.num_virtual_stages_per_pipeline_rank,
                   a.pipeline_model_parallel_layout]
    uneven = (a.decoder_first_pipeline_num_layers is not None
              or a.decoder_last_pipeline_num_layers is not None
              or a.account_for_embedding_in_pipeline_split or a.account_for_loss_in_pipeline_split)
    vpp = None
    if a.hybrid_layer_pattern is not None:  # the pattern's '|' segments set the layout and vpp
        errors.extend(hybrid_pattern_errors(a, pp))
        segments = hybrid_main_pattern(a).count("|") + 1
        vpp = segments // pp if segments > pp and segments % pp == 0 else None
    elif sum(v is not None for v in vpp_sources) > 1:
        err(MSG_VPP_ONE_OF)
    elif a.pipeline_model_parallel_layout is not None:
        vpp = layout_string_stages(a.pipeline_model_parallel_layout) // pp  # (issue 8)
    elif a.num_layers_per_virtual_pipeline_stage is not None:
        if uneven:
            err(MSG_VPP_UNEVEN)
        elif layers % pp:
            err(MSG_VPP_LAYERS_PP)
        elif (layers // pp) % a.num_layers_per_virtual_pipeline_stage:
            err(MSG_VPP_LAYERS_STAGE)
        else:
            vpp = (layers // pp) // a.num_layers_per_virtual_pipeline_stage
    elif a.num_virtual_stages_per_pipeline_rank is not None:
        vpp = a.num_virtual_stages_per_pipeline_rank
        # MA 2a leaves layers % (pp*vpp) to TransformerConfig / layout code.
        if not uneven and layers % (pp * vpp):
            err(f"number of layers ({layers}) must be divisible by pipeline-model-parallel size "
                f"times virtual stages per pipeline rank ({pp}*{vpp})")
    elif not uneven and layers % pp:
        err(MSG_LAYERS_PP)
    if vpp == 1:  # MA 2a: VPP == 1 is normalised to None
        vpp = None
    if vpp is not None:
        if a.overlap_p2p_comm and pp <= 1:
            err(MSG_INTERLEAVED_PP)
        elif not a.overlap_p2p_comm and pp <= 2:
            err(MSG_INTERLEAVED_PP_NO_OVERLAP)
        # MA 2c: interleaved schedule at run time; N defaults to PP.
        if pp > 1 and num_microbatches is not None:
            n = a.microbatch_group_size_per_virtual_pipeline_stage or pp
            if n > num_microbatches or n < pp:
                err("The number of contiguous micro-batches in a virtual pipeline stage"
                    f"should range in [PP={pp} , M={num_microbatches}]")
            else:
                final = num_microbatches % n
                if 0 < final < pp:
                    err("The remainder of M (the total micro-batches) divided by N (number of "
                        "contiguous micro-batches in a virtual pipeline stage) should be 0, "
                        "or larger than or equal to the pipeline-parallel size, but it is "
                        f"{final}. Otherwise, it introduces dependency bubbles in the pipeline "
                        "and reduces throughput.")

    # MA 2a: DP overlap.
    if a.overlap_param_gather:
        if not (a.use_distributed_optimizer or a.use_megatron_fsdp):
            err(MSG_PARAM_GATHER_DISTOPT)
        if not a.overlap_grad_reduce:
            err(MSG_PARAM_GATHER_GRAD_REDUCE)

    # arguments.py (validate_args, --use-torch-fsdp2 block)
    if a.use_torch_fsdp2:
        for broken, msg in ((a.pipeline_model_parallel_size != 1,
                             "--use-torch-fsdp2 is not supported with pipeline parallelism"),
                            (a.expert_model_parallel_size != 1,
                             "--use-torch-fsdp2 is not supported with expert parallelism"),
                            (a.use_distributed_optimizer,
                             "--use-torch-fsdp2 is not supported with MCore's distributed optimizer"),
                            (a.gradient_accumulation_fusion,
                             "--use-torch-fsdp2 is not supported with gradient accumulation fusion"),
                            (a.ckpt_format not in ("torch_dist", "torch_dcp"),
                             "--use-torch-fsdp2 requires --ckpt-format torch_dist or torch_dcp"),
                            (not a.untie_embeddings_and_output_weights,
                             "--use-torch-fsdp2 requires --untie-embeddings-and-output-weights"),
                            (a.fp16, "--use-torch-fsdp2 not supported with fp16 yet"),
                            (env.get("CUDA_DEVICE_MAX_CONNECTIONS") == "1",
                             "FSDP always requires CUDA_DEVICE_MAX_CONNECTIONS value large than one")):
            if broken:
                err(msg)

    # arguments.py: FP8 parameters need a sharded optimizer; FP4 and FP8 exclude each other;
    # the TE cross-entropy kernel is refused in 0.19.2.
    if a.fp8_param_gather and not (a.use_distributed_optimizer or a.use_megatron_fsdp or a.use_torch_fsdp2):
        err(MSG_FP8_PARAM_GATHER)
    # core/distributed/distributed_data_parallel_config.py __post_init__: the grad buffer is
    # reused only for parameters kept in MXFP8 (Megatron-FSDP turns the flag off first)
    if a.reuse_grad_buf_for_mxfp8_param_ag and not a.use_megatron_fsdp and not a.fp8_param_gather:
        err(MSG_REUSE_GRAD_BUF)
    if a.fp4_format is not None and a.fp8_format is not None:
        err(MSG_FP4_FP8)
    if a.cross_entropy_loss_fusion and a.cross_entropy_fusion_impl == "te":
        err(MSG_CE_TE)

    # MA 2a: fp16 and bf16 are mutually exclusive.
    if a.fp16 and a.bf16:
        err(MSG_FP16_BF16)

    # arguments.py: MLA has its own key/value compression, no query groups.
    if a.multi_latent_attention and a.group_query_attention:
        err(MSG_MLA_GQA)

    # MA 2a: heads and hidden (bare assert, only without --kv-channels).
    if a.kv_channels is None and a.hidden_size % a.num_attention_heads:
        err(f"hidden_size ({a.hidden_size}) must be divisible by num_attention_heads "
            f"({a.num_attention_heads}) (bare assert in Megatron)")

    # MA 2a: CP and sequence length; positions.
    if a.seq_length is not None and cp > 1 and a.seq_length % (2 * cp):
        err(MSG_CP_SEQ)
    if a.seq_length is not None and a.max_position_embeddings < a.seq_length:
        err(f"max_position_embeddings ({a.max_position_embeddings}) must be greater than or equal "
            f"to seq_length ({a.seq_length}).")

    # MA 2a: recompute.
    if a.recompute_granularity == "selective" and a.recompute_method is not None:
        err(MSG_RECOMPUTE_SELECTIVE_METHOD)

    # MA 2a: SP with tp == 1 is silently dropped, then TP comm overlap needs SP.
    sequence_parallel = a.sequence_parallel and tp > 1
    if a.tp_comm_overlap and not sequence_parallel:
        err(MSG_TP_COMM_OVERLAP)

    if a.moe_grouped_gemm and gpu_arch_major < GROUPED_GEMM_MIN_ARCH:
        err(MSG_GROUPED_GEMM_ARCH)
    # MA 2a: CUDA_DEVICE_MAX_CONNECTIONS before Blackwell, unless FSDP.
    # (arguments.py: with --overlap-moe-expert-parallel-comm it only warns)
    if (tp > 1 or cp > 1) and gpu_arch_major < 10 and not (a.use_megatron_fsdp or a.use_torch_fsdp2) \
            and not a.overlap_moe_expert_parallel_comm:
        if env.get("CUDA_DEVICE_MAX_CONNECTIONS") != "1":
            err(MSG_CUDA_MAX_CONN)
    # Megatron-FSDP asserts the opposite (validate_args, Megatron FSDP block; not in MA).
    if a.use_megatron_fsdp and env.get("CUDA_DEVICE_MAX_CONNECTIONS") == "1":
        err(MSG_FSDP_MAX_CONN)

    # MA 2a: MoE.
    ep = a.expert_model_parallel_size
    if ep > 1:
        if a.num_experts is None:
            err(MSG_EP_NEEDS_EXPERTS)
        elif a.num_experts % ep:
            err(MSG_EXPERTS_EP)
    # transformer_config.py: top-1 softmax routing needs the softmax over all experts first (a
    # sinkhorn balancer aside); the expert bias balances sigmoid-like scores only
    if a.num_experts is not None and a.moe_router_topk == 1 and a.moe_router_score_function == "softmax" \
            and not a.moe_router_pre_softmax and "sinkhorn" not in a.moe_router_load_balancing_type:
        err(MSG_TOP1_PRE_SOFTMAX)
    if a.moe_router_enable_expert_bias and a.moe_router_score_function not in ("sigmoid", "sqrtsoftplus"):
        err(MSG_EXPERT_BIAS_SCORE)
    # transformer_config.py __post_init__ (0.19.2) and moe/experts.py
    if a.no_rope_freq and a.num_layers and a.num_layers % a.no_rope_freq:
        err(f"no_rope_freq={a.no_rope_freq} should be divisible by num_layers={a.num_layers}.")
    if a.moe_apply_probs_on_input and a.num_experts and a.moe_router_topk != 1:
        err("`moe_apply_probs_on_input` only works with `moe_router_topk`=1.")

    # core/transformer/transformer_config.py __post_init__ (0.19.2), under FP8 only: bf16 layers
    # are refused with delayed scaling and each count is capped at the layers per stage.
    if a.first_last_layers_bf16 and a.fp8_format:
        if a.fp8_recipe in (None, "delayed"):
            err(MSG_BF16_LAYERS_DELAYED)
        per_stage = (a.num_layers or 0) // (a.pipeline_model_parallel_size or 1)
        for name in ("num_layers_at_start_in_bf16", "num_layers_at_end_in_bf16"):
            if not 0 <= getattr(a, name) <= per_stage:
                err(f"{name} ({getattr(a, name)}) must be between 0 and number of layers per pipeline "
                    f"stage ({per_stage}).")

    # MA 2a: optimizer CPU offload.
    if a.optimizer_cpu_offload and not a.use_precision_aware_optimizer:
        err(MSG_OPT_OFFLOAD)
    # arguments.py (0.19.2): the hybrid device optimizer keeps FP8 parameters only under delayed
    # scaling
    if a.optimizer_cpu_offload and a.fp8_param_gather and a.fp8_recipe not in (None, "delayed"):
        err(MSG_OPT_OFFLOAD_FP8_PARAM)
    # core/optimizer/optimizer_config.py __post_init__ (0.19.2): the precision-aware optimizer
    # runs only on the distributed optimizer, which Megatron-FSDP turns on (arguments.py).
    if a.use_precision_aware_optimizer and not (a.use_distributed_optimizer or a.use_megatron_fsdp):
        err(MSG_PRECISION_AWARE_DIST_OPT)

    # MA 2b: TransformerConfig.
    if a.num_attention_heads % tp:
        err(f"num_attention_heads ({a.num_attention_heads}) must be a multiple of "
            f"tensor_model_parallel_size ({tp}).")
    if a.group_query_attention:  # MA 0.4: the groups only count with --group-query-attention
        g = a.num_query_groups
        if g % tp and tp % g:
            err(f"num_query_groups ({g}) must be a multiple or divisor of "
                f"tensor_model_parallel_size ({tp}).")
    if a.cpu_offloading_num_layers > 0:  # MA 2a: this turns cpu_offloading on
        if a.cpu_offloading_num_layers >= layers:
            err(f"CPU offloading can be done only for layers less than {layers}")
        if pp > 1:
            err(MSG_CPU_OFFLOAD_PP)
        if a.recompute_granularity is not None:
            err(MSG_CPU_OFFLOAD_RECOMPUTE)
    g = a.recompute_granularity
    if g == "full" and a.recompute_method is None:
        err(f'Using recompute_granularity: {g} so recompute_method must be "block" or "uniform"')
    if g == "full" and a.recompute_num_layers is None:
        err(f"When using recompute_granularity: {g} recompute_num_layers must be between "
            f"1 and num_layers_per_pipeline_rank: {layers // pp}")
    elif g == "selective" and a.recompute_num_layers is not None:
        err(f"When using recompute_granularity: {g} recompute_num_layers must be None.")
    if g == "selective":
        errors.extend(recompute_module_errors(a))

    # transformer_config.py: the expert all-to-all overlap (combined 1F1B schedule).
    if a.overlap_moe_expert_parallel_comm:
        if pp > 1 and (vpp or 1) < 2:  # vpp as derived above (flags or layout string)
            err(MSG_A2A_VPP)
        if ep <= 1:
            err(MSG_A2A_EP)
        if a.moe_token_dispatcher_type not in ("alltoall", "flex"):
            err(MSG_A2A_DISPATCHER)
        if g == "full":
            err(MSG_A2A_FULL)
        if a.recompute_method is not None:
            err(MSG_A2A_METHOD)
        if not (a.bf16 or a.fp16):
            err(MSG_A2A_PRECISION)
        if (a.mtp_num_layers or 0) > 1:
            err(MSG_A2A_MTP)
    if a.delay_wgrad_compute and not a.overlap_moe_expert_parallel_comm:
        err(MSG_DELAY_WGRAD)
    # MA 2a: delayed weight gradients inside a per-layer graph (attention's, or the router's with
    # an un-overlapped shared expert) need Transformer Engine 2.12; the launches target
    # megatron-core 0.19.2 with TE 2.10, what ../shared/tools/megatron_check emulates
    graphed = set(a.cuda_graph_modules or ())
    if a.delay_wgrad_compute and a.overlap_grad_reduce and (
            "attn" in graphed or ("moe_router" in graphed and a.moe_shared_expert_intermediate_size is not None
                                  and not a.moe_shared_expert_overlap)):
        err(MSG_GRAPH_DELAY_WGRAD_TE)
    # MA 2a; fp16 with dynamic loss scaling has turned the NaN check off before this assert
    if a.cuda_graph_impl == "full_iteration" and a.check_for_nan_in_loss_and_grad and not a.fp16:
        err(MSG_FULL_ITER_NAN)

    # MA 2c: expert grid (etp defaults to tp).
    etp = a.expert_tensor_parallel_size or tp
    if a.num_experts is not None and not a.disable_bias_linear and etp != 1:  # transformer_config.py
        err(MSG_MOE_BIAS_ETP)
    grid = etp * ep * pp
    if world_size % grid:
        err(f"world_size ({world_size}) is not divisible by expert_tensor_model_pipeline_parallel "
            f"size ({grid})")
    return errors


# megatron-core 0.19.2 training/arguments.py, validate_args on --hybrid-layer-pattern.
MSG_HYBRID_LAYOUT_FLAGS = {
    "pipeline_model_parallel_layout": "--pipeline-model-parallel-layout should not be used with "
                                      "--hybrid-layer-pattern. Pipeline stage layout is defined by | "
                                      "separators in the pattern.",
    "num_virtual_stages_per_pipeline_rank": "--num-virtual-stages-per-pipeline-rank should not be used with "
                                            "--hybrid-layer-pattern. Virtual pipeline stages are derived from "
                                            "the number of | segments in the pattern.",
    "account_for_embedding_in_pipeline_split": "--account-for-embedding-in-pipeline-split should not be used "
                                               "with --hybrid-layer-pattern. Pipeline stage layout is defined "
                                               "by | separators in the pattern.",
    "account_for_loss_in_pipeline_split": "--account-for-loss-in-pipeline-split should not be used with "
                                          "--hybrid-layer-pattern. Pipeline stage layout is defined by | "
                                          "separators in the pattern."}
HYBRID_BLOCKS = "MG*D+-E"  # hybrid_layer_allocation.Symbols.VALID_LAYERS


def hybrid_main_pattern(a: argparse.Namespace) -> str:
    """The decoder part of --hybrid-layer-pattern (before the first '/': MTP depths follow)."""
    return a.hybrid_layer_pattern.split("/")[0]


def hybrid_pattern_errors(a: argparse.Namespace, pp: int) -> list[str]:
    """Megatron's checks on a hybrid layer pattern: valid block symbols, no layout flag beside
    it, and '|' segments a multiple of pp (hybrid_layer_allocation.py, arguments.py)."""
    out = [msg for field, msg in MSG_HYBRID_LAYOUT_FLAGS.items() if getattr(a, field)]
    main = hybrid_main_pattern(a)
    bad = sorted(set(main.replace("|", "")) - set(HYBRID_BLOCKS))
    if bad:
        out.append(f"In hybrid layer pattern, {bad[0]!r} is not one of {sorted(HYBRID_BLOCKS)}")
    segments = main.count("|") + 1
    if segments > 1 and segments % pp:
        out.append("The number of hybrid pipeline segments described by --hybrid-layer-pattern must be "
                   "evenly divisible by --pipeline-model-parallel-size. "
                   f"Got {segments} segments and {pp} pipeline parallel size.")
    return out


def recompute_module_errors(a: argparse.Namespace) -> list[str]:
    """TransformerConfig's checks of --recompute-modules under selective granularity (megatron-core
    0.19 transformer_config.py; None means ["core_attn"]), with its messages."""
    modules = a.recompute_modules if a.recompute_modules is not None else ["core_attn"]
    errors = []
    invalid = set(modules) - set(RECOMPUTE_MODULES_ALLOWED)
    if invalid:
        errors.append(f"Invalid choices for recompute_modules: {invalid}. "
                      f"Allowed modules are: {set(RECOMPUTE_MODULES_ALLOWED)}")
    if "moe_act" in modules and not a.moe_grouped_gemm:
        errors.append(MSG_MOE_ACT_GROUPED)
    if "mla_up_proj" in modules and not a.multi_latent_attention:
        errors.append(MSG_MLA_UP_PROJ)
    if "shared_experts" in modules and a.moe_shared_expert_intermediate_size is not None \
            and a.moe_shared_expert_overlap:
        errors.append(MSG_SHARED_EXPERTS_OVERLAP)
    if a.fp8_format is not None and a.fp8_recipe in (None, "delayed") and {"moe_act", "layernorm"} & set(modules):
        errors.append(MSG_FP8_DELAYED_MODULES)  # --fp8-recipe defaults to delayed
    if a.overlap_moe_expert_parallel_comm and "moe" in modules:
        errors.append(MSG_MOE_A2A_OVERLAP_MOE)
    return errors


def validate_launch(launch: MegatronLaunch, gpu_arch_major: int = 9) -> list[str]:
    return validate_megatron_args(launch.argv(), launch.world_size, launch.env, gpu_arch_major)

