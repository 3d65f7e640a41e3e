"""Run-to-run variation: several seeds of a jittered scenario, summarised."""

from __future__ import annotations

import numpy as np

from simtrain.spec.scenario import Scenario
from simtrain.spec.units import report_float

#: seeds sampled at most unless the caller raises it: the P95 of 1,000 samples is within about 1% of its limit
#: for the spreads jitter gives, and 1,000 runs of a small scenario take minutes, of a large one hours
MAX_SAMPLES = 1_000


def sample_step_times(scenario: Scenario, samples: int, max_samples: int = MAX_SAMPLES) -> dict[str, float]:
    """Simulate ``samples`` seeds (seed, seed+1, ...) and return mean, P50 and P95 step time in seconds. More than
    ``max_samples`` is refused before any run."""
    from simtrain.engine.simulation import simulate
    from simtrain.spec.errors import InputError, SimulationLimitError
    from simtrain.spec.units import as_whole

    count = as_whole(samples)
    if count is None or count < 1:
        raise InputError(f"samples={samples!r}: give a whole number of seeds, 1 or more", field="samples")
    if count > max_samples:
        raise SimulationLimitError(f"{count:,} samples would run {count:,} simulations, more than max_samples="
                                   f"{max_samples:,}; 1,000 seeds give the P95 within about 1%; raise max_samples "
                                   "(simtrain.engine.variation.sample_step_times) if you mean it", field="samples")
    samples = count

    base = scenario.simulation.seed
    times = np.array([simulate(scenario, seed=base + i).step_time_s for i in range(samples)])
    stats = {"mean_s": np.mean(times), "p50_s": np.percentile(times, 50), "p95_s": np.percentile(times, 95),
             "min_s": times.min(), "max_s": times.max()}
    return {"samples": samples, **{k: report_float(float(v)) for k, v in stats.items()}}
