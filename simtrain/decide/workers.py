"""Running tasks on workers: serially, on a local process pool or on any concurrent.futures executor
(a Dask client's too), with progress, interrupts that stop the pool, and a dead pool named as such.

Sweeps and search run their points through :func:`run_tasks`; the serial and parallel paths are the same code.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import (
    FIRST_COMPLETED,
    Executor,
    Future,
    ProcessPoolExecutor,
    wait,
)
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from typing import Any

from simtrain.spec.errors import InputError
from simtrain.spec.units import as_whole


class SerialExecutor(Executor):
    """Runs each task at submit time in this process: ``workers=1`` takes the pool's code path."""

    def submit(self, fn, /, *args, **kwargs) -> Future:
        future: Future = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except Exception as err:  # noqa: BLE001 - delivered through the future, like a pool would
            future.set_exception(err)   # (KeyboardInterrupt is not caught: Ctrl-C stops the sweep)
        return future


@contextmanager
def open_executor(workers: int | None, executor: Executor | None, tasks: int) -> Iterator[Executor]:
    """The executor to use: the caller's (left open), a serial one, or a spawn process pool we close."""
    if executor is not None:
        if not callable(getattr(executor, "submit", None)):     # else every point's row would hold the error
            raise InputError(f"executor={executor!r}: give a concurrent.futures Executor (something with "
                             "submit(), e.g. a Dask client's get_executor()), or leave it out", field="executor")
        yield executor
        return
    if workers is not None:
        whole = as_whole(workers)
        if whole is None:
            raise InputError(f"workers={workers!r}: give a whole number of processes (1 runs in this process)",
                             field="workers")
        workers = whole
    if workers is not None and workers < 1:
        raise InputError(f"workers={workers}: give 1 or more (1 runs in this process)", field="workers")
    count = min(workers or os.cpu_count() or 1, max(tasks, 1))
    if count == 1:
        yield SerialExecutor()
        return
    pool = ProcessPoolExecutor(max_workers=count, mp_context=multiprocessing.get_context("spawn"),
                               initializer=_ignore_interrupt)
    pool._simtrain_stops_whole = True   # run_tasks leaves its futures to _stop
    try:                          # an interrupt while the workers start stops the ones started
        with _interrupts_ignored():   # workers start with SIGINT ignored (a spawned child keeps SIG_IGN)
            for _ in range(count):    # a spawn pool starts a worker per submit while none is idle
                pool.submit(os.getpid)
        yield pool
    except BaseException:
        _stop(pool)
        raise
    pool.shutdown(wait=True)


class WorkersFailed(RuntimeError):
    """The worker processes of a sweep or search ended before reporting."""


WORKERS_FAILED = ("the worker processes stopped before reporting (BrokenProcessPool). In a script, call simtrain's "
                  "sweep or search under `if __name__ == \"__main__\":` (each worker imports the script, so unguarded "
                  "code runs again in it), or pass workers=1 to run in this process")


@contextmanager
def _interrupts_ignored() -> Iterator[None]:
    """SIGINT ignored in this process for the block (main thread only; a signal that comes meanwhile is lost:
    the block only starts processes)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _ignore_interrupt() -> None:
    """Workers leave Ctrl-C and SIGTERM to the parent, which stops them (SIGKILL): a terminal sends SIGINT, and a
    scheduler or ``kill -- -PGID`` sends SIGTERM, to the whole process group; a worker interrupted mid-task would
    print its own traceback, and one ended by the signal would be taken for a worker killed from outside."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if hasattr(signal, "SIGTERM") and sys.platform != "win32":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)


def _stop(pool: ProcessPoolExecutor) -> None:
    """Drop queued tasks and end the workers now, not after their current point (an interrupt, an error)."""
    processes = list((getattr(pool, "_processes", None) or {}).values())   # CPython's pool keeps them there
    for process in processes:     # first, so that no worker sees its pipes close and reports it
        if process.is_alive():
            process.kill()        # SIGKILL: workers ignore SIGTERM (a signal to the group is the parent's)
    for process in processes:
        process.join(timeout=5)
    pool.shutdown(wait=True)


#: a progress bar appears only once a call has run this long (s): quick calls stay silent
PROGRESS_DELAY_S = 2.0


def in_notebook() -> bool:
    """True inside a Jupyter kernel (where stderr is no terminal, yet a progress widget is wanted)."""
    shell = sys.modules.get("IPython")
    get = getattr(shell, "get_ipython", None)
    return bool(get is not None and getattr(get(), "kernel", None) is not None)


def progress_bar(total: int | None, progress: bool | None, desc: str, *, eta: bool = True, unit: str = "point"):
    """A tqdm.auto bar: a widget in Jupyter, text on stderr in a terminal. ``progress=None`` shows it in either
    (not in a pipe or a log), and only once the call has run :data:`PROGRESS_DELAY_S`; ``eta=False`` leaves out
    the remaining time where it cannot be known (search candidates that are mostly pruned, not simulated)."""
    from tqdm.auto import tqdm

    show = (sys.stderr.isatty() or in_notebook()) if progress is None else bool(progress)
    options: dict[str, Any] = {"delay": PROGRESS_DELAY_S} if progress is None else {}
    if not eta:
        options["bar_format"] = "{desc}: {n_fmt}/{total_fmt} [{elapsed}]{postfix}"
    return tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, disable=not show, leave=False, mininterval=0,
                **options)


#: tasks in flight on an executor whose size is unknown (a Dask client's): enough to keep a cluster busy, few
#: enough that the submitted arguments and the futures of a 100,000-point grid are not all held at once
UNKNOWN_EXECUTOR_WINDOW = 256


def _in_flight(executor: Executor) -> int:
    """Tasks submitted ahead: twice the pool's workers (one running and one queued each, so none waits for the
    parent), so memory is bounded by the points in flight, not by the grid."""
    workers = getattr(executor, "_max_workers", None)
    return 2 * workers if isinstance(workers, int) and workers > 0 else UNKNOWN_EXECUTOR_WINDOW


def run_tasks(fn: Callable, args: list[tuple], executor: Executor, *, bar=None) -> Iterator[tuple[int, Any]]:
    """Submit ``fn(*a)`` for each ``a``; yield (index, result or the exception) as each finishes.

    A serial executor gets one task at a time, so each result is yielded (and can be written out)
    before the next task starts; pools get twice their workers at a time, other executors 256 (:func:`_in_flight`).
    """
    window = 1 if isinstance(executor, SerialExecutor) else _in_flight(executor)
    pending: dict[Future, int] = {}
    queue = iter(enumerate(args))

    def submit_next() -> bool:
        item = next(queue, None)
        if item is None:
            return False
        i, a = item
        try:
            future = executor.submit(fn, *a)
        except Exception as err:  # noqa: BLE001 - e.g. a broken pool: report it for this task
            future = Future()
            future.set_exception(err)
        pending[future] = i
        return True

    try:
        while len(pending) < window and submit_next():
            pass
        while pending:
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                i = pending.pop(future)
                try:
                    value: Any = future.result()
                except BrokenProcessPool as err:   # every later task fails the same way: stop, and say why
                    raise WorkersFailed(WORKERS_FAILED) from err
                except Exception as err:  # noqa: BLE001 - worker crash, pickling, lost cluster worker
                    value = err
                if bar is not None:
                    bar.update(1)
                yield i, value
                if len(pending) < window:
                    submit_next()
    finally:
        # a pool of open_executor's own is stopped whole by it; cancelling here would race the pool's manager
        # thread, which then fails the cancelled futures as broken (InvalidStateError on Python 3.11). A caller's
        # executor stays open, so its queued tasks are cancelled.
        if not getattr(executor, "_simtrain_stops_whole", False):
            for future in pending:
                future.cancel()
