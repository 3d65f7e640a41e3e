"""Bounded work (issue 8, deliverable 6): a scenario that would need more than
``simulation.max_events`` simulated events (or more than ``simulation.max_gpus`` GPUs) is refused
up front with SimulationLimitError (an InputError: exit 2) naming the estimate and the way out,
instead of being left to exhaust memory or time.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import run_cli

from simtrain.engine.simulation import simulate
from simtrain.spec.errors import InputError, SimulationLimitError
from simtrain.spec.scenario import load_scenario, parse_set

GOOD = Path(__file__).resolve().parent / "bad_inputs" / "good"

#: 12,500 DGX H100 nodes = 100,000 GPUs (8 per node): TP 8 inside a node, PP 4, DP 3,125, one
#: micro-batch of 1 per replica and pipeline stage x 8 -> 8 micro-batches per replica.
HUGE = """\
name: hundred-thousand-gpus
hardware: dgx-h100
nodes: 12500
model: llama2-7b
training:
  seq_len: 4096
  global_batch: 25000
  micro_batch: 1
parallel:
  dp: 3125
  tp: 8
  pp: 4
simulation:
  fidelity: full
"""


@pytest.fixture
def huge(tmp_path) -> Path:
    path = tmp_path / "huge.yaml"
    path.write_text(HUGE, encoding="utf-8")
    return path


def test_full_fidelity_on_100k_gpus_is_refused_quickly(huge, simtrain_exe):
    """`simtrain run` of a full-fidelity 100,000-GPU step exits 2 within seconds, naming the event
    estimate, the bound and folded mode as the way out. (A subprocess with a timeout: if the bound
    ever stopped working, this test fails instead of simulating for hours.)"""
    start = time.monotonic()
    proc = subprocess.run([*simtrain_exe, "run", str(huge)], capture_output=True, text=True, timeout=60)
    elapsed = time.monotonic() - start
    err = proc.stderr
    assert proc.returncode == 2, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    # at least one event per operation of every lane: 3,125 replicas x 4 stages = 12,500 lanes, each
    # running 8 forwards and 8 backwards -> at least 12,500 x 16 = 200,000 events
    assert "simulation.max_events" in err and "simulated events" in err
    estimate = int(err.split("needs at least about ")[1].split(" ")[0].replace(",", ""))
    assert estimate >= 12_500 * 16
    assert "fidelity: folded" in err
    assert elapsed < 15, f"refusal took {elapsed:.1f} s"


_PYTHON_API = """
import sys
from simtrain.spec.scenario import load_scenario
from simtrain.engine.simulation import simulate
try:
    simulate(load_scenario(sys.argv[1]))
except Exception as err:
    print(" ".join(cls.__name__ for cls in type(err).__mro__))
"""


def test_the_limit_is_an_input_error_in_python(huge):
    """From Python the refusal is a SimulationLimitError, which is an InputError."""
    proc = subprocess.run([sys.executable, "-c", _PYTHON_API, str(huge)], capture_output=True, text=True, timeout=60)
    classes = proc.stdout.split()
    assert classes[:2] == ["SimulationLimitError", "InputError"], proc.stdout + proc.stderr
    assert issubclass(SimulationLimitError, InputError)


def test_folded_mode_is_the_way_out(huge):
    """The same 100,000 GPUs in folded mode (one lane per stage) simulate within the default bound."""
    scenario = load_scenario(huge, {"simulation.fidelity": "folded"})
    start = time.monotonic()
    result = simulate(scenario)
    assert result.step_time_s > 0 and result.gpus == 100_000
    assert result.events <= scenario.simulation.max_events
    assert time.monotonic() - start < 30


def test_raising_the_limit_lets_a_run_through():
    """max_events is the user's knob: below the estimate the run is refused, at the default it runs."""
    base = GOOD / "base.yaml"
    # 2 stages x 4 micro-batches x (forward + backward) = 16 operations pass the check at load;
    # the engine's estimate for the same run is larger than 50 and refuses it
    with pytest.raises(SimulationLimitError, match="more than simulation.max_events=50;"):
        simulate(load_scenario(base, {"simulation.max_events": 50}))
    result = simulate(load_scenario(base))
    assert result.events > 50


@pytest.mark.parametrize("sets", [
    [], ["simulation.fidelity=full"], ["training.global_batch=64", "simulation.fidelity=full"],
    ["parallel.zero=3"],
])
def test_estimate_is_not_an_underestimate(sets):
    """The engine's estimate is at least half the events it then schedules, so the bound means something."""
    from simtrain.engine.limits import estimate_events
    from simtrain.plan.build import build_plan

    scenario = load_scenario(GOOD / "base.yaml", parse_set(sets))
    result = simulate(scenario)
    estimate = estimate_events(build_plan(scenario), result.fidelity == "full")
    assert result.events <= 2 * estimate, (result.events, estimate)


def test_too_many_gpus_are_refused_before_any_graph_is_built(capsys):
    """800,000 GPUs exceed simulation.max_gpus: refused at load in well under a second, located at 'nodes'."""
    path = Path(__file__).resolve().parent / "bad_inputs" / "scenarios" / "max_gpus.yaml"
    start = time.monotonic()
    code, _, err = run_cli(["memory", str(path)], capsys)
    assert code == 2
    assert "800,000 GPUs is more than simulation.max_gpus=200,000" in err
    assert time.monotonic() - start < 2


def test_refusal_time_grows_at_most_linearly_with_gpus(tmp_path):
    """Refusing 100,000 GPUs takes no more than ~4x as long as refusing 25,600 (nothing O(GPUs^2) is
    built before the check); 8x allows for timer noise, a quadratic step would be 16x. The bound of
    300,000 events lets both pass the check at load (at most 2 x 8 x 4 x 3,125 = 200,000 operations)
    so that both are refused by the engine's estimate, after the plan is built."""
    def refusal_seconds(nodes: int) -> float:
        dp = nodes * 8 // 32
        scenario = load_scenario(tmp_path / "huge.yaml", {"nodes": nodes, "parallel.dp": dp,
                                                          "training.global_batch": dp * 8,
                                                          "simulation.max_events": 300_000})
        start = time.monotonic()
        with pytest.raises(SimulationLimitError):
            simulate(scenario)
        return time.monotonic() - start

    (tmp_path / "huge.yaml").write_text(HUGE, encoding="utf-8")
    small = min(refusal_seconds(3200) for _ in range(2))
    large = min(refusal_seconds(12500) for _ in range(2))
    assert large < 8 * max(small, 0.05), (small, large)


def test_the_limit_binds_while_the_run_goes():
    """simulation.max_events is a limit, not only a check of the estimate: a run is refused beforehand only on the
    count without the compute's re-timings by communication, which falls short of what this run schedules (its DP
    buckets start and end under the backward's compute: 473 counted, 622 played); then the run may schedule
    exactly the limit, one fewer stops it, and a folded run is not told to fold."""
    from simtrain.spec.scenario import scenario_from_dict

    raw = {"name": "dp8", "hardware": "dgx-h100", "model": "llama2-7b",
           "training": {"seq_len": 4096, "global_batch": 64, "micro_batch": 1}, "parallel": {"dp": 8}}
    scenario = scenario_from_dict(raw)
    events = simulate(scenario).events

    def limited(limit):
        return scenario_from_dict({**raw, "simulation": {"max_events": limit}})

    assert simulate(limited(events)).events == events
    with pytest.raises(SimulationLimitError) as info:
        simulate(limited(events - 1))
    message = str(info.value)
    assert f"reached simulation.max_events={events - 1:,}" in message
    assert "fidelity: folded" not in message and "larger micro_batch" in message


def test_a_run_that_must_be_full_is_not_told_to_fold():
    """Stragglers need lanes of their own (symmetry classes whatever the file says): the limit's advice leaves
    folding out."""
    from simtrain.spec.scenario import scenario_from_dict

    raw = {"name": "slow", "hardware": "dgx-h100", "model": "llama2-7b",
           "training": {"seq_len": 4096, "global_batch": 64, "micro_batch": 1}, "parallel": {"dp": 8},
           "simulation": {"fidelity": "folded", "max_events": 100, "stragglers": [{"rank": 3, "slowdown": 1.2}]}}
    with pytest.raises(SimulationLimitError) as info:
        simulate(scenario_from_dict(raw))
    assert "fidelity: folded" not in str(info.value) and "larger micro_batch" in str(info.value)


def test_the_layer_bound_does_not_refuse_a_zero3_run_that_fits():
    """The load-time bound counts at least 3 events per ZeRO-3 gather and reduce-scatter (engine.event_counts): with
    backward_prefetch none no gather re-times a running compute, and Llama 2 7B on 16 GPUs (ZeRO-3, 2 micro-batches,
    full fidelity) plays 23,068 events; its bound at 12 events per collective was 32 layers x 16 lanes x
    (2 + 12 x 2 x 2) = 25,600, which refused it under a limit of 24,000 (the review found it at 8 micro-batches:
    92,080 played, refused at 99,328)."""
    from simtrain.spec.scenario import scenario_from_dict

    raw = {"name": "z3none", "hardware": "dgx-h100", "nodes": 2, "model": "llama2-7b",
           "training": {"seq_len": 4096, "global_batch": 32, "micro_batch": 1},
           "parallel": {"dp": 16, "zero": 3, "backward_prefetch": "none"},
           "simulation": {"fidelity": "full", "max_events": 24_000}}
    assert simulate(scenario_from_dict(raw)).events <= 24_000
