"""Nemotron 3 Super knobs its recipes set outside the workload configs, read at the release commit:
the NVFP4 precision (per-module dtypes from te_quant.cfg, BF16 last layers from the mixed-precision
helper) and the missing TP communication overlap (no CommOverlapConfig anywhere on its path)."""
import re

import yaml

from fn import _body
from wl import show

LLM = 'scripts/performance/configs/nemotronh/nemotron_3_llm_pretrain.py'
MIXED = 'src/megatron/bridge/training/mixed_precision.py'
COMMON = 'src/megatron/bridge/recipes/common.py'
# te_quant.cfg matcher pattern -> the planner's module name (JobSpec.module_dtypes)
TE_QUANT_MODULES = {'*.linear_qkv': 'attention', '*.linear_proj': 'attention',
                    '*mlp.fc[12]_latent_proj': 'latent_proj', 'mtp.*': 'mtp', '*mixer.out_proj': 'mamba_out_proj'}


def te_quant_module_dtypes(text: str) -> tuple[dict, str]:
    """({module: dtype}, 'pattern dtype, ...') of a TE quantization recipe file."""
    q = yaml.safe_load(text)
    dtype = {n: (c.get('training_recipe') or {}).get('fp8_quantization_recipe', 'bf16') for n, c in q['configs'].items()}
    on = [m for m in q['matchers'].values() if m.get('enabled', True)]
    return ({TE_QUANT_MODULES[m['pattern']]: dtype[m['config']] for m in on},
            ', '.join(f"{m['pattern']} {dtype[m['config']]}" for m in on))


def _line(src: str, pattern: str) -> int | None:
    m = re.search(pattern, src, re.M)
    return src[:m.start()].count('\n') + 1 if m else None


def nvfp4_knobs(commit: str, where) -> dict:
    """module_dtypes and num_layers_at_end_in_bf16 of the NVFP4 Super recipe, as the release's
    set_nemotron_3_super_common_configs sets them for nvfp4: the BF16 last layers on the mixed
    precision directly (26.04) or through nemotron_3_super_bf16_with_nvfp4_mixed (26.04.01 on)."""
    src = show(commit, LLM)
    body, start = _body(src, 'set_nemotron_3_super_common_configs')
    if not body or '"nvfp4"' not in body:
        return {}
    at = lambda line: f'set_nemotron_3_super_common_configs (line {start + line - 1}, nvfp4)'
    out = {}
    cfg_line = _line(body, r'load_quantization_recipe\(.*te_quant\.cfg')
    if cfg_line:
        dtypes, said = te_quant_module_dtypes(show(commit, 'scripts/performance/configs/nemotronh/te_quant.cfg'))
        out['module_dtypes'] = (dtypes, where(LLM, at(cfg_line) + f' loads scripts/performance/configs/nemotronh/'
                                                                  f'te_quant.cfg ({said})'))
    direct = re.search(r'^[ \t]*cfg\.mixed_precision\.num_layers_at_end_in_bf16\s*=\s*(\d+)', body, re.M)
    if direct:
        out['num_layers_at_end_in_bf16'] = (int(direct.group(1)), where(LLM, at(body[:direct.start()].count('\n') + 1)))
    elif 'nemotron_3_super_bf16_with_nvfp4_mixed()' in body:
        mixed = show(commit, MIXED)
        mbody, mstart = _body(mixed, 'nemotron_3_super_bf16_with_nvfp4_mixed')
        m = re.search(r'^[ \t]*cfg\.num_layers_at_end_in_bf16\s*=\s*(\d+)', mbody or '', re.M)
        if m:
            out['num_layers_at_end_in_bf16'] = (int(m.group(1)), where(
                MIXED, f'nemotron_3_super_bf16_with_nvfp4_mixed (line {mstart + mbody[:m.start()].count(chr(10))}), '
                       f'the precision of {LLM} set_nemotron_3_super_common_configs'))
    return out


def no_tp_comm_overlap(commit: str, where, recipe_paths: list[tuple[str, str]]) -> tuple | None:
    """(False, where) when nothing on the Super recipe's path configures communication overlap:
    _pretrain_common leaves comm_overlap None, so Bridge runs without TP overlap
    (training/comm_overlap.py: tp_comm_overlap off unless a CommOverlapConfig enables it)."""
    if any('comm_overlap' in (_body(show(commit, p), fn)[0] or '') for p, fn in recipe_paths):
        return None
    body, start = _body(show(commit, COMMON), '_pretrain_common')
    line = _line(body or '', r'^[ \t]+comm_overlap=None,')
    if line is None:
        return None
    line = start + line - 1
    named = ', '.join(f'{p} {fn}' for p, fn in recipe_paths)
    return False, where(COMMON, f'_pretrain_common (line {line}): comm_overlap=None, which {named} leave unset '
                                '(no TP communication overlap)')
