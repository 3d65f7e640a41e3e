"""Closed, typed schemas: pydantic models that reject unknown keys, and the
translation of pydantic's errors into one located sentence.

Pydantic reports every problem it finds; a person needs the one that explains
the rest. A misspelt key comes first (``trainig:`` also makes ``training``
"missing", but the typo is the news), then the first problem in file order.
"""

from __future__ import annotations

import re
import types
import unicodedata
from typing import Annotated, Any, Literal, TypeVar, Union, get_args, get_origin

from pydantic import (
    BaseModel,
    ConfigDict,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from simtrain.spec.bounds import FIELD_RANGES as _KEYED
from simtrain.spec.bounds import number_problem
from simtrain.spec.errors import InputError, one_line, short_repr, suggest
from simtrain.spec.quantity import QuantityMark
from simtrain.spec.yamlio import locate

T = TypeVar("T", bound=BaseModel)


class Closed(BaseModel):
    """Base for every schema: unknown keys are errors, values are immutable, numbers are finite and inside
    the ranges of simtrain.spec.bounds (so a field added later is checked without a line of its own), and
    a boolean is never a number.

    Pydantic's lax mode turns ``true`` into 1 for an ``int`` (and 1.0 for a ``float``), so
    ``micro_batch: true`` would run as 1 and ``zero: false`` as stage 0. Strict mode would also refuse
    ``2.0`` for a whole number, which files write; so one check here, before any field's own
    validation, refuses a boolean wherever the field's type takes numbers but not booleans.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, allow_inf_nan=False)

    @model_validator(mode="after")
    def _numbers_in_range(self) -> Any:
        """Every number of the schema inside the range simtrain.spec.bounds gives it (plain numbers here; the
        quantity types check theirs as they parse), including numbers inside lists and mappings."""
        owner = type(self).__name__
        for name, field in type(self).model_fields.items():
            problem = _range_problem(owner, name, getattr(self, name), _is_quantity(field))
            if problem:
                raise FieldError(problem[0], name, *problem[1:])
        return self

    @field_validator("*", mode="before")
    @classmethod
    def _no_boolean_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        if isinstance(value, (bool, list, tuple, dict)) and info.field_name in cls.model_fields:
            problem = _boolean_as_number(cls.model_fields[info.field_name].annotation, value)
            if problem:
                raise FieldError(*problem)
        if isinstance(value, str) and info.field_name == "name" and any(map(_breaks_a_line, value)):
            raise FieldError(f"{one_line(repr(value))} holds a control character (a newline, a tab, an escape); a "
                             "name is printed in reports and charts: one line of text")
        if isinstance(value, (str, list)) and info.field_name in cls.model_fields:
            field = cls.model_fields[info.field_name]
            problem = None if _is_quantity(field) else _text_as_number(field.annotation, value)
            if problem:
                raise FieldError(*problem)
        return value


def _is_quantity(field: Any) -> bool:
    """A field typed with a quantity type (simtrain.spec.quantity): its own range was checked as it was parsed."""
    def marked(ann: Any) -> bool:
        if get_origin(ann) is Annotated and any(isinstance(m, QuantityMark) for m in get_args(ann)[1:]):
            return True
        return any(marked(arg) for arg in get_args(ann))

    return any(isinstance(m, QuantityMark) for m in field.metadata) or marked(field.annotation)


def _range_problem(owner: str, name: str, value: Any, quantity: bool, *where: Any) -> tuple | None:
    """(message, *place inside the field) for a number out of its range in ``value``, else None."""
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            problem = _range_problem(owner, name, item, quantity, *where, i)
            if problem:
                return problem
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            problem = _range_problem(owner, name, item, quantity, *where, key)
            if problem:
                return problem
        return None
    if quantity and (where or f"{owner}.{name}" not in _KEYED):    # checked as it was parsed, unless keyed here
        return None
    problem = number_problem(owner, name, value)
    return (problem, *where) if problem else None


class FieldError(ValueError):
    """A rule broken at a place inside the value a validator checks (``links.3.b``), for validators
    that look across fields: :func:`validate` reports it at that place and its line."""

    def __init__(self, message: str, *where: str | int) -> None:
        super().__init__(message)
        self.where = where


def _alternatives(ann: Any) -> list[Any]:
    """The types a value may take at ``ann``: unions opened, ``Annotated`` metadata dropped."""
    origin = get_origin(ann)
    if origin is Annotated:
        return _alternatives(get_args(ann)[0])
    if origin is Union or origin is types.UnionType:
        return [alt for arg in get_args(ann) for alt in _alternatives(arg)]
    return [ann]


def _number_kind(ann: Any) -> tuple[str, str] | None:
    """('a whole number' | 'a number', allowed-values note) when ``ann`` takes numbers but not
    booleans, else None (a bool field, ``Any``, text, a section)."""
    alternatives = _alternatives(ann)
    literals = [v for alt in alternatives if get_origin(alt) is Literal for v in get_args(alt)]
    if bool in alternatives or Any in alternatives or any(isinstance(v, bool) for v in literals):
        return None
    numbers = [v for v in literals if isinstance(v, int)]
    if int in alternatives or numbers:
        shown = ", ".join(str(v) for v in numbers[:-1]) + f" or {numbers[-1]}" if len(numbers) > 1 else ""
        return "a whole number", f" (allowed: {shown})" if shown and int not in alternatives else ""
    if float in alternatives:
        return "a number", ""
    return None


def _breaks_a_line(ch: str) -> bool:
    """A control character (Unicode Cc: newline, tab, escape...), a line or paragraph separator, or a lone surrogate
    (Cs: not text, and no UTF-8 output can hold it); other spacing (a no-break or thin space, a zero-width joiner)
    prints on one line."""
    return unicodedata.category(ch) in ("Cc", "Cs", "Zl", "Zp")


#: text YAML would have read as a number had it not been quoted: "128", "1_28", " 2.5 ", "-.5". YAML 1.1 reads an
#: unquoted 2e0 or 1.5e12 (no dot, or no exponent sign) as text, so exponent forms are left to pydantic, as before
_QUOTED_NUMBER = re.compile(r"\s*[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9][0-9_]*)\s*")


def _text_as_number(ann: Any, value: Any, *where: int) -> tuple | None:
    """(message, *place) for a quoted number at a place, or in a list at a place, that takes numbers and no text but
    the words its type names: lax mode would read "128" as 128 and " 1_28 " too; the HuggingFace reader refuses such
    text, and so do these."""
    alternatives = _alternatives(ann)
    if str in alternatives or Any in alternatives:
        return None
    if isinstance(value, list):
        items = [get_args(alt)[0] for alt in alternatives if get_origin(alt) is list and get_args(alt)]
        for i, item in enumerate(value if items else []):
            problem = _text_as_number(items[0], item, *where, i) if isinstance(item, str) else None
            if problem:
                return problem
        return None
    words = [v for alt in alternatives if get_origin(alt) is Literal for v in get_args(alt) if isinstance(v, str)]
    kind = _number_kind(ann)
    if kind is None or value in words or not _QUOTED_NUMBER.fullmatch(value):
        return None      # a word, or not a number at all: pydantic's own message says what is allowed
    also = " or " + ", ".join(repr(w) for w in words) if words else ""
    return (f"{value!r} is text, not {kind[0]}{kind[1]}{also} (write the number without quotes)", *where)


def _boolean_as_number(ann: Any, value: Any, *where: int | str) -> tuple[str, ...] | None:
    """(message, *place) for a boolean at, or inside a list or mapping at, a place that wants a number."""
    if isinstance(value, bool):
        kind = _number_kind(ann)
        return (f"{str(value).lower()} is a boolean, not {kind[0]}{kind[1]}", *where) if kind else None
    for alt in _alternatives(ann):
        origin, args = get_origin(alt), get_args(alt)
        if origin in (list, tuple) and isinstance(value, (list, tuple)) and args:
            for i, item in enumerate(value):
                item_ann = args[0] if origin is list or args[-1] is Ellipsis else args[min(i, len(args) - 1)]
                problem = _boolean_as_number(item_ann, item, *where, i)
                if problem:
                    return problem
        elif origin is dict and isinstance(value, dict) and len(args) == 2:
            for key, item in value.items():
                problem = _boolean_as_number(args[1], item, *where, key)
                if problem:
                    return problem
    return None


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
    return short_repr(value)


#: pydantic error type -> our sentence, given the offending value
_SENTENCES = {
    "int_parsing": "{v} is not a whole number",
    "int_type": "{v} is not a whole number",
    "int_from_float": "{v} is not a whole number",
    "int_parsing_size": "{v} is outside the range simtrain accepts (magnitude at most 2**40)",
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
    if kind == "invalid_key":           # YAML read an unquoted number or boolean as the key
        names = _field_names(model, loc)
        what = "a boolean" if isinstance(value, bool) else "a number"
        return f"{what} is not a key name" + (f"; allowed keys: {', '.join(names)}" if names else "")
    if kind == "missing":
        return "is required but missing"
    if kind == "literal_error":
        expected = ctx.get("expected", "")
        options = [e.strip(" '") for e in expected.replace(" or ", ",").split(",")]
        if isinstance(value, bool):      # YAML 1.1 reads yes/no/on/off/true/false as booleans
            return (f"{str(value).lower()} (YAML reads an unquoted yes, no, on, off, true or false as a boolean) "
                    f"is not allowed (allowed: {expected}; quote a word that should stay a word)")
        hint = suggest(value, options) if isinstance(value, str) and len(value) <= 100 else ""
        return f"{short_repr(value)} is not allowed{hint} (allowed: {expected})"
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
    """The error to show: a misspelt key first (it usually explains a 'missing' one); for a word where a field takes
    a word or a list (``layers_per_stage: autox``), the word's error, naming the list too; else the first."""
    for err in errors:
        if err["type"] == "extra_forbidden":
            return err
    first = errors[0]
    if isinstance(first.get("input"), str):
        where = _dotted(tuple(first["loc"]))
        for err in errors:
            if err["type"] == "literal_error" and _dotted(tuple(err["loc"])) == where:
                lists = any(e["type"] == "list_type" and _dotted(tuple(e["loc"])) == where for e in errors)
                ctx = dict(err.get("ctx", {}))
                if lists:
                    ctx["expected"] = f"{ctx.get('expected', '')}, or a list"
                return {**err, "ctx": ctx}
    return first


#: a step of pydantic's location that names a branch of a union ('list[int]', "literal['auto']"), not a key
_UNION_STEP = re.compile(r"^(?:list|dict|tuple|set|literal|function-[a-z]+)\[.*\]$")


def _dotted(loc: tuple) -> str:
    """pydantic's location without its internal steps ('[key]', 'function-after[...]', a union's 'list[int]')."""
    return ".".join(str(p) for p in loc
                    if not (isinstance(p, str) and (p.startswith("function-") or p == "[key]" or _UNION_STEP.match(p))))


def validate(model: type[T], data: Any, *, file: str | None, prefix: str = "", root: Any = None,
             units: bool = True) -> T:
    """Build ``model`` from ``data`` or raise an InputError naming file, line and field. With ``file`` (and
    ``units``) physical quantities must carry their unit (``simtrain.spec.quantity``)."""
    try:
        return model.model_validate(data, context={"file": file} if file and units else None)
    except ValidationError as exc:
        err = _pick(exc.errors(include_url=False))
        where = getattr(err.get("ctx", {}).get("error"), "where", ())
        dotted = _dotted(tuple(err["loc"]) + tuple(where))
        field = f"{prefix}.{dotted}" if prefix and dotted else (prefix or dotted)
        line, note = locate(root if root is not None else data, field) if field else (getattr(data, "line", None), "")
        raise InputError(_describe(err, model) + note, file=file, line=line, field=field or None) from None
    except InputError as err:
        raise err.located(file=file, line=getattr(data, "line", None)) from None
