"""Held-out check: the Megatron-Bridge performance-summary rows that ../shared/reference does not
hold (GPT-OSS 120B, Qwen3-30B-A3B, GB300 and B300 systems, later releases; bench/data/
bridge_heldout.csv, extracted by bench/extract_bridge_heldout.py with commit, file and line),
predicted by the exact model as a user would ask it (`planner estimate`): the model preset, the
system preset, the published layout (tp, pp, cp, vp, ep, etp, micro-batch, FSDP), the recipe's
pipeline layout where the loader knows it, no recompute, the distributed optimizer, and nothing
fitted to these rows. Models without a preset (Kimi-K2, Nemotron-3, DeepSeek-V4) are counted and
skipped. Nothing here feeds a fit: the numbers are the out-of-sample error.

    PYTHONPATH=. python bench/heldout_bridge.py [--csv]
"""
from __future__ import annotations

import argparse
import csv
import re
import statistics
from pathlib import Path

from hardware import load_system
from planner.analytical import estimate
from hardware.errors import SpecError
from planner.model import load_model
from planner.plan import JobSpec, Plan
from planner.reference import _stage_layers, bridge_recipe_layout, parse_precision

DATA = Path(__file__).resolve().parent / "data" / "bridge_heldout.csv"
MODELS = {"deepseekv3": "deepseek-v3", "deepseekv3(w/omtp)": "deepseek-v3", "gptoss120b": "gpt-oss-120b",
          "qwen3_30b_a3b": "qwen3-30b-a3b", "qwen3_235b_a22b": "qwen3-235b-a22b", "llama3_70b": "llama3-70b",
          "llama3.1_405b": "llama3.1-405b", "llama3_8b": "llama3-8b"}
SYSTEMS = {"DGX-GB300": "gb300-nvl72", "DGX-GB200": "gb200-nvl72", "DGX-B300": "b300", "DGX-B200": "b200",
           "DGX-H100": "h100-sxm"}


def row_id(row: dict) -> str:
    """The id the row would have in ../shared/reference/bridge_runs.yaml's convention:
    bridge_<release>_<model>_<system>_<precision>_<gpus>gpu_gbs<gbs> (model: the table's name up to
    any parenthesis, spaces as underscores; precision as printed, spaces as underscores)."""
    model = re.sub(r"\s+", "_", row["model"].split("(")[0].strip())
    precision = re.sub(r"\s+", "_", row["precision"].strip())
    return f"bridge_{row['release']}_{model}_{row['system']}_{precision}_{row['gpus']}gpu_gbs{row['gbs']}"


def _int(text: str, default: int | None = None) -> int | None:
    text = (text or "").split("(")[0].strip()
    return int(text) if text.isdigit() else default


def case(row: dict):
    """(model, system, plan, job, measured step s, notes) of a row, or a str: why it is skipped."""
    key = row["model"].lower().replace(" ", "")
    preset = MODELS.get(key)
    if preset is None:
        return f"no model preset for {row['model']}"
    if row["system"] not in SYSTEMS:
        return f"no system preset for {row['system']}"
    gpus, gbs, seq = _int(row["gpus"]), _int(row["gbs"]), _int(row["seq"])
    tps = float(row["tokens_per_s_per_gpu"].split("(")[0].replace(",", ""))
    model = load_model(preset)
    model = model.model_copy(update={"seq_length": seq, **({"mtp_layers": 0} if "w/o mtp" in row["model"].lower()
                                                          else {})})
    system = load_system(SYSTEMS[row["system"]], gpus)
    dtype, _ = parse_precision(row["precision"].split("(")[0].strip(), row["model"])
    tp, pp, cp = _int(row["tp"], 1), _int(row["pp"], 1), _int(row["cp"], 1)
    vpp, ep = _int(row["vp"], 1), _int(row["ep"], 1)
    etp = _int(row.get("etp") or "")
    fsdp = _int(row.get("fsdp") or "", 0)
    notes: list[str] = []
    recipe = bridge_recipe_layout(row["model"], model.layers, pp, vpp)
    stages = _stage_layers(model, pp, vpp, None, notes, recipe)
    if isinstance(stages, str):
        return stages
    fields = dict(tp=tp, pp=pp, cp=cp, dp=gpus // (tp * pp * cp), ep=ep, etp=etp, vpp=vpp,
                  micro_batch=_int(row["mbs"], 1), global_batch=gbs, sequence_parallel=tp > 1,
                  zero_stage=3 if fsdp > 1 else 1, stage_layers=stages)
    try:
        plan = Plan(**{k: v for k, v in fields.items() if v is not None})
        job = JobSpec(global_batch=gbs, max_global_batch=max(gbs, 3072), dtype=dtype)
    except (ValueError, SpecError) as err:
        return f"not a valid plan here: {str(err).splitlines()[0][:120]}"
    measured_s = gbs * seq / (tps * gpus)
    return model, system, plan, job, measured_s, notes


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--csv", action="store_true", help="one CSV line per row")
    args = ap.parse_args()
    rows = list(csv.DictReader(DATA.open()))
    errors, skipped = {}, {}
    for row in rows:
        c = case(row)
        label = f"{row['release']} {row['model']} {row['system']} {row['precision']} {row['gpus']}gpu gbs{row['gbs']}"
        if isinstance(c, str):
            skipped[c.split(" for ")[0] if "preset" in c else c] = skipped.get(c, 0) + 1
            continue
        model, system, plan, job, measured_s, notes = c
        try:
            est = estimate(model, system, plan, job)
        except SpecError as err:
            print(f"{label:75s} error: {err}")
            continue
        err = est.step_time_s / measured_s - 1
        group = (row["model"].split(" (")[0], row["system"])
        errors.setdefault(group, []).append(err)
        fit = "" if est.feasible else "  (model: does not fit / breaks a rule)"
        print(f"{label:75s} {plan.short()[:46]:46s} meas {measured_s:8.3f} pred {est.step_time_s:8.3f} "
              f"{err:+7.1%}{fit}")
    print()
    allerr = [e for v in errors.values() for e in v]
    for g, v in sorted(errors.items()):
        print(f"{g[0]:18s} {g[1]:10s} {len(v):3d} rows  mean |err| {statistics.mean(abs(e) for e in v):6.1%}  "
              f"mean err {statistics.mean(v):+6.1%}  max |err| {max(abs(e) for e in v):6.1%}")
    if allerr:
        print(f"all {len(allerr)} rows: mean |err| {statistics.mean(abs(e) for e in allerr):.1%}, "
              f"max {max(abs(e) for e in allerr):.1%}; skipped: {skipped}")


if __name__ == "__main__":
    main()
