"""Rule: a scenario is read-only all through. Its validated fields were frozen (pydantic models, a frozen dataclass)
but its raw mapping was not: `s.raw["training"]["micro_batch"] = 4` left the simulated scenario at 1 while the next
`with_overrides` started from 4 (the seventeenth session's note). Changes are refused with a sentence saying how to
change a scenario; copies of the mapping are ordinary and changeable."""

from __future__ import annotations

import copy
import pickle

import pytest

import simtrain
from simtrain.spec.frozen_raw import READ_ONLY
from simtrain.spec.yamlio import LineDict


@pytest.fixture(scope="module")
def scenario():
    return simtrain.load_scenario("pp4_dp4")


@pytest.mark.parametrize("change", [
    lambda raw: raw.__setitem__("name", "x"),
    lambda raw: raw["training"].__setitem__("micro_batch", 4),
    lambda raw: raw["parallel"].update(pp=2),
    lambda raw: raw.pop("training"),
    lambda raw: raw.setdefault("simulation", {}),
    lambda raw: raw["training"].clear(),
    lambda raw: raw.__delitem__("name"),
])
def test_raw_refuses_changes(scenario, change):
    before = copy.deepcopy(scenario.raw)
    with pytest.raises(TypeError) as err:
        change(scenario.raw)
    assert str(err.value) == READ_ONLY
    assert scenario.raw == before


def test_overrides_start_from_the_validated_mapping(scenario):
    # pp4_dp4.yaml sets micro_batch 1; the override gives 2 and leaves the scenario it came from at 1
    changed = scenario.with_overrides({"training.micro_batch": 2})
    assert (changed.training.micro_batch, scenario.training.micro_batch) == (2, 1)
    assert scenario.raw["training"]["micro_batch"] == 1


def test_copies_are_changeable_and_keep_lines(scenario):
    for copied in (copy.deepcopy(scenario.raw), pickle.loads(pickle.dumps(scenario.raw))):
        assert type(copied) is LineDict and copied.key_lines == scenario.raw.key_lines
        copied["training"]["micro_batch"] = 8
        assert scenario.raw["training"]["micro_batch"] == 1
    shallow = copy.copy(scenario.raw)
    shallow["name"] = "other"
    assert scenario.raw["name"] == "pp4_dp4"


def test_a_scenario_from_a_dict_does_not_follow_the_dict():
    data = {"name": "d", "hardware": "dgx-h100", "model": "llama2-7b",
            "training": {"seq_len": 4096, "micro_batch": 1, "global_batch": 16},
            "parallel": {"tp": 8, "pp": 1, "dp": 1}}
    s = simtrain.scenario_from_dict(data)
    data["training"]["micro_batch"] = 4
    assert s.raw["training"]["micro_batch"] == 1 and s.with_overrides({}).training.micro_batch == 1


def test_a_copied_or_unpickled_scenario_stays_read_only(scenario):
    # a review found pickle.loads(pickle.dumps(s)) and copy.deepcopy(s) thawed the raw mapping with the scenario
    for copied in (copy.deepcopy(scenario), pickle.loads(pickle.dumps(scenario))):
        with pytest.raises(TypeError) as err:
            copied.raw["training"]["micro_batch"] = 4
        assert str(err.value) == READ_ONLY
        assert copied.with_overrides({}).training.micro_batch == copied.training.micro_batch == 1
