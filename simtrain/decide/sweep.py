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
from collections.abc import Callable, Iterable
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from simtrain.decide.workers import open_executor, progress_bar, run_tasks
from simtrain.spec.errors import InputError, SimulationLimitError
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
    def of(cls, scenario: Scenario) -> ScenarioPayload:
        return cls(raw=scenario.raw, file=scenario.file, base_dir=str(scenario.base_dir))

    def build(self) -> Scenario:
        return scenario_from_dict(self.raw, file=self.file, base_dir=Path(self.base_dir))


def error_text(err: BaseException) -> str:
    """One line for the ``error`` column: the located message of an InputError, else the type and message."""
    text = str(err) if isinstance(err, InputError) else f"{type(err).__name__}: {err}"
    return " ".join(text.split()) or type(err).__name__


#: grid points a sweep runs at most unless its caller raises it: a point is a whole simulation (0.1 s to seconds),
#: so 100,000 points are hours to days of one core, and the points and their rows stay well under 100 MB
MAX_POINTS = 100_000


def grid_points(grid: dict[str, list] | list[dict[str, Any]], zip: Iterable[str] | None = None,  # noqa: A002
                max_points: int = MAX_POINTS) -> list[dict[str, Any]]:
    """The points of a sweep: the cartesian product of ``grid`` in its key order (the last key varies fastest),
    except that the keys named in ``zip`` go in step (their lists paired value by value, as one axis in the place
    of the first of them); or, when ``grid`` is a list of override dicts, those points as given. More than
    ``max_points`` points is refused before any is built."""
    limit = as_whole(max_points)
    if limit is None or limit < 1:
        raise InputError(f"max_points={max_points!r}: give a whole number, 1 or more", field="max_points")
    max_points = limit
    if isinstance(grid, list):
        if len(grid) > max_points:
            raise SimulationLimitError(f"this sweep lists {len(grid):,} points, more than max_points={max_points:,}; "
                                       "each point is a whole simulation: sweep fewer, or raise the limit "
                                       "(--max-points, sweep(max_points=...))", field="grid")
        return _listed_points(grid, zip)
    if not isinstance(grid, dict) or not grid:
        raise InputError("a sweep grid needs at least one key, e.g. {'parallel.pp': [2, 4, 8]}", field="grid")
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
    paired = _zip_keys(grid, zip)
    size = 1
    for key in grid:
        if key not in paired[1:]:
            size *= len(list(grid[key]))
    if size > max_points:
        shape = " x ".join(f"{len(list(grid[k])):,}" for k in grid if k not in paired[1:])
        raise SimulationLimitError(f"this grid has {size:,} points ({shape}), more than max_points={max_points:,}; "
                                   "each point is a whole simulation: sweep fewer values, or raise the limit "
                                   "(--max-points, sweep(max_points=...))", field="grid")
    axes: list[list[dict[str, Any]]] = []
    for key in grid:
        if key in paired and key != paired[0]:
            continue
        if key in paired:
            columns = {k: list(grid[k]) for k in paired}
            lengths = {k: len(c) for k, c in columns.items()}
            if len(set(lengths.values())) > 1:
                raise InputError("the paired keys need lists of one length; they have "
                                 + ", ".join(f"{k}: {n}" for k, n in lengths.items()), field="zip")
            axes.append([{k: columns[k][i] for k in paired} for i in range(lengths[paired[0]])])
        else:
            axes.append([{key: v} for v in grid[key]])
    return [{k: v for part in combo for k, v in part.items()} for combo in itertools.product(*axes)]


def _zip_keys(grid: dict[str, list], zip_keys: Iterable[str] | None) -> list[str]:
    """The grid keys that go in step, in the grid's order; a name the grid lacks is an error."""
    if zip_keys is None:
        return []
    if isinstance(zip_keys, str):
        zip_keys = [zip_keys]
    chosen = list(zip_keys)
    for key in chosen:
        if key not in grid:
            raise InputError(f"{key!r} is not a key of the grid ({', '.join(map(str, grid))})", field="zip")
    return [k for k in grid if k in chosen]


def _listed_points(points: list[dict[str, Any]], zip_keys: Any) -> list[dict[str, Any]]:
    """A sweep given as its points: each a non-empty mapping of dotted keys; all name the same keys (the columns)."""
    if zip_keys is not None:
        raise InputError("only for a grid ({key: [values]}); a list of points is already paired", field="zip")
    if not points:
        raise InputError("a sweep needs at least one point, e.g. [{'parallel.pp': 2}, {'parallel.pp': 4}]",
                         field="grid")
    keys = None
    for i, point in enumerate(points):
        if not isinstance(point, dict) or not point:
            raise InputError(f"point {i} of the sweep is not a mapping of dotted keys to values, e.g. "
                             "{'parallel.pp': 2, 'parallel.dp': 8}", field="grid")
        if keys is None:
            keys = list(point)
        elif set(point) != set(keys):
            raise InputError(f"point {i} of the sweep sets {sorted(point)}, point 0 sets {sorted(keys)}: give every "
                             "point the same keys (they are the table's columns)", field="grid")
    return [{k: p[k] for k in keys} for p in points]


def swept_keys(grid: dict[str, list] | list[dict[str, Any]]) -> list[str]:
    """The keys a sweep sets, in column order."""
    return list(grid[0]) if isinstance(grid, list) else list(grid)


def grid_values(grid: dict[str, list] | list[dict[str, Any]]) -> dict[str, list]:
    """Each swept key with its values (the first point's first), for checks that need one value per key."""
    if isinstance(grid, dict):
        return grid
    return {k: [p[k] for p in grid] for k in swept_keys(grid)}


def as_grid(grid: Any) -> dict[str, list]:
    """A caller's grid with each key's values as a list (a generator, a set, a numpy array or a range is read once,
    here, so that every later use sees the same values); the grid itself is checked by :func:`grid_points`."""
    if not isinstance(grid, dict):
        return grid
    return {key: (list(values) if isinstance(values, Iterable) and not isinstance(values, (str, bytes, dict))
                  else values) for key, values in grid.items()}


def check_grid_keys(scenario: Scenario, grid: dict[str, list]) -> None:
    """A grid key the scenario schema does not have is a typo to report before any point runs, not an error
    in every row."""
    from simtrain.spec.yamlio import OVERRIDE_NOTE

    for key, values in grid.items():
        try:
            scenario.with_overrides({key: list(values)[0]})
        except InputError as err:
            # only the key's own path: an error inside a file the value names (a model file's typo) is that file's
            own_path = err.field is not None and (err.field == key or key.startswith(f"{err.field}."))
            if own_path and (err.message.startswith("unknown key") or err.message.startswith("cannot set")):
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


def run_points(scenario: Scenario, points: list[dict[str, Any]], *, workers: int | None = None,
               executor: Executor | None = None, progress: bool | None = None,
               on_point: Callable[[dict[str, Any]], None] | None = None, keep: bool = True) -> list[dict[str, Any]]:
    """Rows (swept values, then :data:`COLUMNS`) for ``points``, in the order given; with ``keep=False`` none are
    kept (``on_point`` has each one), so memory holds only the points in flight."""
    payload = ScenarioPayload.of(scenario)
    rows: list[dict[str, Any] | None] = [None] * len(points) if keep else []
    with open_executor(workers, executor, len(points)) as ex, progress_bar(len(points), progress, "sweep") as bar:
        for i, value in run_tasks(evaluate_point, [(payload, p) for p in points], ex, bar=bar):
            if isinstance(value, BaseException):
                value = {**{k: None for k in METRICS}, "error": error_text(value)}
            row = {**points[i], **{k: value.get(k) for k in COLUMNS}}
            if keep:
                rows[i] = row
            if on_point is not None:
                on_point(row)
    return [r for r in rows if r is not None]


def sweep(scenario: Scenario, grid: dict[str, list] | list[dict[str, Any]], workers: int | None = None,
          executor: Executor | None = None, progress: bool | None = None,
          on_point: Callable[[dict[str, Any]], None] | None = None, zip: Iterable[str] | None = None,  # noqa: A002
          max_points: int = MAX_POINTS):
    """Simulate every point of ``grid`` (module docstring; :func:`grid_points` for paired keys and listed points);
    a DataFrame with one row per point (:mod:`simtrain.decide.tables` for its columns and dtypes). A sweep of more
    than ``max_points`` points (default 100,000) is refused before any runs.

    ``on_point(row)`` is called in this process as each point finishes (in finishing order).
    """
    from simtrain.decide.tables import column_name, frame_of

    grid = as_grid(grid)
    points = grid_points(grid, zip, max_points)
    check_grid_keys(scenario, grid_values(grid))
    rows = run_points(scenario, points, workers=workers, executor=executor, progress=progress, on_point=on_point)
    return frame_of([{column_name(k): v for k, v in row.items()} for row in rows],
                    [*(column_name(k) for k in swept_keys(grid)), *COLUMNS])


# --- sweeps to a file, row by row, resumable ---------------------------------------------------

