"""Charts of the decision tools: a layout search's winners, a comparison, a validation run (plotly Figures).

Each takes plain rows (dicts, or a DataFrame's records) in SI units and returns a Figure; nothing is shown as a side
effect. ``simtrain compare --plot`` writes :func:`compare_figure`.
"""

from __future__ import annotations

import html
from typing import Any

from simtrain.report.chart_args import need_rows

BLUE = "#4C78A8"


def _records(rows: Any) -> list[dict[str, Any]]:
    """Rows as dicts: a DataFrame's records (missing values as None), or the list given."""
    if hasattr(rows, "to_dict"):
        import pandas as pd

        frame = rows.astype(object).where(pd.notna(rows), None)
        return frame.to_dict(orient="records")
    return list(rows)


def _count(tokens: float) -> str:
    for suffix, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6)):
        if tokens >= scale:
            return f"{tokens / scale:g}{suffix}"
    return f"{tokens:g}"


def compare_figure(rows: Any, energy_note: str = ""):
    """Bars per scenario: tokens/s, MFU, days to train and, where known, cost and energy."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    need_rows("compare_figure", rows)
    rows = _records(rows)
    budget = _count(rows[0]["tokens"]) if rows else ""
    steady = all(r.get("goodput") is None for r in rows)
    panels = [("tokens/s", "tokens_per_s", 1.0), ("MFU (%)", "mfu", 100.0),
              (f"days for {budget} tokens" + (" (steady state)" if steady else ""), "time_to_train_s", 1 / 86400)]
    if any(r.get("cost_usd") is not None for r in rows):
        panels.append((f"cost for {budget} tokens (USD)", "cost_usd", 1.0))
    if any(r.get("energy_j") is not None for r in rows):
        panels.append((f"GPU board energy for {budget} tokens (MWh)", "energy_j", 1 / 3.6e9))
    fig = make_subplots(rows=1, cols=len(panels), subplot_titles=[p[0] for p in panels])
    names = [html.escape(str(r["scenario"])) for r in rows]   # plotly renders tags in axis labels
    for i, (_, key, scale) in enumerate(panels, start=1):
        values = [None if r.get(key) is None else r[key] * scale for r in rows]
        fig.add_trace(go.Bar(x=names, y=values, showlegend=False, marker_color=BLUE,
                             hovertemplate="%{x}: %{y:.4g}<extra></extra>"), row=1, col=i)
    fig.update_layout(title=dict(text="compare" + (f"<br><sup>{html.escape(energy_note)}</sup>" if energy_note
                                                   else ""), x=0.01),
                      template="plotly_white", height=420, width=max(700, 300 * len(panels)))
    return fig


def search_figure(top: Any, subtitle: str = ""):
    """The top layouts of a search: tokens/s per layout, the hover saying why each is slower than the best."""
    import plotly.graph_objects as go

    need_rows("search_figure", top, "top")
    top = _records(top)
    names = [f"#{n} tp{r['tp']} pp{r['pp']} dp{r['dp']} vpp{r['vpp']} mb{r['micro_batch']} z{r['zero']} "
             f"{r['recompute']} {r['schedule']}" for n, r in enumerate(top, start=1)]
    fig = go.Figure(go.Bar(x=[r["tokens_per_s"] for r in top], y=names, orientation="h", marker_color=BLUE,
                           customdata=[[html.escape(str(r.get("reason", "")))] for r in top],
                           hovertemplate="%{y}<br>%{x:,.0f} tokens/s<br>%{customdata[0]}<extra></extra>"))
    fig.update_layout(title=dict(text="search: the fastest layouts" + (f"<br><sup>{html.escape(subtitle)}</sup>"
                                                                       if subtitle else ""), x=0.01),
                      template="plotly_white", xaxis_title="tokens/s", yaxis=dict(autorange="reversed"),
                      height=max(300, 60 + 40 * len(top)), width=900)
    return fig


def validate_figure(cases: Any):
    """Predicted against measured step time, one point per case (log axes); the diagonal is a perfect prediction,
    the dotted lines +-10%."""
    import plotly.graph_objects as go

    need_rows("validate_figure", cases, "cases")
    cases = [c for c in _records(cases) if c.get("predicted_step_time_s") is not None]
    fig = go.Figure()
    for gated, name, colour in ((True, "gated", BLUE), (False, "not gated", "#F58518")):
        chosen = [c for c in cases if bool(c["gate"]) is gated]
        if chosen:
            fig.add_trace(go.Scatter(
                x=[c["target_step_time_s"] for c in chosen], y=[c["predicted_step_time_s"] for c in chosen],
                mode="markers", name=name, marker_color=colour, text=[html.escape(str(c["id"])) for c in chosen],
                hovertemplate="%{text}<br>measured %{x:.3f} s, predicted %{y:.3f} s<extra></extra>"))
    if cases:
        low = min(min(c["target_step_time_s"], c["predicted_step_time_s"]) for c in cases)
        high = max(max(c["target_step_time_s"], c["predicted_step_time_s"]) for c in cases)
        for factor, dash in ((1.0, "solid"), (1.1, "dot"), (0.9, "dot")):
            fig.add_trace(go.Scatter(x=[low, high], y=[low * factor, high * factor], mode="lines", showlegend=False,
                                     line=dict(color="#888", dash=dash, width=1), hoverinfo="skip"))
    fig.update_layout(title=dict(text="validate: predicted vs measured step time", x=0.01), template="plotly_white",
                      xaxis=dict(title="measured step time (s)", type="log"),
                      yaxis=dict(title="predicted step time (s)", type="log"), height=520, width=620)
    return fig
