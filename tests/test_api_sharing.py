"""The Python API hands back values the caller may change without changing the result they came from, and refuses
arguments of the wrong kind with a sentence naming them (found by an audit of the notebook API)."""

from __future__ import annotations

import pytest
from conftest import make_scenario

import simtrain
from simtrain.spec.errors import InputError


def test_changing_a_reports_dict_leaves_the_result_as_it_was():
    """to_dict() gave the Result's own config and band dicts: setting config.parallel.pp to 99 in the report made
    the result's summary say 99 stages."""
    result = simtrain.simulate(make_scenario(parallel={"pp": 2}))
    before = result.summary()
    report = result.to_dict()
    report["config"]["parallel"]["pp"] = 99
    if isinstance(report.get("step_time_band"), dict):
        report["step_time_band"]["changed"] = True
    assert result.summary() == before
    assert result.to_dict()["config"]["parallel"]["pp"] == 2


def test_a_sweep_with_something_that_is_no_executor_is_refused_before_any_point():
    """executor=5 put "AttributeError: 'int' object has no attribute 'submit'" in every row's error column."""
    with pytest.raises(InputError) as err:
        simtrain.sweep(make_scenario(), {"training.micro_batch": [1, 2]}, executor=5)
    assert err.value.field == "executor" and "give a concurrent.futures Executor" in err.value.message


def test_with_overrides_of_none_is_the_scenario_itself():
    """None (no overrides) raised AttributeError: 'NoneType' object has no attribute 'items'."""
    sc = make_scenario()
    assert sc.with_overrides(None).training == sc.training


def test_a_search_results_rows_are_read_only_and_still_pickle():
    """f.top[0]['tp'] = 99 made the summary, repr and .best say tp 99 (found by an audit): the rows are read-only
    now (a copy, dict(row), is the caller's); the result still pickles and its summary survives the round trip."""
    import pickle

    found = simtrain.search(make_scenario(parallel={"dp": 4}, training={"global_batch": 8}), workers=1, top=2,
                            progress=False)
    before = found.summary()
    with pytest.raises(TypeError, match="read-only"):
        found.top[0]["tp"] = 99
    with pytest.raises(TypeError, match="read-only"):
        found.rows[0].update(tp=99)
    mine = dict(found.top[0])
    mine["tp"] = 99
    assert found.summary() == before
    assert pickle.loads(pickle.dumps(found)).summary() == before


@pytest.mark.parametrize("call, field", [
    (lambda: simtrain.validate(5), "path"),                   # TypeError from os.fspath before
    (lambda: simtrain.validate(only=5), "only"),              # TypeError: 'in <string>' requires string
])
def test_validate_names_an_argument_of_the_wrong_kind(call, field):
    with pytest.raises(InputError) as err:
        call()
    assert err.value.field == field


@pytest.mark.parametrize("i", ["a", None, 1.0, True])
def test_a_search_layout_is_asked_for_by_a_whole_number(i):
    """found.scenario('a') and (None) raised TypeError, (1.0) 'list indices must be integers', (True) gave layout 1."""
    found = simtrain.search(make_scenario(parallel={"dp": 4}, training={"global_batch": 8}), workers=1, top=2,
                            progress=False)
    with pytest.raises(InputError) as err:
        found.scenario(i)
    assert err.value.field == "i" and "a whole number from 0 to 1" in err.value.message
