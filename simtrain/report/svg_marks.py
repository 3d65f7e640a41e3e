"""The marks of the static SVG (report/svg.py): each trace kind simtrain's charts use drawn from its data, and the
text helpers. Pure functions of a trace and its axes."""

from __future__ import annotations

import html
import math
import re
from typing import Any

from simtrain.report.svg_axes import Axis, fmt, text_width

INK = "#2a3f5f"                 # plotly_white's text colour


def axis_names(trace: dict) -> tuple[str, str]:
    return "x" + str(trace.get("xaxis", "x"))[1:], "y" + str(trace.get("yaxis", "y"))[1:]



# --- traces ---------------------------------------------------------------------------------------------------

def num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def pick(value: Any, i: int, default: Any = None) -> Any:
    if isinstance(value, (list, tuple)):
        return value[i] if i < len(value) else default
    return default if value is None else value


def bar_groups(data: list[dict], layout: dict) -> dict[int, tuple[int, int]]:
    """(slot, slots) of each vertical bar trace when barmode 'group' puts several side by side on one axis pair."""
    if layout.get("barmode", "group") != "group":
        return {}
    by_axes: dict[tuple, list[int]] = {}
    for i, trace in enumerate(data):
        if trace.get("type") == "bar" and trace.get("orientation") != "h":
            by_axes.setdefault(axis_names(trace), []).append(i)
    return {i: (k, len(ids)) for ids in by_axes.values() for k, i in enumerate(ids)}


def bars(trace: dict, x: Axis, y: Axis, layout: dict, slot: tuple[int, int]) -> list[str]:
    horizontal = trace.get("orientation") == "h"
    lengths, places = (trace.get("x"), trace.get("y")) if horizontal else (trace.get("y"), trace.get("x"))
    lengths, places = list(lengths or ()), list(places or ())
    marker = trace.get("marker") or {}
    line = marker.get("line") or {}
    full = 1 - float(layout.get("bargap", 0.2))
    out = []
    for i, (length, place) in enumerate(zip(lengths, places)):
        base = pick(trace.get("base"), i, 0)
        if not (num(length) and num(base)):
            continue
        width = float(pick(trace.get("width"), i, full / slot[1]))
        along, across = (x, y) if horizontal else (y, x)
        centre = across.value(place) + (slot[0] - (slot[1] - 1) / 2) * width
        a0, a1 = sorted((along.px(base), along.px(base + length)))
        c0, c1 = sorted((across.px(centre - width / 2), across.px(centre + width / 2)))
        rx, ry, rw, rh = (a0, c0, a1 - a0, c1 - c0) if horizontal else (c0, a0, c1 - c0, a1 - a0)
        fill = f'fill="{attr(pick(marker.get("color"), i, "#636efa"))}"'
        opacity = pick(marker.get("opacity"), i, 1)
        fill += f' fill-opacity="{fmt(float(opacity), 3)}"' if num(opacity) and opacity < 1 else ""
        stroke = (f' stroke="{attr(pick(line.get("color"), i, "none"))}" '
                  f'stroke-width="{fmt(float(pick(line.get("width"), i, 0)))}"') if line else ""
        out.append(f'<rect x="{fmt(rx)}" y="{fmt(ry)}" width="{fmt(max(rw, 0.3))}" height="{fmt(rh)}" '
                   f'{fill}{stroke}/>')
        label = pick(trace.get("text"), i)
        size = float((trace.get("textfont") or {}).get("size", 11))
        if label not in (None, "") and text_width(str(label), size) + 4 <= rw and size + 2 <= rh:
            out.append(svg_text(rx + rw / 2, ry + rh / 2 + size * 0.35, str(label), size=size, anchor="middle",
                             fill=(trace.get("textfont") or {}).get("color", "white")))
    return out


def scatter(trace: dict, x: Axis, y: Axis, stacks: dict) -> list[str]:
    xs, ys = list(trace.get("x") or ()), list(trace.get("y") or ())
    mode = trace.get("mode") or ("lines+markers" if len(xs) < 20 else "lines")
    line = trace.get("line") or {}
    colour = line.get("color") or (trace.get("marker") or {}).get("color") or "#636efa"
    colour = colour if isinstance(colour, str) else "#636efa"
    out = []
    stepped = line.get("shape") == "hv"
    if trace.get("stackgroup"):
        key = (*axis_names(trace), trace["stackgroup"])
        below = stacks.get(key, [0.0] * len(ys))
        top = [b + (v if num(v) else 0) for b, v in zip(below, ys)]
        stacks[key] = top
        upper = _points(xs, top, x, y, stepped)
        lower = _points(xs, below, x, y, stepped)[::-1]
        out.append(f'<polygon points="{points_attr(upper + lower)}" fill="{attr(trace.get("fillcolor") or colour)}" '
                   f'fill-opacity="0.85" stroke="none"/>')
        ys = top
        mode = "lines"
    elif trace.get("fill") == "tozeroy":
        pts = _points(xs, ys, x, y, stepped)
        if pts:
            zero = y.px(0 if y.kind != "log" else 10 ** y.lo)
            out.append(f'<polygon points="{points_attr([(pts[0][0], zero)] + pts + [(pts[-1][0], zero)])}" '
                       f'fill="{attr(trace.get("fillcolor") or colour)}" fill-opacity="0.5" stroke="none"/>')
    if "lines" in mode:
        dash = {"dash": ' stroke-dasharray="6,4"', "dot": ' stroke-dasharray="2,3"'}.get(line.get("dash"), "")
        for run in _runs(xs, ys, x, y, stepped):
            out.append(f'<polyline points="{points_attr(run)}" fill="none" stroke="{attr(colour)}" '
                       f'stroke-width="{fmt(float(line.get("width", 2)))}"{dash}/>')
    if "markers" in mode:
        marker = trace.get("marker") or {}
        for i, (xv, yv) in enumerate(zip(xs, ys)):
            if not (x.ok(xv) and y.ok(yv)):
                continue
            px, py = x.px(x.value(xv)), y.px(y.value(yv))
            r = float(pick(marker.get("size"), i, 6)) / 2
            fill = pick(marker.get("color"), i, colour)
            fill = fill if isinstance(fill, str) else colour
            if str(pick(marker.get("symbol"), i, "circle")).startswith("x"):
                out.append(f'<path d="M{fmt(px - r)},{fmt(py - r)}L{fmt(px + r)},{fmt(py + r)}M{fmt(px - r)},'
                           f'{fmt(py + r)}L{fmt(px + r)},{fmt(py - r)}" stroke="{attr(fill)}" stroke-width="2"/>')
            else:
                out.append(f'<circle cx="{fmt(px)}" cy="{fmt(py)}" r="{fmt(r)}" fill="{attr(fill)}"/>')
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


def heatmap(trace: dict, x: Axis, y: Axis) -> list[str]:
    z = trace.get("z") or []
    flat = [v for row in z for v in row if num(v)]
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
            fill = _colour_at(scale, (v - lo) / (hi - lo) if hi > lo else 0.5) if num(v) else "#eeeeee"
            out.append(f'<rect x="{fmt(x0)}" y="{fmt(y0)}" width="{fmt(x1 - x0)}" height="{fmt(y1 - y0)}" '
                       f'fill="{fill}"/>')
            label = pick(pick(trace.get("text"), r), c)
            if label not in (None, ""):
                dark = _luma(fill) < 0.5
                out.append(svg_text((x0 + x1) / 2, (y0 + y1) / 2 + 4, str(label), size=12, anchor="middle",
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


def colorbar(trace: dict, box: tuple, width: float) -> list[str]:
    z = [v for row in trace.get("z") or [] for v in row if num(v)]
    if not z:
        return []
    scale = _colorscale(trace)
    x0, top, bottom = min(box[1] + 12, width - 60), box[2], box[3]
    out = ['<linearGradient id="cb" x1="0" y1="1" x2="0" y2="0">']
    out += [f'<stop offset="{fmt(p)}" stop-color="{_colour_at(scale, p)}"/>' for p, _ in scale]
    out.append("</linearGradient>")
    out.append(f'<rect x="{fmt(x0)}" y="{fmt(top)}" width="14" height="{fmt(bottom - top)}" fill="url(#cb)"/>')
    title = ((trace.get("colorbar") or {}).get("title") or {}).get("text", "")
    out.append(svg_text(x0, top - 6, title, size=11))
    out.append(svg_text(x0 + 18, top + 10, _label(max(z)), size=11))
    out.append(svg_text(x0 + 18, bottom, _label(min(z)), size=11))
    return out


# --- text -------------------------------------------------------------------------------------------------------

def plain(text: Any) -> str:
    """Plotly's HTML-ish label text as plain text: tags dropped, entities read."""
    return html.unescape(re.sub(r"<[^>]+>", "", re.sub(r"<br\s*/?>", " ", str(text), flags=re.I)))


def escape(text: str) -> str:
    return html.escape(text, quote=True)


def attr(value: Any) -> str:
    return escape(str(value))


def svg_text(x: float, y: float, text: str, size: float = 12, anchor: str = "start", fill: str = INK) -> str:
    return (f'<text x="{fmt(x)}" y="{fmt(y)}" font-size="{fmt(size)}" fill="{attr(fill)}" '
            f'text-anchor="{anchor}">{escape(str(text))}</text>')


def points_attr(points: list[tuple[float, float]]) -> str:
    return " ".join(f"{fmt(a)},{fmt(b)}" for a, b in points)
