"""Knobs the release's *_llm_pretrain.py system function sets (token dispatcher, common configs,
full-iteration paged stash), found by reading that function's body at the release commit."""
import os
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
OUT = Path(os.environ.get("HELDOUT_KNOBS_OUT", ROOT / "planner/data/bridge_recipe_knobs_heldout.yaml"))

import re
from wl import show
LLM = {'DeepSeekV3': ('deepseek/deepseek_llm_pretrain.py', 'deepseek_v3'),
       'GPT OSS 120B': ('gpt_oss/gpt_oss_llm_pretrain.py', 'gpt_oss_120b'),
       'Qwen3_30B_a3B': ('qwen/qwen3_llm_pretrain.py', 'qwen3_30b_a3b'),
       'Qwen3_235B_a22B': ('qwen/qwen3_llm_pretrain.py', 'qwen3_235b_a22b'),
       'Kimi_K2': ('kimi/kimi_llm_pretrain.py', 'kimi_k2'),
       'Nemotron_3_Nano': (('nemotronh/nemotron_3_llm_pretrain.py', 'nemotronh/nemotron_3_nano_llm_pretrain.py'),
                           'nemotron_3_nano'),
       'Nemotron_3_Super': ('nemotronh/nemotron_3_llm_pretrain.py', 'nemotron_3_super')}
def _body(src, name):
    m = re.search(rf'^def {name}\(.*?(?=^def |\Z)', src, re.S | re.M)
    return (m.group(0), src[:m.start()].count('\n') + 1) if m else (None, None)
def _assign(body, field):
    vals = re.findall(rf'^\s*cfg\.model\.{field}\s*=\s*(.+?)\s*(?:#.*)?$', body, re.M)
    return vals
def lit(t):
    return {'True': True, 'False': False, 'None': None}.get(t, t.strip('"\'')) if not re.fullmatch(r'[\d.]+', t) else (float(t) if '.' in t else int(t))
def llm_knobs(model, system, precision, cuda_graph_impl, commit, where):
    if model not in LLM:
        return {}
    paths, stem = LLM[model]
    for path in (paths,) if isinstance(paths, str) else paths:  # the first the release has
        path = 'scripts/performance/configs/' + path
        try:
            src = show(commit, path)
            break
        except Exception:
            continue
    else:
        return {}
    fname = f'{stem}_pretrain_config_{system.lower()}'
    body, line = _body(src, fname)
    if body is None:
        return {}
    at = lambda n, l: where(path, f'{n} (line {l})')
    out = {}
    # the dispatcher type is left out: set_workload_base_configs (utils/overrides.py) decides it after
    # the function's own assignment (flex via apply_flex_dispatcher_backend, else alltoall in 26.06+)
    common = re.search(r'^\s{4}(set_\w+_common_configs)\(cfg', body, re.M)
    wl_call = body.find('set_workload_base_configs(')
    if common and (wl_call < 0 or common.start() < wl_call):  # the workload overrides come after
        cb, cl = _body(src, common.group(1))
        if cb:
            for f in ('moe_router_fusion', 'moe_router_force_load_balancing', 'recompute_granularity'):
                v = _assign(cb, f)
                if len(v) == 1 and _assign(body, f) == []:
                    out[f] = (lit(v[0]), at(common.group(1), cl) + f' (called by {fname})')
    if cuda_graph_impl == 'full_iteration' and 'set_full_iter_cg_configs(cfg)' in body:
        guard = re.search(r'if (.*)is_full_iteration_cuda_graph\(cfg\.model\):\s*\n\s+set_full_iter_cg_configs', body)
        if guard and ('fp8_mx' not in guard.group(1) or precision == 'FP8_MX'):
            fb, fl = _body(src, 'set_full_iter_cg_configs')
            if fb:
                if _assign(fb, 'moe_paged_stash') == ['True']:
                    out['moe_paged_stash'] = (True, at('set_full_iter_cg_configs', fl) + f' (called by {fname})')
                cap = _assign(fb, 'moe_expert_rank_capacity_factor')
                if len(cap) == 1:
                    out['moe_expert_rank_capacity_factor'] = (lit(cap[0]), at('set_full_iter_cg_configs', fl) + f' (called by {fname})')
    return out
