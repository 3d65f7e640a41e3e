"""Sweep plots: a metric against one swept parameter, and a heatmap over two.

Both take the DataFrame of :func:`simtrain.decide.sweep` (one row per point: the swept
keys as columns, then step_time_s, tokens_per_s, mfu, bubble_fraction,
peak_memory_bytes_max, fits_in_memory, error) and return a plotly Figure, for
notebooks and for ``simtrain sweep --plot``. Points whose ``error`` is set are
left out (and counted in the title); points that do not fit in memory are
drawn with an x.
"""

from __future__ import annotations

import html
import math

from simtrain.report.chart_args import need_str, need_table

#: metric column -> (axis label, factor from SI to the shown unit, lower is better)
METRICS = {
    "step_time_s": ("step time (ms)", 1e3, True),
    "tokens_per_s": ("tokens/s", 1.0, False),
    "mfu": ("MFU (%)", 100.0, False),
    "hfu": ("HFU (%)", 100.0, False),
    "bubble_fraction": ("pipeline bubble (%)", 100.0, True),
    "peak_memory_bytes_max": ("peak memory per GPU (GB)", 1e-9, True),
}
#: result columns of a sweep table; every other column is an input (a swept or derived key)
RESULT_COLUMNS = set(METRICS) | {"fits_in_memory", "error", "exposed_comm_s", "events", "fidelity"}


def _metric(name: str) -> tuple[str, float, bool]:
    return METRICS.get(name, (name, 1.0, False))


def _check_columns(df, names) -> None:
    from simtrain.spec.errors import InputError

    missing = [n for n in names if n not in df.columns]
    if missing:
        raise InputError(f"the sweep table has no column {missing[0]!r} (columns: {', '.join(map(str, df.columns))})")


def _valid(df):
    """Rows without an error, and how many were dropped."""
    if "error" not in df.columns:
        return df, 0
    bad = df["error"].notna() & (df["error"].astype(str) != "")
    return df[~bad], int(bad.sum())


def _fits(series) -> list[bool]:
    """fits_in_memory as booleans; tables read back from CSV hold 'True'/'False' text. Unknown counts as fits."""
    out = []
    for v in series.tolist():
        if isinstance(v, str):
            out.append(v.strip().lower() not in ("false", "0", "0.0", "no"))
        else:
            out.append(True if v is None or _nan(v) else bool(v))
    return out


def _group_columns(df, fixed: list[str]) -> list[str]:
    """Input columns that still vary once ``fixed`` are fixed: each combination is its own line."""
    out = []
    for col in df.columns:
        if col in RESULT_COLUMNS or col in fixed:
            continue
        try:
            varies = df.groupby(fixed, dropna=False)[col].nunique(dropna=False).max() > 1
        except TypeError:       # unhashable values (lists): not a sweep key
            continue
        if varies:
            out.append(col)
    return out


def sweep_figure(df, x: str, metrics=("step_time_s", "mfu")):
    """Each metric (one panel each) against the swept parameter ``x``; one line per other swept combination."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    need_table("sweep_figure", df, "df")
    need_str("sweep_figure", x, "x")
    metrics = [metrics] if isinstance(metrics, str) else list(metrics)
    x = _column(df, x)
    _check_columns(df, [x, *metrics])
    data, failed = _valid(df)
    groups = _group_columns(data, [x])
    fig = make_subplots(rows=len(metrics), cols=1, shared_xaxes=True, vertical_spacing=0.08)
    palette = ["#4C78A8", "#F58518", "#54A24B", "#E45756", "#72B7B2", "#B279A2", "#9D755D", "#FF9DA6"]
    parts = list(data.groupby(groups, dropna=False, sort=True)) if groups else [((), data)]
    any_oom = False
    for g, (key, sub) in enumerate(parts):
        key = key if isinstance(key, tuple) else (key,)
        name = ", ".join(f"{c}={v}" for c, v in zip(groups, key)) or x
        sub = sub.sort_values(x)
        fits = _fits(sub["fits_in_memory"]) if "fits_in_memory" in sub else [True] * len(sub)
        any_oom = any_oom or not all(fits)
        for i, m in enumerate(metrics, start=1):
            label, scale, _ = _metric(m)
            y = [v * scale if v is not None and not _nan(v) else None for v in sub[m].tolist()]
            fig.add_trace(go.Scatter(
                x=sub[x].tolist(), y=y, name=name, legendgroup=name, showlegend=(i == 1 and bool(groups)),
                mode="lines+markers", line=dict(color=palette[g % len(palette)]),
                marker=dict(symbol=["circle" if f else "x" for f in fits], size=[8 if f else 11 for f in fits]),
                hovertemplate=f"{html.escape(str(x))}=%{{x}}<br>{label}: %{{y:.4g}}<extra>{html.escape(name)}</extra>"),
                row=i, col=1)
            fig.update_yaxes(title_text=label, row=i, col=1)
    fig.update_xaxes(title_text=html.escape(str(x)), row=len(metrics), col=1)
    notes = (["x: does not fit in memory"] if any_oom else []) + (
        [f"{failed} failed point(s) left out (see the error column)"] if failed else [])
    fig.update_layout(title=dict(text=f"{', '.join(_metric(m)[0] for m in metrics)} vs {html.escape(str(x))}"
                                      f"<br><sup>{'; '.join(notes)}</sup>", x=0.01),
                      template="plotly_white", height=max(360, 80 + 260 * len(metrics)))
    return fig


def _nan(v) -> bool:
    return type(v).__name__ == "NAType" or (isinstance(v, float) and math.isnan(v))


def _column(df, key: str) -> str:
    """The column of a swept key: its own name, or the dotted scenario key (``parallel.pp`` is ``parallel_pp``)."""
    plain = str(key).replace(".", "_")
    return plain if key not in df.columns and plain in df.columns else key


def _levels(series) -> list:
    """The distinct values of a column, sorted where they compare."""
    values = list(dict.fromkeys(series.tolist()))
    try:
        return sorted(values)
    except TypeError:
        return values


def _fmt(v: float) -> str:
    """Numbers as people read them: 110,734 / 61.2 / 0.0864."""
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    if abs(v) >= 100:
        return f"{v:.0f}"
    return f"{v:.3g}"


def _cell_text(best: tuple[float, bool] | None, scale: float, tried: bool) -> str:
    if best is None:
        return "failed" if tried else ""
    return _fmt(best[0] * scale) + ("" if best[1] else " (OOM)")


def heatmap_figure(df, x: str, y: str, metric: str):
    """``metric`` over two swept parameters; where other keys vary too, each cell shows their best point."""
    import plotly.graph_objects as go

    need_table("heatmap_figure", df, "df")
    for argument, value in (("x", x), ("y", y), ("metric", metric)):
        need_str("heatmap_figure", value, argument)
    x, y = _column(df, x), _column(df, y)
    _check_columns(df, [x, y, metric])
    data, failed = _valid(df)
    label, scale, lower_better = _metric(metric)
    others = _group_columns(data, [x, y])
    xs, ys = _levels(df[x]), _levels(df[y])          # failed points keep their row and column
    fits = _fits(data["fits_in_memory"]) if "fits_in_memory" in data else [True] * len(data)
    best: dict[tuple, tuple[float, bool]] = {}
    for xv, yv, v, ok in zip(data[x].tolist(), data[y].tolist(), data[metric].tolist(), fits):
        if v is None or _nan(v):
            continue
        old = best.get((xv, yv))
        # a point that fits beats one that does not; then the better metric wins
        better = old is None or (ok, -v if lower_better else v) > (old[1], -old[0] if lower_better else old[0])
        if better:
            best[(xv, yv)] = (v, ok)
    tried = set(zip(df[x].tolist(), df[y].tolist()))
    z, text = [], []
    for yv in ys:
        z.append([best[(xv, yv)][0] * scale if (xv, yv) in best else None for xv in xs])
        text.append([_cell_text(best.get((xv, yv)), scale, (xv, yv) in tried) for xv in xs])
    fig = go.Figure(go.Heatmap(
        z=z, x=[str(v) for v in xs], y=[str(v) for v in ys], text=text,
        texttemplate="%{text}", colorscale="Viridis", reversescale=lower_better, colorbar=dict(title=label),
        hovertemplate=f"{html.escape(str(x))}=%{{x}}<br>{html.escape(str(y))}=%{{y}}<br>{label}: %{{z:.4g}}"
                      "<extra></extra>"))
    notes = []
    if others:
        notes.append(f"each cell: the {'lowest' if lower_better else 'highest'} over {', '.join(others)}")
    if failed:
        notes.append(f"{failed} failed point(s) left out")
    notes.append("OOM: does not fit in memory")
    fig.update_layout(title=dict(text=f"{label} over {html.escape(str(x))} x {html.escape(str(y))}"
                                      f"<br><sup>{'; '.join(notes)}</sup>", x=0.01),
                      template="plotly_white", xaxis_title=html.escape(str(x)), yaxis_title=html.escape(str(y)),
                      xaxis_type="category", yaxis_type="category")
    return fig
