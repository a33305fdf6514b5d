"""Extract the NeMo performance-summary pre-training rows (not the SFT / LoRA tables) that
../shared/reference/measured_runs.yaml does not hold: the held-out check of bench/heldout_nemo.py.
Reads every revision of the two NeMo documents that carry measured pre-training tables, from the
NeMo git history (a local mirror, not needed by CI), and writes bench/data/nemo_heldout.csv;
every row keeps its commit, file and line.

- docs/source/performance/performance_summary.md: markdown tables, one per container/system.
  In NVIDIA/NeMo it only ever held the 24.07 DGX-H100 tables (first 7831735490, 2024-08-12;
  emptied by a2aa70a228, 2024-12-12, which points the README at docs.nvidia.com instead), so
  the later releases' tables are not in this repository's history.
- docs/source/performance/performance_long_sequence.md: HTML tables of long-context
  pre-training with context parallelism (24.03 DGX-H100 Llama-2 7B, 25.04 DGX-B200 Llama-3 8B);
  they print model TFLOP/s per GPU, not tokens/s, and only the "with CP" columns carry a layout.

A row is dropped when measured_runs.yaml holds the same run (a `nemo2407` record with the same
model, GPU count, batch, layout and the same printed numbers); a row repeated unchanged in later
revisions keeps its first commit.

    python bench/extract_nemo_heldout.py --repo /path/to/NeMo.git
"""
from __future__ import annotations

import argparse
import html
import re
import subprocess
from pathlib import Path

import yaml

from heldout_bridge import write_csv

SUMMARY = "docs/source/performance/performance_summary.md"
LONG_SEQUENCE = "docs/source/performance/performance_long_sequence.md"
OUT = Path(__file__).resolve().parent / "data" / "nemo_heldout.csv"
COLUMNS = {"Model": "model", "#-GPUs": "gpus", "GBS": "gbs", "MBS": "mbs", "Sequence Length": "seq", "TP": "tp",
           "PP": "pp", "CP": "cp", "VP": "vp", "EP": "ep", "Tokens / sec / GPU": "tokens_per_s_per_gpu",
           "Model TFLOP / sec / GPU": "model_tflops_per_gpu"}
FIELDS = ["release", "table", "model", "system", "gpus", "precision", "gbs", "mbs", "seq", "tp", "pp", "cp", "dp",
          "vp", "ep", "tokens_per_s_per_gpu", "model_tflops_per_gpu", "commit", "file", "line", "gbs_from"]
# what makes two rows the same measurement (the printed numbers included); the GPU count and batch
# are left out: the long-sequence B200 table's later revisions print 4x the GPUs of its first
# (2 GPUs at tp1 cp1 dp2) for the same layout and TFLOP/s, and the 2024 tables print no batch
SAME = ("table", "release", "model", "system", "precision", "mbs", "seq", "tp", "pp", "cp", "dp", "vp", "ep",
        "tokens_per_s_per_gpu", "model_tflops_per_gpu")


def _git(repo: str, *args: str) -> str:
    return subprocess.run(["git", "--git-dir", repo, *args], capture_output=True, text=True, check=True).stdout


def _number(text: str) -> str:
    """A printed number without its thousands separators or markdown link: '[888](url)' -> '888'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text).replace("*", "").replace(",", "").strip()
    return text


def summary_rows(text: str, commit: str):
    """Pre-training rows of one revision of performance_summary.md."""
    release = system = precision = None
    header, pretraining = None, False
    for n, line in enumerate(text.splitlines(), start=1):
        m = re.match(r"^#+\s*(.+?)\s*$", line)
        if m and not line.startswith("|"):
            pretraining = "pretrain" in m.group(1).lower().replace("-", "")
            header = None
            continue
        if not pretraining:
            continue
        m = re.search(r"Container:\s*\[?NeMo\s*([0-9.]+)", line)
        if m:
            release = m.group(1).rstrip(".")
        m = re.search(r"System:\s*(\S+)", line)
        if m:
            system = m.group(1)
        m = re.search(r"\b(FP8|BF16)\b precision", line)
        if m:
            precision = m.group(1)
        if not line.startswith("|"):
            header = None
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if header is None:
            header = [COLUMNS.get(c, c) for c in cells]
            continue
        if set(line.strip()) <= set("|-: "):
            continue
        row = {k: _number(v) for k, v in zip(header, cells) if k in FIELDS}
        row.update(table="summary", release=release, system=system, precision=precision, commit=commit,
                   file=SUMMARY, line=n)
        yield row


LONG_COLUMNS = {"SeqLen (K)": "seq_k", "# of GPUs": "gpus", "Batch Size": "gbs", "TP": "tp", "PP": "pp", "CP": "cp",
                "DP": "dp", "TFLOPS / GPU": "model_tflops_per_gpu"}
# the HTML tables' cells: with a batch-size column (2025-05 on) and without (2024)
HTML_CELLS = {10: ("seq_k", "gpus", "gbs", "no_cp", "tp", "pp", "dp", "cp", "model_tflops_per_gpu", "speedup"),
              9: ("seq_k", "gpus", "no_cp", "tp", "pp", "dp", "cp", "model_tflops_per_gpu", "speedup")}


def _long_row(cells: dict, context: dict, commit: str, line: int) -> dict:
    row = {"table": "long-sequence", **context, "gbs": cells.get("gbs", ""), "mbs": "",
           "seq": str(int(cells["seq_k"]) * 1024), "gpus": cells["gpus"], "tp": cells["tp"], "pp": cells.get("pp", "1"),
           "cp": cells["cp"], "dp": cells["dp"], "vp": "", "ep": "", "tokens_per_s_per_gpu": "",
           "model_tflops_per_gpu": cells["model_tflops_per_gpu"], "commit": commit, "file": LONG_SEQUENCE, "line": line}
    return row


def long_sequence_rows(text: str, commit: str):
    """The "with CP" rows of one revision of performance_long_sequence.md (markdown or HTML
    tables: sequence length in K tokens, GPUs, batch size where printed, TP, PP, DP, CP, model
    TFLOP/s per GPU; the "without CP" column has no layout and is not kept)."""
    context = {"model": None, "system": None, "release": None, "precision": None}
    lines, header, n = text.splitlines(), None, 0
    while n < len(lines):
        line = lines[n]
        m = re.match(r"^##\s+(\S+)\s+\((FP8|BF16)\)", line)
        if m:
            context.update(model=m.group(1), precision=m.group(2), system=None, release=None)
        m = re.search(r"Container:\s*\[?NeMo\s*([0-9.]+[0-9])", line)
        if m:
            context["release"] = m.group(1)
        m = re.search(r"System:\s*(\S+)", line)
        if m:
            context["system"] = m.group(1)
        if line.startswith("|") and context["model"]:
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if header is None:
                header = [LONG_COLUMNS.get(c, c) for c in cells]
            elif not set(line.strip()) <= set("|-: "):
                yield _long_row({k: _number(v) for k, v in zip(header, cells)}, context, commit, n + 1)
        else:
            header = None
        if line.strip().startswith("<tr") and context["model"]:
            start, cells = n + 1, []
            while "</tr>" not in lines[n]:
                cells += re.findall(r"<td[^>]*>(.*?)</td>", lines[n])
                n += 1
            cells += re.findall(r"<td[^>]*>(.*?)</td>", lines[n])
            cells = [_number(html.unescape(re.sub(r"<[^>]+>", "", c))) for c in cells]
            if len(cells) in HTML_CELLS:
                yield _long_row(dict(zip(HTML_CELLS[len(cells)], cells)), context, commit, start)
        n += 1


def _reference_keys(path: Path) -> set[tuple]:
    """(model, gpus, gbs, mbs, seq, tp, pp, cp, vp, tokens/s, TFLOP/s) of every nemo2407 record."""
    keys = set()
    for r in yaml.safe_load(path.read_text())["records"]:
        if not str(r["id"]).startswith("nemo2407"):
            continue
        p, m = r["parallel"], r["measured"]
        keys.add((r["model"]["name"].upper(), int(r["system"]["gpus"]), int(p["global_batch"]), int(p["microbatch"]),
                  int(r["model"]["seq"]), int(p["tp"]), int(p["pp"]), int(p["cp"]), int(p["vpp"] or 1),
                  str(m["tokens_per_sec_per_gpu"]), str(m["model_tflops_per_gpu"])))
    return keys


def _key(row: dict) -> tuple:
    return (row["model"].upper(), int(row["gpus"]), int(row["gbs"]), int(row["mbs"] or 0), int(row["seq"]),
            int(row["tp"]), int(row["pp"]), int(row["cp"]), int(row["vp"] or 1), row["tokens_per_s_per_gpu"],
            row["model_tflops_per_gpu"])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repo", required=True)
    ap.add_argument("--reference", default=str(Path(__file__).resolve().parents[2] / "shared" / "reference"
                                               / "measured_runs.yaml"))
    args = ap.parse_args()
    ref = _reference_keys(Path(args.reference))
    seen, out, in_ref = {}, [], 0
    for path, parse in ((SUMMARY, summary_rows), (LONG_SEQUENCE, long_sequence_rows)):
        # oldest first, so a row repeated unchanged keeps the commit that first printed it
        commits = _git(args.repo, "log", "--all", "--reverse", "--date-order", "--format=%H", "--", path).split()
        for commit in commits:
            try:
                text = _git(args.repo, "show", f"{commit}:{path}")
            except subprocess.CalledProcessError:
                continue  # the commit deleted the file
            for row in parse(text, commit):
                same = tuple(row.get(k) or "" for k in SAME)
                if same in seen:
                    first = seen[same]
                    if not first["gbs"] and row["gbs"]:
                        # the 2024 long-sequence tables print no batch; a later revision of the
                        # same measurement does: the row keeps its first commit, and says where
                        # the batch was read
                        first.update(gbs=row["gbs"], gbs_from=f"{row['commit']}:{row['line']}")
                    continue
                seen[same] = row
                if row["table"] == "summary" and _key(row) in ref:
                    in_ref += 1
                    continue
                out.append(row)
    write_csv(OUT, FIELDS, out)
    print(f"{len(out)} rows not in {args.reference} ({in_ref} in it) -> {OUT}")


if __name__ == "__main__":
    main()
