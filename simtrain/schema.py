"""Closed, typed schemas: pydantic models that reject unknown keys, and the
translation of pydantic's errors into one located sentence.
"""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from simtrain.errors import InputError, suggest
from simtrain.yamlio import line_of

T = TypeVar("T", bound=BaseModel)


class Closed(BaseModel):
    """Base for every schema: unknown keys are errors, values are immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


def _field_names(model: type[BaseModel], loc: tuple) -> list[str]:
    """Valid keys at the level where an unknown key was found."""
    cls: Any = model
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        field = getattr(cls, "model_fields", {}).get(part)
        if field is None:
            return []
        ann = field.annotation
        for candidate in getattr(ann, "__args__", (ann,)):
            if isinstance(candidate, type) and issubclass(candidate, BaseModel):
                cls = candidate
                break
        else:
            return []
    return list(getattr(cls, "model_fields", {}))


def _describe(err: dict, model: type[BaseModel]) -> str:
    kind = err["type"]
    value = err.get("input")
    loc = err["loc"]
    if kind == "extra_forbidden":
        names = _field_names(model, loc)
        hint = suggest(str(loc[-1]), names)
        return f"unknown key{hint}" + (f"; allowed keys: {', '.join(names)}" if not hint and names else "")
    if kind == "missing":
        return "is required but missing"
    if kind == "literal_error":
        expected = err.get("ctx", {}).get("expected", "")
        options = [e.strip(" '") for e in expected.replace(" or ", ",").split(",")]
        return f"{value!r} is not allowed{suggest(str(value), options)} (allowed: {expected})"
    msg = err["msg"]
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
    if kind in ("value_error", "assertion_error"):
        return msg
    shown = repr(value) if not isinstance(value, (dict, list)) else type(value).__name__
    return f"{shown}: {msg[0].lower() + msg[1:]}"


def validate(model: type[T], data: Any, *, file: str | None, prefix: str = "", root: Any = None) -> T:
    """Build ``model`` from ``data`` or raise an InputError naming file, line and field."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        err = exc.errors(include_url=False)[0]
        loc = tuple(err["loc"])
        dotted = ".".join(str(p) for p in loc)
        field = f"{prefix}.{dotted}" if prefix and dotted else (prefix or dotted)
        line = line_of(root if root is not None else data, field) if field else getattr(data, "line", None)
        raise InputError(_describe(err, model), file=file, line=line, field=field or None) from None
    except InputError as err:
        raise err.located(file=file, line=getattr(data, "line", None)) from None
