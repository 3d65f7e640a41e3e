"""The Chrome / Perfetto trace: Trace Event Format, well-nested threads, busy times, flow arrows.

Format rules from Google's "Trace Event Format" document: complete events
(ph "X") carry ts and dur in microseconds; metadata (ph "M") names processes
and threads; flow events (ph "s"/"f") share an id.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest

from simtrain.engine.simulation import simulate
from simtrain.report.charts import write_outputs
from simtrain.report.trace import trace_events
from simtrain.spec.scenario import load_scenario

DATA = Path(__file__).parent / "data"
ROOT = Path(__file__).parent.parent

SCENARIOS = {
    "pp4_dp4": (ROOT / "scenarios" / "pp4_dp4.yaml", None),
    # ZeRO-3 gathers and reduce-scatters overlap on one stream; TP all-reduces; every rank simulated
    "tiny_zero3_full": (DATA / "charts_tiny.yaml", {"parallel.pp": 2, "parallel.dp": 2, "parallel.tp": 2,
                                                    "parallel.zero": 3, "gpus_per_node": 8,
                                                    "training.global_batch": 8, "simulation.fidelity": "full"}),
}


@pytest.fixture(scope="module", params=sorted(SCENARIOS))
def run(request, tmp_path_factory):
    path, overrides = SCENARIOS[request.param]
    result = simulate(load_scenario(path, overrides))
    out = tmp_path_factory.mktemp("trace") / "trace.json"
    write_outputs(result, trace=str(out))
    return result, json.loads(out.read_text())


def _slices(trace):
    return [e for e in trace["traceEvents"] if e["ph"] == "X"]


def test_trace_is_trace_event_format(run):
    """Every event has a known phase; slices carry numeric pid, tid, ts, dur >= 0 (us) and a name."""
    _, trace = run
    assert isinstance(trace["traceEvents"], list) and trace["displayTimeUnit"] in ("ms", "ns")
    for e in trace["traceEvents"]:
        assert e["ph"] in ("X", "M", "s", "f")
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int)
        if e["ph"] == "X":
            assert isinstance(e["ts"], (int, float)) and e["dur"] >= 0 and e["name"]


def test_trace_times_are_microseconds(run):
    """The last slice ends at the step time, in microseconds."""
    result, trace = run
    end = max(e["ts"] + e["dur"] for e in _slices(trace))
    assert end == pytest.approx(result.step_time_s * 1e6, rel=1e-6)


def test_trace_names_every_process_and_thread(run):
    """One process per simulated lane, named; every thread that holds slices is named."""
    result, trace = run
    meta = [e for e in trace["traceEvents"] if e["ph"] == "M"]
    procs = {e["pid"] for e in meta if e["name"] == "process_name"}
    threads = {(e["pid"], e["tid"]) for e in meta if e["name"] == "thread_name"}
    assert len(procs) == len(result.timeline.lanes)
    assert {(e["pid"], e["tid"]) for e in _slices(trace)} <= threads
    assert {e["pid"] for e in _slices(trace)} <= procs


def test_trace_slices_nest_or_follow(run):
    """On every (pid, tid) a slice either follows the previous one or lies inside it: no partial overlap."""
    _, trace = run
    by_thread = defaultdict(list)
    for e in _slices(trace):
        by_thread[(e["pid"], e["tid"])].append((e["ts"], e["ts"] + e["dur"]))
    for spans in by_thread.values():
        stack: list[float] = []
        for start, end in sorted(spans, key=lambda s: (s[0], -s[1])):
            while stack and start >= stack[-1] - 1e-6:
                stack.pop()
            assert not stack or end <= stack[-1] + 1e-6, "partial overlap"
            stack.append(end)


def test_trace_busy_matches_engine(run):
    """Per lane and stream, the slices' durations add up to the engine's busy time."""
    result, trace = run
    sums = defaultdict(float)
    count = defaultdict(int)
    for e in _slices(trace):
        sums[(e["pid"], e["cat"])] += e["dur"]
        count[(e["pid"], e["cat"])] += 1
    # per slice: the report keeps 9 significant digits (10 ns at a 1-10 s step, per end) and the trace 1 ns
    per_slice_us = 2 * 5e-9 * result.step_time_s * 1e6 + 1e-3
    for lane in result.timeline.lanes:
        for stream, busy in lane.busy.items():
            key = (lane.index + 1, stream)
            assert sums[key] == pytest.approx(busy * 1e6, abs=per_slice_us * count[key] + 1e-6), key


def test_trace_flows_link_sends_to_consumers(run):
    """Each pipeline send starts one flow that ends on the destination stage's compute op for the same micro-batch."""
    result, trace = run
    events = trace["traceEvents"]
    starts = {e["id"]: e for e in events if e["ph"] == "s"}
    ends = {e["id"]: e for e in events if e["ph"] == "f"}
    sends = [e for e in _slices(trace) if e["cat"] == "pp"]
    assert set(starts) == set(ends) and len(starts) == len(sends) > 0
    slices_at = {(e["pid"], e["tid"], e["ts"]): e for e in _slices(trace)}
    lane_of = {ln.index + 1: ln for ln in result.timeline.lanes}
    for fid, s in starts.items():
        f = ends[fid]
        consumer = slices_at[(f["pid"], f["tid"], f["ts"])]
        sender = slices_at[(s["pid"], s["tid"], s["ts"])]
        assert consumer["cat"] == "compute" and f["ts"] >= s["ts"]
        assert consumer["args"]["microbatch"] == sender["args"]["microbatch"]
        step = 1 if s["name"] == "send_act" else -1
        assert consumer["args"]["virtual_stage"] == sender["args"]["virtual_stage"] + step
        assert lane_of[f["pid"]].dp == lane_of[s["pid"]].dp


def test_trace_of_saved_report_equals_trace_of_result():
    """The trace from a saved report is the trace from the Result."""
    result = simulate(load_scenario(DATA / "charts_tiny.yaml"))
    assert trace_events(json.loads(json.dumps(result.to_dict()))) == trace_events(result)
