"""The plan-family evidence table (planner/evidence.py) is what the reference data says today,
and `planner plan` shows it."""
from __future__ import annotations

import json

from typer.testing import CliRunner

from planner.cli.app import app
from planner.evidence import EVIDENCE_FILE, evidence_note, family_of_plan, load_table
from planner.model import load_model
from planner.plan import Plan


def test_evidence_table_is_current(reference_accuracy_rows):
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    from evidence import current_table  # bench/evidence.py
    table = current_table(reference_accuracy_rows)
    assert json.loads(EVIDENCE_FILE.read_text()) == json.loads(json.dumps(table)), \
        "stale: run PYTHONPATH=. python bench/evidence.py --write"


def test_families_and_notes():
    moe, dense = load_model("qwen3-235b-a22b"), load_model("llama3-8b")
    fsdp_no_ep = Plan(dp=256, micro_batch=8, global_batch=2048, zero_stage=3)
    assert family_of_plan(True, fsdp_no_ep) == "MoE · ZeRO-3/FSDP · no pipeline · no expert parallelism"
    assert "no published run" in evidence_note(moe, fsdp_no_ep)  # nobody measured it
    pipe = Plan(pp=8, dp=32, ep=32, vpp=4, micro_batch=1, global_batch=2048)
    table = load_table()
    fam = family_of_plan(True, pipe)
    assert table[fam]["runs"] >= 50
    assert f"{table[fam]['runs']} published runs" in evidence_note(moe, pipe)
    assert family_of_plan(False, Plan(dp=8, global_batch=8)) == "dense · replicated weights (ZeRO-0/1/2) · no pipeline"
    assert evidence_note(dense, Plan(dp=8, global_batch=8)).startswith("Evidence: ")


def test_plan_json_carries_the_evidence():
    r = CliRunner().invoke(app, ["plan", "-m", "llama3-8b", "-s", "h100-sxm", "-g", "8", "-b", "64", "--top", "1",
                                 "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["plans"][0]["evidence"].startswith("Evidence: ")


def test_published_jobs_table_is_current(reference_accuracy_rows):
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    from evidence import current_jobs  # bench/evidence.py
    from planner.evidence import JOBS_FILE
    assert json.loads(JOBS_FILE.read_text()) == json.loads(json.dumps(current_jobs(reference_accuracy_rows))), \
        "stale: run PYTHONPATH=. python bench/evidence.py --write"


def test_plan_names_the_published_run_of_the_same_job():
    """Qwen3-235B, 256 GB200, batch 8192, MXFP8 is a job Megatron-Bridge published (bridge_runs.yaml,
    five releases): `planner plan` names the fastest run, its layout and measured time, and sets the
    plan's prediction against it; a job nobody published gets no such line. (The published runs
    are the job's, whatever the plan: the layout is pinned to the recipe's to keep the search short.)"""
    args = ["plan", "-m", "qwen3-235b-a22b", "-s", "gb200-nvl72", "-g", "256", "-b", "8192", "--dtype", "mxfp8",
            "--top", "1", "--tp", "1", "--pp", "8", "--ep", "32", "--vpp", "3"]
    r = CliRunner().invoke(app, args + ["--json"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.output)
    runs = data["published_runs"]
    assert runs[0]["id"] == "bridge_26.06_Qwen3_235B_a22B_DGX-GB200_MXFP8_256gpu_gbs8192"
    assert runs[0]["measured_s"] == 17.77 and [x["measured_s"] for x in runs] == sorted(x["measured_s"] for x in runs)
    text = CliRunner().invoke(app, args).output
    assert "Published run of this job: bridge_26.06_Qwen3" in " ".join(text.split())
    other = CliRunner().invoke(app, ["plan", "-m", "llama3-8b", "-s", "h100-sxm", "-g", "8", "-b", "64", "--top", "1",
                                     "--json"])
    assert json.loads(other.output)["published_runs"] == []


def test_published_job_note_flags_a_claim_beyond_the_limit():
    from planner.evidence import CLAIM_LIMIT, published_job_note
    model = load_model("qwen3-235b-a22b")
    args = (model, "GB200-186GB", 256, 8192, "mxfp8")
    measured = 17.77  # bridge_26.06 Qwen3-235B on 256 GB200, the fastest published run of the job
    assert "1.00× that measurement." in published_job_note(*args, measured)
    assert "a model claim" not in published_job_note(*args, (1 - CLAIM_LIMIT) * measured * 1.001)
    assert "a model claim" in published_job_note(*args, (1 - CLAIM_LIMIT) * measured * 0.999)
    assert published_job_note(model, "GB200-186GB", 256, 4096, "mxfp8", 10.0) == ""  # no run of that batch


def test_a_faster_published_run_on_a_dispatcher_not_searched_says_how_to_search_it():
    """`planner plan` on Qwen3-235B / 256 GB200 recommended a plan 1.17x the published run's time
    without saying why: that run uses DeepEP (deepep), a job setting the search had not been given."""
    from planner.evidence import published_job_note
    model = load_model("qwen3-235b-a22b")
    args = (model, "GB200-186GB", 256, 8192, "mxfp8")
    slower = published_job_note(*args, 20.8, 1.0, "alltoall")
    assert "uses the deepep MoE dispatcher" in slower and "add --moe-dispatcher deepep" in slower
    assert "--moe-dispatcher" not in published_job_note(*args, 20.8, 1.0, "deepep")  # given: nothing to add
    assert "--moe-dispatcher" not in published_job_note(*args, 17.0, 1.0, "alltoall")  # faster already
