"""What NVIDIA's MoE benchmarks ran with (planner/reference_moe.py), the expert all-to-all
overlap's Megatron rules, and the routing-imbalance flag."""
from __future__ import annotations

import json

import pytest

from hardware import load_system
from planner import megatron as mg
from planner.megatron import rules
from planner.analytical import estimate
from planner.cli.app import app
from planner.model import load_model
from planner.plan import JobSpec, Plan
from planner.reference import load_reference
from planner.reference_moe import MOE_IMBALANCE_LEARNED_DROPLESS, a2a_overlap_allowed, nvidia_moe_settings
from tests.conftest import reference_yaml

QWEN3 = load_model("qwen3-235b-a22b")
DSV3 = load_model("deepseek-v3")
PIPE = Plan(tp=2, pp=8, dp=16, ep=32, etp=1, vpp=4, micro_batch=1, global_batch=2048, sequence_parallel=True)


def test_bridge_recipes_force_balance_and_overlap_where_the_recipe_source_does():
    update, imbalance, notes = nvidia_moe_settings("bridge_26.04_Qwen3_x", QWEN3, PIPE, "fp8", "H100-SXM5-80GB")
    assert imbalance == 1.0 and update == {"moe_a2a_overlap": True}  # qwen/h100 perf recipe: alltoall
    # Qwen3 on B200 sets the overlap off; DeepSeek-V3 asks for the flex dispatcher everywhere
    b200 = Plan(tp=1, pp=8, dp=32, ep=8, vpp=2, micro_batch=1, global_batch=4096)
    assert nvidia_moe_settings("bridge_26.04_Qwen3_x", QWEN3, b200, "mxfp8", "B200")[0] == {}
    dsv3 = Plan(tp=1, pp=8, dp=32, ep=32, vpp=2, micro_batch=1, global_batch=4096)
    assert nvidia_moe_settings("bridge_26.04_DeepSeekV3_x", DSV3, dsv3, "mxfp8", "B200")[0] == {
        "moe_dispatcher": "deepep", "moe_a2a_overlap": True}
    # a layout Megatron cannot overlap (pp > 1 without interleaving) keeps it off
    flat = Plan(tp=1, pp=16, dp=16, ep=8, micro_batch=1, global_batch=4096)
    assert "moe_a2a_overlap" not in nvidia_moe_settings("bridge_x_DeepSeekV3", DSV3, flat, "mxfp8", "GB200")[0]
    assert not a2a_overlap_allowed(flat, DSV3)


def test_learned_routing_rows_and_others():
    _, imb, notes = nvidia_moe_settings("mcore-modelzoo_qwen3_seq16384_dropless", QWEN3, PIPE, "bf16", "H100")
    assert imb == MOE_IMBALANCE_LEARNED_DROPLESS and "learned" in notes[0]
    # NeMo's perf scripts force balance only for DeepSeek-V3: the Grok proxies ran learned routing
    grok = QWEN3.model_copy(update={"name": "Grok-1 (314B)"})
    assert nvidia_moe_settings("dgxc_v25.04.01_Grok1", grok, PIPE, "bf16", "H100")[1] == MOE_IMBALANCE_LEARNED_DROPLESS
    # other stacks route as learned; dense models are left alone
    update, imb, _ = nvidia_moe_settings("torchtitan_llama4", QWEN3, PIPE, "bf16", "H100")
    assert update == {} and imb == MOE_IMBALANCE_LEARNED_DROPLESS  # torchtitan trains its router
    dense = load_model("llama3-8b")
    assert nvidia_moe_settings("bridge_x", dense, Plan(dp=8, global_batch=8), "bf16", "H100") == ({}, None, [])


def test_loaded_rows_carry_the_settings_as_assumptions():
    cases, _ = load_reference()
    by_id = {c.id: c for c in cases}
    on = by_id["mcore-modelzoo_qwen3-235b_256gpu_tp2_pp8_ep32_edp1_deepep_2"]
    off = by_id["mcore-modelzoo_qwen3-235b_256gpu_tp2_pp8_ep32_edp1_deepep_1"]
    assert on.plan.moe_a2a_overlap and not off.plan.moe_a2a_overlap  # "+1f1b overlap" in the notes
    assert on.plan.moe_dispatcher == "deepep"
    assert any("overlap" in a for a in on.assumptions)
    dropless = [c for c in cases if c.id.endswith("_dropless")]
    assert len(dropless) == 4 and all(c.job.moe_load_imbalance == MOE_IMBALANCE_LEARNED_DROPLESS for c in dropless)


def test_overlap_refused_where_megatron_refuses_it():
    m = load_model("qwen3-30b-a3b")
    job = JobSpec()
    no_vpp = Plan(pp=4, dp=16, ep=8, micro_batch=1, global_batch=256, moe_a2a_overlap=True)
    assert any("interleaving" in r for r in mg.not_expressible(no_vpp, m, job))
    full = Plan(pp=4, vpp=2, dp=16, ep=8, micro_batch=1, global_batch=256, moe_a2a_overlap=True, recompute="full")
    assert any("full recompute" in r for r in mg.not_expressible(full, m, job))
    moe_rc = Plan(pp=4, vpp=2, dp=16, ep=8, micro_batch=1, global_batch=256, moe_a2a_overlap=True,
                  recompute="selective", recompute_modules=("moe",))
    assert any("moe cannot be recomputed" in r for r in mg.not_expressible(moe_rc, m, job))
    assert not a2a_overlap_allowed(moe_rc.model_copy(update={"moe_a2a_overlap": False}), m)
    with pytest.raises(ValueError):
        Plan(dp=8, global_batch=8, moe_a2a_overlap=True)  # ep 1: nothing to overlap
    # Megatron's own messages on an argument list
    ok = Plan(pp=4, vpp=2, dp=16, ep=8, micro_batch=1, global_batch=256, moe_a2a_overlap=True)
    launch = mg.megatron_args(ok, m, job, load_system("h100-sxm", 64))
    assert mg.validate_launch(launch) == []
    argv = launch.argv()
    i = argv.index("--num-virtual-stages-per-pipeline-rank") if "--num-virtual-stages-per-pipeline-rank" in argv \
        else argv.index("--num-layers-per-virtual-pipeline-stage")
    bad = argv[:i] + argv[i + 2:]
    assert rules.MSG_A2A_VPP in mg.validate_megatron_args(bad, 64, launch.env)
    assert rules.MSG_DELAY_WGRAD in mg.validate_megatron_args(
        [a for a in argv if a != "--overlap-moe-expert-parallel-comm"], 64, launch.env)


def test_moe_imbalance_flag_slows_the_moe_layers(capsys):
    """ep 16: 8 local experts of 4096 rows. Their GPU time nearly covers the host issuing them
    (time.expert_host_exposed_s), so most of the skew shows; at ep 8 (16 experts) the host
    time hides most of it."""
    from typer.testing import CliRunner
    args = ["estimate", "-m", "qwen3-30b-a3b", "-s", "h100-sxm", "-g", "64", "--pp", "4", "--tp", "1",
            "--ep", "16", "--micro-batch", "1", "-b", "256", "--recompute", "none", "--json"]
    r1 = CliRunner().invoke(app, args)
    r2 = CliRunner().invoke(app, args + ["--moe-imbalance", "1.5"])
    assert r1.exit_code in (0, 1) and r2.exit_code in (0, 1), (r1.output, r2.output)
    t1, t2 = json.loads(r1.output)["step_time_s"], json.loads(r2.output)["step_time_s"]
    assert t2 > 1.1 * t1
    bad = CliRunner().invoke(app, args + ["--moe-imbalance", "0.5"])
    assert bad.exit_code == 2 and "moe-imbalance: must be a number from 1 to 8" in bad.output and "Traceback" not in bad.output


def test_overlap_pays_one_more_microbatch_of_memory_and_saves_time():
    """With DeepEP, or NCCL's alltoall across nodes, the overlap saves time; with NCCL's alltoall
    inside the NVLink domain it hides nothing (time.a2a_in_nccl_copy_kernels): the same
    time, the memory paid all the same."""
    m, s = load_model("qwen3-30b-a3b"), load_system("h100-sxm", 64)
    for base, dispatcher, saves in ((dict(pp=4, vpp=2, dp=16, ep=8), "deepep", True),
                                    (dict(pp=4, vpp=2, dp=16, ep=16), "alltoall", True),
                                    (dict(pp=4, vpp=2, dp=16, ep=8), "alltoall", False)):
        base = dict(base, micro_batch=1, global_batch=256, moe_dispatcher=dispatcher)
        e0 = estimate(m, s, Plan(**base), JobSpec(global_batch=256, moe_dispatcher=dispatcher))
        e1 = estimate(m, s, Plan(**base, moe_a2a_overlap=True), JobSpec(global_batch=256, moe_dispatcher=dispatcher))
        if saves:
            assert e1.step_time_s < 0.99 * e0.step_time_s, (base, dispatcher)
        else:
            assert e1.step_time_s == pytest.approx(e0.step_time_s, rel=1e-9), (base, dispatcher)
        assert e1.memory_breakdown_bytes["activations_bytes"] > e0.memory_breakdown_bytes["activations_bytes"]


def _records_with_step_and_tflops():
    from planner.reference import REFERENCE_DIR  # noqa: PLC0415
    data = reference_yaml(REFERENCE_DIR / "fsdp_moe_runs.yaml")
    return {r["id"]: r["measured"] for r in data["records"]
            if (r.get("measured") or {}).get("step_time_s") and (r.get("measured") or {}).get("tflops_per_gpu")}


def test_megatron_counter_reproduces_the_modelzoo_rows_that_publish_both_numbers():
    """ModelZoo rows with a step time AND TFLOP/s: TFLOP/s·GPUs·time / tokens is the source's own FLOPs
    per token; Megatron's causal count (flops.megatron_logged_flops_per_token) gives it within 1 %
    (the step times are rounded to 3 digits), the full-attention count is 13 % higher."""
    from planner.analytical.flops import megatron_logged_flops_per_token, model_flops_per_token  # noqa: PLC0415
    both = _records_with_step_and_tflops()
    cases = {c.id: c for c in load_reference()[0] if c.id in both and "qwen3-235b" in c.id}
    assert len(cases) >= 5
    for rid, c in cases.items():
        m = both[rid]
        published = m["tflops_per_gpu"] * 1e12 * c.system.num_gpus * m["step_time_s"] / (
            c.job.global_batch * c.model.seq_length)
        assert megatron_logged_flops_per_token(c.model) == pytest.approx(published, rel=0.01)
        assert model_flops_per_token(c.model) > 1.1 * published


def test_config_reference_dimensions_are_read():
    """Attention dimensions a record states only in its config reference: Qwen3-235B's 128-wide
    heads (ModelZoo) and DeepSeek-V3's MLA ranks (the GB200 guide)."""
    cases = load_reference()[0]
    qwen = next(c for c in cases if c.id.startswith("mcore-modelzoo_qwen3-235b"))
    assert qwen.model.q_hidden == 64 * 128
    dsv3 = next(c for c in cases if "gb200guide" in c.id)
    assert dsv3.model.mla is not None and (dsv3.model.mla.q_lora_rank, dsv3.model.mla.kv_lora_rank) == (1536, 512)


def test_plan_output_says_where_the_all_to_all_overlap_hides_nothing():
    """report.moe_dispatch_note: NCCL's alltoall with ep·etp inside the NVLink domain (ep 8 on a
    72-GPU NVL72 or an 8-GPU node) names the dispatcher that lets the overlap work; across nodes,
    with DeepEP, for dense models and outside Megatron it says nothing."""
    from planner.report import moe_dispatch_note  # noqa: PLC0415
    m = load_model("qwen3-30b-a3b")
    nvl72, dgx = load_system("gb200-nvl72", 64), load_system("h100-sxm", 64)
    job = JobSpec(global_batch=1024)

    def note_for(system, plan, job=job, model=m):
        return moe_dispatch_note(model, system, job, estimate(model, system, plan, job))

    plan = Plan(dp=64, ep=8, global_batch=1024)
    note = note_for(nvl72, plan)
    assert note and "ep 8, inside the 72-GPU NVLink domain" in note and "--moe-dispatcher deepep" in note
    # the same plan with DeepEP and the overlap, as the note's numbers say
    now = estimate(m, nvl72, plan, job).step_time_s
    deepep = estimate(m, nvl72, plan.model_copy(update={"moe_dispatcher": "deepep", "moe_a2a_overlap": True}),
                      JobSpec(global_batch=1024, moe_dispatcher="deepep")).step_time_s
    assert deepep < now and f"with DeepEP and the overlap: {now:.3f} → {deepep:.3f} s per step" in note
    assert note_for(dgx, Plan(dp=64, ep=8, global_batch=1024))
    assert note_for(dgx, Plan(dp=64, ep=16, global_batch=1024)) is None  # across nodes
    assert note_for(nvl72, Plan(dp=64, ep=8, global_batch=1024, moe_dispatcher="deepep")) is None
    outside_megatron = JobSpec(global_batch=1024, framework="any")
    assert note_for(nvl72, Plan(dp=64, ep=8, global_batch=1024), job=outside_megatron) is None
    assert note_for(dgx, Plan(dp=64, global_batch=1024), model=load_model("llama3-8b")) is None
    # a hybrid stack: Megatron's combined 1F1B schedule is GPTModel's, the search never overlaps it
    assert note_for(nvl72, Plan(dp=64, ep=8, global_batch=1024), model=load_model("nemotron-3-nano")) is None
