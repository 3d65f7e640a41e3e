"""Static SVG of simtrain's plotly figures, for where no JavaScript runs: GitHub's notebook view, a README, an
nbconvert export without plotly.js.

It draws what simtrain's charts use, from the figure's own data: bars (horizontal on a base, as the Gantt draws
them, or vertical by category), scatter lines, markers and stacked areas, heatmaps, subplots, linear, log and
category axes, titles, annotations, line shapes and a legend. Hover text, patterns and interaction are left out; a
trace of another type is named in a note on the image rather than guessed. Pure: a figure dict in, text out, the
same text for the same figure.
"""

from __future__ import annotations

import html
import math
import re
from typing import Any

from simtrain.report.svg_axes import Axis, fmt, text_width

__all__ = ["figure_svg"]

FONT = "font-family=\"Helvetica,Arial,sans-serif\""
GRID = "#e5e5e5"
INK = "#2a3f5f"                 # plotly_white's text colour
LEGEND_ROW = 20                 # px per legend row under the plot


def figure_svg(fig: Any) -> str:
    """The SVG text of a plotly Figure (or its ``to_dict()``)."""
    d = fig.to_dict() if hasattr(fig, "to_dict") else fig
    data, layout = list(d.get("data", ())), dict(d.get("layout", {}))
    width = float(layout.get("width") or 960)
    legend = _legend_entries(data)
    margin = {"l": 80, "r": 80, "t": 100, "b": 80} | dict(layout.get("margin") or {})
    axes = _axes(data, layout)
    ticks = {name: ax.ticks(7 if name.startswith("x") else 5) for name, ax in axes.items()}
    left_need = max((max((text_width(t, 12) for _, t in ticks[n]), default=0) + (24 if axes[n].title else 8)
                     for n in axes if n.startswith("y") and axes[n].domain_x0 == 0), default=0)
    margin["l"] = max(float(margin["l"]), left_need + 10)
    rows = _legend_rows(legend, width - margin["l"] - margin["r"])
    height = float(layout.get("height") or 450) + rows * LEGEND_ROW
    margin["b"] = float(margin["b"]) + rows * LEGEND_ROW
    box = (margin["l"], width - margin["r"], float(margin["t"]), height - margin["b"])
    for ax in axes.values():
        ax.place(box)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{fmt(width)}" height="{fmt(height)}" '
           f'viewBox="0 0 {fmt(width)} {fmt(height)}" {FONT} font-size="12">',
           f'<rect width="{fmt(width)}" height="{fmt(height)}" fill="white"/>']
    out += _grids(axes, ticks)
    notes: list[str] = []
    clips = {}
    for trace in data:
        xa, ya = _axis_names(trace)
        if xa not in axes or ya not in axes:
            continue
        key = (xa, ya)
        if key not in clips:
            clips[key] = f"c{len(clips)}"
            x0, x1 = axes[xa].px_span()
            y1, y0 = axes[ya].px_span()
            out.append(f'<clipPath id="{clips[key]}"><rect x="{fmt(x0)}" y="{fmt(y0)}" width="{fmt(x1 - x0)}" '
                       f'height="{fmt(y1 - y0)}"/></clipPath>')
    stacks: dict[tuple, list[float]] = {}
    bar_traces = _bar_groups(data, layout)
    for i, trace in enumerate(data):
        kind = trace.get("type", "scatter")
        xa, ya = _axis_names(trace)
        if xa not in axes or ya not in axes:
            continue
        x, y = axes[xa], axes[ya]
        body: list[str] = []
        if kind == "bar":
            body = _bars(trace, x, y, layout, bar_traces.get(i, (0, 1)))
        elif kind == "scatter":
            body = _scatter(trace, x, y, stacks)
        elif kind == "heatmap":
            body = _heatmap(trace, x, y)
            out += _colorbar(trace, box, width)
        else:
            notes.append(f"a {kind} trace is not drawn in this static image")
        if body:
            out.append(f'<g clip-path="url(#{clips[(xa, ya)]})">')
            out += body
            out.append("</g>")
    out += _shapes(layout, axes, box)
    out += _axis_labels(axes, ticks)
    out += _annotations(layout, axes, box)
    out += _title(layout, width)
    out += _legend(legend, box, width, margin)
    for j, note in enumerate(sorted(set(notes))):
        out.append(_text(box[0], height - 6 - 14 * j, note, size=11, fill="#a00"))
    out.append("</svg>")
    return "\n".join(out) + "\n"


# --- axes -------------------------------------------------------------------------------------------------------

def _axis_names(trace: dict) -> tuple[str, str]:
    return "x" + str(trace.get("xaxis", "x"))[1:], "y" + str(trace.get("yaxis", "y"))[1:]


def _axes(data: list[dict], layout: dict) -> dict[str, Axis]:
    """One Axis per axis a trace uses, its extent from the traces drawn on it (shared by matching axes)."""
    axes: dict[str, Axis] = {}
    for trace in data:
        for name in _axis_names(trace):
            if name not in axes:
                axes[name] = Axis(name, dict(layout.get(name[0] + "axis" + name[1:]) or {}))
    stacks: dict[tuple, list[float]] = {}
    for trace in data:
        xa, ya = _axis_names(trace)
        for axis, values in zip((axes[xa], axes[ya]), _extent(trace, stacks)):
            axis.take(values)
    for name, axis in axes.items():
        anchor = axis.spec.get("anchor")
        if anchor in axes or (anchor is None and len(name) == 1):
            other = axes.get(anchor or ("y" if name == "x" else "x"))
            if other is not None:
                axis.anchor_domain = other.domain
    groups: dict[str, list[Axis]] = {}
    for name, axis in axes.items():
        groups.setdefault(axis.spec.get("matches") or name, []).append(axis)
    for name, members in groups.items():
        if name in axes and axes[name] not in members:
            members.append(axes[name])
        for axis in members:
            for other in members:
                axis.join(other)
    for axis in axes.values():
        axis.settle()
    return axes


def _extent(trace: dict, stacks: dict) -> tuple[list, list]:
    """The x and y values a trace spans (bars from their base, stacked areas at their running sum)."""
    kind = trace.get("type", "scatter")
    x, y = list(trace.get("x") or ()), list(trace.get("y") or ())
    if kind == "bar":
        horizontal = trace.get("orientation") == "h"
        lengths = x if horizontal else y
        base = trace.get("base")
        bases = base if isinstance(base, list) else [base or 0] * len(lengths)
        ends = [b + v for b, v in zip(bases, lengths) if _num(v) and _num(b)] + [b for b in bases if _num(b)]
        return (ends, y) if horizontal else (x, ends)
    if kind == "heatmap":
        z = trace.get("z") or []
        return (x or list(range(len(z[0]) if z else 0)), y or list(range(len(z))))
    if trace.get("stackgroup"):
        key = (*_axis_names(trace), trace["stackgroup"])
        below = stacks.get(key, [0.0] * len(y))
        top = [b + (v if _num(v) else 0) for b, v in zip(below, y)]
        stacks[key] = top
        return x, top + [0.0]
    return x, y


# --- traces ---------------------------------------------------------------------------------------------------

def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _pick(value: Any, i: int, default: Any = None) -> Any:
    if isinstance(value, (list, tuple)):
        return value[i] if i < len(value) else default
    return default if value is None else value


def _bar_groups(data: list[dict], layout: dict) -> dict[int, tuple[int, int]]:
    """(slot, slots) of each vertical bar trace when barmode 'group' puts several side by side on one axis pair."""
    if layout.get("barmode", "group") != "group":
        return {}
    by_axes: dict[tuple, list[int]] = {}
    for i, trace in enumerate(data):
        if trace.get("type") == "bar" and trace.get("orientation") != "h":
            by_axes.setdefault(_axis_names(trace), []).append(i)
    return {i: (k, len(ids)) for ids in by_axes.values() for k, i in enumerate(ids)}


def _bars(trace: dict, x: Axis, y: Axis, layout: dict, slot: tuple[int, int]) -> list[str]:
    horizontal = trace.get("orientation") == "h"
    lengths, places = (trace.get("x"), trace.get("y")) if horizontal else (trace.get("y"), trace.get("x"))
    lengths, places = list(lengths or ()), list(places or ())
    marker = trace.get("marker") or {}
    line = marker.get("line") or {}
    full = 1 - float(layout.get("bargap", 0.2))
    out = []
    for i, (length, place) in enumerate(zip(lengths, places)):
        base = _pick(trace.get("base"), i, 0)
        if not (_num(length) and _num(base)):
            continue
        width = float(_pick(trace.get("width"), i, full / slot[1]))
        along, across = (x, y) if horizontal else (y, x)
        centre = across.value(place) + (slot[0] - (slot[1] - 1) / 2) * width
        a0, a1 = sorted((along.px(base), along.px(base + length)))
        c0, c1 = sorted((across.px(centre - width / 2), across.px(centre + width / 2)))
        rx, ry, rw, rh = (a0, c0, a1 - a0, c1 - c0) if horizontal else (c0, a0, c1 - c0, a1 - a0)
        fill = f'fill="{_attr(_pick(marker.get("color"), i, "#636efa"))}"'
        opacity = _pick(marker.get("opacity"), i, 1)
        fill += f' fill-opacity="{fmt(float(opacity), 3)}"' if _num(opacity) and opacity < 1 else ""
        stroke = (f' stroke="{_attr(_pick(line.get("color"), i, "none"))}" '
                  f'stroke-width="{fmt(float(_pick(line.get("width"), i, 0)))}"') if line else ""
        out.append(f'<rect x="{fmt(rx)}" y="{fmt(ry)}" width="{fmt(max(rw, 0.3))}" height="{fmt(rh)}" '
                   f'{fill}{stroke}/>')
        label = _pick(trace.get("text"), i)
        size = float((trace.get("textfont") or {}).get("size", 11))
        if label not in (None, "") and text_width(str(label), size) + 4 <= rw and size + 2 <= rh:
            out.append(_text(rx + rw / 2, ry + rh / 2 + size * 0.35, str(label), size=size, anchor="middle",
                             fill=(trace.get("textfont") or {}).get("color", "white")))
    return out


def _scatter(trace: dict, x: Axis, y: Axis, stacks: dict) -> list[str]:
    xs, ys = list(trace.get("x") or ()), list(trace.get("y") or ())
    mode = trace.get("mode") or ("lines+markers" if len(xs) < 20 else "lines")
    line = trace.get("line") or {}
    colour = line.get("color") or (trace.get("marker") or {}).get("color") or "#636efa"
    colour = colour if isinstance(colour, str) else "#636efa"
    out = []
    stepped = line.get("shape") == "hv"
    if trace.get("stackgroup"):
        key = (*_axis_names(trace), trace["stackgroup"])
        below = stacks.get(key, [0.0] * len(ys))
        top = [b + (v if _num(v) else 0) for b, v in zip(below, ys)]
        stacks[key] = top
        upper = _points(xs, top, x, y, stepped)
        lower = _points(xs, below, x, y, stepped)[::-1]
        out.append(f'<polygon points="{_pts(upper + lower)}" fill="{_attr(trace.get("fillcolor") or colour)}" '
                   f'fill-opacity="0.85" stroke="none"/>')
        ys = top
        mode = "lines"
    elif trace.get("fill") == "tozeroy":
        pts = _points(xs, ys, x, y, stepped)
        if pts:
            zero = y.px(0 if y.kind != "log" else 10 ** y.lo)
            out.append(f'<polygon points="{_pts([(pts[0][0], zero)] + pts + [(pts[-1][0], zero)])}" '
                       f'fill="{_attr(trace.get("fillcolor") or colour)}" fill-opacity="0.5" stroke="none"/>')
    if "lines" in mode:
        dash = {"dash": ' stroke-dasharray="6,4"', "dot": ' stroke-dasharray="2,3"'}.get(line.get("dash"), "")
        for run in _runs(xs, ys, x, y, stepped):
            out.append(f'<polyline points="{_pts(run)}" fill="none" stroke="{_attr(colour)}" '
                       f'stroke-width="{fmt(float(line.get("width", 2)))}"{dash}/>')
    if "markers" in mode:
        marker = trace.get("marker") or {}
        for i, (xv, yv) in enumerate(zip(xs, ys)):
            if not (x.ok(xv) and y.ok(yv)):
                continue
            px, py = x.px(x.value(xv)), y.px(y.value(yv))
            r = float(_pick(marker.get("size"), i, 6)) / 2
            fill = _pick(marker.get("color"), i, colour)
            fill = fill if isinstance(fill, str) else colour
            if str(_pick(marker.get("symbol"), i, "circle")).startswith("x"):
                out.append(f'<path d="M{fmt(px - r)},{fmt(py - r)}L{fmt(px + r)},{fmt(py + r)}M{fmt(px - r)},'
                           f'{fmt(py + r)}L{fmt(px + r)},{fmt(py - r)}" stroke="{_attr(fill)}" stroke-width="2"/>')
            else:
                out.append(f'<circle cx="{fmt(px)}" cy="{fmt(py)}" r="{fmt(r)}" fill="{_attr(fill)}"/>')
    return out


def _points(xs: list, ys: list, x: Axis, y: Axis, stepped: bool) -> list[tuple[float, float]]:
    pts: list[tuple[float, float]] = []
    for xv, yv in zip(xs, ys):
        if not (x.ok(xv) and y.ok(yv)):
            continue
        p = (x.px(x.value(xv)), y.px(y.value(yv)))
        if stepped and pts:
            pts.append((p[0], pts[-1][1]))
        pts.append(p)
    return pts


def _runs(xs: list, ys: list, x: Axis, y: Axis, stepped: bool) -> list[list[tuple[float, float]]]:
    """Lines break where a value is missing (plotly's connectgaps: false)."""
    runs: list[list] = [[]]
    for xv, yv in zip(xs, ys):
        if x.ok(xv) and y.ok(yv):
            runs[-1].append((xv, yv))
        elif runs[-1]:
            runs.append([])
    return [_points([a for a, _ in r], [b for _, b in r], x, y, stepped) for r in runs if len(r) > 1]


def _heatmap(trace: dict, x: Axis, y: Axis) -> list[str]:
    z = trace.get("z") or []
    flat = [v for row in z for v in row if _num(v)]
    lo, hi = (min(flat), max(flat)) if flat else (0.0, 1.0)
    lo, hi = trace.get("zmin", lo), trace.get("zmax", hi)
    scale = _colorscale(trace)
    xs = trace.get("x") or list(range(len(z[0]) if z else 0))
    ys = trace.get("y") or list(range(len(z)))
    out = []
    for r, row in enumerate(z):
        for c, v in enumerate(row):
            cx, cy = x.value(xs[c]), y.value(ys[r])
            x0, x1 = sorted((x.px(cx - 0.5), x.px(cx + 0.5)))
            y0, y1 = sorted((y.px(cy - 0.5), y.px(cy + 0.5)))
            fill = _colour_at(scale, (v - lo) / (hi - lo) if hi > lo else 0.5) if _num(v) else "#eeeeee"
            out.append(f'<rect x="{fmt(x0)}" y="{fmt(y0)}" width="{fmt(x1 - x0)}" height="{fmt(y1 - y0)}" '
                       f'fill="{fill}"/>')
            label = _pick(_pick(trace.get("text"), r), c)
            if label not in (None, ""):
                dark = _luma(fill) < 0.5
                out.append(_text((x0 + x1) / 2, (y0 + y1) / 2 + 4, str(label), size=12, anchor="middle",
                                 fill="white" if dark else "black"))
    return out


def _colorscale(trace: dict) -> list[tuple[float, str]]:
    scale = trace.get("colorscale")
    if not isinstance(scale, list) or not scale:
        scale = [[0, "#440154"], [0.5, "#21918c"], [1, "#fde725"]]     # viridis' ends and middle
    pairs = [(float(p), str(c)) for p, c in scale]
    if trace.get("reversescale"):
        pairs = [(1 - p, c) for p, c in reversed(pairs)]
    return pairs


def _rgb(colour: str) -> tuple[int, int, int]:
    c = colour.strip()
    if c.startswith("#") and len(c) == 7:
        return int(c[1:3], 16), int(c[3:5], 16), int(c[5:7], 16)
    m = re.match(r"rgba?\(([\d.]+),\s*([\d.]+),\s*([\d.]+)", c)
    return (int(float(m[1])), int(float(m[2])), int(float(m[3]))) if m else (128, 128, 128)


def _colour_at(scale: list[tuple[float, str]], t: float) -> str:
    t = min(1.0, max(0.0, t))
    for (p0, c0), (p1, c1) in zip(scale, scale[1:]):
        if t <= p1:
            f = (t - p0) / (p1 - p0) if p1 > p0 else 0.0
            a, b = _rgb(c0), _rgb(c1)
            return "#" + "".join(f"{round(u + (v - u) * f):02x}" for u, v in zip(a, b))
    return "#" + "".join(f"{u:02x}" for u in _rgb(scale[-1][1]))


def _luma(colour: str) -> float:
    r, g, b = _rgb(colour)
    return (0.299 * r + 0.587 * g + 0.114 * b) / 255


def _label(value: float) -> str:
    """A colour bar's end value: whole numbers with thousands separators from 1,000 up, else 4 digits."""
    return f"{value:,.0f}" if abs(value) >= 1000 else fmt(value, 4)


def _colorbar(trace: dict, box: tuple, width: float) -> list[str]:
    z = [v for row in trace.get("z") or [] for v in row if _num(v)]
    if not z:
        return []
    scale = _colorscale(trace)
    x0, top, bottom = min(box[1] + 12, width - 60), box[2], box[3]
    out = ['<linearGradient id="cb" x1="0" y1="1" x2="0" y2="0">']
    out += [f'<stop offset="{fmt(p)}" stop-color="{_colour_at(scale, p)}"/>' for p, _ in scale]
    out.append("</linearGradient>")
    out.append(f'<rect x="{fmt(x0)}" y="{fmt(top)}" width="14" height="{fmt(bottom - top)}" fill="url(#cb)"/>')
    title = ((trace.get("colorbar") or {}).get("title") or {}).get("text", "")
    out.append(_text(x0, top - 6, title, size=11))
    out.append(_text(x0 + 18, top + 10, _label(max(z)), size=11))
    out.append(_text(x0 + 18, bottom, _label(min(z)), size=11))
    return out


# --- frame: grids, labels, shapes, annotations, title, legend -----------------------------------------------------

def _grids(axes: dict[str, Axis], ticks: dict) -> list[str]:
    out = []
    for name, axis in axes.items():
        if not axis.spec.get("showgrid", axis.kind != "category"):
            continue
        o0, o1 = axis.cross_span()
        for value, _ in ticks[name]:
            p = axis.px(value)
            if name.startswith("x"):
                out.append(f'<line x1="{fmt(p)}" y1="{fmt(o0)}" x2="{fmt(p)}" y2="{fmt(o1)}" stroke="{GRID}"/>')
            else:
                out.append(f'<line x1="{fmt(o0)}" y1="{fmt(p)}" x2="{fmt(o1)}" y2="{fmt(p)}" stroke="{GRID}"/>')
    return out


def _axis_labels(axes: dict[str, Axis], ticks: dict) -> list[str]:
    out = []
    for name, axis in axes.items():
        o0, o1 = axis.cross_span()
        show = axis.spec.get("showticklabels", True)
        if name.startswith("x"):
            base = max(o0, o1)
            out.append(f'<line x1="{fmt(axis.px_span()[0])}" y1="{fmt(base)}" x2="{fmt(axis.px_span()[1])}" '
                       f'y2="{fmt(base)}" stroke="#888"/>')
            if show:
                out += [_text(axis.px(v), base + 16, t, anchor="middle") for v, t in ticks[name]]
            if axis.title:
                mid = sum(axis.px_span()) / 2
                out.append(_text(mid, base + (34 if show else 18), axis.title, size=13, anchor="middle"))
        else:
            left = min(o0, o1)
            if show:
                out += [_text(left - 6, axis.px(v) + 4, t, anchor="end") for v, t in ticks[name]]
            if axis.title:
                room = max((text_width(t, 12) for _, t in ticks[name]), default=0) + 18 if show else 10
                mid = sum(axis.px_span()) / 2
                out.append(f'<text x="{fmt(left - room)}" y="{fmt(mid)}" font-size="13" fill="{INK}" '
                           f'text-anchor="middle" transform="rotate(-90 {fmt(left - room)} {fmt(mid)})">'
                           f'{_escape(axis.title)}</text>')
    return out


def _ref(ref: str, value: float, axes: dict[str, Axis], box: tuple, horizontal: bool) -> float | None:
    lo, hi = (box[0], box[1]) if horizontal else (box[3], box[2])
    if ref in ("paper", None, ""):
        return lo + float(value) * (hi - lo)
    name, _, domain = ref.partition(" ")
    axis = axes.get(name)
    if axis is None:
        return None
    if domain == "domain":
        a, b = axis.px_span()
        a, b = (a, b) if horizontal else (b, a)
        return a + float(value) * (b - a)
    return axis.px(axis.value(value))


def _shapes(layout: dict, axes: dict[str, Axis], box: tuple) -> list[str]:
    out = []
    for s in layout.get("shapes") or ():
        x0, x1 = (_ref(s.get("xref", "x"), s.get(k, 0), axes, box, True) for k in ("x0", "x1"))
        y0, y1 = (_ref(s.get("yref", "y"), s.get(k, 0), axes, box, False) for k in ("y0", "y1"))
        if None in (x0, x1, y0, y1):
            continue
        line = s.get("line") or {}
        stroke = f'stroke="{_attr(line.get("color", "#444"))}" stroke-width="{fmt(float(line.get("width", 1)))}"'
        if s.get("type") == "rect":
            out.append(f'<rect x="{fmt(min(x0, x1))}" y="{fmt(min(y0, y1))}" width="{fmt(abs(x1 - x0))}" '
                       f'height="{fmt(abs(y1 - y0))}" fill="{_attr(s.get("fillcolor", "none"))}" {stroke}/>')
        else:
            out.append(f'<line x1="{fmt(x0)}" y1="{fmt(y0)}" x2="{fmt(x1)}" y2="{fmt(y1)}" {stroke}/>')
    return out


def _annotations(layout: dict, axes: dict[str, Axis], box: tuple) -> list[str]:
    out = []
    for a in layout.get("annotations") or ():
        x = _ref(a.get("xref", "x"), a.get("x", 0.5), axes, box, True)
        y = _ref(a.get("yref", "y"), a.get("y", 0.5), axes, box, False)
        if x is None or y is None:
            continue
        size = float((a.get("font") or {}).get("size", 12))
        y += {"bottom": -4, "top": size}.get(a.get("yanchor"), size * 0.35)
        anchor = {"left": "start", "right": "end"}.get(a.get("xanchor"), "middle")
        out.append(_text(x, y, _plain(a.get("text", "")), size=size, anchor=anchor))
    return out


def _title(layout: dict, width: float) -> list[str]:
    title = layout.get("title") or {}
    text = title.get("text", "") if isinstance(title, dict) else str(title)
    if not text:
        return []
    x = float(title.get("x", 0.5)) if isinstance(title, dict) else 0.5
    anchor = "start" if x < 1 / 3 else "end" if x > 2 / 3 else "middle"
    lines = [_plain(part) for part in re.split(r"<br\s*/?>", text, flags=re.I)]
    out = [_text(x * width + (8 if anchor == "start" else 0), 28, lines[0], size=17, anchor=anchor)]
    out += [_text(x * width + (8 if anchor == "start" else 0), 28 + 17 * k, line, size=11, anchor=anchor,
                  fill="#555") for k, line in enumerate(lines[1:], start=1)]
    return out


def _legend_entries(data: list[dict]) -> list[tuple[str, str]]:
    """(name, colour) of each trace the legend lists, once per legend group."""
    shown = [t for t in data if t.get("type", "scatter") != "heatmap" and t.get("name")]
    if len(shown) < 2 and not any(t.get("showlegend") for t in shown):
        return []
    seen, out = set(), []
    for t in shown:
        if t.get("showlegend") is False:
            continue
        key = t.get("legendgroup") or t["name"]
        if key in seen:
            continue
        seen.add(key)
        colour = (t.get("marker") or {}).get("color") or (t.get("line") or {}).get("color") or t.get("fillcolor")
        out.append((_plain(t["name"]), colour if isinstance(colour, str) else "#636efa"))
    return out


def _legend_rows(entries: list[tuple[str, str]], room: float) -> int:
    rows, used = (1, 0.0) if entries else (0, 0.0)
    for name, _ in entries:
        w = text_width(name, 12) + 30
        if used and used + w > room:
            rows, used = rows + 1, 0.0
        used += w
    return rows


def _legend(entries: list[tuple[str, str]], box: tuple, width: float, margin: dict) -> list[str]:
    if not entries:
        return []
    out, x, row = ['<g class="legend">'], box[0], 0
    top = box[3] + margin["b"] - _legend_rows(entries, box[1] - box[0]) * LEGEND_ROW - 4
    for name, colour in entries:
        w = text_width(name, 12) + 30
        if x > box[0] and x + w > box[1]:
            x, row = box[0], row + 1
        y = top + row * LEGEND_ROW
        out.append(f'<rect x="{fmt(x)}" y="{fmt(y + 4)}" width="14" height="10" fill="{_attr(colour)}"/>')
        out.append(_text(x + 18, y + 13, name))
        x += w
    return out + ["</g>"]


# --- text -------------------------------------------------------------------------------------------------------

def _plain(text: Any) -> str:
    """Plotly's HTML-ish label text as plain text: tags dropped, entities read."""
    return html.unescape(re.sub(r"<[^>]+>", "", re.sub(r"<br\s*/?>", " ", str(text), flags=re.I)))


def _escape(text: str) -> str:
    return html.escape(text, quote=True)


def _attr(value: Any) -> str:
    return _escape(str(value))


def _text(x: float, y: float, text: str, size: float = 12, anchor: str = "start", fill: str = INK) -> str:
    return (f'<text x="{fmt(x)}" y="{fmt(y)}" font-size="{fmt(size)}" fill="{_attr(fill)}" '
            f'text-anchor="{anchor}">{_escape(str(text))}</text>')


def _pts(points: list[tuple[float, float]]) -> str:
    return " ".join(f"{fmt(a)},{fmt(b)}" for a, b in points)
