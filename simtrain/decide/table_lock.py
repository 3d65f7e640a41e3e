"""One writer per sweep table: a lock beside the table, ``<out>.lock``, held while a sweep writes it.

Two sweeps writing one ``--out`` would interleave and replace each other's rows, and each would then summarise a
table it did not write. The second is refused instead (exit 2, naming the table and the process holding it).

The lock is an advisory ``flock`` on the lock file: the kernel releases it when the holder exits, however it
ends (Ctrl-C, SIGTERM, SIGKILL, a crash), so a stale lock file never blocks the next sweep. The file is removed
when the sweep ends; a process that locked a file which was removed meanwhile (it raced that removal) sees that
its lock file is no longer the one at the path and tries again. Where ``fcntl`` does not exist (Windows) there
is no lock.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from simtrain.spec.errors import InputError, display_path

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None


def lock_path(table: str | Path) -> Path:
    table = Path(table)
    return table.with_name(table.name + ".lock")


@contextmanager
def table_lock(table: str | Path) -> Iterator[None]:
    """Hold ``<table>.lock`` for the block, or raise InputError if another process holds it."""
    if fcntl is None:  # pragma: no cover - Windows
        yield
        return
    path = lock_path(table)
    _refuse_a_foreign_file(path)
    for _ in range(10):          # a holder removing the file as we open it: open the new one
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 64).decode("ascii", "replace").strip()
            os.close(fd)
            by = f" by process {holder}" if holder.isdigit() else ""
            raise InputError(f"cannot write '{display_path(table)}': another sweep is writing it (locked{by} in "
                             f"{display_path(path)}); wait for it to end, or use another path") from None
        except BaseException:
            os.close(fd)
            raise
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    else:  # pragma: no cover - ten races in a row
        raise InputError(f"cannot lock '{display_path(path)}': it keeps being removed by another process")
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode("ascii"))
        yield
    finally:
        try:
            os.unlink(path)      # while still holding the lock, so no one holds a lock on a removed file unknowingly
        except FileNotFoundError:
            pass
        os.close(fd)


def _refuse_a_foreign_file(path: Path) -> None:
    """A lock file holds the holder's process id (or nothing, in the instant before it is written); anything else at
    that path is another program's file, which the sweep would truncate and remove: refused."""
    try:
        mode = os.stat(path).st_mode
    except OSError:     # none there; or a symlink loop, a name too long: the lock's own open says what
        return
    if not stat.S_ISREG(mode):      # a FIFO would block the read below, a device or folder is no lock file
        raise InputError(f"cannot lock '{display_path(path)}': it exists and is not a regular file (a sweep's lock "
                         "file is one); remove it or use another --out")
    with open(path, "rb") as fh:
        head = fh.read(64)
    if head.strip() and not head.strip().isdigit():
        raise InputError(f"cannot lock '{display_path(path)}': it exists and is not a sweep's lock file (it holds "
                         "no process id), and simtrain never replaces another program's file; remove it or use "
                         "another --out")
