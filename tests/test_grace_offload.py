"""Issue 9: CPU activation offload to the Grace memory of GB200 / GB300 NVL72.

The tier numbers are checked against the datasheet arithmetic, the offload schedule against a
step-by-step simulation of Transformer Engine's default schedule, one estimate's offload time
against the hand formula, the Bridge Llama-3 70B / 405B rows against their recipes'
--cpu-offloading-num-layers, and the emitted Megatron flag against the plan."""
from __future__ import annotations

import random

import numpy as np
import pytest

from hardware import load_system
from planner import megatron as mg
from planner.analytical.estimate import estimate
from planner.analytical.offload import activation_offload_exposed_s, schedule_exposed_s
from planner.megatron.expressible import cpu_offload_layers
from planner.model import load_model
from planner.plan import JobSpec, Plan

GIB = 2**30


def test_gb200_grace_tier_is_half_a_superchip():
    """NVIDIA GB200 NVL72 spec: per GB200 superchip (one Grace, two B200) up to 480 GB LPDDR5X at
    up to 512 GB/s, one NVLink-C2C of 900 GB/s bidirectional. Per GPU: 240 GB; per direction the
    smaller of 900/2/2 = 225 GB/s (link) and 512/2 = 256 GB/s (memory)."""
    tier = load_system("gb200-nvl72", 72).offload
    assert tier.capacity_gib == pytest.approx(480e9 / 2 / GIB, abs=0.05)
    assert tier.bandwidth_gb_per_s == min(900 / 2 / 2, 512 / 2) == 225


def test_gb300_grace_tier_is_limited_by_lpddr5x():
    """NVIDIA GB300 NVL72 spec: 36 Graces with 17 TB LPDDR5X at 14 TB/s in all (480 GB and
    389 GB/s each), NVLink-C2C 900 GB/s per superchip. Per GPU: 240 GB; per direction
    min(225, 389/2) = 194 GB/s: the memory, not the link, limits."""
    tier = load_system("gb300-nvl72", 72).offload
    assert tier.capacity_gib == pytest.approx(480e9 / 2 / GIB, abs=0.05)
    assert 17e12 / 36 == pytest.approx(480e9, rel=0.02)
    assert tier.bandwidth_gb_per_s == pytest.approx(min(900 / 2 / 2, 14000 / 36 / 2), abs=0.5)


def _simulate_te_forward(L: int, N: int, copy_s: float, layer_s: float) -> float:
    """Seconds TE's default schedule adds to a forward of L layers, event by event: layer i < N
    starts its copy (one stream, in order) when its forward ends; layer L - N + i may not start
    before that copy has finished (OffloadSynchronizer._default_offload_sync_init)."""
    t, stream_free, copy_done = 0.0, 0.0, {}
    for j in range(L):
        for i in range(N):
            if L - N + i == j:
                t = max(t, copy_done[i])
        t += layer_s  # layer j's forward
        if j < N:
            start = max(t, stream_free)
            copy_done[j] = stream_free = start + copy_s
    return t - L * layer_s


def _simulate_te_backward(L: int, N: int, copy_s: float, layer_s: float) -> float:
    """The same for the backward (layers L-1 .. 0): layer i < N's reload starts (in order on the
    stream) when layer L - 1 - N + i starts its backward; layer i's backward waits for it."""
    t, stream_free, reload_done = 0.0, 0.0, {}
    for j in range(L - 1, -1, -1):
        for i in range(N - 1, -1, -1):
            if L - 1 - N + i == j:
                start = max(t, stream_free)
                reload_done[i] = stream_free = start + copy_s
        if j < N:
            t = max(t, reload_done[j])
        t += layer_s
    return t - L * layer_s


def test_schedule_hand_case():
    """L = 4 layers, N = 2 offloaded, copy 3 s, layer 1 s: layer 0's copy ends at 1 + 3 = 4 and
    layer 1's at 7; layer 2 (deadline of copy 0) may start at 4 instead of 2, layer 3 (copy 1) at
    7 instead of 4 + 1 = 5: the forward ends at 8 instead of 4, 4 s exposed = N·t_x − (L − 2)·t_c."""
    n, L = np.array([2.0]), np.array([4.0])
    assert schedule_exposed_s(n, L, np.array([3.0]), np.array([1.0]))[0] == pytest.approx(4.0)
    assert _simulate_te_forward(4, 2, 3.0, 1.0) == pytest.approx(4.0)
    assert schedule_exposed_s(n, L, np.array([0.5]), np.array([1.0]))[0] == 0.0  # link faster: hidden


def test_schedule_matches_simulation():
    """The closed form equals the event simulation of both passes on random uniform cases."""
    rng = random.Random(9)
    for _ in range(300):
        L = rng.randint(2, 40)
        N = rng.randint(1, L - 1)
        copy_s, layer_s = rng.uniform(0.01, 3.0), rng.uniform(0.01, 3.0)
        formula = schedule_exposed_s(np.array([float(N)]), np.array([float(L)]), np.array([copy_s]),
                                     np.array([layer_s]))[0]
        assert formula == pytest.approx(_simulate_te_forward(L, N, copy_s, layer_s), abs=1e-9)
        assert formula == pytest.approx(_simulate_te_backward(L, N, copy_s, layer_s), abs=1e-9)


def test_estimate_offload_time_by_hand():
    """Llama-3 70B on 8 GB200 at tp 1, micro-batch 4, 76 of 80 layers offloaded (0.95): the
    estimate's exposed offload time is m × (forward + backward exposure) from its own per-layer
    forward, backward and activation bytes at 225 GB/s, and positive: a layer's copy (~35 ms,
    FP8 GEMM inputs kept in 8 bits) outlasts its forward (~31 ms), so 76 queued copies overrun
    the 78-layer window. With all layers (79 in Megatron) every copy is exposed, both ways."""
    # a 128-token vocabulary: the LM head's time (not an offload window) vanishes from forward_s
    model = load_model("llama3-70b").model_copy(update={"vocab": 128})
    system = load_system("gb200-nvl72", 8)
    job = JobSpec(global_batch=64, dtype="fp8")
    plan = Plan(dp=8, micro_batch=4, global_batch=64, zero_stage=3, offload_activations=0.95)
    e = estimate(model, system, plan, job)
    m = 64 / (4 * 8)
    L, N = 80, 76
    act_layer = (e.memory_breakdown_bytes["activations_bytes"] + e.offload_breakdown_bytes["offload_activations_bytes"]) / L
    copy = act_layer / 225e9
    fwd, bwd = e.time_breakdown_s["forward_s"] / m / L, e.time_breakdown_s["backward_s"] / m / L
    by_hand = m * sum(max(0.0, N * copy - (L - 2) * c, copy - (L - N - 1) * c) for c in (fwd, bwd))
    assert by_hand > 0
    assert e.time_breakdown_s["offload_exposed_s"] == pytest.approx(by_hand, rel=1e-3)  # the 128-word LM head is left
    every = estimate(model, system, plan.model_copy(update={"offload_activations": 1.0}), job)
    act_layer = (every.memory_breakdown_bytes["activations_bytes"]
                 + every.offload_breakdown_bytes["offload_activations_bytes"]) / L
    assert every.time_breakdown_s["offload_exposed_s"] == pytest.approx(m * 2 * 79 * act_layer / 225e9, rel=1e-9)
    assert activation_offload_exposed_s(np.array([0.0]), np.array([80.0]), np.array([1e12]), 1e9,
                                        np.array([1.0]), np.array([2.0]))[0] == 0.0


@pytest.fixture(scope="module")
def bridge_llama_offload_cases():
    from planner.reference import load_reference
    cases, _ = load_reference()
    return {c.id: c for c in cases if c.id.startswith("bridge_") and "GB200" in c.id
            and any("CPU offload of" in a for a in c.assumptions)}


def test_bridge_rows_offload_what_their_recipe_sets(bridge_llama_offload_cases):
    """The recipes' --cpu-offloading-num-layers (bridge_recipe_knobs.yaml): 40 of Llama-3 70B's
    80 layers, 95 of Llama-3.1 405B's 126 (25.09, 128 GPUs); pp 1 and no recompute, as Megatron
    requires; the 405B row fits its HBM only with the offload."""
    cases = bridge_llama_offload_cases
    assert len(cases) == 7
    for rid, c in cases.items():
        n = 95 if "405B" in rid else 40
        assert c.plan.offload_activations == pytest.approx(n / c.model.layers)
        assert (c.plan.pp, c.plan.recompute) == (1, "none")
        assert cpu_offload_layers(c.plan, c.model) == n
    big = cases["bridge_25.09_LLAMA3.1_405B_DGX-GB200_na_128gpu_gbs64"]
    with_offload = estimate(big.model, big.system, big.plan, big.job)
    without = estimate(big.model, big.system, big.plan.model_copy(update={"offload_activations": 0.0}), big.job)
    assert "hbm" not in with_offload.violations and "hbm" in without.violations


def test_megatron_emits_the_recipes_offload_flag():
    """The Bridge 70B GB200 layout with half the layers offloaded launches with
    --cpu-offloading-num-layers 40 (Megatron-Core 0.19: N < num_layers, pp 1, no recompute);
    all layers offloaded runs as 79 (TE never offloads the last); with pp 2 it is not expressible."""
    model, system = load_model("llama3-70b"), load_system("gb200-nvl72", 64)
    job = JobSpec(global_batch=256, dtype="fp8")
    plan = Plan(dp=64, micro_batch=2, global_batch=256, zero_stage=3, fp8_param_gather=True,
                offload_activations=0.5)
    assert mg.not_expressible(plan, model, job) == []
    launch = mg.megatron_args(plan, model, job, system)
    assert launch.value("--cpu-offloading-num-layers") == "40"
    assert "--recompute-granularity" not in launch.flags()
    assert mg.validate_launch(launch, mg.gpu_arch_major(system)) == []
    full = mg.megatron_args(plan.model_copy(update={"offload_activations": 1.0}), model, job, system)
    assert full.value("--cpu-offloading-num-layers") == "79"
    piped = plan.model_copy(update={"pp": 2, "dp": 32})
    assert any(r.startswith("offload_activations:") for r in mg.not_expressible(piped, model, job))


def _plan_cli(*args: str) -> tuple[str, dict]:
    import json

    from typer.testing import CliRunner

    from planner.cli.app import app
    base = ["plan", "-m", "llama3-70b", "-s", "gb200-nvl72", "-g", "64", "-b", "256", "--dtype", "fp8",
            "--top", "1", *args]
    data = CliRunner().invoke(app, base + ["--json"])
    assert data.exit_code == 0, data.output
    return CliRunner().invoke(app, base).output, json.loads(data.output)


def test_plan_offloads_only_where_it_pays_and_says_so():
    """Llama-3 70B on 64 GB200, batch 256, FP8 (the Bridge recipe's job): the search picks the
    recipe's family, tp 1 with about half the layers' activations on Grace (the fewest whole
    layers whose HBM fits: 38 of 80, where one layer fewer does not fit; the recipe offloads 40),
    and the output names the offload, its exposed time and the best plan without it, whose step
    time --no-offload gives again; Llama-3 8B in bf16 ties exactly with and without offload
    (ZeRO-1 with half the activations offloaded, ZeRO-2 without) and then keeps its activations."""
    text, data = _plan_cli()
    best = data["plans"][0]
    assert (best["plan"]["tp"], best["plan"]["offload_activations"]) == (1, 38 / 80)
    model70, gb200_64 = load_model("llama3-70b"), load_system("gb200-nvl72", 64)
    job70 = JobSpec(global_batch=256, dtype="fp8")
    one_fewer = Plan(**{**best["plan"], "offload_activations": 37 / 80})
    assert not estimate(model70, gb200_64, one_fewer, job70).feasible
    gain = data["stats"]["offload_gain"]
    _, alone = _plan_cli("--no-offload")
    assert gain["step_time_s"] == pytest.approx(alone["plans"][0]["step_time_s"], rel=1e-12)
    assert gain["advantage"] == pytest.approx(1 - best["step_time_s"] / gain["step_time_s"]) and gain["advantage"] > 0
    flat = " ".join(text.split())
    assert "Offload: 38 of 80 layers' activations to grace-lpddr5x-c2c-shared" in flat and "It pays" in flat
    from planner.search import plan as search
    model8, gb200, job8 = load_model("llama3-8b"), load_system("gb200-nvl72", 64), JobSpec(global_batch=256)
    small = search(model8, gb200, job8, top_k=1).best
    assert not small.plan.uses_offload
    twin = small.plan.model_copy(update={"zero_stage": 1, "offload_activations": 0.5})
    assert estimate(model8, gb200, twin, job8).step_time_s == small.estimate.step_time_s  # the exact tie


def test_weights_and_activations_share_the_link():
    """With weights offloaded too (`--framework any`), weights and activations cross one link in
    the same compute window: on a 1 GB/s tier, where every byte is exposed, adding half the
    activations adds exactly their 2 × bytes / bandwidth per microbatch (out and back), as the
    single budget says; the per-layer schedule alone would hide part of them."""
    model = load_model("llama3-8b")
    system = load_system("h100-offload-1tib", 8).with_changes(
        offload={"name": "slow", "capacity_gib": 1024, "bandwidth_gb_per_s": 1})
    job = JobSpec(global_batch=16, framework="any")
    weights = Plan(dp=8, micro_batch=1, global_batch=16, offload_weights=0.5)
    both = weights.model_copy(update={"offload_activations": 0.5})
    e_w, e_wa = estimate(model, system, weights, job), estimate(model, system, both, job)
    m = 16 / 8
    act_mb = e_wa.memory_breakdown_bytes["activations_bytes"] + e_wa.offload_breakdown_bytes["offload_activations_bytes"]
    added = e_wa.time_breakdown_s["offload_exposed_s"] - e_w.time_breakdown_s["offload_exposed_s"]
    assert added == pytest.approx(m * 0.5 * 2 * act_mb / 1e9, rel=1e-9)
