"""Pydantic field types for physical quantities.

In a file a quantity is a unit string (``80 GiB``) or a mapping
``{value: 80 GiB, source: "datasheet ..."}``; a bare number there is refused unless it is 0 (``450`` for a
bandwidth is a typo for ``450 GB/s``, not 450 B/s). In code it is an SI float, and Python callers pass one.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BeforeValidator, ValidationInfo

from simtrain.spec.bounds import quantity_problem
from simtrain.spec.errors import InputError
from simtrain.spec.units import KINDS, has_unit, parse_quantity


def _number(value: object) -> object:
    """The number inside a ``{value: ..., source: ...}`` mapping, or the value itself."""
    if isinstance(value, dict):
        unknown = set(value) - {"value", "source", "note"}
        if unknown:
            raise ValueError(f"unknown key '{sorted(unknown)[0]}' in a quantity (allowed: value, source, note)")
        if "value" not in value:
            raise ValueError("a quantity mapping needs 'value' (and should carry 'source')")
        return value["value"]
    return value


def _shown(raw: object, x: float) -> str:
    """The value as the file wrote it ('-25 MB'), else as a number."""
    return raw.strip() if isinstance(raw, str) else f"{x:g}"


def _positive(x: float, raw: object) -> None:
    if not x > 0:
        raise ValueError(f"{_shown(raw, x)} must be greater than zero")


def _non_negative(x: float, raw: object) -> None:
    if x < 0:
        raise ValueError(f"{_shown(raw, x)} must not be negative")


def _fraction(x: float, raw: object) -> None:
    if not 0 < x <= 1:
        raise ValueError(f"{_shown(raw, x)} must be a fraction in (0, 1]")


def _quantity(kind: str, check, value: object, info: ValidationInfo, bounds: str | None = None) -> float:
    raw = _number(value)
    try:
        x = parse_quantity(raw, kind)
    except InputError as err:
        raise ValueError(err.message) from None
    if from_file(info) and kind != "number" and x != 0 and not has_unit(raw):
        example = KINDS[kind].split(", e.g. ")
        raise ValueError(f"{raw!r} has no unit: write {example[0]} with one, "
                         f"e.g. {example[1].split(' or ')[0].split(', ')[0]}")
    check(x, raw)
    problem = quantity_problem(bounds or kind, x)     # the range of simtrain.spec.bounds, for every caller
    if problem:
        raise ValueError(problem)
    return x


def from_file(info: ValidationInfo | None) -> bool:
    """True while validating what a file (or an override of it) says: there a physical quantity needs its unit;
    Python callers pass SI floats."""
    return bool(info is not None and info.context and info.context.get("file"))


class QuantityMark:
    """Marks a quantity type's annotation: its range is checked where it is parsed (simtrain.spec.bounds), so the
    schemas' check of plain numbers leaves it alone."""

    def __init__(self, kind: str) -> None:
        self.kind = kind


def _q(kind: str, check, bounds: str | None = None) -> BeforeValidator:
    def validator(value: object, info: ValidationInfo) -> float:
        return _quantity(kind, check, value, info, bounds)

    return BeforeValidator(validator)


Bytes = Annotated[float, _q("bytes", _positive), QuantityMark("bytes")]
BytesOrZero = Annotated[float, _q("bytes", _non_negative), QuantityMark("bytes")]
Bandwidth = Annotated[float, _q("bandwidth", _positive), QuantityMark("bandwidth")]
Flops = Annotated[float, _q("flops", _positive), QuantityMark("flops")]
Seconds = Annotated[float, _q("time", _non_negative), QuantityMark("time")]
Watts = Annotated[float, _q("power", _positive), QuantityMark("power")]
Fraction = Annotated[float, _q("number", _fraction, "fraction"), QuantityMark("fraction")]
Number = Annotated[float, _q("number", _non_negative), QuantityMark("number")]
PositiveNumber = Annotated[float, _q("number", _positive), QuantityMark("number")]
