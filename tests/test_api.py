"""The Python API a notebook uses (issue 5): what it accepts, and the errors it gives for what it does not.

Each wrong argument is named, as a file's wrong key is: a deep AttributeError from inside simtrain, or a typo
that silently runs something else, is a defect.
"""

from __future__ import annotations

import pickle
import subprocess
import sys

import pytest
from conftest import REPO, make_scenario

import simtrain
from simtrain.spec.errors import InputError

PP4 = REPO / "scenarios" / "pp4_dp4.yaml"


def test_a_scenario_file_path_is_as_good_as_a_scenario():
    """simulate, memory_only and sweep take the path of a scenario file as well as a loaded Scenario."""
    sc = simtrain.load_scenario(PP4)
    assert simtrain.simulate(str(PP4)).to_dict() == simtrain.simulate(sc).to_dict()
    assert simtrain.memory_only(PP4).to_dict() == simtrain.memory_only(sc).to_dict()


@pytest.mark.parametrize("call, name", [("simulate", "simulate"), ("memory", "memory"), ("memory_only", "memory"),
                                        ("search", "search")])
def test_anything_else_is_named_as_the_wrong_argument(call, name):
    """A list where a scenario belongs is a TypeError naming the function and what it takes."""
    with pytest.raises(TypeError, match=f"simtrain.{name}: scenario must be a Scenario .* not list"):
        getattr(simtrain, call)([PP4])


@pytest.mark.parametrize("kwargs, field", [({"fidelity": "Full"}, "fidelity"), ({"fidelity": "detailed"}, "fidelity"),
                                           ({"seed": "x"}, "seed"), ({"seed": True}, "seed")])
def test_simulate_refuses_what_it_would_otherwise_ignore(kwargs, field):
    """fidelity='Full' used to run folded (any value but 'full'), dropping the stragglers' ranks without a word."""
    with pytest.raises(InputError) as err:
        simtrain.simulate(make_scenario(), **kwargs)
    assert err.value.field == field


def test_full_fidelity_by_argument_plays_every_replica():
    """fidelity='full' replaces the scenario's setting: a 2-replica layout plays out twice the lanes."""
    sc = make_scenario(training={"global_batch": 8, "micro_batch": 1}, parallel={"dp": 2})
    folded, full = simtrain.simulate(sc), simtrain.simulate(sc, fidelity="full")
    assert (folded.fidelity, full.fidelity) == ("folded", "full")
    assert full.events > folded.events      # the second replica's lanes are played out too
    assert full.step_time_s == pytest.approx(folded.step_time_s, rel=1e-9)   # symmetric replicas


def test_the_decision_tools_are_functions_and_load_on_first_use():
    """simtrain.simulate, memory, sweep, search, compare and validate are functions (not modules: calling
    `simtrain.search(sc)` raised "'module' object is not callable"), and `import simtrain` loads none of their
    modules (a fresh interpreter); simtrain.estimate and simtrain.charts stay reachable as modules."""
    import types

    for name in ("simulate", "memory", "memory_only", "sweep", "search", "compare", "validate", "load_scenario",
                 "scenarios", "hardware", "models"):
        assert isinstance(getattr(simtrain, name), types.FunctionType), name
    assert simtrain.memory_only is simtrain.memory
    code = ("import sys, simtrain; before = 'simtrain.decide.search' in sys.modules; simtrain.estimate.estimate; "
            "simtrain.charts.plot_sweep; print(before, 'simtrain.decide.search' in sys.modules, "
            "'simtrain.decide.estimate' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False", "True"]
    with pytest.raises(AttributeError, match="no attribute 'serch'"):
        simtrain.serch   # noqa: B018


def test_a_search_result_shows_a_summary_not_its_rows():
    """A notebook cell ending in `result` printed 1.5 MB of rows; the repr is one line naming the best layout."""
    sc = make_scenario(training={"global_batch": 8, "micro_batch": 1}, parallel={"dp": 1})
    result = simtrain.search(sc, top=1, workers=1, progress=False)
    text = repr(result)
    assert text.startswith("<SearchResult: ") and "\n" not in text and len(text) < 300
    assert f"{len(result.rows)} layouts" in text and "best tp" in text
    assert pickle.loads(pickle.dumps(result)).top == result.top


@pytest.mark.parametrize("kwargs, field", [({"gpus": "16"}, "gpus"), ({"top": 0}, "top"), ({"top": 2.5}, "top"),
                                           ({"max_memory": "0.9"}, "max_memory")])
def test_search_names_a_wrong_argument(kwargs, field):
    with pytest.raises(InputError) as err:
        simtrain.search(make_scenario(), workers=1, progress=False, **kwargs)
    assert err.value.field == field


def test_sweep_names_a_wrong_worker_count_and_an_unknown_grid_key():
    sc = make_scenario(training={"global_batch": 8, "micro_batch": 1})
    with pytest.raises(InputError) as err:
        simtrain.sweep(sc, {"training.micro_batch": [1, 2]}, workers="2")
    assert err.value.field == "workers"
    with pytest.raises(InputError, match=r"grid key 'training.micro_bach': unknown key \(did you mean 'micro_batch'"):
        simtrain.sweep(sc, {"training.micro_bach": [1, 2]}, workers=1)


def test_compare_takes_the_cli_token_counts_and_refuses_nonsense():
    """tokens='300B' as on the command line; a negative budget gave a negative cost, an empty list a blank table."""
    sc = make_scenario()
    assert simtrain.compare([sc], tokens="300B")["tokens"].tolist() == [300e9]
    for tokens in (-1e12, 0):
        with pytest.raises(InputError, match="give a token count from 1 to 1e18"):
            simtrain.compare([sc], tokens=tokens)
    with pytest.raises(InputError, match="nothing to compare"):
        simtrain.compare([])


def test_the_report_keys_are_attributes_too():
    """Every top-level number of the JSON report is an attribute of the Result by the same name (a notebook reads
    `r.memory_capacity_bytes` as `simtrain run --json` writes it), equal up to the report's rounding."""
    from simtrain.spec.units import report_float

    r = simtrain.simulate(make_scenario())
    report = r.to_dict(timeline=False)
    numbers = {k: v for k, v in report.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    assert {"step_time_s", "mfu", "tokens_per_s", "memory_capacity_bytes", "peak_memory_bytes_max"} <= set(numbers)
    for key, value in numbers.items():
        attr = getattr(r, key)
        # the report rounds floats to 9 significant digits (report_float) and byte counts to whole bytes
        assert (round(attr) if isinstance(value, int) else report_float(attr)) == value, key


def test_numpy_integers_count_as_whole_numbers():
    """Values from np.arange or a DataFrame cell are numpy integers: taken as ints, as before the checks."""
    import numpy as np

    sc = make_scenario(training={"global_batch": 8, "micro_batch": 1})
    assert simtrain.simulate(sc, seed=np.int64(3)).step_time_s == simtrain.simulate(sc, seed=3).step_time_s
    assert len(simtrain.sweep(sc, {"training.micro_batch": [1]}, workers=np.int64(1))) == 1
    result = simtrain.search(sc, gpus=np.int64(1), top=np.int64(1), workers=1, progress=False)
    assert result.gpus == 1 and len(result.top) == 1
