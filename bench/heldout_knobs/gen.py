"""Writes planner/data/bridge_recipe_knobs_heldout.yaml from hand-read recipe facts (26.08 perf_recipes)."""
import os
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
OUT = Path(os.environ.get("HELDOUT_KNOBS_OUT", ROOT / "planner/data/bridge_recipe_knobs_heldout.yaml"))

import yaml
src = yaml.safe_load(open(str(ROOT / 'planner/data/bridge_recipe_knobs.yaml')))
REL = src['releases']
C = {r: v['commit'] for r, v in REL.items()}
def w(rel, path, fn=''):
    return f"{C[rel][:12]}:{path}" + (f" {fn}" if fn else '')
PR = 'src/megatron/bridge/perf_recipes/'
records = {}
def add(rid, rel, config, layout, knobs, mismatch=None):
    records[rid] = dict(release=rel, commit=C[rel], tag=REL[rel]['tag'], config=config, recipe_layout=layout,
                        layout_matches_record=mismatch is None, mismatch=mismatch,
                        knobs={k: {'value': v, 'where': wh} for k, (v, wh) in knobs.items()})

# ---- 26.08 DeepSeek-V3 GB300 MXFP8
rel = '26.08'; f = PR + 'deepseek/gb300/deepseek_v3.py'; cm = PR + 'deepseek/common.py'
cfg = 'deepseek_v3_pretrain_256gpu_gb300_fp8mx_config'
fi = '_enable_deepseek_full_iteration_mxfp8'
add('bridge_26.08_DeepSeekV3_DGX-GB300_MXFP8_256gpu_gbs4096', rel, cfg, dict(tp=1, pp=2, vpp=8, ep=32, gbs=4096), {
    'moe_token_dispatcher_type': ('flex', w(rel, cm, fi)),
    'moe_flex_dispatcher_backend': ('hybridep', w(rel, cm, fi)),
    'moe_router_force_load_balancing': (True, w(rel, cm, '_deepseek_v3_common')),
    'moe_router_fusion': (True, w(rel, cm, '_deepseek_v3_common')),
    'overlap_moe_expert_parallel_comm': (True, w(rel, cm, fi)),
    'delay_wgrad_compute': (True, w(rel, cm, fi)),
    'moe_shared_expert_overlap': (False, w(rel, cm, fi)),
    'recompute_granularity': ('selective', w(rel, cm, '_deepseek_v3_common')),
    'recompute_modules': ([], w(rel, f, cfg + ': recompute_modules = [] (nothing recomputed)')),
    'cuda_graph_impl': ('full_iteration', w(rel, cm, fi)),
    'cuda_graph_scope': ([], w(rel, cm, fi)),
    'cutedsl_fused_grouped_mlp': (True, w(rel, cm, fi + ': use_transformer_engine_op_fuser + moe_mlp_glu_interleave_size 32')),
    'fp8_dot_product_attention': (True, w(rel, f, cfg + ': _enable_deepseek_full_iteration_mxfp8(cfg, fp8_dot_product_attention=True)')),
    'moe_paged_stash': (True, w(rel, cm, fi)),
    'moe_expert_rank_capacity_factor': (1.5, w(rel, cm, fi)),
    'pipeline_model_parallel_layout': ('Et*4|(t*4|)*14tmL', w(rel, f, cfg + ': set_deepseek_v3_pipeline_model_parallel_layout')),
    'tp_comm_overlap': (False, 'tp 1'),
})

# ---- 26.08 GPT-OSS 120B GB300 / GB200 MXFP8
go = PR + 'gpt_oss/common.py'; gfi = '_apply_gpt_oss_120b_full_iter_fp8mx_configs'
def gpt(sys, ep, extra):
    f = PR + f'gpt_oss/{sys}/gpt_oss.py'; cfg = f'gpt_oss_120b_pretrain_64gpu_{sys}_fp8mx_config'
    k = {
        'moe_token_dispatcher_type': ('flex', w(rel, go, gfi)),
        'moe_flex_dispatcher_backend': ('hybridep', w(rel, go, gfi)),
        'moe_router_force_load_balancing': (True, w(rel, f, cfg)),
        'moe_router_fusion': (True, w(rel, f, cfg)),
        'overlap_moe_expert_parallel_comm': (True, w(rel, go, gfi)),
        'delay_wgrad_compute': (True, w(rel, go, gfi)),
        'moe_shared_expert_overlap': (False, w(rel, go, gfi)),
        'cuda_graph_impl': ('full_iteration', w(rel, go, gfi)),
        'cuda_graph_scope': ([], w(rel, go, gfi)),
        'cutedsl_fused_grouped_mlp': (True, w(rel, go, gfi + ': use_transformer_engine_op_fuser + moe_mlp_glu_interleave_size 32')),
        'fp8_dot_product_attention': (True, w(rel, go, gfi)),
        'moe_paged_stash': (True, w(rel, go, gfi)),
        'moe_expert_rank_capacity_factor': (1.5, w(rel, go, gfi)),
        'offload_modules': ([], w(rel, go, gfi)),
        'tp_comm_overlap': (False, w(rel, go, gfi + ': CommOverlapConfig(tp_comm_overlap=False)')),
    }
    k.update({n: (v, w(rel, f, cfg + (': ' + why if why else ''))) for n, (v, why) in extra.items()})
    add(f'bridge_26.08_GPT_OSS_120B_DGX-{sys.upper()}_MXFP8_64gpu_gbs1280', rel, cfg,
        dict(tp=1, pp=1, vpp=None, ep=ep, gbs=1280), k)
gpt('gb300', 16, {})
gpt('gb200', 64, {'recompute_granularity': ('selective', ''),
                  'recompute_modules': ([], 'set to [] after the full-iteration helper (nothing recomputed)')})

# ---- 26.08 Qwen3 MoE GB300 / GB200 MXFP8
qc = PR + 'qwen/common.py'; qfi = '_enable_hybridep_full_iteration_mxfp8'
def qwen(name, sys, gpus, gbs, layout, rid_model):
    f = PR + f'qwen/{sys}/qwen3_moe.py'; cfg = f'{name}_pretrain_{gpus}gpu_{sys}_fp8mx_config'
    k = {
        'moe_token_dispatcher_type': ('flex', w(rel, f, cfg)),
        'moe_flex_dispatcher_backend': ('hybridep', w(rel, f, cfg)),
        'moe_router_force_load_balancing': (True, w(rel, f, cfg)),
        'moe_router_fusion': (True, w(rel, f, cfg)),
        'overlap_moe_expert_parallel_comm': (True, w(rel, qc, qfi + ': CommOverlapConfig(overlap_moe_expert_parallel_comm=True)')),
        'delay_wgrad_compute': (True, w(rel, qc, qfi)),
        'moe_shared_expert_overlap': (False, w(rel, qc, qfi)),
        'recompute_granularity': (None, w(rel, f, cfg + ': recompute_granularity = None')),
        'recompute_method': (None, w(rel, f, cfg)),
        'recompute_num_layers': (None, w(rel, f, cfg)),
        'cuda_graph_impl': ('full_iteration', w(rel, qc, qfi)),
        'cuda_graph_scope': ([], w(rel, qc, qfi)),
        'cutedsl_fused_grouped_mlp': (True, w(rel, qc, qfi + ': use_transformer_engine_op_fuser + moe_mlp_glu_interleave_size 32')),
        'fp8_dot_product_attention': (True, w(rel, qc, qfi)),
        'moe_paged_stash': (True, w(rel, qc, qfi)),
        'moe_expert_rank_capacity_factor': (1.5, w(rel, qc, qfi)),
        'offload_modules': ([], w(rel, qc, qfi)),
        'tp_comm_overlap': (False, 'tp 1 (' + w(rel, qc, qfi) + ' sets tp_comm_overlap=True, a no-op at tp 1)'),
    }
    add(f'bridge_26.08_{rid_model}_DGX-{sys.upper()}_MXFP8_{gpus}gpu_gbs{gbs}', rel, cfg, dict(layout, gbs=gbs), k)
qwen('qwen3_30b_a3b', 'gb300', 8, 512, dict(tp=1, pp=1, vpp=None, ep=8), 'Qwen3_30B_a3B')
qwen('qwen3_30b_a3b', 'gb200', 8, 512, dict(tp=1, pp=1, vpp=None, ep=8), 'Qwen3_30B_a3B')
qwen('qwen3_235b_a22b', 'gb300', 256, 8192, dict(tp=1, pp=4, vpp=12, ep=32), 'Qwen3_235B_a22B')

# ---- 26.08 Nemotron 3 hybrid stacks (perf_recipes/nemotronh/<system>/nemotronh.py)
from nemotron import LLM as NLLM, no_tp_comm_overlap, nvfp4_knobs  # noqa: E402
NSCOPE = ['attn', 'mamba', 'moe_router', 'moe_preprocess']
NQUANT = {'attention': 'bf16', 'latent_proj': 'bf16', 'mtp': 'bf16', 'mamba_out_proj': 'mxfp8'}
def nemo(rid_model, sys, prec, gpus, layout, cfg, line, extra=None, on=''):
    f = PR + f'nemotronh/{sys}/nemotronh.py'
    at = w(rel, f, f'{cfg} (line {line})' + on)
    k = dict(extra or {})
    k.update({'moe_flex_dispatcher_backend': ('hybridep', at), 'expert_tensor_parallel_size': (1, at),
              'moe_router_force_load_balancing': (True, at), 'cuda_graph_impl': ('transformer_engine', at),
              'cuda_graph_scope': (NSCOPE, at)})
    if layout['tp'] > 1:
        off = no_tp_comm_overlap(C[rel], lambda p, fnm: w(rel, p, fnm), [
            (f, cfg), (PR + 'nemotronh/common.py', '_apply_nemotron_3_super_perf_defaults'),
            (PR + '_common.py', '_benchmark_common'),
            ('src/megatron/bridge/recipes/nemotronh/h100/nemotron_3_super.py', '_nemotron_3_super_pretrain_64gpu_h100_bf16_config'),
            ('src/megatron/bridge/recipes/nemotronh/h100/nemotron_3_super.py', 'nemotron_3_super_pretrain_16gpu_h100_bf16_config')])
        if off:
            k['tp_comm_overlap'] = off
    add(f'bridge_26.08_{rid_model}_DGX-{sys.upper()}_{prec}_{gpus}gpu_gbs512', rel, cfg, dict(layout, gbs=512), k)
def nvfp4(sys, line):
    cfg = f'nemotron_3_super_pretrain_64gpu_{sys}_nvfp4_config'
    return {'module_dtypes': (NQUANT, w(rel, PR + f'nemotronh/{sys}/nemotronh.py', f'{cfg} (line {line}, nvfp4) loads '
                              'src/megatron/bridge/perf_recipes/nemotronh/te_quant.cfg (linear_qkv, linear_proj, '
                              'fc1/fc2_latent_proj and mtp.* in bf16, mixer.out_proj in mxfp8)')),
            'num_layers_at_end_in_bf16': (14, w(rel, 'src/megatron/bridge/training/mixed_precision.py',
                                                'nemotron_3_super_bf16_with_nvfp4_mixed (line 428), the precision of '
                                                'perf_recipes/nemotronh/common.py _nemotron_3_super_nvfp4_precision'))}
SUPER1 = dict(tp=1, pp=1, vpp=None, ep=64)
SUPER2 = dict(tp=2, pp=1, vpp=None, ep=64)
nemo('Nemotron_3_Super', 'gb300', 'MXFP8', 64, SUPER1, 'nemotron_3_super_pretrain_64gpu_gb300_fp8mx_config', 118)
nemo('Nemotron_3_Super', 'gb300', 'NVFP4', 64, SUPER1, 'nemotron_3_super_pretrain_64gpu_gb300_nvfp4_config', 165,
     nvfp4('gb300', 184))
nemo('Nemotron_3_Super', 'gb200', 'MXFP8', 64, SUPER2, 'nemotron_3_super_pretrain_64gpu_gb200_fp8mx_config', 122)
nemo('Nemotron_3_Super', 'gb200', 'NVFP4', 64, SUPER2, 'nemotron_3_super_pretrain_64gpu_gb200_nvfp4_config', 169,
     nvfp4('gb200', 188))
nemo('Nemotron_3_Nano', 'gb300', 'MXFP8', 8, dict(tp=1, pp=1, vpp=None, ep=8),
     'nemotron_3_nano_pretrain_8gpu_gb300_fp8mx_config', 362)
nemo('Nemotron_3_5_Lightning', 'gb200', 'MXFP8', 8, dict(tp=1, pp=1, vpp=None, ep=8),
     'nemotron_3_5_lightning_pretrain_8gpu_gb200_fp8mx_config', 492,
     {'module_dtypes': ({'mtp': 'bf16'}, w(rel, PR + 'nemotronh/gb200/nemotronh.py',
                        'nemotron_3_5_lightning_pretrain_8gpu_gb200_fp8mx_config (line 498): keep_mtp_spec_in_bf16 = True, '
                        'the MTP block outside the low-precision recipe'))},
     on=', on nemotron_3_nano_pretrain_8gpu_gb200_fp8mx_config (line 357)')

HEADER = open(HERE / 'header.txt').read()


class _NoAliases(yaml.SafeDumper):
    """Two knobs may hold the same list object (a config's shared empty list): write each out."""
    def ignore_aliases(self, data):
        return True


def dump(data) -> str:
    return yaml.dump(data, Dumper=_NoAliases, sort_keys=False, width=140)
out = dump({'schema_version': 1, 'releases': REL, 'records': records})
open(OUT, 'w').write(HEADER + out)
print(len(records))

# ---- 26.02 .. 26.06.01: the workload configs of scripts/performance (picked by wl.py:
# system / precision / variant whose gbs per GPU equals the row's, the layout-matching one first)
import csv
sys.path.insert(0, str(HERE))
from wl import pick, pick25, row_id as rid_of
MOE = ('DeepSeekV3', 'GPT OSS 120B', 'Qwen3_30B_a3B', 'Qwen3_235B_a22B', 'Kimi_K2', 'Nemotron_3_Nano',
       'Nemotron_3_Super')
skipped = []
for row in csv.DictReader(open(ROOT / 'bench/data/bridge_heldout.csv')):
    rel = row['release']
    if rel == '26.08':
        continue
    OV = 'scripts/performance/utils/helpers.py' if rel == '25.11' else 'scripts/performance/utils/overrides.py'
    A2A = 'set_moe_a2a_overlap_overrides' if rel == '25.11' else '_set_moe_a2a_overlap_overrides'
    RC = 'set_recompute_overrides' if rel == '25.11' else '_set_recompute_overrides'
    if row['model'].startswith('LLAMA3') and row['seq'].strip() != '8192':
        skipped.append((rid_of(row), f"seq {row['seq']}: a fine-tuning row; the pretrain workload configs run seq 8192"))
        continue
    p = (pick25 if rel == '25.11' else pick)(row, C[rel])
    if p == 'no preset':
        continue
    if isinstance(p, str):
        skipped.append((rid_of(row), p)); continue
    name, c, path, line, lay, lay_ok, want = p
    at = w(rel, path, f'{name} (line {line})')
    g = lambda f: getattr(c, f, None)
    k = {}
    moe = any(row['model'].startswith(m) for m in MOE)
    if moe and g('moe_flex_dispatcher_backend') is not None:
        k['moe_flex_dispatcher_backend'] = (g('moe_flex_dispatcher_backend'), at)
    if moe and g('moe_a2a_overlap'):
        k['overlap_moe_expert_parallel_comm'] = (True, at + ': moe_a2a_overlap=True')
        k['delay_wgrad_compute'] = (True, w(rel, OV, A2A + ' (moe_a2a_overlap)'))
        k['moe_shared_expert_overlap'] = (False, w(rel, OV, A2A + ' (moe_a2a_overlap)'))
    if g('cuda_graph_impl') is not None:
        k['cuda_graph_impl'] = (None if g('cuda_graph_impl') == 'none' else g('cuda_graph_impl'), at)
    if g('cuda_graph_scope') is not None:
        k['cuda_graph_scope'] = (g('cuda_graph_scope'), at)
    if moe and g('cutedsl_fused_grouped_mlp'):
        k['cutedsl_fused_grouped_mlp'] = (True, at)
    if g('fp8_dot_product_attention') is not None:
        k['fp8_dot_product_attention'] = (bool(g('fp8_dot_product_attention')), at)
    if g('recompute_modules') is not None:
        k['recompute_modules'] = (list(g('recompute_modules')), at)
    if g('recompute_num_layers') is not None:
        k['recompute_num_layers'] = (g('recompute_num_layers'), at)
        k['recompute_granularity'] = ('full', w(rel, OV, RC + ' (recompute_num_layers set)'))
        k['recompute_method'] = ('block', w(rel, OV, RC + ' (recompute_num_layers set)'))
    elif g('recompute_modules') is not None and rel != '25.11':  # 25.11's helper sets no granularity
        k['recompute_granularity'] = ('selective', w(rel, OV, '_set_recompute_overrides (recompute_modules set)'))
    if g('cpu_offloading_num_layers') is not None:
        k['cpu_offloading_num_layers'] = (g('cpu_offloading_num_layers'), at)
    if g('use_megatron_fsdp') is not None:
        k['use_megatron_fsdp'] = (bool(g('use_megatron_fsdp')), at)
    if g('pp_layout') is not None:
        k['pipeline_model_parallel_layout'] = (g('pp_layout'), at)
    if moe and g('expert_tensor_parallel_size') is not None:
        k['expert_tensor_parallel_size'] = (g('expert_tensor_parallel_size'), at)
    from fn import llm_knobs  # (25.11: its *_llm_pretrain.py functions were not read)
    prec = re.sub(r'_(V|GBS)\d+$', '', name.split(f"_{row['system'].replace('DGX-', '')}_")[1])
    mkey = 'DeepSeekV3' if row['model'].startswith('DeepSeekV3') else row['model']
    fk = {} if rel == '25.11' else llm_knobs(mkey, row['system'].replace('DGX-', ''), prec, k.get('cuda_graph_impl', (None,))[0],
                                             C[rel], lambda p, fnm: w(rel, p, fnm))
    for n, v in fk.items():
        k.setdefault(n, v)
    if row['model'] == 'Nemotron_3_Super':
        where = lambda p, fnm: w(rel, p, fnm)
        if prec == 'NVFP4':
            for n, v in nvfp4_knobs(C[rel], where).items():
                k.setdefault(n, v)
        if (lay['tp'] or 1) > 1 and not g('moe_a2a_overlap'):  # the a2a overlap would create a CommOverlapConfig
            sys_fn = f"nemotron_3_super_pretrain_config_{row['system'].replace('DGX-', '').lower()}"
            off = no_tp_comm_overlap(C[rel], where, [(NLLM, sys_fn), (NLLM, 'set_nemotron_3_super_common_configs'),
                                                     ('src/megatron/bridge/recipes/nemotronh/nemotron_3_super.py',
                                                      'nemotron_3_super_pretrain_config')])
            if off:
                k['tp_comm_overlap'] = off
    gbs_cfg = c.global_batch_size
    mm = None
    if not lay_ok:
        mm = ('recipe ' + ', '.join(f'{f} {lay[f]}' for f in lay if lay[f] != want[f]) +
              ' (row ' + ', '.join(f'{f} {want[f]}' for f in lay if lay[f] != want[f]) + ')')
    if abs(gbs_cfg / c.num_gpus * int(row['gpus']) - int(row['gbs'])) > 1e-9:
        note = f"recipe gbs {gbs_cfg} on {c.num_gpus} GPUs (row gbs {row['gbs']} on {row['gpus']}): not the same per GPU"
        mm = note if mm is None else mm + '; ' + note
    elif c.num_gpus != int(row['gpus']):
        note = f"recipe is the {c.num_gpus}-GPU config (gbs {gbs_cfg}); the row ran {row['gpus']} GPUs at gbs {row['gbs']} (same per GPU)"
        mm = note if mm is None else mm + '; ' + note
    layout = dict(lay, gbs=gbs_cfg)
    records[rid_of(row)] = dict(release=rel, commit=C[rel], tag=REL[rel]['tag'],
        config=name, recipe_layout=layout, layout_matches_record=lay_ok, mismatch=mm,
        knobs={n: {'value': v, 'where': wh} for n, (v, wh) in k.items()})

out = dump({'schema_version': 1, 'releases': REL, 'records': records})
open(OUT, 'w').write(HEADER + out)
print(len(records))
for s in skipped: print('SKIP', *s)
