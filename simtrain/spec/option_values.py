"""Values written on a command line: one value as YAML reads it (``--set``, each ``--grid`` / ``--fix`` value), and a
comma-separated list of them split at its top-level commas only, so that a value may itself be a YAML list or
mapping (``[core_attn,mlp]``, ``{a: 1, b: 2}``) or a quoted string holding commas."""

from __future__ import annotations

from typing import Any

import yaml

from simtrain.spec.errors import InputError, short_repr
from simtrain.spec.yamlio import check_expansion

_CLOSE = {"[": "]", "{": "}"}
#: a quote opens a quoted string where YAML would: at the start of a value, after '[', '{', ',' or ':'
_BEFORE_QUOTE = "[{,:"


def parse_value(text: str, what: str = "") -> Any:
    """One value as ``--set`` reads it: YAML (``8`` -> 8, ``[a, b]`` -> a list, ``true`` -> True); text YAML cannot
    read stays text; an empty or blank value is the empty string. A value whose aliases expand past a file's bound,
    contain themselves or nest too deeply is an InputError naming ``what`` (the option and its argument)."""
    if not text.strip():
        return ""
    named = f"{what}: " if what else f"the value {short_repr(text)}: "
    try:
        if "*" in text:      # aliases: bounded as in a file (yamlio.check_expansion), before any value is built
            node = yaml.compose(text, Loader=yaml.SafeLoader)
            if node is not None:
                try:
                    check_expansion(node)
                except InputError as err:
                    raise InputError(named + err.message) from None
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    except RecursionError:
        raise InputError(named + "it nests too deeply to be a simtrain value") from None


def split_values(text: str, what: str) -> list[str]:
    """``'1,[2,3],{a: 4, b: 5}'`` -> ``['1', '[2,3]', '{a: 4, b: 5}']``: ``text`` cut at the commas outside brackets,
    braces and quotes, each part stripped. A bracket or quote left open, a closing one never opened, or an empty part
    is an InputError naming ``what`` (the option and its argument, e.g. "--grid 'training.micro_batch=1,,2'")."""
    parts, stack, start, quote, last = [], [], 0, "", ""
    i = 0
    while i < len(text):
        ch = text[i]
        if quote:
            if ch == "\\" and quote == '"' or text.startswith("''", i) and quote == "'":
                i += 1                      # an escaped character: \x in a double-quoted string, '' in a single-quoted
            elif ch == quote:
                quote = ""
        elif ch in "'\"" and (not last or last in _BEFORE_QUOTE):
            quote = ch
        elif ch in _CLOSE:
            stack.append(_CLOSE[ch])
        elif ch in "]}":
            if not stack or stack.pop() != ch:
                raise InputError(f"{what}: '{ch}' at character {i + 1} closes no '{'[' if ch == ']' else '{'}'")
        elif ch == "," and not stack:
            parts.append(text[start:i])
            start = i + 1
        if not quote and not ch.isspace():
            last = ch
        i += 1
    if quote:
        raise InputError(f"{what}: the quote {quote} is not closed")
    if stack:
        raise InputError(f"{what}: a '{'[' if stack[-1] == ']' else '{'}' is not closed")
    parts.append(text[start:])
    parts = [p.strip() for p in parts]
    for n, part in enumerate(parts, 1):
        if not part:
            raise InputError(f"{what}: value {n} of {len(parts)} is empty; give V1,V2,... without empty values "
                             "(quote an empty string: \"\")")
    return parts
