"""What a plan IS (every knob) and what the job asks for (batch, dtype, pins, forbids)."""
from __future__ import annotations

import numbers
from pathlib import Path
from typing import Annotated, Literal, get_args

from pydantic import (BaseModel, ConfigDict, Field, NonNegativeFloat, NonNegativeInt, PositiveInt, ValidationError,
                      field_validator, model_validator)

from hardware.errors import closest_name, finite_number, in_range, kind_text, refuse_loose_types, SpecError, one_line, read_yaml_mapping, shortened

Recompute = Literal["none", "selective", "full"]
RECOMPUTE_CODES: dict[str, int] = {"none": 0, "selective": 1, "full": 2}
# Megatron-Core's selective-recompute modules (--recompute-modules; megatron-core 0.19
# transformer/transformer_config.py, `allowed_modules`; gdn_norm_out is left out: it needs a
# gated-delta-net attention no ModelSpec describes). Bit i of a module mask is module i.
# core_attn is Megatron's default ("selective" alone); planner/analytical/recompute.py says what
# each frees and costs, planner/megatron/rules.py which model features each needs.
RECOMPUTE_MODULES: tuple[str, ...] = ("core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe",
                                      "shared_experts")
RECOMPUTE_MODULE_BITS: dict[str, int] = {name: 1 << i for i, name in enumerate(RECOMPUTE_MODULES)}
DEFAULT_RECOMPUTE_MODULES: tuple[str, ...] = ("core_attn",)


def recompute_modules_mask(names) -> int:
    """Bit mask of module names (None = Megatron's default, core_attn)."""
    return sum(RECOMPUTE_MODULE_BITS[n] for n in set(names or DEFAULT_RECOMPUTE_MODULES))


def recompute_modules_from_mask(mask: int) -> tuple[str, ...]:
    """Module names of a mask, sorted (the Plan field's canonical order)."""
    return tuple(sorted(n for n, bit in RECOMPUTE_MODULE_BITS.items() if int(mask) & bit))


def parse_recompute_modules(value) -> tuple[str, ...] | None:
    """A module list from YAML / the CLI ("moe_act layernorm", "moe_act,layernorm" or a list) as
    the Plan field: sorted, without duplicates, None for Megatron's default (core_attn only).
    Unknown or missing names: ValueError naming the allowed ones."""
    if value is None:
        return None
    if isinstance(value, str):
        value = value.replace(",", " ").split()
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"expected module names; allowed: {', '.join(RECOMPUTE_MODULES)}")
    names = tuple(sorted(set(value)))
    unknown = [n for n in names if n not in RECOMPUTE_MODULE_BITS]
    if unknown or not names:
        what = f"unknown {shortened(unknown[0])!r}" if unknown else "names no module"
        raise ValueError(f"{what}; allowed: {', '.join(RECOMPUTE_MODULES)}")  # the field is named by one_line
    return None if names == DEFAULT_RECOMPUTE_MODULES else names


def applicable_recompute_modules(model) -> dict[str, str | None]:
    """Each module -> None when recomputing it does something for `model` (a ModelSpec), else why
    not. Megatron-Core's layer spec (models/gpt/gpt_layer_specs.py, Transformer Engine) and
    transformer_config.py: moe_act, moe and shared_experts act on MoE layers (shared_experts only
    with shared experts); mla_up_proj needs MLA (Megatron refuses it otherwise); layernorm acts on
    the norms that are modules of their own, MLA's input norm and MoE layers' pre-MLP norm (the
    others are fused into their GEMMs); mlp on dense (non-MoE) layers."""
    moe = model.moe is not None
    return {
        "core_attn": None,
        "moe_act": None if moe else "needs a MoE model",
        "layernorm": None if moe or model.mla is not None else
        "needs MLA or MoE layers (the other norms are fused into their GEMMs)",
        "mla_up_proj": None if model.mla is not None else "needs multi-latent attention (MLA)",
        "mlp": None if model.dense_layers > 0 else "needs dense (non-MoE) layers",
        "moe": None if moe else "needs a MoE model",
        "shared_experts": None if moe and model.moe.shared_experts else "needs shared experts",
    }


def check_recompute_modules(plan: "Plan", model) -> None:
    """SpecError (one line, naming the modules that apply) when the plan recomputes a module that
    does nothing for this model."""
    if plan.recompute != "selective" or plan.recompute_modules is None:
        return
    why = applicable_recompute_modules(model)
    for name in plan.recompute_modules:
        if why[name] is not None:
            allowed = ", ".join(n for n in RECOMPUTE_MODULES if why[n] is None)
            raise SpecError(f"recompute_modules: {name} {why[name]}; allowed for {model.name}: {allowed}")

# fp8 = FP8 with delayed scaling (Transformer Engine DelayedScaling, hybrid E4M3/E5M2); fp8-cs = FP8
# with per-tensor current scaling (Float8CurrentScaling); fp8-block = FP8 with DeepSeek-V3's block
# scales (Float8BlockScaling: 1x128 activation / 128x128 weight tiles, fp32 scales; Megatron
# --fp8-recipe blockwise); mxfp8 = block-scaled FP8 (MXFP8BlockScaling,
# 32-element E8M0 scales, Blackwell); nvfp4 = FP4 E2M1 with 16-element block scales (NVFP4BlockScaling,
# Blackwell). planner/analytical/precision.py says which GEMMs run in them and what their scaling
# passes cost; planner/megatron/emit.py maps them to Megatron flags.
ComputeDtype = Literal["bf16", "fp16", "fp8", "fp8-cs", "fp8-block", "mxfp8", "nvfp4"]
COMPUTE_DTYPES: tuple[str, ...] = ("bf16", "fp16", "fp8", "fp8-cs", "fp8-block", "mxfp8", "nvfp4")
# Modules a per-module quantization recipe may run in another dtype than the job's (JobSpec.module_dtypes):
# attention (its QKV and output projections), LatentMoE's h<->latent projections, a Mamba mixer's
# output projection, and the MTP module as a whole.
ModuleGroup = Literal["attention", "latent_proj", "mamba_out_proj", "mtp"]
MODULE_GROUPS: tuple[str, ...] = get_args(ModuleGroup)
ModuleDtype = Literal["bf16", "fp8-cs", "fp8-block", "mxfp8", "nvfp4"]
MODULE_DTYPES: tuple[str, ...] = get_args(ModuleDtype)
# Who implements sharded data parallelism (ZeRO stage 2/3); the stage says what is sharded.
# "megatron": Megatron-Core (distributed optimizer for ZeRO-1, Megatron-FSDP for 2/3);
# "torch-fsdp2": PyTorch FSDP2 (Megatron --use-torch-fsdp2, torchtitan); "deepspeed": DeepSpeed ZeRO.
DpImpl = Literal["megatron", "torch-fsdp2", "deepspeed"]
DP_IMPL_CODES: dict[str, int] = {"megatron": 0, "torch-fsdp2": 1, "deepspeed": 2}
# distinct layouts one search returns (planner.search.plan's top_k, `planner plan --top`)
MAX_TOP_K = 1000
# the CP-SAT time limit a search may be given (planner.search.plan's time_limit_s, `planner sweep
# --time-limit` per grid point): a day
MAX_TIME_LIMIT_S = 86400
# sequences per step, the cap of --global-batch and of a plan file's global_batch (README "Limits";
# Llama 3 405B used 2,048 sequences of 8K)
MAX_GLOBAL_BATCH = 1 << 20
KernelStack = Literal["te", "torch-eager", "torch-compile"]
# The loss kernel (planner/analytical/kernels.py): "fp32" softmax cross-entropy over fp32 logits
# (Megatron's vocab-parallel loss, torch F.cross_entropy on .float() logits); "flash-attn" the
# flash-attn package's fused cross-entropy kernel on the 16-bit logits (llm-foundry MPT's default).
LossKernel = Literal["fp32", "flash-attn"]
KERNEL_STACKS: tuple[str, ...] = ("te", "torch-eager", "torch-compile")
# MoE token dispatcher (Megatron --moe-token-dispatcher-type): "alltoall" sends one copy per
# routed expert; "deepep" (flex dispatcher with DeepEP) sends a token once per remote NVLink
# domain and fans it out over NVLink there.
MoeDispatcher = Literal["alltoall", "deepep"]
CudaGraphModuleName = Literal["attn", "mlp", "moe", "moe_router", "moe_preprocess", "mamba"]
MOE_DISPATCHER_CODES: dict[str, int] = {"alltoall": 0, "deepep": 1}

# Knobs a user may pin from the CLI / JobSpec, with the Plan field each one sets.
KNOBS = ("tp", "pp", "dp", "cp", "ep", "micro_batch", "global_batch", "vpp", "sequence_parallel",
         "recompute", "zero_stage", "offload_weights", "offload_activations", "offload_optimizer",
         "tp_comm_overlap", "dp_comm_overlap", "etp", "moe_a2a_overlap", "recompute_modules")


class Plan(BaseModel):
    """One way to train: parallel sizes, batch split, memory-saving choices, overlaps."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tp: PositiveInt = 1
    pp: PositiveInt = 1
    dp: PositiveInt = 1
    cp: PositiveInt = 1
    ep: PositiveInt = Field(default=1, description="expert parallel (MoE); Megatron parallel folding: "
                            "world % (etp*ep*pp) == 0")
    etp: PositiveInt | None = Field(default=None, description="expert tensor parallel (MoE); None = tp, "
                                    "Megatron's default")
    micro_batch: PositiveInt = 1
    global_batch: PositiveInt = 1
    vpp: PositiveInt = Field(default=1, description="virtual stages per pipeline rank (interleaving)")
    sequence_parallel: bool = False
    recompute: Recompute = "none"
    recompute_modules: tuple[str, ...] | None = Field(
        default=None, description="selective recompute: the modules recomputed (Megatron --recompute-modules; "
                                  "None = core_attn, Megatron's default)")
    recompute_num_layers: PositiveInt | None = Field(
        default=None, description="full recompute: layers per pipeline stage recomputed (None = all); "
                                  "k/vpp of each virtual stage, as Megatron's block method runs it")
    zero_stage: Literal[0, 1, 2, 3] = Field(
        default=1, description="0 plain DP, 1 distributed optimizer (ZeRO-1), 2 +grads, 3 +params (FSDP)")
    offload_weights: NonNegativeFloat = Field(default=0.0, le=1.0, allow_inf_nan=False,
                                              description="fraction to the offload tier")
    offload_activations: NonNegativeFloat = Field(default=0.0, le=1.0, allow_inf_nan=False)
    offload_optimizer: NonNegativeFloat = Field(default=0.0, le=1.0, allow_inf_nan=False)
    tp_comm_overlap: bool = False
    dp_comm_overlap: bool = True
    # Performance switches the model costs (planner/analytical) and `planner megatron` emits.
    cross_entropy_fusion: bool = Field(
        default=False, description="fused cross-entropy kernels (Megatron --cross-entropy-loss-fusion)")
    grad_reduce_in_bf16: bool = Field(
        default=False, description="16-bit gradient buffers and reduce (Megatron --grad-reduce-in-bf16)")
    fp8_param_gather: bool = Field(
        default=False, description="FP8 compute weights, gathered in FP8 (Megatron --fp8-param-gather)")
    dp_impl: DpImpl = Field(default="megatron", description="implementation of sharded data parallelism")
    moe_dispatcher: MoeDispatcher = Field(default="alltoall", description="MoE token dispatcher")
    moe_a2a_overlap: bool = Field(
        default=False, description="hide the expert all-to-all behind another microbatch's compute "
                                   "(Megatron --overlap-moe-expert-parallel-comm, combined 1F1B)")
    # --- pipeline layout (issue 8): explicit per-virtual-stage choices, Megatron's order
    # (virtual stage s runs on pipeline rank s % pp, as model chunk s // pp).
    stage_layers: tuple[NonNegativeInt, ...] | None = Field(
        default=None, description="transformer layers per virtual stage, length pp*vpp (None = even/balanced split)")
    stage_recompute_layers: tuple[NonNegativeInt, ...] | None = Field(
        default=None, description="layers recomputed in full per virtual stage (needs stage_layers; "
                                  "None = derived from recompute / recompute_num_layers)")

    @field_validator("recompute_modules", mode="before")
    @classmethod
    def _modules(cls, value):
        return parse_recompute_modules(value)

    @model_validator(mode="before")
    @classmethod
    def _no_loose_types(cls, data):
        """Plan(tp=True) or Plan(sequence_parallel="yes") is a mistake, not tp 1 or True (pydantic's
        lax mode would read both; the YAML and CLI readers refuse them before this, in one line)."""
        if isinstance(data, dict):
            refuse_loose_types(data, cls, "plan")
        return data

    @model_validator(mode="before")
    @classmethod
    def _recompute_settings_given(cls, data):
        """A module list or a layer count beside a recompute it does not describe is refused as
        written (Megatron's default list, core_attn, would otherwise vanish into None unseen)."""
        if isinstance(data, dict):
            recompute = data.get("recompute", "none")
            # the field's own error names the choices (a list or mapping is no key of the codes:
            # `recompute: []` was a TypeError, exit 70)
            if not isinstance(recompute, str) or recompute not in RECOMPUTE_CODES:
                return data
            modules = data.get("recompute_modules")
            if modules not in (None, (), []):
                try:  # an unknown name first: "needs recompute: selective" would hide it
                    parse_recompute_modules(modules)
                except ValueError as err:
                    raise ValueError(f"recompute_modules: {err}") from None
            if modules not in (None, (), []) and recompute != "selective":
                shown = modules if isinstance(modules, str) else " ".join(map(str, modules))
                raise ValueError(f"recompute_modules ({shown}) needs recompute: selective (got {recompute})")
            if data.get("recompute_num_layers") is not None and recompute != "full":
                raise ValueError(f"recompute_num_layers ({data['recompute_num_layers']}) counts the layers of full "
                                 f"recompute (got recompute: {recompute})")
        return data

    @model_validator(mode="after")
    def _recompute_modules(self) -> "Plan":
        if self.recompute_modules is not None and self.recompute != "selective":
            raise ValueError(f"recompute_modules ({' '.join(self.recompute_modules)}) needs recompute: "
                             f"selective (got {self.recompute})")
        return self

    @model_validator(mode="after")
    def _batch(self) -> "Plan":
        if self.global_batch % (self.micro_batch * self.dp):
            raise ValueError(f"global_batch ({self.global_batch}) must be a multiple of "
                             f"micro_batch*dp ({self.micro_batch}*{self.dp})")
        return self

    @model_validator(mode="after")
    def _layout(self) -> "Plan":
        stages = self.pp * self.vpp
        if self.stage_layers is not None and len(self.stage_layers) != stages:
            raise ValueError(f"stage_layers has {len(self.stage_layers)} entries; pp*vpp = {stages}")
        if self.stage_recompute_layers is not None:
            if self.stage_layers is None:
                raise ValueError("stage_recompute_layers needs stage_layers")
            if len(self.stage_recompute_layers) != stages or any(
                    k > n for k, n in zip(self.stage_recompute_layers, self.stage_layers)):
                raise ValueError("stage_recompute_layers must have pp*vpp entries, each at most "
                                 "that stage's layers")
            if any(self.stage_recompute_layers) and self.recompute != "full":
                raise ValueError("stage_recompute_layers needs recompute: full")
        return self

    @model_validator(mode="after")
    def _a2a_overlap(self) -> "Plan":
        if self.moe_a2a_overlap and self.ep < 2:
            raise ValueError("moe_a2a_overlap needs expert parallelism (ep >= 2): there is no "
                             "all-to-all to hide")
        return self

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.dp * self.cp

    @property
    def expert_tp(self) -> int:
        return self.tp if self.etp is None else self.etp

    @property
    def expert_dp(self) -> int:
        """Expert-data-parallel size: world / (etp·ep·pp) (megatron/core/parallel_state.py)."""
        return self.gpus // (self.expert_tp * self.ep * self.pp)

    @property
    def num_microbatches(self) -> int:
        return self.global_batch // (self.micro_batch * self.dp)

    @property
    def tp_overlap_on(self) -> bool:
        """TP communication overlapped with GEMMs: asked for, and possible (SP, tp > 1)."""
        return self.tp_comm_overlap and self.sequence_parallel and self.tp > 1

    @property
    def uses_offload(self) -> bool:
        return bool(self.offload_weights or self.offload_activations or self.offload_optimizer)

    def short(self) -> str:
        parts = [f"tp{self.tp}", f"pp{self.pp}", f"dp{self.dp}"]
        if self.cp > 1:
            parts.append(f"cp{self.cp}")
        if self.ep > 1:
            parts.append(f"ep{self.ep}")
        if self.etp is not None and self.etp != self.tp:
            parts.append(f"etp{self.etp}")
        if self.vpp > 1:
            parts.append(f"vpp{self.vpp}")
        if self.stage_layers is not None:
            parts.append("layers[" + compress_runs(self.stage_layers) + "]")
        if self.stage_recompute_layers is not None and any(self.stage_recompute_layers):
            # per virtual stage, as --stage-recompute-layers takes them: one count (`rc-k2`, the
            # largest) read as --recompute-num-layers 2, layers per pipeline rank, another plan
            parts.append("rc-k[" + compress_runs(self.stage_recompute_layers) + "]")
        elif self.recompute == "full" and self.recompute_num_layers is not None:
            parts.append(f"rc-k{self.recompute_num_layers}")
        parts.append(f"mb{self.micro_batch}")
        if self.sequence_parallel:
            parts.append("sp")
        if self.tp_overlap_on:
            parts.append("tp-overlap")  # it changes the time: a plan string must name it
        if self.recompute != "none":
            parts.append(f"rc-{self.recompute}")
        if self.recompute_modules is not None:
            parts[-1] += "[" + "+".join(self.recompute_modules) + "]"
        parts.append(f"zero{self.zero_stage}")
        if not self.dp_comm_overlap and (self.dp * self.cp > 1 or self.expert_dp > 1):  # gradients reduced
            parts.append("no-dp-overlap")  # on by default (and in every searched plan): named when off
        if self.dp_impl != "megatron":
            parts.append(self.dp_impl)
        if self.moe_dispatcher != "alltoall":
            parts.append(self.moe_dispatcher)
        if self.moe_a2a_overlap:
            parts.append("a2a-overlap")
        for knob, label in (("cross_entropy_fusion", "ce-fused"), ("grad_reduce_in_bf16", "grad-bf16"),
                            ("fp8_param_gather", "fp8-ag")):
            if getattr(self, knob):
                parts.append(label)
        for what in ("weights", "activations", "optimizer"):
            frac = getattr(self, f"offload_{what}")
            if frac:  # every digit that counts: `estimate --offload-activations` of the printed
                # 0.094 offloads ceil(0.094·32) = 4 layers where the plan's 0.09375 (3 of 32) offloads 3
                text = f"{frac:g}"
                parts.append(f"off-{what[:3]}{text if float(text) == frac else repr(frac)}")
        return " ".join(parts)


def compress_runs(values) -> str:
    """1,2,2,2,1 -> '1,2x3,1'."""
    out, i = [], 0
    values = list(values)
    while i < len(values):
        j = i
        while j < len(values) and values[j] == values[i]:
            j += 1
        out.append(f"{values[i]}x{j - i}" if j - i > 1 else str(values[i]))
        i = j
    return ",".join(out)


class BytesPerParam(BaseModel):
    """Mixed-precision Adam accounting (Megatron: 2 + 4 + 4 + 8 = 18 B/param; the SageMaker
    model-parallel docs count 20 by keeping an fp32 copy of the gradients too)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    # finite and physical: no format stores a parameter, gradient or Adam state in more than fp32
    # (fp64 moments, 16 B, at most); a weight or a gradient on the wire takes at least a bit (1e-300
    # bytes had been costed as free)
    weights: Annotated[float, in_range(0.125, 8)] = 2.0                       # bf16/fp16 parameters
    grads: float = Field(default=4.0, ge=0, le=8, allow_inf_nan=False)        # fp32 main gradients
    master: float = Field(default=4.0, ge=0, le=8, allow_inf_nan=False)       # fp32 master weights
    optimizer: float = Field(default=8.0, ge=0, le=16, allow_inf_nan=False)   # Adam m and v in fp32
    grad_reduce: Annotated[float, in_range(0.125, 8)] = 4.0                   # bytes per gradient element on the wire

    @classmethod
    def for_adam_moments(cls, moments: str) -> "BytesPerParam":
        """The default accounting with Adam's two moments in `moments` (ADAM_MOMENT_BYTES: fp32
        8 B, bf16 4 B per parameter), as a launch with that --exp-avg-dtype keeps them."""
        if moments not in ADAM_MOMENT_BYTES:
            raise ValueError(f"adam moments {moments!r}: expected one of {', '.join(ADAM_MOMENT_BYTES)}")
        return cls(optimizer=ADAM_MOMENT_BYTES[moments])

    @property
    def optimizer_total(self) -> float:
        return self.master + self.optimizer

    @property
    def total(self) -> float:
        return self.weights + self.grads + self.optimizer_total


# Bytes per parameter of Adam's two moments by their dtype (JobSpec.adam_moments).
ADAM_MOMENT_BYTES = {"fp32": 8.0, "bf16": 4.0}


# JobSpec.hbm_reserve_gib's ceiling (the CLI's --hbm-reserve-gib checks the same): above any
# GPU's HBM; a reserve beyond a GPU's own HBM leaves no plan that fits, which is the answer.
HBM_RESERVE_MAX_GIB = 1024.0

# JobSpec.moe_load_imbalance's range (the CLI's --moe-imbalance checks the same)
MOE_IMBALANCE_RANGE = (1.0, 8.0)


class JobSpec(BaseModel):
    """What the user asks: batch, precision, memory reserve, pins and forbids."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    global_batch: PositiveInt | None = Field(default=None, description="fixed global batch (sequences)")
    max_global_batch: PositiveInt = Field(default=3072, description="cap when the batch is free (seeds: 3072)")
    dtype: ComputeDtype = "bf16"
    hbm_reserve_gib: float = Field(
        default=2.0, ge=0, le=HBM_RESERVE_MAX_GIB, allow_inf_nan=False,
        description="HBM kept free for the CUDA context, NCCL buffers and fragmentation")
    flash_attention: bool = Field(default=True, description="fused attention: no s^2 activations stored")
    bytes_per_param: BytesPerParam = BytesPerParam()
    pins: dict[str, int | float | bool | str] = Field(default_factory=dict)
    allow_offload: bool = True
    allow_idle_gpus: bool = False
    tp_within_nvlink: bool = Field(
        default=True, description="keep tensor parallelism inside one NVLink domain (what practice does)")
    framework: Literal["megatron", "any"] = "megatron"
    # The token dispatcher every searched plan is costed with (a deployment choice, not searched:
    # DeepEP needs its library and GPU-initiated IB): "deepep" sends a token across the network
    # once per destination node and fans it out over NVLink (DeepSeek-V3 §3.2.2; Megatron
    # --moe-token-dispatcher-type flex --moe-flex-dispatcher-backend deepep).
    moe_dispatcher: MoeDispatcher = "alltoall"
    # Megatron's fused cross-entropy (--cross-entropy-loss-fusion, native kernels) in every searched
    # plan: the same fp32 loss in fewer passes (time.CROSS_ENTROPY_FUSED_SHARE), no memory cost, and
    # every layout launches with it, so the fastest plan has it; False searches Megatron's default.
    cross_entropy_fusion: bool = True
    moe_load_imbalance: float = Field(
        default=1.0, ge=MOE_IMBALANCE_RANGE[0], le=MOE_IMBALANCE_RANGE[1],
        description="MoE: tokens routed to the busiest expert over the mean (1.0 = balanced routing, "
                    "what NVIDIA's published MoE benchmarks force with --moe-router-force-load-balancing; "
                    "learned routing early in training is less even)")
    # The kernels the step runs (planner/analytical/kernels.py): "te" Transformer Engine / Megatron
    # fused kernels (cuDNN attention); "torch-eager" PyTorch eager modules (unfused norm, RoPE and
    # activation chains, FlashAttention-2); "torch-compile" the same under torch.compile (Inductor
    # fuses each element-wise chain; FlashAttention-2).
    kernels: KernelStack = "te"
    # Transformer Engine's attention backend: False = cuDNN fused attention (TE's choice on Hopper
    # and later); True = the flash-attn package's FlashAttention-2 kernels, what TE runs with
    # NVTE_FUSED_ATTN=0 (DGX Cloud v24.11.1's GPT-3 175B and Nemotron-4 340B launch scripts).
    # The torch stacks run FlashAttention-2 either way.
    te_flash_attention: bool = False
    # Kernel-level settings of NVIDIA's tuned MoE recipes (Megatron-Bridge perf recipes, e.g.
    # 55443cbfb "Enable Qwen3 GB200/GB300 MXFP8 CuTeDSL Fusion and Full-Iter CUDA Graphs"):
    # full_iteration_cuda_graph: Megatron-Core cuda_graph_impl="full_iteration" replays the whole
    #   forward-backward as one graph, so the per-layer host/launch overhead
    #   (efficiency.layer_overhead_us) is not paid;
    # fp8_attention: --fp8-dot-product-attention, the attention core runs in FP8 (cuDNN);
    # fused_grouped_mlp: Transformer Engine's op fuser (use_transformer_engine_op_fuser) fuses the
    #   experts' activation and its quantisation casts into the grouped GEMMs.
    full_iteration_cuda_graph: bool = False
    # cuda_graph_modules: per-layer CUDA graphs (Megatron-Core --cuda-graph-impl transformer_engine
    #   --cuda-graph-modules, enums.CudaGraphModule) of these static modules; a layer whose every
    #   static module is captured (attention and the dense MLP, or attention, the MoE router and its
    #   preprocess) pays no per-layer launch overhead. The routed experts stay eager (dynamic shapes),
    #   so their host time (time.expert_host_exposed_s) stays.
    cuda_graph_modules: tuple[CudaGraphModuleName, ...] = ()
    fp8_attention: bool = False
    fused_grouped_mlp: bool = False
    # The torch stacks' attention kernel: False = FlashAttention-2; True = MPT's Triton
    # FlashAttention (llm-foundry attn_impl "triton"), with its own ceiling (attention_max_triton).
    triton_flash_attention: bool = False
    loss_kernel: LossKernel = "fp32"
    # Adam's two moments (exp_avg, exp_avg_sq): "fp32" (Megatron's default), or "bf16" as Megatron's
    # precision-aware optimizer keeps them (--use-precision-aware-optimizer --exp-avg-dtype bf16
    # --exp-avg-sq-dtype bf16; TE FusedAdam), what DeepSeek-V3 trained with (arXiv:2412.19437
    # §3.3.3) and NVIDIA's DeepSeek / Qwen3 perf recipes set (Megatron-Bridge perf_recipes/deepseek/
    # common.py). It halves `bytes_per_param.optimizer` (8 -> 4); the fp32 master copy stays 4 B
    # (Megatron keeps it, main_params_dtype fp32; TE's 16-bit-remainder store under bf16 params,
    # store_param_remainders, is not counted: 2 B/param more than such a run holds).
    adam_moments: Literal["fp32", "bf16"] = "fp32"
    # (first, last): transformer layers kept out of the low-precision recipe, their GEMMs in bf16
    # (Megatron --first-last-layers-bf16 --num-layers-at-start-in-bf16 --num-layers-at-end-in-bf16,
    # megatron/core/fp8_utils.py is_first_last_bf16_layer). NVIDIA's NVFP4 recipes keep some: the
    # last 14 of Nemotron 3 Super's 88 (Megatron-Bridge mixed_precision.py
    # nemotron_3_super_bf16_with_nvfp4_mixed), the last 4 of GPT-OSS 20B's 24 (perf_recipes/gpt_oss).
    bf16_layers: tuple[NonNegativeInt, NonNegativeInt] = (0, 0)
    # Per-module dtypes of a Transformer Engine quantization recipe (Megatron-Core
    # TransformerConfig.quant_recipe, glob matchers over module names): NVIDIA's Nemotron 3 Super
    # NVFP4 recipe keeps attention's linear_qkv / linear_proj, the latent projections and the MTP
    # module in bf16 and runs the Mamba out_proj in MXFP8 (Megatron-Bridge te_quant.cfg).
    module_dtypes: dict[ModuleGroup, ModuleDtype] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _no_loose_types(cls, data):
        """JobSpec(global_batch=True) or JobSpec(global_batch="64") is a mistake (as Plan's)."""
        if isinstance(data, dict):
            refuse_loose_types(data, cls, "job")
        return data

    @model_validator(mode="before")
    @classmethod
    def _cap_follows_fixed_batch(cls, data):
        """The cap bounds a free batch only: JobSpec(global_batch=4096) asks for 4096, as `planner
        plan -b 4096` does; a cap given beside the batch is still checked against it."""
        if isinstance(data, dict) and "max_global_batch" not in data:
            batch = data.get("global_batch")
            cap = cls.model_fields["max_global_batch"].default
            if isinstance(batch, int) and not isinstance(batch, bool) and batch > cap:
                data = {**data, "max_global_batch": batch}
        return data

    @model_validator(mode="before")
    @classmethod
    def _moments_bytes(cls, data):
        """bf16 moments set the optimizer bytes, unless bytes_per_param says otherwise; fp32
        moments given beside other optimizer bytes contradict them (the launch keeps fp32 moments)."""
        if isinstance(data, dict) and data.get("adam_moments") == "fp32":
            bpp = data.get("bytes_per_param") or {}
            bpp = bpp.model_dump() if isinstance(bpp, BytesPerParam) else dict(bpp)
            if bpp.get("optimizer", ADAM_MOMENT_BYTES["fp32"]) != ADAM_MOMENT_BYTES["fp32"]:
                raise ValueError(f"adam_moments fp32 contradicts bytes_per_param.optimizer {bpp['optimizer']} "
                                 f"(fp32 moments are {ADAM_MOMENT_BYTES['fp32']:g} B per parameter)")
        if isinstance(data, dict) and data.get("adam_moments") == "bf16":
            bpp = data.get("bytes_per_param") or {}
            bpp = bpp.model_dump() if isinstance(bpp, BytesPerParam) else dict(bpp)
            if bpp.get("optimizer", ADAM_MOMENT_BYTES["fp32"]) not in ADAM_MOMENT_BYTES.values():
                raise ValueError(f"adam_moments bf16 contradicts bytes_per_param.optimizer {bpp['optimizer']}")
            data = {**data, "bytes_per_param": {**bpp, "optimizer": ADAM_MOMENT_BYTES["bf16"]}}
        return data

    @field_validator("pins", mode="before")
    @classmethod
    def _native_pins(cls, pins):
        """numpy scalars as the Python values they are (pydantic would read np.True_ as 1.0)."""
        if isinstance(pins, dict):
            return {k: v.item() if hasattr(v, "dtype") and hasattr(v, "item") else v for k, v in pins.items()}
        return pins

    @model_validator(mode="after")
    def _pins(self) -> "JobSpec":
        if self.full_iteration_cuda_graph and self.cuda_graph_modules:
            raise ValueError(f"full_iteration_cuda_graph captures the whole step; cuda_graph_modules "
                             f"({', '.join(self.cuda_graph_modules)}) would be dropped beside it: give one of the two")
        if self.fp8_attention and self.dtype in ("bf16", "fp16"):
            raise ValueError(f"fp8_attention (--fp8-attention) needs a low-precision dtype (--dtype fp8, fp8-cs, "
                             f"fp8-block, mxfp8 or nvfp4), got {self.dtype}")
        if self.module_dtypes and self.dtype in ("bf16", "fp16", "fp8"):
            raise ValueError(f"module_dtypes (--module-dtype) needs a current- or block-scaled low-precision "
                             f"dtype (--dtype fp8-cs, fp8-block, mxfp8 or nvfp4) for the rest of the model, "
                             f"got {self.dtype}")
        if any(self.bf16_layers) and self.dtype in ("bf16", "fp16", "fp8"):
            why = ("Megatron refuses bf16 layers under delayed scaling" if self.dtype == "fp8"
                   else f"under {self.dtype} every layer already runs 16-bit GEMMs")
            raise ValueError(f"bf16_layers needs a current- or block-scaled low-precision dtype (fp8-cs, "
                             f"fp8-block, mxfp8, nvfp4): {why}")
        unknown = sorted(set(self.pins) - set(KNOBS))
        if unknown:
            raise ValueError(f"unknown knob {unknown[0]!r}; allowed: {', '.join(KNOBS)}")
        for name, value in self.pins.items():  # as the Plan field takes it: pins={"tp": True} is no tp 1
            want = _PIN_KINDS.get(name)
            whole = want is numbers.Integral and isinstance(value, float) and value.is_integer()  # numpy's, coerced
            if want is not None and not whole and (isinstance(value, bool) != (want is bool)
                                                   or not isinstance(value, want)):
                raise ValueError(f"pins: {name}: expected {_PIN_KIND_WORDS[want]}, got {value!r}")
        if self.global_batch and self.global_batch > self.max_global_batch:
            raise ValueError(f"global_batch ({self.global_batch}) exceeds max_global_batch "
                             f"({self.max_global_batch})")
        if self.global_batch is None and self.max_global_batch > MAX_GLOBAL_BATCH:
            # as --max-global-batch: a free batch's search holds every batch up to the cap (2**40
            # was a MemoryError inside plan/check/count); a fixed batch is one value, any size
            raise ValueError(f"max_global_batch: must be an integer from 1 to {MAX_GLOBAL_BATCH:,} where the "
                             f"batch is free, got {self.max_global_batch:,}")
        return self


# What a scalar pin must be (Plan's field types; Literal knobs are checked by the search's domains)
_PIN_KINDS = {**{k: numbers.Integral for k in ("tp", "pp", "dp", "cp", "ep", "micro_batch", "global_batch", "vpp",
                                               "etp", "zero_stage")},
              **{k: bool for k in ("sequence_parallel", "tp_comm_overlap", "dp_comm_overlap", "moe_a2a_overlap")},
              **{k: numbers.Real for k in ("offload_weights", "offload_activations", "offload_optimizer")},
              "recompute": str}
_PIN_KIND_WORDS = {numbers.Integral: "an integer", bool: "true or false", numbers.Real: "a number", str: "a string"}


# The top level of a saved plan file: what a launch reads, then what `planner plan --save` keeps
# for the reader only (ignored on load). Any other key is refused, as in `plan:` and `job:`, so
# that a misspelt `gpu: 16` is named instead of silently falling back to the system's count.
PLAN_FILE_FIELDS = ("plan", "model", "system", "gpus", "seq_length", "global_batch", "job")
# JobSpec fields a launch depends on (pins, forbids and search bounds do not): a plan file's `job:`
SAVED_JOB_FIELDS = ("dtype", "hbm_reserve_gib", "flash_attention", "bytes_per_param", "framework",
                    "full_iteration_cuda_graph", "cuda_graph_modules", "fp8_attention", "fused_grouped_mlp",
                    "adam_moments", "bf16_layers", "module_dtypes", "moe_load_imbalance")
SAVED_RESULT_FIELDS = ("step_time_s", "objective")
SAVED_OBJECTIVES = ("step time", "time per token")  # planner.search.SearchResult.objective


def check_plan_file_fields(data: dict, path: str | Path) -> None:
    """Refuse a top-level key of a saved plan file (one with a `plan:` mapping) that is not in
    PLAN_FILE_FIELDS or SAVED_RESULT_FIELDS, naming it and the allowed ones."""
    allowed = PLAN_FILE_FIELDS + SAVED_RESULT_FIELDS
    unknown = sorted((key for key in data if key not in allowed), key=str)
    if unknown:
        raise SpecError(f"plan ({path}): unknown field {unknown[0]!r}; allowed: {', '.join(allowed)}")
    # kept for the reader and not used on load, but what `planner plan --save` writes where present
    value = data.get("step_time_s")
    if value is not None and not (finite_number(value) and value >= 0):
        raise SpecError(f"plan ({path}): step_time_s: expected a finite non-negative number of seconds, got {value!r}")
    if data.get("objective") not in (None, *SAVED_OBJECTIVES):
        raise SpecError(f"plan ({path}): objective: unknown {data['objective']!r}; allowed: {', '.join(SAVED_OBJECTIVES)}")
    if "job" in data:
        _refuse_cut_saved_file(data, path)


# job fields a saved file may lack: saved files written before the field existed mean its default
SAVED_JOB_FIELDS_LATER = ("moe_load_imbalance",)


def _refuse_cut_saved_file(data: dict, path: str | Path) -> None:
    """A file with a `job:` is one `planner plan --save` wrote, and that writes every plan field
    and every job setting: one without some was cut short (or edited), and filling the gap with
    defaults would cost and launch another job (an FP8 plan cut before its dtype launched in
    bf16). The top-level keys come before `job:` and have their own messages."""
    plan, job = data.get("plan"), data.get("job")
    gaps = [f"plan.{f}" for f in Plan.model_fields if f not in plan] if isinstance(plan, dict) else []
    if job is None or isinstance(job, dict):
        gaps += [f"job.{f}" for f in SAVED_JOB_FIELDS if f not in (job or {}) and f not in SAVED_JOB_FIELDS_LATER]
        # a settings block is written whole too (bytes_per_param: all five byte counts)
        block = (job or {}).get("bytes_per_param")
        if isinstance(block, dict):
            gaps += [f"job.bytes_per_param.{f}" for f in BytesPerParam.model_fields if f not in block]
    # a misspelt field reads as that field missing: name what was written (`sequence_paralel`),
    # not a file "cut short"
    block = job.get("bytes_per_param") if isinstance(job, dict) else None
    for prefix, mapping, fields in (("plan", plan, Plan.model_fields), ("job", job, SAVED_JOB_FIELDS),
                                    ("job.bytes_per_param", block, BytesPerParam.model_fields)):
        if not isinstance(mapping, dict):
            continue
        missing = [g.removeprefix(f"{prefix}.") for g in gaps if g.rsplit(".", 1)[0] == prefix]
        for key in (k for k in mapping if isinstance(k, str) and k not in fields):
            near = closest_name(key, missing)
            if near:
                raise SpecError(f"plan ({path}): {prefix}.{shortened(key)}: unknown field (did you mean {near}?)")
    if gaps:
        shown = ", ".join(gaps[:4]) + (f" and {len(gaps) - 4} more" if len(gaps) > 4 else "")
        raise SpecError(f"plan ({path}): missing {shown}: a file `planner plan --save` wrote has every field "
                        "(was it cut short?); save the plan again, or remove `job:` to estimate it as a bare plan "
                        "under the command line's settings")


PLAN_FILE_REQUIRED = ("tp", "pp", "dp", "global_batch")


def plan_layout_mapping(data: dict, path: str | Path) -> dict:
    """A plan file's layout mapping (under `plan:`, or the bare mapping itself), with the fields
    every plan file gives, else a one-line error: checked before the notes on what the file
    leaves to defaults, which a file that is no plan makes a second, misleading line."""
    if "plan" in data:  # a saved `planner plan --save` file: its other top-level keys checked too
        check_plan_file_fields(data, path)
    data = data.get("plan", data)  # accept a bare plan mapping too
    if not isinstance(data, dict):
        raise SpecError(f"plan ({path}): plan: expected a mapping of plan fields, got {kind_text(data)}")
    # the layout and batch have defaults for the CLI's flags, not for a file: a file without them
    # was estimated as dp 1, batch 1, and the flag that disagreed was blamed
    missing = [f for f in PLAN_FILE_REQUIRED if f not in data]
    if missing:
        raise SpecError(f"plan ({path}): missing {', '.join(missing)}; a plan file gives at least "
                        f"{', '.join(PLAN_FILE_REQUIRED)}")
    return data


def load_plan(path: str | Path) -> Plan:
    data = plan_layout_mapping(read_yaml_mapping(Path(path), "plan"), path)
    try:
        refuse_loose_types(data, Plan, f"plan ({path})")
        plan = Plan.model_validate(data)
    except ValidationError as err:
        raise one_line(err, f"plan ({path})", Plan) from None
    if plan.global_batch > MAX_GLOBAL_BATCH:  # as --global-batch: a hand-edited 10**12 was costed and launched
        raise SpecError(f"plan ({path}): global_batch: must be an integer from 1 to {MAX_GLOBAL_BATCH:,} "
                        f"(as --global-batch), got {plan.global_batch:,}")
    if plan.sequence_parallel and plan.tp == 1:  # as the --sequence-parallel flag with --tp 1
        raise SpecError(f"plan ({path}): sequence_parallel: needs tp > 1 (tp is 1); set it false")
    return plan


def make_plan(**fields) -> Plan:
    """Plan from keyword fields with one-line errors (CLI flags)."""
    try:
        return Plan.model_validate({k: v for k, v in fields.items() if v is not None})
    except ValidationError as err:
        raise one_line(err, "plan") from None


__all__ = ["Plan", "JobSpec", "MAX_GLOBAL_BATCH", "MAX_TIME_LIMIT_S", "MOE_IMBALANCE_RANGE", "MODULE_GROUPS", "MODULE_DTYPES", "BytesPerParam", "ADAM_MOMENT_BYTES", "KNOBS", "RECOMPUTE_CODES", "RECOMPUTE_MODULES",
           "RECOMPUTE_MODULE_BITS", "DEFAULT_RECOMPUTE_MODULES", "recompute_modules_mask",
           "recompute_modules_from_mask", "parse_recompute_modules", "applicable_recompute_modules",
           "check_recompute_modules", "load_plan", "make_plan", "COMPUTE_DTYPES",
           "SpecError", "DpImpl", "DP_IMPL_CODES", "KernelStack", "KERNEL_STACKS", "LossKernel", "MoeDispatcher",
           "CudaGraphModuleName", "MOE_DISPATCHER_CODES"]
