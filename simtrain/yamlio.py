"""Safe YAML loading that remembers where every key stood.

Mappings come back as :class:`LineDict`, a plain ``dict`` that also records the
1-based line of each key, so validation errors can point at ``file:line``.
Only PyYAML's safe loader is used: files never construct Python objects.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from simtrain.errors import InputError


class LineDict(dict):
    """A dict from YAML that knows the line of each of its keys."""

    __slots__ = ("key_lines", "line")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.key_lines: dict[Any, int] = {}
        self.line: int | None = None


class _Loader(yaml.SafeLoader):
    pass


def _construct_mapping(loader: _Loader, node: yaml.MappingNode) -> LineDict:
    loader.flatten_mapping(node)
    out = LineDict()
    out.line = node.start_mark.line + 1
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        if not isinstance(key, (str, int, float, bool)) or key is None:
            raise InputError(f"a mapping key must be a plain name, not {key!r}",
                             line=key_node.start_mark.line + 1)
        if key in out:
            raise InputError(f"key '{key}' appears twice in the same mapping",
                             line=key_node.start_mark.line + 1, field=str(key))
        out[key] = loader.construct_object(value_node, deep=True)
        out.key_lines[key] = key_node.start_mark.line + 1
    return out


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def load_yaml_text(text: str, file: str) -> Any:
    """Parse YAML text; syntax errors become an InputError with line and column."""
    try:
        return yaml.load(text, Loader=_Loader)  # noqa: S506 - _Loader derives from SafeLoader
    except InputError as err:
        raise err.located(file=file)
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        line = mark.line + 1 if mark else None
        col = f", column {mark.column + 1}" if mark else ""
        problem = (err.problem or err.context or "invalid YAML").strip()
        raise InputError(f"YAML syntax error{col}: {problem}", file=file, line=line) from None
    except yaml.YAMLError as err:
        raise InputError(f"YAML error: {err}", file=file) from None


def load_yaml(path: str | Path) -> Any:
    """Read and parse a YAML file, naming it in every error."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError("file not found", file=str(path)) from None
    except IsADirectoryError:
        raise InputError("is a directory, expected a YAML file", file=str(path)) from None
    except UnicodeDecodeError:
        raise InputError("is not UTF-8 text", file=str(path)) from None
    except OSError as err:
        raise InputError(f"cannot be read: {err.strerror}", file=str(path)) from None
    return load_yaml_text(text, str(path))


def line_of(data: Any, dotted: str) -> int | None:
    """The line of the deepest existing key along a dotted path such as 'parallel.tp'."""
    line = getattr(data, "line", None)
    node = data
    for part in dotted.split("."):
        if isinstance(node, LineDict):
            key: Any = part
            if key not in node and part.lstrip("-").isdigit():
                key = int(part)
            if key in node:
                line = node.key_lines.get(key, line)
                node = node[key]
                continue
            return line
        if isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
            line = getattr(node, "line", line)
            continue
        return line
    return line
