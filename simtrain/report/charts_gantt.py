"""The Gantt chart of one simulated step: where the time goes, stage by stage.

One row per pipeline stage and stream (compute, TP comm, PP send, DP/ZeRO),
bars coloured by kind, the micro-batch number on each compute bar, idle spans
on compute rows hatched as bubbles and summed in the row's label. Time in ms.

The engine records every layer; a chart with 16 stages x 16 micro-batches
would drown in them. :func:`gantt_rows` joins each operation's layers into one
bar, and when bars are still more than ``max_bars`` it coarsens in two steps
(one bar per operation, then neighbours closer than a fraction of the step
join) and says so in the title. The label's idle sums are always exact.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field

from simtrain.report.chart_args import need_count
from simtrain.report.charts_data import (
    STREAM_LABELS,
    STREAMS,
    Bar,
    assign_tracks,
    idle_gaps,
    join_interleaved,
    layer_text,
    merge_close,
    merge_layers,
    merge_ops,
    records,
    report_of,
    shown_lanes,
    tolerance,
)
from simtrain.spec.units import format_bytes

#: colour and legend label per record kind; families share a hue (compute blue/orange, comm green/purple/grey)
KIND_STYLE = {
    "forward": ("#4C78A8", "forward"),
    "backward": ("#F58518", "backward"),
    "recompute": ("#E45756", "recompute"),
    "wgrad": ("#EECA3B", "weight gradient (W)"),
    "optimizer": ("#54A24B", "optimizer step"),
    "tp_comm": ("#B279A2", "TP all-reduce"),
    "send_act": ("#72B7B2", "PP send activations"),
    "send_grad": ("#3B8A85", "PP send gradients"),
    "mirror_grad_sum": ("#2F6F6A", "DualPipe gradient sum (mirror ranks)"),
    "embedding_grad_sum": ("#5F8F8B", "tied embedding gradient all-reduce (first and last stage)"),
    "tp_grad_all_reduce": ("#8E5C86", "TP all-reduce of replicated gradients (norms)"),
    "dp_all_reduce": ("#9D755D", "DP all-reduce"),
    "dp_reduce_scatter": ("#BAB0AC", "DP reduce-scatter"),
    "zero_all_gather": ("#79706E", "ZeRO all-gather (params)"),
    "zero3_all_gather": ("#D6A5C9", "ZeRO-3 all-gather"),
    "zero3_reduce_scatter": ("#8C6D8C", "ZeRO-3 reduce-scatter"),
    "ep_comm": ("#EECA3B", "EP dispatch + combine"),
    "cp_comm": ("#4C9F70", "CP KV exchange"),
    "amax_allreduce": ("#E377C2", "FP8 amax all-reduce"),
    "edp_all_reduce": ("#B6992D", "expert-DP all-reduce"),
    "edp_reduce_scatter": ("#D4B84A", "expert-DP reduce-scatter"),
    "edp_all_gather": ("#8F7A24", "expert-DP all-gather (params)"),
}
OTHER_STYLE = ("#999999", None)
BUBBLE_COLOR = "rgba(120,120,120,0.18)"
COMPUTE_KINDS = ("forward", "backward", "recompute", "wgrad")
#: the second direction of a bidirectional or V-shaped schedule: darker shades of the same hues
REVERSE_STYLE = {"forward": ("#2A4A6B", "forward, second direction"),
                 "backward": ("#A6540A", "backward, second direction"),
                 "wgrad": ("#B08D1A", "weight gradient, second direction")}
#: schedules whose virtual stages pp..2pp-1 run the other way (DualPipe's second model copy; a V's up-leg)
TWO_WAY = ("dualpipe", "dualpipev", "zb-v")


@dataclass
class GanttRow:
    """One row of the chart: a stream (track) of one pipeline stage."""

    label: str
    pp: int
    stream: str
    track: int
    bars: list[Bar]
    overlay: list[Bar] = field(default_factory=list)                # recompute pieces inside backward bars
    gaps: list[tuple[float, float]] = field(default_factory=list)   # shaded idle spans (compute rows)
    idle_s: float = 0.0                                              # exact idle sum (compute rows)


def gantt_rows(report: dict, max_bars: int = 5000) -> tuple[list[GanttRow], str]:
    """The chart's rows (top to bottom) and a note on how bars were joined; pure data, no plotly."""
    tl = report["timeline"]
    step = tl["step_time_s"]
    tol = tolerance(step)
    shown, _ = shown_lanes(tl)
    by_lane: dict[int, dict[str, list]] = {ln.index: {} for ln in shown}
    for r in records(tl):
        if r.lane in by_lane:
            by_lane[r.lane].setdefault(r.stream, []).append(r)
    present = [s for s in STREAMS if s == "compute" or any(s in d for d in by_lane.values())]
    present += sorted({s for d in by_lane.values() for s in d} - set(present))
    raw_rows: list[tuple[int, int, str, int, list]] = []
    for ln in sorted(shown, key=lambda x: x.pp):
        for stream in present:
            recs = sorted(by_lane[ln.index].get(stream, []), key=lambda r: (r.start, r.end))
            tracks = assign_tracks(recs, tol)
            for k in range(max(tracks, default=0) + 1):
                raw_rows.append((ln.index, ln.pp, stream, k, [r for r, t in zip(recs, tracks) if t == k]))

    rows = []
    for lane, pp, stream, k, recs in raw_rows:
        name = STREAM_LABELS.get(stream, stream) + (f" ({k + 1})" if k else "")
        row = GanttRow(label=f"stage {pp} · {name}", pp=pp, stream=stream, track=k, bars=merge_layers(recs, tol))
        if stream == "compute":
            # one bar per operation: recomputation (per layer, between the layers' backward pieces)
            # joins its backward bar and is drawn as thin bars inside it, where it happened
            pieces = row.bars
            row.bars = join_interleaved(merge_ops(pieces))
            row.overlay = [b for b in pieces if b.kind == "recompute"]
            inside = by_lane[lane].get("tp", []) + by_lane[lane].get("ep", []) + by_lane[lane].get("cp", [])
            _close_with_tp(row.bars, inside, tol)
            # the TP sum of replicated gradients belongs to no operation: a bar of its own before the optimizer's
            step_end = [r for r in by_lane[lane].get("tp", []) if r.kind == "tp_grad_all_reduce"]
            row.bars = sorted(row.bars + merge_layers(step_end, tol), key=lambda b: b.start)
            # idle = neither computing nor in a TP or EP collective: the engine runs them synchronously
            # inside each layer, so they are part of the operation, not a bubble
            spans = [(b.start, b.end) for b in row.bars]
            spans += [(r.start, r.end) for r in inside]
            row.gaps = idle_gaps(spans, step, tol)
            row.idle_s = sum(b - a for a, b in row.gaps)
            row.label += f" · idle {row.idle_s * 1e3:.1f} ms"
        rows.append(row)

    def count() -> int:
        return sum(len(r.bars) + len(r.overlay) + len(r.gaps) for r in rows)

    note = ""
    if count() > max_bars:
        for row in rows:
            row.bars = merge_ops(row.bars)
            row.overlay = []
        note = "one bar per operation, recompute not drawn"
    # only the steady state is joined: a stage's warm-up (before its first backward) and cool-down (after its last
    # forward) hold the bubbles and stay at full detail
    windows = _steady_windows(rows)
    # communication first: its bars are narrow and numerous, the compute rows carry the schedule
    min_gap = step / 2000
    while count() > max_bars and min_gap <= step / 20:
        for row in rows:
            if row.stream != "compute":
                row.bars = _merge_inside(row.bars, min_gap, windows.get(row.pp))
        note = f"in the steady state, communication bars closer than {min_gap * 1e3:.3g} ms joined"
        min_gap *= 2
    min_gap = step / 2000
    while count() > max_bars and min_gap < step:
        for row in rows:
            window = windows.get(row.pp)
            row.bars = _merge_inside(row.bars, min_gap, window)
            row.gaps = [g for g in row.gaps if g[1] - g[0] >= min_gap or not _inside(g[0], g[1], window)]
        note = f"in the steady state, bars closer than {min_gap * 1e3:.3g} ms joined"
        min_gap *= 2
    if note.startswith("in the steady state"):
        note += " (warm-up and cool-down at full detail; the trace keeps every operation)"
    return rows, note


def _steady_windows(rows: list[GanttRow]) -> dict[int, tuple[float, float]]:
    """Per stage: from its first backward's start to its last forward's end (its steady state)."""
    out = {}
    for row in rows:
        if row.stream != "compute" or row.track:
            continue
        backs = [b.start for b in row.bars if b.kind in ("backward", "recompute", "wgrad") and b.mb >= 0]
        fwds = [b.end for b in row.bars if b.kind == "forward" and b.mb >= 0]
        if backs and fwds and min(backs) < max(fwds):
            out[row.pp] = (min(backs), max(fwds))
    return out


def _inside(start: float, end: float, window: tuple[float, float] | None) -> bool:
    return window is not None and start >= window[0] and end <= window[1]


def _merge_inside(bars: list[Bar], min_gap: float, window: tuple[float, float] | None) -> list[Bar]:
    """``merge_close`` on the bars inside the steady-state window; the others stay as they are."""
    if window is None:
        return bars
    inside = [b for b in bars if _inside(b.start, b.end, window)]
    if len(inside) < 2:
        return bars
    before = [b for b in bars if not _inside(b.start, b.end, window) and b.start < window[0]]
    after = [b for b in bars if not _inside(b.start, b.end, window) and b.start >= window[0]]
    return before + merge_close(inside, min_gap) + after


def _close_with_tp(bars: list[Bar], tp: list, tol: float) -> None:
    """Extend each operation's bar over the TP all-reduce that ends it (after its last layer): the engine runs
    TP collectives inside the operation, so that span is neither idle nor another operation's."""
    from bisect import bisect_left

    tp = sorted(tp, key=lambda r: r.start)
    starts = [r.start for r in tp]
    for bar in bars:
        i = bisect_left(starts, bar.end - tol)
        while i < len(tp) and tp[i].start <= bar.end + tol:
            if tp[i].mb == bar.mb and tp[i].vstage == bar.vstage:
                bar.end = max(bar.end, tp[i].end)
            i += 1


def _hover(bar: Bar, last_vstage: int, vpp: int, pp: int) -> str:
    style = KIND_STYLE.get(bar.kind, OTHER_STYLE)
    lines = [f"<b>{style[1] or bar.kind}</b>"]
    op = []
    if bar.mb >= 0:
        op.append(f"micro-batch {bar.mb}")
    if bar.vstage >= 0 and (vpp > 1 or bar.vstage >= pp):
        op.append(f"virtual stage {bar.vstage}" + (", second direction" if bar.vstage >= pp else ""))
    if bar.overlapped:
        op.append("overlapped with another operation")
    if op:
        lines.append(", ".join(op))
    layers = layer_text(bar, last_vstage)
    if layers:
        lines.append(layers)
    span = bar.end - bar.start
    lines.append(f"start {bar.start * 1e3:.3f} ms, duration {span * 1e3:.3f} ms")
    if bar.busy < span * (1 - 1e-6):
        lines.append(f"busy {bar.busy * 1e3:.3f} ms (the rest: stalls inside the operation)")
    if len(bar.parts) > 1:
        lines.append(", ".join(f"{k} {v * 1e3:.3f} ms" for k, v in sorted(bar.parts.items())))
    if bar.nbytes > 0:
        lines.append(f"{format_bytes(bar.nbytes)}")
    if bar.count > 1:
        lines.append(f"{bar.count} records joined")
    return "<br>".join(lines)


def _ms(seconds: float) -> float:
    """Seconds to ms for the chart, to the nanosecond (reports keep 9 digits): short JSON."""
    return round(seconds * 1e3, 6)


def _labelled_bars(rows: list[GanttRow]) -> set[int]:
    """ids of the bars that carry a micro-batch number: the longest piece of each compute operation.

    With recompute, a backward is drawn as alternating recompute and backward pieces per layer;
    one number per operation keeps the row readable.
    """
    longest: dict[tuple, Bar] = {}
    for i, row in enumerate(rows):
        for bar in row.bars:
            if bar.kind in COMPUTE_KINDS and bar.mb >= 0:
                key = (i, bar.mb, bar.vstage, bar.kind == "forward")
                if key not in longest or bar.end - bar.start > longest[key].end - longest[key].start:
                    longest[key] = bar
    return {id(b) for b in longest.values()}


def gantt_figure(result_or_report, *, max_bars: int = 5000):
    """The Gantt chart of a Result or a saved JSON report, as a plotly Figure."""
    import plotly.graph_objects as go

    need_count("gantt_figure", max_bars, "max_bars")
    report = report_of(result_or_report, "gantt_figure")
    tl = report["timeline"]
    step = tl["step_time_s"]
    par = report.get("config", {}).get("parallel", {})
    pp, vpp = par.get("pp", tl.get("pp", 1)), par.get("vpp", 1)
    last_vstage = pp * vpp - 1
    rows, note = gantt_rows(report, max_bars)
    _, lanes_note = shown_lanes(tl)

    fig = go.Figure()
    gx, gb, gy, gt = [], [], [], []
    for i, row in enumerate(rows):
        for a, b in row.gaps:
            gb.append(_ms(a))
            gx.append(_ms(b - a))
            gy.append(i)
            gt.append(f"<b>idle</b> (neither compute nor TP)<br>{a * 1e3:.3f}-{b * 1e3:.3f} ms: {(b - a) * 1e3:.3f} ms")
    fig.add_trace(go.Bar(name="idle (bubble)", orientation="h", base=gb, x=gx, y=gy, hovertext=gt, hoverinfo="text",
                         marker=dict(color=BUBBLE_COLOR, pattern=dict(shape="/", fgcolor="rgba(90,90,90,0.55)",
                                                                      size=6)),
                         width=0.8))
    by_kind: dict[str, list] = {}
    two_way = par.get("schedule") in TWO_WAY
    for i, row in enumerate(rows):
        for bar in row.bars:
            reverse = two_way and bar.kind in REVERSE_STYLE and bar.vstage >= pp
            by_kind.setdefault(bar.kind + (":reverse" if reverse else ""), []).append((i, bar))
    labelled = _labelled_bars(rows)
    order = [k + suffix for k in KIND_STYLE for suffix in ("", ":reverse")]
    order += sorted(set(by_kind) - set(order))
    for kind in order:
        items = by_kind.get(kind)
        if not items:
            continue
        base_kind, _, reverse = kind.partition(":")
        color, label = (REVERSE_STYLE[base_kind] if reverse else KIND_STYLE.get(base_kind, OTHER_STYLE))
        compute = items[0][1].stream == "compute"
        # an overlapped pair's two bars share the row: the forward in its upper half, the backward in its lower
        offsets = [(-0.4 if b.kind == "forward" else 0.0) if b.overlapped else -0.4 for _, b in items]
        widths = [0.4 if b.overlapped else 0.8 for _, b in items]
        fig.add_trace(go.Bar(
            name=label or base_kind, orientation="h",
            base=[_ms(b.start) for _, b in items], x=[_ms(b.end - b.start) for _, b in items],
            y=[i for i, _ in items],
            text=[str(b.mb) if id(b) in labelled else "" for _, b in items],
            textposition="inside", insidetextanchor="middle", textangle=0, cliponaxis=True,
            textfont=dict(color="white", size=11),
            hovertext=[_hover(b, last_vstage, vpp, pp) for _, b in items], hoverinfo="text",
            # compute bars: a thin white edge separates back-to-back operations; comm bars: an edge
            # of their own colour keeps sub-pixel transfers visible at full zoom
            marker=dict(color=color, line=dict(color="white" if compute else color, width=0.6 if compute else 1),
                        # a joined communication bar that was idle much of its span is drawn faint
                        opacity=[1.0 if compute or b.busy >= 0.9 * (b.end - b.start) else 0.45 for _, b in items]),
            width=widths if any(b.overlapped for _, b in items) else 0.8,
            offset=offsets if any(b.overlapped for _, b in items) else None))
    overlay = [(i, b) for i, row in enumerate(rows) for b in row.overlay]
    if overlay:
        color, label = KIND_STYLE["recompute"]
        fig.add_trace(go.Bar(
            name=label + " (inside backward)", orientation="h",
            base=[_ms(b.start) for _, b in overlay], x=[_ms(b.end - b.start) for _, b in overlay],
            y=[i for i, _ in overlay], offset=0.1, width=0.3,      # the lower part of the backward bar
            hovertext=[_hover(b, last_vstage, vpp, pp) for _, b in overlay], hoverinfo="text",
            marker=dict(color=color, line=dict(width=0))))
    n = len(rows)
    bubble = report.get("bubble_fraction")
    title = (f"{html.escape(str(report.get('scenario', '')))}: one step, {step * 1e3:.1f} ms · "
             f"{pp} stage{'s' if pp != 1 else ''} x {report.get('microbatches')} "
             f"micro-batch{'es' if report.get('microbatches') != 1 else ''}, "
             f"{html.escape(str(par.get('schedule', '')))}"
             + (f" · bubble {bubble * 100:.1f}%" if bubble is not None else "")
             + f"<br><sup>{lanes_note}; hatched: compute idle" + (f"; {note}" if note else "") + "</sup>")
    fig.update_layout(
        title=dict(text=title, x=0.01), barmode="overlay", bargap=0.15, template="plotly_white",
        height=max(360, 150 + 24 * n), legend=dict(orientation="h", yanchor="top", y=-0.08 if n > 12 else -0.2),
        uniformtext=dict(minsize=7, mode="hide"), hoverlabel=dict(align="left"),
        margin=dict(l=10, r=10, t=80, b=60))
    fig.update_xaxes(title_text="time (ms)", range=[0, step * 1e3], showgrid=True, zeroline=False)
    fig.update_yaxes(tickmode="array", tickvals=list(range(n)), ticktext=[r.label for r in rows],
                     range=[n - 0.5, -0.5], showgrid=False, automargin=True)
    for i in range(1, n):   # a rule between stages
        if rows[i].pp != rows[i - 1].pp:
            fig.add_hline(y=i - 0.5, line=dict(color="#cccccc", width=1))
    return fig
