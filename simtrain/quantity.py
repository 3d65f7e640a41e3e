"""Pydantic field types for physical quantities.

In a file a quantity is a number, a unit string (``80 GiB``) or a mapping
``{value: 80 GiB, source: "datasheet ..."}``; in code it is an SI float.
"""

from __future__ import annotations

from functools import partial
from typing import Annotated

from pydantic import AfterValidator, BeforeValidator

from simtrain.errors import InputError
from simtrain.units import parse_quantity


def _parse(kind: str, value: object) -> float:
    if isinstance(value, dict):
        unknown = set(value) - {"value", "source", "note"}
        if unknown:
            raise ValueError(f"unknown key '{sorted(unknown)[0]}' in a quantity (allowed: value, source, note)")
        if "value" not in value:
            raise ValueError("a quantity mapping needs 'value' (and should carry 'source')")
        value = value["value"]
    try:
        return parse_quantity(value, kind)
    except InputError as err:
        raise ValueError(err.message) from None


def _positive(x: float) -> float:
    if not x > 0:
        raise ValueError(f"{x:g} must be greater than zero")
    return x


def _non_negative(x: float) -> float:
    if x < 0:
        raise ValueError(f"{x:g} must not be negative")
    return x


def _fraction(x: float) -> float:
    if not 0 < x <= 1:
        raise ValueError(f"{x:g} must be a fraction in (0, 1]")
    return x


Bytes = Annotated[float, BeforeValidator(partial(_parse, "bytes")), AfterValidator(_positive)]
BytesOrZero = Annotated[float, BeforeValidator(partial(_parse, "bytes")), AfterValidator(_non_negative)]
Bandwidth = Annotated[float, BeforeValidator(partial(_parse, "bandwidth")), AfterValidator(_positive)]
Flops = Annotated[float, BeforeValidator(partial(_parse, "flops")), AfterValidator(_positive)]
Seconds = Annotated[float, BeforeValidator(partial(_parse, "time")), AfterValidator(_non_negative)]
Watts = Annotated[float, BeforeValidator(partial(_parse, "power")), AfterValidator(_positive)]
Fraction = Annotated[float, BeforeValidator(partial(_parse, "number")), AfterValidator(_fraction)]
Number = Annotated[float, BeforeValidator(partial(_parse, "number")), AfterValidator(_non_negative)]
PositiveNumber = Annotated[float, BeforeValidator(partial(_parse, "number")), AfterValidator(_positive)]
