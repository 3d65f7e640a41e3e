"""Static SVG of simtrain's plotly figures, for where no JavaScript runs: GitHub's notebook view, a README, an
nbconvert export without plotly.js.

It draws what simtrain's charts use, from the figure's own data: bars (horizontal on a base, as the Gantt draws
them, or vertical by category), scatter lines, markers and stacked areas, heatmaps, subplots, linear, log and
category axes, titles, annotations, line shapes and a legend. Hover text, patterns and interaction are left out; a
trace of another type is named in a note on the image rather than guessed. Pure: a figure dict in, text out, the
same text for the same figure.
"""

from __future__ import annotations

import base64
import re
import struct
from typing import Any

from simtrain.report.chart_args import need_figure
from simtrain.report.svg_axes import Axis, fmt, text_width
from simtrain.report.svg_marks import (
    INK,
    attr,
    axis_names,
    bar_groups,
    bars,
    colorbar,
    escape,
    heatmap,
    num,
    plain,
    scatter,
    svg_text,
)

__all__ = ["figure_svg"]

FONT = "font-family=\"Helvetica,Arial,sans-serif\""
GRID = "#e5e5e5"
LEGEND_ROW = 20                 # px per legend row under the plot


def figure_svg(fig: Any) -> str:
    """The SVG text of a plotly Figure (or its ``to_dict()``)."""
    need_figure("figure_svg", fig)
    d = _lists(fig.to_dict() if hasattr(fig, "to_dict") else fig)
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
        xa, ya = axis_names(trace)
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
    bar_traces = bar_groups(data, layout)
    for i, trace in enumerate(data):
        kind = trace.get("type", "scatter")
        xa, ya = axis_names(trace)
        if xa not in axes or ya not in axes:
            continue
        x, y = axes[xa], axes[ya]
        body: list[str] = []
        if kind == "bar":
            body = bars(trace, x, y, layout, bar_traces.get(i, (0, 1)))
        elif kind == "scatter":
            body = scatter(trace, x, y, stacks)
        elif kind == "heatmap":
            body = heatmap(trace, x, y)
            out += colorbar(trace, box, width)
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
        out.append(svg_text(box[0], height - 6 - 14 * j, note, size=11, fill="#a00"))
    out.append("</svg>")
    return "\n".join(out) + "\n"


#: plotly's typed-array dtypes (how ``to_dict`` stores numpy arrays since plotly 6) -> struct format characters
_DTYPES = {"i1": "b", "u1": "B", "i2": "h", "u2": "H", "i4": "i", "u4": "I", "i8": "q", "u8": "Q", "f4": "f",
           "f8": "d"}


def _lists(value: Any) -> Any:
    """The figure dict with every typed array ({"dtype", "bdata", "shape"}: little-endian bytes in base64), numpy
    array and tuple as a plain list (rows of lists for a 2-D shape)."""
    if isinstance(value, dict):
        if "bdata" in value and value.get("dtype") in _DTYPES:
            raw = base64.b64decode(value["bdata"])
            code = _DTYPES[value["dtype"]]
            flat = list(struct.unpack(f"<{len(raw) // struct.calcsize(code)}{code}", raw))
            shape = [int(n) for n in str(value.get("shape", len(flat))).split(",") if n.strip()]
            if len(shape) == 2:
                return [flat[r * shape[1]:(r + 1) * shape[1]] for r in range(shape[0])]
            return flat
        return {k: _lists(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_lists(v) for v in value]
    if hasattr(value, "tolist"):            # a numpy array or scalar plotly left as it is (a bar's base)
        return _lists(value.tolist())
    return value


# --- axes -------------------------------------------------------------------------------------------------------

def _axes(data: list[dict], layout: dict) -> dict[str, Axis]:
    """One Axis per axis a trace uses, its extent from the traces drawn on it (shared by matching axes)."""
    axes: dict[str, Axis] = {}
    for trace in data:
        for name in axis_names(trace):
            if name not in axes:
                axes[name] = Axis(name, dict(layout.get(name[0] + "axis" + name[1:]) or {}))
    stacks: dict[tuple, list[float]] = {}
    for trace in data:
        xa, ya = axis_names(trace)
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
        ends = [b + v for b, v in zip(bases, lengths) if num(v) and num(b)] + [b for b in bases if num(b)]
        return (ends, y) if horizontal else (x, ends)
    if kind == "heatmap":
        z = trace.get("z") or []
        return (x or list(range(len(z[0]) if z else 0)), y or list(range(len(z))))
    if trace.get("stackgroup"):
        key = (*axis_names(trace), trace["stackgroup"])
        below = stacks.get(key, [0.0] * len(y))
        top = [b + (v if num(v) else 0) for b, v in zip(below, y)]
        stacks[key] = top
        return x, top + [0.0]
    return x, y


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
                out += [svg_text(axis.px(v), base + 16, t, anchor="middle") for v, t in ticks[name]]
            if axis.title:
                mid = sum(axis.px_span()) / 2
                out.append(svg_text(mid, base + (34 if show else 18), axis.title, size=13, anchor="middle"))
        else:
            left = min(o0, o1)
            if show:
                out += [svg_text(left - 6, axis.px(v) + 4, t, anchor="end") for v, t in ticks[name]]
            if axis.title:
                room = max((text_width(t, 12) for _, t in ticks[name]), default=0) + 18 if show else 10
                mid = sum(axis.px_span()) / 2
                out.append(f'<text x="{fmt(left - room)}" y="{fmt(mid)}" font-size="13" fill="{INK}" '
                           f'text-anchor="middle" transform="rotate(-90 {fmt(left - room)} {fmt(mid)})">'
                           f'{escape(axis.title)}</text>')
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
        stroke = f'stroke="{attr(line.get("color", "#444"))}" stroke-width="{fmt(float(line.get("width", 1)))}"'
        if s.get("type") == "rect":
            out.append(f'<rect x="{fmt(min(x0, x1))}" y="{fmt(min(y0, y1))}" width="{fmt(abs(x1 - x0))}" '
                       f'height="{fmt(abs(y1 - y0))}" fill="{attr(s.get("fillcolor", "none"))}" {stroke}/>')
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
        out.append(svg_text(x, y, plain(a.get("text", "")), size=size, anchor=anchor))
    return out


def _title(layout: dict, width: float) -> list[str]:
    title = layout.get("title") or {}
    text = title.get("text", "") if isinstance(title, dict) else str(title)
    if not text:
        return []
    x = float(title.get("x", 0.5)) if isinstance(title, dict) else 0.5
    anchor = "start" if x < 1 / 3 else "end" if x > 2 / 3 else "middle"
    lines = [plain(part) for part in re.split(r"<br\s*/?>", text, flags=re.I)]
    out = [svg_text(x * width + (8 if anchor == "start" else 0), 28, lines[0], size=17, anchor=anchor)]
    out += [svg_text(x * width + (8 if anchor == "start" else 0), 28 + 17 * k, line, size=11, anchor=anchor,
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
        out.append((plain(t["name"]), colour if isinstance(colour, str) else "#636efa"))
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
        out.append(f'<rect x="{fmt(x)}" y="{fmt(y + 4)}" width="14" height="10" fill="{attr(colour)}"/>')
        out.append(svg_text(x + 18, y + 13, name))
        x += w
    return out + ["</g>"]
