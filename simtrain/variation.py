"""Run-to-run variation: several seeds of a jittered scenario, summarised."""

from __future__ import annotations

import numpy as np

from simtrain.scenario import Scenario


def sample_step_times(scenario: Scenario, samples: int) -> dict[str, float]:
    """Simulate ``samples`` seeds (seed, seed+1, ...) and return mean, P50 and P95 step time in seconds."""
    from simtrain.simulation import simulate

    base = scenario.simulation.seed
    times = np.array([simulate(scenario, seed=base + i).step_time_s for i in range(samples)])
    return {"samples": samples, "mean_s": float(np.mean(times)), "p50_s": float(np.percentile(times, 50)),
            "p95_s": float(np.percentile(times, 95)), "min_s": float(times.min()), "max_s": float(times.max())}
