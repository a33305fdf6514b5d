"""planner/data/bridge_recipe_knobs_heldout.yaml: the Megatron-Bridge recipe knobs of the held-out
rows of bench/data/bridge_heldout.csv, read by the same loader as the in-sample table."""
from __future__ import annotations

import csv
import importlib.util
from pathlib import Path

import yaml

from planner.bridge_recipes import HELDOUT_KNOBS_FILE, KNOBS_FILE, load_recipe_knobs, recipe_knobs

ROOT = Path(__file__).resolve().parents[1]


def _heldout_rows() -> dict[str, dict]:
    spec = importlib.util.spec_from_file_location("heldout_bridge", ROOT / "bench" / "heldout_bridge.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    with open(ROOT / "bench" / "data" / "bridge_heldout.csv", newline="") as fh:
        return {mod.row_id(r): r for r in csv.DictReader(fh)}


def _int(text: str) -> int | None:
    text = (text or "").strip()
    return int(text) if text.isdigit() else None


def test_every_heldout_entry_is_a_heldout_row_and_not_in_sample():
    rows = _heldout_rows()
    heldout, inside = load_recipe_knobs(HELDOUT_KNOBS_FILE), load_recipe_knobs(KNOBS_FILE)
    assert heldout, "the held-out table is empty"
    assert not set(heldout) - set(rows), "entries whose id is no row of bridge_heldout.csv"
    assert not set(heldout) & set(inside), "an id in both tables"


def test_heldout_entries_carry_their_release_commit_and_the_row_layout():
    """Each entry's release and commit are the `releases` map's (copied from the in-sample table);
    a recipe layout that differs from the row's tp/pp/vp/ep must be flagged with a mismatch."""
    rows = _heldout_rows()
    doc = yaml.safe_load(HELDOUT_KNOBS_FILE.read_text())
    assert doc["releases"] == yaml.safe_load(KNOBS_FILE.read_text())["releases"]
    for rid, k in load_recipe_knobs(HELDOUT_KNOBS_FILE).items():
        row = rows[rid]
        assert k.release == row["release"] and k.commit == doc["releases"][k.release]["commit"], rid
        assert all(kn.where.strip() for kn in k.knobs.values()), rid
        vp = _int(row["vp"])  # 25.11 prints vp 1 for no interleaving (vpp None)
        table = {"tp": _int(row["tp"]), "pp": _int(row["pp"]), "vpp": None if vp == 1 else vp, "ep": _int(row["ep"]) or 1}  # blank ep: dense, no expert parallelism
        same = all(k.recipe_layout[f] == v for f, v in table.items())
        assert same == k.layout_matches_record, (rid, k.recipe_layout, table)
        assert same or k.mismatch, rid


def test_recipe_knobs_reads_both_tables():
    """Megatron-Bridge v0.6.0 (51885cf132b2) perf_recipes/deepseek/gb300/deepseek_v3.py
    deepseek_v3_pretrain_256gpu_gb300_fp8mx_config: pp 2, vpp 8, ep 32, recompute_modules [],
    _enable_deepseek_full_iteration_mxfp8(cfg, fp8_dot_product_attention=True) -> full-iteration
    CUDA graph, hybridep, expert a2a overlap; the GB200 config (in-sample) leaves FP8 attention off."""
    k = recipe_knobs("bridge_26.08_DeepSeekV3_DGX-GB300_MXFP8_256gpu_gbs4096", required=True)
    assert k.tag == "v0.6.0" and k.recipe_layout == {"tp": 1, "pp": 2, "vpp": 8, "ep": 32, "gbs": 4096}
    assert k.value("cuda_graph_impl") == "full_iteration" and k.value("fp8_dot_product_attention") is True
    assert k.value("recompute_modules") == [] and k.value("moe_flex_dispatcher_backend") == "hybridep"
    inside = recipe_knobs("bridge_26.08_DeepSeekV3_DGX-GB200_MXFP8_256gpu_gbs4096", required=True)
    assert inside.value("fp8_dot_product_attention") is False


def test_workload_config_entries_match_the_bridge_source_read_by_hand():
    """Megatron-Bridge v0.5.1 (5cb3444c43f7) scripts/performance/configs/deepseek/
    deepseek_workload_base_configs.py: DEEPSEEK_V3_PRETRAIN_CONFIG_GB300_FP8_MX_V2 = replace(
    ..._GB300_FP8_MX_V1, global_batch_size=4096); V1 = replace(GB300_V1 [pp 2, vpp 8, ep 32,
    hybridep, pp_layout Et*4|(t*4|)*14tmL], cuda_graph_impl="full_iteration", moe_a2a_overlap=True,
    cutedsl_fused_grouped_mlp=True, fp8_dot_product_attention=True, recompute_modules=[]).
    v0.3.1 (9c9dd848966) gpt_oss_workload_base_configs.py: GPT_OSS_120B_PRETRAIN_CONFIG_B300_BF16_V1
    sets expert_model_parallel_size=64, the 26.02.01 table prints ep 8: flagged."""
    k = recipe_knobs("bridge_26.06.01_DeepSeekV3_DGX-GB300_MXFP8_256gpu_gbs4096", required=True)
    assert k.tag == "v0.5.1" and k.config == "DEEPSEEK_V3_PRETRAIN_CONFIG_GB300_FP8_MX_V2"
    assert k.recipe_layout == {"tp": 1, "pp": 2, "vpp": 8, "ep": 32, "gbs": 4096} and k.layout_matches_record
    assert k.value("cuda_graph_impl") == "full_iteration" and k.value("cutedsl_fused_grouped_mlp") is True
    assert k.value("fp8_dot_product_attention") is True and k.value("recompute_modules") == []
    assert k.value("overlap_moe_expert_parallel_comm") is True and k.value("delay_wgrad_compute") is True
    assert k.value("pipeline_model_parallel_layout") == "Et*4|(t*4|)*14tmL"
    b = recipe_knobs("bridge_26.02.01_GPT_OSS_120B_DGX-B300_BF16_64gpu_gbs1280", required=True)
    assert b.recipe_layout["ep"] == 64 and not b.layout_matches_record and "ep 64" in b.mismatch


def test_full_iteration_rows_carry_the_paged_stash_of_their_llm_pretrain_function():
    """Megatron-Bridge v0.5.0 (fcbb6031103d) scripts/performance/configs/qwen/qwen3_llm_pretrain.py
    set_full_iter_cg_configs: moe_paged_stash = True, moe_expert_rank_capacity_factor = 1.5, called
    by qwen3_30b_a3b_pretrain_config_gb300 when precision == "fp8_mx" and the graph is full-iteration;
    set_qwen3_common_configs: recompute_granularity None, router fusion, force load balancing."""
    k = recipe_knobs("bridge_26.06_Qwen3_30B_a3B_DGX-GB300_MXFP8_8gpu_gbs512", required=True)
    assert k.value("cuda_graph_impl") == "full_iteration"
    assert k.value("moe_paged_stash") is True and k.value("moe_expert_rank_capacity_factor") == 1.5
    assert k.value("moe_router_force_load_balancing") is True and k.value("recompute_granularity") is None
    assert "set_full_iter_cg_configs" in k.where("moe_paged_stash")


def test_nemotron_3_super_tp2_recipes_run_without_tp_overlap_and_are_read_so():
    """Megatron-Bridge v0.5.0 (fcbb6031103d): src/megatron/bridge/recipes/common.py _pretrain_common
    sets comm_overlap=None (line 127); recipes/nemotronh/nemotron_3_super.py and scripts/performance/
    configs/nemotronh/nemotron_3_llm_pretrain.py create no CommOverlapConfig, and the GB200 workload
    config (tp 2) sets no moe_a2a_overlap, so training/comm_overlap.py leaves tp_comm_overlap off.
    The held-out loader then costs the row's TP collectives unoverlapped; its tp 1 GB300 sibling has
    no such knob (nothing to overlap)."""
    rid = "bridge_26.06_Nemotron_3_Super_DGX-GB200_MXFP8_64gpu_gbs512"
    k = recipe_knobs(rid, required=True)
    assert k.recipe_layout["tp"] == 2 and k.value("tp_comm_overlap") is False
    assert "_pretrain_common (line 127): comm_overlap=None" in k.where("tp_comm_overlap")
    assert "tp_comm_overlap" not in recipe_knobs(rid.replace("GB200", "GB300"), required=True).knobs
    spec = importlib.util.spec_from_file_location("heldout_bridge", ROOT / "bench" / "heldout_bridge.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    cases, _ = mod.read_back([r for r in mod.records()[0] if r["id"] == rid])  # this row alone
    case = next(c for c in cases if c.id == rid)
    assert case.plan.tp == 2 and case.plan.sequence_parallel and case.plan.tp_comm_overlap is False


def test_nemotron_3_super_nvfp4_knobs_parse_the_recipes_te_quant_file():
    """bench/heldout_knobs/nemotron.py reads te_quant.cfg's matchers: linear_qkv / linear_proj ->
    attention bf16, fc1/fc2 latent projections -> latent_proj bf16, mtp.* -> bf16, mixer.out_proj ->
    mxfp8 (the 'mxfp8' config's fp8_quantization_recipe); and the 26.04 release sets the 14 BF16
    last layers in set_nemotron_3_super_common_configs itself (line 50), not through
    mixed_precision.py as 26.04.01 on do."""
    import sys
    sys.path.insert(0, str(ROOT / "bench" / "heldout_knobs"))
    try:
        from nemotron import te_quant_module_dtypes
    finally:
        sys.path.pop(0)
    cfg = """configs:
  mxfp8: {transformer_engine_config_type: TEQuantizationParams, training_recipe: {fp8_quantization_recipe: mxfp8}}
  bf16: {transformer_engine_config_type: TEQuantizationParams, training_recipe: {}}
matchers:
  attn_qkv_bf16: {config: bf16, type: glob, pattern: "*.linear_qkv", enabled: true}
  attn_proj_bf16: {config: bf16, type: glob, pattern: "*.linear_proj", enabled: true}
  latent_bf16: {config: bf16, type: glob, pattern: "*mlp.fc[12]_latent_proj", enabled: true}
  mtp_bf16: {config: bf16, type: glob, pattern: "mtp.*", enabled: true}
  mamba_outproj_mxfp8: {config: mxfp8, type: glob, pattern: "*mixer.out_proj", enabled: true}
  off: {config: mxfp8, type: glob, pattern: "mtp.*", enabled: false}
"""
    dtypes, said = te_quant_module_dtypes(cfg)
    assert dtypes == {"attention": "bf16", "latent_proj": "bf16", "mtp": "bf16", "mamba_out_proj": "mxfp8"}
    assert said.endswith("*mixer.out_proj mxfp8")
    k = recipe_knobs("bridge_26.04_Nemotron_3_Super_DGX-GB200_NVFP4_64gpu_gbs512", required=True)
    assert k.value("module_dtypes") == dtypes and k.value("num_layers_at_end_in_bf16") == 14
    assert "set_nemotron_3_super_common_configs (line 50, nvfp4)" in k.where("num_layers_at_end_in_bf16")
