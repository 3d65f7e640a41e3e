"""Parameter sweeps: simulate every point of a grid, serially, on local processes or on a cluster.

``sweep(scenario, {"parallel.pp": [2, 4, 8], "training.micro_batch": [1, 2]})``
returns a pandas DataFrame, one row per point of the cartesian product (in the
grid's key order): the swept values, then :data:`METRICS` and ``error``. Each
point is ``scenario.with_overrides({key: value, ...})``, so derived keys work too
(sweeping ``training.global_batch`` changes the micro-batch count). An invalid
or failing point gets its message in ``error``; it never aborts the sweep.

Points run on a ``concurrent.futures.Executor``: by default a process pool over
all cores, started with the 'spawn' context (safe in notebooks and threads; no
global ``set_start_method``); ``workers=1`` runs in this process through the same
code path; any executor can be passed in, e.g. a Dask client's
``client.get_executor()``. Workers receive the scenario as its raw mapping, file
and folder (small and picklable) and rebuild it; they return plain dicts.
"""

from __future__ import annotations

import itertools
import json
import multiprocessing
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Executor, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from simtrain.spec.errors import InputError, display_path
from simtrain.report.outputs import write_atomic
from simtrain.spec.scenario import Scenario, scenario_from_dict
from simtrain.spec.units import as_whole

#: result columns of a sweep row, after the swept values
METRICS = ("step_time_s", "tokens_per_s", "mfu", "bubble_fraction", "peak_memory_bytes_max", "fits_in_memory")
COLUMNS = METRICS + ("error",)


@dataclass(frozen=True)
class ScenarioPayload:
    """What a worker needs to rebuild a scenario: its raw mapping, file and folder (no cached objects)."""

    raw: dict
    file: str | None
    base_dir: str

    @classmethod
    def of(cls, scenario: Scenario) -> "ScenarioPayload":
        return cls(raw=scenario.raw, file=scenario.file, base_dir=str(scenario.base_dir))

    def build(self) -> Scenario:
        return scenario_from_dict(self.raw, file=self.file, base_dir=Path(self.base_dir))


def error_text(err: BaseException) -> str:
    """One line for the ``error`` column: the located message of an InputError, else the type and message."""
    text = str(err) if isinstance(err, InputError) else f"{type(err).__name__}: {err}"
    return " ".join(text.split()) or type(err).__name__


def grid_points(grid: dict[str, list]) -> list[dict[str, Any]]:
    """The cartesian product of ``grid`` in its key order (the last key varies fastest)."""
    if not isinstance(grid, dict) or not grid:
        raise InputError("a sweep grid needs at least one key, e.g. {'parallel.pp': [2, 4, 8]}")
    for key, values in grid.items():
        if not isinstance(key, str) or not key:
            raise InputError(f"grid key {key!r} is not a dotted scenario key such as 'parallel.pp'")
        if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
            raise InputError(f"grid values for '{key}' must be a list, e.g. [2, 4, 8]", field=key)
        if not list(values):
            raise InputError(f"grid key '{key}' has no values", field=key)
        seen = set()
        for value in values:
            text = json.dumps(value, sort_keys=True, default=str)
            if text in seen:    # two rows of one point would make --resume's matching ambiguous
                raise InputError(f"grid key '{key}' lists {text} twice; give each value once", field=key)
            seen.add(text)
    keys = list(grid)
    return [dict(zip(keys, combo)) for combo in itertools.product(*(list(grid[k]) for k in keys))]


def check_grid_keys(scenario: Scenario, grid: dict[str, list]) -> None:
    """A grid key the scenario schema does not have is a typo to report before any point runs, not an error
    in every row."""
    from simtrain.spec.yamlio import OVERRIDE_NOTE

    for key, values in grid.items():
        try:
            scenario.with_overrides({key: list(values)[0]})
        except InputError as err:
            # only the key's own path: an error inside a file the value names (a model file's typo) is that file's
            if err.field == key and (err.message.startswith("unknown key") or err.message.startswith("cannot set")):
                raise InputError(f"grid key '{key}': {err.message.removesuffix(OVERRIDE_NOTE)}", field=key) from None


def evaluate_point(payload: ScenarioPayload, overrides: dict[str, Any]) -> dict[str, Any]:
    """Simulate one point; never raises (the message goes to ``error``). Runs in a worker."""
    from simtrain.engine.simulation import simulate

    row: dict[str, Any] = {k: None for k in METRICS}
    try:
        report = simulate(payload.build().with_overrides(overrides)).to_dict(timeline=False)   # as --json writes it
        row.update({k: report[k] for k in METRICS}, fits_in_memory=bool(report["fits_in_memory"]), error=None)
    except Exception as err:  # noqa: BLE001 - a failing point is data, not a reason to stop the sweep
        row["error"] = error_text(err)
    return row


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
    with _interrupts_ignored():   # workers start with SIGINT ignored (a spawned child keeps SIG_IGN)
        for _ in range(count):    # a spawn pool starts a worker per submit while none is idle
            pool.submit(os.getpid)
    try:
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
    """Workers leave Ctrl-C to the parent, which stops them: a terminal sends SIGINT to the whole
    process group, and a worker interrupted mid-task would print its own traceback."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _stop(pool: ProcessPoolExecutor) -> None:
    """Drop queued tasks and end the workers now, not after their current point (an interrupt, an error)."""
    processes = list((getattr(pool, "_processes", None) or {}).values())   # CPython's pool keeps them there
    for process in processes:     # first, so that no worker sees its pipes close and reports it
        if process.is_alive():
            process.terminate()
    for process in processes:
        process.join(timeout=5)
    pool.shutdown(wait=True)


def progress_bar(total: int, progress: bool | None, desc: str):
    """A tqdm bar on stderr; ``progress=None`` shows it only when stderr is a terminal."""
    from tqdm import tqdm

    show = sys.stderr.isatty() if progress is None else bool(progress)
    return tqdm(total=total, desc=desc, unit="point", file=sys.stderr, disable=not show, leave=False, mininterval=0)


def run_tasks(fn: Callable, args: list[tuple], executor: Executor, *, bar=None) -> Iterator[tuple[int, Any]]:
    """Submit ``fn(*a)`` for each ``a``; yield (index, result or the exception) as each finishes.

    A serial executor gets one task at a time, so each result is yielded (and can be written out)
    before the next task starts; pools and cluster executors get every task at once.
    """
    window = 1 if isinstance(executor, SerialExecutor) else max(len(args), 1)
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


def run_points(scenario: Scenario, points: list[dict[str, Any]], *, workers: int | None = None,
               executor: Executor | None = None, progress: bool | None = None,
               on_point: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """Rows (swept values, then :data:`COLUMNS`) for ``points``, in the order given."""
    payload = ScenarioPayload.of(scenario)
    rows: list[dict[str, Any] | None] = [None] * len(points)
    with open_executor(workers, executor, len(points)) as ex, progress_bar(len(points), progress, "sweep") as bar:
        for i, value in run_tasks(evaluate_point, [(payload, p) for p in points], ex, bar=bar):
            if isinstance(value, BaseException):
                value = {**{k: None for k in METRICS}, "error": error_text(value)}
            row = {**points[i], **{k: value.get(k) for k in COLUMNS}}
            rows[i] = row
            if on_point is not None:
                on_point(row)
    return [r for r in rows if r is not None]


def sweep(scenario: Scenario, grid: dict[str, list], workers: int | None = None, executor: Executor | None = None,
          progress: bool | None = None, on_point: Callable[[dict[str, Any]], None] | None = None):
    """Simulate every point of ``grid`` (module docstring); a DataFrame with one row per point.

    ``on_point(row)`` is called in this process as each point finishes (in finishing order).
    """
    import pandas as pd

    points = grid_points(grid)
    check_grid_keys(scenario, grid)
    rows = run_points(scenario, points, workers=workers, executor=executor, progress=progress, on_point=on_point)
    return pd.DataFrame(rows, columns=[*grid, *COLUMNS])


# --- sweeps to a file, row by row, resumable ---------------------------------------------------

FORMATS = {".csv": "csv", ".jsonl": "jsonl", ".parquet": "parquet"}


def table_format(path: str | Path) -> str:
    """'csv', 'jsonl' or 'parquet' from the file name."""
    fmt = FORMATS.get(Path(path).suffix.lower())
    if fmt is None:
        raise InputError(f"cannot tell the table format of '{path}': use a name ending in "
                         f"{', '.join(FORMATS)} (CSV, JSON lines, Parquet)")
    return fmt


def output_format(path: str | Path) -> str:
    """:func:`table_format` for a table simtrain will write, checked before any work is done: Parquet
    needs pyarrow (the ``parquet`` extra), which a plain ``pip install simtrain`` does not bring."""
    fmt = table_format(path)
    if fmt == "parquet":
        try:
            import pyarrow.parquet  # noqa: F401  (pandas writes Parquet with it; --resume reads with it)
        except ImportError:
            raise InputError(f"cannot write '{display_path(path)}': Parquet tables need pyarrow, which is not "
                             "installed; install it with pip install 'simtrain[parquet]', or name a .csv or .jsonl "
                             "file instead") from None
    return fmt


def _plain(value: Any) -> Any:
    """numpy scalars to Python; NaN to None (a missing metric)."""
    if hasattr(value, "item") and not isinstance(value, (list, dict, str)):
        value = value.item()
    if isinstance(value, float) and value != value:
        return None
    return value


def cell(value: Any) -> str:
    """A value as CSV text, and as the key that matches points on --resume: repr for floats (exact)."""
    value = _plain(value)
    if value is None:
        return ""
    if isinstance(value, float):
        return repr(value)
    return str(value)


def _line(row: dict[str, Any], columns: list[str], fmt: str) -> str:
    if fmt == "csv":
        import csv
        import io

        buf = io.StringIO()
        csv.writer(buf, lineterminator="\n").writerow([cell(row.get(c)) for c in columns])
        return buf.getvalue()
    return json.dumps({c: _plain(row.get(c)) for c in columns}, allow_nan=False) + "\n"


class RowFile:
    """A sweep table on disk: rows appended (and flushed) as points finish, so an interrupted sweep
    keeps what it did; ``finish()`` rewrites it atomically in grid order. Parquet cannot be appended:
    rows go to a ``.partial.jsonl`` file beside it and the Parquet file is written at the end."""

    def __init__(self, path: str | Path, keys: list[str], *, resume: bool = False) -> None:
        self.path = Path(path)
        self.fmt = output_format(self.path)
        self.keys = list(keys)
        self.columns = [*self.keys, *COLUMNS]
        self.stream = self.path.with_name(self.path.name + ".partial.jsonl") if self.fmt == "parquet" else self.path
        self.stream_fmt = "jsonl" if self.fmt == "parquet" else self.fmt
        self.entries: dict[tuple, str] = {}
        if resume:
            if self.fmt == "parquet" and self.path.exists():
                import pyarrow.parquet as pq

                table = pq.read_table(self.path)
                self._check_columns(list(table.column_names), self.path)
                for row in table.to_pylist():
                    self._add(row, _line(row, self.columns, "jsonl"))
            if self.stream.exists():
                self._load_stream()
        header = _line({c: c for c in self.columns}, self.columns, "csv") if self.stream_fmt == "csv" else ""
        write_atomic(self.stream, header + "".join(self.entries.values()))   # valid rows only, then append
        self._fh = open(self.stream, "a", encoding="utf-8", newline="")

    def _check_columns(self, found: list[str], where: Path) -> None:
        if found != self.columns:
            raise InputError(f"cannot resume: its columns {found} are not this sweep's {self.columns} "
                             "(a different grid?); use another --out file or drop --resume", file=str(where))

    def key(self, row: dict[str, Any]) -> tuple:
        return tuple(cell(row.get(k)) for k in self.keys)

    def _add(self, row: dict[str, Any], line: str) -> None:
        self.entries.setdefault(self.key(row), line)

    def _load_stream(self) -> None:
        text = self.stream.read_text(encoding="utf-8")
        lines = text.splitlines(keepends=True)
        if lines and not lines[-1].endswith("\n"):
            lines.pop()      # cut off mid-write: that point runs again
        if self.stream_fmt == "csv":
            import csv

            if not lines:
                return
            self._check_columns(next(csv.reader([lines[0]])), self.stream)
            for line in lines[1:]:
                cells = next(csv.reader([line]))
                if len(cells) == len(self.columns):
                    self._add(dict(zip(self.columns, cells)), line)
            return
        for line in lines:
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            self._check_columns(list(row), self.stream)
            self._add(row, line)

    def done(self, point: dict[str, Any]) -> bool:
        return self.key(point) in self.entries

    def append(self, row: dict[str, Any]) -> None:
        line = _line(row, self.columns, self.stream_fmt)
        self._fh.write(line)
        self._fh.flush()
        self._add(row, line)

    def close(self) -> None:
        self._fh.close()

    def finish(self, points: list[dict[str, Any]]) -> None:
        """Rewrite the table atomically: grid order first, then rows of other grids kept from a resume."""
        self.close()
        order = [self.key(p) for p in points]
        known = set(order)
        lines = [self.entries[k] for k in order if k in self.entries]
        lines += [line for k, line in self.entries.items() if k not in known]
        if self.fmt == "parquet":
            import io

            import pandas as pd

            frame = pd.DataFrame([json.loads(line) for line in lines], columns=self.columns)
            buf = io.BytesIO()
            parquet_safe(frame).to_parquet(buf, index=False)
            write_atomic(self.path, buf.getvalue())
            self.stream.unlink(missing_ok=True)
            return
        header = _line({c: c for c in self.columns}, self.columns, "csv") if self.fmt == "csv" else ""
        write_atomic(self.path, header + "".join(lines))


def parquet_safe(frame):
    """Parquet columns hold one type: a column whose values mix types (a swept key with values true and
    flash1, say) is written as text, 'True' and 'flash1'; missing values stay missing."""
    frame = frame.copy()
    for col in frame.columns:
        if frame[col].dtype == object:
            kinds = {type(x) for x in frame[col] if x is not None}
            if len(kinds) > 1:
                frame[col] = [None if x is None else str(x) for x in frame[col]]
    return frame


def read_table(path: str | Path):
    """A sweep or search table written by simtrain, as a DataFrame."""
    import pandas as pd

    fmt = table_format(path)
    if fmt == "csv":
        return pd.read_csv(path)
    if fmt == "jsonl":   # the json module: exact floats and the file's column order
        with open(path, encoding="utf-8") as fh:
            return pd.DataFrame([json.loads(line) for line in fh if line.strip()])
    return pd.read_parquet(path)


def write_table(frame, path: str | Path) -> Path:
    """A whole DataFrame to CSV, JSON lines or Parquet (by extension), atomically."""
    import io

    fmt = output_format(path)
    if fmt == "parquet":
        buf = io.BytesIO()
        parquet_safe(frame).to_parquet(buf, index=False)
        return write_atomic(path, buf.getvalue())
    columns = [str(c) for c in frame.columns]
    rows = frame.to_dict(orient="records")
    header = _line({c: c for c in columns}, columns, "csv") if fmt == "csv" else ""
    return write_atomic(path, header + "".join(_line(r, columns, fmt) for r in rows))


def sweep_identity(scenario: Scenario, grid: dict[str, list]) -> dict[str, Any]:
    """What a sweep's rows depend on besides the swept values: the scenario as written (with its overrides,
    the swept keys left out), the model and hardware it resolves to, and the grid's keys. ``--resume`` refuses a
    file written for another."""
    raw = json.loads(json.dumps(scenario.raw, default=str))
    for key in grid:
        node, *path = key.split(".")
        parent, last = raw, node
        for part in path:
            if not isinstance(parent.get(last), dict):
                parent = None
                break
            parent, last = parent[last], part
        if isinstance(parent, dict):
            parent.pop(last, None)
    hardware = json.loads(scenario.hardware.model_dump_json())
    model = json.loads(scenario.model.model_dump_json())     # a model file may change under the same path
    return {"grid": list(grid), "scenario": raw, "model": model, "hardware": hardware}


def _identity_file(path: Path) -> Path:
    return path.with_name(path.name + ".sweep.json")


def _check_identity(path: Path, identity: dict[str, Any], resume: bool) -> None:
    """Refuse to resume a table whose rows came from another scenario or hardware."""
    side = _identity_file(path)
    if resume and side.exists() and (path.exists() or path.with_name(path.name + ".partial.jsonl").exists()):
        try:
            found = json.loads(side.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            found = None
        if isinstance(found, dict) and found != identity:
            if found.get("grid", identity["grid"]) != identity["grid"]:
                return          # another grid: the table's columns say so (RowFile names it)
            what = next((name for key, name in (("scenario", "scenario (or its --set overrides)"),
                                                ("model", "model (its file changed)"), ("hardware", "hardware"))
                         if found.get(key) != identity[key]), "scenario")
            raise InputError(f"cannot resume: its rows were computed for another {what} "
                             f"(recorded in {display_path(side)}); use another --out file or drop --resume",
                             file=display_path(path))


def sweep_to_file(scenario: Scenario, grid: dict[str, list], path: str | Path, *, resume: bool = False,
                  workers: int | None = None, executor: Executor | None = None, progress: bool | None = None):
    """:func:`sweep`, with each row appended to ``path`` as it finishes; ``resume`` skips the points
    already in the file (matched on the swept values), and refuses a file whose rows came from another
    scenario or hardware (``<path>.sweep.json`` records what they came from). Returns the whole table as written: the grid's
    points first, in grid order, then rows of other grids kept from a resume. Its ``attrs`` count the
    grid's points (``grid_points``), those found in the file and not run again (``resumed_points``) and,
    of those run now, the ones simulated (``simulated_points``) and the invalid or failed ones
    (``failed_points``)."""
    points = grid_points(grid)
    output_format(path)
    check_grid_keys(scenario, grid)
    identity = sweep_identity(scenario, grid)
    _check_identity(Path(path), identity, resume)
    table = RowFile(path, list(grid), resume=resume)
    write_atomic(_identity_file(Path(path)), json.dumps(identity, sort_keys=True, indent=1) + "\n")
    try:
        todo = [p for p in points if not table.done(p)]
        rows = run_points(scenario, todo, workers=workers, executor=executor, progress=progress,
                          on_point=table.append)
    finally:
        table.close()
    table.finish(points)
    frame = read_table(path)
    simulated = sum(1 for row in rows if not row.get("error"))
    frame.attrs.update(grid_points=len(points), resumed_points=len(points) - len(todo),
                       simulated_points=simulated, failed_points=len(rows) - simulated)
    return frame

__all__ = ["sweep", "sweep_to_file", "read_table", "write_table", "RowFile", "table_format", "output_format", "cell", "grid_points", "run_points", "evaluate_point", "ScenarioPayload", "METRICS", "COLUMNS",
           "open_executor", "run_tasks", "progress_bar", "SerialExecutor", "error_text", "check_grid_keys",
           "WorkersFailed"]
