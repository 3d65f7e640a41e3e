"""The memory timeline: per pipeline stage, allocated bytes over the step.

Static parts (parameters, gradients, optimizer state, other: context, buffers,
fragmentation) from the report's ``stages[].memory`` are stacked under the
activations, which rise with every forward and fall with every backward
(``timeline.lanes[].memory_activations``: the stash of in-flight micro-batches,
reference article rule 1). The stage's activation entry also holds working
buffers of the operation running at the peak; they are drawn as a constant
band, so the top of each stack reaches the stage's reported peak exactly.
The device capacity is the dashed line.
"""

from __future__ import annotations

import html

from simtrain.report.charts_data import lanes, report_of
from simtrain.spec.units import format_bytes

#: stacking order, bottom to top, with colours
STATIC_PARTS = (("params", "parameters", "#4C78A8"), ("grads", "gradients", "#F58518"),
                ("optimizer", "optimizer state", "#54A24B"), ("other", "other (context, buffers, fragmentation)",
                                                               "#BAB0AC"))
BUFFER_STYLE = ("activation working buffers (at peak)", "#FF9DA6")
ACT_STYLE = ("activations (stashed micro-batches)", "#E45756")


def memory_series(report: dict) -> list[dict]:
    """Per pipeline stage: times (s), stacked parts (bytes, each a list over times), peak and capacity.

    In full fidelity the lane with the highest activation peak stands for its stage (the stage's
    reported memory comes from that lane). Pure data, no plotly.
    """
    tl = report["timeline"]
    step = tl["step_time_s"]
    stage_mem = {s["pp"]: s for s in report["stages"]}
    worst: dict[int, object] = {}
    for ln in lanes(tl):
        peak = max((b for _, b in ln.memory_activations), default=0)
        if ln.pp not in worst or peak > max((b for _, b in worst[ln.pp].memory_activations), default=0):
            worst[ln.pp] = ln
    out = []
    for pp in sorted(worst):
        ln = worst[pp]
        events = list(ln.memory_activations)
        times = [0.0] + [t for t, _ in events] + [step]
        act, now = [0.0], 0.0
        for _, b in events:
            now = b
            act.append(now)
        act.append(now)
        mem = stage_mem[pp]["memory"]
        parts = {key: [float(mem.get(key, 0))] * len(times) for key, _, _ in STATIC_PARTS}
        buffers = max(0.0, float(mem.get("activations", 0)) - max(act))
        parts["buffers"] = [buffers] * len(times)
        parts["activations"] = act
        out.append({"pp": pp, "dp": ln.dp, "times": times, "parts": parts,
                    "peak": float(stage_mem[pp]["peak_memory_bytes"]),
                    "capacity": float(report.get("memory_capacity_bytes", 0))})
    return out


def memory_figure(result_or_report):
    """Allocated memory over the step, one panel per pipeline stage, as a plotly Figure."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    report = report_of(result_or_report, "memory_figure")
    series = memory_series(report)
    n = len(series)
    titles = [f"stage {s['pp']}: peak {format_bytes(s['peak'])} of {format_bytes(s['capacity'])}" for s in series]
    fig = make_subplots(rows=n, cols=1, shared_xaxes=True, subplot_titles=titles,
                        vertical_spacing=min(0.08, 0.35 / max(n, 1)))
    styles = [(k, label, color) for k, label, color in STATIC_PARTS] + \
        [("buffers", *BUFFER_STYLE), ("activations", *ACT_STYLE)]
    for i, s in enumerate(series, start=1):
        x = [round(t * 1e3, 4) for t in s["times"]]           # ms, to 0.1 us: short JSON
        for key, label, color in styles:
            if key == "buffers" and not any(b > 0 for s_ in series for b in s_["parts"]["buffers"]):
                continue        # no working buffers on any stage: no empty legend entry
            fig.add_trace(go.Scatter(
                x=x, y=[float(f"{b / 1e9:.6g}") for b in s["parts"][key]], name=label, legendgroup=key,
                showlegend=(i == 1),
                stackgroup=f"stage{i}", line=dict(width=0.5, color=color, shape="hv"), fillcolor=color,
                hovertemplate=f"{label}: %{{y:.2f}} GB at %{{x:.1f}} ms<extra>stage {s['pp']}</extra>"),
                row=i, col=1)
        fig.add_trace(go.Scatter(
            x=[x[0], x[-1]], y=[s["capacity"] / 1e9] * 2, name="device capacity", legendgroup="capacity",
            showlegend=(i == 1), mode="lines", line=dict(color="black", dash="dash", width=1.5),
            hovertemplate="capacity %{y:.2f} GB<extra></extra>"), row=i, col=1)
        fig.update_yaxes(title_text="GB", rangemode="tozero", row=i, col=1)
    fig.update_xaxes(title_text="time (ms)", row=n, col=1)
    par = report.get("config", {}).get("parallel", {})
    note = ("folded: each stage stands for all its DP replicas" if not report["timeline"].get("full") else
            "symmetry classes: the class of DP replicas with the highest activation peak per stage"
            if report["timeline"].get("classes") else
            "full fidelity: the DP replica with the highest activation peak per stage")
    fig.update_layout(
        title=dict(text=f"{html.escape(str(report.get('scenario', '')))}: memory over one step · "
                        f"{html.escape(str(par.get('schedule', '')))}, zero={par.get('zero', 0)}<br><sup>{note}</sup>",
                   x=0.01),
        template="plotly_white", height=max(360, 120 + 190 * n), hovermode="x unified",
        margin=dict(l=10, r=10, t=90, b=50))
    return fig
