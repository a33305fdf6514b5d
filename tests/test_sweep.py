"""`planner sweep` and planner.sweep: grids, rows == search.plan per point, CSV/plots, one-line errors."""
import csv
import importlib.util
import json
import math

import pytest
from typer.testing import CliRunner

from hardware import load_system
from hardware.errors import SpecError
from planner import search
from planner.cli import app
from planner.model import load_model
from planner.plan import JobSpec
from planner.sweep import (
    ALLOWED,
    INFINITE_GB_PER_S,
    RESULT_COLUMNS,
    Axis,
    SweepSpec,
    apply_params,
    build_points,
    run_sweep,
)
from tests.conftest import one_line_error

runner = CliRunner()

TINY = """name: tiny
layers: 8
hidden: 1024
heads: 16
seq_length: 1024
vocab: 32000
"""
COMPARED = ["feasible", "plan", "tp", "pp", "dp", "cp", "vpp", "micro_batch", "global_batch", "recompute",
            "step_time_s", "mfu", "tokens_per_s", "hbm_used_gib", "offload_used_gib"]


@pytest.fixture
def tiny(tmp_path):
    path = tmp_path / "tiny.yaml"
    path.write_text(TINY)
    return str(path)


# ---- value syntax ------------------------------------------------------------------------------

def test_axis_values():
    assert Axis.parse("gpus", "4096:16384:x2").values == [4096, 8192, 16384]
    assert Axis.parse("gpus", "8,16, 32").values == [8, 16, 32]
    assert Axis.parse("offload_gib", "256:1024:256").values == [256.0, 512.0, 768.0, 1024.0]
    assert Axis.parse("offload_gib", "0,512").values == [0.0, 512.0]
    bw = Axis.parse("offload_gb_per_s", "50,100,inf").values
    assert bw[:2] == [50.0, 100.0] and math.isinf(bw[2])
    assert Axis.parse("nvlink_domain", "8,16:64:x2").values == [8, 16, 32, 64]
    assert Axis.parse("model", "seed-2t,seed-4t").values == ["seed-2t", "seed-4t"]
    assert Axis.from_cli("max_batch=1536,3072").values == [1536, 3072]


@pytest.mark.parametrize("name, text, words", [
    ("bogus", "1,2", ["unknown parameter", ALLOWED]),
    ("gpus", "", ["no values"]),
    ("gpus", "16:8:x2", ["empty"]),
    ("gpus", "8:16:x1", ["factor"]),
    ("gpus", "8:16:0", ["step"]),
    ("gpus", "eight", ["not a number"]),
    ("gpus", "8.5", ["not an integer"]),
    ("gpus", "inf", ["only allowed for offload_gb_per_s"]),
    ("hbm_gib", "-80", ["positive"]),
    ("gpus", "8,8", ["repeated"]),
    ("model", "a:b:c", ["not a range"]),
])
def test_axis_errors(name, text, words):
    with pytest.raises(SpecError) as err:
        Axis.parse(name, text)
    for w in words:
        assert w in str(err.value)


# ---- rows == search.plan at every point ------------------------------------------------------

def test_rows_equal_search_plan_at_each_point(tiny):
    job = JobSpec(max_global_batch=256)
    spec = SweepSpec.build(model=tiny, system="h100-sxm", job=job,
                           axes=[Axis.parse("gpus", "4,8,16"), Axis.parse("nvlink_domain", "4,8")])
    rows = run_sweep(spec, workers=1)
    assert [(r["gpus"], r["nvlink_domain"]) for r in rows] == [(g, d) for d in (4, 8) for g in (4, 8, 16)]
    model, base = load_model(tiny), load_system("h100-sxm")
    for r in rows:
        # the variant built by hand, independently of apply_params
        tiers = [t.model_dump() for t in base.network]
        tiers[0]["domain_gpus"] = r["nvlink_domain"]
        system = base.with_changes(num_gpus=r["gpus"], network=tiers)
        best = search.plan(model, system, job, top_k=1).best
        assert best is not None and r["feasible"] is True
        assert r["plan"] == best.plan.short() and r["num_gpus"] == r["gpus"]
        assert r["step_time_s"] == pytest.approx(best.estimate.step_time_s, rel=1e-12)
        assert r["mfu"] == pytest.approx(best.estimate.mfu, rel=1e-12)
        assert r["tokens_per_s"] == pytest.approx(best.estimate.tokens_per_s, rel=1e-12)
        assert r["hbm_used_gib"] == pytest.approx(best.estimate.hbm_bytes / 2**30)
        assert r["global_batch"] == best.plan.global_batch <= 256


def test_parallel_workers_give_the_same_rows(tiny):
    spec = SweepSpec.build(model=tiny, system="h100-sxm", job=JobSpec(max_global_batch=256),
                           axes=[Axis.parse("gpus", "4,8")])
    serial = run_sweep(spec, workers=1)
    parallel = run_sweep(spec, workers=2)
    assert [{k: r[k] for k in COMPARED} for r in serial] == [{k: r[k] for k in COMPARED} for r in parallel]


def test_variants_of_memory_and_network():
    model, system, job = load_model("llama3-8b"), load_system("h100-offload-1tib"), JobSpec()
    _, s, _ = apply_params(model, system, job, {"hbm_gib": 120.0, "offload_gb_per_s": math.inf})
    assert s.accelerator.hbm_capacity_gib == 120 and s.offload.bandwidth_gb_per_s == INFINITE_GB_PER_S
    assert s.offload.capacity_gib == 1024
    _, s, _ = apply_params(model, system, job, {"offload_gib": 0.0})
    assert s.offload is None
    _, s, _ = apply_params(model, load_system("h100-sxm"), job, {"offload_gib": 256.0})
    assert s.offload.capacity_gib == 256 and s.offload.bandwidth_gb_per_s == 100
    _, s, j = apply_params(model, system, job, {"nvlink_domain": 16, "max_batch": 512, "gpus": 64})
    assert s.nvlink_domain_gpus == 16 and s.num_gpus == 64 and j.max_global_batch == 512
    m, _, _ = apply_params(None, system, job, {"model": "llama3-70b"})
    assert m.name == "llama3-70b"
    with pytest.raises(SpecError, match="nvlink_domain"):  # NVLink domain larger than the next tier
        apply_params(model, system, job, {"nvlink_domain": 2**21})
    with pytest.raises(SpecError, match="exceeds max_batch"):
        apply_params(model, system, JobSpec(global_batch=1024), {"max_batch": 512})


def test_infeasible_point_has_a_reason(tiny):
    spec = SweepSpec.build(model=tiny, system="h100-sxm", gpus=8, job=JobSpec(max_global_batch=64),
                           axes=[Axis.parse("hbm_gib", "2.1,80")], explain=False)
    rows = run_sweep(spec, workers=1)
    assert rows[0]["feasible"] is False and rows[0]["reason"] and rows[0]["plan"] == ""
    assert rows[1]["feasible"] is True and rows[1]["mfu"] > 0
    points = build_points(spec)
    assert search.plan(points[0].model, points[0].system, points[0].job, top_k=1).best is None


# ---- the CLI ---------------------------------------------------------------------------------

def _sweep(tiny, out, *extra):
    return runner.invoke(app, ["sweep", "-m", tiny, "-s", "h100-sxm", "--max-global-batch", "256",
                               "--vary", "gpus=4:16:x2", "--vary", "nvlink_domain=4,8", "-j", "1",
                               "--out", str(out), *extra])


def test_cli_writes_csv_and_plots(tiny, tmp_path):
    out = tmp_path / "out"
    result = _sweep(tiny, out)
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output
    with (out / "sweep.csv").open() as fh:
        table = list(csv.DictReader(fh))
    assert list(table[0]) == ["gpus", "nvlink_domain"] + RESULT_COLUMNS
    assert len(table) == 6
    assert [(r["gpus"], r["nvlink_domain"]) for r in table] == [
        (g, d) for d in ("4", "8") for g in ("4", "8", "16")]
    assert all(r["feasible"] == "True" and 0 < float(r["mfu"]) < 1 for r in table)
    for ext in ("png", "svg"):
        assert (out / f"sweep.{ext}").stat().st_size > 1000
    assert (out / "sweep.png").read_bytes()[:4] == b"\x89PNG"
    assert "<svg" in (out / "sweep.svg").read_text()[:2000]


def test_cli_json_and_model_axis(tiny, tmp_path):
    result = runner.invoke(app, ["sweep", "-s", "h100-sxm", "-g", "8", "--vary", f"model={tiny},llama3-8b",
                                 "--vary", "offload_gb_per_s=50,inf", "--out", str(tmp_path), "-j", "1",
                                 "--name", "m", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["columns"][0] == "offload_gb_per_s" and "model" in data["columns"]
    assert [(r["model"], r["offload_gb_per_s"]) for r in data["rows"]] == [
        (tiny, 50.0), ("llama3-8b", 50.0), (tiny, "inf"), ("llama3-8b", "inf")]
    assert (tmp_path / "m.csv").exists() and (tmp_path / "m.png").exists() and (tmp_path / "m.svg").exists()


def test_cli_refuses_to_overwrite(tiny, tmp_path):
    (tmp_path / "sweep.png").write_bytes(b"my precious plot")
    one_line_error(_sweep(tiny, tmp_path), "already exists", "--force")
    assert (tmp_path / "sweep.png").read_bytes() == b"my precious plot"
    assert not (tmp_path / "sweep.csv").exists()
    result = _sweep(tiny, tmp_path, "--force")
    assert result.exit_code == 0, result.output
    assert (tmp_path / "sweep.png").read_bytes()[:4] == b"\x89PNG"


def test_a_dotted_name_writes_its_own_plots_and_keeps_the_users(tiny, tmp_path):
    """--name run.v1 writes run.v1.png / .svg (the files it reports and the overwrite check
    guards), never run.png: that was cut from the name and written over without a word."""
    (tmp_path / "run.png").write_bytes(b"my precious plot")
    sweep = lambda *extra: runner.invoke(app, ["sweep", "-m", tiny, "-s", "h100-sxm", "-g", "8", "--vary",  # noqa: E731
                                               "hbm_gib=80", "-j", "1", "--out", str(tmp_path), *extra])
    result = sweep("--name", "run.v1")
    assert result.exit_code == 0, result.output
    assert (tmp_path / "run.png").read_bytes() == b"my precious plot" and not (tmp_path / "run.svg").exists()
    assert (tmp_path / "run.v1.png").read_bytes()[:4] == b"\x89PNG" and (tmp_path / "run.v1.svg").exists()
    (tmp_path / "run.v2.svg").write_text("mine")
    one_line_error(sweep("--name", "run.v2"), "already exists")
    assert (tmp_path / "run.v2.svg").read_text() == "mine"


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_bad_thread_count_is_refused_before_any_output(tiny, tmp_path, workers):
    """-j 2's workers set their own count, so PARPLAN_THREADS=abc went unread there and was refused
    only after an empty output folder was made with -j 1."""
    out = tmp_path / "out"
    result = runner.invoke(app, ["sweep", "-m", tiny, "-s", "h100-sxm", "--vary", "gpus=4,8", "-j", workers,
                                 "--out", str(out)], env={"PARPLAN_THREADS": "abc"})
    one_line_error(result, "PARPLAN_THREADS", "from 1 to")
    assert not out.exists()


def test_dollar_signs_in_a_models_name_are_drawn_as_text(tmp_path):
    """matplotlib reads $...$ as mathtext; a name like run_$1_$2 made the plot an internal error
    after the whole grid had been solved."""
    path = tmp_path / "dollars.yaml"
    path.write_text(TINY.replace("name: tiny", 'name: "run_$1_$2"'))
    result = runner.invoke(app, ["sweep", "-m", str(path), "-s", "h100-sxm", "-g", "8", "--vary", "hbm_gib=80",
                                 "-j", "1", "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    assert "run_$1_$2" in (tmp_path / "out" / "sweep.svg").read_text()


@pytest.mark.parametrize("args, words", [
    (["--vary", "bogus=1,2"], ["unknown parameter 'bogus'", ALLOWED]),
    (["--vary", "gpus"], ["NAME=VALUES", ALLOWED]),
    (["--vary", "gpus=16:8:x2"], ["empty"]),
    (["--vary", "gpus="], ["no values"]),
    (["--vary", "hbm_gib=lots"], ["not a number"]),
    (["--vary", "gpus=8,16", "--vary", "hbm_gib=80", "--vary", "nvlink_domain=8"], ["at most two", ALLOWED]),
    (["--vary", "gpus=8", "--vary", "gpus=16"], ["twice"]),
    (["--vary", "model=llama3-8b"], ["not both"]),
    (["--vary", "model=nope-7b", "--model", ""], ["model", "unknown preset"]),
    (["--vary", "gpus=8", "--framework", "jax"], ["framework"]),
    (["--vary", "gpus=8", "--workers", "0"], ["workers"]),
    (["--vary", "gpus=8", "--global-batch", "0"], ["global-batch"]),
    (["--vary", "max_batch=512", "--global-batch", "1024"], ["max_batch is varied", "--global-batch"]),
    (["--vary", "max_batch=2048", "--global-batch", "1024"], ["max_batch is varied", "--global-batch"]),
])
def test_cli_bad_specs_are_one_line(tiny, tmp_path, args, words):
    base = ["sweep", "-s", "h100-sxm", "--out", str(tmp_path / "o")]
    if "--model" not in args:
        base += ["-m", tiny]
    else:
        args = [a for a in args if a not in ("--model", "")]
    one_line_error(runner.invoke(app, base + args), *words)
    assert not (tmp_path / "o" / "sweep.csv").exists()


def test_cli_needs_a_model(tmp_path):
    one_line_error(runner.invoke(app, ["sweep", "--vary", "gpus=8", "--out", str(tmp_path)]), "model")


@pytest.mark.skipif(importlib.util.find_spec("ray") is not None, reason="ray is installed")
def test_ray_missing_is_one_line(tiny, tmp_path):
    one_line_error(_sweep(tiny, tmp_path, "--ray", "auto"), "pip install ray")


@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="ray is not installed")
def test_ray_local_cluster(tiny):  # pragma: no cover - only where ray is installed
    import ray
    ray.init(num_cpus=1, include_dashboard=False)
    try:
        spec = SweepSpec.build(model=tiny, system="h100-sxm", job=JobSpec(max_global_batch=256),
                               axes=[Axis.parse("gpus", "4,8")])
        local, remote = run_sweep(spec, workers=1), run_sweep(spec, ray_address="auto")
        assert [{k: r[k] for k in COMPARED} for r in local] == [{k: r[k] for k in COMPARED} for r in remote]
    finally:
        ray.shutdown()


def test_one_model_file_named_two_ways_is_swept_once(tiny, tmp_path, monkeypatch):
    """m.yaml and ./m.yaml were two points of the model axis with the same rows (input audit)."""
    monkeypatch.chdir(tmp_path)
    one_line_error(runner.invoke(app, ["sweep", "-s", "h100-sxm", "-g", "8", "--vary", f"model={tiny},./tiny.yaml",
                                       "--out", str(tmp_path / "out")]), "named twice", "two paths")
    assert not (tmp_path / "out").exists()


def test_csv_results_keep_every_digit(tiny, tmp_path):
    """The CSV wrote results at 6 significant digits: a point's step time no longer matched its
    `planner plan` (31.2462 for 31.24617142850488) and 1,610,810 tokens/s read 1.61081e+06. Each
    result now reads back as the float `--json` and search.plan give; grid values stay 40, not 40.0."""
    out = tmp_path / "out"
    result = runner.invoke(app, ["sweep", "-m", tiny, "-s", "h100-sxm", "--max-global-batch", "256",
                                 "--vary", "gpus=4,16", "--vary", "hbm_gib=40,80", "-j", "1",
                                 "--out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)["rows"]
    with (out / "sweep.csv").open() as fh:
        table = list(csv.DictReader(fh))
    assert [(r["gpus"], r["hbm_gib"]) for r in table] == [("4", "40"), ("16", "40"), ("4", "80"), ("16", "80")]
    model, base = load_model(tiny), load_system("h100-sxm")
    for r, c in zip(rows, table):
        assert r["feasible"] and c["feasible"] == "True"
        for col in ("step_time_s", "mfu", "tokens_per_s", "hbm_used_gib"):
            assert float(c[col]) == r[col], col
            assert "e" not in c[col].lower(), (col, c[col])
        system = base.with_changes(num_gpus=r["gpus"], accelerator={
            **base.accelerator.model_dump(), "hbm_capacity_gib": r["hbm_gib"]})
        best = search.plan(model, system, JobSpec(max_global_batch=256), top_k=1).best
        assert float(c["step_time_s"]) == best.estimate.step_time_s
        assert float(c["tokens_per_s"]) == best.estimate.tokens_per_s
