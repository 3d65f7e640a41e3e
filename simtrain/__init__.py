"""simtrain: a discrete-event simulator of distributed training steps.

The Python API that notebooks use (the CLI is a thin shell over it)::

    import simtrain
    sc = simtrain.load_scenario("scenarios/pp4_dp4.yaml")
    result = simtrain.simulate(sc)          # a Result; result.to_dict() is the JSON report
    table = simtrain.sweep(sc, {"parallel.pp": [2, 4, 8]})   # a pandas DataFrame

Heavy modules (plotly, pandas, the engine) load on first use, so ``import simtrain`` stays fast.
The functions keep their names for good: the modules behind them are called differently
(``simtrain.engine.simulation``, ``simtrain.decide.sweep``), so importing them never shadows a function.
The package is layered (docs/architecture.md): spec -> plan -> engine -> decide, with report beside.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from simtrain.spec.errors import InputError
    from simtrain.spec.scenario import Scenario

#: loaded on first use too (pydantic, yaml, networkx): ``import simtrain`` and the command line's start-up stay
#: short, so a Ctrl-C there meets simtrain's own handler, not a traceback from an import
_SCENARIO_NAMES = {"Scenario": "simtrain.spec.scenario", "load_scenario": "simtrain.spec.scenario",
                   "scenario_from_dict": "simtrain.spec.scenario", "InputError": "simtrain.spec.errors"}

__version__ = "0.1.0"
__all__ = ["InputError", "Scenario", "load_scenario", "scenario_from_dict", "simulate", "memory_only", "sweep"]


#: names a notebook reaches as ``simtrain.search``, ``simtrain.compare``... without importing them first
#: (loaded on first use, so ``import simtrain`` stays fast): the modules behind the decision tools and charts
_SUBMODULES = {"charts": "simtrain.report.charts", "compare": "simtrain.decide.compare",
               "estimate": "simtrain.decide.estimate", "memory": "simtrain.plan.memory",
               "search": "simtrain.decide.search", "simulation": "simtrain.engine.simulation",
               "sweeps": "simtrain.decide.sweep", "validate": "simtrain.decide.validate",
               "variation": "simtrain.engine.variation"}
#: the layers (docs/architecture.md), also loaded on first use
_LAYERS = ("spec", "plan", "engine", "report", "decide", "cli")


def __getattr__(name: str):
    if name in _SCENARIO_NAMES:
        import importlib

        return getattr(importlib.import_module(_SCENARIO_NAMES[name]), name)
    if name in _SUBMODULES or name in _LAYERS:
        import importlib

        return importlib.import_module(_SUBMODULES.get(name, f"simtrain.{name}"))
    raise AttributeError(f"module 'simtrain' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*__all__, *_SUBMODULES, *_LAYERS, "__version__"])


def _scenario(scenario: Any, function: str) -> Scenario:
    """A Scenario, or the path of a scenario file (loaded); anything else is named as the wrong argument."""
    from os import PathLike

    from simtrain.spec.scenario import Scenario, load_scenario

    if isinstance(scenario, Scenario):
        return scenario
    if isinstance(scenario, (str, PathLike)):
        return load_scenario(scenario)
    raise TypeError(f"simtrain.{function}: scenario must be a Scenario (simtrain.load_scenario) or the path of a "
                    f"scenario file, not {type(scenario).__name__}")


def simulate(scenario: Scenario | str, *, fidelity: str | None = None, seed: int | None = None):
    """Simulate one optimizer step of ``scenario`` (a Scenario or a scenario file's path) and return its Result;
    ``result.to_dict()`` is the JSON report of ``simtrain run``. ``fidelity`` ('folded' or 'full') and ``seed``
    replace the scenario's ``simulation.fidelity`` and ``simulation.seed`` for this run."""
    from simtrain.engine.simulation import simulate as _simulate

    return _simulate(_scenario(scenario, "simulate"), fidelity=fidelity, seed=seed)


def memory_only(scenario: Scenario | str):
    """The memory ledger without a simulation (``simtrain memory``); see :func:`simtrain.engine.simulation.memory`.

    (Not called ``memory``: that is the name of the memory-model module.)"""
    from simtrain.engine.simulation import memory as _memory

    return _memory(_scenario(scenario, "memory_only"))


def sweep(scenario: Scenario | str, grid: dict[str, list], *, workers: int | None = None, executor: Any = None,
          progress: bool | None = None, on_point: Any = None, max_points: int | None = None):
    """Simulate ``scenario`` at every point of ``grid`` ({dotted key: [values]}, a cartesian product) and return
    a pandas DataFrame: one row per point, the swept keys then step_time_s, tokens_per_s, mfu, bubble_fraction,
    peak_memory_bytes_max, fits_in_memory and error (SI units).

    ``workers`` processes (default: one per core; 1 runs here), or any concurrent.futures ``executor`` (a Dask
    client's too); in a script, call it under ``if __name__ == "__main__":``, since each worker imports the
    script. ``on_point(row)`` is called here as each point finishes. A grid of more than ``max_points`` points
    (default 100,000) is refused before any runs. See :func:`simtrain.decide.sweep.sweep`."""
    from simtrain.decide.sweep import MAX_POINTS
    from simtrain.decide.sweep import sweep as _sweep

    return _sweep(_scenario(scenario, "sweep"), grid, workers=workers, executor=executor, progress=progress,
                  on_point=on_point, max_points=MAX_POINTS if max_points is None else max_points)
