"""The checks of a saved report (``simtrain run --json``) before the charts and the trace read it.

A saved report is user input: it may have been edited by hand or cut short. :func:`check_report` checks that the
timeline, lanes, stages and config have the shapes the charts read, and that every time in the timeline lies in
the step simtrain simulated (:func:`check_timeline_values`), so that a hand-edited time of 1e300 s is refused with
the field that holds it rather than drawn as an axis to 1e300 s or overflowing the trace's integer nanoseconds.
Each problem is a :class:`ReportError` naming the field; `simtrain plot` adds the file.
"""

from __future__ import annotations

import json
import math
from operator import itemgetter
from typing import Any

from simtrain.spec.errors import InputError
from simtrain.spec.units import is_number


class ReportError(InputError):
    """A saved report the charts cannot read: a field missing, of the wrong type or out of its range, as after a
    hand edit; the message names the field. Raised where the report is read; `simtrain plot` adds the file."""


#: the record fields the charts read, in the order of simtrain.report.charts_data.Rec (simtrain.report.timeline.FIELDS)
RECORD_FIELDS = ("lane", "stream", "kind", "start_s", "end_s", "microbatch", "vstage", "layer_lo", "layer_hi", "bytes")
_NUMBER = (int, float)
#: the value types a record may hold, in RECORD_FIELDS order: times and bytes int or float, the rest exact
_RECORD_TYPES = {(int, str, str, start, end, int, int, int, int, nbytes)
                 for start in _NUMBER for end in _NUMBER for nbytes in _NUMBER}


def _damaged(field: str, what: str) -> ReportError:
    return ReportError(f"{what}; write the report again with `simtrain run SCENARIO --json PATH`", field=field)


def _show(value: Any) -> str:
    """A value as the JSON file spells it (null, "x"), cut to 60 characters."""
    text = json.dumps(value, default=repr, ensure_ascii=False)
    return text if len(text) <= 60 else text[:57] + "..."


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _positive_whole(value: Any) -> bool:
    return _whole(value) and value >= 1


def _pairs(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(p, list) and len(p) == 2 and is_number(p[0]) and is_number(p[1])
                                           for p in value)


def _want(parent: dict, key: str, where: str, ok, kind: str, *, required: bool = True) -> None:
    """``parent[key]`` must pass ``ok``; ``kind`` says what it should be, for the message."""
    if key not in parent:
        if required:
            raise _damaged(where + key, f"missing from the report (it should be {kind})")
    elif not ok(parent[key]):
        raise _damaged(where + key, f"{_show(parent[key])} is not {kind}")


def _want_objects(items: list, where: str, kind: str) -> None:
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise _damaged(f"{where}.{i}", f"{_show(item)} is not {kind}")


def check_report(report: dict) -> dict:
    """The timeline, lanes, stages and config of a report have the shapes the charts read, and its records and
    times the values simtrain writes (:func:`check_timeline_values`), else a :class:`ReportError` naming the
    field."""
    tl = report["timeline"]
    if not isinstance(tl, dict):
        raise _damaged("timeline",
                       f"{_show(tl)} is not a timeline (an object with fields, records, lanes, step_time_s)")
    _want(tl, "fields", "timeline.", lambda v: isinstance(v, list) and all(f in v for f in RECORD_FIELDS),
          "a list naming the record fields " + ", ".join(RECORD_FIELDS))
    _want(tl, "records", "timeline.", lambda v: isinstance(v, list), "a list of records")
    _want(tl, "step_time_s", "timeline.", lambda v: is_number(v) and 0 < v < float("inf"),
          "a positive number of seconds")
    _want(tl, "pp", "timeline.", _positive_whole, "a positive whole number", required=False)
    _want(tl, "lanes", "timeline.", lambda v: isinstance(v, list) and len(v) > 0, "a non-empty list of lanes")
    _want_objects(tl["lanes"], "timeline.lanes", "a lane (an object with index, dp, pp, end_s)")
    for i, lane in enumerate(tl["lanes"]):
        where = f"timeline.lanes.{i}."
        _want(lane, "index", where, _whole, "a whole number")
        _want(lane, "dp", where, lambda v: v is None or _whole(v), "a whole number or null")
        _want(lane, "pp", where, _whole, "a whole number")
        _want(lane, "end_s", where, is_number, "a number of seconds")
        _want(lane, "memory_activations", where, _pairs, "a list of [time s, bytes] pairs", required=False)
    _want(report, "stages", "", lambda v: isinstance(v, list), "a list of pipeline stages")
    _want_objects(report["stages"], "stages", "a stage (an object with pp, memory, peak_memory_bytes)")
    for i, stage in enumerate(report["stages"]):
        _want(stage, "pp", f"stages.{i}.", _whole, "a whole number")
        _want(stage, "memory", f"stages.{i}.", lambda v: isinstance(v, dict) and all(map(is_number, v.values())),
              "an object of byte counts")
        _want(stage, "peak_memory_bytes", f"stages.{i}.", is_number, "a number of bytes")
    stage_pp = {stage["pp"] for stage in report["stages"]}
    for i, lane in enumerate(tl["lanes"]):
        if lane["pp"] not in stage_pp:
            raise _damaged(f"timeline.lanes.{i}.pp", f"stage {lane['pp']} is not among the report's stages")
    _want(report, "bubble_fraction", "", lambda v: v is None or is_number(v), "a fraction or null", required=False)
    _want(report, "memory_capacity_bytes", "", is_number, "a number of bytes", required=False)
    _want(report, "config", "", lambda v: isinstance(v, dict), "an object", required=False)
    config = report.get("config", {})
    _want(config, "gpus_per_node", "config.", lambda v: v is None or _positive_whole(v), "a positive whole number",
          required=False)
    _want(config, "parallel", "config.", lambda v: isinstance(v, dict), "an object", required=False)
    for key in ("dp", "tp", "pp", "vpp"):
        _want(config.get("parallel", {}), key, "config.parallel.", _positive_whole, "a positive whole number",
              required=False)
    check_timeline_values(tl)
    return report



#: the longest step a saved report may hold, s (about 31,700 years): no simulated step comes near, and beyond it
#: the trace's integer nanoseconds and the charts' millisecond axes stop meaning anything (1e300 s overflows them)
MAX_STEP_S = 1e12
#: slack on "within the step": reports round times to 9 significant digits (simtrain.spec.units.report_float)
_ROUNDING = 1e-8


def record_values(timeline: dict) -> list[tuple]:
    """The timeline's records as tuples in :data:`RECORD_FIELDS` order, read by field name so a reordered report
    still reads right; a record of the wrong length or with a value of the wrong type is a :class:`ReportError`
    naming it."""
    names = timeline["fields"]
    pick = itemgetter(*(names.index(f) for f in RECORD_FIELDS))
    out = []
    for k, row in enumerate(timeline["records"]):
        if not isinstance(row, (list, tuple)) or len(row) != len(names):
            raise _damaged(f"timeline.records.{k}",
                           f"{_show(row)} is not a record of the {len(names)} fields {', '.join(map(str, names))}")
        values = pick(row)
        if tuple(map(type, values)) not in _RECORD_TYPES:   # one set lookup per record: the check stays cheap
            raise _damaged(f"timeline.records.{k}", f"{_show(row)} holds a value of the wrong type (lane, "
                           "microbatch, vstage and layers are whole numbers, stream and kind text, times and bytes "
                           "numbers)")
        out.append(values)
    return out


def _out_of_step(value: Any, low: float, step: float) -> bool:
    """True unless ``low <= value <= step`` (within rounding): NaN and infinities are out."""
    return not (low <= value <= step * (1 + _ROUNDING))


def check_timeline_values(timeline: dict) -> None:
    """Every time of a shape-checked timeline lies in the step: ``0 <= start_s <= end_s <= step_time_s`` for each
    record, ``end_s`` of each lane and the times of its memory points likewise; byte counts are finite and not
    negative; a record's lane is one the timeline lists, and its micro-batch, virtual stage and layers are -1 (none)
    or more. simtrain writes nothing else; the first value that breaks a rule is a :class:`ReportError` naming the
    record and field, the value and what is allowed."""
    step = timeline["step_time_s"]
    if step > MAX_STEP_S:
        raise _damaged("timeline.step_time_s", f"{_show(step)} s is not a step time simtrain simulates (allowed: "
                       f"more than 0, up to {MAX_STEP_S:g} s)")
    within = f"allowed: 0 to step_time_s = {_show(step)} s"
    for i, lane in enumerate(timeline["lanes"]):
        if _out_of_step(lane["end_s"], 0.0, step):
            raise _damaged(f"timeline.lanes.{i}.end_s", f"{_show(lane['end_s'])} is not a time in the step ({within})")
        for j, (t, nbytes) in enumerate(lane.get("memory_activations", ())):
            if _out_of_step(t, 0.0, step) or not 0 <= nbytes < math.inf:
                raise _damaged(f"timeline.lanes.{i}.memory_activations.{j}", f"{_show([t, nbytes])} is not a [time s, "
                               f"bytes] point of the step ({within}; bytes 0 or more, finite)")
    lane_ids = {lane["index"] for lane in timeline["lanes"]}
    for k, (lane, _, _, start, end, *marks, nbytes) in enumerate(record_values(timeline)):
        where = f"timeline.records.{k}."
        if lane not in lane_ids:
            raise _damaged(where + "lane", f"{lane} is not a lane of the timeline (allowed: "
                           f"{', '.join(map(str, sorted(lane_ids)))})")
        if _out_of_step(start, 0.0, step):
            raise _damaged(where + "start_s", f"{_show(start)} is not a time in the step ({within})")
        if _out_of_step(end, start, step):
            raise _damaged(where + "end_s", f"{_show(end)} is not a time in the step after start_s = {_show(start)} "
                           f"(allowed: {_show(start)} to step_time_s = {_show(step)} s)")
        for name, mark in zip(RECORD_FIELDS[5:9], marks, strict=True):
            if mark < -1:
                raise _damaged(where + name, f"{mark} is not an index (allowed: -1 for none, or 0 or more)")
        if not 0 <= nbytes < math.inf:
            raise _damaged(where + "bytes", f"{_show(nbytes)} is not a byte count (allowed: 0 or more, finite)")
