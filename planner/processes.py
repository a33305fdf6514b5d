"""Worker processes for the commands that spread independent work over CPUs (`planner sweep`'s
grid points, `planner validate --lofo`'s family refits), with Ctrl-C ending them at once."""
from __future__ import annotations

import os
import signal
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context

from planner.threads import THREADS_ENV


def worker_pool(workers: int, initializer=None, initargs: tuple = ()) -> ProcessPoolExecutor:
    """A pool of `workers` spawned processes that ignore SIGINT and then run `initializer(*initargs)`.

    Spawn, not fork: the parent may hold OR-tools' solver threads, and forking a process with
    threads is unsafe. Workers ignore SIGINT because Ctrl-C is the parent's to handle: a worker
    interrupted mid-task would report the interrupt as that task's error and take the next task,
    so the parent ends them itself (`end_now`)."""
    return ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn"),
                               initializer=_start_worker, initargs=(initializer, initargs))


def end_now(pool: ProcessPoolExecutor) -> None:
    """End the pool's workers without waiting for their running or queued tasks (which can take
    minutes): what the parent does on Ctrl-C or a failed task before re-raising. The shutdown
    after the workers are gone returns at once and lets the pool release its queues (without it
    multiprocessing's resource tracker warns of leaked semaphores on stderr)."""
    for proc in list((pool._processes or {}).values()):  # noqa: SLF001 - no public way to kill them
        proc.terminate()
    pool.shutdown(wait=True, cancel_futures=True)


def _start_worker(initializer, initargs: tuple) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # the pool already fills the CPUs: each worker's search stays on its own thread (planner.threads)
    os.environ[THREADS_ENV] = "1"
    if initializer is not None:
        initializer(*initargs)
