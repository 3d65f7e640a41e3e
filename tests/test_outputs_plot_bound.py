"""`simtrain plot` reads a report of at most 64 MiB (simtrain.report.charts.MAX_REPORT_BYTES): an audit's 191 MB
report (200,000 copies of one lane) took 58 s and 2.29 GB to draw, and /dev/zero was read without end. The largest
report a run writes at the default simulation.max_events measured 30.2 MB (docs/visualization.md)."""

from __future__ import annotations

import os
import sys
import threading

import pytest
from conftest import run_cli

from simtrain.report import charts

MIB = 2**20


def test_a_report_over_64_mib_is_refused_naming_its_size_and_the_cap(tmp_path, capsys):
    """A 65 MiB report: exit 2, one line with the file, its size (65.0 MiB) and the cap (64 MiB), no chart
    written. One of exactly 64 MiB is read (here it is not JSON, and that is what is said)."""
    big = tmp_path / "big.json"
    with open(big, "wb") as fh:          # sparse: nothing is written to the disk
        fh.truncate(65 * MIB)
    code, out, err = run_cli(["plot", str(big), "--gantt", str(tmp_path / "g.html")], capsys)
    assert (code, out) == (2, "")
    assert err == (f"error: {big}: the report is 65.0 MiB, more than the 64 MiB simtrain plot reads (the largest "
                   "report a run writes is about 30 MB); draw the charts in the run itself with simtrain run "
                   "--gantt/--trace\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big.json"]

    with open(big, "r+b") as fh:
        fh.truncate(64 * MIB)
    code, _, err = run_cli(["plot", str(big), "--gantt", str(tmp_path / "g.html")], capsys)
    assert code == 2 and "not a JSON report" in err and "MiB" not in err, err


@pytest.mark.skipif(sys.platform == "win32" or not hasattr(os, "mkfifo"), reason="needs a FIFO")
def test_a_report_without_a_size_is_read_no_further_than_the_cap(tmp_path, capsys, monkeypatch):
    """A FIFO (like /dev/zero, it has no size to look at first) feeding more than the cap is refused once the cap
    is passed, not read to its end; the cap is lowered to 1 MiB here to keep the test small."""
    monkeypatch.setattr(charts, "MAX_REPORT_BYTES", MIB, raising=False)
    fifo = tmp_path / "r.json"
    os.mkfifo(fifo)

    def feed():
        with open(fifo, "wb") as fh:
            fh.write(b" " * (MIB + 1))

    writer = threading.Thread(target=feed, daemon=True)
    writer.start()
    try:
        code, out, err = run_cli(["plot", str(fifo), "--gantt", str(tmp_path / "g.html")], capsys)
    finally:
        writer.join(timeout=10)
    assert (code, out) == (2, "")
    assert err == (f"error: {fifo}: the report is more than the 1 MiB simtrain plot reads (the largest report a run "
                   "writes is about 30 MB); draw the charts in the run itself with simtrain run --gantt/--trace\n")


@pytest.mark.skipif(sys.platform == "win32" or not hasattr(os, "mkfifo"), reason="needs a FIFO")
def test_a_fifo_without_a_writer_does_not_block(tmp_path, capsys, monkeypatch):
    """A FIFO nobody writes: plot waits charts.PIPE_WAIT_S (0.2 s here) for its first bytes and refuses it, where
    open() waited for a writer for ever (found by review). Run in a thread joined with a timeout, so a regression
    fails instead of hanging the suite."""
    monkeypatch.setattr(charts, "PIPE_WAIT_S", 0.2)
    fifo = tmp_path / "r.json"
    os.mkfifo(fifo)
    result = {}
    thread = threading.Thread(target=lambda: result.update(
        done=run_cli(["plot", str(fifo), "--gantt", str(tmp_path / "g.html")], capsys)), daemon=True)
    thread.start()
    thread.join(timeout=20)
    assert "done" in result, "plot blocked on a FIFO without a writer"
    code, out, err = result["done"]
    assert (code, out) == (2, "")
    assert err == f"error: {fifo}: is a pipe nobody wrote a report into within 0.2 s; give a report file\n"
