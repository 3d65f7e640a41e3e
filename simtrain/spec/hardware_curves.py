"""Measured curves and counts in hardware files, as pydantic types: a value bare or as ``{value: ..., source: ...}``,
checked point by point (a GEMM efficiency curve, a kernel's speed by head width, a whole number), and the linear
interpolation the head-width curves are read with. The error messages name the offending value."""

from __future__ import annotations

import math
from typing import Annotated

from pydantic import BeforeValidator, PositiveInt

from simtrain.spec.units import is_number


def _pairs(value: object, kind: str, names: tuple[str, str], valid, rule: str) -> tuple[tuple[float, float], ...]:
    """[[x, y], ...] (or {value: [...], source: ...}) with x increasing and each pair ``valid``; ``kind`` and
    ``names`` word the error, ``rule`` says what ``valid`` allows."""
    if isinstance(value, dict):
        value = value.get("value")
    pair = f"[{names[0]}, {names[1]}]"
    if not isinstance(value, list) or len(value) < 2:
        raise ValueError(f"a {kind} is a list of at least two {pair} pairs, not {value!r}")
    points = []
    for item in value:
        if not (isinstance(item, list) and len(item) == 2 and all(is_number(x) for x in item)):
            raise ValueError(f"{kind} point {item!r} is not a {pair} pair")
        x, y = float(item[0]), float(item[1])
        if not valid(x, y):
            raise ValueError(f"{kind} point {item!r}: {rule}")
        points.append((x, y))
    for a, b in zip(points, points[1:]):
        if b[0] <= a[0]:
            raise ValueError(f"{kind} {names[0]}s must increase: {b[0]:g} follows {a[0]:g}")
    return tuple(points)


def _curve(value: object) -> tuple[tuple[float, float], ...]:
    """A measured curve: [[size, fraction of peak], ...] (or {value: [...], source: ...}), sizes increasing."""
    return _pairs(value, "curve", ("size", "fraction"), lambda x, y: x > 0 and 0 < y <= 1,
                  "size must be > 0 and fraction in (0, 1]")


Curve = Annotated[tuple[tuple[float, float], ...], BeforeValidator(_curve)]


def _width_curve(value: object) -> tuple[tuple[float, float], ...]:
    """A kernel's relative speed by head width: [[head width, speed relative to the reference width], ...] (or
    {value: [...], source: ...}), widths increasing; a speed may exceed 1 (a kernel can be faster at a wider head)."""
    return _pairs(value, "head-width curve", ("head width", "relative speed"),
                  lambda x, y: 0 < x < math.inf and 0 < y < math.inf,
                  "the head width and the relative speed must be finite numbers > 0")


WidthCurve = Annotated[tuple[tuple[float, float], ...], BeforeValidator(_width_curve)]


def interpolate_linear(curve: tuple[tuple[float, float], ...], x: float) -> float:
    """Piecewise-linear in x through a curve's points, flat beyond the ends."""
    if x <= curve[0][0]:
        return curve[0][1]
    for (x0, y0), (x1, y1) in zip(curve, curve[1:]):
        if x <= x1:
            return y0 + (x - x0) / (x1 - x0) * (y1 - y0)
    return curve[-1][1]


def _count(value: object) -> object:
    """A whole number, bare or as ``{value: ..., source: ...}``."""
    if isinstance(value, dict) and "value" in value and set(value) <= {"value", "source", "note"}:
        return value["value"]
    return value


Count = Annotated[PositiveInt, BeforeValidator(_count)]
