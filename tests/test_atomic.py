"""Nothing lost (issue 8, deliverable 5): reports, charts and traces are written to a temporary file
and renamed over the target, so an interrupted write leaves the old file or none, never half a file.

Two kinds of interruption: an exception in the middle of ``simtrain.report.outputs.write_atomic`` (disk full
while flushing), and ``SIGKILL`` of a real ``simtrain run`` process while it is inside the write.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import run_cli

from simtrain.report import outputs as simtrain_io

SCENARIO = Path(__file__).resolve().parent / "bad_inputs" / "good" / "base.yaml"
OLD = '{\n "old": "report"\n}\n'   # an earlier simtrain report, in dumps_json's canonical form


def _leftovers(folder: Path, target: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name != target.name)


def test_exception_mid_write_keeps_the_old_file(tmp_path, monkeypatch):
    """If writing fails after the temporary file was filled, the target keeps its old bytes and
    the temporary file is removed."""
    target = tmp_path / "report.json"
    target.write_text(OLD, encoding="utf-8")

    def full_disk(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(simtrain_io.os, "fsync", full_disk)
    with pytest.raises(OSError):
        simtrain_io.write_json(target, {"new": list(range(1000))})
    assert target.read_text(encoding="utf-8") == OLD
    assert _leftovers(tmp_path, target) == []


def test_interrupt_mid_write_leaves_no_file(tmp_path, monkeypatch):
    """A Ctrl-C during the write of a new file leaves no file at all (not an empty or partial one)."""
    target = tmp_path / "trace.json"

    def interrupted(src, dst):
        raise KeyboardInterrupt

    monkeypatch.setattr(simtrain_io.os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        simtrain_io.write_atomic(target, "x" * 100_000)
    assert not target.exists()
    assert _leftovers(tmp_path, target) == []


@pytest.mark.parametrize("option", ["--json", "--gantt", "--trace", "--memory-plot"])
def test_cli_outputs_go_through_write_atomic(tmp_path, monkeypatch, capsys, option):
    """Every file `simtrain run` writes is written atomically: with the disk full at the flush, the
    old file survives, no temporary file is left and the CLI says so in one line naming the file (exit 2)."""
    if option != "--json":
        pytest.importorskip("simtrain.report.charts")
    target = tmp_path / ("out.json" if option in ("--json", "--trace") else "out.html")
    target.write_text(OLD, encoding="utf-8")

    def full_disk(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full_disk)
    code, _, err = run_cli(["run", str(SCENARIO), option, str(target)], capsys)
    assert code == 2, err
    assert err.strip() == f"error: {target}: No space left on device"
    assert target.read_text(encoding="utf-8") == OLD
    assert _leftovers(tmp_path, target) == []


_CHILD = """
import os, sys, time
from pathlib import Path
import simtrain.report.outputs

ready = Path(sys.argv[1])
real_fsync = os.fsync

def slow_fsync(fd):
    # the report is in the temporary file but not yet renamed: tell the parent, then wait to be killed
    ready.write_text("inside write_atomic")
    time.sleep(60)
    real_fsync(fd)

simtrain.report.outputs.os.fsync = slow_fsync
from simtrain.cli import main
main(sys.argv[2:])
"""


@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL is POSIX")
@pytest.mark.parametrize("existing", [True, False], ids=["old-file", "no-file"])
def test_sigkill_during_write_leaves_old_file_or_none(tmp_path, existing):
    """SIGKILL of `simtrain run --json` while the report is half-way through write_atomic leaves the
    old report (or no report), never a partial one at the target path."""
    target = tmp_path / "out" / "report.json"
    target.parent.mkdir()
    if existing:
        target.write_text(OLD, encoding="utf-8")
    ready = tmp_path / "ready"
    proc = subprocess.Popen([sys.executable, "-c", _CHILD, str(ready), "run", str(SCENARIO), "--json", str(target)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert proc.poll() is None, proc.stderr.read().decode()
            assert time.monotonic() < deadline, "the child never reached write_atomic"
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGKILL
    if existing:
        assert target.read_text(encoding="utf-8") == OLD
    else:
        assert not target.exists()
    # A killed process cannot delete its temporary file; it is hidden ('.report.json.*.tmp') and whole
    # or partial, but it is never at the target path.
    for name in _leftovers(target.parent, target):
        assert name.startswith(".report.json.") and name.endswith(".tmp"), name


@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL is POSIX")
def test_sigkill_at_random_moments_never_leaves_a_partial_report(tmp_path, simtrain_exe):
    """Killing `simtrain run --json` at several moments (start-up, simulation, writing) leaves either
    the old report or a complete new one: the target always holds valid JSON."""
    target = tmp_path / "report.json"
    target.write_text(OLD, encoding="utf-8")
    # measured once: how long a full run takes here, so the kills spread over its whole length
    start = time.monotonic()
    subprocess.run([*simtrain_exe, "run", str(SCENARIO), "--json", str(tmp_path / "probe.json")],
                   capture_output=True, check=True, timeout=120)
    length = time.monotonic() - start
    for fraction in (0.3, 0.6, 0.8, 0.9, 0.95, 1.0):
        proc = subprocess.Popen([*simtrain_exe, "run", str(SCENARIO), "--json", str(target)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(length * fraction)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        data = json.loads(target.read_text(encoding="utf-8"))      # never a partial file
        assert data == json.loads(OLD) or data["scenario"] == "base"


def test_one_run_writes_all_its_outputs_or_none(tmp_path, monkeypatch, capsys):
    """`simtrain run --gantt g.html --json r.json` interrupted while the report is written (after the chart):
    neither file changes, so a new chart never sits beside an old report, and no temporary file is left."""
    pytest.importorskip("simtrain.report.charts")
    gantt, report = tmp_path / "g.html", tmp_path / "r.json"
    gantt.write_text(OLD, encoding="utf-8")
    report.write_text(OLD, encoding="utf-8")

    def interrupted(obj):
        raise KeyboardInterrupt

    monkeypatch.setattr(simtrain_io, "dumps_json", interrupted)
    code, _, err = run_cli(["run", str(SCENARIO), "--gantt", str(gantt), "--json", str(report)], capsys)
    assert code == 130, err
    assert gantt.read_text(encoding="utf-8") == OLD and report.read_text(encoding="utf-8") == OLD
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g.html", "r.json"]


def test_staged_outputs_land_together(tmp_path):
    """Inside staged_outputs nothing reaches its target until the block ends; then every file does."""
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    with simtrain_io.staged_outputs():
        simtrain_io.write_atomic(a, "A")
        simtrain_io.write_atomic(b, "B")
        assert not a.exists() and not b.exists()
    assert (a.read_text(), b.read_text()) == ("A", "B")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "b.txt"]


def test_an_output_in_a_missing_folder_is_refused_before_simulating(tmp_path, capsys):
    """--json into a folder that does not exist: exit 2 at once, naming the option and the folder."""
    code, _, err = run_cli(["run", str(SCENARIO), "--json", str(tmp_path / "nope" / "r.json")], capsys)
    assert code == 2
    assert "--json" in err and "folder" in err and "nope" in err and "does not exist" in err


def test_a_failed_rename_leaves_no_temporary_file(tmp_path, monkeypatch):
    """If the second of two staged renames fails, the first file is in place (renames are not undone) and the
    second's temporary file is removed."""
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    real = os.replace
    calls = []

    def second_fails(src, dst):
        calls.append(dst)
        if len(calls) == 2:
            raise OSError(errno.EIO, "I/O error")
        real(src, dst)

    monkeypatch.setattr(simtrain_io.os, "replace", second_fails)
    with pytest.raises(OSError):
        with simtrain_io.staged_outputs():
            simtrain_io.write_atomic(a, "A")
            simtrain_io.write_atomic(b, "B")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt"]


def test_staged_blocks_nest_and_the_outermost_commits(tmp_path):
    """An inner block does not commit on its own: a failure after it in the outer block leaves neither file."""
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    with pytest.raises(RuntimeError):
        with simtrain_io.staged_outputs():
            with simtrain_io.staged_outputs():
                simtrain_io.write_atomic(a, "A")
            simtrain_io.write_atomic(b, "B")
            raise RuntimeError("after the inner block")
    assert list(tmp_path.iterdir()) == []


def test_a_closed_stdout_does_not_take_the_files_back(tmp_path, monkeypatch, capsys):
    """The text is printed after the files are in place: if printing fails (a closed pipe), the chart stays."""
    pytest.importorskip("simtrain.report.charts")
    import simtrain.cli.commands_core as core

    def closed_pipe(*args, **kwargs):
        raise BrokenPipeError(errno.EPIPE, "Broken pipe")

    monkeypatch.setattr(core, "emit", closed_pipe)
    gantt = tmp_path / "g.html"
    run_cli(["run", str(SCENARIO), "--gantt", str(gantt)], capsys)
    assert gantt.read_text(encoding="utf-8").lstrip().lower().startswith("<!doctype html")
