"""The Megatron MoE ModelZoo GB200/GB300 rows run what the command printed under their table row
sets (planner/data/modelzoo_command_knobs.yaml, read at yanring/Megatron-MoE-ModelZoo@798dfb5
best_practice/qwen3/readme.md with its sbatch_benchmarking.sh and model config): each applied
setting reaches the row's plan, cited; the layouts follow the model config's split flags, derived
here by hand."""
from __future__ import annotations

import pytest

from planner.analytical import time as T
from planner.analytical.estimate import estimate
from planner.bridge_recipes import MODELZOO_KNOBS_FILE, launch_knobs, load_recipe_knobs, recipe_knobs
from planner.reference import REFERENCE_DIR, load_reference
from tests.conftest import reference_copy

GB300 = "mcore-modelzoo_qwen3-235b_64gpu_gb300_mxfp8_tp1_pp1_ep64_cp1_seq4096"
GB200_BF16 = "mcore-modelzoo_qwen3-235b_256gpu_gb200_bf16_tp1_pp8_ep8_cp1_seq4096"
GB200_MXFP8 = "mcore-modelzoo_qwen3-235b_256gpu_gb200_mxfp8_tp1_pp4_ep64_cp1_seq4096"
GB200_128K = "mcore-modelzoo_qwen3-235b_128gpu_gb200_mxfp8_tp4_pp4_ep32_cp4_seq131072"
CITE = "Megatron-MoE-ModelZoo @798dfb5 798dfb503c68:"


@pytest.fixture(scope="module")
def zoo():
    cases, _ = load_reference(REFERENCE_DIR / "fsdp_moe_runs.yaml")
    return {c.id: c for c in cases if c.id.startswith("mcore-modelzoo")}


def test_table_covers_the_rows_with_a_published_command():
    """The GB200/GB300 rows (each has a command under its row at 798dfb5); the H100 rows have none.
    Every entry's layout is its record's, its commit the records' source commit."""
    doc = reference_copy(REFERENCE_DIR / "fsdp_moe_runs.yaml")
    zoo = {r["id"]: r for r in doc["records"] if r["id"].startswith("mcore-modelzoo")}
    with_command = {rid for rid, r in zoo.items() if r["system"]["gpu"] in ("GB200", "GB300")}
    table = load_recipe_knobs(MODELZOO_KNOBS_FILE)
    assert set(table) == with_command == {GB300, GB200_BF16, GB200_MXFP8, GB200_128K}
    for rid, k in table.items():
        p = zoo[rid]["parallel"]
        assert k.recipe_layout == {"tp": p["tp"], "pp": p["pp"], "vpp": p["vpp"], "ep": p["ep"],
                                   "gbs": p["global_batch"]}, rid
        assert k.commit == zoo[rid]["source"]["commit"] and k.source == "Megatron-MoE-ModelZoo"
        assert all(knob.where.startswith("798dfb503c68:") for knob in k.knobs.values()), rid


def test_launch_knobs_reads_each_records_own_table():
    bridge = "bridge_25.11_Qwen3_235B_a22B_DGX-B200_FP8-MX_64gpu_gbs1024"
    assert launch_knobs(bridge) == recipe_knobs(bridge) and launch_knobs(bridge).source == "Megatron-Bridge"
    assert launch_knobs(GB300).cite("overlap_moe_expert_parallel_comm").startswith(CITE + "best_practice/qwen3/readme.md:103")
    assert launch_knobs("mcore-modelzoo_qwen3-235b_256gpu_tp2_pp8_ep32_edp1_deepep_1") is None  # H100: no command
    assert launch_knobs("torchtitan_llama4_x") is None


def test_gb300_runs_the_all_to_all_overlap_its_command_sets(zoo):
    """A2A_OVERLAP=1: the overlap hides the paired microbatches' all-to-all. By hand with
    pp 1 (only the first forward and the last backward are unpaired, u = 1/m, m = 8192/64 = 128
    microbatches) and compute longer than the all-to-all: exposed/plain = (2u + (1-u)(2 - 2e))/2,
    e = A2A_OVERLAP_EFFICIENCY."""
    c = zoo[GB300]
    assert c.plan.moe_a2a_overlap and c.plan.moe_dispatcher == "deepep" and c.plan.recompute == "none"
    assert any(a.startswith("expert all-to-all overlap + delayed wgrad (" + CITE + "best_practice/qwen3/readme.md:103 A2A_OVERLAP=1")
               for a in c.assumptions)
    assert c.job.cuda_graph_modules == ("attn", "moe_router", "moe_preprocess")
    assert any(a.startswith("per-layer CUDA graphs of attn/moe_router/moe_preprocess (") for a in c.assumptions)
    on = estimate(c.model, c.system, c.plan, c.job).time_breakdown_s["cp_ep_comm_exposed_s"]
    off = estimate(c.model, c.system, c.plan.model_copy(update={"moe_a2a_overlap": False}), c.job) \
        .time_breakdown_s["cp_ep_comm_exposed_s"]
    u, e = 1 / 128, T.A2A_OVERLAP_EFFICIENCY
    assert on / off == pytest.approx((2 * u + (1 - u) * (2 - 2 * e)) / 2, rel=1e-9)


def test_gb200_mxfp8_runs_recompute_and_overlap_and_lists_the_offload(zoo):
    c = zoo[GB200_MXFP8]
    assert (c.plan.recompute, set(c.plan.recompute_modules), c.plan.moe_a2a_overlap) == \
        ("selective", {"moe_act", "layernorm"}, True)
    assert "no recompute (not stated)" not in c.assumptions
    assert any(a.startswith("selective recompute of moe_act layernorm (" + CITE) for a in c.assumptions)
    assert any(a.startswith("not costed: activation offload of expert_fc1 moe_act (" + CITE) for a in c.assumptions)
    # 96 slots (94 layers + embedding + loss) over pp 4 x vpp 6 = 24 virtual stages: 4 each,
    # the first and last give one slot to the embedding and the loss
    assert c.plan.stage_layers == (3,) + (4,) * 22 + (3,)


def test_gb200_bf16_runs_without_overlap_and_recompute(zoo):
    c = zoo[GB200_BF16]
    assert (c.plan.moe_a2a_overlap, c.plan.recompute, c.plan.moe_dispatcher) == (False, "none", "deepep")
    assert "no recompute (" + CITE + "best_practice/qwen3/readme.md:69 (no recompute flag; none in the model config))" \
        in c.assumptions and "no recompute (not stated)" not in c.assumptions
    assert any(a.startswith("flex dispatcher, hybridep (" + CITE + "best_practice/qwen3/readme.md:69") for a in c.assumptions)
    # 96 slots over 8 stages: 12 each, 11 on the first (embedding) and the last (loss)
    assert c.plan.stage_layers == (11,) + (12,) * 6 + (11,)
    assert any(a.startswith("layout 11,12x6,11 layers per virtual stage as the recipe sets it (" + CITE +
                            "model_configs/benchmarking/Qwen3-235B-A22B.yaml:27-28") for a in c.assumptions)


def test_long_context_row_runs_mxfp8_without_tp_overlap(zoo):
    """sbatch_benchmarking.sh adds --tp-comm-overlap only for PR=bf16; this command is PR=mxfp8."""
    c = zoo[GB200_128K]
    p = c.plan
    assert (p.tp_comm_overlap, p.etp, p.moe_a2a_overlap, p.recompute) == (False, 1, False, "selective")
    assert set(p.recompute_modules) == {"moe_act", "layernorm"}
    assert any(a.startswith("TP comm overlap off (" + CITE + "sbatch_benchmarking.sh:94-95") for a in c.assumptions)
    # 96 slots over pp 4 x vpp 12 = 48 virtual stages: 2 each, 1 on the first and the last
    assert p.stage_layers == (1,) + (2,) * 46 + (1,)


def test_h100_rows_take_the_model_configs_split_flags(zoo):
    """The rows without a command still run the ModelZoo model config's account-for-embedding/loss
    split: pp 32 x vpp 3 = 96 virtual stages for 96 slots, one each, the first holding only the
    embedding and the last only the loss -> [0, 1 x 94, 0]; pp 8 x vpp 4: 3 slots each -> [2, 3 x 30, 2]."""
    qwen = [c for c in zoo.values() if c.id.startswith("mcore-modelzoo_qwen3-235b") and c.plan.pp > 1]
    assert len(qwen) == 15  # 4 H100 table rows, 8 long-context rows, 3 GB200 rows
    assert not any("balanced split" in a for c in qwen for a in c.assumptions)
    assert zoo["mcore-modelzoo_qwen3-235b_256gpu_tp2_pp32_ep8_edp1_a2a_4"].plan.stage_layers == (0,) + (1,) * 94 + (0,)
    deepep = zoo["mcore-modelzoo_qwen3-235b_256gpu_tp2_pp8_ep32_edp1_deepep_1"]
    assert deepep.plan.stage_layers == (2,) + (3,) * 30 + (2,)
    assert any("Qwen3-235B-A22B.yaml:27-28 --account-for-embedding/loss-in-pipeline-split" in a for a in deepep.assumptions)
