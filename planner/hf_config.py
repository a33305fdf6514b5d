"""A Hugging Face `config.json` as a model: its fields mapped onto ModelSpec's.

One mapping serves every decoder-only architecture; `model_type` only chooses the defaults that a
config may leave out (tied embeddings, the MLP's activation, which MoE field names it uses). A
`model_type` not in ARCHITECTURES is read on purpose, from its own fields and Hugging Face's
defaults (tied embeddings; a gated MLP only with a SiLU activation), not refused; a config that
lacks a field the mapping needs is refused naming the field and the architectures read; a key
that only another architecture's Hugging Face class reads (KEYS_READ_BY: moe_intermediate_size
in a Mixtral config, shared experts in a Qwen3-MoE one) is refused naming the key and the model_type.
DeepSeek's left-out MLA ranks are Hugging Face's defaults (HF_MLA_DEFAULTS), said when read.
What ModelSpec cannot express is approximated, named in APPROXIMATIONS and said when a config is
read (`approximation_notes`): sliding-window layers are costed as full attention (and launched with
their window: `window_fields`), GeGLU as SwiGLU
(same three matrices); Gemma's extra norms are not counted (under 0.01 % of the parameters).
Qwen2's q/k/v biases are `qkv_bias`, Qwen3's and Gemma-3's per-head q/k norms `qk_norm`, GPT-OSS's
attention sinks `attention_sinks` (counted, not costed).
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Iterable

from hardware.errors import MAX_YAML_BYTES, SpecError, finite_number, kind_text

# Training runs pre-train at 4k–8k tokens and extend the context later; max_position_embeddings
# (often 128k) is the inference limit, so it is only an upper bound here.
HF_DEFAULT_SEQ_LENGTH = 4096

# model_type -> (defaults for fields a config may omit, what is approximated)
ARCHITECTURES: dict[str, tuple[dict, str]] = {
    "llama": ({"tie_word_embeddings": False}, ""),
    "mistral": ({"tie_word_embeddings": False}, ""),  # sliding windows: sliding_window_note
    "mixtral": ({"tie_word_embeddings": False}, ""),
    "qwen2": ({"tie_word_embeddings": False}, ""),
    "qwen2_moe": ({"tie_word_embeddings": False}, ""),
    "qwen3": ({"tie_word_embeddings": True}, ""),
    "qwen3_moe": ({"tie_word_embeddings": False}, ""),
    # transformers' DeepseekV2Config defaults tie_word_embeddings to False, as DeepseekV3Config
    "deepseek_v2": ({"tie_word_embeddings": False}, ""),
    "deepseek_v3": ({"tie_word_embeddings": False}, ""),
    "gpt_oss": ({"tie_word_embeddings": False, "attention_bias": True},
                "attention sinks launched (--softmax-type learnable) but not costed; clamped quick-GeGLU "
                "costed as SwiGLU plus its clamp passes"),
    "gemma": ({"tie_word_embeddings": True}, "GeGLU costed as SwiGLU"),
    "gemma2": ({"tie_word_embeddings": True}, "GeGLU costed as SwiGLU"),
    # transformers' Gemma3TextConfig defaults, which the hub's gemma-3-4b/27b configs rely on
    # (configuration_gemma3.py: vocab 262,208, 8 heads in 4 KV groups, head_dim 256; RoPE base
    # 1,000,000 on the global layers and 10,000 on the windowed ones, norm epsilon 1e-6)
    "gemma3_text": ({"tie_word_embeddings": True, "vocab_size": 262_208, "num_attention_heads": 8,
                     "num_key_value_heads": 4, "head_dim": 256, "sliding_window_pattern": 6,
                     "rope_theta": 1_000_000, "rope_local_base_freq": 10_000, "rms_norm_eps": 1e-6},
                    "GeGLU costed as SwiGLU"),
    "nemotron_h": ({"tie_word_embeddings": False},
                   "a hybrid stack: each layer costed as the pattern's mean block (exact without "
                   "pipelining); attention without position embedding costed with RoPE's fused pass"),
    "glm4_moe": ({"tie_word_embeddings": False}, "partial RoPE (partial_rotary_factor) not costed apart"),
    # the original Qwen (Qwen-1.8B/7B/14B/72B, remote code; configuration_qwen.py QWenConfig:
    # tie_word_embeddings False): its MLP width is half its intermediate_size (HALVED_FFN_TYPES)
    "qwen": ({"tie_word_embeddings": False}, ""),
    # Llama 4 (the text tower of Llama4ForConditionalGeneration): every MoE layer also runs one
    # shared expert as wide as a routed one (transformers modeling_llama4.py Llama4TextMoe)
    "llama4_text": ({"tie_word_embeddings": False},
                    "chunked attention (attention_chunk_size) costed as full causal attention, the same "
                    "up to the chunk length; the weightless L2 q/k norm of the RoPE layers launched on "
                    "every layer (Megatron --qk-l2-norm)"),
}
APPROXIMATIONS = {k: v[1] for k, v in ARCHITECTURES.items()}
# Architectures whose config's intermediate_size is the gated MLP's two input projections together:
# the original Qwen's QWenMLP builds w1 and w2 of intermediate_size // 2 each and c_proj from that
# width (Qwen/Qwen-7B modeling_qwen.py; vLLM qwen.py QWenBlock: QWenMLP(hidden, intermediate_size // 2)).
# Read as written, Qwen-1.8B cost 2.65 B parameters for its 1.84 B.
HALVED_FFN_TYPES = ("qwen",)
# Models whose attention is not causal-decoder attention (encoders see the whole sequence; an
# encoder-decoder has a second stack and cross-attention): costed as a decoder they would be
# silently wrong, and Megatron's GPT launch would train another model
ENCODER_TYPES = ("albert", "bert", "camembert", "deberta", "deberta-v2", "distilbert", "electra", "ernie",
                 "modernbert", "mpnet", "roberta", "xlm-roberta", "xlm-roberta-xl",
                 "bart", "mbart", "pegasus", "t5", "mt5", "umt5", "longt5", "switch_transformers", "whisper")

# Recurrent and state-space stacks with no attention layers (transformers' Mamba, Mamba-2, RWKV,
# xLSTM, RecurrentGemma is hybrid but its recurrent blocks are not Mamba-2): costed from llama-style
# fields they would be an attention model they are not. Hybrid Mamba-2 stacks are read as
# nemotron_h (hybrid_override_pattern); Jamba's layer kinds are refused where its fields name them.
RECURRENT_TYPES = ("mamba", "mamba2", "falcon_mamba", "rwkv", "rwkv5", "rwkv6", "rwkv7", "xlstm",
                   "recurrent_gemma")


def refuse_encoders(cfg: dict, path: Path) -> None:
    """A one-line error for an encoder or encoder-decoder config (the planner costs causal
    decoder-only stacks). Multimodal wrappers (…ForConditionalGeneration with a text_config) are
    read for their language model, so only an encoder model_type or the encoder-decoder flag refuse."""
    kind = cfg.get("model_type")
    if cfg.get("is_encoder_decoder") is True or kind in ENCODER_TYPES:
        what = "an encoder-decoder" if cfg.get("is_encoder_decoder") is True else "an encoder (bidirectional attention)"
        raise SpecError(f"model {path}: model_type {_shown(kind)} is {what}; the planner costs decoder-only "
                        "causal language models (GPT, Llama, Mixtral, DeepSeek, ...)")
    if kind is None and isinstance(cfg.get("architectures"), list):
        # no model_type to go by: the class names say it (BertForMaskedLM, RobertaModel)
        for arch in (a for a in cfg["architectures"] if isinstance(a, str)):
            low = arch.lower()
            if low.endswith("formaskedlm") or (any(low.startswith(e.replace("-", "")) for e in ENCODER_TYPES)
                                                and not low.endswith("forcausallm")):
                raise SpecError(f"model {path}: architectures {_shown(arch)} is an encoder model (and the config "
                                "names no model_type); the planner costs decoder-only causal language models")
    if kind in RECURRENT_TYPES:
        raise SpecError(f"model {path}: model_type {_shown(kind)} is a recurrent (state-space or RNN) stack with no "
                        "attention layers; the planner costs transformers and hybrid Mamba-2 stacks written as "
                        "nemotron_h (hybrid_override_pattern)")


# Which layers keep full attention: a config's layer_types (GPT-OSS, newer Gemma-3 dumps), else
# Gemma-2's alternation (transformers Gemma2DecoderLayer: even layer_idx windowed), Gemma-3's
# sliding_window_pattern (every 6th layer full), else every layer windowed (Mistral 7B v0.1).
FULL_ATTENTION_KINDS = ("full_attention", "global", "attention")


UNSAYABLE = "unsayable"  # a layer pattern Megatron's integer --window-attn-skip-freq cannot say


def _window_layout(cfg: dict) -> tuple[int, int | None] | str | None:
    """(window, N: every N-th layer keeps full attention, None: every layer windowed) of a config's
    sliding windows; None where no layer is windowed; UNSAYABLE where the full layers are no
    integer frequency."""
    window = cfg.get("sliding_window")
    if not window or cfg.get("use_sliding_window") is False:
        return None
    every = None
    kinds = cfg.get("layer_types") if isinstance(cfg.get("layer_types"), list) else None
    if kinds:
        full = [i + 1 for i, k in enumerate(kinds) if k in FULL_ATTENTION_KINDS]
        if len(full) == len(kinds):
            return None
        if full:
            every = full[0]
            if full != list(range(every, len(kinds) + 1, every)):
                return UNSAYABLE
    elif cfg.get("model_type") == "gemma2":
        every = 2
    elif isinstance(cfg.get("sliding_window_pattern"), int):
        every = cfg["sliding_window_pattern"]
        if every == 1:  # every layer keeps full attention: no window
            return None
    layers = cfg.get("num_hidden_layers")
    if every and isinstance(layers, int) and every > layers:
        every = None  # no layer reaches it: every layer windowed
    return int(window), every


def window_fields(cfg: dict) -> dict:
    """ModelSpec's attention_window / window_full_every / attention_sinks of a config (no window
    where none is, or where its layer pattern is UNSAYABLE: then launched and costed without it,
    as sliding_window_note says)."""
    out = {"attention_sinks": True} if cfg.get("model_type") == "gpt_oss" else {}  # GptOssAttention.sinks
    layout = _window_layout(cfg)
    if isinstance(layout, tuple):
        window, every = layout
        out["attention_window"] = window
        if every:
            out["window_full_every"] = every
    return out


def sliding_window_note(cfg: dict, seq_length: int) -> str:
    """What a config's sliding-window attention becomes in the cost: full causal attention, an
    overcount of the attention core wherever the window is shorter than the sequence; and whether
    the launch sets it. "" where no layer is windowed, or the window is no shorter than the sequence."""
    window = cfg.get("sliding_window")
    if isinstance(window, float) and window.is_integer():
        window = int(window)  # 4096.0 is 4096, as _check_types reads it
    layout = _window_layout(cfg)
    if layout is None or not isinstance(window, int) or isinstance(window, bool) or window >= seq_length:
        return ""
    kinds = cfg.get("layer_types") if isinstance(cfg.get("layer_types"), list) else []
    sliding = sum(1 for k in kinds if k == "sliding_attention")
    which = f"{sliding} of {len(kinds)} layers'" if sliding else "the"  # (Gemma-2 alternates, unlisted)
    launched = ("the Megatron launch sets no window (a layer pattern --window-attn-skip-freq cannot say)"
                if layout == UNSAYABLE else "the Megatron launch sets it (--window-size)")
    return (f"{which} sliding-window attention (window {window} < sequence {seq_length}) is costed as full "
            f"causal attention (slower than the run); {launched}")


# The norms' epsilon, as transformers' config classes name it (Llama/Qwen/DeepSeek/GPT-OSS
# rms_norm_eps; Nemotron-H layer_norm_epsilon; Llama 4 rms_norm_eps in its text config)
NORM_EPS_KEYS = ("rms_norm_eps", "layer_norm_epsilon", "layer_norm_eps", "norm_eps")


# Megatron's Llama 3.x RoPE scaling has fixed frequency bands (rotary_pos_embedding.py _apply_scaling:
# low_freq_factor 1, high_freq_factor 4, original context 8192: Llama 3.1's); only the factor is a flag
MEGATRON_LLAMA3_ROPE = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


# MLASpec's YaRN fields from config.json's rope_scaling keys, and the YaRN settings Megatron's MLA
# fixes (MLATransformerConfig beta_fast / beta_slow / original_max_position_embeddings: no argument
# sets them), whose other values a note names
MLA_YARN_KEYS = {"yarn_factor": "factor", "mscale": "mscale", "mscale_all_dim": "mscale_all_dim"}
MEGATRON_MLA_YARN_FIXED = {"beta_fast": 32, "beta_slow": 1, "original_max_position_embeddings": 4096}


def mla_yarn_note(cfg: dict) -> str:
    """An MLA checkpoint's YaRN settings Megatron cannot be told; "" where it runs them."""
    if not cfg.get("kv_lora_rank") or rope_type(cfg) != "yarn":
        return ""
    return _fixed_rope_note(cfg["rope_scaling"], MEGATRON_MLA_YARN_FIXED, "yarn",
                            "Megatron's MLA fixes {fixed} (no argument sets them); launched with those")


def _fixed_rope_note(rope: dict, fixed: dict, kind: str, says: str) -> str:
    """A note naming the rope_scaling settings that differ from the ones Megatron fixes ('' if none)."""
    other = {k: rope[k] for k, v in fixed.items() if rope.get(k) is not None and rope[k] != v}
    if not other:
        return ""
    listed = lambda d: ", ".join(f"{k} {v:g}" for k, v in d.items())  # noqa: E731
    return f"rope_scaling {kind} with {listed(other)}: " + says.format(fixed=listed(fixed))


# transformers modeling_rope_utils.ROPE_INIT_FUNCTIONS (and Qwen2-VL's multimodal "mrope")
HF_ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "longrope", "llama3", "mrope")


def rope_type(cfg: dict) -> str | None:
    """rope_scaling's rope_type (older configs: type), None where the config has no mapping."""
    rope = cfg.get("rope_scaling")
    return (rope.get("rope_type") or rope.get("type")) if isinstance(rope, dict) else None


def llama3_rope_note(cfg: dict) -> str:
    """A Llama 3.x RoPE scaling whose frequency bands are not Megatron's fixed ones; "" otherwise."""
    if rope_type(cfg) != "llama3":
        return ""
    return _fixed_rope_note(cfg["rope_scaling"], MEGATRON_LLAMA3_ROPE, "llama3",
                            "Megatron's --use-rope-scaling fixes {fixed}; launched with those (not costed either way)")


def unknown_rope_note(cfg: dict) -> str:
    """A rope_scaling type the planner does not know (transformers adds them): read, and said."""
    kind = rope_type(cfg)
    if kind is None or kind in HF_ROPE_TYPES:
        return ""
    return (f"rope_scaling rope_type {_shown(kind)} is not one the planner knows ({', '.join(HF_ROPE_TYPES)}): "
            "costed as plain RoPE (its cost does not depend on the frequencies) and launched without it; "
            "add the scaling to the launch by hand")


def rope_base_note(cfg: dict) -> str:
    """A fractional rope_theta, launched as Megatron's integer --rotary-base, or windowed layers
    with their own RoPE base (Gemma-3's rope_local_base_freq), which Megatron's one --rotary-base
    cannot give them; "" otherwise."""
    theta = cfg.get("rope_theta")
    local = cfg.get("rope_local_base_freq")
    if finite_number(local) and local != theta and isinstance(_window_layout(cfg), tuple):
        return (f"the windowed layers' RoPE base (rope_local_base_freq {local:g}) is not the global layers' "
                f"(rope_theta {theta if theta is None else format(theta, 'g')}): Megatron takes one "
                "--rotary-base, so every layer is launched with rope_theta's (not costed either way)")
    if isinstance(theta, float) and not theta.is_integer() and finite_number(theta):
        return f"rope_theta {theta:g} is launched as --rotary-base {round(theta)} (Megatron reads an integer)"
    return ""


def approximation_notes(path: Path, seq_length: int) -> list[str]:
    """What the cost of this config approximates (APPROXIMATIONS and its sliding windows), said to
    the user whenever it is read."""
    raw = read_config(path)
    kind = raw.get("model_type")
    cfg = with_defaults(raw)  # read as model_fields reads it
    notes = [APPROXIMATIONS.get(kind, "")] if isinstance(kind, str) else []
    if kind == "glm4_moe" and not cfg.get("partial_rotary_factor", 1) < 1:
        notes = []  # its note is the partial RoPE's, which this config does not set
    # the MLA defaults from the file as written: a null q_lora_rank is "no query compression", not absent
    return [n for n in (*notes, hf_default_note(raw), sliding_window_note(cfg, seq_length), rope_base_note(cfg),
                              llama3_rope_note(cfg), unknown_rope_note(cfg), mla_yarn_note(cfg),
                              sparse_attention_note(cfg, seq_length), *launch_gap_notes(cfg)) if n]


# rope_scaling types transformers knows and `planner megatron` does not launch (llama3, yarn and
# linear by a whole factor it does), and why: Megatron 0.19 has no flag for them
ROPE_TYPES_NOT_LAUNCHED = {
    "linear": "Megatron's --rotary-seq-len-interpolation-factor takes whole factors only",
    "dynamic": "Megatron has no dynamic NTK scaling",
    "longrope": "Megatron has no LongRoPE",
    "mrope": "Megatron's GPT model has no multimodal RoPE",
}


def linear_rope_launchable(cfg: dict) -> bool:
    """Linear RoPE scaling by a whole factor >= 1: what Megatron's integer
    --rotary-seq-len-interpolation-factor launches (a fractional one stays a note)."""
    factor = cfg["rope_scaling"].get("factor")
    return finite_number(factor) and factor >= 1 and float(factor).is_integer() and not cfg.get("kv_lora_rank")


def nope_period(cfg: dict) -> int | None:
    """n where a config's no_rope_layers (1 = RoPE, 0 = none) leaves out exactly every n-th layer
    (Llama 4: [1, 1, 1, 0] repeated, n = 4: Megatron --no-rope-freq n); None otherwise. A Llama 4
    config without the list takes transformers' default, every no_rope_layer_interval-th layer (4;
    Llama4TextConfig), as Llama-4-Maverick's config.json does."""
    layers = cfg.get("no_rope_layers")
    if layers is None and cfg.get("model_type") == "llama4_text":
        interval = cfg.get("no_rope_layer_interval", 4)
        return interval if isinstance(interval, int) and interval >= 2 and cfg["num_hidden_layers"] % interval == 0 \
            else None
    if not (isinstance(layers, list) and layers and 0 in layers):
        return None
    n = layers.index(0) + 1
    periodic = n >= 2 and len(layers) % n == 0 and all((v == 0) == ((i + 1) % n == 0) for i, v in enumerate(layers))
    return n if periodic else None


def launch_gap_notes(cfg: dict) -> list[str]:
    """What the config's model does that `planner megatron` does not launch, none of which changes
    the cost (a frequency table, a gate of one h x 1 projection, a norm's offset): said, so that a
    launch that trains another model is not a silent one."""
    kind = cfg.get("model_type")
    notes = []
    rope = rope_type(cfg)
    if rope in ROPE_TYPES_NOT_LAUNCHED and not (rope == "linear" and linear_rope_launchable(cfg)):
        factor = cfg["rope_scaling"].get("factor")
        shown = f"{factor:g}" if isinstance(factor, (int, float)) and not isinstance(factor, bool) else _shown(factor)
        said = f" (factor {shown})" if factor is not None else ""
        notes.append(f"rope_scaling rope_type {_shown(rope)}{said} is launched as plain RoPE "
                     f"({ROPE_TYPES_NOT_LAUNCHED[rope]}); costed alike")
    layers = cfg.get("no_rope_layers")
    if kind == "llama4_text" and isinstance(layers, list) and 0 in layers and nope_period(cfg) is None:
        notes.append(f"RoPE is launched on every layer, where the config's no_rope_layers leave it out of "
                     f"{layers.count(0)} in no fixed period (Megatron's --no-rope-freq also takes a per-layer list; "
                     "add it by hand)")
    if isinstance(kind, str) and kind.startswith("gemma"):
        gaps = ["its gelu-tanh GLU is launched as SwiGLU (Megatron has no flag for it)",
                "its (1 + w) RMSNorm as a plain one (Megatron's --apply-layernorm-1p)"]
        caps = [k for k in ("attn_logit_softcapping", "final_logit_softcapping") if cfg.get(k)]
        if caps:
            gaps.append(f"{' and '.join(caps)} not at all (Megatron has no soft-capping)")
        head_dim = cfg.get("head_dim")
        if cfg.get("query_pre_attn_scalar") and head_dim and cfg["query_pre_attn_scalar"] != head_dim:
            gaps.append(f"query_pre_attn_scalar {_shown(cfg['query_pre_attn_scalar'])} as head_dim {head_dim} "
                        "(Megatron's launch flags cannot set the softmax scale)")
        notes.append(f"a Gemma launch trains another model: {'; '.join(gaps)}; the embedding scale by sqrt(hidden) "
                     "and the post-attention/post-MLP norms are not launched either")
    if kind in WHOLE_WIDTH_QK_NORM_TYPES:
        post = " and its norms after attention and MLP (post-norm) as Megatron's pre-norm" if kind != "olmoe" else ""
        notes.append(f"its q/k RMSNorm over all heads' width at once is neither costed (an element-wise pass over "
                     f"q and k) nor launched (Megatron's --qk-layernorm normalises each head){post}: the launch "
                     "trains another model")
    parallel = parallel_block_key(cfg)
    if parallel:
        notes.append(f"attention and MLP run in parallel on the same input ({parallel}): costed as sequential "
                     "blocks (the same matmuls), launched as Megatron's sequential ones (it has no parallel "
                     "block): the launch trains another model")
    if cfg.get("topk_method") == "group_limited_greedy":
        notes.append("topk_method group_limited_greedy (DeepSeek-V2) scores a group by its best expert; Megatron's "
                     "group-limited routing (--moe-router-group-topk), which the launch uses, by the sum of its "
                     "top experts")
    if isinstance(kind, str) and kind not in ARCHITECTURES and kind not in HF_MLA_DEFAULTS:
        notes.append(f"model_type {_shown(kind)} is not one the planner lists: read as a Llama-style decoder from its "
                     "fields (RMSNorm under RoPE, linear biases only from attention_bias/mlp_bias, the activation "
                     "from hidden_act); check the launch's normalization, bias and activation flags against the model")
    return notes


# OLMo's q/k norms span every head at once, not each head as Qwen3's (transformers modeling_olmo2.py
# Olmo2Attention: q_norm = RMSNorm(num_attention_heads * head_dim), k_norm over the KV width; OLMo 3
# and OLMoE alike), and OLMo 2 / 3 norm each sublayer's output instead of its input
# (Olmo2DecoderLayer: post_attention_layernorm, post_feedforward_layernorm, no input_layernorm)
WHOLE_WIDTH_QK_NORM_TYPES = ("olmo2", "olmo3", "olmoe")
# Decoder layers that add attention and MLP outputs of the same input to the residual, x + attn(n(x))
# + mlp(n'(x)) (transformers CohereDecoderLayer, Cohere2DecoderLayer, PhiDecoderLayer, GPTJBlock),
# and the switches that say so where it is optional (GPTNeoXConfig use_parallel_residual, default
# true; FalconConfig parallel_attn, default true)
PARALLEL_BLOCK_TYPES = ("cohere", "cohere2", "phi", "gptj")
PARALLEL_BLOCK_SWITCHES = {"gpt_neox": "use_parallel_residual", "falcon": "parallel_attn"}


def parallel_block_key(cfg: dict) -> str:
    """What makes a config's layers parallel attention + MLP blocks ("" where they are sequential)."""
    kind = cfg.get("model_type")
    if kind in PARALLEL_BLOCK_TYPES:
        return f"model_type {kind}"
    switch = PARALLEL_BLOCK_SWITCHES.get(kind) if isinstance(kind, str) else None
    if switch and cfg.get(switch, True) is not False:
        return f"{switch} {'true' if switch in cfg else 'absent, true by default'}"
    return ""


def sparse_attention_note(cfg: dict, seq_length: int) -> str:
    """DeepSeek Sparse Attention (DeepSeek-V3.2, GLM-5: a lightning indexer picks index_topk keys
    per query) is costed as the dense MLA it trains from, without the indexer: said."""
    topk = cfg.get("index_topk")
    if not topk:
        return ""
    return (f"DeepSeek Sparse Attention (index_topk {_shown(topk)}) is costed and launched as dense MLA: the "
            f"same attention up to {_shown(topk)} tokens (every key is selected), dense beyond (this run: "
            f"{seq_length:,}); its indexer's own compute is left out")


def with_defaults(cfg: dict, extra: dict | None = None) -> dict:
    """A config as model_fields reads it: the architecture's defaults (ARCHITECTURES), then `extra`,
    under what the file gives (a null is left out)."""
    kind = cfg.get("model_type")
    arch = ARCHITECTURES.get(kind, ({}, ""))[0] if isinstance(kind, str) else {}
    return {**arch, **(extra or {}), **{k: v for k, v in cfg.items() if v is not None}}
# Architectures whose MLPs (experts) carry biases when attention_bias is set (GPT-OSS's
# gate_up_proj_bias / down_proj_bias); elsewhere a config's `mlp_bias` says so.
MLP_BIAS_TYPES = ("gpt_oss",)
# Architectures whose q/k/v projections carry biases whatever attention_bias says (transformers'
# Qwen2Attention and Qwen2MoeAttention: bias=True on q_proj, k_proj, v_proj)
QKV_BIAS_TYPES = ("qwen2", "qwen2_moe", "qwen")  # the original Qwen's fused c_attn: nn.Linear, bias on
# Architectures that normalise each query and key head (HF modeling code: q_norm / k_norm).
QK_NORM_TYPES = ("qwen3", "qwen3_moe", "gemma3_text", "qwen3_vl_text", "qwen3_vl_moe_text")

REQUIRED = ("num_hidden_layers", "hidden_size", "num_attention_heads", "vocab_size")
# Where a config gives its routed-expert count; any other field naming experts (a count spelt
# otherwise) is refused rather than read as a dense model.
EXPERT_COUNT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")
SHARED_EXPERT_COUNT_KEYS = ("n_shared_experts", "num_shared_experts")
UNREAD_MTP_KEY = re.compile(r"(^|_)(mtp|nextn)(_|$)")
# Where a config gives its MTP depth (the last with use_mtp: MiniMax-M2), and the key read beside it
MTP_DEPTH_KEYS = ("num_nextn_predict_layers", "mtp_num_hidden_layers", "num_mtp_modules")
MTP_READ_KEYS = (*MTP_DEPTH_KEYS, "mtp_transformer_layers")
UNREAD_EXPERT_KEY = re.compile(r"(^|_)(num_)?experts?(_|$)|^moe_num_|^moe_k$")

# The JSON type of every config key read here: a wrong one (a list where a number belongs, the
# string "maybe" for a flag) would otherwise crash the reader or be read as something else.
INTEGER_KEYS = (
    *REQUIRED, "num_key_value_heads", "head_dim", "intermediate_size", "intermediate_size_mlp",
    "max_position_embeddings", "num_nextn_predict_layers", "q_lora_rank", "kv_lora_rank",
    "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", *EXPERT_COUNT_KEYS, "num_experts_per_tok",
    "experts_per_token", "moe_intermediate_size", "first_k_dense_replace", "moe_layer_freq",
    "decoder_sparse_step", "interleave_moe_layer_step", "n_group", "topk_group", *SHARED_EXPERT_COUNT_KEYS,
    "shared_expert_intermediate_size", "moe_shared_expert_intermediate_size", "shared_intermediate_size", "moe_latent_size",
    "mamba_num_heads", "mamba_head_dim", "ssm_state_size", "n_groups", "conv_kernel", "chunk_size",
    "sliding_window", "rotary_dim", "num_mtp_modules", "mtp_transformer_layers", "mtp_num_hidden_layers")
# Keys that are at least 1 whenever given (a model has layers, width, heads, KV heads, and routes
# to at least one expert); every other integer key may be 0 (no MTP, no shared or dense layers)
AT_LEAST_ONE = (*REQUIRED, "num_key_value_heads", "num_experts_per_tok", "experts_per_token", "moe_layer_freq",
                "decoder_sparse_step", "interleave_moe_layer_step")
MAX_CONFIG_INTEGER = 1 << 40
# The config key behind each ModelSpec field this reader fills from one key, for messages: an error
# on `query_groups` names num_key_value_heads, the key the user wrote
CONFIG_KEY_OF_FIELD = {"attention_window": "sliding_window", "window_full_every": "sliding_window_pattern",
                       "rope_scaling_factor": "rope_scaling.factor", "norm_epsilon": "rms_norm_eps",
                       "rope_base": "rope_theta", "layers": "num_hidden_layers", "hidden": "hidden_size", "heads": "num_attention_heads",
                       "query_groups": "num_key_value_heads", "head_dim": "head_dim", "ffn": "intermediate_size",
                       "vocab": "vocab_size", "mtp_layers": "num_nextn_predict_layers",
                       "moe.top_k": "num_experts_per_tok", "moe.shared_experts": "n_shared_experts",
                       "moe.first_dense_layers": "first_k_dense_replace"}
# The config keys behind the planner's names in a model-level message ("hidden (4096) must be
# divisible by heads (31)"): said after it, so the user finds the key to change
CONFIG_KEYS_OF_WORD = {"layers": "num_hidden_layers", "hidden": "hidden_size", "heads": "num_attention_heads",
                       "query_groups": "num_key_value_heads", "head_dim": "head_dim", "vocab": "vocab_size",
                       "top_k": "num_experts_per_tok", "num_experts": "num_experts / num_local_experts / n_routed_experts",
                       "first_dense_layers": "first_k_dense_replace / mlp_only_layers", "router_groups": "n_group",
                       "router_group_topk": "topk_group", "activation_clamp": "swiglu_limit",
                       "shared_expert_ffn": "shared_expert_intermediate_size / moe_shared_expert_intermediate_size",
                       "expert_ffn": "moe_intermediate_size / intermediate_size", "mtp_layers": "num_nextn_predict_layers"}
# (A shared expert's width of 0 is how Qwen3-MoE configs say there is none: Qwen3-Coder-480B-A35B's
# config.json has shared_expert_intermediate_size 0, read as no shared expert.)
POSITIVE_IF_GIVEN = ("moe_intermediate_size", "kv_lora_rank", "q_lora_rank", "n_group", "topk_group",
                     "moe_shared_expert_intermediate_size", "head_dim", "intermediate_size")
# Architectures whose experts are sized by moe_intermediate_size (transformers' Qwen2/3-MoE,
# Qwen3-Next, DeepSeek-V2/V3, GLM-4-MoE configs), not by intermediate_size as Mixtral's
EXPERT_FFN_KEY_TYPES = ("qwen2_moe", "qwen3_moe", "qwen3_next", "deepseek_v2", "deepseek_v3", "glm4_moe")
BOOL_KEYS = ("tie_word_embeddings", "attention_bias", "mlp_bias", "use_qk_norm", "use_sliding_window", "norm_topk_prob",
             "use_routing_bias", "use_mtp")
# transformers' activation table (activations.py ACT2CLS: every name a config may give), each one
# element-wise pass; a gate comes from the architecture or SiLU (Apertus's xielu is a plain MLP)
HF_ACTIVATIONS = ("gelu", "gelu_10", "gelu_accurate", "gelu_fast", "gelu_new", "gelu_python", "gelu_python_tanh",
                  "gelu_pytorch_tanh", "hardswish", "laplace", "leaky_relu", "linear", "mish", "prelu", "quick_gelu",
                  "relu", "relu2", "relu6", "sigmoid", "silu", "sqrtsoftplus", "swish", "tanh", "xielu")
STRING_KEYS = ("model_type", "hidden_act", "hidden_activation", "mlp_hidden_act", "hybrid_override_pattern",
               "mtp_hybrid_override_pattern", "scoring_func", "topk_method")
LIST_KEYS = ("layer_types", "layers_block_type", "mtp_layers_block_type", "block_types", "moe_layers")
# rope_scaling's rope_type (older configs: type) as transformers names them (modeling_rope_utils;
# "su" is LongRoPE's old name, "mrope" Qwen-VL's); only YaRN is costed apart
ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "longrope", "llama3", "su", "mrope")
# Multi-head latent attention (MLA). transformers' DeepseekV2Config and DeepseekV3Config always
# build it (DeepseekV2Attention / DeepseekV3Attention have no plain-attention path) and default each
# MLA size a config.json leaves out (configuration_deepseek_v2.py / configuration_deepseek_v3.py:
# kv_lora_rank 512, q_lora_rank 1536, qk_nope_head_dim 128, qk_rope_head_dim 64, v_head_dim 128).
# A left-out rank (MLA_DEFAULTED) is read as that default and said (`approximation_notes`), as HF
# builds it: without kv_lora_rank the config was costed as plain attention. The head widths stay
# required (refused by name when left out). q_lora_rank null is HF's "no query compression"
# (DeepSeek-V2-Lite); any other MLA size null has no meaning there and is refused.
MLA_KEYS = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
MLA_DEFAULTED = ("kv_lora_rank", "q_lora_rank")
_DEEPSEEK_MLA = {"kv_lora_rank": 512, "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
                 "v_head_dim": 128}
HF_MLA_DEFAULTS: dict[str, tuple[str, dict]] = {"deepseek_v2": ("DeepseekV2Config", _DEEPSEEK_MLA),
                                                "deepseek_v3": ("DeepseekV3Config", _DEEPSEEK_MLA)}
# Config keys that only some architectures' Hugging Face classes read (transformers
# configuration_*.py). Given (non-zero) for another model_type the planner names, they would be
# read for the wrong model (moe_intermediate_size sizing Mixtral's experts, a count of shared
# experts Qwen3-MoE does not have) or dropped silently (a Llama's intermediate_size_mlp): refused,
# naming the key and the model_type. UNLISTED: also read for a model_type outside ARCHITECTURES and
# HF_MLA_DEFAULTS, which is read from its own fields. (0 is how a config says "none":
# Qwen3-Coder-480B's shared_expert_intermediate_size 0 is its model.)
UNLISTED = object()  # no config's model_type can equal it
# IBM Granite MoE with a shared MLP beside the experts in every layer, gated SiLU of width
# shared_intermediate_size and no output gate (transformers modeling_granitemoeshared.py and
# modeling_granitemoehybrid.py GraniteMoeSharedMLP / GraniteMoeHybridMLP; vLLM granitemoeshared.py);
# with no experts (num_local_experts 0: Granite 4.0 dense) that MLP is the layer's only one
GRANITE_SHARED_MLP_TYPES = ("granitemoeshared", "granitemoehybrid")
KEYS_READ_BY: dict[str, tuple[str, tuple]] = {
    **{k: ("an MLA size", (*HF_MLA_DEFAULTS, UNLISTED)) for k in MLA_KEYS},
    "moe_intermediate_size": ("the routed experts' width", (*EXPERT_FFN_KEY_TYPES, "nemotron_h", UNLISTED)),
    "n_shared_experts": ("a shared-expert count", ("deepseek_v2", "deepseek_v3", "glm4_moe", "nemotron_h", UNLISTED)),
    "num_shared_experts": ("a shared-expert count", (UNLISTED,)),
    "shared_expert_intermediate_size": ("Qwen2-MoE's shared-expert width", ("qwen2_moe", "qwen3_next", UNLISTED)),
    "moe_shared_expert_intermediate_size": ("Nemotron-H's shared-expert width", ("nemotron_h",)),
    "shared_intermediate_size": ("Granite's shared MLP width", GRANITE_SHARED_MLP_TYPES),
    "moe_latent_size": ("Nemotron 3's latent MoE width", ("nemotron_h",)),
    "intermediate_size_mlp": ("Llama 4's dense-layer width", ("llama4_text",)),
    "swiglu_limit": ("GPT-OSS's SwiGLU clamp", ("gpt_oss", UNLISTED)),
    # Llama 4's weightless L2 norm, GLM-4.5's q/k norms (Qwen3 and Gemma-3 have theirs always)
    "use_qk_norm": ("a q/k norm switch", ("llama4_text", "glm4_moe", *QK_NORM_TYPES, UNLISTED)),
}


def _readers(readers: tuple[str, ...]) -> str:
    named = ", ".join(r for r in readers if r != UNLISTED)
    other = "model_types the planner does not list" if UNLISTED in readers else ""
    return f"{named}, and {other}" if named and other else named or other


def refuse_unread_keys(cfg: dict, path: Path) -> None:
    """One line naming a config key that the model_type's Hugging Face class does not read
    (KEYS_READ_BY), or an MLA size that no MLA switches on; the planner would otherwise cost
    another model than the one Hugging Face builds."""
    model_type = cfg.get("model_type")
    listed = model_type in ARCHITECTURES or model_type in HF_MLA_DEFAULTS
    unread = [k for k, (_, readers) in KEYS_READ_BY.items()
              if cfg.get(k) and model_type not in readers and (listed or UNLISTED not in readers)]
    if unread:
        key = unread[0]
        what, readers = KEYS_READ_BY[key]
        also = f"; also not read: {', '.join(unread[1:])}" if unread[1:] else ""
        raise SpecError(f"model {path}: {key} {_shown(cfg[key])} ({what}) is not read for model_type "
                        f"{_shown(model_type)} (Hugging Face's config for it has no such field; read for: "
                        f"{_readers(readers)}); remove it{also}")
    for key, given in (("partial_rotary_factor", (cfg.get("partial_rotary_factor") or 1) < 1),
                       ("rope_scaling", (rope_type(cfg) or "default") != "default")):
        if model_type == "nemotron_h" and given:  # NemotronHConfig has neither field
            raise SpecError(f"model {path}: {key} {_shown(cfg[key])}: nemotron_h has no RoPE (its attention layers "
                            "use no position embedding); remove it")
    if model_type in HF_MLA_DEFAULTS:
        for key in MLA_KEYS:
            if key != "q_lora_rank" and key in cfg and cfg[key] is None:
                raise SpecError(f"model {path}: {key} is null; a {model_type} model's attention is always MLA: "
                                f"give {key} an integer >= 1 (Hugging Face's {HF_MLA_DEFAULTS[model_type][0]} "
                                f"default: {HF_MLA_DEFAULTS[model_type][1][key]})")
    elif not cfg.get("kv_lora_rank"):
        given = [k for k in MLA_KEYS if cfg.get(k)]
        if given:  # MLA is switched on by its KV compression rank; without it these would be dropped
            raise SpecError(f"model {path}: {', '.join(given)} given without kv_lora_rank (model_type "
                            f"{_shown(model_type)}): MLA sizes are read only with kv_lora_rank, its KV "
                            "compression rank; give kv_lora_rank or remove them")


def hf_mla_defaults(cfg: dict) -> dict:
    """The MLA sizes a DeepSeek config leaves out, as Hugging Face's config class defaults them
    (HF_MLA_DEFAULTS); {} for other model_types."""
    kind = cfg.get("model_type")
    if not isinstance(kind, str) or kind not in HF_MLA_DEFAULTS:
        return {}
    return {k: HF_MLA_DEFAULTS[kind][1][k] for k in MLA_DEFAULTED if k not in cfg}


def hf_default_note(cfg: dict) -> str:
    """What a DeepSeek config left out and is read as Hugging Face's default; "" if nothing."""
    given = hf_mla_defaults(cfg)
    if not given:
        return ""
    return (f"{', '.join(f'{k} {v}' for k, v in given.items())}: absent from config.json, read as Hugging Face's "
            f"{HF_MLA_DEFAULTS[cfg['model_type']][0]} default{'s' if len(given) > 1 else ''} (its attention is "
            "always MLA)")


def _shown(value) -> str:
    """A config value as JSON, cut short: an error stays one readable line."""
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _check_types(cfg: dict, path: Path) -> None:
    """One line naming the config key whose value has the wrong JSON type (null = left out)."""
    def bad(key: str, allowed: str) -> SpecError:
        return SpecError(f"model {path}: {key} must be {allowed}, got {_shown(cfg[key])}")

    if isinstance(cfg.get("moe_layer_freq"), list):
        raise bad("moe_layer_freq", "an integer (every k-th layer is MoE); a per-layer list (MiMo-V2) is not read")
    for key in INTEGER_KEYS:
        v = cfg.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))
                              or (isinstance(v, float) and not v.is_integer())):
            raise bad(key, "an integer")
        if isinstance(v, float) and abs(v) <= MAX_CONFIG_INTEGER:
            cfg[key] = int(v)  # 48.0 is 48 (JSON writers emit it); range() and the schema want an int
    for key, kinds, allowed in [*((k, bool, "true or false") for k in BOOL_KEYS),
                                *((k, str, "a string") for k in STRING_KEYS),
                                *((k, list, "a list") for k in LIST_KEYS)]:
        if cfg.get(key) is not None and not isinstance(cfg[key], kinds):
            raise bad(key, allowed)
        if kinds is str and isinstance(cfg.get(key), str) and not cfg[key].strip():
            raise bad(key, "a non-empty string (leave the key out where the model has none)")  # "" is not silu
    for key in ("rotary_pct", "partial_rotary_factor"):  # the first: GPT-NeoX's and Qwen's name for it
        rotary = cfg.get(key)
        if rotary is not None and (isinstance(rotary, bool) or not isinstance(rotary, (int, float)) or not 0 < rotary <= 1):
            raise bad(key, "a number in (0, 1]")
    scale = cfg.get("routed_scaling_factor")
    if scale is not None and not (finite_number(scale) and 1e-3 <= scale <= 1e3):
        raise bad("routed_scaling_factor", "a number from 0.001 to 1000 (the routed experts' weight)")
    if cfg.get("scoring_func") is not None and cfg["scoring_func"] not in ROUTER_SCORES:
        raise bad("scoring_func", f"one of {', '.join(ROUTER_SCORES)}")
    pattern = cfg.get("sliding_window_pattern")
    if pattern is not None and not (finite_number(pattern) and float(pattern).is_integer() and 1 <= pattern <= 1 << 20):
        raise bad("sliding_window_pattern", "an integer >= 1 (every N-th layer keeps full attention)")
    if isinstance(pattern, float):
        cfg["sliding_window_pattern"] = int(pattern)
    kinds = cfg.get("layer_types") if isinstance(cfg.get("layer_types"), list) else []
    if "sliding_attention" in kinds and cfg.get("use_sliding_window") is not False and not cfg.get("sliding_window"):
        # the layers say windowed, the window says none: costed and launched as full attention,
        # it would train another model than the checkpoint's
        raise SpecError(f"model {path}: layer_types names sliding_attention layers but sliding_window is "
                        f"{_shown(cfg.get('sliding_window'))}; give the window (gpt-oss: 128), or make those "
                        "layers full_attention")
    given_eps = {k: cfg[k] for k in NORM_EPS_KEYS if cfg.get(k) is not None}
    if len(set(map(str, given_eps.values()))) > 1:
        raise SpecError(f"model {path}: the norms' epsilon is given twice and differs "
                        f"({', '.join(f'{k} {_shown(v)}' for k, v in given_eps.items())}); keep one")
    if cfg.get("topk_method") == "noaux_tc" and cfg.get("scoring_func") == "softmax":
        raise SpecError(f"model {path}: topk_method noaux_tc balances sigmoid scores (DeepSeek-V3 §2.1.2); "
                        "scoring_func is softmax: change one of the two")
    for key in ("rotary_emb_base", "rope_theta"):
        theta = cfg.get(key)
        if theta is not None and not (finite_number(theta) and 1 <= theta <= 1e12):
            raise bad(key, "a number from 1 to 1e12 (RoPE's base frequency)")
    for key in NORM_EPS_KEYS:
        eps = cfg.get(key)
        if eps is not None and not (finite_number(eps) and 1e-12 <= eps <= 0.1):
            raise bad(key, "a number from 1e-12 to 0.1 (the norms' epsilon)")
    limit = cfg.get("swiglu_limit")
    if limit is not None and not (finite_number(limit) and limit > 0):  # JSON's NaN token parses
        raise bad("swiglu_limit", "a finite number > 0 (or null: no clamp)")
    # HF's PretrainedConfig takes the context length as a positive integer; it caps seq_length
    if cfg.get("max_position_embeddings") is not None and cfg["max_position_embeddings"] < 1:
        raise bad("max_position_embeddings", "an integer >= 1")
    # every count and size: not negative, and not so large that it is no model (an integral float
    # of 1e19 would not even parse as an integer downstream); the model's own ranges come after
    for key in INTEGER_KEYS:
        low = 1 if key in AT_LEAST_ONE else 0
        if cfg.get(key) is not None and not low <= cfg[key] <= MAX_CONFIG_INTEGER:
            raise bad(key, f"an integer from {low} to {MAX_CONFIG_INTEGER:,}")
    # the layer count first: lists of layers are built from it before the model's own checks
    from planner.model import MAX_LAYERS
    if cfg.get("num_hidden_layers") is not None and cfg["num_hidden_layers"] > MAX_LAYERS:
        raise bad("num_hidden_layers", f"an integer from 1 to {MAX_LAYERS:,}")
    # sizes and counts that, given, switch a mechanism on: 0 would silently switch it off (MLA,
    # group-limited routing, a shared expert) or size the experts like the dense MLP
    for key in POSITIVE_IF_GIVEN:
        if cfg.get(key) is not None and cfg[key] < 1:
            raise bad(key, "an integer >= 1 (leave the key out or null where the model has none)")
    if cfg.get("model_type") in EXPERT_FFN_KEY_TYPES and any(cfg.get(k) for k in EXPERT_COUNT_KEYS) \
            and cfg.get("moe_intermediate_size") is None:
        raise SpecError(f"model {path}: moe_intermediate_size is missing; a {cfg['model_type']} config sizes its "
                        "experts with it (intermediate_size is its dense layers' width)")
    rope = cfg.get("rope_scaling")
    if rope is not None:
        if not isinstance(rope, dict):
            raise bad("rope_scaling", 'a mapping (e.g. {"rope_type": "yarn", "factor": 32}) or null')
        key = "rope_type" if "rope_type" in rope else "type"
        kind = rope.get(key, "default")
        if not isinstance(kind, str) or not kind.strip():
            raise SpecError(f"model {path}: rope_scaling.{key} must be a name such as {', '.join(ROPE_TYPES)}, "
                            f"got {_shown(kind)}")
        # a name transformers may add later is read as the others: only YaRN is costed apart and
        # llama3 launched; a known name in another case is a slip transformers would refuse
        if kind not in ROPE_TYPES and kind.lower() in ROPE_TYPES:
            raise SpecError(f"model {path}: rope_scaling.{key} {_shown(kind)} is not a name transformers reads; "
                            f"did you mean {kind.lower()!r}? (allowed: {', '.join(ROPE_TYPES)})")
        factor = rope.get("factor")
        if factor is not None and (isinstance(factor, bool) or not isinstance(factor, (int, float))
                                   or not 0 < factor < float("inf")):
            raise SpecError(f"model {path}: rope_scaling.factor must be a number > 0, got {_shown(factor)}")
        if kind == "llama3" and factor is not None and not 1 <= factor <= 1e4:
            raise SpecError(f"model {path}: rope_scaling.factor must be a number from 1 to 10000 for llama3 "
                            f"scaling (Llama 3.1: 8), got {_shown(factor)}")
        for band in MEGATRON_LLAMA3_ROPE:  # Llama 3.x's frequency bands: positive numbers, a whole context
            value = rope.get(band)
            whole = band == "original_max_position_embeddings"
            if value is not None and not (finite_number(value) and value > 0
                                          and (not whole or float(value).is_integer())):
                raise SpecError(f"model {path}: rope_scaling.{band} must be "
                                f"{'an integer >= 1' if whole else 'a number > 0'}, got {_shown(value)}")


def find_config_json(ref: str, preset_names: Iterable[str] = ()) -> Path | None:
    """The config.json that `ref` names (a .json file, or a directory holding config.json), else
    None (then `ref` is a preset or a YAML file). A directory without config.json that is named
    like a preset does not hide the preset."""
    if not ref.strip():
        return None  # an empty name: the preset/file resolver says so (Path("") is the folder ".")
    path = Path(ref)
    if path.suffix.lower() == ".json":  # CONFIG.JSON too
        return path
    try:
        return _config_in_folder(ref, path, preset_names)
    except PermissionError as exc:  # a folder on the way this user may not enter
        raise SpecError(f"model: {ref}: cannot read ({exc.strerror})") from None


def _config_in_folder(ref: str, path: Path, preset_names: Iterable[str]) -> Path | None:
    if path.is_dir():
        config = path / "config.json"
        if not config.is_file() and ref in set(preset_names):
            return None
        if config.is_symlink() and not config.exists():  # dangling, or a loop of links
            raise SpecError(f"model: {config} is a symbolic link that leads to no file")
        if config.is_dir():
            raise SpecError(f"model: {config} is a folder, expected the config.json file of {ref}")
        if not config.is_file():
            raise SpecError(f"model: directory {ref} holds no config.json (give a Hugging Face model "
                            "directory, a config.json, a model YAML or a preset)")
        return config
    return None


def _refuse_duplicate_keys(pairs: list[tuple]) -> dict:
    """A JSON object whose key repeats: json keeps the last value without a word, so a config
    edited by hand (num_hidden_layers twice) would be read as the other number."""
    seen = set()
    for key, _ in pairs:
        if key in seen:
            raise DuplicateJSONKey(key)
        seen.add(key)
    return dict(pairs)


class DuplicateJSONKey(ValueError):
    pass


def read_config(path: Path) -> dict:
    try:
        if path.is_dir():
            raise SpecError(f"model {path}: is a folder, expected a config.json file")
        if path.exists() and not path.is_file():
            # a FIFO would block the read, /dev/zero never end it: neither holds a config
            raise SpecError(f"model {path}: is not a regular file (a device, pipe or socket), expected a config.json")
        if path.stat().st_size > MAX_YAML_BYTES:
            raise SpecError(f"model {path}: larger than {MAX_YAML_BYTES >> 20} MiB, not a config.json")
        # utf-8-sig: a byte-order mark, as some Windows editors write, is not an error
        data = json.loads(path.read_text(encoding="utf-8-sig"), object_pairs_hook=_refuse_duplicate_keys)
    except OSError as exc:
        raise SpecError(f"model {path}: cannot read ({exc.strerror})") from None
    except DuplicateJSONKey as exc:
        raise SpecError(f"model {path}: key {exc.args[0]!r} appears twice in one object; keep one") from None
    except RecursionError:
        raise SpecError(f"model {path}: not a JSON config (nested too deep)") from None
    except UnicodeDecodeError:
        raise SpecError(f"model {path}: not a text (UTF-8) JSON file") from None
    except json.JSONDecodeError as exc:
        if not exc.doc.strip():
            raise SpecError(f"model {path}: the file is empty; expected a JSON object of config fields") from None
        raise SpecError(f"model {path}: not a JSON config at line {exc.lineno} ({exc.msg})") from None
    if not isinstance(data, dict):
        raise SpecError(f"model {path}: expected a JSON object of fields, got {kind_text(data)}")
    if data.get("text_config") is not None and not isinstance(data["text_config"], dict):
        raise SpecError(f"model {path}: text_config must be a mapping (the language model's fields) or null, "
                        f"got {_shown(data['text_config'])}")
    # multimodal wrappers (Gemma-3, Llama-4, Qwen-VL) keep the language model under text_config;
    # one that does not name its own model_type is the wrapper's text tower (transformers' composite
    # configs: Gemma3Config.text_config is a Gemma3TextConfig), not the wrapper's type
    if isinstance(data.get("text_config"), dict):
        wrapper = data.get("model_type")
        tower = data["text_config"].get("model_type", TEXT_TOWER_TYPES.get(wrapper, wrapper)
                                        if isinstance(wrapper, str) else wrapper)
        data = {**data, **data["text_config"], "model_type": tower}
    return _with_legacy_rope_keys(_with_rope_parameters(data, path))


# RoPE's base and rotated fraction as GPT-NeoX (GPTNeoXConfig) and the original Qwen (QWenConfig)
# write them, read as the names the others use; dropped, a Pythia config (rotary_pct 0.25) was
# launched with RoPE on every channel and Qwen-72B with base 10000 for its 1,000,000
LEGACY_ROPE_KEYS = {"rotary_emb_base": "rope_theta", "rotary_pct": "partial_rotary_factor"}


def _with_legacy_rope_keys(cfg: dict) -> dict:
    """A config's rotary_emb_base / rotary_pct as rope_theta / partial_rotary_factor where it does
    not give those (validated under either name by _check_types)."""
    aliases = {new: cfg[old] for old, new in LEGACY_ROPE_KEYS.items()
               if cfg.get(old) is not None and cfg.get(new) is None}
    return {**cfg, **aliases} if aliases else cfg


# model_type of a multimodal wrapper -> its text tower's (transformers configuration_*.py)
TEXT_TOWER_TYPES = {"gemma3": "gemma3_text", "gemma4": "gemma4_text", "llama4": "llama4_text",
                    "qwen3_vl": "qwen3_vl_text", "qwen3_vl_moe": "qwen3_vl_moe_text"}


def _with_rope_parameters(cfg: dict, path: Path) -> dict:
    """transformers 5 writes RoPE's base and scaling as one `rope_parameters` mapping
    ({"rope_type": "yarn", "rope_theta": 1e6, "factor": 32, ...}; GLM-5, Gemma 4) where older
    configs wrote rope_theta and rope_scaling: read as those where the config has neither. A
    mapping per layer kind (Gemma 3/4 in transformers 5: full_attention / sliding_attention) gives
    the full-attention layers' as the model's and the sliding layers' base as
    rope_local_base_freq, as Gemma 3's older configs wrote it."""
    params = cfg.get("rope_parameters")
    if params is None:
        return cfg
    if not isinstance(params, dict):
        raise SpecError(f"model {path}: rope_parameters must be a mapping (e.g. "
                        f'{{"rope_type": "default", "rope_theta": 1000000}}) or null, got {_shown(params)}')
    out = dict(cfg)
    if any(isinstance(v, dict) for v in params.values()):
        local = params.get("sliding_attention")
        if isinstance(local, dict) and out.get("rope_local_base_freq") is None and local.get("rope_theta") is not None:
            out["rope_local_base_freq"] = local["rope_theta"]
        params = params.get("full_attention")
        if not isinstance(params, dict):
            return out
    if out.get("rope_theta") is None and params.get("rope_theta") is not None:
        out["rope_theta"] = params["rope_theta"]
    scaling = {k: v for k, v in params.items() if k != "rope_theta"}
    if out.get("rope_scaling") is None and scaling.get("rope_type", "default") != "default":
        out["rope_scaling"] = scaling
    if out.get("partial_rotary_factor") is None and params.get("partial_rotary_factor") is not None:
        out["partial_rotary_factor"] = params["partial_rotary_factor"]
    return out


def _name(cfg: dict, path: Path) -> str:
    from planner.model import MAX_MODEL_NAME_CHARS  # here: planner.model imports this module
    given = cfg.get("_name_or_path")
    name = given.rstrip("/").split("/")[-1] if isinstance(given, str) else ""
    # a repo path's last part, shown in the header: visible text only, cut to a header's length
    def clean(text: str) -> str:
        return "".join(c for c in text if c.isprintable()).strip()[:MAX_MODEL_NAME_CHARS]
    # a config saved under its own name (org--model.json) is named by it; config.json by its folder
    own = path.stem if path.name != "config.json" else path.parent.name
    return clean(name) or clean(own) or "hf-model"


# Layer kinds a config may list per layer (layer_types: Gemma-3, GPT-OSS, Qwen3-Next;
# layers_block_type: Jamba; block_types: RecurrentGemma) that are attention + MLP layers.
ATTENTION_LAYER_KINDS = {"attention", "full_attention", "sliding_attention", "global", "local"}
# Fields that only a non-attention token mixer has: Mamba/SSM layers (Nemotron-H's
# hybrid_override_pattern, Jamba, Falcon-H1, Zamba) and linear attention (Qwen3-Next's gated
# DeltaNet, Kimi Linear, MiniMax's lightning attention).
NON_ATTENTION_MIXER_FIELDS = ("hybrid_override_pattern", "ssm_state_size", "mamba_d_state", "mamba_num_heads",
                              "mamba_d_ssm", "linear_num_value_heads", "linear_attn_config", "attn_type_list")


def _count_keys(cfg: dict, keys: tuple[str, ...], what: str, path: Path) -> list[str]:
    """Which of `keys` (one count, several spellings) the config gives; refused where two differ
    (which one the model class reads depends on it)."""
    given = [k for k in keys if cfg.get(k)]
    if len({cfg[k] for k in given}) > 1:
        raise SpecError(f"model {path}: the {what} count is given twice and differs "
                        f"({', '.join(f'{k} {cfg[k]}' for k in given)}); keep one")
    return given


def _sparse_attention_kinds(cfg: dict) -> set[str]:
    """DeepSeek Sparse Attention layers, as NVIDIA's GLM-5.2 checkpoint lists them in layer_types
    where zai-org's config.json lists none: the MLA that index_topk (read, and said by
    sparse_attention_note) makes sparse; none without index_topk."""
    return {"deepseek_sparse_attention"} if cfg.get("index_topk") else set()


def refuse_non_attention_mixers(cfg: dict, path: Path) -> None:
    """A hybrid stack (Mamba or linear-attention layers between attention layers) costed as an
    all-attention transformer would be silently wrong in time and memory: say so instead. Only
    Nemotron-H's (model_type nemotron_h: Megatron's block pattern, Mamba-2 mixers) is read
    (`_nemotron_h_fields`)."""
    model_type = cfg.get("model_type")
    if model_type == "nemotron_h":
        return
    for key in ("layer_types", "layers_block_type", "block_types"):
        kinds = cfg.get(key)
        if isinstance(kinds, list):
            other = sorted({str(k) for k in kinds} - ATTENTION_LAYER_KINDS - _sparse_attention_kinds(cfg))
            if other:
                raise SpecError(f"model {path} (model_type {model_type!r}): {key} has {', '.join(other)} layers; "
                                "only attention layers are modelled (allowed: "
                                f"{', '.join(sorted(ATTENTION_LAYER_KINDS))}), not hybrid Mamba or linear-attention stacks")
            layers = cfg.get("num_hidden_layers")
            if isinstance(layers, int) and len(kinds) != layers:
                raise SpecError(f"model {path}: {key} lists {len(kinds)} layers, num_hidden_layers is {layers}; "
                                "one entry per layer")
    # any mamba_* / ssm_* key marks a Mamba mixer, whichever of them a config writes (Falcon-H1
    # mamba_n_heads / mamba_d_head / mamba_d_conv, Zamba, Jamba)
    field = next((k for k in NON_ATTENTION_MIXER_FIELDS if cfg.get(k) is not None and not _softmax_only(cfg, k)), None) or \
        next((k for k in sorted(cfg) if re.match(r"(mamba|ssm)_", k) and cfg[k] is not None), None)
    if field is not None:
        raise SpecError(f"model {path} (model_type {model_type!r}): {field} marks a Mamba or linear-attention "
                        "mixer; only attention + MLP/MoE layers and Nemotron-H's Mamba-2 stacks (model_type "
                        "nemotron_h) are modelled")


def _softmax_only(cfg: dict, key: str) -> bool:
    """MiniMax's attn_type_list of only 1s: every layer softmax attention (0 is lightning, linear,
    attention: vLLM / FastDeploy minimax_m1 MiniMaxM1DecoderLayer), as NVIDIA's MiniMax-M2.5
    checkpoints write it, where the base model's config.json has no such list."""
    kinds = cfg.get(key)
    return key == "attn_type_list" and isinstance(kinds, list) and bool(kinds) and all(
        k == 1 and not isinstance(k, bool) for k in kinds)


# Config keys that, set, build layers this reader does not cost: (what they build). Reading
# such a config without them would cost another model (Gemma 4 31B read as a 23 B model).
UNMODELLED_KEYS = {
    "global_head_dim": "the full-attention layers' own head width (Gemma 4)",
    "num_global_key_value_heads": "the full-attention layers' own KV heads (Gemma 4)",
    "attention_k_eq_v": "keys reused as values (Gemma 4)",
    "enable_moe_block": "a dense MLP beside the experts in every layer (Gemma 4)",
    "use_double_wide_mlp": "MLPs of twice the width on some layers (Gemma 4)",
    "num_kv_shared_layers": "layers that reuse an earlier layer's keys and values (Gemma 3n / 4)",
    "hidden_size_per_layer_input": "per-layer input embeddings (Gemma 3n / 4)",
    "altup_num_inputs": "alternating updates (Gemma 3n AltUp)",
    "laurel_rank": "learned augmented residual layers (Gemma 3n)",
    "block_configs": "per-layer blocks of their own FFN width, some without attention (NAS-pruned "
                     "Llama-Nemotron, DeciLM)",
    "ff_intermediate_size": "Phi-3-small's GeGeLU MLP beside block-sparse attention",
    "blocksparse_block_size": "block-sparse attention (Phi-3-small)",
}


def refuse_unmodelled(cfg: dict, path: Path) -> None:
    """A config that builds layers this reader does not cost (UNMODELLED_KEYS) is refused by the
    key that builds them, not read as a plainer model."""
    model_type = cfg.get("model_type")
    for key, what in UNMODELLED_KEYS.items():
        value = cfg.get(key)
        if value in (None, False, 0, [], {}, ""):
            continue
        if (key, value) in (("global_head_dim", cfg.get("head_dim")),
                            ("num_global_key_value_heads", cfg.get("num_key_value_heads"))):
            continue  # the same shape as every other layer's
        shown = "[...]" if isinstance(value, list) else "{...}" if isinstance(value, dict) else _shown(value)
        raise SpecError(f"model {path} (model_type {model_type!r}): {key} = {shown} builds {what}, which the "
                        "planner does not model (one attention shape and one MLP per layer kind); write the "
                        "model as a YAML file (fields: planner/presets/*.yaml) to cost an approximation")


def model_fields(path: Path) -> dict:
    """config.json -> the fields of a ModelSpec (validated by the caller)."""
    cfg = read_config(path)
    _check_types(cfg, path)
    cfg = _nemotron_h_block_lists(cfg, path)
    refuse_encoders(cfg, path)
    refuse_non_attention_mixers(cfg, path)
    refuse_unmodelled(cfg, path)
    refuse_unread_keys(cfg, path)
    model_type = cfg.get("model_type")
    # a DeepSeek config's left-out MLA sizes are HF's defaults (said in approximation_notes)
    mla_defaulted = hf_mla_defaults(cfg)
    cfg = with_defaults(cfg, mla_defaulted)
    missing = [f for f in REQUIRED if f not in cfg]
    moe_keys = _count_keys(cfg, EXPERT_COUNT_KEYS, "routed-expert", path)
    unread = sorted(k for k, v in cfg.items() if UNREAD_EXPERT_KEY.search(k) and v and k not in EXPERT_COUNT_KEYS)
    for key in EXPERT_COUNT_KEYS:
        # 0 experts is a dense model, unless other fields name experts (top-k, widths): then a typo
        # (a negative count never gets here: _check_types ranges every integer key)
        if cfg.get(key) == 0 and unread:
            raise SpecError(f"model {path}: {key} must be >= 1 (the routed-expert count), got {cfg[key]}")
    mtp_unread = sorted(k for k, v in cfg.items() if UNREAD_MTP_KEY.search(k) and k not in MTP_READ_KEYS
                        and isinstance(v, int) and not isinstance(v, bool) and v > 0)
    if mtp_unread:
        # an MTP depth spelt otherwise would silently cost the model without its MTP layers
        raise SpecError(f"model {path} (model_type {model_type!r}): {', '.join(mtp_unread)} names MTP layers this "
                        f"reader does not map (it reads {', '.join(MTP_DEPTH_KEYS)}, the last with use_mtp)")
    if unread and not moe_keys:
        # a MoE config spelling its experts differently (ERNIE-4.5 moe_num_experts, DBRX
        # ffn_config) would otherwise be read as the dense model it is not
        if set(unread) <= {"num_experts_per_tok", "experts_per_token", "moe_intermediate_size"}:
            # keys this reader does read, beside a missing count (a Mixtral without num_local_experts)
            raise SpecError(f"model {path} (model_type {model_type!r}): {', '.join(unread)} names experts, and "
                            f"the expert count is missing (it is read from {', '.join(EXPERT_COUNT_KEYS)})")
        raise SpecError(f"model {path} (model_type {model_type!r}): {', '.join(unread)} names experts this "
                        f"reader does not map (it reads the expert count from {', '.join(EXPERT_COUNT_KEYS)})")
    if not moe_keys and "intermediate_size" not in cfg:
        missing.append("intermediate_size")
    if missing:
        known = ", ".join(sorted(ARCHITECTURES))
        # the planner's own schema written as JSON (layers, hidden, heads): say where it is read
        own = " (this looks like the planner's own model schema: save it as .yaml)" \
            if model_type is None and {"layers", "hidden", "heads"} <= set(cfg) else ""
        raise SpecError(f"model {path} (model_type {model_type!r}): missing {', '.join(missing)}; "
                        f"architectures read: {known}{own}")

    act = str(cfg.get("hidden_act") or cfg.get("hidden_activation") or "silu")
    act_key = "hidden_act" if cfg.get("hidden_act") else "hidden_activation"  # the key to name in errors
    if act.lower() not in HF_ACTIVATIONS:
        raise SpecError(f"model {path}: {act_key} {act!r} is not an activation the planner reads; allowed: "
                        f"{', '.join(HF_ACTIVATIONS)}")
    act = act.lower()
    # every architecture read here has a gated MLP (gate, up, down); for others SiLU implies it
    gated = model_type in ARCHITECTURES or act in ("silu", "swish") \
        or (isinstance(model_type, str) and model_type.startswith("gemma"))  # GeGLU in every Gemma
    max_pos = cfg.get("max_position_embeddings")
    # _check_types made it an integer >= 1 (2048.0 included) or left it out
    seq = HF_DEFAULT_SEQ_LENGTH if max_pos is None else min(HF_DEFAULT_SEQ_LENGTH, int(max_pos))
    biases = bool(cfg.get("attention_bias", False)) and (model_type in MLP_BIAS_TYPES or cfg.get("mlp_bias") is True)
    fields = {
        "name": _name(cfg, path),
        "layers": cfg["num_hidden_layers"],
        "hidden": cfg["hidden_size"],
        "heads": cfg["num_attention_heads"],
        "query_groups": cfg.get("num_key_value_heads"),
        "head_dim": cfg.get("head_dim"),
        "ffn": _dense_ffn(cfg, path),
        "seq_length": seq,
        "vocab": cfg["vocab_size"],
        "activation": "swiglu" if gated else "gelu",
        "tied_embeddings": bool(cfg.get("tie_word_embeddings", True)),
        "position_embedding": "rope",
        # `biases` is every linear layer's (GPT-OSS: attention and experts); attention_bias alone
        # is the q/k/v projections' (GLM-4.5; Qwen2's are always there: Qwen2Attention)
        "biases": biases,
        "qkv_bias": not biases and not cfg.get("kv_lora_rank")
        and (model_type in QKV_BIAS_TYPES or cfg.get("attention_bias") is True),
        "dropout": False,
        # Llama 4's use_qk_norm is a weightless L2 norm (transformers Llama4TextL2Norm)
        "qk_norm": model_type in QK_NORM_TYPES or (cfg.get("use_qk_norm") is True and model_type != "llama4_text"),
        "qk_l2_norm": model_type == "llama4_text" and cfg.get("use_qk_norm") is True,
    }
    if model_type == "llama4_text" and (period := nope_period(cfg)) is not None:
        fields["no_rope_every"] = period
    fields.update(window_fields(cfg))
    # numbers the launch needs and the cost does not read; Megatron's --rotary-base is an integer
    if cfg.get("rope_theta") is not None and model_type != "nemotron_h":
        fields["rope_base"] = round(cfg["rope_theta"])
    eps = next((cfg[k] for k in NORM_EPS_KEYS if cfg.get(k) is not None), None)
    if eps is not None:
        fields["norm_epsilon"] = float(eps)
    if cfg.get("partial_rotary_factor", 1) < 1 and not cfg.get("kv_lora_rank"):
        fields["rotary_percent"] = float(cfg["partial_rotary_factor"])  # GLM-4.5: RoPE on half of each head
    elif cfg.get("rotary_dim") and cfg.get("partial_rotary_factor") is None and not cfg.get("kv_lora_rank"):
        # MiniMax-M2: RoPE on rotary_dim of each head's head_dim channels
        width = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
        if cfg["rotary_dim"] > width:
            raise SpecError(f"model {path}: rotary_dim {cfg['rotary_dim']} is wider than a head ({width}); "
                            "it must be at most head_dim")
        if cfg["rotary_dim"] < width:
            fields["rotary_percent"] = cfg["rotary_dim"] / width
    if model_type == "llama4_text" and cfg.get("intermediate_size_mlp"):
        # the dense layers' width; intermediate_size is the experts' (Llama4TextMLP vs experts)
        fields["ffn"] = cfg["intermediate_size_mlp"]
    fields.update(_moe_fields(cfg, path, moe_keys))
    if cfg.get("num_nextn_predict_layers"):
        fields["mtp_layers"] = cfg["num_nextn_predict_layers"]  # before Nemotron-H's MTP pattern check
    elif cfg.get("mtp_num_hidden_layers"):
        fields["mtp_layers"] = cfg["mtp_num_hidden_layers"]  # Qwen3-Next / Qwen3.5's spelling
    elif cfg.get("use_mtp") is True and cfg.get("num_mtp_modules"):
        # MiniMax-M2: num_mtp_modules modules of mtp_transformer_layers layers each (3 of 1), the
        # DeepSeek-V3 MTP depth Megatron's --mtp-num-layers counts; they had been dropped unread
        if cfg.get("mtp_transformer_layers", 1) != 1:
            raise SpecError(f"model {path}: mtp_transformer_layers {_shown(cfg['mtp_transformer_layers'])}: an MTP "
                            "module of more than one layer is not modelled (one layer each, as DeepSeek-V3's)")
        fields["mtp_layers"] = cfg["num_mtp_modules"]
    if model_type == "nemotron_h":
        fields.update(_nemotron_h_fields(cfg, fields))
    # YaRN RoPE and a clamped gated activation (GPT-OSS: rope_scaling.rope_type "yarn",
    # swiglu_limit 7.0) change what Megatron runs (time.py: unfused RoPE, eager clamp); MLA's
    # decoupled RoPE (DeepSeek-V3's yarn) is not costed apart, so it is left out there
    scaling = rope_type(cfg)
    if scaling in ("yarn", "llama3") and not cfg.get("kv_lora_rank"):
        # llama3: Llama 3.1/3.2's long-context frequencies, launched (--use-rope-scaling), not costed apart
        fields["rope_scaling"] = scaling
        if scaling == "llama3" and cfg["rope_scaling"].get("factor") is not None:
            fields["rope_scaling_factor"] = float(cfg["rope_scaling"]["factor"])
    if scaling == "linear" and linear_rope_launchable(cfg):
        # position interpolation by a whole factor: launched (--rotary-seq-len-interpolation-factor)
        fields["rope_scaling"], fields["rope_scaling_factor"] = "linear", float(cfg["rope_scaling"]["factor"])
    if isinstance(cfg.get("swiglu_limit"), (int, float)) and not isinstance(cfg["swiglu_limit"], bool) \
            and cfg["swiglu_limit"] > 0:
        fields["activation_clamp"] = float(cfg["swiglu_limit"])
        if fields["activation"] != "swiglu":  # said in the config's terms, not ModelSpec's activation
            raise SpecError(f"model {path}: swiglu_limit {_shown(cfg['swiglu_limit'])} clamps a gated (SwiGLU) MLP; "
                            f"this config's MLP is not gated ({act_key} {act}); remove it")
    if cfg.get("kv_lora_rank"):
        # a DeepSeek config that gave no kv_lora_rank is MLA by its model_type, not by a key it wrote
        why = (f"a {model_type} model's attention is always MLA (kv_lora_rank absent, read as Hugging Face's "
               f"{HF_MLA_DEFAULTS[model_type][0]} default {mla_defaulted['kv_lora_rank']}) and needs its head widths"
               if "kv_lora_rank" in mla_defaulted else "kv_lora_rank (MLA) needs its head widths")
        _require(cfg, ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"), why)
        fields["mla"] = {k: cfg.get(k) for k in ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim",
                                                 "qk_rope_head_dim", "v_head_dim")}
        if scaling == "yarn":  # the checkpoint's YaRN, launched (--rotary-scaling-factor, --mscale...)
            rope = cfg["rope_scaling"]
            fields["mla"].update({field: rope[key] for field, key in MLA_YARN_KEYS.items() if rope.get(key) is not None})
        fields["head_dim"] = None  # MLA's head widths live in `mla`
    return fields


def _dense_ffn(cfg: dict, path: Path) -> int | None:
    """The dense MLP's width: intermediate_size, halved where the config gives both gated halves
    together (HALVED_FFN_TYPES); Granite's shared MLP width where there are no experts."""
    width = cfg.get("intermediate_size")
    if cfg.get("model_type") in GRANITE_SHARED_MLP_TYPES and cfg.get("shared_intermediate_size") \
            and not any(cfg.get(k) for k in EXPERT_COUNT_KEYS):
        return cfg["shared_intermediate_size"]  # no experts: the shared MLP is the layer's MLP
    if width is None or cfg.get("model_type") not in HALVED_FFN_TYPES:
        return width
    if width % 2:
        raise SpecError(f"model {path}: intermediate_size {width} must be even for model_type "
                        f"{_shown(cfg['model_type'])} (it is the two gated MLP projections together)")
    return width // 2


def _require(cfg: dict, keys: tuple[str, ...], why: str) -> None:
    """One line naming the config keys a mechanism the config switches on needs and lacks."""
    missing = [k for k in keys if cfg.get(k) is None]
    if missing:
        raise SpecError(f"model: missing {', '.join(missing)}; {why}")


# transformers 5's NemotronHConfig gives the blocks as layers_block_type (and the MTP module's as
# mtp_layers_block_type, default ["attention", "moe"]), one name per layer, and derives
# num_hidden_layers from it; hybrid_override_pattern is its legacy spelling (configuration_nemotron_h.py)
NEMOTRON_H_BLOCKS = {"mamba": "M", "attention": "*", "mlp": "-", "moe": "E"}


def _nemotron_h_block_lists(cfg: dict, path: Path) -> dict:
    """A nemotron_h config's layers_block_type / mtp_layers_block_type as the block patterns
    (hybrid_override_pattern / mtp_hybrid_override_pattern) and layer count it means; the config
    unchanged where it writes the patterns (Nemotron-H, Nemotron 3 Nano and Super) or is not nemotron_h."""
    if cfg.get("model_type") != "nemotron_h" or cfg.get("hybrid_override_pattern") is not None:
        return cfg
    out = dict(cfg)
    for key, pattern_key in (("layers_block_type", "hybrid_override_pattern"),
                             ("mtp_layers_block_type", "mtp_hybrid_override_pattern")):
        blocks = cfg.get(key)
        if blocks is None:
            continue
        other = sorted({str(b) for b in blocks} - set(NEMOTRON_H_BLOCKS))
        if other or not blocks:
            raise SpecError(f"model {path}: {key} names {', '.join(other) or 'no layers'}; allowed block "
                            f"names: {', '.join(NEMOTRON_H_BLOCKS)}")
        out[pattern_key] = "".join(NEMOTRON_H_BLOCKS[b] for b in blocks)
    blocks = cfg.get("layers_block_type")
    if blocks is not None:
        if cfg.get("num_hidden_layers") not in (None, len(blocks)):
            raise SpecError(f"model {path}: layers_block_type lists {len(blocks)} layers, num_hidden_layers is "
                            f"{cfg['num_hidden_layers']}; one entry per layer")
        out["num_hidden_layers"] = len(blocks)
    return out


def _nemotron_h_fields(cfg: dict, fields: dict) -> dict:
    """Nemotron-H / Nemotron-3 (transformers' NemotronHConfig): hybrid_override_pattern is
    Megatron's block pattern (M Mamba-2, * attention, - MLP, E MoE); the Mamba-2 mixer from
    mamba_num_heads / mamba_head_dim / ssm_state_size / n_groups / conv_kernel / chunk_size; the
    MLPs' relu2 is squared ReLU; the shared expert's width is moe_shared_expert_intermediate_size."""
    # no positional encoding: the Mamba blocks carry position (Megatron-Bridge 067f987df
    # models/nemotronh/nemotron_h_bridge.py: position_embedding_type "none")
    out = {"hybrid_pattern": cfg.get("hybrid_override_pattern"), "position_embedding": "none",
           "mamba": {"num_heads": cfg.get("mamba_num_heads"), "head_dim": cfg.get("mamba_head_dim"),
                     "state_dim": cfg.get("ssm_state_size"), "groups": cfg.get("n_groups", 8),
                     "conv_kernel": cfg.get("conv_kernel", 4), "chunk_size": cfg.get("chunk_size", 128)}
           if "M" in str(cfg.get("hybrid_override_pattern") or "") else None}
    if "M" in str(cfg.get("hybrid_override_pattern") or ""):
        _require(cfg, ("mamba_num_heads", "mamba_head_dim", "ssm_state_size"), "Mamba-2 blocks (M) need their mixer's sizes")
    if not cfg.get("hybrid_override_pattern"):  # the block pattern is the model; no default guessed
        raise SpecError("model: hybrid_override_pattern is missing; a nemotron_h config gives its blocks "
                        "(M Mamba-2, * attention, - MLP, E MoE), one per layer")
    # NemotronH's MLPs are never gated: up, mlp_hidden_act, down (transformers' default relu2)
    act = str(cfg.get("mlp_hidden_act") or "relu2").lower()
    if act in ("relu2", "squared_relu"):
        out["activation"] = "squared_relu"
    elif act in ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu"):
        out["activation"] = "gelu"  # relu costs as gelu: one element-wise pass either way
    else:
        raise SpecError(f"model: mlp_hidden_act {act!r} is not read for nemotron_h; allowed: relu2, "
                        "squared_relu, gelu, gelu_new, gelu_pytorch_tanh, relu")
    moe = fields.get("moe")
    if moe and cfg.get("moe_shared_expert_intermediate_size"):
        moe["shared_experts"] = cfg.get("n_shared_experts") or 1
        width = cfg["moe_shared_expert_intermediate_size"]  # all shared experts together
        if width % moe["shared_experts"]:
            raise SpecError(f"model: moe_shared_expert_intermediate_size ({width}) must be a multiple of "
                            f"n_shared_experts ({moe['shared_experts']}): it is their width together")
        moe["shared_expert_ffn"] = width // moe["shared_experts"]
    if moe and cfg.get("moe_latent_size"):
        moe["latent_size"] = cfg["moe_latent_size"]  # LatentMoE (Nemotron 3 Super)
    if fields.get("mtp_layers"):
        pattern = cfg.get("mtp_hybrid_override_pattern", "*E")
        if pattern != "*E":
            raise SpecError(f"model: mtp_hybrid_override_pattern {pattern!r} is not supported (allowed: '*E', "
                            "an attention and a MoE block)")
    return out


# Interleaved MoE layers, by the key each architecture reads (transformers Llama4TextConfig,
# Qwen2MoeConfig / Qwen3MoeConfig); another architecture's key in a config is not read by its model
STEP_KEYS = ("decoder_sparse_step", "interleave_moe_layer_step")
# Leading-dense-layer keys an architecture's model class ignores (transformers: DeepSeek and GLM
# read first_k_dense_replace, Qwen-MoE mlp_only_layers; Llama 4 places its dense layers by its step
# or moe_layers): given there, they would silently make another model
DENSE_LAYER_KEYS_NOT_READ = {"llama4_text": ("first_k_dense_replace", "mlp_only_layers"),
                             "mixtral": ("first_k_dense_replace", "mlp_only_layers"),
                             "gpt_oss": ("first_k_dense_replace", "mlp_only_layers"),
                             "qwen2_moe": ("first_k_dense_replace",), "qwen3_moe": ("first_k_dense_replace",)}
STEP_KEY_OF_TYPE = {"llama4_text": "interleave_moe_layer_step", "qwen2_moe": "decoder_sparse_step",
                    "qwen3_moe": "decoder_sparse_step"}


# The router each architecture's transformers class builds (not costed; launched as Megatron's
# --moe-router-* flags): DeepseekV3TopkRouter, Glm4MoeTopkRouter and NemotronHTopkRouter score with a
# sigmoid and balance with e_score_correction_bias (DeepSeek-V3 §2.1.2, auxiliary-loss-free);
# Llama4TextMoe takes a sigmoid of the top-1 logit. Elsewhere a config's scoring_func / topk_method
# (DeepSeek-V2 softmax; noaux_tc the bias) say it, else softmax (Mixtral, Qwen-MoE, GPT-OSS).
ROUTER_SCORES = ("softmax", "sigmoid")
SIGMOID_BIAS_ROUTER_TYPES = ("deepseek_v3", "glm4_moe", "nemotron_h")
SIGMOID_ROUTER_TYPES = ("llama4_text",)
NORM_TOPK_TYPES = ("deepseek_v2", "qwen2_moe", "qwen3_moe")


def _router_fields(cfg: dict) -> dict:
    """MoESpec router fields of a config: score function, balancing bias, routed scaling."""
    kind = cfg.get("model_type")
    # MiniMax-M2 says it with use_routing_bias (its router's e_score_correction_bias)
    bias = kind in SIGMOID_BIAS_ROUTER_TYPES or cfg.get("topk_method") == "noaux_tc" \
        or cfg.get("use_routing_bias") is True
    sigmoid = bias or kind in SIGMOID_ROUTER_TYPES or cfg.get("scoring_func") == "sigmoid"
    out: dict = {"router_score": "sigmoid"} if sigmoid else {}
    if bias:
        out["router_expert_bias"] = True
    if cfg.get("routed_scaling_factor") not in (None, 1, 1.0):
        out["router_topk_scale"] = float(cfg["routed_scaling_factor"])
    # the classes that read norm_topk_prob default it to false (transformers' DeepseekV2Config,
    # Qwen2MoeConfig, Qwen3MoeConfig): softmax over all experts, the top-k not renormalised
    if not sigmoid and kind in NORM_TOPK_TYPES and not cfg.get("norm_topk_prob", False):
        out["router_pre_softmax"] = True
    # the load-balancing loss's weight, where the config's is the one Megatron-Bridge trains with
    # (Qwen3-MoE: qwen3_moe_bridge sets 1e-3 = router_aux_loss_coef; Mixtral, Qwen2-MoE: the same
    # Switch-style loss); not GPT-OSS's 0.9, which only weighs Hugging Face's fine-tuning loss
    coeff = cfg.get("router_aux_loss_coef")
    if kind in AUX_LOSS_FROM_CONFIG_TYPES and isinstance(coeff, (int, float)) and not isinstance(coeff, bool):
        out["router_aux_loss_coeff"] = float(coeff)
    return out


AUX_LOSS_FROM_CONFIG_TYPES = ("qwen3_moe", "qwen2_moe", "mixtral")


def _moe_fields(cfg: dict, path: Path, moe_keys: list[str]) -> dict:
    if not moe_keys:
        return {}
    experts = cfg[moe_keys[0]]
    # Mixtral and GPT-OSS size experts with intermediate_size; Qwen-MoE and DeepSeek with
    # moe_intermediate_size (their intermediate_size is the dense layers' width)
    expert_ffn = cfg.get("moe_intermediate_size") or cfg.get("intermediate_size")
    top_k = cfg.get("num_experts_per_tok") or cfg.get("experts_per_token")
    if not top_k:  # named by the config's key, not the planner's moe.top_k
        given = cfg.get("num_experts_per_tok", cfg.get("experts_per_token"))
        got = "it is missing" if given is None else f"got {given!r}"
        raise SpecError(f"model {path}: num_experts_per_tok (or experts_per_token) must be an integer >= 1 "
                        f"for a MoE config ({moe_keys[0]} {experts}); {got}")
    moe = {"num_experts": experts, "top_k": top_k, "expert_ffn": expert_ffn}
    if cfg.get("model_type") == "qwen2_moe" and cfg.get("shared_expert_intermediate_size"):
        moe["shared_expert_gate"] = True  # Qwen2MoeSparseMoeBlock: sigmoid(shared_expert_gate(x))
    if cfg.get("model_type") == "llama4_text" and top_k == 1:
        moe["apply_probs_on_input"] = True  # Llama4TextMoe scales the routed rows before the experts
    for key in DENSE_LAYER_KEYS_NOT_READ.get(cfg.get("model_type"), ()):
        if cfg.get(key):
            raise SpecError(f"model {path}: {key} {_shown(cfg[key])} is not read for model_type "
                            f"{cfg['model_type']!r} (its model has no leading dense layers of that name); drop it")
    first_dense = cfg.get("first_k_dense_replace", 0)
    dense_only = cfg.get("mlp_only_layers") or []
    if dense_only:
        if not isinstance(dense_only, list) or dense_only != list(range(len(dense_only))):
            raise SpecError(f"model {path}: mlp_only_layers {dense_only} is not supported (only leading "
                            "dense layers, i.e. [0, 1, ..., k-1])")
        first_dense = len(dense_only)
    # DeepSeek's moe_layer_freq k makes layer i MoE when i % k == 0 (after the leading dense ones);
    # only k = 1 is read. Llama 4's interleave_moe_layer_step and Qwen-MoE's decoder_sparse_step s
    # make layer i MoE when (i + 1) % s == 0 (transformers Llama4TextConfig moe_layers,
    # Qwen2MoeDecoderLayer), MoESpec.layer_step with no leading dense layers.
    if cfg.get("moe_layer_freq", 1) != 1:
        raise SpecError(f"model {path}: moe_layer_freq {cfg['moe_layer_freq']} is not supported (allowed: 1, "
                        "every layer after the leading dense ones is MoE)")
    steps = {k: cfg[k] for k in STEP_KEYS if cfg.get(k, 1) != 1}
    own = STEP_KEY_OF_TYPE.get(cfg.get("model_type"))
    for key in steps:  # a step the architecture does not read would silently make another model
        if (own is not None and key != own) or (own is None and len(steps) > 1):
            allowed = f"{own} only" if own else "one step key"
            raise SpecError(f"model {path}: {key} {steps[key]} is not read for model_type "
                            f"{cfg.get('model_type')!r} (allowed: {allowed}; drop it or set it to 1)")
    step = next(iter(steps.values()), 1)
    if steps and first_dense:
        key = next(iter(steps))
        raise SpecError(f"model {path}: {key} {step} with leading dense layers ({first_dense}) is not supported "
                        f"(allowed: {key} 1, or no leading dense layers)")
    if not 1 <= step <= cfg["num_hidden_layers"]:
        key = next(iter(steps))
        raise SpecError(f"model {path}: {key} must be an integer from 1 to num_hidden_layers "
                        f"({cfg['num_hidden_layers']}), got {step!r}")
    moe_layers = cfg.get("moe_layers")  # Llama 4's explicit list of MoE layers
    if isinstance(moe_layers, list):
        expected = [i for i in range(first_dense, cfg["num_hidden_layers"]) if (i - first_dense + 1) % step == 0]
        if moe_layers != expected:
            shown = ", ".join(map(str, expected[:3])) + (f", ..., {expected[-1]}" if len(expected) > 3 else "")
            raise SpecError(f"model {path}: moe_layers {moe_layers} is not supported (allowed: {shown}, the MoE "
                            f"layers of interleave step {step} after {first_dense} leading dense layers)")
    moe["first_dense_layers"] = first_dense
    if step > 1:
        moe["layer_step"] = step
    # DeepSeek-V3 group-limited routing (n_group 8, topk_group 4); 1 group is no limit
    if (cfg.get("n_group") or 1) > 1 and cfg.get("topk_group"):
        moe["router_groups"], moe["router_group_topk"] = cfg["n_group"], cfg["topk_group"]
    shared_keys = _count_keys(cfg, SHARED_EXPERT_COUNT_KEYS, "shared-expert", path)
    if shared_keys:  # DeepSeek n_shared_experts, Ling / Bailing-MoE num_shared_experts
        moe["shared_experts"] = cfg[shared_keys[0]]
    elif cfg.get("shared_expert_intermediate_size"):  # Qwen2-MoE: one shared expert of this width
        moe["shared_experts"] = 1
        moe["shared_expert_ffn"] = cfg["shared_expert_intermediate_size"]
    elif cfg.get("model_type") in GRANITE_SHARED_MLP_TYPES and cfg.get("shared_intermediate_size"):
        moe["shared_experts"] = 1
        moe["shared_expert_ffn"] = cfg["shared_intermediate_size"]
    elif cfg.get("model_type") == "llama4_text":  # one shared expert, no config field names it
        moe["shared_experts"] = 1
        moe["shared_expert_ffn"] = expert_ffn
    moe.update(_router_fields(cfg))
    return {"moe": moe}
