"""H800 and A800: the H100 / A100 dies with NVLink cut to 400 GB/s (hardware/presets/h800.yaml,
a800-80g.yaml). Same compute, slower tensor-parallel traffic, by the link ratio."""
from __future__ import annotations

import pytest

from hardware.load import load_system
from planner.analytical import PlanArrays
from planner.analytical.estimate import estimate
from planner.analytical.time import per_layer_terms
from planner.model import load_model
from planner.plan import JobSpec, Plan


@pytest.mark.parametrize("variant, base, per_direction_gb_s", [("h800", "h100-sxm", (200, 450)),
                                                               ("a800-80g", "a100-80g", (200, 300))])
def test_export_variant_pays_only_for_its_slower_nvlink(variant, base, per_direction_gb_s):
    model = load_model("llama3-8b")
    plan = Plan(tp=8, pp=1, dp=1, micro_batch=1, global_batch=8, sequence_parallel=False, recompute="none",
                zero_stage=0)
    job = JobSpec(global_batch=8, dtype="bf16")
    cut = estimate(model, load_system(variant, 8), plan, job)
    full = estimate(model, load_system(base, 8), plan, job)
    # same SM, same peaks: forward and backward compute agree to the microsecond
    assert cut.time_breakdown_s["forward_s"] == pytest.approx(full.time_breakdown_s["forward_s"], rel=1e-9)
    assert cut.time_breakdown_s["backward_s"] == pytest.approx(full.time_breakdown_s["backward_s"], rel=1e-9)
    # exposed tensor-parallel all-reduces scale as a ring all-reduce of one layer's activations
    # (8192 tokens x 4096 hidden x 2 bytes) over 8 GPUs: 2(n-1)/n * bytes / (link * 0.8) + 2(n-1) * 3 us
    nbytes, n, lat_s = 8192 * 4096 * 2, 8, 3e-6
    ring = [2 * (n - 1) / n * nbytes / (gb_s * 1e9 * 0.8) + 2 * (n - 1) * lat_s for gb_s in per_direction_gb_s]
    P = PlanArrays.from_plans([plan], model.layers, 0)
    tp_cut, tp_full = (per_layer_terms(model, load_system(name, 8), job, P)["tp_fwd"][0] for name in (variant, base))
    assert tp_cut / tp_full == pytest.approx(ring[0] / ring[1], rel=1e-6)
    assert cut.time_breakdown_s["tp_comm_exposed_s"] > full.time_breakdown_s["tp_comm_exposed_s"]


def test_reference_gpu_name_h800_reads_as_the_h800_system():
    from planner.reference import system_preset_for
    system = load_system(system_preset_for("H800 80GB")[0], 2048)
    assert system.accelerator.name == "H800-SXM5-80GB" and system.nvlink_domain_gpus == 8
