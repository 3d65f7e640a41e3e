"""The simulated timeline as the charts and the trace read it.

Everything here works on the JSON report (``Result.to_dict()``), so a chart
drawn from a saved report (``simtrain plot``) is the chart drawn right after
the run. Times stay in seconds (SI); the figures convert to ms, the trace to us.

Three transformations serve both the Gantt chart and the trace:

- :func:`merge_layers` joins the engine's per-layer records of one operation
  into one bar (the engine records every layer so that the trace can show them).
- :func:`assign_tracks` puts records that overlap in time on one stream (two
  pipeline sends in flight, a ZeRO-3 gather beside a reduce-scatter) on separate
  tracks, so every track is a sequence of non-overlapping slices.
- :func:`idle_gaps` finds the spans where a compute stream does nothing: the
  pipeline bubbles, and the waits for communication.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

from simtrain.report.chart_args import need_result
from simtrain.report.report_check import check_report, record_values
from simtrain.spec.errors import InputError

#: streams in display order (the engine's names)
STREAMS = ("compute", "tp", "pp", "dp", "ep", "cp", "amax", "offload")
STREAM_LABELS = {"compute": "compute", "tp": "TP comm", "cp": "CP KV exchange", "pp": "PP send", "dp": "DP/ZeRO",
                 "ep": "EP all-to-all", "amax": "FP8 amax all-reduce", "offload": "host offload"}


class Rec(NamedTuple):
    """One engine record, times in seconds (see simtrain.report.timeline.FIELDS)."""

    lane: int
    stream: str
    kind: str
    start: float
    end: float
    mb: int
    vstage: int
    lo: int
    hi: int
    nbytes: float


@dataclass(frozen=True)
class LaneInfo:
    """One simulated lane: a pipeline rank of one DP replica (``dp`` None: folded, all replicas)."""

    index: int
    dp: int | None
    pp: int
    end: float
    memory_activations: tuple = ()


@dataclass
class Bar:
    """Consecutive records of one operation on one stream, drawn as one bar."""

    stream: str
    kind: str
    start: float
    end: float
    busy: float                 # s actually spent (the span minus stalls inside the operation)
    mb: int
    vstage: int
    lo: int                     # first transformer layer, -1 if none
    hi: int                     # last layer + 1
    nbytes: float
    count: int = 1              # engine records joined into this bar
    edge: bool = False          # holds embedding or output-layer work (records without a layer)
    parts: dict = field(default_factory=dict)   # kind -> busy s, when kinds were joined
    overlapped: bool = False    # runs at the same time as another operation of its lane (an overlapped pair)


def report_of(result_or_report: Any, function: str = "report_of") -> dict:
    """The JSON report of a :class:`~simtrain.report.result.Result`, or the report dict itself, checked
    (:func:`check_report`): a saved report may have been edited by hand. Anything else is a TypeError naming
    ``function`` (the public function that was handed it)."""
    need_result(function, result_or_report)
    report = result_or_report if isinstance(result_or_report, dict) else result_or_report.to_dict(timeline=True)
    if not report.get("timeline"):
        raise InputError("this report has no timeline to draw (a `simtrain memory` report, or saved without it); "
                         "write one with `simtrain run SCENARIO --json PATH`")
    if isinstance(result_or_report, dict):
        check_report(report)
    return report


def records(timeline: dict) -> list[Rec]:
    """The timeline's records (:func:`simtrain.report.report_check.record_values`: read by field name, a damaged
    record a :class:`ReportError` naming it)."""
    return [Rec._make(values) for values in record_values(timeline)]


def lanes(timeline: dict) -> list[LaneInfo]:
    return [LaneInfo(index=ln["index"], dp=ln["dp"], pp=ln["pp"], end=ln["end_s"],
                     memory_activations=tuple(tuple(x) for x in ln.get("memory_activations", ())))
            for ln in timeline["lanes"]]


def shown_lanes(timeline: dict) -> tuple[list[LaneInfo], str]:
    """The lanes a chart shows, one per pipeline rank, and a note saying which."""
    all_lanes = lanes(timeline)
    if not timeline.get("full"):
        return all_lanes, "folded: each stage stands for all its DP replicas"
    replicas = len({ln.dp for ln in all_lanes})
    # the replica that finishes last sets the step: show it (a straggler or a slow link lives there)
    slowest = max(all_lanes, key=lambda ln: (ln.end, -ln.index)).dp
    shown = [ln for ln in all_lanes if ln.dp == slowest]
    classes = timeline.get("classes")
    if classes:
        alike = next((len(c) for c in classes if c and c[0] == slowest), 1)
        stands = f", standing for {alike} alike" if alike > 1 else ""
        return shown, (f"symmetry classes: DP replica {slowest} of {sum(len(c) for c in classes)} shown (the one that "
                       f"finishes last{stands})")
    return shown, f"full fidelity: DP replica {slowest} of {replicas} shown (the one that finishes last)"


def tolerance(step_time: float) -> float:
    """Gaps and overlaps below this are rounding, not time: reports keep 9 significant digits."""
    return max(1e-9, 2e-8 * step_time)


def assign_tracks(items: list, tol: float) -> list[int]:
    """Greedy interval partitioning: for items with .start/.end, sorted by start, the track of each.

    An item goes on the first track whose last item ended by its start (within ``tol``),
    so no two items on one track overlap; one track suffices when nothing overlaps.
    """
    ends: list[float] = []
    out = []
    for it in items:
        for k, end in enumerate(ends):
            if it.start >= end - tol:
                ends[k] = it.end
                out.append(k)
                break
        else:
            ends.append(it.end)
            out.append(len(ends) - 1)
    return out


def _bar(r: Rec) -> Bar:
    return Bar(stream=r.stream, kind=r.kind, start=r.start, end=r.end, busy=r.end - r.start, mb=r.mb,
               vstage=r.vstage, lo=r.lo, hi=r.hi, nbytes=r.nbytes, edge=r.lo < 0, parts={r.kind: r.end - r.start})


def _join(bar: Bar, other: Bar, kind: str | None = None) -> None:
    bar.end = max(bar.end, other.end)
    bar.busy += other.busy
    bar.nbytes += other.nbytes
    bar.count += other.count
    bar.edge = bar.edge or other.edge
    if other.lo >= 0:
        bar.lo = other.lo if bar.lo < 0 else min(bar.lo, other.lo)
        bar.hi = max(bar.hi, other.hi)
    for k, v in other.parts.items():
        bar.parts[k] = bar.parts.get(k, 0.0) + v
    if kind is not None:
        bar.kind = kind


def merge_layers(row: list[Rec], tol: float) -> list[Bar]:
    """Join consecutive records of one row with the same (kind, micro-batch, virtual stage).

    ``row`` holds one lane's records of one stream (one track), sorted by start. On the
    compute stream records join across gaps: nothing else runs there in between, so a gap
    inside an operation is the operation's own stall (its TP all-reduce, a ZeRO-3 gather);
    the bar's ``busy`` keeps the time really computed. On communication streams records
    join only when they touch, so a bar never claims a link was busy when it was not.
    """
    out: list[Bar] = []
    for r in row:
        prev = out[-1] if out else None
        if (prev is not None and prev.kind == r.kind and prev.mb == r.mb and prev.vstage == r.vstage
                and r.kind != "optimizer" and (r.stream == "compute" or r.start <= prev.end + tol)):
            _join(prev, _bar(r))
        else:
            out.append(_bar(r))
    return out


def _copy(bar: Bar) -> Bar:
    return replace(bar, parts=dict(bar.parts))


def merge_ops(bars: list[Bar]) -> list[Bar]:
    """Coarser: one bar per operation (recompute joins its backward); a comm operation's pieces join across gaps.

    Returns new bars; ``bars`` is left as it was.
    """
    out: list[Bar] = []
    for b in bars:
        prev = out[-1] if out else None
        if prev is None:
            out.append(_copy(b))
            continue
        if b.stream == "compute":
            same_op = prev.mb == b.mb and prev.vstage == b.vstage and b.mb >= 0
            if same_op and {prev.kind, b.kind} <= {"backward", "recompute"}:
                _join(prev, b, kind="backward")
                continue
            if same_op and prev.kind == b.kind:
                _join(prev, b)
                continue
        elif prev.kind == b.kind and prev.mb == b.mb and prev.vstage == b.vstage:
            _join(prev, b)
            continue
        out.append(_copy(b))
    return out


def join_interleaved(bars: list[Bar]) -> list[Bar]:
    """Join the pieces of each compute operation that took turns with another one (an overlapped forward/backward
    pair: DualPipe's F&B), so that the two are drawn as two overlapping bars, each marked ``overlapped``.
    A (kind, micro-batch, virtual stage) runs once per lane, so its pieces are one operation. New bars."""
    out: list[Bar] = []
    seen: dict[tuple, Bar] = {}
    for b in bars:
        kind = "backward" if b.kind == "recompute" else b.kind
        key = (kind, b.mb, b.vstage)
        hit = seen.get(key) if b.mb >= 0 and b.stream == "compute" else None
        if hit is not None:
            _join(hit, b, kind=kind if kind != hit.kind else None)
            continue
        out.append(_copy(b))
        if b.mb >= 0:
            seen[key] = out[-1]
    out.sort(key=lambda x: x.start)
    for a, b in zip(out, out[1:], strict=False):
        if b.start < a.end and b.stream == "compute" and a.mb >= 0 and b.mb >= 0:
            a.overlapped = b.overlapped = True
    return out


def merge_close(bars: list[Bar], min_gap: float) -> list[Bar]:
    """Coarsest: neighbours closer than ``min_gap`` join; the bar takes the kind with the most busy time (new bars)."""
    out: list[Bar] = []
    for b in bars:
        prev = out[-1] if out else None
        if prev is not None and b.start - prev.end < min_gap:
            _join(prev, b)
            prev.kind = max(prev.parts, key=prev.parts.get)
            if prev.mb != b.mb:
                prev.mb = -1
        else:
            out.append(_copy(b))
    return out


def idle_gaps(spans: list[tuple[float, float]], t_end: float, tol: float) -> list[tuple[float, float]]:
    """Parts of [0, t_end] that no (start, end) span covers, longer than ``tol``."""
    gaps = []
    t = 0.0
    for start, end in sorted(spans):
        if start - t > tol:
            gaps.append((t, start))
        t = max(t, end)
    if t_end - t > tol:
        gaps.append((t, t_end))
    return gaps


def gpu_ranks(report: dict, lane: LaneInfo) -> tuple[int, int]:
    """First and last GPU rank a lane stands for (Megatron order, see simtrain.spec.placement)."""
    from simtrain.spec.placement import Placement

    par = report.get("config", {}).get("parallel", {})
    cp = par.get("cp", 1)
    pl = Placement(par.get("dp", 1) * cp, par.get("tp", 1), par.get("pp", 1),
                   report.get("config", {}).get("gpus_per_node", 1) or 1, cp=cp)
    if lane.dp is None:
        ranks = [pl.rank(d, t, lane.pp) for d in range(pl.dp) for t in range(pl.tp)]
    else:
        ranks = pl.tp_group(lane.dp, lane.pp)
    return min(ranks), max(ranks)


def layer_text(bar: Bar, last_vstage: int) -> str:
    """'layers 10-19 + output layer' style description of what a bar computed."""
    parts = []
    if bar.lo >= 0:
        parts.append(f"layer {bar.lo}" if bar.hi == bar.lo + 1 else f"layers {bar.lo}-{bar.hi - 1}")
    if bar.edge and bar.vstage >= 0:
        if bar.vstage == 0:
            parts.append("embedding")
        if bar.vstage == last_vstage:
            parts.append("output layer")
    return " + ".join(parts)
