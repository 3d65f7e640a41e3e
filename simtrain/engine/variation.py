"""Run-to-run variation: several seeds of a jittered scenario, summarised."""

from __future__ import annotations

import numpy as np

from simtrain.spec.scenario import Scenario
from simtrain.spec.units import report_float


def sample_step_times(scenario: Scenario, samples: int) -> dict[str, float]:
    """Simulate ``samples`` seeds (seed, seed+1, ...) and return mean, P50 and P95 step time in seconds."""
    from simtrain.engine.simulation import simulate

    base = scenario.simulation.seed
    times = np.array([simulate(scenario, seed=base + i).step_time_s for i in range(samples)])
    stats = {"mean_s": np.mean(times), "p50_s": np.percentile(times, 50), "p95_s": np.percentile(times, 95),
             "min_s": times.min(), "max_s": times.max()}
    return {"samples": samples, **{k: report_float(float(v)) for k, v in stats.items()}}
