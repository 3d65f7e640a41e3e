"""The chart functions' arguments checked where a notebook hands them in.

A value of the wrong kind is a ``TypeError`` in one sentence that names the function, the argument, the kind given
and the kinds allowed, as ``simtrain.simulate`` does for its scenario; without it a notebook saw Python's own
``'int' object has no attribute 'to_dict'`` from deep inside a chart. Values of the right kind that are wrong (a
missing column, a report without a timeline) stay :class:`~simtrain.spec.errors.InputError`.
"""

from __future__ import annotations

import numbers
import os
from collections.abc import Mapping
from typing import Any


def _refuse(function: str, argument: str, allowed: str, value: Any) -> TypeError:
    return TypeError(f"simtrain.charts.{function}: {argument} must be {allowed}, not {type(value).__name__}")


def is_result(value: Any) -> bool:
    """A simulated Result, by what the charts read of it (duck-typed: simtrain.report.result imports the charts, so
    importing it here would close an import cycle)."""
    return callable(getattr(value, "to_dict", None)) and hasattr(value, "timeline") and hasattr(value, "devices")


def need_result(function: str, value: Any) -> None:
    """A simulated :class:`~simtrain.report.result.Result` or its JSON report (a dict)."""
    if not (isinstance(value, dict) or is_result(value)):
        raise _refuse(function, "the run", "a Result (simtrain.simulate) or its JSON report (a dict)", value)


def need_table(function: str, value: Any, argument: str = "the table") -> None:
    """A pandas DataFrame (what ``simtrain.sweep`` returns)."""
    import pandas as pd

    if not isinstance(value, pd.DataFrame):
        raise _refuse(function, argument, "a pandas DataFrame (simtrain.sweep returns one)", value)


def need_rows(function: str, value: Any, argument: str = "the rows") -> None:
    """A DataFrame, or a list or tuple of mappings (one per row)."""
    import pandas as pd

    if isinstance(value, pd.DataFrame):
        return
    if not isinstance(value, (list, tuple)):
        raise _refuse(function, argument, "a pandas DataFrame or a list of rows (dicts)", value)
    for row in value:
        if not isinstance(row, Mapping):
            raise _refuse(function, f"each row of {argument}", "a mapping of column names to values (a dict)", row)


def need_str(function: str, value: Any, argument: str, *, optional: bool = False) -> None:
    if not (isinstance(value, str) or (optional and value is None)):
        raise _refuse(function, argument, "a string" + (" or None" if optional else ""), value)


def need_path(function: str, value: Any, argument: str, *, optional: bool = False) -> None:
    """A file path: a str or an os.PathLike (pathlib.Path); None where the output is optional."""
    if not (isinstance(value, (str, os.PathLike)) or (optional and value is None)):
        raise _refuse(function, argument, "a file path (str or pathlib.Path)" + (" or None" if optional else ""),
                      value)


def need_figures(function: str, value: Any) -> None:
    """A list or tuple of plotly Figures."""
    if not isinstance(value, (list, tuple)):
        raise _refuse(function, "figures", "a list of plotly Figures", value)
    for fig in value:
        if not callable(getattr(fig, "to_html", None)) or isinstance(fig, type):
            raise _refuse(function, "each item of figures", "a plotly Figure", fig)


def need_figure(function: str, value: Any) -> None:
    """A plotly Figure or its ``to_dict()``."""
    if not (isinstance(value, dict) or (callable(getattr(value, "to_dict", None)) and hasattr(value, "layout"))):
        raise _refuse(function, "fig", "a plotly Figure or its to_dict()", value)


def need_count(function: str, value: Any, argument: str) -> None:
    """A whole number of at least 1: an int or numpy integer (``True`` is not one)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise _refuse(function, argument, "a whole number", value)
    if value < 1:
        raise ValueError(f"simtrain.charts.{function}: {argument} must be at least 1, not {value}")
