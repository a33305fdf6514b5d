"""planner/bridge_recipes.py: the per-release Megatron-Bridge recipe knobs of the bridge_runs.yaml
MoE records, checked against the Bridge source read by hand, and applied to the reference cases."""
from __future__ import annotations

import pytest
import yaml

from hardware.errors import SpecError
from planner.bridge_recipes import KNOBS_FILE, load_recipe_knobs, recipe_knobs, release_commits
from planner.reference import REFERENCE_DIR, load_reference
from tests.conftest import reference_copy

QWEN_2606_GB200 = "bridge_26.06_Qwen3_235B_a22B_DGX-GB200_MXFP8_256gpu_gbs8192"
QWEN_2604_GB200 = "bridge_26.04_Qwen3_235B_a22B_DGX-GB200_MXFP8_256gpu_gbs8192"
DSV3_260401_B200 = "bridge_26.04.01_DeepSeekV3_DGX-B200_MXFP8_256gpu_gbs4096"
DSV3_2509_H100 = "bridge_25.09_DeepSeekV3_DGX-H100_na_1024gpu_gbs8192"
QWEN_2604_H100 = "bridge_26.04_Qwen3_235B_a22B_DGX-H100_FP8_256gpu_gbs8192"


def test_qwen3_gb200_26_06_is_the_full_iteration_recipe():
    """Megatron-Bridge v0.5.0 (fcbb6031103d) scripts/performance/configs/qwen/
    qwen3_workload_base_configs.py lines 229-237: QWEN3_235B_A22B_PRETRAIN_CONFIG_GB200_FP8_MX_V2 =
    replace(..._GB200_FP8_CS_V2 [pp 8, ep 32, hybridep], virtual_pipeline_model_parallel_size=3,
    moe_a2a_overlap=True, cuda_graph_impl="full_iteration", cuda_graph_scope=[],
    cutedsl_fused_grouped_mlp=True, fp8_dot_product_attention=True)."""
    k = recipe_knobs(QWEN_2606_GB200, required=True)
    assert (k.release, k.tag, k.commit[:12]) == ("26.06", "v0.5.0", "fcbb6031103d")
    assert k.recipe_layout == {"tp": 1, "pp": 8, "vpp": 3, "ep": 32, "gbs": 8192} and k.layout_matches_record
    assert k.value("moe_token_dispatcher_type") == "flex" and k.value("moe_flex_dispatcher_backend") == "hybridep"
    assert k.value("overlap_moe_expert_parallel_comm") is True
    assert k.value("cuda_graph_impl") == "full_iteration" and k.value("cuda_graph_scope") == []
    assert k.value("cutedsl_fused_grouped_mlp") is True and k.value("fp8_dot_product_attention") is True
    assert "qwen3_workload_base_configs.py QWEN3_235B_A22B_PRETRAIN_CONFIG_GB200_FP8_MX_V2" in k.where("cutedsl_fused_grouped_mlp")
    # one release earlier (v0.4.0, same file): vpp 3 already, but no overlap, TE graphs of attn/router/preprocess
    k0 = recipe_knobs(QWEN_2604_GB200, required=True)
    assert k0.tag == "v0.4.0" and k0.value("overlap_moe_expert_parallel_comm") is False
    assert k0.value("cuda_graph_impl") == "transformer_engine" and k0.value("cutedsl_fused_grouped_mlp") is False


def test_dsv3_b200_26_04_01_is_the_deepep_pp8_recipe():
    """Megatron-Bridge v0.4.2 (c810129341a8) scripts/performance/configs/deepseek/
    deepseek_workload_base_configs.py lines 203-214: DEEPSEEK_V3_PRETRAIN_CONFIG_B200_FP8_MX_V2 =
    moe_flex_dispatcher_backend="deepep", pp 8, vpp 2, ep 32, moe_a2a_overlap=True,
    pp_layout="Et*4|(t*4|)*14tmL", cuda_graph_impl="transformer_engine",
    recompute_modules=["mla_up_proj", "mlp"]; utils/overrides.py lines 230-231 apply the flex backend."""
    k = recipe_knobs(DSV3_260401_B200, required=True)
    assert k.tag == "v0.4.2" and k.recipe_layout["pp"] == 8 and k.recipe_layout["vpp"] == 2 and k.recipe_layout["ep"] == 32
    assert k.value("moe_flex_dispatcher_backend") == "deepep"
    assert k.value("overlap_moe_expert_parallel_comm") is True and k.value("delay_wgrad_compute") is True
    assert k.value("recompute_modules") == ["mla_up_proj", "mlp"]
    assert k.value("pipeline_model_parallel_layout") == "Et*4|(t*4|)*14tmL"


def test_dsv3_h100_25_09_is_the_run_script_branch():
    """Megatron-Bridge v0.1.0rc3 (bf71eba07bae) scripts/performance/run_script.py lines 56-91: on h100
    enable_deepep (flex), no token drop, A2A_1F1B (overlap_moe_expert_parallel_comm,
    delay_wgrad_compute, moe_shared_expert_overlap False), recompute_modules
    ["mla_up_proj", "mlp"], layout "Et|(tt|)*30mL"."""
    k = recipe_knobs(DSV3_2509_H100, required=True)
    assert k.tag == "v0.1.0rc3" and k.value("moe_token_dispatcher_type") == "flex"
    assert k.value("moe_flex_dispatcher_backend") == "deepep" and k.value("moe_expert_capacity_factor") is None
    assert k.value("overlap_moe_expert_parallel_comm") is True and k.value("moe_shared_expert_overlap") is False
    assert k.value("recompute_modules") == ["mla_up_proj", "mlp"]
    assert k.value("pipeline_model_parallel_layout") == "Et|(tt|)*30mL"
    assert k.where("moe_token_dispatcher_type").startswith("bf71eba07bae:scripts/performance/run_script.py")


def test_qwen3_h100_26_04_runs_alltoall_without_tp_overlap():
    """Megatron-Bridge v0.4.0 (0fbfe7d3e970) scripts/performance/configs/qwen/qwen3_llm_pretrain.py
    qwen3_235b_a22b_pretrain_config_h100 (def line 151): CommOverlapConfig(tp_comm_overlap=False),
    moe_token_dispatcher_type = "alltoall" (line 169); QWEN3_235B_A22B_PRETRAIN_CONFIG_H100_FP8_CS_V2:
    tp 2, pp 8, vpp 4, ep 32, moe_a2a_overlap=True."""
    k = recipe_knobs(QWEN_2604_H100, required=True)
    assert k.value("moe_token_dispatcher_type") == "alltoall" and k.value("tp_comm_overlap") is False
    assert k.value("overlap_moe_expert_parallel_comm") is True and k.value("expert_tensor_parallel_size") == 1


def test_table_covers_exactly_the_bridge_records():
    """One entry per record of bridge_runs.yaml (36 DeepSeek-V3 / Qwen3-235B, 50 Llama-3 / 3.1),
    its release the id's, its commit the release's, every knob with a where."""
    doc = reference_copy(REFERENCE_DIR / "bridge_runs.yaml")
    moe_ids = {r["id"] for r in doc["records"] if r["model"].get("moe")}
    llama_ids = {r["id"] for r in doc["records"] if r["model"]["name"].startswith("LLAMA3")}
    table = load_recipe_knobs()
    assert set(table) == moe_ids | llama_ids and (len(moe_ids), len(llama_ids)) == (36, 50)
    commits = release_commits()
    for rid, k in table.items():
        assert rid.split("_")[1] == k.release and commits[k.release] == (k.tag, k.commit), rid
        assert all(knob.where for knob in k.knobs.values()), rid
    assert recipe_knobs("megatron_readme_h100_x") is None


def _write(tmp_path, entry: dict) -> object:
    path = tmp_path / "knobs.yaml"
    path.write_text(yaml.safe_dump({"records": {"bridge_x": entry}}))
    return path


GOOD = {"release": "26.04", "commit": "0" * 40, "tag": "v0.4.0", "config": "c", "recipe_layout":
        {"tp": 1, "pp": 8, "vpp": 3, "ep": 32}, "layout_matches_record": True, "mismatch": None,
        "knobs": {"tp_comm_overlap": {"value": False, "where": "here"}}}


@pytest.mark.parametrize("bad, words", [
    ({"knobs": {"tp_comm_overlap": {"value": False, "where": ""}}}, "knobs.tp_comm_overlap"),
    ({"knobs": {"warp_speed": {"value": 1, "where": "w"}}}, "knobs.warp_speed: unknown knob; allowed:"),
    ({"commit": "abc"}, "commit: expected 40"),
    ({"recipe_layout": {"tp": 1}}, "recipe_layout"),
])
def test_malformed_entries_are_one_line_errors(tmp_path, bad, words):
    path = _write(tmp_path, {**GOOD, **bad})
    with pytest.raises(SpecError) as err:
        load_recipe_knobs(path)
    msg = str(err.value)
    assert "\n" not in msg and "record bridge_x" in msg and words in msg


def test_missing_field_and_unknown_record_are_one_line_errors(tmp_path):
    path = _write(tmp_path, {k: v for k, v in GOOD.items() if k != "tag"})
    with pytest.raises(SpecError, match=r"record bridge_x: tag: required field is missing$"):
        load_recipe_knobs(path)
    assert recipe_knobs("bridge_x", path=_write(tmp_path, GOOD)).value("tp_comm_overlap") is False
    with pytest.raises(SpecError, match=r"^bridge recipe knobs: no entry for record 'bridge_y'"):
        recipe_knobs("bridge_y", required=True, path=_write(tmp_path, GOOD))
    with pytest.raises(SpecError, match="unknown name 'warp'; allowed: "):
        recipe_knobs("bridge_x", path=_write(tmp_path, GOOD)).value("warp")


@pytest.fixture(scope="module")
def bridge_cases():
    cases, _ = load_reference(REFERENCE_DIR / "bridge_runs.yaml")
    return {c.id: c for c in cases}


def test_cases_run_their_own_release_recipe(bridge_cases):
    """The knobs the model costs follow each row's release: the all-to-all overlap arrives for Qwen3
    GB200 with 26.06 (not before), Qwen3 H100 drops TP overlap and folds experts to etp 1, the
    25.09 token-drop rows run capacity 1.0, the 25.11 'w/o MTP' rows have no MTP layer, DSV3's
    selective recompute modules are the recipe's; each cited with its Bridge tag."""
    c = bridge_cases
    assert c[QWEN_2606_GB200].plan.moe_a2a_overlap and not c[QWEN_2604_GB200].plan.moe_a2a_overlap
    assert c[QWEN_2604_GB200].plan.moe_dispatcher == "deepep"
    h100 = c[QWEN_2604_H100].plan
    assert (h100.tp_comm_overlap, h100.etp, h100.moe_dispatcher, h100.moe_a2a_overlap) == (False, 1, "alltoall", True)
    assert c["bridge_25.09_Qwen3_235B_a22B_DGX-B200_na_64gpu_gbs1024"].model.moe.capacity_factor == 1.0
    assert c["bridge_25.11_DeepSeekV3_DGX-GB200_BF16_256gpu_gbs4096"].model.mtp_layers == 0
    assert c["bridge_25.11_DeepSeekV3_DGX-B200_FP8-MX_256gpu_gbs2048"].model.mtp_layers == 1
    b200 = c[DSV3_260401_B200].plan
    assert (b200.recompute, b200.recompute_modules, b200.moe_dispatcher) == ("selective", ("mla_up_proj", "mlp"), "deepep")
    notes = c[QWEN_2606_GB200].assumptions
    assert any(a.startswith("expert all-to-all overlap") and "Megatron-Bridge v0.5.0 fcbb6031103d:" in a for a in notes)
    # the kernel settings the time model costs reach the job, cited
    job, job0 = c[QWEN_2606_GB200].job, c[QWEN_2604_GB200].job
    assert (job.full_iteration_cuda_graph, job.fused_grouped_mlp, job.fp8_attention) == (True, True, True)
    assert (job0.full_iteration_cuda_graph, job0.fused_grouped_mlp, job0.fp8_attention) == (False, False, False)
    assert any(a.startswith("fused grouped MLP, TE op fuser (Megatron-Bridge v0.5.0") for a in notes)
    assert any(a.startswith("full-iteration CUDA graph (Megatron-Bridge v0.5.0") for a in notes)
    assert not any(a.startswith("not costed: CUDA graphs full_iteration") for a in notes)
    # 26.04's per-layer TE graphs of attention, router and preprocess: costed, cited
    assert job0.cuda_graph_modules == ("attn", "moe_router", "moe_preprocess")
    assert any(a.startswith("per-layer CUDA graphs of attn/moe_router/moe_preprocess (Megatron-Bridge")
               for a in c[QWEN_2604_GB200].assumptions)
    assert not any(a.startswith("no recompute (NeMo/Bridge") for a in c[DSV3_260401_B200].assumptions)


def test_knobs_file_is_packaged():
    assert KNOBS_FILE.parent.name == "data" and KNOBS_FILE.read_text().startswith("# What each Megatron-Bridge")


def test_llama31_405b_rows_run_the_recipes_account_for_layout(bridge_cases):
    """Every release's Llama-3.1-405B pretrain recipe sets account_for_embedding/loss_in_pipeline_split
    (v0.1.0rc3 recipes/llama/llama31_405b.py defaults; @067f987 recipes/llama/h100/llama3.py lines
    1227-1228): the embedding and the loss each count as a layer, so 126 + 2 = 128 slots split evenly.
    By hand: 64 virtual stages hold 2 slots each -> [1, 2 x 62, 1]; 128 hold 1 -> [0, 1 x 126, 0]."""
    rows = [c for c in bridge_cases.values() if c.model.layers == 126 and c.plan.pp > 1]
    assert len(rows) >= 20
    for c in rows:
        stages = c.plan.pp * c.plan.vpp
        expect = (1,) + (2,) * 62 + (1,) if stages == 64 else (0,) + (1,) * 126 + (0,)
        assert stages in (64, 128) and tuple(c.plan.stage_layers) == expect, c.id
        assert any("llama31_405b_pretrain_config account_for_embedding/loss" in a for a in c.assumptions), c.id


LLAMA70_2604_GB200_FP8 = "bridge_26.04_LLAMA3_70B_DGX-GB200_FP8_64gpu_gbs256"
LLAMA70_2602_GB200_NVFP4 = "bridge_26.02_LLAMA3_70B_DGX-GB200_NVFP4_64gpu_gbs256"
LLAMA8_2511_B200 = "bridge_25.11_LLAMA3_8B_DGX-B200_FP8-CS_(FP8-MX)_8gpu_gbs128"
LLAMA8_2511_H100 = "bridge_25.11_LLAMA3_8B_DGX-H100_FP8-CS_8gpu_gbs128"


def test_llama3_70b_gb200_fp8_26_04_is_fsdp_with_40_offloaded_layers(bridge_cases):
    """Megatron-Bridge v0.4.0 (0fbfe7d3e970) scripts/performance/configs/llama/
    llama3_workload_base_configs.py lines 241-246: LLAMA3_70B_PRETRAIN_CONFIG_GB200_FP8_CS_V2 =
    replace(gbs 256, micro_batch_size=2, use_megatron_fsdp=True, cpu_offloading_num_layers=40);
    utils/overrides.py line 82 sets data_parallel_sharding_strategy "optim_grads_params", line 137
    cpu_offloading_weights False. The case keeps ZeRO-3, gathers FP8 weights, and offloads 40 of
    the 80 layers' activations to the GB200 preset's Grace tier: offload_activations 0.5."""
    k = recipe_knobs(LLAMA70_2604_GB200_FP8, required=True)
    assert (k.tag, k.commit[:12], k.config) == ("v0.4.0", "0fbfe7d3e970", "LLAMA3_70B_PRETRAIN_CONFIG_GB200_FP8_CS_V2")
    assert k.recipe_layout == {"tp": 1, "pp": 1, "vpp": None, "ep": 1, "cp": 1, "mbs": 2, "gbs": 256}
    assert k.layout_matches_record and k.mismatch is None
    assert (k.value("use_megatron_fsdp"), k.value("data_parallel_sharding_strategy")) == (True, "optim_grads_params")
    assert (k.value("cpu_offloading_num_layers"), k.value("cpu_offloading_weights")) == (40, False)
    assert k.value("recompute_granularity") is None and k.value("fp8_param_gather") is True
    case = bridge_cases[LLAMA70_2604_GB200_FP8]
    assert (case.plan.zero_stage, case.plan.fp8_param_gather, case.framework) == (3, True, "Megatron-FSDP")
    assert case.plan.offload_activations == 0.5 and case.system.offload is not None
    assert any(a.startswith("CPU offload of 40 of 80 layers' activations") and "v0.4.0 0fbfe7d3e970:" in a
               for a in case.assumptions)
    assert not any(a.startswith("not costed: CPU offload") for a in case.assumptions)


def test_llama3_70b_gb200_nvfp4_turns_tp_overlap_off(bridge_cases):
    """v0.3.0 (21b02e0cfb2f) scripts/performance/configs/llama/llama3_llm_pretrain.py line 113
    (llama3_70b_pretrain_config_gb200): tp_comm_overlap = False if precision == "nvfp4"; the NVFP4
    precision helper gathers FP4, not FP8, weights (training/mixed_precision.py line 402:
    fp8_param_gather = False). Layout tp 2 pp 4 vpp 5 is the record's."""
    k = recipe_knobs(LLAMA70_2602_GB200_NVFP4, required=True)
    assert "llama3_llm_pretrain.py llama3_70b_pretrain_config_gb200" in k.where("tp_comm_overlap")
    assert k.value("tp_comm_overlap") is False and k.value("fp8_param_gather") is False
    assert (k.recipe_layout["tp"], k.recipe_layout["pp"], k.recipe_layout["vpp"]) == (2, 4, 5)
    plan = bridge_cases[LLAMA70_2602_GB200_NVFP4].plan
    assert (plan.tp_comm_overlap, plan.fp8_param_gather) == (False, False)


def test_llama3_8b_25_11_b200_full_iteration_graph_and_h100_mismatch(bridge_cases):
    """v0.2.0 (7af9601c9da7) scripts/performance/configs/llama3/workload_base_configs.py lines
    207-212: LLAMA3_8B_B200_FP8_CS_BASE_CONFIG sets cuda_graph_impl "local" with scope
    "full_iteration" (Megatron-Core's whole-iteration graph): the job costs it. The H100 FP8-CS
    config (no Megatron-FSDP, recompute_num_layers 5) contradicts the record's FSDP 8, so its
    recompute is not applied: the record keeps no recompute."""
    b200 = bridge_cases[LLAMA8_2511_B200]
    assert recipe_knobs(LLAMA8_2511_B200).value("cuda_graph_scope") == ["full_iteration"]
    assert b200.job.full_iteration_cuda_graph is True
    assert any(a.startswith("full-iteration CUDA graph (Megatron-Bridge v0.2.0") for a in b200.assumptions)
    k = recipe_knobs(LLAMA8_2511_H100, required=True)
    assert (k.value("recompute_num_layers"), k.value("use_megatron_fsdp"), k.layout_matches_record) == (5, False, False)
    h100 = bridge_cases[LLAMA8_2511_H100]
    assert (h100.plan.recompute, h100.plan.zero_stage) == ("none", 3)
    assert any("recompute/FSDP/offload not applied" in a for a in h100.assumptions)


def test_dense_recipe_full_recompute_and_fsdp_when_the_record_is_silent(tmp_path):
    """A recipe with recompute_num_layers 5 (Bridge overrides: granularity full, method block) and
    Megatron-FSDP optim_grads_params, on a record that prints neither: full recompute of 5 layers,
    ZeRO-3 Megatron-FSDP; with the record's FSDP contradicting the recipe, neither is applied."""
    from planner.plan import Plan
    from planner.reference_dense import bridge_dense_recipe
    entry = {**GOOD, "recipe_layout": {"tp": 1, "pp": 1, "vpp": None, "ep": 1, "cp": 1, "mbs": 1},
             "knobs": {n: {"value": v, "where": "w"} for n, v in (
                 ("recompute_granularity", "full"), ("recompute_num_layers", 5), ("use_megatron_fsdp", True),
                 ("data_parallel_sharding_strategy", "optim_grads_params"), ("tp_comm_overlap", False))}}
    k = recipe_knobs("bridge_x", path=_write(tmp_path, entry))
    plan = Plan(tp=1, pp=1, dp=8, micro_batch=1, global_batch=128, zero_stage=1)
    run = bridge_dense_recipe(k, plan, "fp8", recompute_stated=False, fsdp_stated=False, layers=32, host_tier=False)
    assert run.plan_update == {"recompute": "full", "recompute_num_layers": 5, "recompute_modules": None,
                               "zero_stage": 3, "dp_impl": "megatron"} and run.megatron_fsdp
    Plan.model_validate({**plan.model_dump(), **run.plan_update})
    held = bridge_dense_recipe(k, plan, "fp8", recompute_stated=False, fsdp_stated=True, layers=32, host_tier=False)
    assert held.plan_update == {} and any("not applied" in n for n in held.notes)


def test_bridge_runs_reduce_bf16_gradients_at_every_precision():
    """Megatron-Bridge's performance scripts set grad_reduce_in_fp32=False for every model and
    precision (scripts/performance/configs/*/*_llm_pretrain.py, perf_recipes/_common.py): a BF16
    Bridge record keeps and reduces 2-byte gradients, as its FP8 records do; a BF16 run of another
    Megatron stack keeps Megatron's fp32 default."""
    cases = {c.id: c for c in load_reference()[0]}
    bridge_bf16 = cases["bridge_25.11_DeepSeekV3_DGX-GB200_BF16_256gpu_gbs4096"].job.bytes_per_param
    assert (bridge_bf16.grads, bridge_bf16.grad_reduce) == (2.0, 2.0)
    bridge_fp8 = cases["bridge_25.11_DeepSeekV3_DGX-GB200_FP8-MX_256gpu_gbs4096"].job.bytes_per_param
    assert (bridge_fp8.grads, bridge_fp8.grad_reduce) == (2.0, 2.0)
    other = [c for c in cases.values() if c.framework == "Megatron/NeMo" and c.job.dtype == "bf16"
             and c.id.startswith("dgxc_")]
    assert other and all(c.job.bytes_per_param.grads == 4.0 for c in other)
