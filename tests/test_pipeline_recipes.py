"""Issue 8, "Done when": NVIDIA's published recipe layouts (../shared/reference/bridge_runs.yaml)
are inside the space: their uneven layouts break no layout rule, and `planner plan` for a dense
recipe returns a plan predicted no slower than the recipe itself. MoE recipes use Megatron's
expert parallel folding (ep may exceed dp·cp; expert tensor parallel 1 where tp·ep·pp exceeds
the GPUs, as the recipes run)."""
from __future__ import annotations

from pathlib import Path

import pytest

from hardware import load_system
from planner.analytical import estimate
from planner.model import load_model
from planner.plan import JobSpec, Plan
from planner.search import plan as search
from tests.conftest import reference_yaml

REFERENCE = Path(__file__).resolve().parents[1].parent / "shared" / "reference" / "bridge_runs.yaml"
MODELS = {"LLAMA3.1_405B": "llama3.1-405b", "Qwen3_235B_a22B": "qwen3-235b-a22b", "DeepSeekV3": "deepseek-v3"}
SYSTEMS = {"H100-SXM5-80GB": "h100-sxm", "B200": "b200"}


def _recipes():
    if not REFERENCE.is_file():
        pytest.skip(f"{REFERENCE} not found")
    out = {}
    for r in reference_yaml(REFERENCE)["records"]:
        name = r["model"]["name"].split(" ")[0]
        p, system = r["parallel"], SYSTEMS.get(r["system"]["gpu"])
        if name not in MODELS or system is None:
            continue
        vpp = p["vpp"] or 1
        if r["model"]["layers"] % (p["pp"] * vpp) == 0:
            continue  # even layouts were inside the space before issue 8
        key = (name, system, r["system"]["gpus"], p["tp"], p["pp"], p["cp"], p["ep"] or 1, vpp,
               p["microbatch"], p["global_batch"])
        out[key] = r["id"]
    return out


def test_every_uneven_recipe_layout_breaks_no_layout_rule():
    recipes = _recipes()
    assert len(recipes) >= 10  # 405B, Qwen3-235B and DeepSeek-V3 recipes on H100 / B200
    for (name, system, gpus, tp, pp, cp, ep, vpp, mb, gb), rid in recipes.items():
        model = load_model(MODELS[name])
        dp = gpus // (tp * pp * cp)
        etp = (tp if gpus % (tp * ep * pp) == 0 else 1) if model.moe else None
        plan = Plan(tp=tp, pp=pp, cp=cp, dp=dp, ep=ep, etp=etp, vpp=vpp,
                    micro_batch=mb, global_batch=gb, sequence_parallel=tp > 1)
        est = estimate(model, load_system(system, gpus), plan, JobSpec(global_batch=gb, max_global_batch=max(gb, 3072)))
        assert "layers_pp" not in est.violations, rid
        assert "vpp_needs_pp" not in est.violations, rid
        assert set(est.violations) <= {"hbm"}, (rid, est.violations)


def test_plan_is_no_slower_than_the_405b_h100_recipe():
    """bridge_26.06_LLAMA3.1_405B_DGX-H100_FP8_1024gpu_gbs1536: tp8 pp8 cp2 vpp8 (126 layers:
    Megatron's account-for-embedding-and-loss split)."""
    model, system = load_model("llama3.1-405b"), load_system("h100-sxm", 1024)
    job = JobSpec(global_batch=1536, dtype="fp8")
    recipe = Plan(tp=8, pp=8, cp=2, dp=8, vpp=8, micro_batch=1, global_batch=1536, sequence_parallel=True)
    rec = estimate(model, system, recipe, job)
    assert rec.violations == [] or rec.violations == ["hbm"]
    best = search(model, system, job, top_k=1).best
    assert best is not None and best.estimate.step_time_s <= rec.step_time_s * (1 + 1e-9)
