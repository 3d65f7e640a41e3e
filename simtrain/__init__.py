"""simtrain: a discrete-event simulator of distributed training steps.

The Python API that notebooks use (the CLI is a thin shell over it)::

    import simtrain
    sc = simtrain.load_scenario("scenarios/pp4_dp4.yaml")
    result = simtrain.simulate(sc)          # a Result; result.to_dict() is the JSON report
    table = simtrain.sweep(sc, {"parallel.pp": [2, 4, 8]})   # a pandas DataFrame

Heavy modules (plotly, pandas, the engine) load on first use, so ``import simtrain`` stays fast.
The functions keep their names for good: the modules behind them are called differently
(``simtrain.simulation``, ``simtrain.sweeps``), so importing them never shadows a function.
"""

from __future__ import annotations

from typing import Any

from simtrain.errors import InputError
from simtrain.scenario import Scenario, load_scenario, scenario_from_dict

__version__ = "0.1.0"
__all__ = ["InputError", "Scenario", "load_scenario", "scenario_from_dict", "simulate", "memory_only", "sweep"]


def simulate(scenario: Scenario, **kwargs: Any):
    """Simulate one optimizer step; see :func:`simtrain.simulation.simulate`."""
    from simtrain.simulation import simulate as _simulate

    return _simulate(scenario, **kwargs)


def memory_only(scenario: Scenario):
    """The memory ledger without a simulation (``simtrain memory``); see :func:`simtrain.simulation.memory`.

    (Not called ``memory``: that is the name of the memory-model module.)"""
    from simtrain.simulation import memory as _memory

    return _memory(scenario)


def sweep(scenario: Scenario, grid: dict[str, list], **kwargs: Any):
    """Simulate every point of ``grid``; see :func:`simtrain.sweeps.sweep`."""
    from simtrain.sweeps import sweep as _sweep

    return _sweep(scenario, grid, **kwargs)
