"""The search's independent pieces of work on several CPU threads, in order, Ctrl-C-safe.

Two kinds of work run here: chunks of the vectorised cost model (`constraints.cost_table`), whose
numpy kernels release the GIL on arrays of tens of thousands of rows (DeepSeek-V3 on 256 GB200,
2.9 M rows: 18.0 s on one thread, 11.5 s on two, the same table), and the per-stage CP-SAT solves
of the reported plans (`planner.search.refine_stages`), which run in C++ without the GIL.
Threads, not processes: nothing to pickle, no start-up, and the results are the same arrays in
the same order whatever the thread count (each piece is computed whole by one thread).

Thread count: PARPLAN_THREADS if set (1 = everything on the calling thread), else the CPUs this
process may use, at most MAX_THREADS. The worker processes of `planner sweep` and `planner
validate --lofo` set it to 1 (planner.processes): they already fill the CPUs.
"""
from __future__ import annotations

import os
from contextlib import AbstractContextManager, nullcontext
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterable, TypeVar

from hardware.errors import SpecError

T = TypeVar("T")
R = TypeVar("R")

THREADS_ENV = "PARPLAN_THREADS"
# beyond this the chunks' working sets crowd the caches more than the threads gain (numpy's own
# passes are memory-bound on these arrays)
MAX_THREADS = 8
# what PARPLAN_THREADS may ask for: more threads than any machine's cores only cost memory
MAX_ENV_THREADS = 256


def thread_count() -> int:
    """Threads for the search's parallel work (module docstring)."""
    raw = os.environ.get(THREADS_ENV)
    if raw is not None and raw.strip():
        text = raw.strip()
        # ASCII digits only: int() would also take "1_0" and other scripts' digits
        n = int(text) if text.isascii() and text.isdigit() else 0
        if not 1 <= n <= MAX_ENV_THREADS:
            raise SpecError(f"{THREADS_ENV}: expected an integer from 1 to {MAX_ENV_THREADS} (1 = no extra "
                            f"threads), got {raw!r}")
        return n
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    return max(1, min(cpus, MAX_THREADS))


def map_in_order(fn: Callable[[T], R], items: Iterable[T],
                 stopping: Callable[[], AbstractContextManager] = nullcontext) -> list[R]:
    """[fn(x) for x in items], the calls spread over `thread_count()` threads.

    On Ctrl-C (KeyboardInterrupt reaches only the calling thread) the queued calls are dropped
    and the running ones are waited for inside `stopping()`, which stops those that would run
    long (constraints.solve.stopping_solves for CP-SAT); then the interrupt goes on, so no thread
    outlives the call."""
    items = list(items)
    workers = min(thread_count(), len(items))
    if workers <= 1:
        return [fn(x) for x in items]
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="parplan")
    try:
        return list(pool.map(fn, items))
    except KeyboardInterrupt:
        with stopping():
            pool.shutdown(wait=True, cancel_futures=True)
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


__all__ = ["thread_count", "map_in_order", "THREADS_ENV", "MAX_THREADS"]
