"""Writing files safely: a temporary file beside the target, then an atomic rename,
so an interrupted run never leaves half a report, trace or chart on disk."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from simtrain.spec.errors import InputError

_STAGE: ContextVar[list[tuple[str, Path]] | None] = ContextVar("simtrain_staged_outputs", default=None)


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
            os.replace(tmp, path)
        except BaseException:
            for rest, _ in pending[done:]:
                _unlink(rest)
            raise


def _unlink(tmp: str) -> None:
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass


def write_atomic(path: str | Path, data: str | bytes) -> Path:
    """Write ``data`` to ``path`` through a temporary file and a rename (inside ``staged_outputs``, the rename
    waits for the block's end)."""
    path = Path(path)
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise InputError(f"cannot write '{path}': folder '{parent}' does not exist")
    mode = "wb" if isinstance(data, bytes) else "w"
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=parent)
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


def dumps_json(obj: Any) -> str:
    """Canonical JSON: sorted keys, fixed separators, so equal inputs give byte-identical files."""
    return json.dumps(obj, sort_keys=True, indent=1, ensure_ascii=False, allow_nan=False) + "\n"


def write_json(path: str | Path, obj: Any) -> Path:
    return write_atomic(path, dumps_json(obj))
