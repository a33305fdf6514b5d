"""Extract the Megatron-Bridge performance-summary pre-training rows (not the SFT / LoRA tables)
that ../shared/reference/bridge_runs.yaml does not hold (other models, GB300/B300, later releases): the held-out check of
bench/heldout_bridge.py. Reads the Bridge git history (a local mirror, not needed by CI) and
writes bench/data/bridge_heldout.csv; every row keeps its commit, file and line.

    python bench/extract_bridge_heldout.py --repo /path/to/Megatron-Bridge.git [--commit SHA]
"""
from __future__ import annotations

import argparse
import re
import subprocess
from pathlib import Path

import yaml

from heldout_bridge import row_id, write_csv

FILES = ("docs/performance-summary.md", "docs/performance-summary-archive.md")
OUT = Path(__file__).resolve().parent / "data" / "bridge_heldout.csv"
COLUMNS = {"System": "system", "Model": "model", "#-GPUs": "gpus", "Precision": "precision", "GBS": "gbs",
           "MBS": "mbs", "Sequence Length": "seq", "FSDP": "fsdp", "TP": "tp", "PP": "pp", "CP": "cp", "VP": "vp",
           "EP": "ep", "ETP": "etp", "GA": "ga", "Tokens / sec / GPU": "tokens_per_s_per_gpu",
           "Model TFLOP / sec / GPU": "model_tflops_per_gpu"}
FIELDS = ["release", "model", "system", "gpus", "precision", "gbs", "mbs", "seq", "fsdp", "tp", "pp", "cp", "vp",
          "ep", "etp", "ga", "tokens_per_s_per_gpu", "model_tflops_per_gpu", "commit", "file", "line"]


def rows_of(text: str, commit: str, path: str):
    release, section = None, {}
    header = None
    pretraining = True  # the tables under "### SFT Performance" / "### LoRA Performance" are fine-tuning
    for n, line in enumerate(text.splitlines(), start=1):
        m = re.match(r"^## (\S+) NeMo Container", line)
        if m:
            release, section, header, pretraining = m.group(1), {}, None, True
            continue
        m = re.match(r"^### (.+?)\s*$", line)
        if m:
            pretraining = "pre-training" in m.group(1).lower()
            header = None
            continue
        if not pretraining:
            continue
        m = re.match(r"^#### (Model|System): (.+?)\s*$", line)
        if m:
            section = {m.group(1).lower(): m.group(2).strip()}
            header = None
            continue
        if not line.startswith("|") or release is None:
            header = None if not line.startswith("|") else header
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if header is None:
            header = [COLUMNS.get(c, c) for c in cells]
            continue
        if set(line) <= set("|-: "):
            continue
        row = {**section, **dict(zip(header, cells))}
        row.update(release=release, commit=commit, file=path, line=n)
        yield row


def in_reference(row: dict, reference_ids: set[str]) -> bool:
    """Whether bridge_runs.yaml holds the row (its id convention: heldout_bridge.row_id)."""
    return row_id(row) in reference_ids


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repo", required=True)
    ap.add_argument("--commit", default="HEAD")
    ap.add_argument("--reference", default=str(Path(__file__).resolve().parents[2] / "shared" / "reference"
                                               / "bridge_runs.yaml"))
    args = ap.parse_args()
    commit = subprocess.run(["git", "--git-dir", args.repo, "rev-parse", args.commit], capture_output=True,
                            text=True, check=True).stdout.strip()
    ref_ids = {r["id"] for r in yaml.safe_load(Path(args.reference).read_text())["records"]}
    out = []
    for path in FILES:
        text = subprocess.run(["git", "--git-dir", args.repo, "show", f"{commit}:{path}"], capture_output=True,
                              text=True, check=True).stdout
        for row in rows_of(text, commit, path):
            if {"model", "system", "precision", "gpus", "gbs"} <= set(row) and not in_reference(row, ref_ids):
                out.append(row)
    write_csv(OUT, FIELDS, out)
    print(f"{len(out)} rows not in {args.reference} -> {OUT}")


if __name__ == "__main__":
    main()
