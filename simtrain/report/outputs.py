"""Writing files safely: a temporary file beside the target, then an atomic rename,
so an interrupted run never leaves half a report, trace or chart on disk.

A target that exists and is not a regular file is never renamed over (that would replace ``/dev/null`` or a
user's FIFO with a regular file): a character device (``/dev/null``, a terminal) or a FIFO with a reader is
written into directly; a FIFO without a reader (writing would block), a socket, a block device (a disk) or a
folder is refused.

A symlink is written through: the file it points to is replaced (the link stays a link). A file its owner protected
is never replaced: read-only by its mode bits (also for root, whom ``os.access`` lets write anything), or marked
immutable or append-only (``chattr +i``, ``+a``); a replaced file keeps its permission bits (and, for root, its owner).
Every error names the file asked for, never the temporary one.
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

from simtrain.report.output_checks import (  # noqa: F401 - check_replaceable and written_by_simtrain: imported from here too
    check_replaceable,
    check_writable,
    folder_problem,
    shown_path,
    special_target,
    write_target,
    written_by_simtrain,
)
from simtrain.spec.errors import InputError

#: files staged by the innermost ``staged_outputs`` block: (temporary file or a special file's data, the file it
#: replaces, the path the user asked for)
_STAGE: ContextVar[list[tuple[str | bytes, Path, Path]] | None] = ContextVar("simtrain_staged_outputs", default=None)


@contextmanager
def staged_outputs() -> Iterator[None]:
    """Files written inside the block land together: each goes to a temporary file beside its target, and
    all are renamed only when the block ends without an error, so an interrupted command leaves all of its
    outputs or none (never a new chart beside an old report). Blocks nest: the outermost one commits."""
    if _STAGE.get() is not None:   # inside another block: its end commits these files too
        yield
        return
    pending: list[tuple[str | bytes, Path, Path]] = []
    token = _STAGE.set(pending)
    try:
        yield
    except BaseException:
        for tmp, _, _ in pending:
            _unlink(tmp)
        raise
    finally:
        _STAGE.reset(token)
    for done, (tmp, target, asked) in enumerate(pending):
        try:
            if isinstance(tmp, bytes):      # a device or FIFO: its data, written in at the end like a rename
                _write_special(target, tmp, asked)
            else:
                _rename(tmp, target, asked)
        except BaseException:
            for rest, _, _ in pending[done:]:
                _unlink(rest)
            raise


def _unlink(tmp: str | bytes) -> None:
    if isinstance(tmp, bytes):
        return
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass


def _write_special(path: Path, data: bytes, asked: Path | None = None) -> None:
    """Write ``data`` into an existing character device or FIFO, never replacing it. A FIFO is opened without
    blocking: with no reader at the other end the write could wait forever, so it is refused."""
    asked = path if asked is None else asked
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    except OSError as err:
        if err.errno == errno.ENXIO:
            raise InputError(f"cannot write '{asked}': it is a FIFO with no reader (start the reader first, or name "
                             "a regular file)") from None
        raise _of(err, asked) from None
    try:
        os.set_blocking(fd, True)
        with os.fdopen(fd, "wb", closefd=True) as fh:
            fd = -1
            fh.write(data)
            fh.flush()
    except OSError as err:      # /dev/full: "No space left on device", said of the file asked for
        raise _of(err, asked) from None
    finally:
        if fd >= 0:
            os.close(fd)


def write_output(path: str | Path, data: str | bytes) -> Path:
    """:func:`write_atomic` for a file a user named: refused where it would replace a file simtrain did not
    write (:func:`check_replaceable`) or one its owner protected (:func:`check_writable`)."""
    check_replaceable(path)
    return write_atomic(path, data)


def write_atomic(path: str | Path, data: str | bytes) -> Path:
    """Write ``data`` to ``path`` through a temporary file and a rename (inside ``staged_outputs``, the rename
    waits for the block's end). A symlink is written through (:func:`write_target`); a protected file is refused
    (:func:`check_writable`); a replaced file keeps its permission bits and, where the rights allow, its owner."""
    target = write_target(path)
    asked = Path(path)
    parent = target.parent if str(target.parent) else Path(".")
    special = special_target(target)
    problem = folder_problem(parent, creates=not special)
    if problem:
        raise InputError(f"cannot write {shown_path(asked, target)}: {problem}")
    if special:
        raw = data if isinstance(data, bytes) else data.encode("utf-8")
        stage = _STAGE.get()
        if stage is None:
            _write_special(target, raw, asked)
        else:
            stage.append((raw, target, asked))
        return asked
    check_writable(target)
    mode = "wb" if isinstance(data, bytes) else "w"
    try:
        fd, tmp = tempfile.mkstemp(prefix=_temp_prefix(target.name, parent), suffix=".tmp", dir=parent)
    except OSError as err:      # a read-only folder, /proc, a full disk: name the file asked for, not the temporary
        raise InputError(f"cannot write {shown_path(asked, target)}: {err.strerror} (simtrain writes a temporary file "
                         f"in '{parent}' and renames it over the target)") from None
    try:
        try:
            with os.fdopen(fd, mode, **({} if mode == "wb" else {"encoding": "utf-8"})) as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            _take_over_permissions(tmp, target)
        except OSError as err:  # a full disk, a quota, an I/O error: said of the file asked for
            raise _of(err, asked) from None
        stage = _STAGE.get()
        if stage is None:
            _rename(tmp, target, asked)
        else:
            stage.append((tmp, target, asked))
    except BaseException:
        _unlink(tmp)
        raise
    return asked


def _rename(tmp: str, target: Path, asked: Path) -> None:
    try:
        os.replace(tmp, target)
    except OSError as err:      # e.g. the target became immutable, or sits in a sticky folder and is another user's
        raise _of(err, asked) from None


def _of(err: OSError, asked: Path) -> OSError:
    """``err`` said of the file the user asked for (its errno kept for callers), not of a temporary file or of the
    file a symlink points to: the CLI prints 'error: FILE: REASON'."""
    return OSError(err.errno, err.strerror or str(err), str(asked))


def _take_over_permissions(tmp: str, target: Path) -> None:
    """Give the temporary file the permission bits of the file it replaces (a private report stays private), and
    for root its owner and group too; a new file gets 0666 less the umask, as ``open`` would give it."""
    try:
        st = os.stat(target)
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        return
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        mine = os.stat(tmp)
        if (st.st_uid, st.st_gid) != (mine.st_uid, mine.st_gid):
            try:
                os.chown(tmp, st.st_uid, st.st_gid)
            except OSError:     # root without the right (a user namespace, an NFS root squash): the new owner stays
                pass
    os.chmod(tmp, stat.S_IMODE(st.st_mode) & 0o777)


#: the bytes a temporary file adds to its target's name: '.', '.', mkstemp's 8 random characters, '.tmp'
_TEMP_EXTRA = 1 + 1 + 8 + 4


def _temp_prefix(name: str, parent: Path) -> str:
    """'.NAME.' for the temporary file beside NAME, NAME cut so that the whole name fits the folder's limit
    (NAME_MAX, 255 bytes on most file systems): a legal 255-byte target name still gets a temporary file."""
    try:
        limit = os.pathconf(parent, "PC_NAME_MAX")
    except (OSError, ValueError, AttributeError):
        limit = 255
    budget = max(limit - _TEMP_EXTRA, 1)
    while name and len(os.fsencode(name)) > budget:
        name = name[:-1]
    return f".{name}."


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
