"""A scenario's raw mapping, read-only.

``Scenario.raw`` is the mapping the scenario was validated from (lines kept, for messages and overrides). Its
validated fields are frozen (pydantic models, a frozen dataclass); the raw mapping was not, so
``scenario.raw["training"]["micro_batch"] = 4`` changed nothing that was simulated but did change what the next
``with_overrides`` started from, and the two then disagreed. :func:`freeze` makes a read-only copy: every change
raises a TypeError that says how to change a scenario. A deep copy of the mapping (``copy.deepcopy``, pickling) is
an ordinary, changeable :class:`~simtrain.spec.yamlio.LineDict` all through, so overrides and sweeps start from it
as before; a shallow one (``copy.copy``, ``dict(raw)``) can be changed at its top level only. A copied or
unpickled :class:`~simtrain.spec.scenario.Scenario` freezes its raw mapping again (``Scenario.__setstate__``).
"""

from __future__ import annotations

from typing import Any

from simtrain.spec.yamlio import LineDict, LineList

READ_ONLY = ("a scenario's raw mapping is read-only: make a changed scenario with "
             "scenario.with_overrides({'training.micro_batch': 4})")


def _refuse(*_args: Any, **_kwargs: Any) -> None:
    raise TypeError(READ_ONLY)


class FrozenLineDict(LineDict):
    """A :class:`LineDict` that refuses changes; its copies are changeable."""

    __slots__ = ()
    __setitem__ = __delitem__ = _refuse
    clear = pop = popitem = setdefault = update = _refuse
    __ior__ = _refuse

    def __deepcopy__(self, memo: dict) -> LineDict:
        return thaw(self)

    def __copy__(self) -> LineDict:
        out = LineDict(self)
        out.key_lines, out.line = dict(self.key_lines), self.line
        return out

    def __reduce__(self):
        return thaw, (thaw(self),)


class FrozenLineList(LineList):
    """A :class:`LineList` that refuses changes; its copies are changeable."""

    __slots__ = ()
    __setitem__ = __delitem__ = _refuse
    append = extend = insert = pop = remove = clear = sort = reverse = _refuse
    __iadd__ = __imul__ = _refuse

    def __deepcopy__(self, memo: dict) -> LineList:
        return thaw(self)

    def __copy__(self) -> LineList:
        out = LineList(self)
        out.line = self.line
        return out

    def __reduce__(self):
        return thaw, (thaw(self),)


def freeze(value: Any) -> Any:
    """A read-only deep copy of a YAML value: mappings and lists frozen, their lines kept; scalars as they are."""
    if isinstance(value, dict):
        out = FrozenLineDict()
        dict.update(out, {k: freeze(v) for k, v in value.items()})
        out.key_lines = dict(getattr(value, "key_lines", {}))
        out.line = getattr(value, "line", None)
        return out
    if isinstance(value, list):
        out = FrozenLineList()
        list.extend(out, [freeze(v) for v in value])
        out.line = getattr(value, "line", None)
        return out
    return value


def thaw(value: Any) -> Any:
    """A changeable deep copy (LineDict / LineList, lines kept) of a frozen or ordinary YAML value."""
    if isinstance(value, dict):
        out = LineDict({k: thaw(v) for k, v in value.items()})
        out.key_lines = dict(getattr(value, "key_lines", {}))
        out.line = getattr(value, "line", None)
        return out
    if isinstance(value, list):
        out = LineList([thaw(v) for v in value])
        out.line = getattr(value, "line", None)
        return out
    return value
