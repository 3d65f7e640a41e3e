"""simtrain: a discrete-event simulator of distributed training steps.

The Python API that notebooks use (the CLI is a thin shell over it); every decision tool is a function::

    import simtrain
    sc = simtrain.load_scenario("pp4_dp4")             # a bundled scenario by name, or a file's path
    result = simtrain.simulate(sc)                      # a Result: result.summary(), result.gantt(), ...
    simtrain.memory(sc)                                 # the memory ledger alone (also simtrain.memory_only)
    table = simtrain.sweep(sc, {"parallel.pp": [2, 4, 8]})      # a DataFrame, one row per point
    found = simtrain.search(sc, fix={"parallel.zero": 1})       # found.best.scenario runs the winner
    simtrain.compare([sc_a, sc_b], tokens="2T", price_per_gpu_hour=2.0, goodput=0.9)   # a DataFrame
    simtrain.validate()                                 # a DataFrame of published runs, predicted vs measured
    simtrain.charts.plot_sweep(table)                   # the plotly Figure `simtrain sweep --plot` writes

``simtrain.scenarios()``, ``simtrain.hardware()`` and ``simtrain.models()`` list what is bundled. Heavy modules
(plotly, pandas, the engine) load on first use, so ``import simtrain`` stays fast. The package is layered
(docs/architecture.md): spec -> plan -> engine -> decide, with report beside; the decision tools' modules live in
``simtrain.decide`` (``simtrain.decide.search``...), so importing them never shadows these functions.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from simtrain.spec.errors import InputError
    from simtrain.spec.scenario import Scenario

#: loaded on first use too (pydantic, yaml, networkx): ``import simtrain`` and the command line's start-up stay
#: short, so a Ctrl-C there meets simtrain's own handler, not a traceback from an import
_SCENARIO_NAMES = {"Scenario": "simtrain.spec.scenario", "load_scenario": "simtrain.spec.scenario",
                   "scenario_from_dict": "simtrain.spec.scenario", "InputError": "simtrain.spec.errors"}

__version__ = "0.1.0"
__all__ = ["InputError", "Scenario", "load_scenario", "scenario_from_dict", "simulate", "memory", "memory_only",
           "sweep", "search", "compare", "validate", "scenarios", "hardware", "models"]


#: modules a notebook reaches as ``simtrain.charts``... without importing them first (loaded on first use)
_SUBMODULES = {"charts": "simtrain.report.charts", "estimate": "simtrain.decide.estimate",
               "simulation": "simtrain.engine.simulation", "variation": "simtrain.engine.variation"}
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
    """A Scenario, or the path (or bundled name) of a scenario file, loaded; anything else is named as the wrong
    argument."""
    from os import PathLike

    from simtrain.spec.scenario import Scenario, load_scenario

    if isinstance(scenario, Scenario):
        return scenario
    if isinstance(scenario, (str, PathLike)):
        return load_scenario(scenario)
    raise TypeError(f"simtrain.{function}: scenario must be a Scenario (simtrain.load_scenario), the path of a "
                    f"scenario file or a bundled scenario's name, not {type(scenario).__name__}")


def scenarios() -> list[str]:
    """The bundled example scenarios' names: ``simtrain.load_scenario(name)`` loads one."""
    from simtrain.spec.bundled import scenario_names

    return scenario_names()


def hardware() -> list[str]:
    """The bundled hardware files' names (a scenario's ``hardware:``)."""
    from simtrain.spec.bundled import hardware_names

    return hardware_names()


def models() -> list[str]:
    """The bundled model presets' names (a scenario's ``model:``)."""
    from simtrain.spec.bundled import model_names

    return model_names()


def simulate(scenario: Scenario | str, *, fidelity: str | None = None, seed: int | None = None):
    """Simulate one optimizer step of ``scenario`` (a Scenario, a scenario file's path or a bundled name) and return
    its Result: ``result.summary()`` is the text of ``simtrain run``, ``result.to_dict()`` its JSON report.
    ``fidelity`` ('folded' or 'full') and ``seed`` replace the scenario's ``simulation.fidelity`` and
    ``simulation.seed`` for this run."""
    from simtrain.engine.simulation import simulate as _simulate

    return _simulate(_scenario(scenario, "simulate"), fidelity=fidelity, seed=seed)


def memory(scenario: Scenario | str):
    """The memory ledger without a simulation (``simtrain memory``): a Result without times;
    ``.summary()`` is the per-stage table and the verdict."""
    from simtrain.engine.simulation import memory as _memory

    return _memory(_scenario(scenario, "memory"))


#: the name this function had first (kept: notebooks call it)
memory_only = memory


def sweep(scenario: Scenario | str, grid: dict[str, list] | list[dict[str, Any]], *,
          zip: Iterable[str] | None = None, workers: int | None = None, executor: Any = None,
          progress: bool | None = None, on_point: Any = None, max_points: int | None = None):
    """Simulate ``scenario`` at every point of ``grid`` and return a pandas DataFrame: one row per point, the swept
    keys (as columns ``parallel_pp``...) then step_time_s, tokens_per_s, mfu, bubble_fraction, peak_memory_bytes_max,
    fits_in_memory and error (SI units; fixed dtypes, docs/decide.md).

    ``grid`` is {dotted key: [values]} (a cartesian product; the keys named in ``zip`` go in step instead, their
    lists paired value by value), or a list of override dicts, one point each. ``workers`` processes (default: one
    per core; 1 runs here), or any concurrent.futures ``executor`` (a Dask client's too); in a script, call it under
    ``if __name__ == "__main__":``. ``on_point(row)`` is called here as each point finishes. A sweep of more than
    ``max_points`` points (default 100,000) is refused before any runs."""
    from simtrain.decide.sweep import MAX_POINTS
    from simtrain.decide.sweep import sweep as _sweep

    return _sweep(_scenario(scenario, "sweep"), grid, zip=zip, workers=workers, executor=executor,
                  progress=progress, on_point=on_point, max_points=MAX_POINTS if max_points is None else max_points)


def search(scenario: Scenario | str, *, gpus: int | None = None, top: int = 5, max_memory: float | None = None,
           fix: dict[str, Any] | None = None, workers: int | None = None, executor: Any = None,
           progress: bool | None = None, max_layouts: int | None = None):
    """The ``top`` fastest layouts (tp, pp, dp, vpp, micro-batch, ZeRO, recompute, schedule, SP) of the scenario's
    model and global batch on its cluster (or ``gpus`` GPUs). ``fix`` narrows the layouts searched
    ({"parallel.zero": 1, "parallel.tp": [4, 8]}); ``max_memory`` is the fraction of the GPU's memory a layout may
    use (default 0.92: the memory ledger's measured error kept free). Returns a SearchResult: ``.best.scenario``,
    ``.scenario(i)``, ``.table`` (a DataFrame of every candidate), ``.summary()``, ``.figure()``."""
    from simtrain.decide.search import DEFAULT_MAX_MEMORY, MAX_LAYOUTS
    from simtrain.decide.search import search as _search

    return _search(_scenario(scenario, "search"), gpus=gpus, top=top, workers=workers, executor=executor,
                   progress=progress, fix=fix, max_memory=DEFAULT_MAX_MEMORY if max_memory is None else max_memory,
                   max_layouts=MAX_LAYOUTS if max_layouts is None else max_layouts)


def compare(scenarios: Iterable[Scenario | str], tokens: float | str = 1e12, *,
            price_per_gpu_hour: float | dict[str, float] | None = None, goodput: float | None = None):
    """The scenarios side by side for a token budget (``tokens``: a number or '2T', '300B'): a DataFrame, one row
    per scenario, with step time, tokens/s, MFU, memory, time to train (seconds and days), GPU-hours, price, cost
    (USD) and GPU board energy (J and MWh). ``price_per_gpu_hour`` replaces the prices (one number, or a mapping by
    scenario or hardware name); ``goodput`` in (0, 1] is the share of wall time spent training (without it the days
    are steady-state). ``attrs["warnings"]`` says what makes the comparison unfair; ``simtrain.charts.plot_compare``
    draws it."""
    from simtrain.decide.compare import compare as _compare
    from simtrain.decide.compare import compare_frame
    from simtrain.spec.scenario import Scenario

    if isinstance(scenarios, (str, Scenario)) or not isinstance(scenarios, Iterable):
        raise TypeError("simtrain.compare: scenarios must be a list of Scenarios, scenario files or bundled names")
    loaded = [_scenario(s, "compare") for s in scenarios]
    return compare_frame(_compare(loaded, tokens, price_per_gpu_hour=price_per_gpu_hour, goodput=goodput))


def validate(cases: str | None = None, *, only: str | None = None, progress: bool | None = None):
    """Predicted against measured step times on published training runs (``simtrain validate``): a DataFrame, one
    row per case; ``cases`` is a cases file or a bundled set's name (default: the dev set), ``only`` keeps the
    cases whose id contains it. ``simtrain.charts.plot_validate`` draws it."""
    from simtrain.decide.validate import validate_frame

    return validate_frame(cases, only=only, progress=progress)
