"""What Megatron runs for GPT-OSS beyond a plain SwiGLU/RoPE transformer: the unfused YaRN RoPE,
the eager clamp in front of the experts' fused activation and the experts' eager FC2 bias
(planner/analytical/kernels.py UNFUSED_ROPE_BYTES, CLAMP_GLU_BYTES, EXPERT_FC2_BIAS_BYTES), each
against a hand-derived time."""
import numpy as np
import pytest

from hardware import load_system
from planner.analytical import PlanArrays
from planner.analytical import kernels as K
from planner.analytical.time import layer_compute_fwd_s, moe_mlp_fwd_s, per_layer_terms
from planner.model import load_model
from planner.plan import JobSpec, Plan
from planner.reference import load_reference

GPT_OSS = load_model("gpt-oss-120b")
PLAIN = GPT_OSS.model_copy(update={"rope_scaling": "none", "activation_clamp": None, "biases": False})
H100 = load_system("h100-sxm", 8)
# H100 SXM HBM3 3350 GB/s (datasheet), each eager kernel streaming at 0.70 of it
STREAM_BYTES_PER_S = 3350e9 * 0.70


def _plan(**kw):
    # ep 1: every expert on every GPU, so the busiest rank gets exactly the mean (no sampling spread)
    return PlanArrays.from_plans([Plan(dp=8, micro_batch=1, global_batch=8, **kw)], GPT_OSS.layers)


def test_preset_and_config_name_the_yarn_rope_and_the_clamp():
    assert (GPT_OSS.rope_scaling, GPT_OSS.activation_clamp) == ("yarn", 7.0)
    hf = load_model("tests/fixtures/hf/gpt-oss-120b")
    assert (hf.rope_scaling, hf.activation_clamp) == ("yarn", 7.0)
    # DeepSeek-V3's config also says yarn, but for MLA's decoupled RoPE, which is not costed apart
    assert load_model("tests/fixtures/hf/deepseek-v3").rope_scaling == "none"


def test_unfused_rope_time_against_hand_number():
    """One layer forward, one 4096-token sequence, tp 1: every q and k element (64 heads + 8 KV
    groups, 64 wide: 4608 per token) moves 24 B unfused instead of the fused 4 B in TE's lump:
    4096 x 4608 x 20 B = 377,487,360 B at 2345 GB/s = 160.97 us, only in the element-wise part."""
    assert K.UNFUSED_ROPE_BYTES - K.FUSED_ROPE_BYTES == 20.0
    # a full-iteration CUDA graph: no host issue time for the extra GPU time to hide behind
    P, job = _plan(), JobSpec(global_batch=8, full_iteration_cuda_graph=True)
    no_yarn = GPT_OSS.model_copy(update={"rope_scaling": "none"})
    yarn, plain = layer_compute_fwd_s(GPT_OSS, H100, job, P), layer_compute_fwd_s(no_yarn, H100, job, P)
    expected_s = 377_487_360 / STREAM_BYTES_PER_S
    assert expected_s == pytest.approx(160.97e-6, rel=1e-4)
    assert float(yarn["elementwise"][0] - plain["elementwise"][0]) == pytest.approx(expected_s, rel=1e-9)
    assert float(yarn["gemm"][0]) == float(plain["gemm"][0])
    assert float(yarn["attention"][0]) == float(plain["attention"][0])
    # tensor parallelism splits the heads: half the bytes per GPU at tp 2
    P2 = PlanArrays.from_plans([Plan(tp=2, dp=4, micro_batch=1, global_batch=8)], GPT_OSS.layers)
    tp2 = layer_compute_fwd_s(GPT_OSS, H100, job, P2)["elementwise"] - layer_compute_fwd_s(no_yarn, H100, job, P2)["elementwise"]
    assert float(tp2[0]) == pytest.approx(expected_s / 2, rel=1e-9)
    assert K.unfused_rope_extra_bytes_per_token(GPT_OSS, "te") == 20.0 * 4608
    assert K.unfused_rope_extra_bytes_per_token(GPT_OSS, "torch-compile") == 0.0


def test_clamp_time_against_hand_number():
    """Routed experts, one sequence of 4096 tokens, top-4, expert FFN 2880: 16,384 rows x 2880
    elements x 16 B (clamp of each half 2+2, torch.cat 4+4) = 754,974,720 B at 2345 GB/s =
    321.95 us of forward activation time; recompute of moe_act reruns exactly that much more."""
    P, job = _plan(), JobSpec(global_batch=8)
    no_clamp = GPT_OSS.model_copy(update={"activation_clamp": None})
    clamped, plain = moe_mlp_fwd_s(GPT_OSS, H100, job, P), moe_mlp_fwd_s(no_clamp, H100, job, P)
    expected_s = 754_974_720 / STREAM_BYTES_PER_S
    assert expected_s == pytest.approx(321.95e-6, rel=1e-4)
    assert float(clamped["expert_act_s"][0] - plain["expert_act_s"][0]) == pytest.approx(expected_s, rel=1e-9)
    assert float(clamped["expert_gemm_s"][0]) == float(plain["expert_gemm_s"][0])
    # selective recompute of moe_act reruns the clamp with the activation
    Pr = _plan(recompute="selective", recompute_modules=("moe_act",))
    rerun = per_layer_terms(GPT_OSS, H100, job, Pr)["selective"] - per_layer_terms(no_clamp, H100, job, Pr)["selective"]
    assert float(rerun[0]) == pytest.approx(expected_s, rel=1e-9)


def test_expert_fc2_bias_time_against_hand_number():
    """Megatron adds the routed experts' FC2 bias eagerly (experts.py _apply_bias): 16,384 rows x
    hidden 2880 x 12 B (b*p written 2, the add 2+2+2, torch.cat 2+2) = 566,231,040 B at 2345 GB/s
    = 241.46 us per layer forward, outside the moe_act checkpoint (not rerun by it)."""
    P, job = _plan(), JobSpec(global_batch=8, full_iteration_cuda_graph=True)
    biased = moe_mlp_fwd_s(GPT_OSS, H100, job, P)
    no_bias = moe_mlp_fwd_s(GPT_OSS.model_copy(update={"biases": False}), H100, job, P)
    expected_s = 566_231_040 / STREAM_BYTES_PER_S
    assert expected_s == pytest.approx(241.46e-6, rel=1e-4)
    assert float(biased["expert_bias_s"][0]) == pytest.approx(expected_s, rel=1e-9)
    assert float(biased["elementwise"][0] - no_bias["elementwise"][0]) == pytest.approx(expected_s, rel=1e-9)
    assert np.array_equal(biased["expert_act_s"], no_bias["expert_act_s"])
    Pr = _plan(recompute="selective", recompute_modules=("moe_act",))
    terms = (per_layer_terms(GPT_OSS, H100, job, Pr), per_layer_terms(GPT_OSS.model_copy(update={"biases": False}),
                                                                      H100, job, Pr))
    assert float(terms[0]["selective"][0]) == pytest.approx(float(terms[1]["selective"][0]), rel=1e-12)


def test_fused_grouped_mlp_and_torch_stacks_pay_no_clamp():
    """TE's fused grouped MLP clamps inside its kernel (ScaledClampedQGeGLU(limit=...)); the
    Megatron clamp passes do not exist under the torch stacks either."""
    P = _plan()
    for job in (JobSpec(global_batch=8, fused_grouped_mlp=True), JobSpec(global_batch=8, kernels="torch-compile")):
        a, b = moe_mlp_fwd_s(GPT_OSS, H100, job, P), moe_mlp_fwd_s(PLAIN, H100, job, P)
        assert np.array_equal(a["expert_act_s"], b["expert_act_s"])
        assert float(a["expert_bias_s"][0]) == 0.0


def test_heldout_record_carries_the_fields_and_a_bad_one_is_refused(tmp_path):
    """bench/heldout_bridge.py writes the preset's rope_scaling / activation_clamp into the
    record's model block; the reference loader reads them, and refuses a non-number in one line."""
    import csv
    import sys
    from pathlib import Path

    import yaml

    from hardware.errors import SpecError
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    import heldout_bridge
    row = next(r for r in csv.DictReader(heldout_bridge.DATA.open())
               if r["release"] == "26.04" and r["model"] == "GPT OSS 120B" and r["system"] == "DGX-H100")
    rec = heldout_bridge.record(row)
    assert (rec["model"]["rope_scaling"], rec["model"]["activation_clamp"], rec["model"]["biases"]) == ("yarn", 7.0, True)
    path = tmp_path / "r.yaml"
    heldout_bridge.write_yaml(path, [rec])
    (case,), _ = load_reference([path])
    assert (case.model.rope_scaling, case.model.activation_clamp, case.model.biases) == ("yarn", 7.0, True)
    rec["model"]["biases"] = "yes"
    path.write_text(yaml.safe_dump({"schema_version": 1, "records": [rec]}))
    with pytest.raises(SpecError, match="model.biases"):
        load_reference([path])
    rec["model"]["biases"] = True
    rec["model"]["activation_clamp"] = "seven"
    path.write_text(yaml.safe_dump({"schema_version": 1, "records": [rec]}))
    with pytest.raises(SpecError, match="model.activation_clamp"):
        load_reference([path])


def test_empty_recompute_module_list_recomputes_nothing(tmp_path):
    """The 26.06 GB200 MXFP8 GPT-OSS recipe sets selective recompute with recompute_modules []
    (planner/data/bridge_recipe_knobs_heldout.yaml): Megatron-Core fills in core_attn only for
    None (transformer_config.py __post_init__), so nothing is recomputed; the H100 recipe's
    [layernorm, moe_act] stays what it says."""
    import csv
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    import heldout_bridge
    rows = [r for r in csv.DictReader(heldout_bridge.DATA.open()) if r["model"] == "GPT OSS 120B"
            and (r["release"], r["system"], r["precision"]) in (("26.06", "DGX-GB200", "MXFP8"),
                                                                ("26.04", "DGX-H100", "BF16"))]
    path = tmp_path / "r.yaml"
    heldout_bridge.write_yaml(path, [heldout_bridge.record(r) for r in rows])
    cases, _ = load_reference([path])
    (gb200,) = [c for c in cases if "GB200" in c.id]
    assert gb200.plan.recompute == "none" and gb200.plan.recompute_modules is None
    assert any("no recompute: selective with no module" in a for a in gb200.assumptions)
    (h100,) = [c for c in cases if "H100" in c.id]
    assert h100.plan.recompute == "selective" and h100.plan.recompute_modules == ("layernorm", "moe_act")
