"""Closed, typed schemas: pydantic models that reject unknown keys, and the
translation of pydantic's errors into one located sentence.

Pydantic reports every problem it finds; a person needs the one that explains
the rest. A misspelt key comes first (``trainig:`` also makes ``training``
"missing", but the typo is the news), then the first problem in file order.
"""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from simtrain.errors import InputError, suggest
from simtrain.yamlio import locate

T = TypeVar("T", bound=BaseModel)


class Closed(BaseModel):
    """Base for every schema: unknown keys are errors, values are immutable, numbers are finite."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, allow_inf_nan=False)


class FieldError(ValueError):
    """A rule broken at a place inside the value a validator checks (``links.3.b``), for validators
    that look across fields: :func:`validate` reports it at that place and its line."""

    def __init__(self, message: str, *where: str | int) -> None:
        super().__init__(message)
        self.where = where


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
        for candidate in _type_args(ann):
            if isinstance(candidate, type) and issubclass(candidate, BaseModel):
                cls = candidate
                break
        else:
            return []
    return list(getattr(cls, "model_fields", {}))


def _type_args(ann: Any) -> list[Any]:
    """The classes inside an annotation: X, X | None, list[X], list[X] | None."""
    out = []
    for arg in getattr(ann, "__args__", (ann,)):
        out.append(arg)
        out.extend(getattr(arg, "__args__", ()))
    return out


def _kind_of(value: Any) -> str:
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, (list, tuple)):
        return "a list"
    if isinstance(value, bool):
        return f"{value!r} (true/false)"
    if value is None:
        return "nothing (null)"
    return repr(value)


#: pydantic error type -> our sentence, given the offending value
_SENTENCES = {
    "int_parsing": "{v} is not a whole number",
    "int_type": "{v} is not a whole number",
    "int_from_float": "{v} is not a whole number",
    "float_parsing": "{v} is not a number",
    "float_type": "{v} is not a number",
    "finite_number": "{v} is not a finite number",
    "bool_parsing": "{v} is not true or false",
    "bool_type": "{v} is not true or false",
    "string_type": "{v} is not text (expected a string)",
    "model_type": "{v} is not a section (expected key: value lines)",
    "model_attributes_type": "{v} is not a section (expected key: value lines)",
    "dict_type": "{v} is not a mapping (expected key: value lines)",
    "list_type": "{v} is not a list (expected [a, b, ...] or '- ' lines)",
    "none_required": "{v} must be empty (null)",
}

_BOUNDS = {"greater_than": ("gt", "greater than"), "greater_than_equal": ("ge", "at least"),
           "less_than": ("lt", "less than"), "less_than_equal": ("le", "at most")}


def _describe(err: dict, model: type[BaseModel]) -> str:
    kind = err["type"]
    value = err.get("input")
    loc = err["loc"]
    ctx = err.get("ctx", {})
    if kind == "extra_forbidden":
        names = _field_names(model, loc)
        hint = suggest(str(loc[-1]), names)
        return f"unknown key{hint}" + (f"; allowed keys: {', '.join(names)}" if not hint and names else "")
    if kind == "missing":
        return "is required but missing"
    if kind == "literal_error":
        expected = ctx.get("expected", "")
        options = [e.strip(" '") for e in expected.replace(" or ", ",").split(",")]
        return f"{value!r} is not allowed{suggest(str(value), options)} (allowed: {expected})"
    if kind in _SENTENCES:
        return _SENTENCES[kind].format(v=_kind_of(value))
    if kind in _BOUNDS:
        key, words = _BOUNDS[kind]
        return f"{_kind_of(value)} must be {words} {ctx.get(key)}"
    msg = err["msg"]
    for prefix in ("Value error, ", "Assertion failed, "):
        if msg.startswith(prefix):
            msg = msg[len(prefix):]
    if kind in ("value_error", "assertion_error"):
        return msg
    return f"{_kind_of(value)}: {msg[0].lower() + msg[1:]}"


def _pick(errors: list[dict]) -> dict:
    """The error to show: a misspelt key first (it usually explains a 'missing' one), else the first."""
    for err in errors:
        if err["type"] == "extra_forbidden":
            return err
    return errors[0]


def _dotted(loc: tuple) -> str:
    """pydantic's location without its internal steps ('[key]', 'function-after[...]')."""
    return ".".join(str(p) for p in loc if not (isinstance(p, str) and (p.startswith("function-") or p == "[key]")))


def validate(model: type[T], data: Any, *, file: str | None, prefix: str = "", root: Any = None) -> T:
    """Build ``model`` from ``data`` or raise an InputError naming file, line and field."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        err = _pick(exc.errors(include_url=False))
        where = getattr(err.get("ctx", {}).get("error"), "where", ())
        dotted = _dotted(tuple(err["loc"]) + tuple(where))
        field = f"{prefix}.{dotted}" if prefix and dotted else (prefix or dotted)
        line, note = locate(root if root is not None else data, field) if field else (getattr(data, "line", None), "")
        raise InputError(_describe(err, model) + note, file=file, line=line, field=field or None) from None
    except InputError as err:
        raise err.located(file=file, line=getattr(data, "line", None)) from None
