"""The flags that make Megatron build a hybrid Mamba stack as the plan costs it (Nemotron-H,
Nemotron 3): `pretrain_mamba.py` with the block pattern, the Mamba-2 mixer's shape and, under
pipeline parallelism, the plan's layout as '|'-separated pattern segments.

megatron-core 0.19.2 (training/arguments.py, models/hybrid/hybrid_layer_allocation.py): the pattern
(`--hybrid-layer-pattern`, symbols M Mamba, * attention, - MLP, E MoE) sets the layer count; its
'|' segments are the pipeline stages in model order (segment = vp_stage·pp + pp_rank), so they also
set the virtual stages, and Megatron refuses --pipeline-model-parallel-layout, the
account-for-embedding/loss flags and --num-virtual-stages-per-pipeline-rank beside it. MTP depths
follow a '/' each with their own blocks.
"""
from __future__ import annotations

from planner.megatron.launch import Arg
from planner.model import ModelSpec
from planner.pipeline_layout import plan_layout
from planner.plan import Plan

ENTRYPOINT = "pretrain_mamba.py"
# The blocks of one MTP depth of a hybrid stack, as time.mtp_fwd_s costs it: attention then MoE
# (Megatron-Bridge 067f987df recipes/nemotronh/h100/nemotron_3_nano.py: mtp_hybrid_override_pattern
# "*E", mtp_use_repeated_layer).
MTP_BLOCKS = "*E"
# Pipeline flags the pattern's segments replace (Megatron asserts they are absent beside them).
LAYOUT_FLAGS = ("--pipeline-model-parallel-layout", "--account-for-embedding-in-pipeline-split",
                "--account-for-loss-in-pipeline-split", "--num-virtual-stages-per-pipeline-rank",
                "--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers")


def hybrid_layer_pattern(plan: Plan, model: ModelSpec) -> str:
    """The pattern with the plan's pipeline layout as '|' segments and one '/'-part per MTP depth."""
    main = model.hybrid_pattern
    if plan.pp > 1:
        segments, at = [], 0
        for count in plan_layout(plan, model.layers):
            segments.append(main[at:at + count])
            at += count
        main = "|".join(segments)
    return main + f"/{MTP_BLOCKS}" * model.mtp_layers


def hybrid_args(plan: Plan, model: ModelSpec) -> list[Arg]:
    """`--hybrid-layer-pattern` and the Mamba mixer's shape (TransformerConfig mamba_* fields)."""
    out: list[Arg] = [("--hybrid-layer-pattern", hybrid_layer_pattern(plan, model))]
    if model.mamba is not None:
        m = model.mamba
        out += [("--mamba-num-heads", str(m.num_heads)), ("--mamba-head-dim", str(m.head_dim)),
                ("--mamba-state-dim", str(m.state_dim)), ("--mamba-num-groups", str(m.groups))]
    return out
