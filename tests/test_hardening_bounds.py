"""Every number checked at the door, and work bounded before it starts (issue 26, deliverables 1 and 2)."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest
from conftest import run_cli

GOOD = Path(__file__).resolve().parent / "bad_inputs" / "good"
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def folder(tmp_path, monkeypatch) -> Path:
    for name in ("base.yaml", "hw.yaml", "model.yaml"):
        shutil.copy(GOOD / name, tmp_path / name)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_a_field_added_later_is_checked_without_a_line_of_its_own():
    """A new schema with plain and quantity fields gets the finite-and-in-range check from Closed and the quantity
    types: 1e300 for a plain float, 10**30 for a count, 1e-300 B/s for a bandwidth are each refused."""
    from simtrain.spec.errors import InputError
    from simtrain.spec.quantity import Bandwidth
    from simtrain.spec.schema import Closed, validate

    class NewSection(Closed):
        factor: float = 1.0
        count: int = 1
        link: Bandwidth = 1e9
        sizes: list[float] = []

    for data, says in [({"factor": 1e300}, "factor: 1e+300 is outside the range simtrain accepts"),
                       ({"count": 10**30}, "count: 1e+30 is outside the range simtrain accepts"),
                       ({"link": "1e-300 B/s"}, "link: 1e-300 B/s is outside the range simtrain accepts (1 kB/s"),
                       ({"sizes": [1.0, float("inf")]}, "sizes.1: inf is not a finite number")]:
        with pytest.raises(InputError) as exc:
            validate(NewSection, data, file="new.yaml")
        assert says in str(exc.value), str(exc.value)
    assert validate(NewSection, {"factor": 2.5, "count": 7, "link": "1 GB/s"}, file="new.yaml").count == 7


def test_python_callers_get_the_same_ranges(folder):
    """with_overrides (SI floats from Python) is held to the same ranges as a file: 1e-300 B/s is an InputError."""
    from simtrain.spec.errors import InputError
    from simtrain.spec.scenario import load_scenario

    sc = load_scenario("base.yaml")
    with pytest.raises(InputError, match="outside the range simtrain accepts"):
        sc.with_overrides({"simulation.dp_bucket_size": 1e-300})
    with pytest.raises(InputError, match="not a finite number"):
        sc.with_overrides({"simulation.jitter": float("nan")})


def test_three_million_layers_are_refused_in_well_under_a_second(folder, capsys):
    """model.layers is at most 2**14 = 16,384, 16 times DeepNet's 1,000 layers: 3,000,000 layers are refused by the
    range at load (they ran 22 s and 1.9 GB once; 499,000 layers, under the event bound's count, built their plan
    for 19-31 s before the engine refused them)."""
    from simtrain.spec.errors import InputError
    from simtrain.spec.scenario import load_scenario

    for layers in (3_000_000, 499_000, 16_385):
        model = {"name": "deep", "layers": layers, "hidden": 64, "heads": 4, "ffn_hidden": 256, "vocab": 128}
        started = time.monotonic()
        with pytest.raises(InputError, match=f"model.layers: {layers} is outside the range simtrain accepts "
                                             r"\(1 to 16384"):
            load_scenario("base.yaml", {"model": model})
        assert time.monotonic() - started < 0.5


def test_deep_zero3_layers_are_refused_by_the_event_bound_before_the_plan(folder):
    """ZeRO-3 gathers every layer's weights in each micro-batch's forward and backward and reduce-scatters its
    gradients, at least 3 events each, plus 2 per layer for the gradients: 10,000 layers x (2 + 9 x 16 micro-batches)
    = 1,460,000 events, more than max_events=1,000,000: refused at load."""
    from simtrain.spec.errors import SimulationLimitError
    from simtrain.spec.scenario import load_scenario

    model = {"name": "deep", "layers": 10_000, "hidden": 64, "heads": 4, "ffn_hidden": 256, "vocab": 128}
    with pytest.raises(SimulationLimitError) as exc:
        load_scenario("base.yaml", {"model": model, "parallel.zero": 3, "parallel.pp": 1, "parallel.dp": 4,
                                    "training.global_batch": 64, "training.micro_batch": 1})
    assert "10,000 layers x 16 micro-batches (ZeRO-3 gathers) need at least 1,460,000" in str(exc.value)


@pytest.mark.parametrize("args,says", [
    (["sweep", "base.yaml", "--grid", "training.seq_len=" + ",".join(str(i) for i in range(1, 1001)),
      "--grid", "simulation.seed=" + ",".join(str(i) for i in range(101)), "--out", "t.csv"],
     "this grid has 101,000 points (1,000 x 101), more than max_points=100,000"),
    (["sweep", "base.yaml", "--grid", "training.seq_len=1,2,3", "--max-points", "2", "--out", "t.csv"],
     "this grid has 3 points (3), more than max_points=2"),
    (["search", "base.yaml", "--gpus", "1" + "0" * 30, "--workers", "1"],
     "--gpus 1,000,000,000,000,000,000,000,000,000,000 is more than simulation.max_gpus=200,000"),
    (["search", str(REPO / "scenarios" / "pp4_dp4.yaml"), "--max-layouts", "100", "--workers", "1"],
     "this search would screen more than 100 layouts"),
    (["run", "base.yaml", "--samples", "1001"], "--samples 1,001 is more than 1,000"),
    (["compare", "base.yaml", "--tokens", "1e300"], "--tokens 1e300: give a token count from 1 to 1e18"),
])
def test_oversize_work_is_refused_up_front(folder, capsys, args, says):
    """Grids, searches, GPU counts, samples and token budgets beyond their bound: exit 2 at once, naming the limit."""
    started = time.monotonic()
    code, out, err = run_cli(args, capsys)
    assert code == 2, err
    assert says in err and len(err.strip().splitlines()) == 1, err
    assert time.monotonic() - started < 5
    assert not (folder / "t.csv").exists()


def test_a_huge_global_batch_search_enumerates_at_once(folder):
    """The divisors of a global batch of 2**30 take O(sqrt n) steps (the loop over n hung the search)."""
    from simtrain.decide.search import _divisors

    started = time.monotonic()
    assert _divisors(2**30) == [2**i for i in range(31)]
    assert _divisors(36) == [1, 2, 3, 4, 6, 9, 12, 18, 36]
    assert time.monotonic() - started < 1


def test_a_pool_gets_twice_its_workers_at_a_time():
    """run_tasks keeps 2 x workers tasks in flight on a pool (memory bounded by the points in flight): when the
    first result arrives, 4 of 50 tasks have been submitted to a 2-worker pool, not all 50."""
    from concurrent.futures import ThreadPoolExecutor

    from simtrain.decide.workers import run_tasks

    submitted: list = []

    class Counting(ThreadPoolExecutor):
        def submit(self, fn, /, *args, **kwargs):
            submitted.append(args)
            return super().submit(fn, *args, **kwargs)

    with Counting(max_workers=2) as pool:
        results = {}
        for i, value in run_tasks(lambda x: x * x, [(i,) for i in range(50)], pool):
            if not results:
                assert len(submitted) == 4
            results[i] = value
    assert results == {i: i * i for i in range(50)}


@pytest.mark.parametrize("call,error,says", [
    (lambda sim, sc: sim.simulate(sc, seed=-1), "InputError", "seed: -1 is outside the range simtrain accepts"),
    (lambda sim, sc: sim.sweep(sc, {"training.micro_batch": [1]}, workers=1, max_points="x"), "InputError",
     "max_points='x': give a whole number"),
    (lambda sim, sc: sc.with_overrides([("training.micro_batch", 2)]), "TypeError",
     "overrides must be a mapping of dotted keys"),
    (lambda sim, sc: sim.load_scenario("base.yaml", [1]), "TypeError", "overrides must be a mapping"),
    (lambda sim, sc: sim.load_scenario(5), "TypeError",
     "path must be a file path (str or pathlib.Path) or a bundled scenario's name, not int"),
    (lambda sim, sc: sim.estimate.estimate(5), "TypeError", "scenario must be a Scenario"),
])
def test_api_arguments_of_an_unexpected_type_are_named(folder, call, error, says):
    """Python arguments of an unexpected type or range raise InputError or a TypeError naming the argument, never
    an AttributeError or IndexError from inside simtrain."""
    import simtrain

    sc = simtrain.load_scenario("base.yaml")
    with pytest.raises((simtrain.InputError, TypeError)) as exc:
        call(simtrain, sc)
    assert type(exc.value).__name__ in (error, "SimulationLimitError") and says in str(exc.value), str(exc.value)


def test_a_generator_as_grid_values_is_read_once(folder):
    """sweep(sc, {key: generator}) runs each value (the generator was exhausted by the checks: IndexError)."""
    import simtrain

    sc = simtrain.load_scenario("base.yaml")
    table = simtrain.sweep(sc, {"training.micro_batch": (m for m in (1, 2))}, workers=1, progress=False)
    assert list(table["training_micro_batch"]) == [1, 2]
    assert "estimate" not in table and simtrain.estimate.estimate("base.yaml").step_time_s > 0


def test_the_event_refusal_does_not_blame_an_override_for_the_default_limit(capsys):
    """simulation.max_events at its default (1,000,000) was not set by anyone: a refusal of a run whose other
    simulation keys came from --set must not say the limit was "set by an override" (it did, found by an audit).
    Full fidelity on 1,024 replicas x 4 stages of 64 micro-batches each needs far more than 1,000,000 events."""
    from conftest import REPO
    code, _, err = run_cli(["run", str(REPO / "scenarios" / "pp4_dp4.yaml"), "--set", "nodes=512",
                            "--set", "parallel.dp=1024", "--set", "training.global_batch=65536",
                            "--set", "simulation.overlap_dp=false", "--full"], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "more than simulation.max_events=1,000,000" in err and "override" not in err, err
