"""Held-out check: the NeMo performance-summary pre-training rows that ../shared/reference does not
hold (bench/data/nemo_heldout.csv, extracted by bench/extract_nemo_heldout.py with commit, file and
line): the earlier revisions of the 24.07 DGX-H100 table (same layouts as the nemo2407 records,
other measured numbers) and the long-sequence context-parallel tables (24.03 DGX-H100, 25.04
DGX-B200); and the later releases' rows published only on docs.nvidia.com
(bench/data/nemo_docs_heldout.csv, typed in with each page's address: 25.02 DGX-B200/H100, 25.04
DGX-GB200). Each row is written as a measured_runs.yaml record in the nemo2407 records' conventions
(model block from the planner's model preset; sequence parallel and the distributed optimizer
"likely", recompute unstated, which the loader fills with NeMo's H100 recipe defaults) and read by
the same loader `planner validate --reference` uses. Nothing is fitted to these rows.

Step time: gbs*seq/(tokens_per_sec_per_gpu*gpus) where the table prints tokens/s (as for the
nemo2407 records); the long-sequence tables print only model TFLOP/s per GPU, so there it is
gbs * (NeMo's model FLOPs per sequence) / (TFLOP/s * gpus), the FLOPs counted as NeMo counted them
(see `nemo_model_flops_per_token`).

    PYTHONPATH=. python bench/heldout_nemo.py [--write-yaml PATH]
"""
from __future__ import annotations

import argparse
import csv
import statistics
from pathlib import Path

from heldout_bridge import build_records, preset_model_block, read_back
from planner.calibration import predict
from planner.model import load_model

DATA = Path(__file__).resolve().parent / "data" / "nemo_heldout.csv"
# The release tables after 24.07 are published on docs.nvidia.com, not in the NeMo repository:
# the rows of the stored page snapshots whose every cell is legible, typed in by hand with the
# page's address (25.02 DGX-B200 and the one DGX-H100 row shown; 25.04 DGX-GB200).
DOCS_DATA = Path(__file__).resolve().parent / "data" / "nemo_docs_heldout.csv"
MODELS = {"GPT3-175B": "gpt3-175b", "LLAMA3-8B": "llama3-8b", "LLAMA3-70B": "llama3-70b", "LLAMA2-7B": "llama2-7b",
          "LLAMA2-13B": "llama2-13b", "LLAMA2-70B": "llama2-70b", "LLAMA3-405B": "llama3-405b",
          "Mixtral-8x7B": "mixtral-8x7b", "GPT3-5B": "gpt3-5b", "GPT3-20B": "gpt3-20b",
          "Nemotron-8B": "nemotron3-8b", "Nemotron-22B": "nemotron3-22b", "Nemotron-15B": "nemotron4-15b",
          "Nemotron-340B": "nemotron4-340b"}
# the record's system block, as the nemo2407 records write it (B200: the b200 preset's GPU)
SYSTEMS = {"DGX-H100": {"gpu": "H100-SXM5-80GB", "gpu_mem_gb": 80, "gpus_per_node": 8},
           "DGX-B200": {"gpu": "B200", "gpu_mem_gb": 180, "gpus_per_node": 8},
           "DGX-GB200": {"gpu": "GB200", "gpu_mem_gb": 186, "gpus_per_node": 4}}


def nemo_model_flops_per_token(layers: int, hidden: int, heads: int, query_groups: int, ffn: int, vocab: int,
                               seq: int) -> float:
    """Model FLOPs per token as NeMo's performance tables count them for a Llama (SwiGLU, GQA)
    model: L·h²·(12 + 12·g/a + 18·f/h + 12·s/h + 6·V/(L·h)), attention over the full s×s
    matrix (NVIDIA/NeMo nemo/utils/flops_formulas.py llama2/llama3 at e1335c8378, 2025-04-22,
    the formula of the 25.04 container; NeMo halved the attention term for the causal mask only
    later). The 24.07 table agrees: its LLAMA3-8B row, 711 TFLOP/s at 12273 tokens/s, is
    57.9 GFLOP/token, which this gives at seq 8192 (the causal count would be 51.5), and its
    LLAMA2-7B row (780 at 16934) 46.1 at seq 4096. The 24.03 long-sequence table is assumed to
    count alike (its container predates the formula file)."""
    return layers * hidden**2 * (12 + 12 * query_groups / heads + 18 * ffn / hidden + 12 * seq / hidden
                                 + 6 * vocab / (layers * hidden))


# NEMO2_FP8_PARAM_GATHER: the docs pages' rows (NeMo 2.x containers, 25.02 and 25.04) ran
# scripts/performance with an FP8 precision plugin that keeps FP8 primary weights: 25.02's
# bf16_with_fp8_mixed sets fp8_params=True (NVIDIA/NeMo v2.2.1,
# nemo/collections/llm/recipes/precision/mixed_precision.py), 25.04's delayed and current-scaling
# plugins fp8_param_gather=True (v2.3.0, same file), which scripts/performance/utils.py keeps except
# under Megatron-FSDP (the FSDP rows are not built). The repository's long-sequence tables state no
# recipe and are left as they were.


def row_id(row: dict) -> str:
    """nemo<release digits>_<model>_<system>_<gpus>gpu_gbs<gbs>_seq<seq>_<commit[:8] or 'docs'> (the
    commit keeps revisions of one configuration apart)."""
    release = row["release"].replace(".", "")
    return (f"nemo{release}_{row['model']}_{row['system']}_{row['gpus']}gpu_gbs{row['gbs']}_seq{row['seq']}"
            f"_{row['commit'][:8] if row.get('commit') else 'docs'}")


def _step_time(row: dict, gbs: int, seq: int, gpus: int, preset: str) -> tuple[float, str]:
    if row["tokens_per_s_per_gpu"]:
        return gbs * seq / (float(row["tokens_per_s_per_gpu"]) * gpus), "gbs*seq/(tokens_per_sec_per_gpu*gpus)"
    m = load_model(preset)
    flops = nemo_model_flops_per_token(m.layers, m.hidden, m.heads, m.query_groups, m.ffn_hidden, m.vocab, seq)
    return (gbs * seq * flops / (float(row["model_tflops_per_gpu"]) * 1e12 * gpus),
            "gbs*seq*F/(model_tflops_per_gpu*1e12*gpus), F = NeMo llama FLOPs/token, non-causal attention "
            "(nemo/utils/flops_formulas.py @e1335c8378)")


def _source(row: dict) -> dict:
    title = f"NeMo performance summary ({row['release']} container, {row['system']}, {row['table']} table)"
    if not row.get("commit"):
        return {"title": title, "url": row["url"], "how": "typed from the page"}
    return {"title": title, "repo": "NVIDIA/NeMo", "file": row["file"], "commit": row["commit"], "line": int(row["line"]),
            **({"batch_from": row["gbs_from"]} if row.get("gbs_from") else {})}


def record(row: dict) -> dict | str:
    """The row as a measured_runs.yaml record, or why it cannot be one."""
    preset = MODELS.get(row["model"])
    if preset is None:
        return f"no model preset for {row['model']}"
    if row["system"] not in SYSTEMS:
        return f"no system preset for {row['system']}"
    if not row["gbs"]:
        return "global batch not printed"
    if row.get("fsdp") == "1":
        # NeMo 25.04's FSDP is Megatron-FSDP; the loader reads a sharding degree only from Bridge records
        return "FSDP row (a measured_runs record states no FSDP)"
    gpus, gbs, seq = int(row["gpus"]), int(row["gbs"]), int(row["seq"])
    tp, pp, cp = int(row["tp"]), int(row["pp"]), int(row["cp"])
    if row.get("dp") and tp * pp * cp * int(row["dp"]) != gpus:
        return "printed tp·pp·cp·dp is not the GPU count"
    if row.get("ga") and gbs != int(row["mbs"]) * gpus // (tp * pp * cp) * int(row["ga"]):
        return "printed GA is not gbs/(mbs·dp)"  # a check on the hand-typed docs rows too
    parallel_extra = {}
    if row["table"] == "docs pre-training" and row["precision"].upper().startswith("FP8"):
        parallel_extra["fp8_param_gather"] = True  # NEMO2_FP8_PARAM_GATHER
    model = preset_model_block(preset, row["model"], seq)
    # as the in-sample nemo2407 records: tied embeddings stated, biases left to the loader's default
    model.pop("biases", None)
    if load_model(preset).tied_embeddings:
        model["tied_embeddings"] = True
    step, how = _step_time(row, gbs, seq, gpus, preset)
    vpp = int(row["vp"]) if row["vp"] and int(row["vp"]) > 1 else None
    measured = {"model_tflops_per_gpu": float(row["model_tflops_per_gpu"])} if row["model_tflops_per_gpu"] else {}
    if row["tokens_per_s_per_gpu"]:
        measured["tokens_per_sec_per_gpu"] = float(row["tokens_per_s_per_gpu"])
    return {"id": row_id(row),
            "source": _source(row),
            "model": model,
            "system": {**SYSTEMS[row["system"]], "gpus": gpus},
            "parallel": {"tp": tp, "pp": pp, "cp": cp, "ep": int(row.get("ep") or 1), "dp": gpus // (tp * pp * cp),
                         "vpp": vpp,
                         "microbatch": int(row["mbs"]) if row["mbs"] else None, "global_batch": gbs,
                         "sequence_parallel": "likely (NeMo default when tp>1; not stated)", "recompute": None,
                         "distributed_optimizer": "likely (NeMo default; not stated)", **parallel_extra},
            "precision": f"{row['precision'].lower()} (Transformer Engine)",
            "measured": measured,
            "derived": {"iteration_time_s": round(step, 4), "how": how},
            "notes": f"{row['release']} {row['table']}"}


def records() -> tuple[list[dict], dict[str, int]]:
    return build_records([*csv.DictReader(DATA.open()), *csv.DictReader(DOCS_DATA.open())], record)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--write-yaml", type=Path, help="also keep the records as a measured_runs.yaml-style file")
    args = ap.parse_args()
    recs, skipped = records()
    cases, not_read = read_back(recs, args.write_yaml)
    table_of = {r["id"]: r["notes"] for r in recs}
    errors: dict[str, list[float]] = {}
    for c in sorted(cases, key=lambda c: c.id):
        p = predict(c)
        err = p["step_time_s"] / c.measured_step_s - 1
        fits = "" if p["violations"] == 0 else "  (model: does not fit / breaks a rule)"
        print(f"{c.id[:72]:72s} {c.plan.short()[:40]:40s} meas {c.measured_step_s:8.3f} "
              f"pred {p['step_time_s']:8.3f} {err:+7.1%}{fits}")
        errors.setdefault(f"{c.model.name} {c.system.accelerator.name} {table_of[c.id]}", []).append(err)
    print()
    for group, v in sorted(errors.items()):
        print(f"{group:40s} {len(v):3d} rows  mean |err| {statistics.mean(abs(e) for e in v):6.1%}  "
              f"mean err {statistics.mean(v):+6.1%}  max |err| {max(abs(e) for e in v):6.1%}")
    allerr = [e for v in errors.values() for e in v]
    print(f"all {len(allerr)} rows: mean |err| {statistics.mean(abs(e) for e in allerr):.1%}, "
          f"max {max(abs(e) for e in allerr):.1%}; not built: {skipped}; not read by the loader: "
          f"{len(not_read)} ({sorted({s.reason for s in not_read})[:5]})")


if __name__ == "__main__":
    main()
