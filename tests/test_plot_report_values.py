"""`simtrain plot` on a saved report whose timeline holds values no simulation writes (docs/errors.md, "Files
simtrain reads"): a saved report is user input, so every time must lie in the step (0 <= start_s <= end_s <=
step_time_s, a step of at most 1e12 s), every byte count be finite and not negative and every record sit on a listed
lane. A value that breaks this is refused when the report is read, before any of --gantt, --memory-plot and --trace
draws it: exit 2 and one line naming the file, the record or lane and field, and the value.

The report here is written by hand (a two-stage pipeline of one micro-batch, a step of 2 s), so every value in the
expected messages comes from this file.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from conftest import run_cli

FIELDS = ["lane", "stream", "kind", "start_s", "end_s", "microbatch", "vstage", "layer_lo", "layer_hi", "bytes"]
REPORT = {
    "scenario": "hand",
    "config": {"parallel": {"dp": 1, "tp": 1, "pp": 2}, "gpus_per_node": 2},
    "stages": [{"pp": 0, "memory": {"weights": 1e9}, "peak_memory_bytes": 2e9},
               {"pp": 1, "memory": {"weights": 1e9}, "peak_memory_bytes": 2e9}],
    "memory_capacity_bytes": 80e9,
    "timeline": {
        "fields": FIELDS, "step_time_s": 2.0, "pp": 2, "full": False,
        "lanes": [{"index": 0, "dp": None, "pp": 0, "end_s": 2.0,
                   "memory_activations": [[0.0, 0], [0.5, 1e9], [2.0, 0]]},
                  {"index": 1, "dp": None, "pp": 1, "end_s": 2.0,
                   "memory_activations": [[0.0, 0], [1.5, 1e9], [2.0, 0]]}],
        "records": [[0, "compute", "forward", 0.0, 0.5, 0, 0, 0, 1, 0],
                    [0, "pp", "send_act", 0.5, 0.6, 0, 0, -1, -1, 1000],
                    [1, "compute", "forward", 0.6, 1.0, 0, 1, 1, 2, 0],
                    [1, "compute", "backward", 1.0, 1.5, 0, 1, 1, 2, 0],
                    [1, "pp", "send_grad", 1.5, 1.6, 0, 1, -1, -1, 1000],
                    [0, "compute", "backward", 1.6, 2.0, 0, 0, 0, 1, 0]],
    },
}
AGAIN = "; write the report again with `simtrain run SCENARIO --json PATH`"
OUTPUTS = {"--gantt": "g.html", "--memory-plot": "m.html", "--trace": "t.json"}
HUGE = [0, "compute", "forward", 0.0, 1e300, 0, 0, -1, -1, 0]      # the audit's record


def _plot(tmp_path, monkeypatch, capsys, report: dict, option: str) -> tuple[int, str, str]:
    monkeypatch.chdir(tmp_path)
    Path("r.json").write_text(json.dumps(report), encoding="utf-8")
    return run_cli(["plot", "r.json", option, OUTPUTS[option]], capsys)


def _with_record(record: list) -> dict:
    report = copy.deepcopy(REPORT)
    report["timeline"]["records"].append(record)
    return report


@pytest.mark.parametrize("option", OUTPUTS)
def test_the_hand_written_report_draws(tmp_path, monkeypatch, capsys, option):
    """Rule: a report whose times all lie in the step is drawn (so the refusals below come from their edit)."""
    code, out, err = _plot(tmp_path, monkeypatch, capsys, REPORT, option)
    assert (code, out, err) == (0, f"wrote {OUTPUTS[option]}\n", "")


@pytest.mark.parametrize("option", OUTPUTS)
def test_a_record_ending_at_1e300_s_is_refused_by_every_output(tmp_path, monkeypatch, capsys, option):
    """Rule: a record time beyond the step is refused at read time, so the trace does not overflow its integer
    nanoseconds (it was an internal error) and the charts do not silently draw an axis to 1e300 s."""
    code, out, err = _plot(tmp_path, monkeypatch, capsys, _with_record(HUGE), option)
    assert (code, out) == (2, "")
    assert "Traceback" not in err and err.count("\n") == 1
    assert err == (f"error: r.json: timeline.records.6.end_s: 1e+300 is not a time in the step after start_s = 0.0 "
                   f"(allowed: 0.0 to step_time_s = 2.0 s){AGAIN}\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]      # nothing drawn


def _set(dotted: str, value):
    report = copy.deepcopy(REPORT)
    *parents, last = dotted.split(".")
    node = report
    for key in parents:
        node = node[int(key)] if isinstance(node, list) else node[key]
    node[int(last) if isinstance(node, list) else last] = value
    return report


@pytest.mark.parametrize("report, message", [
    (_with_record([0, "compute", "forward", -1.0, 0.5, 0, 0, -1, -1, 0]),
     "timeline.records.6.start_s: -1.0 is not a time in the step (allowed: 0 to step_time_s = 2.0 s)"),
    (_with_record([0, "compute", "forward", 1.5, 0.5, 0, 0, -1, -1, 0]),
     "timeline.records.6.end_s: 0.5 is not a time in the step after start_s = 1.5 (allowed: 1.5 to step_time_s = "
     "2.0 s)"),
    (_with_record([0, "compute", "forward", 0.0, 2.5, 0, 0, -1, -1, 0]),
     "timeline.records.6.end_s: 2.5 is not a time in the step after start_s = 0.0 (allowed: 0.0 to step_time_s = "
     "2.0 s)"),
    (_with_record([7, "pp", "send_act", 0.0, 0.5, 0, 0, -1, -1, 0]),
     "timeline.records.6.lane: 7 is not a lane of the timeline (allowed: 0, 1)"),
    (_with_record([0, "pp", "send_act", 0.0, 0.5, 0, 0, -1, -1, -5]),
     "timeline.records.6.bytes: -5 is not a byte count (allowed: 0 or more, finite)"),
    (_with_record([0, "compute", "forward", 0.0, 0.5, -3, 0, -1, -1, 0]),
     "timeline.records.6.microbatch: -3 is not an index (allowed: -1 for none, or 0 or more)"),
    (_set("timeline.lanes.1.end_s", 1e300),
     "timeline.lanes.1.end_s: 1e+300 is not a time in the step (allowed: 0 to step_time_s = 2.0 s)"),
    (_set("timeline.lanes.0.memory_activations.1", [1e300, 1e9]),
     "timeline.lanes.0.memory_activations.1: [1e+300, 1000000000.0] is not a [time s, bytes] point of the step "
     "(allowed: 0 to step_time_s = 2.0 s; bytes 0 or more, finite)"),
    (_set("timeline.step_time_s", 1e300),
     "timeline.step_time_s: 1e+300 s is not a step time simtrain simulates (allowed: more than 0, up to 1e+12 s)"),
])
def test_a_timeline_value_out_of_the_step_is_one_located_line(tmp_path, monkeypatch, capsys, report, message):
    """Rule: times in [0, step_time_s] with start_s <= end_s, step_time_s at most 1e12 s, bytes finite and >= 0,
    records on listed lanes, indexes -1 or more; anything else is exit 2 naming the field and the value."""
    code, out, err = _plot(tmp_path, monkeypatch, capsys, report, "--trace")
    assert (code, out, err) == (2, "", f"error: r.json: {message}{AGAIN}\n")
