"""Evaluate the Bridge workload_base_configs.py of a release and pick each held-out row's config."""
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
OUT = Path(os.environ.get("HELDOUT_KNOBS_OUT", ROOT / "planner/data/bridge_recipe_knobs_heldout.yaml"))

import re, subprocess
sys.path.insert(0, str(ROOT / 'bench'))
from heldout_bridge import row_id
GIT = ['git', '--git-dir', os.environ.get('BRIDGE_GIT_DIR', '/work/.mirror/NVIDIA-NeMo+Megatron-Bridge/repo')]
def show(c, p):
    return subprocess.run(GIT + ['show', f'{c}:{p}'], capture_output=True, text=True, check=True).stdout
FILES = {'DeepSeekV3': ('deepseek', 'deepseek_workload_base_configs.py', 'DEEPSEEK_V3'),
         'GPT OSS 120B': ('gpt_oss', 'gpt_oss_workload_base_configs.py', 'GPT_OSS_120B'),
         'Qwen3_30B_a3B': ('qwen', 'qwen3_workload_base_configs.py', 'QWEN3_30B_A3B'),
         'Qwen3_235B_a22B': ('qwen', 'qwen3_workload_base_configs.py', 'QWEN3_235B_A22B'),
         'LLAMA3_8B': ('llama', 'llama3_workload_base_configs.py', 'LLAMA3_8B'),
         'LLAMA3_70B': ('llama', 'llama3_workload_base_configs.py', 'LLAMA3_70B'),
         'LLAMA3.1_405B': ('llama', 'llama31_workload_base_configs.py', 'LLAMA31_405B'),
         'Kimi_K2': ('kimi', 'kimi_workload_base_configs.py', 'KIMI_K2'),
         # 26.02.01 has the Nano's file only; 26.04 on, one file for Nano and Super
         'Nemotron_3_Nano': ('nemotronh', ('nemotron_3_workload_base_configs.py', 'nemotron_3_nano_workload_base_configs.py'),
                             'NEMOTRON_3_NANO'),
         'Nemotron_3_Super': ('nemotronh', 'nemotron_3_workload_base_configs.py', 'NEMOTRON_3_SUPER')}
PREC = {'MXFP8': 'FP8_MX', 'FP8-MX': 'FP8_MX', 'FP8': 'FP8_CS', 'FP8-CS': 'FP8_CS', 'BF16': 'BF16', 'NVFP4': 'NVFP4'}
_cache = {}
def configs(commit, path):
    key = (commit, path)
    if key not in _cache:
        utils = show(commit, 'scripts/performance/utils/utils.py')
        cls = re.search(r'@dataclass\nclass WorkloadBaseConfig:.*?(?=\n(?:def |class |@))', utils, re.S).group(0)
        ns = {}
        exec('from dataclasses import dataclass, fields, replace\nfrom typing import *\n' + cls, ns)
        src = show(commit, path)
        body = re.sub(r'^from utils\.utils import WorkloadBaseConfig\s*$', '', src, flags=re.M)
        exec(body, ns)
        lines = {m.group(1): src[:m.start()].count('\n') + 1 for m in re.finditer(r'^([A-Z0-9_]+)\s*=', src, re.M)}
        _cache[key] = ({k: v for k, v in ns.items() if k.isupper() and type(v).__name__ == 'WorkloadBaseConfig'}, lines)
    return _cache[key]
def _int(t):
    t = (t or '').split('(')[0].strip()
    return int(t) if t.isdigit() else None
def pick(row, commit):
    """(name, config, path, line, per-gpu gbs ok, layout ok) or a str: why not."""
    if row['model'].split('(')[0].strip() not in FILES and row['model'] not in FILES:
        return 'no preset'
    model = 'DeepSeekV3' if row['model'].startswith('DeepSeekV3') else row['model']
    fam, fname, prefix = FILES[model]
    prec = PREC.get(row['precision'].strip())
    if prec is None:
        return f"precision {row['precision']!r} names no single recipe"
    sysname = row['system'].replace('DGX-', '')
    for fname in (fname,) if isinstance(fname, str) else fname:
        path = f'scripts/performance/configs/{fam}/{fname}'
        try:
            cfgs, lines = configs(commit, path)
            break
        except subprocess.CalledProcessError:
            continue
    else:
        return f'no {path}'
    want = {'tp': _int(row['tp']), 'pp': _int(row['pp']), 'vpp': _int(row['vp']), 'ep': _int(row['ep']) or 1}
    gpus, gbs = int(row['gpus']), int(row['gbs'])
    cands = []
    for name, c in cfgs.items():
        # the versioned variants (_V1, _V2), the named-batch ones (_GBS15360: 26.06's DeepSeek-V3)
        # and the unversioned ones (Kimi-K2's, the only kind its file has)
        if not re.fullmatch(f'{prefix}_PRETRAIN_CONFIG_{sysname}_{prec}(_(V|GBS)\\d+)?', name):
            continue
        lay = {'tp': c.tensor_model_parallel_size, 'pp': c.pipeline_model_parallel_size,
               'vpp': c.virtual_pipeline_model_parallel_size, 'ep': c.expert_model_parallel_size}
        gbs_ok = abs(c.global_batch_size / c.num_gpus * gpus - gbs) < 1e-9
        cands.append((gbs_ok, lay == want, name, c, lay))
    if not cands:
        return f'no {prefix}_PRETRAIN_CONFIG_{sysname}_{prec}_V* in {path}'
    ok = [x for x in cands if x[0]]
    if not ok:
        return 'no variant with the row gbs per GPU: ' + ', '.join(f'{x[2]} gbs {x[3].global_batch_size}/{x[3].num_gpus}gpu' for x in cands)
    ok.sort(key=lambda x: (not x[1], x[2]))
    if len(ok) > 1 and ok[0][1] == ok[1][1]:
        return 'two variants fit equally: ' + ', '.join(x[2] for x in ok[:2])
    gbs_ok, lay_ok, name, c, lay = ok[0]
    return name, c, path, lines[name], lay, lay_ok, want

# 25.11 (v0.2.0): configs/<family>/workload_base_configs.py, one <MODEL>_<SYSTEM>_<PRECISION>_BASE_CONFIG
FAM25 = {'DeepSeekV3': 'deepseek', 'GPT OSS 120B': 'gpt_oss', 'Qwen3_30B_a3B': 'qwen3', 'Qwen3_235B_a22B': 'qwen3',
         'LLAMA3_8B': 'llama3', 'LLAMA3_70B': 'llama3', 'LLAMA3.1_405B': 'llama31'}
def pick25(row, commit):
    model = 'DeepSeekV3' if row['model'].startswith('DeepSeekV3') else row['model']
    if model not in FAM25:
        return 'no preset'
    prec = PREC.get(row['precision'].strip())
    if prec is None:
        return f"precision {row['precision']!r} names no single recipe"
    sysname = row['system'].replace('DGX-', '')
    path = f'scripts/performance/configs/{FAM25[model]}/workload_base_configs.py'
    cfgs, lines = configs(commit, path)
    name = f'{FILES[model][2]}_{sysname}_{prec}_BASE_CONFIG'
    if name not in cfgs:
        return f'no {name} in {path}'
    c = cfgs[name]
    vp = _int(row['vp'])  # the 25.11 table prints vp 1 for no interleaving
    want = {'tp': _int(row['tp']), 'pp': _int(row['pp']), 'vpp': None if vp == 1 else vp, 'ep': _int(row['ep']) or 1}
    lay = {'tp': c.tensor_model_parallel_size, 'pp': c.pipeline_model_parallel_size,
           'vpp': c.virtual_pipeline_model_parallel_size, 'ep': c.expert_model_parallel_size}
    return name, c, path, lines[name], lay, lay == want, want
