"""What a model IS: transformer shape, parameter counts, and presets."""
from __future__ import annotations

import functools
import operator
import re
from pathlib import Path
from typing import Annotated, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from hardware.errors import (SpecError, digit_limit_error, in_range, one_line, other_kind_of_file, read_yaml_mapping,
                             reference_text, refuse_loose_types, VISIBLE_LINE_PATTERN, check_name_length,
                             resolve_preset_or_file)
from planner import hf_config

PRESET_DIR = Path(__file__).parent / "presets"

Activation = Literal["gelu", "swiglu", "squared_relu"]


# ---- upper bounds on a model's integers ------------------------------------------------------
# Generous caps, far beyond any real model, that refuse a typo or a fuzzed value (`layers:
# 1000000000` ran `planner count` for minutes: the stage search and the per-layer arrays scale
# with the layer count) as the CLI's flags refuse theirs. For scale: the largest
# presets are Llama 3 405B (126 layers, hidden 16,384, ffn 53,248), DeepSeek-V3 (256 experts,
# top-8), Kimi K2 (384 experts), Gemma 3 (vocab 262,144) and the seed-study's 128T-parameter
# stack (seed-128t: 640 layers, hidden 131,072, 1,024 heads, ffn 524,288).
MAX_LAYERS = 10_000        # ~80x Llama 3 405B's 126 layers, 15x seed-128t's 640
MAX_WIDTH = 1 << 20        # hidden, head and latent widths: 8x seed-128t's hidden 131,072
MAX_FFN = 1 << 22          # MLP widths: 4 * MAX_WIDTH, the default ffn of the widest hidden
MAX_HEADS = 1 << 16        # attention / Mamba heads and KV groups: 64x seed-128t's 1,024
MAX_VOCAB = 1 << 22        # 4,194,304 tokens: 16x the largest vocabulary (Gemma 3: 262,144)
MAX_EXPERTS = 1 << 16      # experts, top-k, shared experts, router groups: 170x Kimi K2's 384


MAX_SEQ_LENGTH = 1 << 24    # tokens; the CLI's --seq-length takes the same cap
MAX_MODEL_NAME_CHARS = 200  # a header line; Hugging Face repo ids run to ~100


# plain int + in_range: a value out of range says the range ("must be an integer from 1 to 10,000,
# got 0"), where PositiveInt said only "Input should be greater than 0"
Layers = Annotated[int, in_range(1, MAX_LAYERS, integer=True)]
LayerCount = Annotated[int, in_range(0, MAX_LAYERS, integer=True)]
Width = Annotated[int, in_range(1, MAX_WIDTH, integer=True)]
FfnWidth = Annotated[int, in_range(1, MAX_FFN, integer=True)]
Heads = Annotated[int, in_range(1, MAX_HEADS, integer=True)]
Vocab = Annotated[int, in_range(1, MAX_VOCAB, integer=True)]
Experts = Annotated[int, in_range(1, MAX_EXPERTS, integer=True)]
ExpertCount = Annotated[int, in_range(0, MAX_EXPERTS, integer=True)]
SeqLength = Annotated[int, in_range(1, MAX_SEQ_LENGTH, integer=True)]
# Finite, generous ranges for the two real-valued fields (an .inf reached Megatron's command line):
# capacity factors in use are 1-2 (GShard §2.2, Switch Transformer §2.2: 1.0-1.25), and above
# experts/top_k an expert's capacity holds every token anyway; GPT-OSS clamps at 7.0.
CapacityFactor = Annotated[float, in_range(0.01, 1000.0)]
ActivationClamp = Annotated[float, in_range(1e-3, 1e6)]
# routed_scaling_factor: 1 to 16 in published configs (DeepSeek-V2 16, V3 2.5, Kimi K2 2.827)
RouterScale = Annotated[float, in_range(1e-3, 1e3)]
# Llama 3.x RoPE scaling factors: 8 (3.1) and 32 (3.2)
RopeFactor = Annotated[float, in_range(1.0, 1e4)]
# RoPE bases in use run from 10,000 (Llama 2, DeepSeek) to 10^7 (Qwen3-Coder); Megatron reads an int
RopeBase = Annotated[int, in_range(1, 10**12, integer=True)]
# norm epsilons in use are 1e-6 (Qwen3, DeepSeek) to 1e-5 (Llama, Megatron's default)
NormEpsilon = Annotated[float, in_range(1e-12, 0.1)]


def _whole(value) -> int | None:
    """`value` as the int a field reads it as: 4096 or 4096.0 (pydantic takes a whole float for an
    int field, as Plan's and JobSpec's do); None for a bool, text or a fraction (refused by the
    field itself)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, float):
        return int(value) if value.is_integer() else None
    try:
        return operator.index(value)
    except TypeError:
        return None


class _Part(BaseModel):
    """A model spec or a part of one. ModelSpec(layers=True) or layers="2" is a mistake, not 1 or 2
    (pydantic's lax mode would read both; load_model refuses them first, naming the file), as
    Plan and JobSpec refuse theirs."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    spec_label: ClassVar[str] = "model"

    @model_validator(mode="before")
    @classmethod
    def _no_loose_types(cls, data):
        if isinstance(data, dict):
            refuse_loose_types(data, cls, cls.spec_label)
        return data


class MoESpec(_Part):
    """Mixture of experts in the MLP of (all but the first `first_dense_layers`) layers."""

    spec_label: ClassVar[str] = "moe"
    num_experts: Experts
    top_k: Experts
    expert_ffn: FfnWidth | None = Field(default=None, description="default: the dense ffn")
    shared_experts: ExpertCount = Field(default=0, description="experts every token passes through")
    shared_expert_ffn: FfnWidth | None = Field(default=None, description="width of EACH shared expert; "
                                                  "default: expert_ffn")
    first_dense_layers: LayerCount = Field(default=0, description="leading layers with the dense ffn "
                                               "instead of experts (DeepSeek-V3: 3)")
    # Interleaved MoE (Llama 4 Maverick: 2, Hugging Face interleave_moe_layer_step; Qwen-MoE's
    # decoder_sparse_step; GShard / Switch Transformer: every other layer): after the leading dense
    # layers, layer j (counted from 1) is MoE when j is a multiple of layer_step, else dense.
    layer_step: Layers = Field(default=1, description="every layer_step-th layer after the leading dense "
                                                      "ones is MoE, the others dense (Llama 4 Maverick: 2)")
    capacity_factor: CapacityFactor | None = Field(default=None, description="token-drop capacity; "
                                                   "None = dropless")
    # Group-limited routing (DeepSeek-V3 §3.2.2 node-limited routing; Megatron
    # --moe-router-num-groups / --moe-router-group-topk; config.json n_group / topk_group): the
    # experts form router_groups contiguous groups and a token's top-k is picked inside its best
    # router_group_topk groups only.
    router_groups: Experts | None = Field(default=None, description="expert groups for group-limited "
                                              "routing (None = no limit)")
    # LatentMoE (Nemotron 3 Super; Megatron-Core --moe-latent-size): each routed token is projected
    # h -> latent_size before the dispatch and back after the combine, and the routed experts work
    # on latent_size-wide rows; the router and the shared experts stay on h.
    latent_size: Width | None = Field(default=None, description="LatentMoE width of the routed "
                                            "experts' rows (None = the hidden size)")
    router_group_topk: Experts | None = Field(default=None, description="groups a token may route to")
    # How the router scores and weights experts: not costed (the same fp32 passes over tokens x
    # experts either way, time.ROUTER_PASSES), launched so that the trained model is the named one.
    # "softmax" (Megatron's default: Mixtral, Qwen3) or "sigmoid" (DeepSeek-V3, GLM-4.5, Nemotron 3,
    # Llama 4); expert_bias: DeepSeek-V3's auxiliary-loss-free balancing bias (§2.1.2;
    # config.json topk_method noaux_tc / e_score_correction_bias); topk_scale: the weight on the
    # routed experts' sum (config.json routed_scaling_factor; DeepSeek-V3 2.5).
    router_score: Literal["softmax", "sigmoid"] = Field(default="softmax", description="router score function "
                                                         "(Megatron --moe-router-score-function); not costed")
    router_expert_bias: bool = Field(default=False, description="auxiliary-loss-free balancing bias (Megatron "
                                     "--moe-router-enable-expert-bias; needs sigmoid scores); not costed")
    router_topk_scale: RouterScale | None = Field(default=None, description="scale of the routed experts' "
                                                  "weights (Megatron --moe-router-topk-scaling-factor); not costed")
    # softmax over all experts, then the top-k, not renormalised (DeepSeek-V2, Qwen2-MoE:
    # config.json norm_topk_prob false; Megatron --moe-router-pre-softmax); else the softmax runs
    # over the top-k logits, which renormalises (Mixtral, Qwen3-MoE, GPT-OSS)
    router_pre_softmax: bool = Field(default=False, description="softmax before the top-k, weights not "
                                     "renormalised (Megatron --moe-router-pre-softmax); not costed")
    # the load-balancing loss's weight (config.json router_aux_loss_coef: Qwen3-MoE 1e-3, as
    # Megatron-Bridge's Qwen3-MoE provider sets; Mixtral 8x7B 2e-2); None: the launch's default
    # (1e-2, or 1e-4 for the sequence-wise loss beside an expert bias)
    router_aux_loss_coeff: Annotated[float, in_range(0.0, 10.0)] | None = Field(
        default=None, description="load-balancing aux-loss coefficient (Megatron --moe-aux-loss-coeff); not costed")
    # Qwen2-MoE multiplies the shared expert's output by sigmoid(shared_expert_gate(x)), an h x 1
    # projection (transformers modeling_qwen2_moe.py Qwen2MoeSparseMoeBlock)
    shared_expert_gate: bool = Field(default=False, description="a sigmoid gate on the shared experts' output "
                                     "(Qwen2-MoE; Megatron --moe-shared-expert-gate); its h x 1 projection is "
                                     "not costed")
    # Llama 4 scales each routed row by its router score before the experts, not after
    # (transformers modeling_llama4.py Llama4TextMoe: routed_in = hidden_states * router_scores)
    apply_probs_on_input: bool = Field(default=False, description="the router score scales the expert's input, "
                                       "not its output (Llama 4; Megatron --moe-apply-probs-on-input, top-1 "
                                       "only); same cost")

    @model_validator(mode="after")
    def _topk(self) -> "MoESpec":
        if self.top_k > self.num_experts:
            raise ValueError(f"top_k ({self.top_k}) must be <= num_experts ({self.num_experts})")
        if (self.router_groups is None) != (self.router_group_topk is None):
            raise ValueError("router_groups and router_group_topk: give both or neither")
        if self.router_pre_softmax and self.router_score != "softmax":
            raise ValueError("router_pre_softmax: orders a softmax router's steps; router_score is sigmoid")
        if self.shared_expert_gate and not self.shared_experts:
            raise ValueError("shared_expert_gate: gates the shared experts; shared_experts is 0")
        if self.apply_probs_on_input and self.top_k != 1:
            raise ValueError(f"apply_probs_on_input: scales the one chosen expert's input; top_k is {self.top_k} "
                             "(Megatron: --moe-apply-probs-on-input only with top-1 routing)")
        if self.router_expert_bias and self.router_score != "sigmoid":
            raise ValueError("router_expert_bias: the balancing bias needs router_score sigmoid (Megatron: expert "
                             "bias for aux-loss-free routing only supports sigmoid scores)")
        if self.router_groups is not None:
            if self.num_experts % self.router_groups:
                raise ValueError(f"router_groups ({self.router_groups}) must divide num_experts ({self.num_experts})")
            if self.router_group_topk > self.router_groups:
                raise ValueError(f"router_group_topk ({self.router_group_topk}) must be <= router_groups "
                                 f"({self.router_groups})")
            # a token picks its top_k experts inside its router_group_topk groups (DeepSeek-V3
            # §3.2.2; Megatron's group-limited top-k), so those groups must hold that many experts
            reachable = self.router_group_topk * (self.num_experts // self.router_groups)
            if self.top_k > reachable:
                raise ValueError(f"top_k ({self.top_k}) must be <= router_group_topk ({self.router_group_topk}) x "
                                 f"num_experts / router_groups ({self.num_experts // self.router_groups}) = "
                                 f"{reachable}: the experts a token's groups hold")
        return self


class MLASpec(_Part):
    """Multi-head latent attention (DeepSeek-V2, arXiv:2405.04434 §2.1, eqs. 9-19; DeepSeek-V3
    config.json field names). Queries and keys/values pass through low-rank latents; each head's
    query/key is a no-position part plus a decoupled RoPE part whose key is shared by all heads."""

    spec_label: ClassVar[str] = "mla"
    q_lora_rank: Width | None = Field(default=None, description="None = queries not compressed")
    kv_lora_rank: Width
    qk_nope_head_dim: Width
    qk_rope_head_dim: Width
    v_head_dim: Width
    # launch-only (not costed: the decoupled RoPE part's frequencies and the softmax scale change no
    # time or byte): the checkpoint's YaRN RoPE (config.json rope_scaling factor / mscale /
    # mscale_all_dim; Megatron --rotary-scaling-factor / --mscale / --mscale-all-dim, whose
    # defaults 1, 1, 0 are plain RoPE). DeepSeek-V3: 40, 1, 1, as Megatron-Bridge's recipe sets.
    yarn_factor: RopeFactor | None = Field(default=None, description="YaRN scaling factor (None: Megatron's 1)")
    mscale: Annotated[float, in_range(0.0, 100.0)] | None = Field(default=None, description="YaRN mscale (None: 1)")
    mscale_all_dim: Annotated[float, in_range(0.0, 100.0)] | None = Field(
        default=None, description="YaRN mscale_all_dim (None: Megatron's 0)")

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim


class MambaSpec(_Part):
    """A Mamba-2 mixer (Dao & Gu 2024, "Transformers are SSMs", §7; Megatron-Core
    ssm/mamba_mixer.py; --mamba-num-heads / --mamba-head-dim / --mamba-state-dim /
    --mamba-num-groups): d_inner = num_heads·head_dim channels, a state of state_dim per head
    whose input (B) and output (C) projections are shared by the heads of one of `groups` groups."""

    spec_label: ClassVar[str] = "mamba"
    num_heads: Heads
    head_dim: Width
    state_dim: Width
    groups: Heads = 8
    conv_kernel: Width = Field(default=4, description="causal depthwise conv1d width")
    chunk_size: SeqLength = Field(default=128, description="SSD chunk length (Mamba-2 §6)")

    @property
    def d_inner(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def conv_channels(self) -> int:
        """x, B and C pass the conv1d: d_inner + 2·groups·state_dim channels."""
        return self.d_inner + 2 * self.groups * self.state_dim

    @property
    def in_proj_width(self) -> int:
        """in_proj's output: z and x (d_inner each), B and C (groups·state each), dt (one per head)."""
        return 2 * self.d_inner + 2 * self.groups * self.state_dim + self.num_heads

    @model_validator(mode="after")
    def _groups(self) -> "MambaSpec":
        if self.num_heads % self.groups:
            raise ValueError(f"groups ({self.groups}) must divide num_heads ({self.num_heads})")
        return self


# Megatron's hybrid layer pattern (--hybrid-layer-pattern, formerly --hybrid-override-pattern;
# megatron/core/ssm/mamba_hybrid_layer_allocation.py Symbols): one block per layer, each with its own pre-norm.
HYBRID_BLOCKS = {"M": "Mamba-2 mixer", "*": "attention", "-": "dense MLP", "E": "MoE MLP"}


# What the output's header shows ("llama3-8b (8.0 B params ..."): one line of visible text, short
# enough for a header
ModelName = Annotated[str, Field(min_length=1, max_length=MAX_MODEL_NAME_CHARS, pattern=VISIBLE_LINE_PATTERN)]


class ModelSpec(_Part):
    """A decoder-only transformer. Every MLP/attention is a matmul of these widths. With
    `hybrid_pattern` (Nemotron-H / Nemotron-3) each layer is ONE block of the pattern (a Mamba-2
    mixer, attention, a dense MLP or a MoE MLP) instead of attention followed by an MLP."""

    name: ModelName = "custom"
    layers: Layers
    hidden: Width
    heads: Heads
    head_dim: Width | None = Field(default=None, description="width of one attention head; "
                                         "default hidden // heads (Qwen3, Gemma set it apart)")
    query_groups: Heads | None = Field(default=None, description="KV groups (GQA); default = heads")
    ffn: FfnWidth | None = Field(default=None, description="MLP hidden width; default 4*hidden")
    seq_length: SeqLength
    vocab: Vocab
    activation: Activation = "gelu"
    tied_embeddings: bool = True
    position_embedding: Literal["learned", "rope", "none"] = Field(
        default="learned", description="'learned' absolute positions (GPT), 'rope', or 'none' "
        "(Nemotron-H / Nemotron 3: the Mamba blocks carry position)")
    rope_scaling: Literal["none", "yarn", "llama3", "linear"] = Field(
        default="none", description="RoPE frequency scaling: 'yarn' (GPT-OSS; Megatron applies a "
        "YaRN RoPE unfused: time.py unfused_rope_extra_bytes_per_token), 'llama3' (Llama 3.1/3.2's "
        "long-context frequencies, Megatron --use-rope-scaling; fused, not costed apart) or 'linear' "
        "(positions divided by rope_scaling_factor, Megatron --rotary-seq-len-interpolation-factor; "
        "not costed apart)")
    rope_scaling_factor: RopeFactor | None = Field(
        default=None, description="RoPE scaling factor: llama3's (Megatron --rope-scaling-factor, default 8; "
        "Llama 3.1: 8, Llama 3.2: 32) or linear's (a whole number, required)")
    activation_clamp: ActivationClamp | None = Field(
        default=None, description="clamp limit of the gated MLP's inputs (GPT-OSS 7.0: gate at most "
        "+limit, linear half within ±limit); costed on the routed experts (moe_mlp_fwd_s)")
    biases: bool = True
    qkv_bias: bool = Field(default=False, description="biases on the q/k/v projections only (Qwen2, "
                           "GLM-4.5; Megatron --add-qkv-bias); `biases` has them already")
    rotary_percent: float = Field(default=1.0, gt=0, le=1, description="share of each head's width RoPE "
                                  "rotates (GLM-4.5: 0.5; Megatron --rotary-percent); not costed apart")
    # Two numbers the launch needs to train the named model and the cost does not read: left out
    # (None), Megatron's defaults apply (10,000 and 1e-5) and `planner megatron` says so.
    rope_base: RopeBase | None = Field(default=None, description="RoPE base frequency θ (Hugging Face "
                                       "rope_theta; Megatron --rotary-base, default 10000); not costed")
    norm_epsilon: NormEpsilon | None = Field(default=None, description="epsilon of every LayerNorm/RMSNorm "
                                             "(Hugging Face rms_norm_eps; Megatron --norm-epsilon, default "
                                             "1e-5); not costed")
    # Sliding-window attention and attention sinks, launched (Megatron --window-size W,0,
    # --window-attn-skip-freq N, --softmax-type learnable) but costed as full causal attention with
    # a plain softmax: the launch trains the named model, the time is an upper bound on its attention.
    attention_window: Width | None = Field(default=None, description="sliding-window attention width in "
                                           "tokens (Mistral 7B 4096, GPT-OSS 128); costed as full attention")
    window_full_every: Layers | None = Field(default=None, description="every N-th layer (1-based) keeps full "
                                             "attention, the others the window (GPT-OSS 2, Gemma 3 6); None: "
                                             "every layer windowed")
    attention_sinks: bool = Field(default=False, description="learnable per-head softmax offsets (GPT-OSS; "
                                  "Megatron --softmax-type learnable); counted (heads parameters a layer), not costed")
    dropout: bool = Field(default=True, description="hidden/attention dropout (GPT-3: yes; Llama: no)")
    qk_l2_norm: bool = Field(default=False, description="Llama 4's weightless L2 norm over each query and "
                             "key head (Megatron --qk-l2-norm): no parameters, unlike qk_norm")
    # Llama 4's interleaved NoPE: every n-th layer attends without rotary position embedding
    # (config.json no_rope_layers [1, 1, 1, 0] repeated: Megatron --no-rope-freq 4)
    no_rope_every: Annotated[int, Field(ge=2, le=1024)] | None = Field(
        default=None, description="every n-th layer without RoPE (Llama 4: 4; Megatron --no-rope-freq); its "
        "RoPE pass, a few memory-bound passes, is still costed on every layer")
    qk_norm: bool = Field(default=False, description="a norm over each query and key head before "
                          "attention (Qwen3, Gemma-3; Megatron --qk-layernorm)")
    moe: MoESpec | None = None
    mla: MLASpec | None = None
    mtp_layers: LayerCount = Field(default=0, description="multi-token-prediction modules "
                                       "(DeepSeek-V3: 1), each a block + 2h->h projection")
    mtp_shared_weights: bool = Field(default=False, description="the MTP modules are one module run "
                                     "mtp_layers times (Megatron mtp_use_repeated_layer; Nemotron 3 Super)")
    hybrid_pattern: str | None = Field(default=None, description="one block per layer: M Mamba-2, "
                                       "* attention, - dense MLP, E MoE MLP (Megatron "
                                       "--hybrid-layer-pattern; Nemotron-H)")
    mamba: MambaSpec | None = None

    @model_validator(mode="before")
    @classmethod
    def _default_head_dim(cls, data):
        # resolve head_dim here so that `model.head_dim` is always the width actually used
        if not isinstance(data, dict):
            return data
        mla = data.get("mla")
        v_head_dim = _whole(mla.get("v_head_dim") if isinstance(mla, dict) else getattr(mla, "v_head_dim", None))
        hidden, heads = _whole(data.get("hidden")), _whole(data.get("heads"))
        split = hidden // heads if hidden is not None and heads is not None and heads > 0 and hidden % heads == 0 \
            else None
        head_dim = data.get("head_dim")
        if head_dim is None:
            if split is not None:
                data = {**data, "head_dim": split}
            elif v_head_dim is not None:
                data = {**data, "head_dim": v_head_dim}  # MLA's widths live in `mla`
        elif v_head_dim is not None and _whole(head_dim) not in (None, split, v_head_dim):
            # MLA sets its own head widths: head_dim would be ignored. Its default and the values'
            # width, which change nothing, pass (the deepseek-v2 preset, Megatron's kv_channels)
            allowed = f"{v_head_dim} (mla.v_head_dim)" if split in (None, v_head_dim) else \
                f"{split} (hidden / heads) or {v_head_dim} (mla.v_head_dim)"
            raise ValueError(f"head_dim ({head_dim}) and mla: MLA's heads are mla.qk_nope_head_dim + "
                             "mla.qk_rope_head_dim wide (queries, keys) and mla.v_head_dim wide (values), so "
                             f"head_dim would be ignored; drop it (allowed with mla: {allowed})")
        return data

    @model_validator(mode="after")
    def _shape(self) -> "ModelSpec":
        if self.head_dim is None:
            raise ValueError(f"hidden ({self.hidden}) must be divisible by heads ({self.heads}), "
                             "or give head_dim")
        if self.heads % self.kv_groups:
            raise ValueError(f"query_groups ({self.kv_groups}) must divide heads ({self.heads})")
        if self.moe and self.moe.first_dense_layers >= self.layers:
            raise ValueError(f"moe.first_dense_layers ({self.moe.first_dense_layers}) must be < "
                             f"layers ({self.layers})")
        if self.moe and self.moe.layer_step > self.layers - self.moe.first_dense_layers:
            raise ValueError(f"moe.layer_step ({self.moe.layer_step}) leaves no MoE layer: it must be <= layers "
                             f"after the leading dense ones ({self.layers - self.moe.first_dense_layers})")
        self._check_no_idle_fields()
        if self.hybrid_pattern is not None:
            self._check_hybrid()
        elif self.mamba is not None:
            raise ValueError("mamba: a Mamba mixer needs hybrid_pattern (which layers are Mamba blocks)")
        return self

    def uncosted_attention(self) -> str:
        """What of the attention is launched but costed as full causal attention with a plain
        softmax (a window shorter than the sequence, GPT-OSS's sinks), as a sentence; "" if nothing."""
        parts = []
        if self.attention_window is not None and self.attention_window < self.seq_length:
            parts.append(f"the {self.attention_window}-token sliding window"
                         + (f" (full attention every {self.window_full_every} layers)" if self.window_full_every else ""))
        if self.attention_sinks:
            parts.append("the learnable attention sinks")
        if not parts:
            return ""
        return (" and ".join(parts) + (" are" if self.attention_sinks else " is")  # the sinks are plural
                + " launched but costed as full causal attention with a plain softmax: the attention core's "
                "time is an upper bound")

    def _check_no_idle_fields(self) -> None:
        """A field that changes nothing beside the others is a mistake in the file, not a no-op."""
        if self.activation_clamp is not None and self.activation != "swiglu":
            raise ValueError(f"activation_clamp clamps a gated MLP's inputs; activation {self.activation} has none "
                             "(use activation: swiglu or drop activation_clamp)")
        if self.rope_scaling != "none" and self.position_embedding != "rope":
            raise ValueError(f"rope_scaling ({self.rope_scaling}) scales RoPE; position_embedding is "
                             f"{self.position_embedding}")
        if self.no_rope_every is not None and self.position_embedding != "rope":
            raise ValueError(f"no_rope_every ({self.no_rope_every}) leaves RoPE out of some layers; "
                             f"position_embedding is {self.position_embedding}")
        if self.no_rope_every is not None and self.layers % self.no_rope_every:
            raise ValueError(f"no_rope_every ({self.no_rope_every}) must divide layers ({self.layers}) "
                             "(Megatron repeats the pattern over the whole stack)")
        if self.qk_l2_norm and self.qk_norm:
            raise ValueError("qk_l2_norm and qk_norm: a query/key head takes one norm; keep one")
        if self.qk_l2_norm and self.mla:
            raise ValueError("qk_l2_norm: not with MLA (Megatron: qk_l2_norm is not supported with MLA)")
        if self.qkv_bias and self.biases:
            raise ValueError("qkv_bias: biases: true has the q/k/v biases already (drop qkv_bias)")
        if self.qkv_bias and self.mla:
            raise ValueError("qkv_bias: MLA's projections are not q/k/v ones (drop qkv_bias)")
        if self.window_full_every is not None and self.window_full_every > self.layers:
            raise ValueError(f"window_full_every ({self.window_full_every}) is beyond the {self.layers} layers: no "
                             "layer would keep full attention; drop it (every layer windowed) or give N <= layers")
        if self.window_full_every == 1:
            raise ValueError("window_full_every 1 gives every layer full attention, so no layer uses "
                             "attention_window; drop both, or give every N >= 2")
        if self.window_full_every is not None and self.attention_window is None:
            raise ValueError(f"window_full_every ({self.window_full_every}) places full-attention layers among "
                             "windowed ones; attention_window is not set")
        if self.rope_scaling_factor is not None and self.rope_scaling not in ("llama3", "linear"):
            raise ValueError(f"rope_scaling_factor ({self.rope_scaling_factor:g}) sizes llama3 or linear RoPE scaling; "
                             f"rope_scaling is {self.rope_scaling} (use rope_scaling: llama3 or linear, or drop it)")
        if self.rope_scaling == "linear" and (self.rope_scaling_factor is None
                                              or not float(self.rope_scaling_factor).is_integer()):
            raise ValueError("rope_scaling linear: give rope_scaling_factor as a whole number (Megatron's "
                             f"--rotary-seq-len-interpolation-factor is an integer), got {self.rope_scaling_factor}")
        if self.rope_base is not None and self.position_embedding != "rope":
            raise ValueError(f"rope_base ({self.rope_base}) is RoPE's base; position_embedding is "
                             f"{self.position_embedding}")
        if self.rotary_percent != 1.0 and self.position_embedding != "rope":
            raise ValueError(f"rotary_percent ({self.rotary_percent}) sizes RoPE; position_embedding is "
                             f"{self.position_embedding}")
        if self.mtp_layers > self.layers:  # DeepSeek-V3 predicts 1 token ahead, Nemotron 3 Super 2
            raise ValueError(f"mtp_layers ({self.mtp_layers}) exceeds the {self.layers} layers: each MTP module "
                             "predicts one more token ahead; published models use 1 or 2")
        if self.mtp_shared_weights and not self.mtp_layers:
            raise ValueError("mtp_shared_weights needs mtp_layers > 0 (there is no MTP module to share)")
        if self.moe and self.moe.shared_expert_ffn is not None and not self.moe.shared_experts:
            raise ValueError("moe.shared_expert_ffn sizes shared experts; moe.shared_experts is 0")
        if self.moe and self.moe.latent_size is not None and self.moe.latent_size >= self.hidden:
            raise ValueError(f"moe.latent_size ({self.moe.latent_size}) must be < hidden ({self.hidden}): LatentMoE "
                             "projects the routed rows down to it")

    def _check_hybrid(self) -> None:
        pattern = self.hybrid_pattern
        bad = sorted(set(pattern) - set(HYBRID_BLOCKS))
        if bad:  # each character named apart ('memem' said 'em' is not a block)
            upper = " (blocks are upper case)" if all(c.upper() in HYBRID_BLOCKS for c in bad) else ""
            verb = "is not a block" if len(bad) == 1 else "are not blocks"
            raise ValueError(f"hybrid_pattern: {', '.join(map(repr, bad))} {verb}{upper}; allowed: "
                             + ", ".join(f"{k} ({v})" for k, v in HYBRID_BLOCKS.items()))
        if len(pattern) != self.layers:
            raise ValueError(f"hybrid_pattern has {len(pattern)} blocks; it must have one per layer ({self.layers})")
        if "M" not in pattern and "*" not in pattern:
            raise ValueError("hybrid_pattern: no Mamba (M) and no attention (*) block, so no token sees another; "
                             "a stack needs at least one sequence mixer")
        if ("M" in pattern) != (self.mamba is not None):
            raise ValueError("hybrid_pattern and mamba: Mamba blocks (M) need `mamba`, and `mamba` needs M blocks")
        if ("E" in pattern) != (self.moe is not None):
            raise ValueError("hybrid_pattern and moe: MoE blocks (E) need `moe`, and `moe` needs E blocks")
        if self.moe and (self.moe.first_dense_layers or self.moe.layer_step > 1):
            field = "first_dense_layers" if self.moe.first_dense_layers else "layer_step"
            raise ValueError(f"moe.{field}: a hybrid model places its dense MLPs in hybrid_pattern (-)")
        if self.mla:
            raise ValueError("hybrid_pattern: MLA is not modelled in hybrid stacks")
        if self.mtp_layers and not (self.moe and "*" in self.hybrid_pattern):
            raise ValueError("hybrid_pattern: a hybrid stack's MTP module is an attention and a MoE block "
                             "(Nemotron's mtp_hybrid_override_pattern *E); it needs both")
        if self.mamba and self.mamba.d_inner % self.mamba.groups:
            raise ValueError("mamba: groups must divide num_heads·head_dim")

    # ---- derived widths -------------------------------------------------------------------
    @property
    def kv_groups(self) -> int:
        return self.query_groups or self.heads

    @property
    def q_hidden(self) -> int:
        """Width of all query heads (= hidden unless head_dim is set apart; MLA: heads·(nope+rope))."""
        return self.heads * (self.mla.qk_head_dim if self.mla else self.head_dim)

    @property
    def kv_hidden(self) -> int:
        """Width of the keys (= of the values): kv_groups·head_dim. MLA's keys (heads·(nope+rope))
        and values (heads·v_head_dim) differ; kv_hidden is then their mean, so that 2·kv_hidden
        is the K+V width that attention stores and context parallelism exchanges."""
        if self.mla:
            return self.heads * (self.mla.qk_head_dim + self.mla.v_head_dim) // 2
        return self.kv_groups * self.head_dim

    @property
    def ffn_hidden(self) -> int:
        return self.ffn or 4 * self.hidden

    @property
    def expert_ffn_hidden(self) -> int:
        return (self.moe.expert_ffn if self.moe and self.moe.expert_ffn else None) or self.ffn_hidden

    @property
    def shared_expert_ffn_hidden(self) -> int:
        """Width of each shared expert (0 without shared experts)."""
        if not self.moe or not self.moe.shared_experts:
            return 0
        return self.moe.shared_expert_ffn or self.expert_ffn_hidden

    @property
    def expert_hidden(self) -> int:
        """Width of the rows the routed experts see and the all-to-all moves: the LatentMoE
        latent size, else the hidden size."""
        return (self.moe.latent_size if self.moe else None) or self.hidden

    @property
    def latent_proj_params(self) -> int:
        """LatentMoE's two projections of one MoE layer, h -> latent and latent -> h (0 without)."""
        return 2 * self.hidden * self.moe.latent_size if self.moe and self.moe.latent_size else 0

    @property
    def mlp_matrices(self) -> int:
        """Weight matrices of width ffn in one MLP: up+down, plus the gate for SwiGLU."""
        return 3 if self.activation == "swiglu" else 2

    # ---- hybrid stacks: blocks per kind ---------------------------------------------------
    def blocks(self, kind: str) -> int:
        """Layers of one block kind of a hybrid stack (HYBRID_BLOCKS); 0 for a transformer."""
        return self.hybrid_pattern.count(kind) if self.hybrid_pattern else 0

    @property
    def attention_layers(self) -> int:
        """Layers with an attention block (every layer of a transformer)."""
        return self.blocks("*") if self.hybrid_pattern else self.layers

    @property
    def ssd_chunk_tokens(self) -> int:
        """The SSD chunk a sequence is scanned in: mamba.chunk_size, or the whole sequence where it
        is shorter (mamba_ssm's chunk kernels stop at the sequence's end; a chunk_size beyond it
        had been costed as if the chunk were filled)."""
        return min(self.mamba.chunk_size, self.seq_length)

    @property
    def mamba_block_params(self) -> int:
        """One Mamba-2 block: in_proj h×in_proj_width, the conv1d (weights and bias per channel),
        dt bias, A and D per head, the gated RMSNorm over d_inner, out_proj d_inner×h, the pre-norm
        (Megatron-Core ssm/mamba_mixer.py; no linear biases)."""
        m = self.mamba
        return (self.hidden * m.in_proj_width + m.conv_channels * (m.conv_kernel + 1) + 3 * m.num_heads
                + m.d_inner + m.d_inner * self.hidden + self.hidden)

    def _hybrid_mean(self, per_kind: dict[str, int]) -> float:
        """Mean over the pattern's layers of a per-block-kind count."""
        return sum(self.blocks(k) * v for k, v in per_kind.items()) / self.layers

    # ---- layer kinds: dense MLP layers and MoE layers ------------------------------------
    @property
    def dense_layer_positions(self) -> tuple[int, ...]:
        """0-based indices of the layers whose MLP is the dense ffn (all of a dense model's; a MoE
        model's leading dense layers, then those between its interleaved MoE layers)."""
        if not self.moe:
            return tuple(range(self.layers))
        first, step = self.moe.first_dense_layers, self.moe.layer_step
        return tuple(i for i in range(self.layers) if i < first or (i - first + 1) % step)

    @property
    def dense_layers(self) -> int:
        """Layers whose MLP is the dense ffn (all layers of a dense model)."""
        return len(self.dense_layer_positions) if self.moe else self.layers

    @property
    def moe_layers(self) -> int:
        return self.layers - self.dense_layers

    # ---- parameter counts (Narayanan et al. SC'21 sec 3.2: P = 12lh^2(1 + 13/12h + (V+s)/12lh)
    # for GPT; generalised here to GQA, head_dim, SwiGLU, MoE and MLA) -----------------------
    @property
    def attention_params(self) -> int:
        """One layer's attention weights (+ biases; + MLA's two latent norms)."""
        h = self.hidden
        if self.mla:
            return _mla_params(h, self.heads, self.mla)
        qkv = self.q_hidden + 2 * self.kv_hidden
        weights = h * qkv + self.q_hidden * h  # QKV + output projection
        # q/k norms: one head_dim-wide norm each, shared by all heads (HF Qwen3Attention q_norm/k_norm)
        qk_norm = 2 * self.norm_elems_per_width * self.head_dim if self.qk_norm else 0
        bias = qkv + h if self.biases else qkv if self.qkv_bias else 0
        # attention sinks: one learnable softmax offset per head (HF GptOssAttention.sinks
        # [num_attention_heads]; Megatron-Core dot_product_attention.py softmax_offset, built under
        # --softmax-type learnable, [heads per TP partition]: split over tp like the heads)
        sinks = self.heads if self.attention_sinks else 0
        return weights + bias + qk_norm + sinks

    def _mlp_params(self, ffn: int, width: int | None = None) -> int:
        """One MLP of inner width `ffn` on rows `width` wide (default the hidden size)."""
        width = width or self.hidden
        weights = self.mlp_matrices * width * ffn
        bias = ((self.mlp_matrices - 1) * ffn + width) if self.biases else 0
        return weights + bias

    @property
    def dense_mlp_params(self) -> int:
        return self._mlp_params(self.ffn_hidden)

    @property
    def expert_params_per_layer(self) -> float:
        """All routed experts of one MoE layer (0 for dense models): the part EP shards. A hybrid
        stack's mean over its layers (E blocks hold them)."""
        experts = self.moe.num_experts * self._mlp_params(self.expert_ffn_hidden, self.expert_hidden) if self.moe else 0
        return self._hybrid_mean({"E": experts}) if self.hybrid_pattern else experts

    @property
    def shared_expert_params_per_layer(self) -> int:
        return self.moe.shared_experts * self._mlp_params(self.shared_expert_ffn_hidden) if self.moe else 0

    @property
    def router_params(self) -> int:
        """The router (h×E) and, with LatentMoE, the two latent projections (non-expert weights
        every token passes)."""
        return self.router_gate_params + self.latent_proj_params

    @property
    def router_gate_params(self) -> int:
        """The router's own parameters, its E×h weight and bias (router_bias_params), which
        Megatron-Core's moe/router.py TopKRouter creates as plain torch Parameters: whole on every
        TP rank and never FP8 (not a Transformer Engine module); 0 for dense models."""
        return self.hidden * self.moe.num_experts + self.router_bias_params if self.moe else 0

    @property
    def router_bias_params(self) -> int:
        """The router's bias, one per expert, on a model with linear biases (HF GptOssTopKRouter.bias
        [num_local_experts]; Megatron-Core moe/router.py TopKRouter builds `bias` [num_experts]
        when add_bias_linear); 0 otherwise."""
        return self.moe.num_experts if self.moe and self.biases else 0

    @property
    def mla_down_proj_params(self) -> int:
        """MLA's down-projections of one layer, h×q_lora_rank (with a query LoRA) and
        h×(kv_lora_rank + qk_rope_head_dim); 0 without MLA."""
        if not self.mla:
            return 0
        return self.hidden * ((self.mla.q_lora_rank or 0) + self.mla.kv_lora_rank + self.mla.qk_rope_head_dim)

    @property
    def tp_replicated_params_by_block(self) -> dict[str, int]:
        """Weights of one layer (a hybrid stack: one block of each kind) that every tensor-parallel
        rank holds whole, norms apart: MLA's down-projections (Megatron-Core gpt_layer_specs.py
        builds linear_q_down_proj / linear_kv_down_proj as TELinear, which
        multi_latent_attention.py makes parallel_mode="duplicated"), a MoE layer's router
        weight E×h and its bias (moe/router.py TopKRouter: plain Parameters, not split over tp),
        and the biases of the row-parallel linears, attention's output projection and the MLP's
        fc2 (shared experts' included): tensor_parallel/layers.py RowParallelLinear builds its bias
        over the whole output width on every rank, added after the reduce (TE's row-parallel
        Linear likewise)."""
        router = self.router_gate_params
        row_bias = self.hidden if self.biases else 0
        shared = self.moe.shared_experts * row_bias if self.moe else 0
        if self.hybrid_pattern:
            return {"*": row_bias, "-": row_bias, "E": router + shared}
        return {"layer": self.mla_down_proj_params + router + row_bias + (shared if self.moe else row_bias)}

    @property
    def expert_tp_replicated_params_per_layer(self) -> float:
        """Routed-expert parameters of one MoE layer that every expert-tensor-parallel rank holds
        whole: each expert's fc2 bias, h wide (moe/experts.py SequentialMLP's RowParallelLinear,
        TEGroupedMLP's TERowParallelGroupedLinear: the whole output width on every rank; the fc1
        bias is column-parallel, split). A hybrid stack's mean over its layers."""
        per_block = self.mtp_layer_expert_tp_replicated_params
        return self._hybrid_mean({"E": per_block}) if self.hybrid_pattern else per_block

    @property
    def router_params_per_layer(self) -> float:
        """router_gate_params of the repeated layer (a hybrid stack's mean over its layers, of
        which only the MoE blocks route)."""
        return self._hybrid_mean({"E": self.router_gate_params}) if self.hybrid_pattern else self.router_gate_params

    @property
    def tp_replicated_params_per_layer(self) -> float:
        """tp_replicated_params_by_block of the repeated layer (a hybrid stack's mean block)."""
        if self.hybrid_pattern:
            return self._hybrid_mean(self.tp_replicated_params_by_block)
        return self.tp_replicated_params_by_block["layer"]

    @property
    def mtp_layer_tp_replicated_params(self) -> int:
        """tp_replicated_params_by_block of one MTP module's layer (a hybrid stack's: its attention
        block and its MoE block)."""
        by_block = self.tp_replicated_params_by_block
        return by_block["*"] + by_block["E"] if self.hybrid_pattern else by_block["layer"]

    @property
    def mtp_layer_expert_tp_replicated_params(self) -> int:
        """The routed experts' fc2 biases of one MoE layer (a hybrid stack's: one MoE block's), as
        an MTP module's layer holds them: expert_tp_replicated_params_per_layer per MoE layer."""
        return self.moe.num_experts * self.expert_hidden if self.moe and self.biases else 0

    @property
    def rms_norm(self) -> bool:
        """The norm Megatron runs (`planner megatron` launches --normalization RMSNorm): RMSNorm for
        Llama-style models (RoPE, or none as Nemotron-H), LayerNorm for GPT-style ones (learned
        positions)."""
        return self.position_embedding != "learned"

    @property
    def norm_elems_per_width(self) -> int:
        """Parameters of one norm per unit of its width: the weight, and a bias for a LayerNorm of a
        model with linear biases (GPT-3). An RMSNorm has no bias even beside linear biases (GPT-OSS:
        HF GptOssRMSNorm holds `weight` only; Megatron-Core's RMSNorm builds none)."""
        return 2 if self.biases and not self.rms_norm else 1

    @property
    def norm_params(self) -> int:
        return 2 * self.norm_elems_per_width * self.hidden  # two norms per layer

    @property
    def dense_layer_params(self) -> int:
        """One layer with the dense MLP."""
        return self.attention_params + self.dense_mlp_params + self.norm_params

    @property
    def moe_layer_non_expert_params(self) -> int:
        """One MoE layer without its routed experts: attention, router, shared experts, norms."""
        return self.attention_params + self.router_params + self.shared_expert_params_per_layer \
            + self.norm_params

    @property
    def moe_layer_params(self) -> int:
        return self.moe_layer_non_expert_params + self.expert_params_per_layer if self.moe else 0

    @property
    def non_expert_params_per_layer(self) -> float:
        """The repeated layer without routed experts: the MoE layer for MoE models (an upper bound
        for their few leading dense layers, see dense_layer_params), else the dense layer. A hybrid
        stack's mean block (each block one pre-norm), as memory costs its stages by layer count."""
        if self.hybrid_pattern:
            return self._hybrid_mean(self.non_expert_params_by_block)
        return self.moe_layer_non_expert_params if self.moe else self.dense_layer_params

    @property
    def non_expert_params_by_block(self) -> dict[str, float]:
        """A hybrid stack's parameters of one block of each kind, routed experts apart (each block
        has one pre-norm)."""
        norm = self.norm_params / 2
        return {"M": self.mamba_block_params if self.mamba else 0, "*": self.attention_params + norm,
                "-": self.dense_mlp_params + norm,
                "E": self.router_params + self.shared_expert_params_per_layer + norm}

    @property
    def params_per_layer(self) -> int:
        """The repeated layer (the MoE layer for MoE models)."""
        return self.non_expert_params_per_layer + self.expert_params_per_layer

    @property
    def transformer_params(self) -> int:
        """All layers of the main stack, dense and MoE layers counted as what they are (a hybrid
        stack: every block as what it is)."""
        if self.hybrid_pattern:
            return round(self.layers * (self.non_expert_params_per_layer + self.expert_params_per_layer))
        return self.dense_layers * self.dense_layer_params + self.moe_layers * self.moe_layer_params

    @property
    def mtp_layer_expert_params(self) -> int:
        """Routed experts of one MTP module's layer (a hybrid stack's: one MoE block's)."""
        if self.hybrid_pattern:
            return self.moe.num_experts * self._mlp_params(self.expert_ffn_hidden, self.expert_hidden) if self.moe else 0
        return self.expert_params_per_layer

    @property
    def mtp_layer_params(self) -> float:
        """One MTP module's layer: the repeated layer, or a hybrid stack's attention block and MoE
        block (Nemotron's mtp_hybrid_override_pattern "*E")."""
        if self.hybrid_pattern:
            norm = self.norm_params / 2
            return (self.attention_params + norm + self.router_params + self.shared_expert_params_per_layer + norm
                    + self.mtp_layer_expert_params)
        return self.params_per_layer

    @property
    def mtp_weight_modules(self) -> int:
        """MTP modules with weights of their own (one when they share them)."""
        return min(self.mtp_layers, 1) if self.mtp_shared_weights else self.mtp_layers

    @property
    def mtp_params(self) -> int:
        """DeepSeek-V3 §2.2 MTP modules: each a layer of the repeated kind, the projection
        M ∈ R^{h×2h}, and the norms of its two inputs and of its output; embedding and output
        head are shared with the main model (DeepSeek-V3 config: num_nextn_predict_layers)."""
        norm = self.norm_elems_per_width * self.hidden
        return round(self.mtp_weight_modules * (self.mtp_layer_params + 2 * self.hidden * self.hidden + 3 * norm))

    @property
    def embedding_params(self) -> int:
        pos = self.seq_length * self.hidden if self.position_embedding == "learned" else 0
        return self.vocab * self.hidden + pos

    @property
    def output_params(self) -> int:
        """LM head weights that are not shared with the input embedding (+ final norm)."""
        head = 0 if self.tied_embeddings else self.vocab * self.hidden
        return head + self.norm_elems_per_width * self.hidden

    @property
    def num_params(self) -> int:
        """Every parameter, MTP modules included."""
        return self.transformer_params + self.mtp_params + self.embedding_params + self.output_params

    @property
    def active_expert_params_per_layer(self) -> int:
        """Routed-expert parameters one token uses in one MoE layer (top_k experts)."""
        return self.moe.top_k * self._mlp_params(self.expert_ffn_hidden, self.expert_hidden) if self.moe else 0

    @property
    def active_params(self) -> int:
        """Parameters touched per token in the main model (MoE: only top_k experts; without
        the MTP modules, as DeepSeek-V3 reports its 37B)."""
        if not self.moe:
            return self.num_params - self.mtp_params
        if self.hybrid_pattern:
            active = self.layers * self.non_expert_params_per_layer + self.blocks("E") * self.active_expert_params_per_layer
            return round(active) + self.embedding_params + self.output_params
        moe_layer = self.moe_layer_non_expert_params + self.active_expert_params_per_layer
        return self.dense_layers * self.dense_layer_params + self.moe_layers * moe_layer + \
            self.embedding_params + self.output_params


def _mla_params(hidden: int, heads: int, mla: MLASpec) -> int:
    """MLA weights with the DeepSeek-V3 checkpoint's shapes: q_a_proj h×q_lora + q_a_layernorm +
    q_b_proj q_lora×heads·(nope+rope) (or q_proj h×heads·(nope+rope)); kv_a_proj_with_mqa
    h×(kv_lora+rope) + kv_a_layernorm; kv_b_proj kv_lora×heads·(nope+v); o_proj heads·v×h.
    No biases (attention_bias: false)."""
    q_out = heads * mla.qk_head_dim
    if mla.q_lora_rank:
        q = hidden * mla.q_lora_rank + mla.q_lora_rank + mla.q_lora_rank * q_out
    else:
        q = hidden * q_out
    kv = hidden * (mla.kv_lora_rank + mla.qk_rope_head_dim) + mla.kv_lora_rank \
        + mla.kv_lora_rank * heads * (mla.qk_nope_head_dim + mla.v_head_dim)
    return q + kv + heads * mla.v_head_dim * hidden


def model_preset_names() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


def load_model(ref: str, overrides: dict | None = None) -> ModelSpec:
    """Preset name, model YAML, Hugging Face config.json or a directory holding one -> ModelSpec;
    `overrides` replace fields (e.g. seq_length)."""
    ref = reference_text(ref, "model")
    check_name_length(ref, "model")
    if overrides is not None and not isinstance(overrides, dict):
        raise SpecError(f"load_model: overrides must be a mapping of field: value, got {type(overrides).__name__}")
    config_json = hf_config.find_config_json(ref, model_preset_names())
    if config_json is not None:
        data, label = _config_fields(config_json), f"Hugging Face config {config_json}"
    else:
        path, label = resolve_preset_or_file(ref, PRESET_DIR, "model")
        if path.resolve().parent == PRESET_DIR.resolve():
            try:
                key = tuple(sorted((overrides or {}).items()))
                hash(key)
            except TypeError:  # an override that is not a plain value: validated the long way
                key = None
            if key is not None:
                return _preset_model(path.resolve(), label, key)
        data = read_yaml_mapping(path, "model")
    return _validated_model(data, overrides, label, config_json)


@functools.lru_cache(maxsize=256)
def _preset_model(path: Path, label: str, overrides: tuple) -> ModelSpec:
    """A shipped preset, parsed and validated once per process per set of overrides (a search
    or a validation run asks for the same few presets thousands of times); ModelSpec and its
    parts are frozen, so one instance serves every caller."""
    return _validated_model(read_yaml_mapping(path, "model"), dict(overrides), label, None)


def _validated_model(data: dict, overrides: dict | None, label: str, config_json: Path | None) -> ModelSpec:
    data.update({k: v for k, v in (overrides or {}).items() if v is not None})
    try:
        refuse_loose_types(data, ModelSpec, f"model ({label})")
        return ModelSpec.model_validate(data)
    except ValidationError as err:
        other = "" if config_json is not None else other_kind_of_file(data, "model")
        if other:
            raise SpecError(f"model ({label}): {other}") from None
        error = one_line(err, f"model ({label})", ModelSpec)
        if config_json is not None:  # name the config key the user wrote, not the planner's field
            for field, key in hf_config.CONFIG_KEY_OF_FIELD.items():
                if str(error).startswith(f"model ({label}): {field}: "):
                    error = SpecError(str(error).replace(f": {field}: ", f": {key} (the planner's {field}): ", 1))
                    break
            else:  # a rule between fields: say which config keys its names are
                said = str(error)[len(f"model ({label}): "):]
                keys = [f"{word} = {key}" for word, key in hf_config.CONFIG_KEYS_OF_WORD.items()
                        if key != word and re.search(rf"(?<!\w){re.escape(word)}\b", said)]
                if keys:
                    error = SpecError(f"{error} (in config.json: {'; '.join(keys)})")
        raise error from None


def _config_fields(path: Path) -> dict:
    """hf_config.model_fields, an integer of more digits than Python converts (json raises a bare
    ValueError, "Exceeds the limit (4300 digits)") said in one line as the YAML readers say it."""
    try:
        return hf_config.model_fields(path)
    except SpecError:
        raise
    except ValueError as exc:
        error = digit_limit_error(exc, f"model {path}")
        if error is None:
            raise
        raise error from None
