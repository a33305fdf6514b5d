"""Leading dense layers of a MoE model costed per pipeline rank as what they are (issue 8 item 1):
hand-derived per-rank composition, parameters, activations and time; the representative-rank
reduction against every rank; the per-stage CP-SAT against the brute-force oracle."""
from __future__ import annotations

import itertools
import re

import numpy as np
import pytest

from constraints.stages import best_stages
from hardware import load_system
from planner.analytical import PlanArrays, estimate
from planner.analytical.memory import rank_memory
from planner.analytical.time import layer_microbatch_s, layer_recompute_s, per_layer_terms, rank_microbatch_s
from planner.model import ModelSpec, load_model
from planner.pipeline_layout import balanced_layout, layout_from_string, stage_lead_layers
from planner.plan import JobSpec, Plan
from tests.test_pipeline import assert_per_stage_zero_regret

# 2 dense + 6 MoE layers. Per layer (no biases, RoPE, SwiGLU): attention 4·256² = 262,144;
# norms 2·256 = 512; dense MLP 3·256·1024 = 786,432; 8 experts of 3·256·256 = 196,608 each =
# 1,572,864; router 256·8 = 2,048. Embedding / LM head 1000·256 = 256,000 each (pp > 1).
TINY = ModelSpec(layers=8, hidden=256, heads=4, ffn=1024, seq_length=128, vocab=1000, activation="swiglu",
                 position_embedding="rope", biases=False, dropout=False, tied_embeddings=False,
                 moe={"num_experts": 8, "top_k": 2, "expert_ffn": 256, "first_dense_layers": 2})
# the same model's two layer kinds, written out independently of planner.analytical.layer_kinds
ALL_MOE = TINY.model_copy(update={"moe": TINY.moe.model_copy(update={"first_dense_layers": 0})})
ALL_DENSE = ModelSpec(layers=8, hidden=256, heads=4, ffn=1024, seq_length=128, vocab=1000, activation="swiglu",
                      position_embedding="rope", biases=False, dropout=False, tied_embeddings=False)
DENSE_LAYER, MOE_NON_EXPERT, EXPERTS, VOCAB = 262_144 + 786_432 + 512, 262_144 + 2_048 + 512, 1_572_864, 256_000


def test_leading_layers_fill_the_first_virtual_stages():
    assert stage_lead_layers((4, 4), 2) == (2, 0)
    assert stage_lead_layers((1, 2, 2, 3), 2) == (1, 1, 0, 0)  # pp 2 vpp 2: rank 0 chunk 0, rank 1 chunk 0
    assert stage_lead_layers((1, 1, 1, 1), 3) == (1, 1, 1, 0)  # pp 2 vpp 2: wraps to rank 0's chunk 1
    assert stage_lead_layers((2, 2), 0) == (0, 0)


def _arrays(plans, model=TINY):
    return PlanArrays.from_plans(plans, model.layers, 2 if model.moe and model.moe.first_dense_layers else 0)


def _rank(P, col, r):
    """Row 0's value of column `col` at pipeline rank r (representatives may repeat a rank)."""
    j = int(np.flatnonzero(P.rank_index[0] == r)[0])
    return col[0, j]


PP2 = Plan(pp=2, dp=2, ep=2, etp=1, global_batch=8)                                    # layout (4, 4)
PP2_VPP2 = Plan(pp=2, vpp=2, dp=2, ep=2, etp=1, global_batch=8, stage_layers=(1, 2, 2, 3),
                recompute="full", stage_recompute_layers=(1, 1, 1, 1))


def test_rank_composition_pp2_and_pp2_vpp2():
    P = _arrays([PP2])
    assert [_rank(P, P.rank_layers, r) for r in (0, 1)] == [4, 4]
    assert [_rank(P, P.rank_lead_layers, r) for r in (0, 1)] == [2, 0]
    Q = _arrays([PP2_VPP2])
    # stages (1, 2, 2, 3): rank 0 = stages 0, 2 (1 dense; 2 MoE), rank 1 = stages 1, 3 (1 dense + 1 MoE; 3 MoE)
    assert [_rank(Q, Q.rank_layers, r) for r in (0, 1)] == [3, 5]
    assert [_rank(Q, Q.rank_lead_layers, r) for r in (0, 1)] == [1, 1]
    # block recompute of 1 layer per stage takes each stage's first: the dense one where there is one
    assert [_rank(Q, Q.rank_recompute, r) for r in (0, 1)] == [2, 2]
    assert [_rank(Q, Q.rank_lead_recompute, r) for r in (0, 1)] == [1, 1]
    assert Q.lead_recompute_total[0] == 2 and Q.recompute_total[0] == 4


def test_rank_parameters_hand_derived():
    """ep 2 shards the experts; rank 0 holds 2 dense + 2 MoE layers + embedding, rank 1 4 MoE +
    LM head."""
    system = load_system("h100-sxm", 4)
    P = _arrays([PP2])
    params = rank_memory(TINY, system, JobSpec(), P)["params_elems"]
    assert _rank(P, params, 0) == 2 * DENSE_LAYER + 2 * MOE_NON_EXPERT + 2 * EXPERTS / 2 + VOCAB
    assert _rank(P, params, 1) == 4 * MOE_NON_EXPERT + 4 * EXPERTS / 2 + VOCAB


def test_rank_activations_hand_derived():
    """Korthikanti Table 2 per layer in s·b·h bytes (tp 1, no dropout, flash attention): 8 unsharded
    + attention (2·256 + 4·256 + 2·256)/256 = 8, + MLP: dense 6·1024/256 = 24 (40 in all); MoE
    6·top_k·256/256 = 12, permuted inputs 2·top_k = 4, router 8·8/256 = 0.25 (32.25 in all).
    Full recompute keeps only the 2·sbh input."""
    system = load_system("h100-sxm", 4)
    sbh = 1 * 128 * 256
    P = _arrays([PP2])
    act = rank_memory(TINY, system, JobSpec(), P)["activations_per_microbatch"]
    assert _rank(P, act, 0) == pytest.approx(sbh * (2 * 40 + 2 * 32.25), rel=1e-12)
    assert _rank(P, act, 1) == pytest.approx(sbh * 4 * 32.25, rel=1e-12)
    Q = _arrays([PP2_VPP2])
    act = rank_memory(TINY, system, JobSpec(), Q)["activations_per_microbatch"]
    # rank 0: dense (recomputed) 2 + MoE recomputed 2 + MoE 32.25; rank 1: dense (recomputed) 2 +
    # MoE 32.25 + MoE recomputed 2 + 2 MoE 64.5
    assert _rank(Q, act, 0) == pytest.approx(sbh * (2 + 2 + 32.25), rel=1e-12)
    assert _rank(Q, act, 1) == pytest.approx(sbh * (2 + 32.25 + 2 + 64.5), rel=1e-12)


@pytest.mark.parametrize("plan", [PP2, PP2_VPP2], ids=["pp2", "pp2-vpp2"])
def test_rank_time_sums_each_layer_kind_at_its_own_cost(plan):
    """Rank time = its MoE layers at the all-MoE model's per-layer cost + its dense layers at the
    dense model's, recomputed ones again at their kind's recompute cost, + LM head on the last."""
    system = load_system("h100-sxm", 4)
    job = JobSpec()
    P = _arrays([plan])
    times = rank_microbatch_s(per_layer_terms(TINY, system, job, P), P)
    moe = per_layer_terms(ALL_MOE, system, job, _arrays([plan], ALL_MOE))
    dense = per_layer_terms(ALL_DENSE, system, job, _arrays([plan], ALL_DENSE))
    layout = plan.stage_layers or balanced_layout(8, plan.pp, plan.vpp)
    rec = plan.stage_recompute_layers or (0,) * len(layout)
    lead = stage_lead_layers(layout, 2)
    for r in range(plan.pp):
        stages = range(r, len(layout), plan.pp)
        n_d = sum(lead[s] for s in stages)
        n_m = sum(layout[s] for s in stages) - n_d
        k_d = sum(min(rec[s], lead[s]) for s in stages)
        k_m = sum(rec[s] for s in stages) - k_d
        want = (n_m * layer_microbatch_s(moe)[0] + n_d * layer_microbatch_s(dense)[0]
                + k_m * layer_recompute_s(moe)[0] + k_d * layer_recompute_s(dense)[0]
                + (moe["logit_fwd"][0] + moe["logit_bwd"][0] if r == plan.pp - 1 else 0.0))
        assert _rank(P, times, r) == pytest.approx(want, rel=1e-12)
    # the kinds really differ here (else the test could not tell averaging from per-kind costing)
    assert layer_microbatch_s(dense)[0] != pytest.approx(layer_microbatch_s(moe)[0], rel=1e-3)


@pytest.mark.parametrize("pp,vpp", [(2, 1), (4, 1), (4, 4), (8, 2), (8, 4), (16, 1), (16, 2)])
def test_default_split_representatives_equal_every_rank(pp, vpp):
    """The default split keeps only ranks 0..min(lead, pp−1) and the last; the same layout written
    out explicitly keeps every rank. Both must cost the same (DeepSeek-V3: 61 layers, 3 dense)."""
    model = load_model("deepseek-v3")
    system = load_system("h100-sxm", 1024)
    job = JobSpec(global_batch=1024, dtype="fp8")
    plan = Plan(tp=2, pp=pp, vpp=vpp, dp=1024 // (2 * pp), ep=64, etp=1, global_batch=1024 * 2 // 2,
                sequence_parallel=True, recompute="full", recompute_num_layers=2)
    layout = balanced_layout(model.layers, pp, vpp)
    a = estimate(model, system, plan, job)
    b = estimate(model, system, plan.model_copy(update={"stage_layers": layout}), job)
    assert a.step_time_s == pytest.approx(b.step_time_s, rel=1e-12)
    assert a.hbm_bytes == pytest.approx(b.hbm_bytes, rel=1e-12)
    assert a.hardware_flops == pytest.approx(b.hardware_flops, rel=1e-12)


@pytest.mark.parametrize("explicit", [False, True])
def test_one_recompute_count_reruns_each_chunks_first_layers_leading_dense_ones_first(explicit):
    """DeepSeek-V3 (3 leading dense layers) at pp 8 × vpp 2, k = 2 a stage: Megatron reruns the
    first layer of every chunk, so rank 0 reruns dense layer 0 (chunk 0 holds 0-3) and the first
    MoE layer of its chunk 8, not its first two layers (both dense). The same plan as the
    per-stage counts of 1, in time and memory, written with the default split or explicitly."""
    model = load_model("deepseek-v3")
    system = load_system("h100-sxm", 1024)
    job = JobSpec(global_batch=1024, dtype="fp8")
    base = Plan(tp=2, pp=8, vpp=2, dp=64, ep=64, etp=1, global_batch=1024, sequence_parallel=True,
                recompute="full", recompute_num_layers=2)
    layout = balanced_layout(model.layers, 8, 2)
    one = base.model_copy(update={"stage_layers": layout}) if explicit else base
    named = base.model_copy(update={"recompute_num_layers": None, "stage_layers": layout,
                                    "stage_recompute_layers": (1,) * len(layout)})
    a, b = estimate(model, system, one, job), estimate(model, system, named, job)
    assert a.step_time_s == pytest.approx(b.step_time_s, rel=1e-12)
    assert a.hbm_bytes == pytest.approx(b.hbm_bytes, rel=1e-12)
    assert a.hardware_flops == pytest.approx(b.hardware_flops, rel=1e-12)
    P = PlanArrays.from_plans([one], model.layers, 3)
    assert P.rank_lead_recompute[0][list(P.rank_index[0].astype(int)).index(0)] == 1


def test_dense_layers_wrapping_to_a_later_chunk():
    """5 leading dense layers over pp 2 × vpp 2 of 2-layer stages: stages 0, 1 hold 2 each and
    stage 2 (rank 0, chunk 1) the fifth; default and explicit agree."""
    model = ModelSpec(layers=8, hidden=256, heads=4, ffn=1024, seq_length=128, vocab=1000, activation="swiglu",
                      moe={"num_experts": 8, "top_k": 2, "expert_ffn": 256, "first_dense_layers": 5})
    P = PlanArrays.from_plans([Plan(pp=2, vpp=2, global_batch=4)], 8, 5)
    assert [_rank(P, P.rank_lead_layers, r) for r in (0, 1)] == [3, 2]
    system = load_system("h100-sxm", 2)
    plan = Plan(pp=2, vpp=2, global_batch=4)
    a = estimate(model, system, plan, JobSpec())
    b = estimate(model, system, plan.model_copy(update={"stage_layers": (2, 2, 2, 2)}), JobSpec())
    assert a.step_time_s == pytest.approx(b.step_time_s, rel=1e-12) and a.hbm_bytes == pytest.approx(b.hbm_bytes, rel=1e-12)


# ---- per-stage CP-SAT against the brute-force oracle, heterogeneous layers ---------------------

ORACLE_BASE = ModelSpec(layers=8, hidden=2048, heads=16, seq_length=4096, vocab=32000, activation="swiglu", ffn=8192,
                        moe={"num_experts": 16, "top_k": 2, "expert_ffn": 2048, "first_dense_layers": 2})


def _oracle_cases(dense: str = "leading"):
    """7 or 8 layers, pp·vpp <= 6, with and without full recompute, HBM roomy or squeezed to 97 %
    of the balanced split's need; the dense layers either 1 or 2 leading ones, or (interleaved)
    between MoE layers, every 2nd or 3rd layer MoE (Llama 4 Maverick's kind)."""
    cases = []
    for layers, kind, (pp, vpp), rc, squeeze in itertools.product(
            (7, 8), (1, 2) if dense == "leading" else (2, 3), ((2, 1), (3, 1), (2, 2), (3, 2)), ("none", "full"),
            (None, 0.97)):
        if squeeze and (layers == 7 or (dense != "leading" and kind == 3)):
            continue
        moe = {"first_dense_layers": kind} if dense == "leading" else {"first_dense_layers": 0, "layer_step": kind}
        model = ORACLE_BASE.model_copy(update={"layers": layers, "moe": ORACLE_BASE.moe.model_copy(update=moe)})
        tag = f"d{kind}" if dense == "leading" else f"s{kind}"
        cases.append(pytest.param(model, pp, vpp, rc, squeeze, id=f"l{layers}-{tag}-pp{pp}-v{vpp}-{rc}-{squeeze}"))
    return cases


@pytest.mark.parametrize("dense", ["leading", "interleaved"])
def test_enough_heterogeneous_oracle_cases(dense):
    assert len(_oracle_cases(dense)) >= 20


@pytest.mark.parametrize("model,pp,vpp,rc,squeeze", _oracle_cases())
def test_cpsat_per_stage_zero_regret_with_leading_dense_layers(model, pp, vpp, rc, squeeze):
    assert_per_stage_zero_regret(model, pp, vpp, rc, squeeze)


@pytest.mark.parametrize("model,pp,vpp,rc,squeeze", _oracle_cases("interleaved"))
def test_cpsat_per_stage_zero_regret_with_interleaved_dense_layers(model, pp, vpp, rc, squeeze):
    """Dense layers between MoE layers, posed as a two-kind block pattern (each stage's count of
    each from where its bounds fall): as fast as every split costed."""
    assert_per_stage_zero_regret(model, pp, vpp, rc, squeeze)


@pytest.mark.parametrize("lead,pp,rc,squeeze", [
    pytest.param(lead, pp, rc, squeeze, id=f"d{lead}-pp{pp}-{rc}-{squeeze}")
    for lead, pp, rc, squeeze in itertools.product((0, 2), (2, 3), ("none", "selective"), (None, 0.97))
    if not (rc == "selective" and squeeze is None)])
def test_cpsat_per_stage_zero_regret_with_the_all_to_all_overlap(lead, pp, rc, squeeze):
    """Megatron's all-to-all overlap (interleaved, ep 2) holds one more layer's activations per
    rank (memory.in_flight_microbatches), a constant per rank: probed as a per-layer cost it
    charged every layer again, so the solver found no split where the balanced one fits
    (DeepSeek-V3 on 1024 H100: every reported plan 'INFEASIBLE')."""
    model = ORACLE_BASE.model_copy(update={"moe": ORACLE_BASE.moe.model_copy(update={"first_dense_layers": lead})})
    assert_per_stage_zero_regret(model, pp, 2, rc, squeeze, ep=2, a2a_overlap=True)


# ---- the layouts Megatron-Bridge's recipes set, read for the reference rows --------------------

def _bridge_list_layout(stages: list[list[str]]) -> tuple[int, ...]:
    """Decoder layers per stage of a layout in the list form the Bridge source writes."""
    return tuple(stage.count("decoder") for stage in stages)


def test_deepseek_v3_recipe_layouts_match_the_bridge_helper():
    """The layout strings reproduce `_get_deepseek_v3_pipeline_layout`'s list-form map
    (Megatron-Bridge@067f987df03b recipes/deepseek/h100/deepseek_v3.py), transcribed here in that
    form, and the H100 perf recipe's pp8 vpp4 string "Et|(tt|)*30mL"."""
    from planner.reference import bridge_recipe_layout
    last = ["mtp", "loss"]
    helper = {
        (4, 1): [["embedding"] + ["decoder"] * 16, ["decoder"] * 16, ["decoder"] * 16, ["decoder"] * 13 + last],
        (8, 1): [["embedding"] + ["decoder"] * 8] + [["decoder"] * 8] * 6 + [["decoder"] * 5 + last],
        (4, 2): [["embedding"] + ["decoder"] * 8] + [["decoder"] * 8] * 6 + [["decoder"] * 5 + last],
        (16, 1): [["embedding"] + ["decoder"] * 4] + [["decoder"] * 4] * 14 + [["decoder"] + last],
        (8, 2): [["embedding"] + ["decoder"] * 4] + [["decoder"] * 4] * 14 + [["decoder"] + last],
        (4, 4): [["embedding"] + ["decoder"] * 4] + [["decoder"] * 4] * 14 + [["decoder"] + last],
    }
    for (pp, vpp), stages in helper.items():
        layout, where = bridge_recipe_layout("DeepSeekV3 (w/ MTP)", 61, pp, vpp)
        assert layout == _bridge_list_layout(stages) and "_get_deepseek_v3_pipeline_layout" in where
    layout, where = bridge_recipe_layout("DeepSeekV3", 61, 8, 4)
    assert layout == (1,) + (2,) * 30 + (0,) and "perf_recipes/deepseek/h100" in where
    assert bridge_recipe_layout("DeepSeekV3", 61, 2, 1) is None  # the helper has none: balanced stays
    assert bridge_recipe_layout("Llama3 70B", 80, 4, 1) is None


def test_qwen3_235b_recipe_layout_is_megatrons_account_for_embedding_and_loss():
    """94 layers + embedding + loss = 96 = pp·vpp·(96/(pp·vpp)); the first stage one fewer (the
    embedding), the last one fewer (the loss): Megatron's rule, by hand."""
    from planner.reference import bridge_recipe_layout
    assert bridge_recipe_layout("Qwen3_235B_a22B", 94, 8, 4)[0] == (2,) + (3,) * 30 + (2,)
    assert bridge_recipe_layout("Qwen3_235B_a22B (tokendrop)", 94, 8, 3)[0] == (3,) + (4,) * 22 + (3,)
    assert bridge_recipe_layout("Qwen3_235B_a22B", 94, 8, 1)[0] == (11,) + (12,) * 6 + (11,)
    assert bridge_recipe_layout("Qwen3_235B_a22B", 94, 8, 5) is None  # 96 is not a multiple of 40


def test_bridge_moe_rows_run_the_recipes_layouts():
    """Every DeepSeek-V3 / Qwen3-235B Bridge row with a pipeline runs the recipe's layout and cites
    the source (its own release's Bridge tag and commit, or the @067f987 rules where that release's
    recipe set another layout than the record ran); none is left with the balanced-split assumption."""
    from planner.reference import REFERENCE_DIR, bridge_recipe_layout, load_reference
    cases, _ = load_reference(REFERENCE_DIR / "bridge_runs.yaml")
    moe = [c for c in cases if c.model.moe and c.plan.pp > 1]
    assert len(moe) >= 30
    dsv3 = 0
    for c in moe:
        layout, where = bridge_recipe_layout(c.model.name, c.model.layers, c.plan.pp, c.plan.vpp, c.id)
        assert tuple(c.plan.stage_layers) == layout, c.id
        assert any(f"({where})" in a for a in c.assumptions), c.id
        assert re.search(r"^Megatron-Bridge (v0\.\d\.\d\S* [0-9a-f]{12}:|not v0.* @067f987df03b )", where), where
        assert not any("balanced split" in a for a in c.assumptions), c.id
        dsv3 += c.model.layers == 61
    assert dsv3 >= 15


def test_pipeline_ranks_report_composition(tmp_path):
    """`pipeline_ranks` gives every rank its layers by kind and the same microbatch time as the
    model; `planner estimate` prints them when ranks differ."""
    from typer.testing import CliRunner

    from planner.analytical.ranks import pipeline_ranks
    from planner.cli import app
    system = load_system("h100-sxm", 4)
    rows = pipeline_ranks(TINY, system, JobSpec(), PP2_VPP2)
    assert [(r.layers, r.lead_layers, r.recomputed) for r in rows] == [(3, 1, 2), (5, 1, 2)]
    P = _arrays([PP2_VPP2])
    times = rank_microbatch_s(per_layer_terms(TINY, system, JobSpec(), P), P)
    assert [r.microbatch_s for r in rows] == [_rank(P, times, 0), _rank(P, times, 1)]
    assert rows[0].describe(TINY, 2) == "1 dense + 2 MoE + embedding"
    assert rows[1].describe(TINY, 2) == "1 dense + 4 MoE + LM head"
    import yaml
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(TINY.model_dump(exclude_none=True)))
    out = CliRunner().invoke(app, ["estimate", "-m", str(path), "-s", "h100-sxm", "-g", "4", "--tp", "1", "--pp", "2",
                                   "--ep", "2", "--etp", "1", "-b", "8", "--recompute", "none"], env={"COLUMNS": "200"})
    assert out.exit_code in (0, 1), out.output
    assert "2 dense + 2 MoE + embedding" in out.output and "4 MoE + LM head" in out.output


def test_mtp_module_memory_on_the_last_rank_hand_derived():
    """One MTP module (DeepSeek-V3 §2.2) on the last rank: a MoE layer (non-expert 264,704, experts
    1,572,864 over ep 2) + the 2h→h projection 2·256² = 131,072 + 3 norms of 256, + the MTP
    stage's own word embedding (V·h, gpt_model.py: built where pre_process or mtp_process); its
    layer's activations (32.25 sbh) and the 2h-wide projection input (4 sbh). Rank 0 is unchanged."""
    mtp = TINY.model_copy(update={"mtp_layers": 1})
    system = load_system("h100-sxm", 4)
    P = _arrays([PP2], mtp)
    mem = rank_memory(mtp, system, JobSpec(), P)
    base = rank_memory(TINY, system, JobSpec(), P)
    assert _rank(P, mem["params_elems"], 1) == 4 * MOE_NON_EXPERT + 4 * EXPERTS / 2 + VOCAB \
        + MOE_NON_EXPERT + 131_072 + 768 + EXPERTS / 2 + VOCAB
    assert _rank(P, mem["params_elems"], 0) == _rank(P, base["params_elems"], 0)
    sbh = 128 * 256
    assert _rank(P, mem["activations_per_microbatch"], 1) == pytest.approx(sbh * (4 * 32.25 + 32.25 + 4), rel=1e-12)
    assert _rank(P, mem["activations_per_microbatch"], 0) == _rank(P, base["activations_per_microbatch"], 0)


def test_cpsat_loads_the_dense_rank_and_unloads_the_mtp_rank_on_deepseek_v3():
    """DeepSeek-V3 at tp2 pp16 ep64: rank 0's 3 dense layers are cheap and the last rank runs MTP +
    LM head, so the per-stage optimum puts more layers on rank 0 and fewer on the last rank than
    the middle ranks hold (NVIDIA's recipe: 4 × 15, 1), and beats the balanced split."""
    model, system = load_model("deepseek-v3"), load_system("h100-sxm", 1024)
    job = JobSpec(global_batch=8192, max_global_batch=8192, dtype="fp8")
    plan = Plan(tp=2, pp=16, dp=32, ep=64, etp=1, global_batch=8192, sequence_parallel=True)
    chosen, sol = best_stages(model, system, job, plan)
    assert sol.proven_optimal
    layout = chosen.stage_layers
    assert layout[0] >= max(layout[1:-1]) > layout[-1]
    assert estimate(model, system, chosen, job).step_time_s < estimate(model, system, plan, job).step_time_s


def test_megatron_layout_string_names_the_mtp_module():
    """Megatron (pipeline_parallel_layer_layout.py validate_layer_layout) asserts that the layout
    string holds as many 'm' as --mtp-num-layers: DeepSeek-V3's emitted layout ends in 'mL'."""
    from planner.megatron.emit import megatron_args
    model, system = load_model("deepseek-v3"), load_system("h100-sxm", 1024)
    layout = (5, 4, 3) + (4,) * 12 + (1,)  # no first/last flag expresses it: a layout string
    plan = Plan(tp=2, pp=16, dp=32, ep=64, etp=1, global_batch=8192, sequence_parallel=True, stage_layers=layout)
    args = dict(megatron_args(plan, model, JobSpec(global_batch=8192, max_global_batch=8192, dtype="fp8"), system).args)
    assert args["--mtp-num-layers"] == "1"
    text = args["--pipeline-model-parallel-layout"]
    assert text.count("m") == 1 and text.endswith("mL") and layout_from_string(text) == layout


def test_solved_split_is_spread_evenly_over_each_ranks_chunks_at_the_same_cost():
    """Without recompute the solver is indifferent to how a rank's layers sit in its chunks; the
    split it returns spreads them (Kimi-K2's pp 2 · vpp 8 came back as 1,4,25,4,1,...), keeping
    each rank's total and the stage that holds the leading dense layer, at the same step time."""
    from constraints.stages import _spread_over_chunks
    solved = (1, 4, 25, 4, 1, 4, 1, 4, 1, 4, 1, 3, 1, 3, 1, 3)
    spread = _spread_over_chunks(solved, 2, 8, 1)
    assert [sum(spread[r::2]) for r in range(2)] == [sum(solved[r::2]) for r in range(2)] == [32, 29]
    assert spread[0] == 1  # the dense layer's stage
    for r in range(2):
        free = spread[r::2][1:] if r == 0 else spread[r::2]
        assert max(free) - min(free) <= 1
    model, system = load_model("deepseek-v3"), load_system("h100-sxm", 256)  # 3 leading dense layers
    job = JobSpec(global_batch=1024)
    base = dict(pp=2, vpp=8, dp=128, ep=8, micro_batch=1, global_batch=1024)
    odd = (1, 4, 25, 4, 1, 4, 1, 4, 1, 4, 1, 3, 1, 3, 1, 4)  # 61 layers
    even = _spread_over_chunks(odd, 2, 8, 3)
    assert even[:2] == odd[:2] and even != odd
    times = [estimate(model, system, Plan(**base, stage_layers=s), job).step_time_s for s in (odd, even)]
    assert times[0] == pytest.approx(times[1], rel=1e-12)


def test_estimate_names_a_pipeline_rank_that_sets_the_pace():
    """The imbalance note fires from the ranks' own microbatch times: on the hand-made rows below
    the slowest rank takes 2.0 / 1.0 of the median; a balanced split stays silent."""
    from types import SimpleNamespace

    from planner.report import IMBALANCE_NOTE_RATIO, pipeline_imbalance_note
    plan = Plan(tp=1, pp=4, dp=1, micro_batch=1)
    rows = [SimpleNamespace(microbatch_s=t) for t in (1.0, 1.0, 1.0, 2.0)]
    note = pipeline_imbalance_note(rows, plan)
    assert note is not None and "rank 3 takes 2.00x" in note and "--pp 4" in note
    even = [SimpleNamespace(microbatch_s=t) for t in (1.0, 1.1, 1.0, IMBALANCE_NOTE_RATIO * 0.99)]
    assert pipeline_imbalance_note(even, plan) is None


def test_the_stage_problem_charges_the_overlaps_paired_layer_once_per_rank():
    """With the all-to-all overlap each rank's memory is its layers' at its in-flight count plus
    one layer (memory.in_flight_microbatches); the stage problem's linear memory c_r + w_r·N_r at
    the balanced split equals the exact model's per-rank HBM to its rounding (one memory unit
    per coefficient), on a MoE model without leading dense layers, where every layer is alike."""
    from constraints.stages import MEMORY_STEPS, stage_problem
    from planner.analytical.ranks import pipeline_ranks
    model = ORACLE_BASE.model_copy(update={"layers": 16, "moe": ORACLE_BASE.moe.model_copy(
        update={"first_dense_layers": 0})})
    system, job = load_system("h100-sxm", 8), JobSpec()
    plan = Plan(pp=4, vpp=2, dp=2, ep=2, global_batch=64, moe_a2a_overlap=True)
    problem = stage_problem(model, system, job, plan)
    unit = (system.accelerator.hbm_capacity_bytes - job.hbm_reserve_gib * 2**30) / MEMORY_STEPS  # usable HBM
    for rank in pipeline_ranks(model, system, job, plan):
        linear = (problem.c[rank.rank] + problem.w[rank.rank] * rank.layers) * unit
        assert linear == pytest.approx(rank.hbm_bytes, abs=(1 + rank.layers) * unit)
