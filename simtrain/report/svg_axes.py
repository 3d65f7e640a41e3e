"""Axes for the static SVG (report/svg.py): from data values to pixels, and the ticks to label them.

An axis is linear, log (base 10) or category, as plotly reads the figure: its layout ``type`` if given, else
category when its values are text. Its range is the layout's (plotly's units: log10 for a log axis, the category
index for a category axis), else the data's extent padded by 5% of it, or from zero for bars and ``rangemode:
tozero``. Axes that ``match`` share one range, as plotly's shared axes do.
"""

from __future__ import annotations

import math
from typing import Any

PAD = 0.05          # of the data span on each side of an autoranged axis, close to plotly's look


def fmt(value: float, sig: int | None = None) -> str:
    """A coordinate to 2 decimals (``sig`` None), or a number to ``sig`` significant digits; no '-0'."""
    text = f"{value:.{sig}g}" if sig else f"{value:.2f}".rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


def text_width(text: str, size: float) -> float:
    """About how wide a line of Helvetica is, in px: 0.56 em a character (its mean advance over digits and
    lower-case letters)."""
    return 0.56 * size * len(text)


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


class Axis:
    """One axis of a figure: its kind, range and place on the canvas."""

    def __init__(self, name: str, spec: dict) -> None:
        self.name, self.spec = name, spec
        title = spec.get("title") or {}
        self.title = str(title.get("text", "") if isinstance(title, dict) else title)
        self.domain = tuple(spec.get("domain") or (0.0, 1.0))
        self.anchor_domain: tuple = (0.0, 1.0)
        self.kind = spec.get("type") if spec.get("type") in ("linear", "log", "category") else None
        self.categories: list[str] = []
        self.values: list[float] = []
        self.lo, self.hi = 0.0, 1.0
        self.p0, self.p1 = 0.0, 1.0            # pixels of lo and hi
        self.c0, self.c1 = 0.0, 1.0            # pixels of the crossing axis' domain

    @property
    def domain_x0(self) -> float:
        """Where on the canvas (0-1) this y axis' plot starts: 0 for the left-most column."""
        return float(self.anchor_domain[0])

    def take(self, values: list) -> None:
        """Widen the axis to hold ``values`` (numbers, or text for a category axis)."""
        for v in values:
            if isinstance(v, str) or self.kind == "category":
                if self.kind is None:
                    self.kind = "category"
                label = str(v)
                if label not in self.categories:
                    self.categories.append(label)
            elif _number(v):
                self.values.append(float(v))

    def join(self, other: Axis) -> None:
        """Share ``other``'s data (matching axes show one range)."""
        if other is self:
            return
        for c in other.categories:
            if c not in self.categories:
                self.categories.append(c)
        self.values = self.values + [v for v in other.values if v not in self.values]
        self.kind = self.kind or other.kind

    def settle(self) -> None:
        """Fix the range: the layout's, else the data's extent with padding."""
        self.kind = self.kind or "linear"
        given = self.spec.get("range")
        if isinstance(given, (list, tuple)) and len(given) == 2 and all(_number(v) for v in given):
            self.lo, self.hi = float(given[0]), float(given[1])
            return
        if self.kind == "category":
            self.lo, self.hi = -0.5, max(len(self.categories), 1) - 0.5
            return
        values = [math.log10(v) for v in self.values if v > 0] if self.kind == "log" else list(self.values)
        if self.kind == "linear" and self.spec.get("rangemode") == "tozero":
            values.append(0.0)
        if not values:
            self.lo, self.hi = (0.0, 1.0)
            return
        lo, hi = min(values), max(values)
        if hi == lo:
            lo, hi = lo - (abs(lo) * 0.1 or 1), hi + (abs(hi) * 0.1 or 1)
        pad = PAD * (hi - lo)
        self.lo = lo if (self.kind == "linear" and lo == 0 and min(values) >= 0) else lo - pad
        self.hi = hi + pad

    def place(self, box: tuple[float, float, float, float]) -> None:
        """Put the axis on the plot box (left, right, top, bottom px) at its domain."""
        left, right, top, bottom = box
        if self.name.startswith("x"):
            self.p0, self.p1 = left + self.domain[0] * (right - left), left + self.domain[1] * (right - left)
            self.c0, self.c1 = (bottom - self.anchor_domain[0] * (bottom - top),
                                bottom - self.anchor_domain[1] * (bottom - top))
        else:
            self.p0, self.p1 = bottom - self.domain[0] * (bottom - top), bottom - self.domain[1] * (bottom - top)
            self.c0, self.c1 = (left + self.anchor_domain[0] * (right - left),
                                left + self.anchor_domain[1] * (right - left))

    def value(self, v: Any) -> float:
        """A data value in the axis' own numbers: the category's index, or the number itself."""
        if self.kind == "category":
            label = str(v) if not _number(v) or str(v) in self.categories else None
            return float(self.categories.index(label)) if label is not None else float(v)
        return float(v)

    def ok(self, v: Any) -> bool:
        """Whether ``v`` can be drawn on this axis (a number, positive on a log axis; any category)."""
        if self.kind == "category":
            return v is not None
        return _number(v) and (self.kind != "log" or v > 0)

    def px(self, v: float) -> float:
        """Pixel of an axis number (raw data value on a log axis; non-positive values land at its low end)."""
        u = (math.log10(v) if v > 0 else self.lo) if self.kind == "log" else v
        return self.p0 + (u - self.lo) / (self.hi - self.lo) * (self.p1 - self.p0)

    def px_span(self) -> tuple[float, float]:
        return (self.p0, self.p1) if self.name.startswith("x") else (max(self.p0, self.p1), min(self.p0, self.p1))

    def cross_span(self) -> tuple[float, float]:
        return self.c0, self.c1

    def ticks(self, wanted: int) -> list[tuple[float, str]]:
        """(axis number to pass to px, label) of each tick: the layout's tickvals/ticktext, each category, the
        decades of a log axis, or 1-2-5 steps of a linear one."""
        vals, texts = self.spec.get("tickvals"), self.spec.get("ticktext")
        if isinstance(vals, list) and vals:
            labels = texts if isinstance(texts, list) and len(texts) == len(vals) else [str(v) for v in vals]
            return [(float(v), str(t)) for v, t in zip(vals, labels) if _number(v)]
        lo, hi = sorted((self.lo, self.hi))
        if self.kind == "category":
            return [(float(i), c) for i, c in enumerate(self.categories) if lo <= i <= hi]
        if self.kind == "log":
            return [(10.0 ** k, fmt(10.0 ** k, 6)) for k in range(math.ceil(lo), math.floor(hi) + 1)] or \
                [(10.0 ** lo, fmt(10.0 ** lo, 3)), (10.0 ** hi, fmt(10.0 ** hi, 3))]
        return nice_ticks(lo, hi, wanted)


def nice_ticks(lo: float, hi: float, wanted: int) -> list[tuple[float, str]]:
    """Ticks at multiples of 1, 2 or 5 × 10^k, about ``wanted`` of them between lo and hi, labelled with the step's
    decimals and thousands separators."""
    if hi <= lo:
        return [(lo, fmt(lo, 6))]
    raw = (hi - lo) / max(wanted, 1)
    power = 10.0 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    decimals = max(0, -math.floor(math.log10(step) + 1e-9))
    first = math.ceil(lo / step - 1e-9)
    out = []
    k = first
    while k * step <= hi + 1e-9 * step:
        v = round(k * step, decimals + 1)
        out.append((v, f"{v:,.{decimals}f}".replace("-0", "0") if v == 0 else f"{v:,.{decimals}f}"))
        k += 1
    return out
