"""Predicted against measured step times of the validation cases: one point per case, log-log, one colour per
source, the diagonal and the +/-10% band drawn. Reads the case rows of ``simtrain validate --json`` (plain dicts),
so a saved report can be drawn again."""

from __future__ import annotations

import html
from typing import Any

#: one colour per source, in name order (plotly's qualitative 'Plotly' palette, ten colours, then repeated)
PALETTE = ("#636EFA", "#EF553B", "#00CC96", "#AB63FA", "#FFA15A", "#19D3F3", "#FF6692", "#B6E880", "#FF97FF",
           "#FECB52")


def validation_figure(cases: list[dict[str, Any]]):
    """The figure: measured step time (x) against predicted (y), seconds, log axes; gated cases filled,
    ungated hollow; hover names the case, its error and its configuration."""
    import plotly.graph_objects as go

    drawn = [c for c in cases if c.get("predicted_step_time_s") is not None]
    fig = go.Figure()
    if drawn:
        lo = min(min(c["target_step_time_s"], c["predicted_step_time_s"]) for c in drawn) / 1.3
        hi = max(max(c["target_step_time_s"], c["predicted_step_time_s"]) for c in drawn) * 1.3
        for factor, name, dash in ((1.0, "predicted = measured", "solid"), (1.1, "+10%", "dot"),
                                   (0.9, "-10%", "dot")):
            fig.add_trace(go.Scatter(x=[lo, hi], y=[lo * factor, hi * factor], mode="lines", name=name,
                                     line=dict(color="#888888", width=1, dash=dash), hoverinfo="skip"))
    sources = sorted({c.get("source_name") or c.get("source", "") for c in drawn})
    for i, source in enumerate(sources):
        color = PALETTE[i % len(PALETTE)]
        for gated in (True, False):
            mine = [c for c in drawn if (c.get("source_name") or c.get("source", "")) == source
                    and bool(c.get("gate")) == gated]
            if not mine:
                continue
            fig.add_trace(go.Scatter(
                x=[c["target_step_time_s"] for c in mine], y=[c["predicted_step_time_s"] for c in mine],
                mode="markers", name=html.escape(source) + ("" if gated else " (not gated)"),
                marker=dict(color=color if gated else "rgba(0,0,0,0)", size=8,
                            line=dict(color=color, width=1.5)),
                text=[html.escape(f"{c['id']}: {100 * c['error']:+.1f}% ({c.get('gpu', '')}) {c.get('config', '')}")
                      for c in mine],
                hovertemplate="%{text}<br>measured %{x:.3g} s, predicted %{y:.3g} s<extra></extra>"))
    fig.update_xaxes(type="log", title="measured step time (s)")
    fig.update_yaxes(type="log", title="predicted step time (s)")
    fig.update_layout(title=dict(text="simtrain validate: predicted vs measured step time<br><sup>one point per "
                                      "case; filled = gated, hollow = settings partly assumed; dotted: +/-10%</sup>",
                                 x=0.01),
                      template="plotly_white", height=640, width=960, legend=dict(font=dict(size=10)))
    return fig
