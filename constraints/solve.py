"""Solve the CP-SAT model and enumerate the K best DISTINCT layouts, deterministically.

Each round solves to optimality (one worker, fixed seed, a time limit as a safety net), records
the chosen row, then adds the no-good `layout != chosen layout` and solves again. Because the
table is in rank order and its integer costs increase strictly with the rank, the optimum of
round i is the best row whose layout was not chosen before.

Guard: CP-SAT has returned a wrong OPTIMAL on some encodings (presolve), so every answer is
checked against the table itself (the first allowed row in rank order, a numpy scan). On a
disagreement the table's answer is used and the disagreement is counted in the stats; the
brute-force oracle in the tests is the second line of defence.
"""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
from ortools.sat.python import cp_model

from constraints.encode import Encoded, encode
from constraints.cost_table import Table

SEED = 0
WORKERS = 1
TIME_LIMIT_S = 30.0


@dataclass
class Solutions:
    indices: list[int]                       # table rows, best first
    status: str                              # of the last round: OPTIMAL, INFEASIBLE, ...
    stats: dict = field(default_factory=dict)


def new_solver(time_limit: float) -> cp_model.CpSolver:
    """CP-SAT with the project's fixed seed and workers, a time limit, and Ctrl-C left to Python."""
    s = cp_model.CpSolver()
    s.parameters.num_workers = WORKERS
    s.parameters.random_seed = SEED
    s.parameters.max_time_in_seconds = time_limit
    # CP-SAT installs its own SIGINT handler (it stops the search and returns) unless told not to;
    # then Ctrl-C never reaches Python and `planner plan --top 1000` runs on. Let Python have it.
    s.parameters.catch_sigint_signal = False
    return s


# Solves running now, so that a Ctrl-C caught on the main thread can stop those that other
# threads started (planner.threads.map_in_order: the per-stage solves of several plans).
_running: set = set()
_running_lock = threading.Lock()
_stopping = threading.Event()


def interruptible_solve(solver: cp_model.CpSolver, model: cp_model.CpModel) -> int:
    """solver.Solve in a helper thread (it releases the GIL) so that the calling thread stays in
    Python and gets Ctrl-C at once; then the search is stopped and KeyboardInterrupt goes on.
    A late round of `plan --top 1000` solves for seconds, which a blocked main thread would wait out.
    Called from a thread other than the main one, the main thread stops it (`stopping_solves`)."""
    done: dict = {}
    worker = threading.Thread(target=lambda: done.setdefault("code", solver.Solve(model)), daemon=True)
    with _running_lock:
        if _stopping.is_set():
            raise KeyboardInterrupt  # a Ctrl-C is being handled: start nothing new
        _running.add(solver)
    try:
        worker.start()  # inside: a Ctrl-C that lands while the thread starts must stop it too
        while worker.is_alive():
            worker.join(0.05)
            if _stopping.is_set():
                solver.StopSearch()
    except KeyboardInterrupt:
        # until the solve returns: a stop that lands before the search starts is reset by it, and a
        # thread still inside the solver when Python exits aborts the process
        while worker.is_alive():
            solver.StopSearch()
            worker.join(0.01)
        raise
    finally:
        with _running_lock:
            _running.discard(solver)
    if _stopping.is_set():
        raise KeyboardInterrupt  # stopped from the main thread: the answer is not one to use
    return done["code"]


@contextmanager
def stopping_solves():
    """While inside: every running solve is stopped and none starts (each raises
    KeyboardInterrupt in its thread). For the thread that caught a Ctrl-C, around waiting for the
    solves other threads run."""
    _stopping.set()
    try:
        with _running_lock:
            for solver in _running:
                solver.StopSearch()
        yield
    finally:
        _stopping.clear()


def solve_top_k(table: Table, k: int = 1, time_limit_s: float = TIME_LIMIT_S,
                encoded: Encoded | None = None) -> Solutions:
    """The k best distinct layouts, one CP-SAT solve per layout (each excluding the layouts before
    it), cross-checked against the table's own order (`solver_disagreements`). Each solve reloads
    the whole table (2-3 s at 36,000 rows: DeepSeek-V3 on 256 GPUs), so once the solves have spent
    `time_limit_s` together the remaining layouts are taken in the table's order, which is what
    every solve returns anyway (`table_rounds`): `--top 100` took 9 minutes there, now ~1."""
    t0 = time.perf_counter()
    if not len(table):
        return Solutions(indices=[], status="INFEASIBLE",
                         stats={"encode_s": 0.0, "solve_s": 0.0, "rounds": 0, "table_rounds": 0,
                                "solver_disagreements": 0})
    enc = encoded or encode(table)
    build = time.perf_counter() - t0
    allowed = table.fits.copy()
    group = table.rows["group"]
    chosen: list[int] = []
    disagreements = 0
    status = "INFEASIBLE"
    solve_s = 0.0
    table_rounds = 0
    for _ in range(k):
        expected = int(np.argmax(allowed)) if allowed.any() else None
        if chosen and solve_s >= time_limit_s:
            got = expected  # the table's order, which every solved round matched
            table_rounds += got is not None
        else:
            solver = new_solver(time_limit_s)
            t1 = time.perf_counter()
            code = interruptible_solve(solver, enc.model)
            solve_s += time.perf_counter() - t1
            status = solver.StatusName(code)
            got = int(solver.Value(enc.row)) if code in (cp_model.OPTIMAL, cp_model.FEASIBLE) else None
            if got != expected or (code == cp_model.FEASIBLE):
                disagreements += got != expected
                got = expected
        if got is None:
            break
        chosen.append(got)
        g = int(group[got])
        enc.model.Add(enc.layout != g)
        allowed &= group != g
    return Solutions(indices=chosen, status=status,
                     stats={"encode_s": build, "solve_s": solve_s, "rounds": len(chosen),
                            "table_rounds": table_rounds, "solver_disagreements": disagreements})


def explain(table: Table, time_limit_s: float = TIME_LIMIT_S) -> list[str]:
    """Names of the named constraints that together leave no plan: a CP-SAT infeasibility core
    over the rules' enforcement literals, shrunk to a minimal one (dropping each rule in turn and
    keeping it only if the rest becomes feasible). Empty when a plan exists."""
    if not len(table):
        return []
    enc = encode(table, assumptions=True)
    by_index = {lit.Index(): name for name, lit in enc.rules.items()}

    def infeasible(names: list[str]) -> tuple[bool, list[str]]:
        enc.model.ClearAssumptions()
        enc.model.AddAssumptions([enc.rules[n] for n in names])
        solver = new_solver(time_limit_s)
        code = interruptible_solve(solver, enc.model)
        if code != cp_model.INFEASIBLE:
            return False, []
        return True, [by_index[i] for i in solver.SufficientAssumptionsForInfeasibility() if i in by_index]

    bad, core = infeasible(list(enc.rules))
    if not bad:
        return []
    core = core or list(enc.rules)
    for name in list(core):
        trial = [n for n in core if n != name]
        still, smaller = infeasible(trial)
        if still:
            core = [n for n in trial if not smaller or n in smaller] or trial
    return core


__all__ = ["Solutions", "solve_top_k", "explain", "stopping_solves", "SEED", "WORKERS"]
