"""Rule: the decision tools' DataFrames count bytes in whole bytes, as their --json reports do (simtrain.compare()
held 42,672,879,257.6 bytes where `simtrain compare --json` wrote 42,672,879,258; the seventeenth session's note)."""

from __future__ import annotations

import math

import simtrain
from simtrain.decide.compare import compare, compare_report
from simtrain.decide.tables import frame_of
from simtrain.spec.scenario import load_scenario


def test_byte_columns_are_whole_and_others_untouched():
    frame = frame_of([{"scenario": "a", "peak_memory_bytes_max": 1.6, "memory_capacity_bytes": 80e9 + 0.4,
                       "predicted_peak_memory_bytes": 2.5, "measured_memory_bytes": None, "step_time_s": 1.25}])
    row = frame.to_dict("records")[0]
    # by hand: 1.6 -> 2, 80e9 + 0.4 -> 80e9, 2.5 -> 2 (round half to even, as Python's round), a missing value NaN
    assert row["peak_memory_bytes_max"] == 2.0
    assert row["memory_capacity_bytes"] == 80e9
    assert row["predicted_peak_memory_bytes"] == 2.0
    assert math.isnan(row["measured_memory_bytes"])
    assert row["step_time_s"] == 1.25                          # a float that is not bytes keeps its fraction
    assert str(frame["peak_memory_bytes_max"].dtype) == "float64"


def test_compare_frame_bytes_equal_its_json():
    # dp8_baseline's ledger peak is 65,450,766,233.6 bytes (a fraction of a byte from the fractional ledger terms)
    scenarios = [load_scenario("dp8_baseline"), load_scenario("compare_a100")]
    rows = compare(scenarios, "1T")
    assert not float(rows[0]["peak_memory_bytes_max"]).is_integer()    # the case this test is about
    written = compare_report(rows)["rows"]
    frame = simtrain.compare(scenarios, "1T")
    for got, want in zip(frame.to_dict("records"), written):
        for key in ("peak_memory_bytes_max", "memory_capacity_bytes"):
            assert got[key] == want[key] and float(got[key]).is_integer(), key
