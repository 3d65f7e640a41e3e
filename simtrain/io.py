"""Writing files safely: a temporary file beside the target, then an atomic rename,
so an interrupted run never leaves half a report, trace or chart on disk."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from simtrain.errors import InputError


def write_atomic(path: str | Path, data: str | bytes) -> Path:
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
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return path


def dumps_json(obj: Any) -> str:
    """Canonical JSON: sorted keys, fixed separators, so equal inputs give byte-identical files."""
    return json.dumps(obj, sort_keys=True, indent=1, ensure_ascii=False, allow_nan=False) + "\n"


def write_json(path: str | Path, obj: Any) -> Path:
    return write_atomic(path, dumps_json(obj))
