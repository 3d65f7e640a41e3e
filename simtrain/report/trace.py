"""The simulated step as a Chrome / Perfetto trace (Trace Event Format).

Format: "Trace Event Format", Google (docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU):
complete events (``ph: "X"``, ``ts`` and ``dur`` in microseconds), metadata
events (``ph: "M"``: ``process_name``, ``thread_name``, sort indices) and flow
events (``ph: "s"`` / ``"f"`` sharing an ``id``; ``bp: "e"`` binds the end to
the enclosing slice). Open the file in https://ui.perfetto.dev or chrome://tracing.

One process (pid) per simulated lane: a pipeline stage's TP group in one DP
replica, or in folded fidelity the stage standing for all replicas. One thread
(tid) per stream: compute, TP comm, PP send, DP/ZeRO; records that overlap on
one stream (two sends in flight) get extra threads, so every thread's slices
follow one another without partial overlap. Every engine record (per layer)
becomes one slice; each pipeline send carries a flow arrow to the first
compute slice of the operation that consumed it on the destination stage.
"""

from __future__ import annotations

from simtrain.report.charts_data import (
    STREAM_LABELS,
    STREAMS,
    assign_tracks,
    gpu_ranks,
    lanes,
    records,
    report_of,
    tolerance,
)

STREAM_TID = {s: i + 1 for i, s in enumerate(STREAMS)}
NS_PER_S = 1e9


def _tid(stream: str, track: int) -> int:
    base = STREAM_TID.get(stream, len(STREAMS) + 1)
    return base if track == 0 else base * 100 + track


def _us(ns: int) -> float:
    return ns / 1000.0


def trace_events(result_or_report) -> dict:
    """The trace of a Result or a saved report, as a JSON-ready dict ``{"traceEvents": [...], ...}``."""
    report = report_of(result_or_report, "trace_events")
    tl = report["timeline"]
    step = tl["step_time_s"]
    tol_ns = max(1, round(tolerance(step) * NS_PER_S))
    par = report.get("config", {}).get("parallel", {})
    pp, dp = par.get("pp", 1), par.get("dp", 1)
    all_lanes = lanes(tl)
    lane_of = {ln.index: ln for ln in all_lanes}
    events: list[dict] = []
    for ln in all_lanes:
        lo, hi = gpu_ranks(report, ln)
        gpus = f"GPU {lo}" if lo == hi else f"GPUs {lo}-{hi}"
        cp = par.get("cp", 1)
        replicas = f"{dp} DP replicas" if cp == 1 else f"{dp} DP x {cp} CP ranks"
        who = f"all {replicas}" if ln.dp is None else f"{'DP replica' if cp == 1 else 'DP x CP rank'} {ln.dp}"
        events.append({"ph": "M", "name": "process_name", "pid": ln.index + 1, "tid": 0,
                       "args": {"name": f"stage {ln.pp} ({who}; {gpus})"}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": ln.index + 1, "tid": 0,
                       "args": {"sort_index": ln.index}})

    # integer nanoseconds: sums and comparisons stay exact; ts/dur in us keep 3 decimals
    by_row: dict[tuple[int, str], list] = {}
    for r in records(tl):
        by_row.setdefault((r.lane, r.stream), []).append(
            (round(r.start * NS_PER_S), round(r.end * NS_PER_S), r))
    consumers: dict[tuple, tuple] = {}     # (lane, mb, vstage, F/B) -> (ts ns, tid) of the first compute slice
    sends = []
    threads = set()
    for (lane, stream), rows in sorted(by_row.items()):
        rows.sort(key=lambda x: (x[0], x[1]))
        spans = [_Span(a, b) for a, b, _ in rows]
        tracks = assign_tracks(spans, tol_ns)
        last_end: dict[int, int] = {}
        for (a, b, r), k in zip(rows, tracks):
            a = max(a, last_end.get(k, a))       # a rounding overlap (<= tol) becomes "follows"
            b = max(a, b)
            last_end[k] = b
            tid = _tid(stream, k)
            threads.add((lane, stream, k, tid))
            args = {"microbatch": r.mb, "virtual_stage": r.vstage}
            if r.lo >= 0:
                args["layers"] = str(r.lo) if r.hi == r.lo + 1 else f"{r.lo}-{r.hi - 1}"
            if r.nbytes:
                args["bytes"] = r.nbytes
            name = f"{r.kind} mb{r.mb}" if r.mb >= 0 else r.kind
            events.append({"ph": "X", "name": name, "cat": stream, "pid": lane + 1, "tid": tid,
                           "ts": _us(a), "dur": _us(b - a), "args": args})
            if stream == "compute" and r.kind in ("forward", "backward", "recompute"):
                key = (lane, r.mb, r.vstage, "F" if r.kind == "forward" else "B")
                if key not in consumers or a < consumers[key][0]:
                    consumers[key] = (a, tid)
            if r.kind in ("send_act", "send_grad"):
                sends.append((lane, tid, a, r))

    lane_at = {(ln.dp, ln.pp): ln.index for ln in all_lanes}
    flow_id = 0
    for lane, tid, ts, r in sends:
        forward = r.kind == "send_act"
        dst_v = r.vstage + (1 if forward else -1)
        dst_lane = lane_at.get((lane_of[lane].dp, dst_v % pp))
        target = consumers.get((dst_lane, r.mb, dst_v, "F" if forward else "B"))
        if target is None:
            continue
        flow_id += 1
        common = {"name": r.kind, "cat": "pp_flow", "id": flow_id}
        events.append({"ph": "s", "pid": lane + 1, "tid": tid, "ts": _us(ts), "bp": "e", **common})
        events.append({"ph": "f", "pid": dst_lane + 1, "tid": target[1], "ts": _us(target[0]), "bp": "e", **common})

    for lane, stream, k, tid in sorted(threads):
        label = STREAM_LABELS.get(stream, stream) + (f" ({k + 1})" if k else "")
        events.append({"ph": "M", "name": "thread_name", "pid": lane + 1, "tid": tid, "args": {"name": label}})
        events.append({"ph": "M", "name": "thread_sort_index", "pid": lane + 1, "tid": tid,
                       "args": {"sort_index": tid}})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"scenario": str(report.get("scenario", "")), "step_time_s": step,
                          "fidelity": report.get("fidelity"), "generator": "simtrain"}}


class _Span:
    __slots__ = ("start", "end")

    def __init__(self, start: int, end: int) -> None:
        self.start, self.end = start, end
