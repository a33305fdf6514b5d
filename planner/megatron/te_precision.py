"""JobSpec.module_dtypes as the Transformer Engine per-module precision file Megatron-LM reads with
--te-precision-config-file (megatron/core/quantization/quant_config.py RecipeConfig: `configs` of
type TEQuantizationParams, and `matchers`, glob patterns over module paths where the first match
wins; megatron/core/extensions/transformer_engine.py TEQuantizationRecipe: an fp8 or an fp4 recipe,
or neither for bf16). The layout is that of Megatron-Bridge's Nemotron 3 Super te_quant.cfg."""
from __future__ import annotations

import yaml

from planner.plan import JobSpec

FILE_NAME = "te_precision.yaml"

# Module groups -> the module-path glob Megatron's GPTModel gives them. The MTP module comes first:
# its own attention must take the MTP group's dtype, not the attention group's.
GROUP_PATTERNS: dict[str, str] = {
    "mtp": "mtp.*",
    "attention": "*self_attention.linear_*",
    "latent_proj": "*mlp.fc[12]_latent_proj",
    "mamba_out_proj": "*mixer.out_proj",
}
# JobSpec dtypes -> TEQuantizationRecipe fields (fp8_format as `planner megatron` emits the job's)
TRAINING_RECIPES = {
    "bf16": {},
    "fp8-cs": {"fp8_quantization_recipe": "tensorwise", "fp8_format": "hybrid"},
    "fp8-block": {"fp8_quantization_recipe": "blockwise", "fp8_format": "e4m3"},
    "mxfp8": {"fp8_quantization_recipe": "mxfp8", "fp8_format": "e4m3"},
    "nvfp4": {"fp4_quantization_recipe": "nvfp4"},
}


def precision_file(job: JobSpec) -> str:
    """The YAML text of the job's per-module recipe ('' when it has none)."""
    if not job.module_dtypes:
        return ""
    dtypes = sorted(set(job.module_dtypes.values()), key=list(TRAINING_RECIPES).index)
    configs = {dtype.replace("-", "_"): {"transformer_engine_config_type": "TEQuantizationParams",
                                         "training_recipe": TRAINING_RECIPES[dtype]} for dtype in dtypes}
    matchers = {group: {"config": job.module_dtypes[group].replace("-", "_"), "type": "glob", "pattern": pattern,
                        "enabled": True}
                for group, pattern in GROUP_PATTERNS.items() if group in job.module_dtypes}
    return yaml.safe_dump({"configs": configs, "matchers": matchers}, sort_keys=False)


__all__ = ["FILE_NAME", "GROUP_PATTERNS", "precision_file"]
