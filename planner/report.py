"""Human-readable tables and JSON of Estimates (rich)."""
from __future__ import annotations

import statistics

import numpy as np
from rich.console import Console
from rich.text import Text
from rich.table import Table

from hardware.spec import SystemSpec
from planner.pipeline_layout import plan_layout
from planner.plan import compress_runs
from planner.analytical.estimate import RULES, Estimate
from planner.jsonout import json_safe, json_text  # noqa: F401 (re-exported)
from planner.analytical.layer_kinds import lead_layers
from planner.analytical.ranks import pipeline_ranks
from planner.model import ModelSpec
from planner.plan import JobSpec, Plan

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

# The step-time components two plans are compared by (`time_difference`): forward and backward
# together, since a micro-batch or precision change moves both the same way.
COMPARED_TIME_PARTS = {
    "forward + backward compute": ("forward_s", "backward_s"), "recompute": ("recompute_s",),
    "TP comm": ("tp_comm_exposed_s",), "CP/EP comm": ("cp_ep_comm_exposed_s",),
    "pipeline bubble": ("pp_bubble_s",), "pipeline p2p": ("pp_p2p_s",), "DP comm": ("dp_comm_exposed_s",),
    "offload": ("offload_exposed_s",), "optimizer step": ("optimizer_step_s",),
}


def time_difference(base: dict, other: dict) -> list[tuple[str, float]]:
    """Where `other` spends more (+) or fewer (−) seconds per step than `base`, by component
    (COMPARED_TIME_PARTS), largest change first; both are time breakdowns keyed as TIME_LABELS."""
    parts = [(label, sum(other[k] - base[k] for k in keys)) for label, keys in COMPARED_TIME_PARTS.items()]
    return sorted(parts, key=lambda x: -abs(x[1]))


def difference_text(parts: list[tuple[str, float]], base_s: float, top: int = 3) -> str:
    """'−0.31 s pipeline bubble (−24%), …': the `top` largest changes, as seconds and shares of
    `base_s`, leaving out those under 0.5 % of it."""
    shown = [(label, d) for label, d in parts[:top] if abs(d) >= 0.005 * base_s]
    def signed(x: float, fmt: str) -> str:
        return ("−" if x < 0 else "+") + format(abs(x), fmt)
    return ", ".join(f"{signed(d, '.2f')} s {label} ({signed(d / base_s, '.0%')})" for label, d in shown) or "no change"


OFFLOAD_LABELS = {"offload_weights_grads_bytes": "weights + gradients", "offload_optimizer_bytes": "optimizer state",
                  "offload_activations_bytes": "activations"}


def describe_plan(est: Estimate, layers: int | None = None) -> str:
    """The plan in one line; given the model's `layers`, a default split that is uneven is written
    out (Megatron's default layout, as costed), as an explicit one is."""
    p = est.plan
    default_uneven = layers is not None and p.stage_layers is None and p.pp > 1 and layers % (p.pp * p.vpp)
    return (f"TP {p.tp} · PP {p.pp} · DP {p.dp}" + (f" · CP {p.cp}" if p.cp > 1 else "")
            + (f" · EP {p.ep}" if p.ep > 1 else "")
            + (f" (ETP {p.etp})" if p.ep > 1 and p.etp is not None and p.etp != p.tp else "")
            + (" · DeepEP dispatch" if p.moe_dispatcher == "deepep" else "")
            + (" · all-to-all overlap" if p.moe_a2a_overlap else "")
            + f" · micro-batch {p.micro_batch}"
            + f" · global batch {p.global_batch} ({p.num_microbatches} microbatch{'es' if p.num_microbatches != 1 else ''})"
            + (f" · VPP {p.vpp}" if p.vpp > 1 else "")
            + (f" · layers per virtual stage {compress_runs(p.stage_layers)}" if p.stage_layers else "")
            + (f" · layers per virtual stage {compress_runs(plan_layout(p, layers))} (the default split)"
               if default_uneven else "")
            + (f" (recomputed {compress_runs(p.stage_recompute_layers)})" if p.stage_recompute_layers else "")
            + (" · SP" if p.sequence_parallel else "")
            + (" · TP comm overlap" if p.tp_overlap_on else "")
            + f" · recompute {p.recompute}"
            + (f" (first {p.recompute_num_layers} layer{'s' if p.recompute_num_layers != 1 else ''}"
               f"{' per stage' if p.pp > 1 else ''}"
               f"{f': {p.recompute_num_layers // p.vpp} of each virtual stage' if p.vpp > 1 and not p.recompute_num_layers % p.vpp else ''})"
               if p.recompute == "full" and p.recompute_num_layers and not p.stage_recompute_layers else "")
            + (f" ({', '.join(p.recompute_modules)})" if p.recompute_modules else "") + f" · ZeRO-{p.zero_stage}"
            + "".join(f" · offload {w} {getattr(p, 'offload_' + w):.0%}"
                      for w in ("weights", "activations", "optimizer") if getattr(p, "offload_" + w))
            + (" · fused cross-entropy" if p.cross_entropy_fusion else ""))


def fold_at_separators(text: str, width: int, sep: str = " · ") -> str:
    """`text` folded into lines of at most `width` characters between its `sep`-joined items, so
    that a terminal never breaks an item ("VPP 8") in two; an item wider than a line keeps a line
    of its own."""
    lines, line = [], ""
    tail = len(sep.rstrip())  # a line that breaks ends with the separator: room for it
    for item in text.split(sep):
        joined = item if not line else line + sep + item
        if line and len(joined) + tail > width:
            lines.append(line + sep.rstrip())
            line = item
        else:
            line = joined
    return "\n".join([*lines, line])


def estimate_tables(est: Estimate, title: str = "") -> list[Table]:
    times = Table(title=title or "Step time", show_edge=False)
    times.add_column("time per step")
    times.add_column("seconds", justify="right")
    times.add_column("share", justify="right")
    for key, label in TIME_LABELS.items():
        value = est.time_breakdown_s[key]
        if value > 0:
            times.add_row(label, f"{value:.3f}", f"{value / est.step_time_s:.1%}")
    times.add_row(Text("step", style="bold"), Text(f"{est.step_time_s:.3f}", style="bold"), "100%")

    memory = Table(title="Memory per GPU (worst pipeline stage)", show_edge=False)
    memory.add_column("HBM")
    memory.add_column("GiB", justify="right")
    for key, label in MEMORY_LABELS.items():
        memory.add_row(label, f"{est.memory_breakdown_bytes[key] / GIB:.2f}")
    # usable to the same two decimals as the total: 17.70 of 17.7 hid an overflow of 0.01 GiB
    memory.add_row(Text("total", style="bold"), Text.assemble((f"{est.hbm_bytes / GIB:.2f}", "bold"),
                                                            f" of {est.hbm_capacity_bytes / GIB:.2f} usable"))
    if est.offload_bytes or est.offload_capacity_bytes:
        for key, label in OFFLOAD_LABELS.items():
            if est.offload_breakdown_bytes[key]:
                memory.add_row(f"offload tier: {label}", f"{est.offload_breakdown_bytes[key] / GIB:.2f}")
        memory.add_row("offload tier total", f"{est.offload_bytes / GIB:.2f} of {est.offload_capacity_bytes / GIB:,.2f} capacity")
    return [times, memory]


def offload_note(model: ModelSpec, system, plan, est: Estimate, gain: dict | None) -> str:
    """One line on what the plan offloads to the host tier, what the copies cost, and what the
    offload buys against the best plan without it (planner.recommend._offload_gain)."""
    from planner.analytical.offload import offloaded_layers
    tier = system.offload
    what = []
    if plan.offload_activations:
        n = int(offloaded_layers(np.array([plan.offload_activations]), np.array([float(model.layers)]))[0])
        what.append(f"{n} of {model.layers} layers' activations")
    what += [f"{getattr(plan, 'offload_' + w):.0%} of the {label}" for w, label in
             (("weights", "weights and gradients"), ("optimizer", "optimizer state")) if getattr(plan, "offload_" + w)]
    cost = est.time_breakdown_s["offload_exposed_s"]
    text = (f"Offload: {', '.join(what)} to {tier.name} ({est.offload_bytes / GIB:.1f} GiB per GPU, "
            f"{tier.bandwidth_gb_per_s:g} GB/s); the copies add {cost:.3f} s per step"
            + (" (hidden behind compute)" if cost == 0 else "") + ". ")
    if gain is None:
        return text + "No plan fits without offload."
    slower = 1 / (1 - gain["advantage"]) - 1
    if slower < 0:  # the offload was pinned: say what it costs, not that it pays
        return (text + f"It costs: the best plan without offload, {gain['plan_without_offload']}, takes "
                f"{gain['step_time_s']:.3f} s per step, {-slower:.1%} less time per token.")
    return (text + f"It pays: the best plan without offload, {gain['plan_without_offload']}, takes "
            f"{gain['step_time_s']:.3f} s per step, {slower:.1%} more time per token.")


def moe_routing_note(model: ModelSpec, imbalance: float, ep: int = 2) -> str | None:
    """What the MoE time assumes about routing, said where a user sees the plan."""
    if model.moe is None:
        return None
    if ep == 1 and imbalance != 1.0:  # time.moe_load_imbalance: no rank is busier at ep 1
        return (f"MoE: ep 1, every GPU holds every expert, so the routing skew (--moe-imbalance {imbalance:g}) "
                "slows no rank")
    what = "balanced routing, as NVIDIA's MoE benchmarks force" if imbalance == 1.0 else "routing skew"
    from planner.reference_moe import MOE_IMBALANCE_LEARNED_DROPLESS
    return (f"MoE: busiest expert rank gets {imbalance:g}× the mean tokens ({what}); "
            f"--moe-imbalance {MOE_IMBALANCE_LEARNED_DROPLESS:g} models learned dropless routing "
            "(fitted on Megatron MoE ModelZoo runs)")


def moe_dispatch_note(model: ModelSpec, system: SystemSpec, job: JobSpec, est: Estimate) -> str | None:
    """Where NCCL's alltoall moves the expert all-to-all inside the NVLink domain, Megatron's
    all-to-all overlap hides nothing (time.a2a_in_nccl_copy_kernels): say what would let it."""
    from planner.analytical.estimate import estimate
    from planner.analytical.time import a2a_in_nccl_copy_kernels
    from planner.megatron.expressible import a2a_overlap_model, a2a_overlap_refusals
    from planner.plan import MOE_DISPATCHER_CODES
    plan = est.plan
    if plan.ep == 1 or job.framework != "megatron" or plan.moe_dispatcher != "alltoall":
        return None
    if not a2a_overlap_model(model):
        return None  # no overlap to enable: the search never runs it there (constraints.space knob_domains)
    if not a2a_in_nccl_copy_kernels(system, MOE_DISPATCHER_CODES["alltoall"], plan.ep, plan.expert_tp):
        return None
    text = (f"MoE: the expert all-to-all (ep {plan.ep}, inside the {system.nvlink_domain_gpus}-GPU NVLink "
            "domain) runs on NCCL's copy kernels, where Megatron's all-to-all overlap hides nothing "
            "(measured slower with it); --moe-dispatcher deepep (DeepEP / HybridEP, as NVIDIA's MoE "
            "recipes run) lets the search overlap it")
    # the same plan with DeepEP and, where Megatron accepts it, the overlap: a number, not a search
    overlap = not a2a_overlap_refusals(plan, model)
    deepep = estimate(model, system, plan.model_copy(update={"moe_dispatcher": "deepep", "moe_a2a_overlap": overlap}),
                      job.model_copy(update={"moe_dispatcher": "deepep"}))
    if deepep.feasible and est.feasible and deepep.step_time_s < est.step_time_s:
        text += (f" (this plan with DeepEP{' and the overlap' if overlap else ''}: {est.step_time_s:.3f} → "
                 f"{deepep.step_time_s:.3f} s per step)")
    return text


# A rank this much slower per microbatch than the median rank sets the pipeline's pace with time
# to spare elsewhere: worth telling the user that the layers per stage can be re-split.
IMBALANCE_NOTE_RATIO = 1.25


def pipeline_imbalance_note(rows, plan: Plan) -> str | None:
    """One line when the slowest pipeline rank takes IMBALANCE_NOTE_RATIO x the median rank's
    microbatch time or more (1F1B runs at the pace of its slowest stage), else None."""
    median = statistics.median(r.microbatch_s for r in rows)
    slowest = max(range(len(rows)), key=lambda i: rows[i].microbatch_s)
    ratio = rows[slowest].microbatch_s / median
    if ratio < IMBALANCE_NOTE_RATIO:
        return None
    return (f"Pipeline imbalance: rank {slowest} takes {ratio:.2f}x the median rank's time per microbatch and "
            f"sets the pace; `planner plan` with the same pins re-splits the layers per stage "
            f"(--pp {plan.pp}{f' --vpp {plan.vpp}' if plan.vpp > 1 else ''}).")


def pipeline_ranks_table(model: ModelSpec, system: SystemSpec, job: JobSpec, plan: Plan,
                         rows=None) -> Table | None:
    """Layers by kind, microbatch time and HBM of each pipeline rank, runs of equal ranks merged;
    None when every rank holds the same layers (nothing to tell)."""
    if plan.pp == 1:
        return None
    rows = rows if rows is not None else pipeline_ranks(model, system, job, plan)
    described = [(r.describe(model, plan.pp), r) for r in rows]
    if len({(r.layers, r.lead_layers, r.recomputed) for r in rows}) == 1 and not lead_layers(model):
        return None
    table = Table(title="Pipeline ranks (layers per rank, all its virtual stages)", show_edge=False)
    for col in ("rank", "layers", "recomputed", "microbatch s", "HBM GiB"):
        table.add_column(col, justify="left" if col in ("rank", "layers") else "right")
    slowest = max(r.microbatch_s for r in rows)
    i = 0
    while i < len(described):  # merge runs of ranks that hold the same and cost the same
        j = i
        while j + 1 < len(described) and described[j + 1][0] == described[i][0] and \
                described[j + 1][1].recomputed == described[i][1].recomputed and \
                described[j + 1][1].microbatch_s == described[i][1].microbatch_s:
            j += 1
        text, r = described[i]
        mark = " (slowest)" if r.microbatch_s == slowest else ""
        hbm = [x.hbm_bytes / GIB for _, x in described[i:j + 1]]  # in-flight microbatches fall with the rank
        table.add_row(f"{i}" if i == j else f"{i}-{j}", text, str(r.recomputed), f"{r.microbatch_s:.4f}{mark}",
                      f"{max(hbm):.2f}" if i == j else f"{min(hbm):.2f}-{max(hbm):.2f}")
        i = j + 1
    return table


def hybrid_stage_note(model: ModelSpec, plan, system: SystemSpec, job: JobSpec) -> str:
    """A pipelined hybrid stack's ranks are timed and sized with their own blocks
    (hybrid.rank_excess_s, memory.rank_memory); how far the busiest rank's blocks are from the
    pattern's mean block."""
    if not model.hybrid_pattern or plan.pp == 1:
        return ""
    from planner.analytical.hybrid import busiest_rank_excess
    rank, excess = busiest_rank_excess(model, system, job, plan)
    return ("Hybrid stack: each pipeline rank's time counts its own blocks (the pattern cut at the "
            f"stages): rank {rank}'s cost {excess:+.1%} forward compute against the pattern's mean block, "
            "included above, as are its blocks' parameters and activations.")


def precision_text(job: JobSpec) -> str:
    """The job's GEMM precision, with its mixed-recipe exceptions (bf16 layers, per-module dtypes)."""
    parts = []
    first, last = job.bf16_layers
    if first or last:
        parts.append(" and ".join(p for p in (f"first {first}" if first else "", f"last {last}" if last else "") if p)
                     + " layers bf16")
    parts += [f"{module} {dtype}" for module, dtype in job.module_dtypes.items()]
    return job.dtype + (f" ({'; '.join(parts)})" if parts else "")


def kernel_text(job: JobSpec) -> str:
    """The kernel settings the time was costed with, where they differ from the defaults (Transformer
    Engine, no CUDA graphs): a run launched without them is slower than the table says."""
    parts = [] if job.kernels == "te" else [f"{job.kernels} kernels"]
    if job.full_iteration_cuda_graph:
        parts.append("full-iteration CUDA graph")
    elif job.cuda_graph_modules:
        parts.append(f"CUDA graphs of {', '.join(job.cuda_graph_modules)} per layer")
    parts += [name for name, on in (("FP8 attention", job.fp8_attention), ("fused grouped MLP", job.fused_grouped_mlp))
              if on]
    return ", ".join(parts)


def kernel_json(job: JobSpec) -> dict:
    """The kernel settings the time was costed with, for --json output."""
    return {"kernels": job.kernels, "full_iteration_cuda_graph": job.full_iteration_cuda_graph,
            "cuda_graph_modules": list(job.cuda_graph_modules), "fp8_attention": job.fp8_attention,
            "fused_grouped_mlp": job.fused_grouped_mlp}


def print_estimate(console: Console, model: ModelSpec, system: SystemSpec, est: Estimate, title: str = "",
                   job: JobSpec | None = None) -> None:
    """The plan, its time and memory tables, per-rank layers where ranks differ and, given the
    job, what the MoE time assumes about routing and how much measured evidence backs the plan."""
    console.print(Text.assemble((model.name, "bold"), f" ({model.num_params / 1e9:.1f} B params, seq "
                                f"{model.seq_length:,}) on ", (f"{system.num_gpus}× {system.accelerator.name}", "bold"),
                                f" ({system.name})" + (f" · {precision_text(job)}" if job is not None else "")
                                + (f" · {kernels}" if job is not None and (kernels := kernel_text(job)) else "")))
    console.print(fold_at_separators(describe_plan(est, model.layers), console.width))
    for table in estimate_tables(est, title):
        console.print(table)
    rank_rows = pipeline_ranks(model, system, job, est.plan) if job is not None and est.plan.pp > 1 else None
    ranks = pipeline_ranks_table(model, system, job, est.plan, rank_rows) if rank_rows else None
    if ranks is not None:
        console.print(ranks)
    # MFU counts the full s×s attention (Narayanan eq. 3, as the published MFUs); HFU counts what
    # runs (causal half, recompute), so at long sequence MFU may exceed the kernels' ceilings.
    # the denominator is the peak of the job's GEMM precision (an FP8 run against the FP8 peak):
    # say which, since a faster FP8 run shows a lower MFU than its BF16 twin
    over = ""
    if job is not None:
        from planner.analytical import precision
        over = f" over the {precision.gemm_peak_key(job.dtype)} peak"
    console.print(f"MFU {est.mfu:.1%} (full-attention FLOPs{over}, as published MFUs) · HFU {est.hfu:.1%} (executed: causal attention half, recompute in) · "
                  f"{est.tokens_per_s:,.0f} tokens/s · "
                  f"{est.model_flops / est.step_time_s / est.plan.gpus / 1e12:,.0f} model TFLOP/s per GPU")
    if job is not None:
        from planner.evidence import evidence_note, published_job_note
        published = published_job_note(model, system.accelerator.name, system.num_gpus, est.plan.global_batch,
                                       job.dtype, est.step_time_s, job.moe_load_imbalance, job.moe_dispatcher)
        imbalance = pipeline_imbalance_note(rank_rows, est.plan) if rank_rows else None
        attention = model.uncosted_attention()
        for note in (f"Attention: {attention}." if attention else None, imbalance,
                     moe_routing_note(model, job.moe_load_imbalance, est.plan.ep),
                     moe_dispatch_note(model, system, job, est), evidence_note(model, est.plan),
                     published, megatron_note(model, job, est.plan), hybrid_stage_note(model, est.plan, system, job)):
            if note:
                console.print(note)
    if est.violations:
        console.print("Not feasible:", style="bold red")
        for rule in est.violations:
            console.print(f"  - {rule}: {RULES[rule]}")


def megatron_note(model: ModelSpec, job: JobSpec, plan) -> str | None:
    """Why Megatron-LM would not run this plan as costed (`planner megatron` refuses it), if so."""
    if job.framework != "megatron":
        return None
    from planner.megatron.expressible import not_expressible
    reasons = not_expressible(plan, model, job)
    return f"Not expressible in Megatron-LM (`planner megatron` refuses it): {'; '.join(reasons)}" if reasons else None


def precision_json(job: JobSpec) -> dict:
    """The job's GEMM precision with its mixed-recipe exceptions, for --json output."""
    return {"dtype": job.dtype, "bf16_layers": list(job.bf16_layers), "module_dtypes": dict(job.module_dtypes)}


def estimate_json(est: Estimate, job: JobSpec | None = None, model: ModelSpec | None = None,
                  system: SystemSpec | None = None) -> str:
    """An estimate as JSON, with what it was made for (model, system, GPUs, sequence) when given."""
    data = est.model_dump()
    if model is not None:
        data.update(model=model.name, seq_length=model.seq_length)
        if job is not None and job.framework == "megatron":  # what the table's note says
            from planner.megatron.expressible import not_expressible
            data["megatron_refusals"] = not_expressible(est.plan, model, job)
    if system is not None:
        data.update(system=system.name, gpus=system.num_gpus)
    data["feasible"] = est.feasible
    if job is not None:
        data["precision"] = precision_json(job)
        data["kernel_settings"] = kernel_json(job)
    if model is not None and est.plan.pp > 1:  # the layout costed, the default split written out
        data["pipeline_layout"] = list(plan_layout(est.plan, model.layers))
    if model is not None and system is not None and job is not None and est.plan.pp > 1:
        # what the text's per-rank table shows: each pipeline rank's layers, time and HBM
        from dataclasses import asdict
        data["pipeline_ranks"] = [asdict(r) for r in pipeline_ranks(model, system, job, est.plan)]
    return json_text(data)
