"""The one exception type for bad input, and how it is shown to a person.

Every problem with a user's file becomes an :class:`InputError` that knows the
file, the line, the dotted field name and the offending value, so the CLI can
print a single located sentence (``scenarios/x.yaml:12: parallel.tp: ...``) and
exit with status 2 instead of a traceback.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class InputError(Exception):
    """A problem with user input: a file, a field or a value the rules forbid."""

    def __init__(self, message: str, *, file: str | None = None, line: int | None = None,
                 field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.file = file
        self.line = line
        self.field = field

    def located(self, *, file: str | None = None, line: int | None = None,
                field: str | None = None) -> "InputError":
        """Fill in the location parts that are still unknown (innermost wins)."""
        self.file = self.file or file
        self.line = self.line or line
        self.field = self.field or field
        return self

    def __str__(self) -> str:
        where = ""
        if self.file:
            where = f"{self.file}:{self.line}: " if self.line else f"{self.file}: "
        field = f"{self.field}: " if self.field else ""
        return f"{where}{field}{self.message}"


class SimulationLimitError(InputError):
    """The scenario would need more work than the configured bound allows."""


def suggest(word: str, choices: Iterable[str]) -> str:
    """' (did you mean X?)' for the closest valid choice, or ''."""
    match = difflib.get_close_matches(str(word), list(choices), n=1, cutoff=0.6)
    return f" (did you mean '{match[0]}'?)" if match else ""


def allowed(choices: Iterable[object]) -> str:
    return "allowed: " + ", ".join(str(c) for c in choices)
