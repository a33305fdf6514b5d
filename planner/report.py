"""Human-readable tables and JSON of Estimates (rich)."""
from __future__ import annotations

import json

from rich.console import Console
from rich.table import Table

from hardware.spec import SystemSpec
from planner.plan import compress_runs
from planner.analytical.estimate import RULES, Estimate
from planner.jsonout import json_safe, json_text  # noqa: F401 (re-exported)
from planner.model import ModelSpec

GIB = 2**30

TIME_LABELS = {
    "forward_s": "forward", "backward_s": "backward", "recompute_s": "recompute",
    "tp_comm_exposed_s": "TP comm (exposed)", "cp_ep_comm_exposed_s": "CP/EP comm (exposed)",
    "pp_bubble_s": "pipeline bubble", "pp_p2p_s": "pipeline p2p", "dp_comm_exposed_s": "DP comm (exposed)",
    "offload_exposed_s": "offload (exposed)", "optimizer_step_s": "optimizer step",
}
MEMORY_LABELS = {
    "weights_bytes": "weights (blocks)", "grads_bytes": "gradients (blocks)", "optimizer_bytes": "optimizer state (blocks)",
    "embeddings_bytes": "embedding / LM head (weights, grads, optimizer)",
    "activations_bytes": "activations", "workspace_bytes": "workspace (logits, recompute, gathers)",
}

OFFLOAD_LABELS = {"offload_weights_grads_bytes": "weights + gradients", "offload_optimizer_bytes": "optimizer state",
                  "offload_activations_bytes": "activations"}


def describe_plan(est: Estimate) -> str:
    p = est.plan
    return (f"TP {p.tp} · PP {p.pp} · DP {p.dp}" + (f" · CP {p.cp}" if p.cp > 1 else "")
            + (f" · EP {p.ep}" if p.ep > 1 else "") + f" · micro-batch {p.micro_batch}"
            + f" · global batch {p.global_batch} ({p.num_microbatches} microbatch{'es' if p.num_microbatches != 1 else ''})"
            + (f" · VPP {p.vpp}" if p.vpp > 1 else "")
            + (f" · layers per virtual stage {compress_runs(p.stage_layers)}" if p.stage_layers else "")
            + (f" (recomputed {compress_runs(p.stage_recompute_layers)})" if p.stage_recompute_layers else "")
            + (" · SP" if p.sequence_parallel else "")
            + f" · recompute {p.recompute}"
            + (f" ({', '.join(p.recompute_modules)})" if p.recompute_modules else "") + f" · ZeRO-{p.zero_stage}"
            + "".join(f" · offload {w} {getattr(p, 'offload_' + w):.0%}"
                      for w in ("weights", "activations", "optimizer") if getattr(p, "offload_" + w)))


def estimate_tables(est: Estimate, title: str = "") -> list[Table]:
    times = Table(title=title or "Step time", show_edge=False)
    times.add_column("time per step")
    times.add_column("seconds", justify="right")
    times.add_column("share", justify="right")
    for key, label in TIME_LABELS.items():
        value = est.time_breakdown_s[key]
        if value > 0:
            times.add_row(label, f"{value:.3f}", f"{value / est.step_time_s:.1%}")
    times.add_row("[bold]step[/bold]", f"[bold]{est.step_time_s:.3f}[/bold]", "100%")

    memory = Table(title="Memory per GPU (worst pipeline stage)", show_edge=False)
    memory.add_column("HBM")
    memory.add_column("GiB", justify="right")
    for key, label in MEMORY_LABELS.items():
        memory.add_row(label, f"{est.memory_breakdown_bytes[key] / GIB:.2f}")
    memory.add_row("[bold]total[/bold]", f"[bold]{est.hbm_bytes / GIB:.2f}[/bold] of "
                   f"{est.hbm_capacity_bytes / GIB:.1f} usable")
    if est.offload_bytes or est.offload_capacity_bytes:
        for key, label in OFFLOAD_LABELS.items():
            if est.offload_breakdown_bytes[key]:
                memory.add_row(f"offload tier: {label}", f"{est.offload_breakdown_bytes[key] / GIB:.2f}")
        memory.add_row("offload tier total", f"{est.offload_bytes / GIB:.2f} of {est.offload_capacity_bytes / GIB:.0f}")
    return [times, memory]


def print_estimate(console: Console, model: ModelSpec, system: SystemSpec, est: Estimate, title: str = "") -> None:
    console.print(f"[bold]{model.name}[/bold] ({model.num_params / 1e9:.1f} B params) on "
                  f"[bold]{system.num_gpus}× {system.accelerator.name}[/bold] ({system.name})")
    console.print(describe_plan(est))
    for table in estimate_tables(est, title):
        console.print(table)
    # MFU counts the full s×s attention (Narayanan eq. 3, as the published MFUs); HFU counts what
    # runs (causal half, recompute), so at long sequence MFU may exceed the kernels' ceilings.
    console.print(f"MFU {est.mfu:.1%} (full-attention FLOPs, as published MFUs) · HFU {est.hfu:.1%} (executed) · "
                  f"{est.tokens_per_s:,.0f} tokens/s · "
                  f"{est.model_flops / est.step_time_s / est.plan.gpus / 1e12:.0f} model TFLOP/s per GPU")
    if est.violations:
        console.print("[bold red]Not feasible:[/bold red]")
        for rule in est.violations:
            console.print(f"  - {rule}: {RULES[rule]}")


def estimate_json(est: Estimate) -> str:
    data = est.model_dump()
    data["feasible"] = est.feasible
    return json_text(data)
