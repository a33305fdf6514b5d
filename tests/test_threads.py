"""The search's work on several threads (planner.threads): the same table and plans as on one
thread, and Ctrl-C still ends it at once, solves running on other threads included."""
from __future__ import annotations

import signal
import threading
import time

import numpy as np
import pytest
from ortools.sat.python import cp_model
from typer.testing import CliRunner

import constraints.cost_table as cost_table
from constraints import solve as solve_mod
from constraints.space import build_space
from planner.threads import THREADS_ENV, map_in_order, thread_count
from hardware import load_system
from planner.cli import app
from planner.model import load_model
from planner.plan import JobSpec
from planner.search import plan


def test_map_in_order_keeps_the_order_of_its_items(monkeypatch):
    monkeypatch.setenv(THREADS_ENV, "3")
    # later items finish first: the result is still in item order
    assert map_in_order(lambda x: (time.sleep(0.02 * (5 - x)), x * x)[1], range(5)) == [0, 1, 4, 9, 16]


# 100000 threads ran the same search in 1.6x the time and 4x the memory; "1_0" and Arabic-Indic
# digits are integers to Python's int(), not to a user
@pytest.mark.parametrize("raw", ["0", "-2", "two", "1.5", "100000", "1_0", "\u0661"])
def test_a_bad_thread_count_is_a_one_line_input_error(monkeypatch, raw):
    monkeypatch.setenv(THREADS_ENV, raw)
    out = CliRunner().invoke(app, ["plan", "-m", "llama3-8b", "-s", "h100-sxm", "-g", "8", "-b", "64"])
    assert out.exit_code == 2, out.output
    assert THREADS_ENV in out.output and "an integer from 1 to 256" in out.output
    assert "Traceback" not in out.output


def test_thread_count_default_is_bounded(monkeypatch):
    monkeypatch.delenv(THREADS_ENV, raising=False)
    assert 1 <= thread_count() <= 8


def _table(monkeypatch, threads: str):
    monkeypatch.setenv(THREADS_ENV, threads)
    model, system = load_model("llama3-8b"), load_system("h100-sxm").model_copy(update={"num_gpus": 64})
    space = build_space(model, system, JobSpec(global_batch=256))
    return cost_table.tabulate(space, top_k=5)


def test_the_table_is_the_same_on_one_thread_and_on_several(monkeypatch):
    # chunks of 997 rows: each block of pairs the pass costs between two looks at its compute
    # bound (cost_table.FIRST_BLOCK_ROWS, then twice as many) spans several, so the threads
    # really split it
    monkeypatch.setattr(cost_table, "CHUNK", 997)
    one, several = _table(monkeypatch, "1"), _table(monkeypatch, "4")
    assert one.stats["evaluated"] == several.stats["evaluated"] > 4 * 997
    assert one.rows.keys() == several.rows.keys()
    for key in one.rows:
        np.testing.assert_array_equal(one.rows[key], several.rows[key], err_msg=key)
    for key in one.res:
        np.testing.assert_array_equal(one.res[key], several.res[key], err_msg=key)


def test_plans_with_stage_solves_side_by_side_equal_the_one_thread_plans(monkeypatch):
    # a pipelined search whose first plans all get per-stage CP-SAT solves (planner.search.refine_stages)
    model, system = load_model("llama3-70b"), load_system("h100-sxm").model_copy(update={"num_gpus": 512})
    job = JobSpec(global_batch=1024)
    monkeypatch.setenv(THREADS_ENV, "1")
    one = plan(model, system, job, top_k=5)
    monkeypatch.setenv(THREADS_ENV, "3")
    several = plan(model, system, job, top_k=5)
    assert any(r.plan.stage_layers for r in one.ranked)  # the stage solves changed something
    assert [(r.plan, r.objective) for r in one.ranked] == [(r.plan, r.objective) for r in several.ranked]


def _golomb_ruler(marks: int = 11) -> cp_model.CpModel:
    """A model CP-SAT takes minutes to prove on one worker: the shortest Golomb ruler."""
    md = cp_model.CpModel()
    top = marks * marks
    x = [md.NewIntVar(0, top, f"x{i}") for i in range(marks)]
    md.Add(x[0] == 0)
    diffs = []
    for i in range(marks):
        for j in range(i + 1, marks):
            d = md.NewIntVar(1, top, f"d{i}_{j}")
            md.Add(d == x[j] - x[i])
            diffs.append(d)
    for i in range(marks - 1):
        md.Add(x[i] < x[i + 1])
    md.AddAllDifferent(diffs)
    md.Minimize(x[-1])
    return md


def test_ctrl_c_stops_solves_that_other_threads_run(monkeypatch):
    monkeypatch.setenv(THREADS_ENV, "2")
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    started = threading.Barrier(3)

    def long_solve(_):
        solver = solve_mod.new_solver(120.0)
        started.wait(timeout=10)
        return solve_mod.interruptible_solve(solver, _golomb_ruler())

    main = threading.main_thread().ident
    timer = threading.Thread(target=lambda: (started.wait(timeout=10), time.sleep(0.5),
                                             signal.pthread_kill(main, signal.SIGINT)))
    try:
        timer.start()
        t0 = time.perf_counter()
        with pytest.raises(KeyboardInterrupt):
            map_in_order(long_solve, range(4), stopping=solve_mod.stopping_solves)
        waited_s = time.perf_counter() - t0
    finally:
        timer.join()
        signal.signal(signal.SIGINT, previous)
    assert waited_s < 5.0  # both solves were stopped, the two queued never started
    assert not [t for t in threading.enumerate() if t.name.startswith("parplan")]
    assert not solve_mod._running and not solve_mod._stopping.is_set()  # the next search starts clean
