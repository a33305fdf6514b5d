"""A malformed sweep point log (NAME.points.jsonl, read when a sweep resumes; found by a fuzzer) is
one line naming the file and the line, exit 2, before any point runs, and is left as it is; a
record cut by a kill still resumes."""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

import planner.sweep as sweep_mod
from planner.cli.app import app
from tests.conftest import one_line_error

REAL_EVALUATE = sweep_mod.evaluate_point


def sweep(out, monkeypatch, stop_after: int | None = None):
    """`planner sweep` over gpus=8,16,32; with stop_after, Ctrl-C once that many points ran."""
    calls = []

    def evaluate(point):
        calls.append(point.params)
        if stop_after is not None and len(calls) > stop_after:
            raise KeyboardInterrupt
        return REAL_EVALUATE(point)

    monkeypatch.setattr(sweep_mod, "evaluate_point", evaluate)
    result = CliRunner().invoke(app, ["sweep", "-m", "llama3-8b", "-s", "h100-sxm", "-b", "1024", "-j", "1",
                                      "--no-explain", "--vary", "gpus=8,16,32", "--out", str(out)])
    return result, calls


def interrupted_log(tmp_path, monkeypatch, points: int = 0):
    """The log of a sweep stopped after `points` points: its header, then their records."""
    result, _ = sweep(tmp_path, monkeypatch, stop_after=points)
    assert result.exit_code == 130, result.output
    log = tmp_path / "sweep.points.jsonl"
    assert len(log.read_text().splitlines()) == 1 + points
    return log


def a_record(log) -> dict:
    return json.loads(log.read_text().splitlines()[1])


@pytest.mark.parametrize("bad,words", [
    ("5", "line 2: expected a point record (a JSON object), got 5"),        # was TypeError, exit 70
    ("null", "line 2: expected a point record (a JSON object), got null"),  # was TypeError, exit 70
    ('{"_params": {"gpus": 8}}', "line 2: the point record lacks gpus"),    # was KeyError in plot
    ('{"_params": 5}', "line 2: _params 5 is not a point of this sweep's grid"),  # was KeyError
    ('{"_params": {"gpus": 7}}', "line 2: _params {\"gpus\": 7} is not a point of this sweep's grid"),
    ("not json at all", "line 2: not JSON"),
    (lambda r: json.dumps({**r, "feasible": "yes"}), "line 2: feasible must be true or false"),
    (lambda r: json.dumps({**r, "mfu": "high"}), "line 2: mfu must be a finite non-negative number"),
    (lambda r: json.dumps({**r, "gpus": 16}), "line 2: the point record's parameters differ from its _params"),
])
def test_a_malformed_line_is_one_line_error_and_the_log_is_kept(tmp_path, monkeypatch, bad, words):
    log = interrupted_log(tmp_path, monkeypatch, points=1 if callable(bad) else 0)
    header = log.read_text().splitlines()[0]
    line = bad(a_record(log)) if callable(bad) else bad
    log.write_text(header + "\n" + line + "\n")
    result, calls = sweep(tmp_path, monkeypatch)
    message = one_line_error(result)
    assert f"out: {log} {words}" in message, message
    assert "delete it" in message and "--out" in message
    assert calls == []  # refused before any point ran
    assert log.read_text() == header + "\n" + line + "\n"  # never overwritten
    assert not (tmp_path / "sweep.csv").exists()


@pytest.mark.parametrize("content,words", [
    ("this is not a point log\n", "line 1: not JSON"),  # was "holds the points of a different sweep"
    # a lone partial JSON line that is not the start of this sweep's header: someone's file, not a
    # log cut by a kill (it had been emptied, then deleted at the end of the sweep)
    ('{"run": "my notes from the last experiment', "line 1: not JSON"),
    ("[1, 2]\n", 'line 1: not the header {"sweep": ...}'),
    (b"\xff\xfe\n", "line 1: not UTF-8 text"),
])
def test_a_log_that_is_not_one_says_so_not_different_sweep(tmp_path, monkeypatch, content, words):
    log = tmp_path / "sweep.points.jsonl"
    log.write_bytes(content if isinstance(content, bytes) else content.encode())
    result, calls = sweep(tmp_path, monkeypatch)
    message = one_line_error(result)
    assert words in message and "different sweep" not in message, message
    assert calls == [] and log.read_bytes() == (content if isinstance(content, bytes) else content.encode())


def test_a_record_cut_by_a_kill_runs_again_and_leaves_a_readable_log(tmp_path, monkeypatch):
    log = interrupted_log(tmp_path, monkeypatch, points=1)
    with log.open("a") as fh:
        fh.write('{"gpus": 16, "model": "lla')  # killed mid-write: no newline
    # resumed and stopped again after one more point: that record starts a line of its own
    result, calls = sweep(tmp_path, monkeypatch, stop_after=1)
    assert result.exit_code == 130, result.output
    assert calls[0] == {"gpus": 16}
    lines = log.read_text().splitlines()
    assert [json.loads(line).get("gpus") for line in lines[1:]] == [8, 16]
    result, calls = sweep(tmp_path, monkeypatch)
    assert result.exit_code == 0, result.output
    assert "resuming: 2 of 3 points already done" in result.output and calls == [{"gpus": 32}]


def test_an_unterminated_last_record_and_an_empty_log_resume(tmp_path, monkeypatch):
    log = interrupted_log(tmp_path, monkeypatch, points=1)
    log.write_text(log.read_text().rstrip("\n"))  # an editor that drops the final newline
    result, calls = sweep(tmp_path, monkeypatch, stop_after=1)
    assert result.exit_code == 130 and calls[0] == {"gpus": 16}, result.output
    assert [json.loads(line).get("gpus") for line in log.read_text().splitlines()[1:]] == [8, 16]
    log.write_text("")  # killed before its header was written: nothing to resume, nothing to lose
    result, calls = sweep(tmp_path, monkeypatch)
    assert result.exit_code == 0, result.output
    assert calls == [{"gpus": 8}, {"gpus": 16}, {"gpus": 32}]


def test_a_resume_keeps_the_users_files_and_replaces_only_what_it_was_writing(tmp_path, monkeypatch):
    """A resume had taken every output there for its own: a sweep.csv the user put beside a stopped
    sweep's log was overwritten without --force. Only outputs the sweep had begun to write (its log
    says so) are its own."""
    log = interrupted_log(tmp_path, monkeypatch, points=1)
    mine = tmp_path / "sweep.csv"
    mine.write_text("my,data\n")
    result, calls = sweep(tmp_path, monkeypatch)
    one_line_error(result, "sweep.csv already exists")
    assert calls == [] and mine.read_text() == "my,data\n" and log.is_file()
    mine.unlink()
    # killed while writing its outputs: the log records it, and the rerun replaces them
    with log.open("a") as fh:
        fh.write(json.dumps(sweep_mod.WRITING_MARK) + "\n")
    (tmp_path / "sweep.csv").write_text("half written")
    result, calls = sweep(tmp_path, monkeypatch)
    assert result.exit_code == 0, result.output
    assert (tmp_path / "sweep.csv").read_text().startswith("gpus") and not log.exists()


def test_a_point_logged_twice_or_at_odds_with_its_plan_is_refused(tmp_path, monkeypatch):
    log = interrupted_log(tmp_path, monkeypatch, points=1)
    header, record = log.read_text().splitlines()[:2]
    log.write_text(f"{header}\n{record}\n{record}\n")
    one_line_error(sweep(tmp_path, monkeypatch)[0], "line 3", "logged twice")
    odd = json.dumps({**json.loads(record), "tp": 3})
    log.write_text(f"{header}\n{odd}\n")
    one_line_error(sweep(tmp_path, monkeypatch)[0], "line 2", "tp3", "differ from its plan")


def test_a_system_file_edited_between_the_runs_is_another_sweep(tmp_path, monkeypatch):
    """The log's header named the system file, not what it said: edited between a Ctrl-C and the
    rerun (HBM 80 -> 16 GiB), the resumed sweep kept the old points, above the new HBM. The
    header holds the model and system as read, so the rerun is refused as a different sweep."""
    import yaml
    system = tmp_path / "box.yaml"
    acc = yaml.safe_load(open("hardware/presets/accelerators/h100-sxm5-80gb.yaml"))
    spec = {**yaml.safe_load(open("hardware/presets/h100-sxm.yaml")), "name": "box", "accelerator": acc}
    system.write_text(yaml.safe_dump(spec))
    calls = []

    def evaluate(point):
        calls.append(point.params)
        if len(calls) > 1:
            raise KeyboardInterrupt
        return REAL_EVALUATE(point)

    monkeypatch.setattr(sweep_mod, "evaluate_point", evaluate)
    args = ["sweep", "-m", "llama3-8b", "-s", str(system), "-b", "1024", "-j", "1", "--no-explain",
            "--vary", "gpus=8,16,32", "--out", str(tmp_path / "out")]
    assert CliRunner().invoke(app, args).exit_code == 130
    logged_gib = float(spec["accelerator"]["hbm_capacity_gib"])
    spec["accelerator"]["hbm_capacity_gib"] = 16
    system.write_text(yaml.safe_dump(spec))
    monkeypatch.setattr(sweep_mod, "evaluate_point", REAL_EVALUATE)
    one_line_error(CliRunner().invoke(app, args), "holds the points of a different sweep",
                   f"inputs.system.accelerator.hbm_capacity_gib: {logged_gib} in the log, 16.0 now")


def test_a_header_cut_by_a_kill_is_a_fresh_log(tmp_path, monkeypatch):
    log = interrupted_log(tmp_path, monkeypatch, points=0)
    header = log.read_text().splitlines()[0]
    log.write_text(header[:25])  # killed while writing its own header
    result, calls = sweep(tmp_path, monkeypatch)
    assert result.exit_code == 0, result.output
    assert calls == [{"gpus": 8}, {"gpus": 16}, {"gpus": 32}]


@pytest.mark.parametrize("flag", ["-m", "-s"])
def test_force_never_overwrites_the_model_or_system_it_reads(tmp_path, flag):
    """`--force` overwrites outputs; an output path that is the sweep's own input file is refused."""
    from pathlib import Path as _Path
    source = _Path(__file__).resolve().parents[1] / ("examples/custom_model.yaml" if flag == "-m"
                                                     else "hardware/presets/h100-sxm.yaml")
    target = tmp_path / "sweep.csv"
    target.write_text(source.read_text())
    args = {"-m": str(target) if flag == "-m" else "llama3-8b", "-s": str(target) if flag == "-s" else "h100-sxm"}
    result = CliRunner().invoke(app, ["sweep", "-m", args["-m"], "-s", args["-s"], "-g", "8", "-b", "8",
                                      "--no-explain", "--vary", "hbm_gib=80", "--out", str(tmp_path), "--force"])
    message = one_line_error(result, "would be overwritten")
    assert ("--model" if flag == "-m" else "--system") in message
    assert target.read_text() == source.read_text()
