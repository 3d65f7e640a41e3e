"""Whether a file may be written, before anything is: the file a path lands in (a symlink is written through),
the folder it needs, and the files simtrain never replaces (another program's file, a device, a folder, a file its
owner protected). :mod:`simtrain.report.outputs` writes; this module only looks.
"""

from __future__ import annotations

import os
import stat
import struct
import sys
from pathlib import Path

from simtrain.spec.errors import InputError, display_path


def special_target(path: str | Path) -> str | None:
    """What kind of existing non-regular file ``path`` names (following symlinks): 'device', 'fifo', or the
    reason it is refused; None for a regular file or no file."""
    try:
        mode = os.stat(path).st_mode
    except OSError:      # none yet, or unreachable (a loop, no search right): folder_problem says which
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


def folder_problem(folder: str | Path, creates: bool = True) -> str | None:
    """Why no file can be made in ``folder``, as the end of a sentence ("folder 'out' does not exist", "'t.sh' is
    not a folder"); None when it is a folder. ``creates=False`` (an existing device or FIFO, written in place, as
    /dev/null) asks only that the folder exist, not that a file can be made in it."""
    folder = str(folder) or "."
    try:
        if not stat.S_ISDIR(os.stat(folder).st_mode):
            return f"'{folder}' is not a folder"
        if not creates:
            return None
        if _inode_flags(Path(folder)) & _FS_IMMUTABLE_FL:
            return f"folder '{folder}' is marked immutable (chattr +i): no file can be made in it"
        if not os.access(folder, os.W_OK | os.X_OK):
            return f"folder '{folder}' is not writable to this user"
        return None
    except (FileNotFoundError, NotADirectoryError):
        pass
    except OSError as err:     # a folder above it without search permission, a symlink loop
        return f"folder '{folder}' cannot be reached: {err.strerror}"
    above = folder
    while True:                # the nearest existing path above it: a file there is what stops the folder
        up = os.path.dirname(above.rstrip(os.sep)) if above.rstrip(os.sep) else above
        if up in ("", above):
            break
        above = up
        if os.path.lexists(above):
            if not os.path.isdir(above):
                return f"'{above}' is not a folder"
            break
    return f"folder '{folder}' does not exist"


def write_target(path: str | Path) -> Path:
    """The file a write to ``path`` replaces: ``path`` itself, or for a symlink the file it points to (at the end of
    a chain of links, which may not exist yet), so that the link is kept and what it points to is written."""
    if os.fspath(path) == "":
        raise InputError("cannot write '': the file name is empty; name a file")
    path = Path(path)
    if not os.path.islink(path):
        return path
    try:
        os.stat(path)
    except FileNotFoundError:
        pass                   # a dangling link: the file it points to is made, as a shell's '>' would
    except OSError as err:
        raise InputError(f"cannot write '{path}': it is a symlink that cannot be followed ({err.strerror})") from None
    return Path(os.path.realpath(path))


def shown_path(asked: Path, target: Path) -> str:
    """The file asked for, quoted, and where a symlink leads: "'link.json' (a symlink to 'store/real.json')"."""
    return f"'{asked}'" if asked == target else f"'{asked}' (a symlink to '{display_path(target)}')"


#: Linux inode flags (``chattr``): the file cannot be changed, renamed over or unlinked (``+i``), or only appended to
#: (``+a``); read with FS_IOC_GETFLAGS, _IOR('f', 1, long) (linux/fs.h)
_FS_IMMUTABLE_FL, _FS_APPEND_FL = 0x10, 0x20
_FS_IOC_GETFLAGS = (2 << 30) | (struct.calcsize("l") << 16) | (ord("f") << 8) | 1


def _inode_flags(path: Path) -> int:
    """The file's ``chattr`` flags, 0 where they cannot be read (not Linux, a file system without them)."""
    if not sys.platform.startswith("linux"):
        return 0
    import fcntl

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return 0
    try:
        return struct.unpack("i", fcntl.ioctl(fd, _FS_IOC_GETFLAGS, bytes(8))[:4])[0]
    except OSError:
        return 0
    finally:
        os.close(fd)


def check_writable(path: str | Path) -> None:
    """Refuse to replace an existing regular file its owner protected: read-only by its mode bits (no write bit
    for anyone; root passes ``os.access`` on any file, so the bits are read too) or by access rights, or marked
    immutable or append-only. A symlink is judged by the file it points to."""
    asked = Path(path)
    target = write_target(path)
    try:
        st = os.stat(target)
    except OSError:
        return                 # no file yet (or none reachable: the write says why)
    if not stat.S_ISREG(st.st_mode):
        return
    flags = _inode_flags(target)       # first: os.access says "not writable" of an immutable file too
    if flags & _FS_IMMUTABLE_FL:
        why = "it is marked immutable (chattr +i)"
    elif flags & _FS_APPEND_FL:
        why = "it is marked append-only (chattr +a)"
    elif st.st_mode & 0o222 == 0:
        why = f"it is read-only (mode {stat.S_IMODE(st.st_mode):04o})"
    elif not os.access(target, os.W_OK):
        why = f"it is read-only to this user (mode {stat.S_IMODE(st.st_mode):04o}, owner uid {st.st_uid})"
    else:
        return
    raise InputError(f"cannot write {shown_path(asked, target)}: {why}, and simtrain never replaces a file its "
                     "owner protected; make it writable or name another file")


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
    check_writable(path)
    try:
        ours = written_by_simtrain(path, header)
    except OSError as err:
        raise InputError(f"cannot write '{path}': {err.strerror}") from None
    if not ours:
        raise InputError(f"cannot write '{path}': it exists and is not a file simtrain wrote (a report, chart, trace "
                         "or table), and simtrain never replaces another program's file; remove it or name another "
                         "file")


