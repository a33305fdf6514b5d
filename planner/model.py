"""What a model IS: transformer shape, parameter counts, and presets."""
from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveInt, ValidationError, model_validator

from hardware.errors import refuse_loose_types, one_line, read_yaml_mapping, resolve_preset_or_file

PRESET_DIR = Path(__file__).parent / "presets"

Activation = Literal["gelu", "swiglu", "squared_relu"]


class MoESpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    num_experts: PositiveInt
    top_k: PositiveInt
    expert_ffn: PositiveInt | None = Field(default=None, description="default: the dense ffn")

    @model_validator(mode="after")
    def _topk(self) -> "MoESpec":
        if self.top_k > self.num_experts:
            raise ValueError(f"top_k ({self.top_k}) must be <= num_experts ({self.num_experts})")
        return self


class ModelSpec(BaseModel):
    """A decoder-only transformer. Every MLP/attention is a matmul of these widths."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = "custom"
    layers: PositiveInt
    hidden: PositiveInt
    heads: PositiveInt
    query_groups: PositiveInt | None = Field(default=None, description="KV groups (GQA); default = heads")
    ffn: PositiveInt | None = Field(default=None, description="MLP hidden width; default 4*hidden")
    seq_length: PositiveInt
    vocab: PositiveInt
    activation: Activation = "gelu"
    tied_embeddings: bool = True
    position_embedding: Literal["learned", "rope"] = "learned"
    biases: bool = True
    dropout: bool = Field(default=True, description="hidden/attention dropout (GPT-3: yes; Llama: no)")
    moe: MoESpec | None = None

    @model_validator(mode="after")
    def _shape(self) -> "ModelSpec":
        if self.hidden % self.heads:
            raise ValueError(f"hidden ({self.hidden}) must be divisible by heads ({self.heads})")
        if self.heads % self.kv_groups:
            raise ValueError(f"query_groups ({self.kv_groups}) must divide heads ({self.heads})")
        return self

    # ---- derived widths -------------------------------------------------------------------
    @property
    def kv_groups(self) -> int:
        return self.query_groups or self.heads

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv_hidden(self) -> int:
        return self.kv_groups * self.head_dim

    @property
    def ffn_hidden(self) -> int:
        return self.ffn or 4 * self.hidden

    @property
    def expert_ffn_hidden(self) -> int:
        return (self.moe.expert_ffn if self.moe and self.moe.expert_ffn else None) or self.ffn_hidden

    @property
    def mlp_matrices(self) -> int:
        """Weight matrices of width ffn in one MLP: up+down, plus the gate for SwiGLU."""
        return 3 if self.activation == "swiglu" else 2

    # ---- parameter counts (Narayanan et al. SC'21 sec 3.2: P = 12lh^2(1 + 13/12h + (V+s)/12lh)
    # for GPT; generalised here to GQA, SwiGLU and MoE) ------------------------------------
    @property
    def attention_params(self) -> int:
        h = self.hidden
        weights = h * (h + 2 * self.kv_hidden) + h * h  # QKV + output projection
        return weights + ((h + 2 * self.kv_hidden) + h if self.biases else 0)

    def _mlp_params(self, ffn: int) -> int:
        weights = self.mlp_matrices * self.hidden * ffn
        bias = ((self.mlp_matrices - 1) * ffn + self.hidden) if self.biases else 0
        return weights + bias

    @property
    def dense_mlp_params(self) -> int:
        return self._mlp_params(self.ffn_hidden)

    @property
    def expert_params_per_layer(self) -> int:
        """All experts of one MoE layer (0 for dense models)."""
        return self.moe.num_experts * self._mlp_params(self.expert_ffn_hidden) if self.moe else 0

    @property
    def norm_params(self) -> int:
        return 2 * (2 if self.biases else 1) * self.hidden  # two norms per layer (+bias for LayerNorm)

    @property
    def non_expert_params_per_layer(self) -> int:
        router = self.hidden * self.moe.num_experts if self.moe else 0
        mlp = 0 if self.moe else self.dense_mlp_params
        return self.attention_params + mlp + router + self.norm_params

    @property
    def params_per_layer(self) -> int:
        return self.non_expert_params_per_layer + self.expert_params_per_layer

    @property
    def embedding_params(self) -> int:
        pos = self.seq_length * self.hidden if self.position_embedding == "learned" else 0
        return self.vocab * self.hidden + pos

    @property
    def output_params(self) -> int:
        """LM head weights that are not shared with the input embedding (+ final norm)."""
        head = 0 if self.tied_embeddings else self.vocab * self.hidden
        return head + (2 if self.biases else 1) * self.hidden

    @property
    def num_params(self) -> int:
        return self.layers * self.params_per_layer + self.embedding_params + self.output_params

    @property
    def active_params(self) -> int:
        """Parameters touched per token (MoE: only top_k experts)."""
        if not self.moe:
            return self.num_params
        active_experts = self.moe.top_k * self._mlp_params(self.expert_ffn_hidden)
        return self.layers * (self.non_expert_params_per_layer + active_experts) + \
            self.embedding_params + self.output_params


def model_preset_names() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


def load_model(ref: str, overrides: dict | None = None) -> ModelSpec:
    """Preset name or YAML path -> ModelSpec; `overrides` replace fields (e.g. seq_length)."""
    path, label = resolve_preset_or_file(ref, PRESET_DIR, "model")
    data = read_yaml_mapping(path, "model")
    data.update({k: v for k, v in (overrides or {}).items() if v is not None})
    try:
        refuse_loose_types(data, ModelSpec, "model")
        return ModelSpec.model_validate(data)
    except ValidationError as err:
        raise one_line(err, f"model ({label})") from None
