"""Published measured runs (../shared/reference/measured_runs.yaml) as (model, system, plan, job)
cases, and the predicted-vs-measured accuracy table.

Where a record leaves a knob unstated we fill it with the documented default of the framework
and era it came from, and list the assumption beside the row; records we cannot model
(no parallel layout, GPUs without a preset, no measured time) are skipped with a reason.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import yaml

from hardware import load_system
from hardware.errors import SpecError
from hardware.spec import SystemSpec
from planner.analytical import PlanArrays, estimate_many
from planner.analytical.flops import narayanan_eq3_flops
from planner.model import ModelSpec, MoESpec
from planner.plan import BytesPerParam, JobSpec, Plan

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_REFERENCE = REPO_ROOT.parent / "shared" / "reference" / "measured_runs.yaml"
SYSTEM_FOR_GPU = {"A100-SXM4-80GB": "a100-80g", "H100-SXM5-80GB": "h100-sxm"}


@dataclass
class RefCase:
    id: str
    source: str
    model: ModelSpec
    system: SystemSpec
    plan: Plan
    job: JobSpec
    measured_step_s: float
    how_measured: str
    assumptions: list[str] = field(default_factory=list)
    fit: bool = True  # used by bench/calibrate.py; False for runs of another framework


@dataclass
class Skipped:
    id: str
    reason: str


def _source(rec_id: str) -> str:
    return rec_id.split("_")[0] + ("_" + rec_id.split("_")[1] if rec_id.startswith("dgxc") else "")


def _model(rec: dict) -> ModelSpec:
    m = rec["model"]
    act = str(m.get("activation") or "gelu")
    activation = "swiglu" if "swiglu" in act else "squared_relu" if "squared" in act else "gelu"
    moe = m.get("moe")
    gpt_style = rec["id"].startswith(("narayanan", "megatron"))
    return ModelSpec(
        name=m.get("name", rec["id"]), layers=m["layers"], hidden=m["hidden"], heads=m["heads"],
        query_groups=m.get("query_groups") or m["heads"], ffn=m.get("ffn"), seq_length=m["seq"],
        vocab=m["vocab"], activation=activation, tied_embeddings=bool(m.get("tied_embeddings", True)),
        position_embedding="learned" if gpt_style else "rope", biases=gpt_style,
        dropout=gpt_style or str(m.get("name", "")).startswith("GPT"),
        moe=MoESpec(num_experts=moe["num_experts"], top_k=moe["topk"], expert_ffn=moe.get("moe_ffn"))
        if moe else None)


def _smallest_vpp(layers_per_stage: int) -> int:
    return next((v for v in range(2, layers_per_stage + 1) if layers_per_stage % v == 0), 1)


def _case(rec: dict) -> RefCase | Skipped:
    rid = rec["id"]
    par, sysrec, meas = rec["parallel"], rec["system"], rec["measured"]
    if sysrec["gpu"] not in SYSTEM_FOR_GPU:
        return Skipped(rid, f"no preset for {sysrec['gpu']}")
    if par.get("tp") is None or par.get("pp") is None:
        return Skipped(rid, "parallel layout (tp/pp) not published")
    model = _model(rec)
    assumptions: list[str] = []
    tp, pp, cp = int(par["tp"]), int(par["pp"]), int(par.get("cp") or 1)
    gpus = int(sysrec["gpus"])
    dp = gpus // (tp * pp * cp)
    mb = par.get("microbatch")
    if mb is None:
        mb = 1
        assumptions.append("micro-batch 1")
    vpp = par.get("vpp")
    if isinstance(vpp, str):
        vpp = _smallest_vpp(model.layers // pp)
        assumptions.append(f"interleaved, vpp {vpp}")
    vpp = int(vpp or 1)
    era_2021 = rid.startswith(("narayanan", "megatron_readme_2020", "megatron_readme_jan2021"))
    rc = str(par.get("recompute"))
    if rc.startswith("full"):
        recompute = "full"
    elif rc.startswith("selective"):
        recompute = "selective"
    elif rid.startswith("megatron_readme_h100"):
        recompute = "selective"
        assumptions.append("selective recompute (Megatron-Core default recipe)")
    else:
        recompute = "none"
        assumptions.append("no recompute (NeMo H100 recipes: recompute_layers=0)")
    sp_raw = par.get("sequence_parallel")
    sp = tp > 1 and (sp_raw is True or (isinstance(sp_raw, str) and "likely" in sp_raw)
                     or (sp_raw is None and not era_2021))
    if sp_raw is None and sp:
        assumptions.append("sequence parallel")
    dist = str(par.get("distributed_optimizer"))
    zero = 3 if "ZeRO stage 3" in dist else 1 if ("likely" in dist or (dist == "None" and not era_2021)) else 0
    ep = int(par.get("ep") or 1)
    gbs = int(par["global_batch"])
    if gbs % (mb * dp):
        return Skipped(rid, f"global batch {gbs} is not a multiple of micro-batch·dp = {mb * dp}")
    try:
        # ZeRO-3 rows here are DeepSpeed's (Narayanan Table 2 baseline): costed as DeepSpeed
        plan = Plan(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, etp=par.get("etp"), micro_batch=mb, global_batch=gbs,
                    vpp=vpp, sequence_parallel=sp, recompute=recompute, zero_stage=zero,
                    dp_comm_overlap=not era_2021, tp_comm_overlap=sp and not era_2021,
                    dp_impl="deepspeed" if zero == 3 else "megatron")
    except ValueError as exc:
        return Skipped(rid, f"plan not representable: {exc}")
    prec = str(rec.get("precision"))
    dtype = "fp8" if "fp8" in prec else "fp16" if "fp16" in prec else "bf16"
    extra = {}
    if dtype == "fp8" and not era_2021:
        # NeMo's performance scripts set grad_reduce_in_fp32=False with fp8: bf16 main grads and reduce.
        extra["bytes_per_param"] = BytesPerParam(grads=2.0, grad_reduce=2.0)
        assumptions.append("bf16 gradients (NeMo fp8 perf recipe)")
    if zero == 3:
        # DeepSpeed ZeRO-3 (Narayanan Table 2 baseline) reduces fp16 gradients: 2 bytes on the wire.
        extra["bytes_per_param"] = BytesPerParam(grad_reduce=2.0)
        assumptions.append("DeepSpeed fp16 gradient reduce")
    job = JobSpec(global_batch=gbs, max_global_batch=max(gbs, 3072), dtype=dtype, flash_attention=not era_2021,
                  hbm_reserve_gib=0.0, **extra)
    system = load_system(SYSTEM_FOR_GPU[sysrec["gpu"]], gpus)
    if "iteration_time_s" in meas:
        step, how = float(meas["iteration_time_s"]), "measured step time"
    elif "model_tflops_per_gpu" in meas and rec.get("derived", {}).get("iteration_time_s"):
        step, how = float(rec["derived"]["iteration_time_s"]), "derived step time (source's tokens/s)"
    elif "tflops_per_gpu" in meas and rid.startswith("narayanan"):
        # Narayanan rows print TFLOP/s under eq. 3 (incl. recompute); invert it exactly.
        f = narayanan_eq3_flops(gbs, model.seq_length, model.layers, model.hidden, model.vocab,
                                recompute=recompute == "full")
        step, how = f / (float(meas["tflops_per_gpu"]) * 1e12 * gpus), "eq. 3 FLOPs / published TFLOP/s"
    elif "tflops_per_gpu" in meas and rec.get("derived", {}).get("iteration_time_s"):
        step, how = float(rec["derived"]["iteration_time_s"]), "derived step time (source's TFLOP/s)"
    else:
        return Skipped(rid, "no step time or throughput to compare")
    # DeepSpeed ZeRO-3 rows measure DeepSpeed's implementation, not Megatron's: reported, not fitted.
    return RefCase(rid, _source(rid), model, system, plan, job, step, how, assumptions, fit=zero != 3)


def load_reference(path: Path | str = DEFAULT_REFERENCE) -> tuple[list[RefCase], list[Skipped]]:
    path = Path(path)
    if not path.is_file():
        raise SpecError(f"reference: {path} not found (expected ../shared/reference/measured_runs.yaml "
                        "beside the repository, or pass --reference)")
    records = yaml.safe_load(path.read_text())["records"]
    cases, skipped = [], []
    for rec in records:
        out = _case(rec)
        (cases if isinstance(out, RefCase) else skipped).append(out)
    return cases, skipped


def predict(case: RefCase, system: SystemSpec | None = None) -> dict:
    system = system or case.system
    P = PlanArrays.from_plans([case.plan], case.model.layers)
    r = estimate_many(case.model, system, case.job, P)
    return {k: (float(v[0]) if k != "violations" else int(v[0])) for k, v in r.items()}


def accuracy_rows(cases: list[RefCase], systems: dict[str, SystemSpec] | None = None) -> list[dict]:
    rows = []
    for case in cases:
        system = (systems or {}).get(case.system.accelerator.name, case.system)
        if system is not case.system:
            system = system.with_changes(num_gpus=case.system.num_gpus)
        pred = predict(case, system)
        err = pred["step_time_s"] / case.measured_step_s - 1.0
        rows.append({"id": case.id, "source": case.source,
                     "framework": "Megatron/NeMo" if case.fit else "DeepSpeed ZeRO-3", "gpu": case.system.accelerator.name,
                     "dtype": case.job.dtype, "gpus": case.system.num_gpus, "plan": case.plan.short(),
                     "measured_s": case.measured_step_s, "predicted_s": pred["step_time_s"],
                     "error": err, "fits_hbm": pred["hbm_bytes"] <= pred["hbm_capacity_bytes"],
                     "assumptions": case.assumptions})
    return rows


def summarize(rows: list[dict], key: str = "source") -> dict[str, dict]:
    groups: dict[str, list[float]] = {}
    for r in rows:
        groups.setdefault(r[key], []).append(abs(r["error"]))
    groups["all"] = [abs(r["error"]) for r in rows]
    return {k: {"rows": len(v), "mean_abs_error": float(np.mean(v)), "max_abs_error": float(np.max(v))}
            for k, v in groups.items()}


def log_error(rows: list[dict]) -> float:
    return float(np.mean([abs(math.log1p(r["error"])) for r in rows]))
