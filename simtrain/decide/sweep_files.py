"""Sweep tables on disk: CSV, JSON lines or Parquet, rows appended as points finish, resumable.

:func:`sweep_to_file` runs a sweep into a file; ``resume=True`` keeps the rows already there and refuses
a table computed from another scenario, other overrides or edited model and hardware files (the record
``<out>.sweep.json`` says what the rows came from).
"""

from __future__ import annotations

import json
from concurrent.futures import Executor
from pathlib import Path
from typing import Any

from simtrain.decide.sweep import COLUMNS, MAX_POINTS, as_grid, check_grid_keys, grid_points, run_points
from simtrain.decide.table_lock import table_lock
from simtrain.decide.tables import DTYPES, column_name, typed
from simtrain.report.outputs import check_replaceable, special_target, write_atomic, write_target
from simtrain.spec.errors import InputError, display_path
from simtrain.spec.scenario import Scenario

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
    """numpy scalars to Python; NaN and pandas' NA to None (a missing metric)."""
    if type(value).__name__ == "NAType":
        return None
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


#: the metrics a sweep writes as numbers: finite and >= 0 where present (a failed point leaves them empty)
_NUMERIC = tuple(c for c in COLUMNS if c != "error" and DTYPES.get(c) == "float64")


def _check_metrics(row: dict[str, Any], n: int) -> None:
    """A row read back by --resume holds what a sweep writes: each numeric metric empty, or finite and >= 0;
    an edited value (1e999, nan, text) is refused, naming the row and the column, not carried into the best."""
    for column in _NUMERIC:
        value = row.get(column)          # not _plain: a NaN here was written by hand (simtrain writes none)
        if value is None or value == "":
            continue
        try:
            number = float(value) if not isinstance(value, bool) else float("nan")
        except (TypeError, ValueError):
            number = float("nan")
        if not (number == number and 0 <= number < float("inf")):
            raise ValueError(f"row {n}: {column} holds {value!r}, not a finite number >= 0")


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
        self.keys = [column_name(k) for k in keys]     # rows on disk name a swept key by its column
        self.columns = [*self.keys, *COLUMNS]
        self.stream = self.path.with_name(self.path.name + ".partial.jsonl") if self.fmt == "parquet" else self.path
        self.stream_fmt = "jsonl" if self.fmt == "parquet" else self.fmt
        self.entries: dict[tuple, str] = {}
        if resume:
            self._load_existing()
        header = _line({c: c for c in self.columns}, self.columns, "csv") if self.stream_fmt == "csv" else ""
        write_atomic(self.stream, header + "".join(self.entries.values()))   # valid rows only, then append
        self._fh = open(self.stream, "a", encoding="utf-8", newline="")

    def _load_existing(self) -> None:
        """The rows already in the table (and, for Parquet, in its rows in progress). A file that is not the table
        its name says (a CSV named .parquet, a binary file named .csv, JSON lines that are not objects) is refused
        with what was found, never read as rows."""
        where = self.path
        try:
            if self.fmt == "parquet" and self.path.exists():
                import pyarrow.parquet as pq

                table = pq.read_table(self.path)
                self._check_columns(list(table.column_names), self.path)
                for row in table.to_pylist():
                    self._add(row, _line(row, self.columns, "jsonl"), read_back=True)
            where = self.stream
            if self.stream.exists():
                self._load_stream()
        except InputError:
            raise
        except (Exception, RecursionError) as err:  # noqa: BLE001 - any reader's complaint means "not that table"
            kind = {"csv": "a CSV", "jsonl": "a JSON-lines", "parquet": "a Parquet"}[
                self.stream_fmt if where == self.stream else self.fmt]
            detail = " ".join(str(err).split())[:120] or type(err).__name__
            raise InputError(f"cannot resume: it is not {kind} table simtrain wrote ({type(err).__name__}: "
                             f"{detail}); use another path or resume=False", file=display_path(where)) from None

    def _check_columns(self, found: list[str], where: Path) -> None:
        if found != self.columns:
            raise InputError(f"cannot resume: its columns {found} are not this sweep's {self.columns} "
                             "(a different grid?); use another path or resume=False", file=str(where))

    def key(self, row: dict[str, Any]) -> tuple:
        return tuple(cell(row.get(k)) for k in self.keys)

    @staticmethod
    def _named(row: dict[str, Any]) -> dict[str, Any]:
        """A point or a row with its swept keys named as columns (``parallel.pp`` -> ``parallel_pp``)."""
        return {column_name(k): v for k, v in row.items()}

    def _add(self, row: dict[str, Any], line: str, read_back: bool = False) -> None:
        if read_back:       # what the sweep appends itself is what it computed
            _check_metrics(row, len(self.entries) + 1)
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
                if len(cells) != len(self.columns):
                    raise ValueError(f"a row has {len(cells)} cells for {len(self.columns)} columns")
                self._add(dict(zip(self.columns, cells)), line, read_back=True)
            return
        for line in lines:
            if not line.strip():
                continue
            row = json.loads(line)      # a line that is not JSON: not a table simtrain wrote (refused above)
            if not isinstance(row, dict):
                raise ValueError(f"a line holds {type(row).__name__}, not a row (a JSON object)")
            self._check_columns(list(row), self.stream)
            self._add(row, line, read_back=True)

    def done(self, point: dict[str, Any]) -> bool:
        return self.key(self._named(point)) in self.entries

    def append(self, row: dict[str, Any]) -> None:
        row = self._named(row)
        line = _line(row, self.columns, self.stream_fmt)
        self._fh.write(line)
        self._fh.flush()
        self._add(row, line)

    def close(self) -> None:
        self._fh.close()

    def finish(self, points: list[dict[str, Any]]):
        """Rewrite the table atomically: grid order first, then rows of other grids kept from a resume. Returns
        the table as written (from this process's own rows, never read back from a path another may change)."""
        self.close()
        order = [self.key(self._named(p)) for p in points]
        known = set(order)
        lines = [self.entries[k] for k in order if k in self.entries]
        lines += [line for k, line in self.entries.items() if k not in known]
        if self.fmt == "parquet":
            import io

            import pandas as pd

            frame = typed(pd.DataFrame([json.loads(line) for line in lines], columns=self.columns))
            buf = io.BytesIO()
            parquet_safe(frame).to_parquet(buf, index=False)
            write_atomic(self.path, buf.getvalue())
            self.stream.unlink(missing_ok=True)
            return pd.read_parquet(io.BytesIO(buf.getvalue()))
        header = _line({c: c for c in self.columns}, self.columns, "csv") if self.fmt == "csv" else ""
        text = header + "".join(lines)
        write_atomic(self.path, text)
        return _parse_table(text, self.fmt)


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
    """A sweep or search table written by simtrain, as a DataFrame with the dtypes it was written with
    (:mod:`simtrain.decide.tables`): a CSV's empty cells are missing values, not text or NaN in a text column."""
    import pandas as pd

    fmt = table_format(path)
    if fmt == "parquet":
        return typed(pd.read_parquet(path))
    with open(path, encoding="utf-8") as fh:
        return typed(_parse_table(fh.read(), fmt))


def _parse_table(text: str, fmt: str):
    """A CSV or JSON-lines table's text as a DataFrame (JSON lines through the json module: exact floats and the
    file's column order)."""
    import io

    import pandas as pd

    if fmt == "csv":
        # text as written ('1f1b' stays text, 'True' stays a flag), numbers parsed: pandas' own inference, over the
        # whole column at once (low_memory=False: no DtypeWarning for a search table's mixed columns)
        return pd.read_csv(io.StringIO(text), keep_default_na=False, na_values=[""], low_memory=False)
    return pd.DataFrame([json.loads(line) for line in text.splitlines() if line.strip()])


def write_table(frame, path: str | Path) -> Path:
    """A whole DataFrame to CSV, JSON lines or Parquet (by extension), atomically."""
    import io

    fmt = output_format(path)
    columns = [str(c) for c in frame.columns]
    rows = frame.to_dict(orient="records")
    header = _line({c: c for c in columns}, columns, "csv") if fmt == "csv" else ""
    check_replaceable(path, header.encode("utf-8") if header else None)   # never over another program's file
    if fmt == "parquet":
        buf = io.BytesIO()
        parquet_safe(frame).to_parquet(buf, index=False)
        return write_atomic(path, buf.getvalue())
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
    # a model file may change under the same path; its warnings (unmodelled) change no row, and tables written
    # before the field existed resume; so do those written before the bias flags, where they are false
    later = {key for key in ("qkv_bias", "attention_bias", "mlp_bias") if not getattr(scenario.model, key)}
    model = json.loads(scenario.model.model_dump_json(exclude={"unmodelled"} | later))
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
                             f"(recorded in {display_path(side)}); use another path or resume=False",
                             file=display_path(path))


def regular_table(path: str | Path) -> None:
    """A sweep table is appended to and read back by --resume: it must be a regular file (or none yet), and so
    must the files beside it (its record, its Parquet rows in progress)."""
    path = Path(path)
    for target in (path, path.with_name(path.name + ".partial.jsonl"), _identity_file(path)):
        if special_target(target):
            raise InputError(f"cannot write the sweep table '{display_path(path)}': '{display_path(target)}' is a "
                             "device or FIFO, and a table is appended to and read back; name a regular file")


def sweep_to_file(scenario: Scenario, grid: dict[str, list], path: str | Path, *, resume: bool = False,
                  workers: int | None = None, executor: Executor | None = None, progress: bool | None = None,
                  max_points: int = MAX_POINTS):
    """:func:`sweep`, with each row appended to ``path`` as it finishes; ``resume`` skips the points
    already in the file (matched on the swept values), and refuses a file whose rows came from another
    scenario or hardware (``<path>.sweep.json`` records what they came from). Returns the whole table as
    written: the grid's points first, in grid order, then rows of other grids kept from a resume. Its ``attrs``
    count the grid's points (``grid_points``), those found in the file and not run again (``resumed_points``) and,
    of those run now, the ones simulated (``simulated_points``) and the invalid or failed ones
    (``failed_points``)."""
    grid = as_grid(grid)
    points = grid_points(grid, max_points=max_points)
    output_format(path)
    # a symlinked table is its target's: one lock, one record and one Parquet side file for every name of it
    path = write_target(path)
    check_grid_keys(scenario, grid)
    regular_table(path)
    # never over another program's file: the table (--resume reads it first and refuses what is no table), the rows
    # of a Parquet table in progress, and the record, which is rewritten whether or not the sweep resumes
    out = Path(path)
    check_replaceable(_identity_file(out))
    if not resume:
        check_replaceable(out)
        if output_format(out) == "parquet":
            check_replaceable(out.with_name(out.name + ".partial.jsonl"))
    identity = sweep_identity(scenario, grid)
    with table_lock(path):
        _check_identity(Path(path), identity, resume)
        table = RowFile(path, list(grid), resume=resume)
        write_atomic(_identity_file(Path(path)), json.dumps(identity, sort_keys=True, indent=1) + "\n")
        counts = {"simulated": 0, "failed": 0}

        def written(row: dict[str, Any]) -> None:      # rows go to the file as they finish; only counts stay here
            table.append(row)
            counts["failed" if row.get("error") else "simulated"] += 1

        try:
            todo = [p for p in points if not table.done(p)]
            run_points(scenario, todo, workers=workers, executor=executor, progress=progress, on_point=written,
                       keep=False)
        finally:
            table.close()
        frame = table.finish(points)
    frame.attrs.update(grid_points=len(points), resumed_points=len(points) - len(todo),
                       simulated_points=counts["simulated"], failed_points=counts["failed"])
    return frame

