"""The two kinds of transformer layer a model can have: the repeated layer (the MoE layer of a
MoE model, else the dense layer) and a MoE model's leading dense layers (DeepSeek-V3 §4.2: the
first three layers keep a dense FFN; MoESpec.first_dense_layers). The cost model prices each kind
with the same functions: a leading dense layer is the repeated layer of the model's dense twin."""
from __future__ import annotations

from planner.model import ModelSpec


def lead_layers(model: ModelSpec) -> int:
    """Leading dense layers of a MoE model (0 for a dense model: one layer kind)."""
    return model.moe.first_dense_layers if model.moe else 0


def lead_layer_model(model: ModelSpec) -> ModelSpec:
    """The model whose repeated layer is `model`'s leading dense layer: the same attention,
    norms and dense FFN width, no experts, no MTP modules (those run on the last stage with the
    repeated layer). Only its per-layer costs are used."""
    return model.model_copy(update={"moe": None, "mtp_layers": 0})


__all__ = ["lead_layers", "lead_layer_model"]
