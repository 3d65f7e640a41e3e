"""Unit strings at the edges, SI floats inside.

Files say ``989 TFLOPS``, ``80 GiB``, ``3.35 TB/s``, ``400 Gb/s`` or ``5 us``;
the code only ever sees seconds, bytes, bytes/s and FLOP/s as floats. ``B`` is
a byte and ``b`` a bit: ``400 Gb/s`` is 50e9 bytes/s. Decimal prefixes are
powers of 1000 (``GB``), binary ones powers of 1024 (``GiB``).
"""

from __future__ import annotations

import math
import operator
import re

from simtrain.spec.errors import InputError

_DECIMAL = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18}
_BINARY = {"Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40, "Pi": 2.0**50}
_TIME = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ns": 1e-9, "min": 60.0, "h": 3600.0}

#: what each quantity kind accepts, shown in error messages
KINDS = {
    "bytes": "bytes, e.g. '80 GiB', '80 GB', '512 MB'",
    "bandwidth": "a bandwidth, e.g. '3.35 TB/s', '450 GB/s', '400 Gb/s' (bits)",
    "flops": "a compute rate, e.g. '989 TFLOPS' or '989 TFLOP/s'",
    "time": "a time, e.g. '2 us', '5 µs', '1.5 ms'",
    "power": "a power, e.g. '700 W' or '10.2 kW'",
    "number": "a plain number",
}

_NUMBER = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
_RE = re.compile(rf"^\s*({_NUMBER})\s*([^\s\d].*?)?\s*$")


def _prefix_scale(prefix: str) -> float | None:
    if prefix in _BINARY:
        return _BINARY[prefix]
    if prefix in _DECIMAL:
        return _DECIMAL[prefix]
    return None


def _unit_scale(unit: str, kind: str) -> float | None:
    """Multiplier from ``unit`` to the SI unit of ``kind``; None if not that kind."""
    if kind == "time":
        return _TIME.get(unit)
    if kind == "flops":
        m = re.fullmatch(r"([kKMGTPE]?)FLOP(?:S|s|/s)", unit)
        return _DECIMAL[m.group(1)] if m else None
    if kind == "power":
        m = re.fullmatch(r"([kKM]?)W", unit)
        return _DECIMAL[m.group(1)] if m else None
    if kind == "bytes":
        m = re.fullmatch(r"([kKMGTPE]i?|)(B|bytes?)", unit)
        if not m:
            return None
        return _prefix_scale(m.group(1))
    if kind == "bandwidth":
        m = re.fullmatch(r"([kKMGTPE]i?|)(B|b|bit|byte)(?:/s|ps)", unit)
        if not m:
            return None
        scale = _prefix_scale(m.group(1))
        if scale is None:
            return None
        return scale / 8.0 if m.group(2) in ("b", "bit") else scale
    return None


def parse_quantity(value: object, kind: str) -> float:
    """Parse ``value`` (a number or a unit string) as ``kind``, returning SI.

    A bare number is taken as already SI (bytes, seconds, FLOP/s, bytes/s): that is how Python callers
    pass quantities. Files must write the unit (``simtrain.spec.quantity`` refuses a bare non-zero number there).
    Infinite and NaN values are refused: no physical quantity in a file is either.
    Raises :class:`InputError` (without location; the caller adds it).
    """
    if kind not in KINDS:
        raise ValueError(f"unknown quantity kind {kind!r}")
    if isinstance(value, bool):
        raise InputError(f"{str(value).lower()} is a boolean, not {KINDS[kind]}")
    if not isinstance(value, (int, float, str)):
        shown = "a mapping" if isinstance(value, dict) else "a list" if isinstance(value, list) else repr(value)
        raise InputError(f"{shown} is not {KINDS[kind]}")
    if isinstance(value, str):
        m = _RE.match(value)
        if not m:
            raise InputError(f"'{value}' is not {KINDS[kind]}")
        number, unit = _finite(m.group(1), kind, value), (m.group(2) or "")
        scale = _unit_scale(unit, kind) if unit else 1.0
        if scale is None:
            other = next((k for k in KINDS if k not in (kind, "number") and _unit_scale(unit, k) is not None), None)
            if other:
                raise InputError(f"'{value}' is {KINDS[other].split(',')[0]} (unit '{unit}'), not {KINDS[kind]}")
            raise InputError(f"unknown unit '{unit}' in '{value}': expected {KINDS[kind]}")
        return _finite(number * scale, kind, value)
    return _finite(value, kind)


def is_number(value: object) -> bool:
    """An int or float, and not a bool (which Python counts as an int)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def has_unit(value: object) -> bool:
    """Whether a quantity as written names its unit: '450 GB/s' does; 450, '450' and '450e9' do not."""
    if not isinstance(value, str):
        return False
    m = _RE.match(value)
    return bool(m and m.group(2))


def _finite(number: object, kind: str, shown: object = None) -> float:
    """``float(number)``, refusing infinities, NaN and numbers beyond floating point."""
    try:
        out = float(number)
    except OverflowError:
        out = math.inf
    if not math.isfinite(out):
        text = repr(shown if shown is not None else number)
        text = text if len(text) <= 40 else text[:36] + "..."
        raise InputError(f"{text} is not a finite number" + (f" ({KINDS[kind]})" if kind != "number" else ""))
    return out


def format_bytes(n: float) -> str:
    """Human form in decimal GB/MB, as people read memory reports."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B"


def as_whole(value: object) -> int | None:
    """``value`` as an int when it is a whole-number type (int, numpy integers: what ``operator.index`` takes),
    else None; a boolean is never one."""
    if isinstance(value, bool):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def format_count(n: int, noun: str, plural: str | None = None) -> str:
    """'1 stage', '4 stages', '1 micro-batch', '16 micro-batches' (``plural`` where adding s is wrong)."""
    return f"{n:,} {noun if n == 1 else plural or noun + 's'}"


def format_time(seconds: float) -> str:
    if seconds == 0:
        return "0 s"
    if seconds >= 1.0:
        return f"{seconds:.3f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.1f} us"


def parse_count(value: object) -> float:
    """Token counts such as '1T', '300B', '2.5e12' -> float."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return _finite(value, "number")
    m = re.fullmatch(rf"\s*({_NUMBER})\s*([kKMBGT]?)\s*", str(value))
    if not m:
        raise InputError(f"'{value}' is not a count, e.g. '1T', '300B', '2e12'")
    scale = {"": 1, "k": 1e3, "K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12}[m.group(2)]
    return _finite(float(m.group(1)) * scale, "number", value)


def report_float(x: float | None) -> float | None:
    """Round to 9 significant digits: stable reports and tables across platforms' last-bit float noise."""
    if x is None:
        return None
    return float(f"{x:.9g}")
