"""Hybrid stacks (Nemotron-H / Nemotron-3: one block per layer, Megatron --hybrid-layer-pattern):
parameter and FLOP counts by hand and against NVIDIA's model card, the identity that a pattern of
attention and MLP blocks IS a transformer (time and memory equal to the layer-pair model), the
search space's limits, the launch refusal, and the held-out Nemotron 3 Nano rows."""
from __future__ import annotations

import statistics
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from constraints.space import knob_domains
from hardware import load_system
from planner.analytical import estimate, flops
from planner import megatron as mg
from planner.cli import app
from planner.model import ModelSpec, load_model
from planner import search
from planner.plan import JobSpec, Plan

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import heldout_bridge  # noqa: E402

NANO = load_model("nemotron-3-nano")


def test_nano_matches_the_model_card_and_a_hand_count():
    """NVIDIA's card: 31.6B total, 3.6B active with embeddings. By hand: a Mamba-2 block is
    in_proj h·(2·4096 + 2·8·128 + 64), conv1d 6144·(4 + 1), dt bias / A / D 3·64, the gated norm
    4096, out_proj 4096·h, its pre-norm h; an attention block h·(4096 + 2·256) + 4096·h and a
    norm; a MoE block 128 experts of 2·h·1856 (squared ReLU), the router h·128, one shared expert
    2·h·3712 and a norm; 23 + 6 + 23 blocks; untied vocabulary 131072 plus the final norm."""
    h = 2688
    mamba = h * (8192 + 2048 + 64) + 6144 * 5 + 3 * 64 + 4096 + 4096 * h + h
    attention = h * (4096 + 512) + 4096 * h + h
    moe_shared = h * 128 + 2 * h * 3712 + h
    experts = 128 * 2 * h * 1856
    total = 23 * mamba + 6 * attention + 23 * (moe_shared + experts) + 2 * 131072 * h + h
    active = 23 * mamba + 6 * attention + 23 * (moe_shared + 6 * 2 * h * 1856) + 2 * 131072 * h + h
    assert (NANO.blocks("M"), NANO.blocks("*"), NANO.blocks("E")) == (23, 6, 23)
    assert NANO.num_params == total and NANO.active_params == active
    assert NANO.num_params / 1e9 == pytest.approx(31.6, abs=0.05)
    assert NANO.active_params / 1e9 == pytest.approx(3.6, abs=0.05)


def test_super_matches_its_checkpoint_to_the_parameter():
    """Nemotron 3 Super's BF16 safetensors (as quoted with its config in public code): 123,611,012,096
    weights, 2,942,324,736 of them in the MTP module (one attention and one MoE block, the 2h->h
    projection and norms, shared by the recipes' two MTP passes) and 107,898,470,400 in the
    backbone's inactive experts (40 MoE blocks x 490 of 512 LatentMoE experts of 2·1024·2688)."""
    m = load_model("nemotron-3-super")
    assert m.num_params == 123_611_012_096
    assert m.mtp_params == 2_942_324_736
    assert 40 * (512 - 22) * m._mlp_params(2688, 1024) == 107_898_470_400
    assert m.mtp_layers == 2 and m.mtp_weight_modules == 1


def test_latent_moe_flops_by_hand():
    """LatentMoE per token: top-22 experts of two 1024×2688 matrices, the h<->latent projections
    (2·4096·1024 each way), one shared expert of two 4096×5376 matrices, the router 4096×512."""
    m = load_model("nemotron-3-super")
    expected = 2 * (22 * 2 * 1024 * 2688 + 2 * 4096 * 1024 + 2 * 4096 * 5376 + 4096 * 512)
    assert flops.mlp_matmul_flops_per_token(m) == expected


def test_latent_moe_moves_latent_rows():
    """The dispatch and combine carry the 1024-wide latent rows, not the 4096-wide hidden ones: a
    quarter of the bytes (the same link, so a quarter of the time up to its latency)."""
    from planner.analytical import PlanArrays
    from planner.analytical import time as tm
    m = load_model("nemotron-3-super")
    wide = m.model_copy(update={"moe": m.moe.model_copy(update={"latent_size": None})})
    system, job = load_system("h100-sxm", 64), JobSpec(dtype="bf16")
    P = PlanArrays.from_plans([Plan(dp=64, ep=64, global_batch=64)], m.layers)
    ratio = float(tm.moe_dispatch_s(m, system, job, P)[0] / tm.moe_dispatch_s(wide, system, job, P)[0])
    assert ratio == pytest.approx(1024 / 4096, rel=0.05)


def test_mamba_flops_by_hand():
    """Projections 2·h·in_proj + 2·d_inner·h; the SSD scan (Mamba-2 §6, chunk Q = 128, N = 128,
    P = 64, H = 64, G = 8): G·Q·N + H·(Q·P + 4·N·P) per token."""
    h = 2688
    assert flops.mamba_matmul_flops_per_token(NANO) == 2 * h * 10304 + 2 * 4096 * h
    assert flops.ssd_flops_per_token(NANO) == 8 * 128 * 128 + 64 * (128 * 64 + 4 * 128 * 64)
    attention_core = flops.attention_core_flops_per_token(NANO)
    per_token = (23 * (flops.mamba_matmul_flops_per_token(NANO) + flops.ssd_flops_per_token(NANO))
                 + 6 * (flops.attention_matmul_flops_per_token(NANO) + attention_core)
                 + 23 * flops.mlp_matmul_flops_per_token(NANO) + flops.logit_flops_per_token(NANO))
    assert flops.model_flops_per_token(NANO) == pytest.approx(3 * per_token, rel=1e-12)


def _as_blocks(model: ModelSpec, mlp: str) -> ModelSpec:
    """The same transformer written as a hybrid stack: each layer an attention block then an MLP
    block (`mlp`: - dense, E MoE)."""
    return model.model_copy(update={"name": model.name + "-as-blocks", "layers": 2 * model.layers,
                                    "hybrid_pattern": ("*" + mlp) * model.layers})


@pytest.mark.parametrize("preset,mlp,plan", [
    ("llama3-8b", "-", dict(tp=2, dp=8, global_batch=64, micro_batch=2, sequence_parallel=True)),
    ("qwen3-30b-a3b", "E", dict(tp=1, dp=16, ep=8, global_batch=64, micro_batch=1)),
])
def test_attention_and_mlp_blocks_are_the_transformer(preset, mlp, plan):
    """A hybrid stack of alternating attention and MLP blocks is the transformer it spells: the
    same parameters, FLOPs, step time and memory (pipeline size 1, where the mean block is exact)."""
    model = load_model(preset)
    blocks = ModelSpec.model_validate({**model.model_dump(), **_as_blocks(model, mlp).model_dump(
        include={"name", "layers", "hybrid_pattern"})})
    system, job = load_system("h100-sxm", 16), JobSpec(dtype="bf16")
    a, b = estimate(model, system, Plan(**plan), job), estimate(blocks, system, Plan(**plan), job)
    assert blocks.num_params == model.num_params and blocks.active_params == model.active_params
    assert flops.model_flops_per_token(blocks) == pytest.approx(flops.model_flops_per_token(model), rel=1e-12)
    assert b.step_time_s == pytest.approx(a.step_time_s, rel=1e-9)
    assert b.hbm_bytes == pytest.approx(a.hbm_bytes, rel=1e-9)


def test_search_space_of_a_hybrid_stack():
    """No context parallelism (the Mamba blocks' is not costed), no all-to-all overlap (Megatron's
    combined 1F1B schedule is GPTModel's), tensor parallelism within the Mamba heads and groups."""
    d = knob_domains(NANO, load_system("gb200-nvl72", 64), JobSpec(global_batch=512))
    assert d["cp"] == (1,) and d["moe_a2a_overlap"] == (0,)
    assert all(64 % t == 0 and 8 % t == 0 for t in d["tp"]) and 8 in d["tp"]


def test_the_all_to_all_overlap_on_a_hybrid_stack_is_not_launched():
    """The launch check refuses what the space leaves out: an independent brute force found
    `estimate` calling Nano with the overlap expressible (and `planner megatron` emitting
    --overlap-moe-expert-parallel-comm for pretrain_mamba.py), 8.5 % faster than `plan`'s best
    (72 GB200, free batch, DeepEP)."""
    plan = Plan(tp=1, pp=1, dp=72, ep=8, micro_batch=4, global_batch=2880, zero_stage=1,
                moe_dispatcher="deepep", moe_a2a_overlap=True)
    refusals = mg.not_expressible(plan, NANO, JobSpec(dtype="mxfp8", moe_dispatcher="deepep"))
    assert any("hybrid Mamba stack" in r for r in refusals)



def test_megatron_hybrid_stacks_offload_no_activations_in_the_search():
    """Megatron's hybrid stack has no layer-wise CPU offload (expressible.py refuses it), so the
    space leaves it out under Megatron, and keeps it for `--framework any`. With it in, the cost
    table's best rows on a Grace box were offloading ones that the launch check then dropped:
    Nemotron 3 Nano on 4 GB200 found no plan at all, and Nemotron 3 Super on 256 GB300 (nvfp4,
    batch 1024) said "no plan fits" while tp1 pp1 dp256 ep32 fits in 154 GiB."""
    box = load_system("gb200-nvl72", 4)
    assert knob_domains(NANO, box, JobSpec(global_batch=64))["offload_activations"] == (0.0,)
    assert len(knob_domains(NANO, box, JobSpec(global_batch=64, framework="any"))["offload_activations"]) > 1
    found = search.plan(NANO, box, JobSpec(global_batch=64), top_k=1)
    assert found.best is not None and found.stats["not_expressible_dropped"] == 0
    assert found.best.plan.offload_activations == 0 and not mg.not_expressible(found.best.plan, NANO, JobSpec())

@pytest.mark.parametrize("update,message", [
    ({"hybrid_pattern": "MEX*"}, "'X' is not a block"),
    ({"hybrid_pattern": "ME*"}, "one per layer"),
    ({"mamba": None}, "Mamba blocks (M) need `mamba`"),
    ({"moe": None}, "MoE blocks (E) need `moe`"),
])
def test_malformed_hybrid_models_are_one_line_errors(tmp_path, update, message):
    data = {**NANO.model_dump(exclude_none=True), "layers": 4, "hybrid_pattern": "ME*E", **update}
    data = {k: v for k, v in data.items() if v is not None}
    import yaml
    path = tmp_path / "model.yaml"
    path.write_text(yaml.safe_dump(data))
    result = CliRunner().invoke(app, ["estimate", "-m", str(path), "-s", "h100-sxm", "-g", "8", "--tp", "1",
                                      "--pp", "1", "-b", "8"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert message in " ".join(result.output.split())


def test_context_parallel_pin_on_a_hybrid_stack_is_refused():
    """plan refuses the pin in one line; estimate costs the plan but marks it infeasible by name."""
    result = CliRunner().invoke(app, ["plan", "-m", "nemotron-3-nano", "-s", "h100-sxm", "-g", "16", "-b", "1024",
                                      "--cp", "2"])
    assert result.exit_code == 2 and "Traceback" not in result.output and "allowed: 1" in result.output
    est = estimate(NANO, load_system("h100-sxm", 16), Plan(cp=2, dp=8, ep=8, global_batch=1024, micro_batch=1))
    assert "hybrid_cp" in est.violations and not est.feasible


def test_hybrid_plans_are_their_own_evidence_family():
    """The reference data holds no hybrid run: a hybrid plan's family has none, the output says its
    time rests on the model alone, and transformer MoE runs do not gate it."""
    from planner.evidence import evidence_note, family_of_plan
    from planner.recommend import recommend
    plan = Plan(dp=16, ep=8, global_batch=1024, micro_batch=1)
    assert family_of_plan(True, plan, hybrid=True).startswith("hybrid Mamba MoE")
    assert "rests on the model alone" in evidence_note(NANO, plan)
    rec = recommend(NANO, load_system("h100-sxm", 16), JobSpec(global_batch=1024), top_k=1)
    assert rec.model_only == [] and "evidence_gate" not in rec.stats


def test_layer_cuda_graphs_capture_the_mamba_blocks_too():
    """--cuda-graph layers on a hybrid stack adds the mamba module; each block kind whose module is
    captured pays no launch overhead (the Nano recipes' attn, mamba, moe_router, moe_preprocess)."""
    from planner.cli.common import kernel_settings
    settings = kernel_settings("layers", moe=True, mamba=True)
    assert set(settings["cuda_graph_modules"]) == {"attn", "mamba", "moe_router", "moe_preprocess"}
    system, plan = load_system("gb200-nvl72", 8), Plan(dp=8, ep=8, global_batch=512, micro_batch=2)
    eager = estimate(NANO, system, plan, JobSpec(dtype="mxfp8"))
    graphed = estimate(NANO, system, plan, JobSpec(dtype="mxfp8", cuda_graph_modules=settings["cuda_graph_modules"]))
    partial = estimate(NANO, system, plan, JobSpec(dtype="mxfp8", cuda_graph_modules=("attn",)))
    assert graphed.step_time_s < partial.step_time_s < eager.step_time_s


def test_the_busiest_ranks_own_blocks_are_measured_against_the_mean():
    """Nano's blocks reordered as 26 Mamba then 26 MoE at pp 2: rank 1 holds every MoE block, so
    its own blocks cost c_E against the mean (c_M + c_E)/2 it is costed with; interleaved (vpp 2)
    the chunks alternate ranks and rank 0 holds the second Mamba half and the first MoE half."""
    from planner.analytical import PlanArrays
    from planner.analytical.hybrid import block_fwd_s, busiest_rank_excess
    from planner.analytical.layer_kinds import lead_layers
    halves = ModelSpec(**{**NANO.model_dump(), "hybrid_pattern": "M" * 26 + "E" * 26})
    system, job = load_system("h100-sxm", 16), JobSpec(global_batch=64)
    plan = Plan(pp=2, dp=8, ep=8, micro_batch=1, global_batch=64)
    P = PlanArrays.from_plans([plan], halves.layers, lead_layers(halves))
    blocks = block_fwd_s(halves, system, job, P)
    c = {k: float(b["gemm"][0] + b["elementwise"][0]) for k, b in blocks.items()}
    rank, excess = busiest_rank_excess(halves, system, job, plan)
    assert rank == 1 and excess == pytest.approx(c["E"] / ((c["M"] + c["E"]) / 2) - 1, rel=1e-9)
    assert busiest_rank_excess(halves, system, job, plan.model_copy(update={"pp": 1, "dp": 16})) == (0, 0.0)
    interleaved = plan.model_copy(update={"vpp": 2})  # chunks M13 | M13 | E13 | E13 -> ranks 0,1,0,1
    assert busiest_rank_excess(halves, system, job, interleaved)[1] == pytest.approx(0.0, abs=1e-12)


def test_a_pipelined_hybrid_rank_is_timed_with_its_own_blocks():
    """Nano's blocks reordered as 26 Mamba then 26 MoE at pp 2: rank 1 holds every MoE block. Its
    microbatch is, by hand, 26 of the per-layer terms that do not depend on the block (TP
    collectives, selective recompute) plus 26 MoE blocks' forward, backward (BACKWARD_FACTOR x
    forward + the weight-gradient extra) and all-to-all (the mean layer's over the MoE share),
    plus the LM head; rank 0 the same with Mamba blocks and no all-to-all. The step takes the
    slower one. Without pipelining, and where the ranks hold the pattern's mix, the mean block is
    exact and nothing changes."""
    from planner.analytical import PlanArrays
    from planner.analytical import time as tm
    from planner.analytical.hybrid import block_forward_s, block_fwd_s
    from planner.analytical.layer_kinds import lead_layers
    from planner.analytical.ranks import pipeline_ranks
    halves = ModelSpec(**{**NANO.model_dump(), "hybrid_pattern": "M" * 26 + "E" * 26})
    system, job = load_system("h100-sxm", 16), JobSpec(global_batch=64)
    plan = Plan(pp=2, dp=8, ep=8, micro_batch=1, global_batch=64)
    P = PlanArrays.from_plans([plan], halves.layers, lead_layers(halves))
    terms = tm.per_layer_terms(halves, system, job, P)
    blocks = block_fwd_s(halves, system, job, P)

    def own(kind):
        fwd = float(block_forward_s(blocks[kind])[0])
        bwd = tm.BACKWARD_FACTOR * fwd + float(blocks[kind].get("wgrad_extra", [0.0])[0])
        a2a = float((terms["ep_fwd"] + terms["ep_bwd"])[0]) * 52 / 26 if kind == "E" else 0.0
        return fwd + bwd + a2a
    common = float((terms["tp_fwd"] + terms["tp_bwd"] + terms["cp_fwd"] + terms["cp_bwd"] + terms["selective"])[0])
    head = float((terms["logit_fwd"] + terms["logit_bwd"])[0])
    ranks = pipeline_ranks(halves, system, job, plan)
    assert ranks[0].microbatch_s == pytest.approx(26 * (common + own("M")), rel=1e-9)
    assert ranks[1].microbatch_s == pytest.approx(26 * (common + own("E")) + head, rel=1e-9)
    # the default split and the same layout written out cost the same
    explicit = plan.model_copy(update={"stage_layers": (26, 26)})
    assert estimate(halves, system, explicit, job).step_time_s == pytest.approx(
        estimate(halves, system, plan, job).step_time_s, rel=1e-12)
    # the mean block where it is exact: pp 1, and M/E alternating at pp 2 (each rank half and half)
    for model, p in ((halves, plan.model_copy(update={"pp": 1, "dp": 16})),
                     (ModelSpec(**{**NANO.model_dump(), "hybrid_pattern": "ME" * 26}), plan)):
        P = PlanArrays.from_plans([p], model.layers, 0)
        mean = tm.rank_microbatch_s(tm.per_layer_terms(model, system, job, P), P)
        assert max(r.microbatch_s for r in pipeline_ranks(model, system, job, p)) == pytest.approx(
            float(mean.max()), rel=1e-9)
    # the step: 1F1B over m = 8 microbatches at the slower rank (1, the MoE half) plus the bubble
    # (the other rank once); against the same blocks alternating (M/E on both ranks) it differs by
    # 8 x rank 1's difference + rank 0's difference + the optimizer step's (it waits for the rank
    # with the most parameters: rank 1's 26 MoE blocks against 13)
    assert ranks[1].microbatch_s > ranks[0].microbatch_s
    alternating = ModelSpec(**{**NANO.model_dump(), "hybrid_pattern": "ME" * 26})
    mixed = pipeline_ranks(alternating, system, job, plan)
    a, b = estimate(halves, system, plan, job), estimate(alternating, system, plan, job)
    expected = 8 * (ranks[1].microbatch_s - mixed[1].microbatch_s) + (ranks[0].microbatch_s - mixed[0].microbatch_s) \
        + a.time_breakdown_s["optimizer_step_s"] - b.time_breakdown_s["optimizer_step_s"]
    assert a.step_time_s - b.step_time_s == pytest.approx(expected, rel=1e-6)


def test_a_pipelined_hybrid_rank_holds_the_parameters_and_activations_of_its_own_blocks():
    """Nano's 26 Mamba then 26 MoE blocks at pp 2, ep 8: rank 0 holds no routed experts, rank 1
    all of them, 26 x 128 experts x 2 x 2688 x 1856 (squared ReLU: up and down) / 8 per GPU; rank
    0's other parameters are 26 Mamba blocks (their in_proj, conv, out_proj, norms; counted by
    hand in test_nano_matches_the_model_card_and_a_hand_count). Rank 0's activations per
    microbatch are 26 Mamba blocks' at 8192 tokens, bf16: the norm's input (2h bytes), in_proj's
    input (2h) and output z, x, B, C, dt (2 x 10304), the scan output y and out_proj's input
    (2 x 4096 each). The alternating pattern splits everything evenly."""
    from planner.analytical import PlanArrays
    from planner.analytical.layer_kinds import lead_layers
    from planner.analytical.memory import rank_memory, stage_params
    h = 2688
    mamba = h * (8192 + 2048 + 64) + 6144 * 5 + 3 * 64 + 4096 + 4096 * h + h
    per_moe_block = 128 * 2 * h * 1856 / 8
    plan = Plan(pp=2, dp=8, ep=8, micro_batch=1, global_batch=64, stage_layers=(26, 26))
    for pattern, expert_by_rank in (("M" * 26 + "E" * 26, (0, 26)), ("ME" * 26, (13, 13))):
        model = ModelSpec(**{**NANO.model_dump(), "hybrid_pattern": pattern})
        P = PlanArrays.from_plans([plan], model.layers, lead_layers(model))
        blocks, _, expert = stage_params(model, P, by_block=True)
        assert list(expert[0][:2]) == pytest.approx([n * per_moe_block for n in expert_by_rank], rel=1e-12)
        if pattern.startswith("M" * 26):
            assert blocks[0][0] == pytest.approx(26 * mamba, rel=1e-12)
            act = rank_memory(model, load_system("h100-sxm", 16), JobSpec(global_batch=64), P,
                              by_block=True)["activations_per_microbatch"][0]
            assert act[0] == pytest.approx(26 * 8192 * (2 * h + 2 * h + 2 * 10304 + 2 * 4096 + 2 * 4096), rel=1e-12)


def test_pipelined_hybrid_plans_say_how_stages_are_costed():
    result = CliRunner().invoke(app, ["estimate", "-m", "nemotron-3-nano", "-s", "h100-sxm", "-g", "16", "--tp", "1",
                                      "--pp", "2", "--ep", "8", "-b", "1024"])
    assert "own blocks" in " ".join(result.output.split())
    assert "mean block" in " ".join(result.output.split())
    flat = CliRunner().invoke(app, ["estimate", "-m", "nemotron-3-nano", "-s", "h100-sxm", "-g", "16", "--tp", "1",
                                    "--pp", "1", "--ep", "8", "-b", "1024"])
    assert "mean block" not in " ".join(flat.output.split())


def test_planner_megatron_launches_a_hybrid_stack_with_pretrain_mamba():
    """The script runs pretrain_mamba.py with the block pattern cut at the plan's stages ('|', in
    model order: vp_stage·pp + pp_rank) and the MTP depths after '/'; the layout flags of a
    transformer launch are absent (Megatron refuses them beside a pattern). Megatron's own parser
    reads such launches back to their plan and model in tests/test_megatron_parser.py."""
    result = CliRunner().invoke(app, ["megatron", "-m", "nemotron-3-super", "-s", "b200", "-g", "64",
                                      "-b", "128", "--tp", "1", "--pp", "2", "--vpp", "2", "--ep", "32",
                                      "--micro-batch", "1", "--dtype", "mxfp8", "--recompute", "full"])
    assert result.exit_code == 0, result.output
    _, argv, _ = mg.parse_script(result.output)
    assert "pretrain_mamba.py" in result.output and "pretrain_gpt.py" not in result.output
    model = load_model("nemotron-3-super")
    pattern = argv[argv.index("--hybrid-layer-pattern") + 1]
    main, *mtp = pattern.split("/")
    assert main.replace("|", "") == model.hybrid_pattern and mtp == ["*E"] * model.mtp_layers
    assert [len(seg) for seg in main.split("|")] == [22, 22, 22, 22]  # 88 layers, pp 2 x vpp 2
    for flag, value in (("--mamba-num-heads", model.mamba.num_heads), ("--moe-latent-size", model.moe.latent_size)):
        assert argv[argv.index(flag) + 1] == str(value)
    assert "--mtp-use-repeated-layer" in argv
    assert not {"--num-virtual-stages-per-pipeline-rank", "--pipeline-model-parallel-layout",
                "--account-for-embedding-in-pipeline-split", "--moe-layer-freq"} & set(argv)
    # one line of flags does not name its script: a note on stderr does
    line = CliRunner().invoke(app, ["megatron", "-m", "nemotron-3-nano", "-s", "gb200-nvl72", "-g", "16", "-b", "128",
                                    "--tp", "1", "--ep", "8", "--micro-batch", "2", "--format", "args"])
    assert line.exit_code == 0 and "note: these are pretrain_mamba.py arguments" in line.stderr
    assert line.stdout.startswith("--num-layers 52 ")


def test_heldout_nemotron_3_nano_rows():
    """The 20 Nemotron 3 Nano rows of the Megatron-Bridge tables (held out; nothing of the hybrid
    model is fitted), predicted with each release's recipe knobs: within 10 % on average, every
    row within 20 % (README: H100 1 %, GB300 6 %, GB200 7 %, B200/B300 15 %)."""
    recs, _ = heldout_bridge.records()
    cases, _ = heldout_bridge.read_back([r for r in recs if "Nemotron_3_Nano" in r["id"]])
    from planner.calibration import predict
    errors = [predict(c)["step_time_s"] / c.measured_step_s - 1 for c in cases]
    assert len(errors) == 20
    assert statistics.mean(abs(e) for e in errors) <= 0.10 and max(abs(e) for e in errors) <= 0.20


def test_bf16_tail_layers_without_an_attention_block_keep_the_mtp_module():
    """Nemotron 3 Super keeps its last 4 blocks in bf16 under an NVFP4 recipe (--bf16-layers 0,4):
    those blocks (M, E, M, E) hold no attention block, yet the MTP module costed beside them is
    still an attention block and a MoE block. The estimate runs (it was an internal error), the
    bf16 tail costs more than none, and the MTP module costs what it costs without bf16 layers."""
    from planner.analytical import PlanArrays
    from planner.analytical import time as tm
    super_ = load_model("nemotron-3-super")
    assert "*" not in super_.hybrid_pattern[-4:]
    system = load_system("b200", 64)
    plan = Plan(tp=1, pp=4, dp=16, ep=8, micro_batch=1, global_batch=512)
    plain = JobSpec(global_batch=512, dtype="nvfp4")
    tail = JobSpec(global_batch=512, dtype="nvfp4", bf16_layers=(0, 4))
    assert estimate(super_, system, plan, tail).step_time_s > estimate(super_, system, plan, plain).step_time_s
    kept = super_.model_copy(update={"hybrid_pattern": super_.hybrid_pattern[-4:], "layers": 4})
    P = PlanArrays.from_plans([plan], super_.layers, 0)
    assert float(tm.mtp_fwd_s(kept, {}, 0.0, system, plain, P)[0]) == pytest.approx(
        float(tm.mtp_fwd_s(super_, {}, 0.0, system, plain, P)[0]), rel=1e-12)
    result = CliRunner().invoke(app, ["estimate", "-m", "nemotron-3-super", "-s", "b200", "-g", "64", "--tp", "1",
                                      "--pp", "1", "--ep", "64", "-b", "512", "--dtype", "nvfp4", "--bf16-layers", "0,4"])
    assert result.exit_code == 0, result.output


def test_a_recomputed_hybrid_stage_reruns_its_first_blocks():
    """Megatron's block recompute reruns a stage's first k layers, so what a hybrid rank reruns
    depends on which blocks come first. Pattern (13 Mamba, 13 MoE) twice at pp 2, one stage per
    rank, 13 layers recomputed on rank 0 and 14 on rank 1: rank 0 reruns exactly its 13 Mamba
    blocks and keeps its 13 MoE blocks' activations, rank 1 its 13 Mamba blocks and one MoE
    block (a spread-evenly model would rerun 6.5 of each on rank 0). By hand: each recomputed
    block adds the TP and CP collectives of a forward and its own forward (a MoE block's with
    its all-to-all); each keeps its input (2 bytes x tokens x h) instead of its activations."""
    from planner.analytical import PlanArrays
    from planner.analytical import time as tm
    from planner.analytical.hybrid import block_forward_s, block_fwd_s
    from planner.analytical.memory import RankColumns, activation_bytes_per_layer, rank_memory
    from planner.analytical.ranks import pipeline_ranks
    model = ModelSpec(**{**NANO.model_dump(), "hybrid_pattern": ("M" * 13 + "E" * 13) * 2})
    system, job = load_system("h100-sxm", 16), JobSpec(global_batch=64)
    base = Plan(pp=2, dp=8, ep=8, micro_batch=1, global_batch=64, stage_layers=(26, 26))
    plan = base.model_copy(update={"recompute": "full", "stage_recompute_layers": (13, 14)})
    P = PlanArrays.from_plans([plan], model.layers, 0)
    terms = tm.per_layer_terms(model, system, job, P)
    blocks = block_fwd_s(model, system, job, P)
    fwd = {k: float(block_forward_s(b)[0]) for k, b in blocks.items()}
    a2a_fwd = float(terms["ep_fwd"][0]) * 52 / 26  # the mean layer's over the MoE share
    comm = float((terms["tp_fwd"] + terms["cp_fwd"])[0])
    plain = [r.microbatch_s for r in pipeline_ranks(model, system, job, base)]
    ranks = [r.microbatch_s for r in pipeline_ranks(model, system, job, plan)]
    assert ranks[0] - plain[0] == pytest.approx(13 * (comm + fwd["M"]), rel=1e-9)
    assert ranks[1] - plain[1] == pytest.approx(14 * comm + 13 * fwd["M"] + fwd["E"] + a2a_fwd, rel=1e-9)
    # memory: rank 0 keeps 13 inputs and 13 MoE blocks' full activations
    C = RankColumns(P)
    kept_e = float(np.ravel(activation_bytes_per_layer(model.model_copy(update={"hybrid_pattern": "E", "layers": 1}),
                                                      job, C)[1])[0])
    act = rank_memory(model, system, job, P, by_block=True)["activations_per_microbatch"][0]
    assert act[0] == pytest.approx(13 * 2 * 8192 * model.hidden + 13 * kept_e, rel=1e-12)
    # executed FLOPs: the 26 Mamba blocks' and the one MoE block's forward again, every token
    f_mamba = flops.mamba_matmul_flops_per_token(model) + flops.ssd_flops_per_token(model)
    f_moe = flops.mlp_matmul_flops_per_token(model)
    rerun = estimate(model, system, plan, job).hardware_flops - estimate(model, system, base, job).hardware_flops
    assert rerun == pytest.approx(64 * 8192 * (26 * f_mamba + f_moe), rel=1e-12)


def test_one_recompute_count_reruns_the_first_blocks_of_every_chunk():
    """Interleaved, one count k per stage: Megatron reruns the first k/vpp layers of every chunk,
    the same plan as those per-stage counts in time, memory and FLOPs. Pattern (13 Mamba, 13 MoE)
    twice at pp 2 × vpp 2, k = 8: chunks of 13 rerun 4 each. Chunks (3, 10, 10, 3): rank 0 holds
    3 Mamba then 10 MoE blocks and reruns 3 + 4 (7 blocks, 4 of them MoE), not its first 8 in
    chunk order (3 + 5)."""
    model = ModelSpec(**{**NANO.model_dump(), "hybrid_pattern": ("M" * 13 + "E" * 13) * 2})
    system, job = load_system("h100-sxm", 16), JobSpec(global_batch=64)
    base = Plan(pp=2, vpp=2, dp=8, ep=8, micro_batch=1, global_batch=64, stage_layers=(13, 13, 13, 13),
                recompute="full")
    one = estimate(model, system, base.model_copy(update={"recompute_num_layers": 8}), job)
    named = estimate(model, system, base.model_copy(update={"stage_recompute_layers": (4, 4, 4, 4)}), job)
    assert one.step_time_s == named.step_time_s and one.hbm_bytes == named.hbm_bytes
    # an uneven one: chunks (3, 10, 10, 3) at k = 8 rerun 3 + 4 on rank 0 (Megatron), not 8
    uneven = base.model_copy(update={"stage_layers": (3, 10, 10, 3)})
    one = estimate(model, system, uneven.model_copy(update={"recompute_num_layers": 8}), job)
    named = estimate(model, system, uneven.model_copy(update={"stage_recompute_layers": (3, 4, 4, 3)}), job)
    assert one.step_time_s == named.step_time_s and one.hbm_bytes == named.hbm_bytes
    assert one.hardware_flops == named.hardware_flops


def test_plan_says_when_a_hybrids_stages_were_searched_near_the_mean_block_split():
    """Nano at pp 8 vpp 2 has C(51, 15) splits: the per-block stage search keeps each bound near
    the mean-block answer, and `planner plan` says so rather than calling the answer optimal.
    (The micro-batch is pinned to the search's own choice, 2: one stage search, not three rounds.)"""
    result = CliRunner().invoke(app, ["plan", "-m", "nemotron-3-nano", "-s", "h100-sxm", "-g", "32", "-b", "512",
                                      "--tp", "1", "--pp", "8", "--vpp", "2", "--ep", "4", "--micro-batch", "2",
                                      "--top", "1"])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "within 3 layers of the mean-block split" in text
    assert "proven optimal" not in text.split("per-stage CP-SAT")[1]


def test_an_ssd_chunk_longer_than_the_sequence_is_scanned_as_the_sequence():
    """A chunk_size beyond the sequence was costed as if the chunk were filled: 10x the sequence
    made a step 5.6x slower (2026-11-28, tenth session). mamba_ssm's chunk kernels stop at the
    sequence's end, so a chunk of the whole sequence and a longer one are the same scan, and the
    SSD FLOPs per token are the chunked algorithm's at Q = the sequence (Dao & Gu 2024, §6)."""
    seq = NANO.seq_length
    whole, beyond, usual = (NANO.model_copy(update={"mamba": NANO.mamba.model_copy(update={"chunk_size": q})})
                            for q in (seq, 10 * seq, 128))
    m = NANO.mamba
    assert flops.ssd_flops_per_token(beyond) == flops.ssd_flops_per_token(whole) \
        == m.groups * seq * m.state_dim + m.num_heads * (seq * m.head_dim + 4 * m.state_dim * m.head_dim)
    system, plan = load_system("h100-sxm", 8), Plan(tp=1, pp=1, dp=8, global_batch=16)
    t = {name: estimate(model, system, plan).step_time_s for name, model in
         (("whole", whole), ("beyond", beyond), ("usual", usual))}
    assert t["beyond"] == t["whole"] and t["usual"] < t["whole"]
