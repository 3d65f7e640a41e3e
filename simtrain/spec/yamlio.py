"""Safe YAML loading that remembers where every key stood.

Mappings come back as :class:`LineDict`, a plain ``dict`` that also records the
1-based line of each key, so validation errors can point at ``file:line``.
Only PyYAML's safe loader is used: files never construct Python objects.
Every way a file can be unreadable (missing, a folder, a device, too big, not
UTF-8, bad syntax, a value Python cannot hold) becomes an :class:`InputError`
that names the file and, where there is one, the line.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import yaml

from simtrain.spec.errors import InputError, display_path

#: no hand-written scenario, hardware or model file comes near this; a bigger file is a wrong path
MAX_INPUT_BYTES = 16 * 2**20

#: the most values a file's anchors and aliases may expand to (the largest bundled file, a validation cases file,
#: holds about 9,000): YAML's aliases repeat a value without repeating its text, so a 1 KB file of nested aliases
#: can stand for a billion values, which validating, quoting or copying would have to walk one by one
MAX_EXPANDED_VALUES = 200_000

#: the line recorded for a key that an override (``--set``, a sweep point) put there, not the file
OVERRIDE_LINE = 0


class LineDict(dict):
    """A dict from YAML that knows the line of each of its keys."""

    __slots__ = ("key_lines", "line")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.key_lines: dict[Any, int] = {}
        self.line: int | None = None


class LineList(list):
    """A list from YAML that knows the line it starts on."""

    __slots__ = ("line",)

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.line: int | None = None


class _Loader(yaml.SafeLoader):
    pass


def _construct(loader: _Loader, node: yaml.Node) -> Any:
    """One value; a scalar Python cannot hold (a 5000-digit integer, 2024-13-45) names its line."""
    try:
        return loader.construct_object(node, deep=True)
    except (ValueError, OverflowError) as err:
        raise InputError(f"cannot read the value {_short(node)}: {str(err).split(';')[0]}",
                         line=node.start_mark.line + 1) from None


def _short(node: yaml.Node) -> str:
    text = repr(node.value) if isinstance(node, yaml.ScalarNode) else f"({node.id})"
    return text if len(text) <= 40 else text[:37] + "...'"


_MERGE_TAG = "tag:yaml.org,2002:merge"


def _construct_mapping(loader: _Loader, node: yaml.MappingNode) -> LineDict:
    """A mapping with its keys' lines. A key written twice is refused. A merge (``<<: *base`` or ``<<: [*a, *b]``)
    follows YAML's merge key type, here and not in PyYAML's flatten_mapping, whose order changed between releases:
    a key written in the mapping overrides a merged one, and of the merged mappings the earlier one wins."""
    out = LineDict()
    out.line = node.start_mark.line + 1
    merged: LineDict = LineDict()
    for key_node, value_node in node.value:
        if key_node.tag == _MERGE_TAG:
            for source in _merge_sources(value_node):
                part = _construct(loader, source)
                for key, value in part.items():
                    if key not in merged:
                        merged[key] = value
                        merged.key_lines[key] = part.key_lines.get(key, part.line)
            continue
        key = _construct(loader, key_node)
        if not isinstance(key, (str, int, float, bool)):
            raise InputError(f"a mapping key must be a plain name, not {_short(key_node)}",
                             line=key_node.start_mark.line + 1)
        if key in out:
            raise InputError(f"key '{key}' appears twice in the same mapping",
                             line=key_node.start_mark.line + 1, field=str(key))
        out[key] = _construct(loader, value_node)
        out.key_lines[key] = key_node.start_mark.line + 1
    if not merged:
        return out
    whole = LineDict({**{k: v for k, v in merged.items() if k not in out}, **out})
    whole.line = out.line
    whole.key_lines = {**merged.key_lines, **out.key_lines}
    return whole


def _merge_sources(node: yaml.Node) -> list[yaml.MappingNode]:
    """The mappings a merge key names: one mapping, or a list of them."""
    sources = node.value if isinstance(node, yaml.SequenceNode) else [node]
    for source in sources:
        if not isinstance(source, yaml.MappingNode) or source.tag != yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG:
            shown = f"a mapping tagged {source.tag}" if isinstance(source, yaml.MappingNode) else _short(source)
            raise InputError(f"a merge (<<) takes a mapping or a list of mappings, not {shown}",
                             line=source.start_mark.line + 1, field="<<")
    return sources


def _construct_sequence(loader: _Loader, node: yaml.SequenceNode) -> LineList:
    out = LineList(_construct(loader, child) for child in node.value)
    out.line = node.start_mark.line + 1
    return out


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, _construct_sequence)


# libyaml, PyYAML's C parser, reads a hardware file about 6x faster than PyYAML's Python parser, but it accepts a few
# texts the Python parser refuses (a tab or a byte-order mark inside the text, '?' inside a flow mapping, a '>#-'
# block header, an empty '!' tag). So the C parser reads only texts outside those corners (checked on the parsed
# nodes below: on 90,000 mutated bundled files, every text the check let through read alike in both parsers);
# every other text, and every text either parser refuses, goes through the Python parser, so values, lines and
# error messages stay as they were.
_FastLoader: type | None = None
if getattr(yaml, "__with_libyaml__", False):
    class _FastLoader(yaml.CSafeLoader):  # type: ignore[no-redef]
        pass

    _FastLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
    _FastLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, _construct_sequence)

#: characters that send a text to the Python parser wherever they stand
_ANYWHERE = re.compile("[\t\r\ufeff\x85\u2028\u2029]")
#: characters that send it there outside quoted and block scalars and comments (explicit keys, tags, anchors,
#: aliases, directives, reserved indicators, block headers in odd places)
_STRUCTURE = re.compile(r"[?!&*%@`|>]")
#: the block scalar headers the C parser may read: '>' or '|', optionally with a chomping indicator, then the line end
_BLOCK_HEADER = re.compile(r"[>|][-+]?\n")
_COMMENT = re.compile(r"(?:^|(?<= ))#[^\n]*", re.MULTILINE)


def _fast_document(text: str) -> tuple[bool, Any]:
    """(True, value) when the C parser read ``text`` and the text keeps clear of the corners where the two
    parsers differ; (False, None) when the Python parser must read it."""
    if _ANYWHERE.search(text):
        return False, None
    loader = _FastLoader(text)
    try:
        node = loader.get_single_node()
        quoted = _quoted_spans(text, node) if node is not None else None
        if quoted is None:
            return False, None
        parts, pos = [], 0
        for start, end in quoted:
            parts.append(text[pos:start])
            pos = end
        parts.append(text[pos:])
        if _STRUCTURE.search(_COMMENT.sub("", " ".join(parts))):
            return False, None
        return True, _construct(loader, node)
    except Exception:  # noqa: BLE001 - any refusal or failure: the Python parser reads it and words the error
        return False, None
    finally:
        loader.dispose()


def _quoted_spans(text: str, root: yaml.Node) -> list[tuple[int, int]] | None:
    """Sorted (start, end) character spans of the quoted and block scalars under ``root``; None for a block header
    the C parser may read otherwise, or spans that overlap."""
    spans, stack, seen = [], [root], set()
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.ScalarNode):
            if node.style in (">", "|") and not _BLOCK_HEADER.match(text, node.start_mark.index):
                return None
            if node.style:
                spans.append((node.start_mark.index, node.end_mark.index))
        elif isinstance(node, yaml.MappingNode):
            stack.extend(part for pair in node.value for part in pair)
        else:
            stack.extend(node.value)
    spans.sort()
    if any(spans[i][1] > spans[i + 1][0] for i in range(len(spans) - 1)):
        return None
    return spans


def _error_line(text: str, index: int | None) -> int | None:
    return text.count("\n", 0, index) + 1 if index is not None else None


def load_yaml_text(text: str, file: str) -> Any:
    """Parse YAML text; syntax errors become an InputError with line and column."""
    try:
        return _construct_document(text)
    except InputError as err:
        raise err.located(file=file) from None
    except yaml.constructor.ConstructorError as err:
        # the safe loader refuses tags such as !!python/object: files never build Python objects
        mark = err.problem_mark
        col = f", column {mark.column + 1}" if mark else ""
        raise InputError(f"unsupported YAML{col}: {(err.problem or 'cannot construct a value').strip()} "
                         "(simtrain files hold plain mappings, lists, numbers and strings)",
                         file=file, line=mark.line + 1 if mark else None) from None
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        line = mark.line + 1 if mark else None
        col = f", column {mark.column + 1}" if mark else ""
        problem = (err.problem or err.context or "invalid YAML").strip()
        context = (err.context or "").strip() if err.problem else ""
        if context and problem.startswith("but "):     # "expected a single document ..., but found another"
            problem = f"{context}, {problem}"
        elif context:
            problem = f"{problem} ({context})"
        raise InputError(f"YAML syntax error{col}: {problem}", file=file, line=line) from None
    except yaml.reader.ReaderError as err:
        char = f"#x{err.character:04x}" if isinstance(err.character, int) else repr(err.character)
        raise InputError(f"YAML syntax error: character {char} is not allowed in a YAML file",
                         file=file, line=_error_line(text, err.position)) from None
    except yaml.YAMLError as err:
        raise InputError(f"YAML error: {' '.join(str(err).split())}", file=file) from None
    except RecursionError:
        raise InputError("YAML nests too deeply to be a simtrain file", file=file) from None


def _construct_document(text: str) -> Any:
    if _FastLoader is not None:
        done, value = _fast_document(text)
        if done:
            return value
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is not None:
            check_expansion(node)
        return _construct(loader, node) if node is not None else None
    finally:
        loader.dispose()


def check_expansion(root: yaml.Node) -> None:
    """Refuse a document whose aliases expand it past MAX_EXPANDED_VALUES values (a text without aliases expands to
    its own nodes and is never refused here), naming the line of the first collection that crosses the bound."""
    size: dict[int, int] = {}
    open_: set[int] = set()     # collections entered and not yet summed: meeting one again is an alias to itself
    distinct = 0
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        if id(node) in size:
            continue
        if isinstance(node, yaml.ScalarNode):
            size[id(node)] = 1
            distinct += 1
            continue
        parts = [p for pair in node.value for p in pair] if isinstance(node, yaml.MappingNode) else list(node.value)
        if not children_done:
            if id(node) in open_:
                raise InputError("an alias (*name) stands inside the value its anchor (&name) names, a value that "
                                 "would contain itself; write the values out instead", line=node.start_mark.line + 1)
            open_.add(id(node))
            stack.append((node, True))
            stack.extend((p, False) for p in parts if id(p) not in size)
            continue
        open_.discard(id(node))
        size[id(node)] = total = 1 + sum(size[id(p)] for p in parts)
        distinct += 1
        if total > max(MAX_EXPANDED_VALUES, distinct):
            raise InputError(f"its anchors and aliases (&name, *name) expand to more than {MAX_EXPANDED_VALUES:,} "
                             "values, far more than any simtrain file holds; write the values out instead",
                             line=node.start_mark.line + 1)


def read_text(path: str | Path, what: str = "YAML file") -> tuple[str, str]:
    """(text, name to show) of a small UTF-8 input file; every failure is an InputError naming it."""
    path = Path(path)
    shown = display_path(path)
    try:
        if path.exists() and not path.is_dir() and not path.is_file():
            raise InputError(f"is not a regular file (a device, pipe or socket); expected a {what}", file=shown)
        if path.is_file() and path.stat().st_size > MAX_INPUT_BYTES:
            raise InputError(f"is {path.stat().st_size / 2**20:.0f} MiB, larger than any simtrain input "
                             f"({MAX_INPUT_BYTES // 2**20} MiB); is it the right file?", file=shown)
        return path.read_text(encoding="utf-8"), shown
    except (FileNotFoundError, NotADirectoryError):
        raise InputError("file not found", file=shown) from None
    except IsADirectoryError:
        raise InputError(f"is a directory, expected a {what}", file=shown) from None
    except UnicodeDecodeError as err:
        line = err.object.count(b"\n", 0, err.start) + 1
        raise InputError(f"is not UTF-8 text: byte {err.object[err.start]:#04x} cannot be decoded",
                         file=shown, line=line) from None
    except OSError as err:
        raise InputError(f"cannot be read: {err.strerror}", file=shown) from None


def load_yaml(path: str | Path) -> Any:
    """Read and parse a YAML file, naming it in every error."""
    text, shown = read_text(path)
    return load_yaml_text(text, shown)


def reference_path(ref: str, *, base_dir: Path, what: str, suffixes: tuple[str, ...]) -> Path:
    """The file a scenario names (``hardware: hw/mine.yaml``), resolved against the scenario's folder.

    The path is the user's own: absolute paths, ``~`` and ``..`` are allowed. It must name an existing
    regular file with one of ``suffixes``. Raises an InputError without a file, for the caller to
    locate at the referencing key. (No bundled or referenced file can name further files: the
    schemas have no such keys, so simtrain only ever opens paths a user wrote; docs/errors.md.)
    """
    wanted = ", ".join(suffixes)
    try:
        path = (Path(base_dir) / Path(ref).expanduser()).resolve()
        exists, is_dir, is_file = path.exists(), path.is_dir(), path.is_file()
    except (OSError, ValueError, RuntimeError) as err:   # NUL byte, name too long, symlink loop
        raise InputError(f"{what} file '{ref}' cannot be opened: {getattr(err, 'strerror', None) or err}") from None
    if not exists:
        raise InputError(f"{what} file '{ref}' does not exist (looked at {path})")
    if is_dir:
        raise InputError(f"{what} file '{ref}' is a directory (looked at {path}); name a {wanted} file in it")
    if not is_file:
        raise InputError(f"{what} file '{ref}' is not a regular file (looked at {path})")
    if path.suffix.lower() not in suffixes:
        raise InputError(f"{what} file '{ref}' must end in {wanted}")
    return path


def looks_like_path(ref: str, *, base_dir: Path, suffixes: tuple[str, ...]) -> bool:
    """Is a ``hardware:``/``model:`` value a file path rather than a bundled name?"""
    if ref.lower().endswith(suffixes) or "/" in ref or os.sep in ref or ref.startswith(("~", ".")) or "\0" in ref:
        return True
    try:
        return (Path(base_dir) / ref).exists()
    except (OSError, ValueError):
        return True


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


#: what an error says of a value that came from an override (``overrides=``, a sweep grid), not from the file; the
#: command line names its flag (CLI_OVERRIDE_WORDS)
OVERRIDE_NOTE = " (value set by an override, not by the file)"
#: (Python's words, the command line's words) for a value an override set
CLI_OVERRIDE_WORDS = ("set by an override", "set by an override such as --set")


def locate(data: Any, dotted: str) -> tuple[int | None, str]:
    """(line, note) for an error at ``dotted``: the file line, or None and a note when the value
    came from an override rather than from the file; for a section of the file, a note naming the
    keys an override set inside it (a rule across the section may fail because of them)."""
    line = line_of(data, dotted)
    if line == OVERRIDE_LINE:
        return None, OVERRIDE_NOTE
    node = data
    for part in dotted.split("."):
        node = node.get(part) if isinstance(node, LineDict) else None
    overridden = _overridden(node, dotted) if isinstance(node, LineDict) else []
    if overridden:
        return line, f" (with {', '.join(overridden)} set by an override)"
    return line, ""


def _overridden(node: LineDict, prefix: str) -> list[str]:
    """Dotted keys under ``node`` whose values an override set."""
    out = []
    for key, value in node.items():
        if node.key_lines.get(key) == OVERRIDE_LINE:
            out.append(f"{prefix}.{key}")
        elif isinstance(value, LineDict):
            out.extend(_overridden(value, f"{prefix}.{key}"))
    return out
