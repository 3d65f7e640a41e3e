"""Writing files safely: a temporary file beside the target, then an atomic rename,
so an interrupted run never leaves half a report, trace or chart on disk.

A target that exists and is not a regular file is never renamed over (that would replace ``/dev/null`` or a
user's FIFO with a regular file): a character device (``/dev/null``, a terminal) or a FIFO with a reader is
written into directly; a FIFO without a reader (writing would block), a socket, a block device (a disk) or a
folder is refused.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from simtrain.spec.errors import InputError

_STAGE: ContextVar[list[tuple[str | bytes, Path]] | None] = ContextVar("simtrain_staged_outputs", default=None)


@contextmanager
def staged_outputs() -> Iterator[None]:
    """Files written inside the block land together: each goes to a temporary file beside its target, and
    all are renamed only when the block ends without an error, so an interrupted command leaves all of its
    outputs or none (never a new chart beside an old report). Blocks nest: the outermost one commits."""
    if _STAGE.get() is not None:   # inside another block: its end commits these files too
        yield
        return
    pending: list[tuple[str, Path]] = []
    token = _STAGE.set(pending)
    try:
        yield
    except BaseException:
        for tmp, _ in pending:
            _unlink(tmp)
        raise
    finally:
        _STAGE.reset(token)
    for done, (tmp, path) in enumerate(pending):
        try:
            if isinstance(tmp, bytes):      # a device or FIFO: its data, written in at the end like a rename
                _write_special(path, tmp)
            else:
                os.replace(tmp, path)
        except BaseException:
            for rest, _ in pending[done:]:
                _unlink(rest)
            raise


def _unlink(tmp: str | bytes) -> None:
    if isinstance(tmp, bytes):
        return
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass


def special_target(path: str | Path) -> str | None:
    """What kind of existing non-regular file ``path`` names (following symlinks): 'device', 'fifo', or the
    reason it is refused; None for a regular file or no file."""
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return None
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISCHR(mode):
        return "device"
    if stat.S_ISFIFO(mode):
        return "fifo"
    kind = ("a folder" if stat.S_ISDIR(mode) else "a block device (a disk)" if stat.S_ISBLK(mode)
            else "a socket" if stat.S_ISSOCK(mode) else "not a regular file")
    raise InputError(f"cannot write '{path}': it is {kind}, which simtrain never writes into or replaces; "
                     "name a regular file")


def _write_special(path: Path, data: bytes) -> None:
    """Write ``data`` into an existing character device or FIFO, never replacing it. A FIFO is opened without
    blocking: with no reader at the other end the write could wait forever, so it is refused."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    except OSError as err:
        if err.errno == errno.ENXIO:
            raise InputError(f"cannot write '{path}': it is a FIFO with no reader (start the reader first, or name "
                             "a regular file)") from None
        raise
    try:
        os.set_blocking(fd, True)
        with os.fdopen(fd, "wb", closefd=True) as fh:
            fd = -1
            fh.write(data)
    finally:
        if fd >= 0:
            os.close(fd)


#: how much of an existing file is read to tell whether simtrain wrote it
_HEAD_BYTES = 64 * 2**10
#: the first bytes of each kind of file simtrain writes: canonical JSON (``dumps_json``: one-space indent; the
#: report, memory, compare, search and validate JSON, and a sweep's ``.sweep.json`` record), a Chrome trace
#: (``report.trace``), a chart page (``charts.figures_html``)
_OUR_STARTS = (b'{\n "', b'{"traceEvents":[{"ph":"M","name":"process_name"',
               b'<!DOCTYPE html>\n<html>\n<head>\n<meta charset="utf-8">\n<title>')
#: a column every sweep table (step_time_s) or search table (estimate_s) has, in its header line or Parquet footer
_TABLE_COLUMNS = (b"step_time_s", b"estimate_s")


def written_by_simtrain(path: str | Path, header: bytes | None = None) -> bool:
    """Whether the existing regular file ``path`` is empty or one simtrain writes (a report, chart, trace or table,
    told by how it starts; a chart page also by its figures' ids, a table by a column of its own or by ``header``,
    the first line of the table about to replace it)."""
    path = Path(path)
    size = path.stat().st_size
    if size == 0:
        return True
    with open(path, "rb") as fh:
        head = fh.read(_HEAD_BYTES)
        if head.startswith(b"PAR1"):          # Parquet: the column names sit in the footer
            fh.seek(max(size - _HEAD_BYTES, 0))
            return any(col in fh.read() for col in _TABLE_COLUMNS)
        if head.startswith(_OUR_STARTS[2]):   # a chart page: plotly.js comes first, the figures' divs after it
            return size <= 2**26 and b'id="simtrain-figure-' in head + fh.read()
    if head.startswith(_OUR_STARTS[:2]):
        return True
    first = head.split(b"\n", 1)[0]
    if header is not None and first == header.rstrip(b"\r\n"):
        return True
    return any(col in first for col in _TABLE_COLUMNS)     # a CSV header or a JSON-lines row of a table


def check_replaceable(path: str | Path, header: bytes | None = None) -> None:
    """Refuse to replace (or append to) an existing regular file that simtrain did not write: a user's file is
    never overwritten by an output option (``--json``, ``--out``, ``--gantt``, ``--trace``, ``--plot``)."""
    path = Path(path)
    if special_target(path) or not path.exists():
        return
    try:
        ours = written_by_simtrain(path, header)
    except OSError as err:
        raise InputError(f"cannot write '{path}': {err.strerror}") from None
    if not ours:
        raise InputError(f"cannot write '{path}': it exists and is not a file simtrain wrote (a report, chart, trace "
                         "or table), and simtrain never replaces another program's file; remove it or name another "
                         "file")


def write_output(path: str | Path, data: str | bytes) -> Path:
    """:func:`write_atomic` for a file a user named: refused where it would replace a file simtrain did not
    write (:func:`check_replaceable`)."""
    check_replaceable(path)
    return write_atomic(path, data)


def write_atomic(path: str | Path, data: str | bytes) -> Path:
    """Write ``data`` to ``path`` through a temporary file and a rename (inside ``staged_outputs``, the rename
    waits for the block's end)."""
    path = Path(path)
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise InputError(f"cannot write '{path}': folder '{parent}' does not exist")
    if special_target(path):
        raw = data if isinstance(data, bytes) else data.encode("utf-8")
        stage = _STAGE.get()
        if stage is None:
            _write_special(path, raw)
        else:
            stage.append((raw, path))
        return path
    mode = "wb" if isinstance(data, bytes) else "w"
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=parent)
    except OSError as err:      # a read-only folder, /proc, a full disk: name the file asked for, not the temporary
        raise InputError(f"cannot write '{path}': {err.strerror} (simtrain writes a temporary file in "
                         f"'{parent}' and renames it over the target)") from None
    try:
        with os.fdopen(fd, mode, **({} if mode == "wb" else {"encoding": "utf-8"})) as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        stage = _STAGE.get()
        if stage is None:
            os.replace(tmp, path)
        else:
            stage.append((tmp, path))
    except BaseException:
        _unlink(tmp)
        raise
    return path


#: json's C encoder (it runs only without ``indent``): one line of JSON for a row or a scalar
_LINE = json.JSONEncoder(sort_keys=True, ensure_ascii=False, allow_nan=False, separators=(", ", ": "))


def dumps_json(obj: Any) -> str:
    """Canonical JSON: sorted keys, one key per line for each object outside lists, each item of a list (a
    timeline operation, a device, a sentence) on a line of its own, a list of numbers on one line; equal inputs
    give byte-identical files. Written by json's C encoder row by row: json.dumps with ``indent`` runs in pure
    Python, 6x slower on a 16,384-GPU report's 1 MB timeline."""
    return _pretty(obj, 0) + "\n"


def _pretty(obj: Any, depth: int) -> str:
    pad = " " * (depth + 1)
    if isinstance(obj, dict) and obj:
        items = (f"{pad}{_LINE.encode(_key(k))}: {_pretty(v, depth + 1)}" for k, v in sorted(obj.items()))
        return "{\n" + ",\n".join(items) + "\n" + " " * depth + "}"
    if isinstance(obj, (list, tuple)) and any(isinstance(v, (dict, list, tuple, str)) for v in obj):
        return "[\n" + ",\n".join(pad + row for row in _rows(obj)) + "\n" + " " * depth + "]"
    return _LINE.encode(obj)


def _rows(items: list | tuple) -> list[str]:
    """Each item of a list as one line of JSON. A list of lists (a timeline's records) is encoded in one call of
    the C encoder and cut at its ``"], ["`` boundaries (a 16,384-GPU report's 8,767 records: 24 -> 13 ms); when
    the text holds more boundaries than items (a string that contains one), each item is encoded on its own."""
    if len(items) > 1 and all(type(v) is list or type(v) is tuple for v in items):
        rows = _LINE.encode(items)[1:-1].split("], [")
        if len(rows) == len(items):
            return [rows[0] + "]", *("[" + row + "]" for row in rows[1:-1]), "[" + rows[-1]]
    return [_LINE.encode(v) for v in items]


def _key(key: Any) -> str:
    """A dict key as JSON writes it: text as is, numbers and constants by their JSON spelling."""
    return key if isinstance(key, str) else json.dumps(key)


def write_json(path: str | Path, obj: Any) -> Path:
    return write_output(path, dumps_json(obj))
