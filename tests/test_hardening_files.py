"""Files are never destroyed (issue 26, deliverable 3): special targets are written into or refused, never
replaced; an output naming one of the run's inputs is refused; one sweep table has one writer at a time, and a
sweep's summary describes its own rows only."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import run_cli

CORPUS = Path(__file__).resolve().parent / "bad_inputs"
GOOD = CORPUS / "good"
POSIX = pytest.mark.skipif(sys.platform == "win32", reason="devices, FIFOs and flock are POSIX")


@pytest.fixture
def folder(tmp_path, monkeypatch) -> Path:
    """A copy of the good base scenario with its hardware and model files, as the working folder."""
    for name in ("base.yaml", "hw.yaml", "model.yaml"):
        shutil.copy(GOOD / name, tmp_path / name)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@POSIX
def test_json_to_dev_null_keeps_the_device(folder, capsys):
    """`--json /dev/null` writes into the device: /dev/null stays a character device (run as root too)."""
    code, out, err = run_cli(["run", "base.yaml", "--json", "/dev/null"], capsys)
    assert code == 0, err
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)
    assert "step time" in out


@POSIX
def test_a_fifo_with_a_reader_receives_the_report(folder, capsys):
    """A FIFO the user made to receive the report gets the JSON and stays a FIFO."""
    fifo = folder / "report.json"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()
    deadline = time.monotonic() + 10
    code = None
    while time.monotonic() < deadline:       # the reader must have opened its end first
        code, _, err = run_cli(["run", "base.yaml", "--json", str(fifo)], capsys)
        if code == 0:
            break
        time.sleep(0.05)
    reader.join(timeout=10)
    assert code == 0, err
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert got and got[0].startswith(b"{") and b'"step_time_s"' in got[0]


@POSIX
def test_a_fifo_without_a_reader_is_refused_not_replaced(folder, capsys):
    """With no reader a write to a FIFO would block forever: exit 2 naming it, and it stays a FIFO."""
    fifo = folder / "report.json"
    os.mkfifo(fifo)
    code, _, err = run_cli(["run", "base.yaml", "--json", str(fifo)], capsys)
    assert code == 2 and "is a FIFO with no reader" in err
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert sorted(p.name for p in folder.iterdir()) == ["base.yaml", "hw.yaml", "model.yaml", "report.json"]


@POSIX
def test_a_socket_is_refused_before_the_run(folder, capsys):
    """A socket at the output path is refused up front (exit 2) and left in place."""
    import socket

    sock = socket.socket(socket.AF_UNIX)
    try:
        sock.bind("s.json")
        code, out, err = run_cli(["run", "base.yaml", "--json", "s.json"], capsys)
    finally:
        sock.close()
    assert code == 2 and "it is a socket" in err and out == ""
    assert stat.S_ISSOCK(os.stat("s.json").st_mode)


@POSIX
def test_a_sweep_table_must_be_a_regular_file(folder, capsys):
    """A sweep table is appended to and read back: a FIFO at --out is refused, and stays a FIFO."""
    os.mkfifo("t.csv")
    code, _, err = run_cli(["sweep", "base.yaml", "--grid", "training.micro_batch=1,2", "--out", "t.csv",
                            "--workers", "1"], capsys)
    assert code == 2 and "is a device or FIFO" in err
    assert stat.S_ISFIFO(os.stat("t.csv").st_mode)


@pytest.mark.parametrize("args", [["run", "base.yaml", "--json", "hw.yaml"],
                                  ["run", "base.yaml", "--trace", "model.yaml"],
                                  ["run", "base.yaml", "--json", "base.yaml"],
                                  ["memory", "base.yaml", "--json", "model.yaml"],
                                  ["compare", "base.yaml", "--json", "hw.yaml"]])
def test_an_output_naming_an_input_is_refused(folder, capsys, args):
    """An output option that names the scenario, its hardware or its model file is refused; the file is intact."""
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    code, _, err = run_cli(args, capsys)
    assert code == 2 and "is one of this run's input files" in err, err
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before


def test_a_symlink_to_an_input_is_that_input(folder, capsys):
    """A link to the model file is the model file: refused as an output."""
    if sys.platform == "win32":
        pytest.skip("symlinks need privileges on Windows")
    os.symlink("model.yaml", "link.json")
    code, _, err = run_cli(["run", "base.yaml", "--json", "link.json"], capsys)
    assert code == 2 and "is one of this run's input files" in err
    assert (folder / "model.yaml").read_text() == (GOOD / "model.yaml").read_text()


def test_plot_refuses_to_overwrite_its_report(folder, capsys):
    """`simtrain plot r.json --trace r.json` would replace the report it draws: refused."""
    assert run_cli(["run", "base.yaml", "--json", "r.json"], capsys)[0] == 0
    before = (folder / "r.json").read_bytes()
    code, _, err = run_cli(["plot", "r.json", "--trace", "r.json"], capsys)
    assert code == 2 and "is one of this run's input files" in err
    assert (folder / "r.json").read_bytes() == before


@POSIX
def test_a_second_sweep_on_one_table_is_refused_naming_it(folder, capsys):
    """While one process holds a sweep table, a second sweep on it exits 2 naming the table and the holder."""
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom simtrain.decide.table_lock import table_lock\n"
         "with table_lock('t.csv'):\n    print('locked', flush=True)\n    time.sleep(60)\n"],
        stdout=subprocess.PIPE, text=True, cwd=folder)
    try:
        assert holder.stdout.readline().strip() == "locked"
        code, _, err = run_cli(["sweep", "base.yaml", "--grid", "training.micro_batch=1,2", "--out", "t.csv",
                                "--workers", "1"], capsys)
    finally:
        holder.kill()
        holder.wait(timeout=10)
    assert code == 2, err
    assert err.strip() == (f"error: cannot write 't.csv': another sweep is writing it (locked by process {holder.pid} "
                           "in t.csv.lock); wait for it to end, or use another --out file")
    assert not (folder / "t.csv").exists()
    # the holder was killed: the kernel released its lock, so the next sweep runs
    code, _, err = run_cli(["sweep", "base.yaml", "--grid", "training.micro_batch=1,2", "--out", "t.csv",
                            "--workers", "1"], capsys)
    assert code == 0, err
    assert not (folder / "t.csv.lock").exists()


def test_a_resume_summarises_its_own_grid_only(folder, capsys):
    """A resume into a table holding another grid's rows counts and ranks its own points only: the other
    sweep's rows (micro_batch 1, 2) stay in the file but are not this sweep's (micro_batch 4)."""
    base = ["sweep", "base.yaml", "--out", "t.csv", "--workers", "1"]
    assert run_cli([*base, "--grid", "training.micro_batch=1,2"], capsys)[0] == 0
    code, out, err = run_cli([*base, "--grid", "training.micro_batch=4", "--resume"], capsys)
    assert code == 0, err
    assert "1 point: 1 simulated, 0 invalid or failed, 0 already done" in out
    assert "best (fits in memory): training.micro_batch=4:" in out
    assert len((folder / "t.csv").read_text().splitlines()) == 1 + 3


def test_the_returned_table_is_the_one_this_sweep_wrote(folder, monkeypatch):
    """sweep_to_file returns the rows it wrote itself: replacing the file after it was written (what a second
    writer would do) does not change what the sweep reports."""
    from simtrain.decide import sweep_files
    from simtrain.spec.scenario import load_scenario

    real = sweep_files.write_atomic

    def then_replaced(path, data):
        out = real(path, data)
        if Path(path).name == "t.jsonl" and isinstance(data, str) and data:
            Path(path).write_text('{"training.micro_batch": 99}\n')    # someone else's rows
        return out

    monkeypatch.setattr(sweep_files, "write_atomic", then_replaced)
    frame = sweep_files.sweep_to_file(load_scenario("base.yaml"), {"training.micro_batch": [1, 2]}, "t.jsonl",
                                      workers=1, progress=False)
    assert list(frame["training_micro_batch"]) == [1, 2]


@pytest.mark.parametrize("name,content", [("t.parquet", b"training.micro_batch,step_time_s\n1,2\n"),
                                          ("t.csv", b"\xff\xfe\x00binary\x00"),
                                          ("t.jsonl", b"[1, 2, 3]\n"),
                                          ("t.jsonl", b"a,b,c\n1,2,3\n")])
def test_resume_into_a_table_that_is_not_its_extension(folder, capsys, name, content):
    """--resume into a file that is not the table its extension says: exit 2 naming it, the file unchanged."""
    if name.endswith(".parquet"):
        pytest.importorskip("pyarrow")
    (folder / name).write_bytes(content)
    code, _, err = run_cli(["sweep", "base.yaml", "--grid", "training.micro_batch=1,2", "--out", name, "--resume",
                            "--workers", "1"], capsys)
    assert code == 2, err
    assert err.startswith(f"error: {name}: cannot resume: it is not a") and len(err.strip().splitlines()) == 1
    assert (folder / name).read_bytes() == content


@pytest.mark.parametrize("name, edit, says", [
    ("t.csv", ("step_time_s", "1e999"), "row 1: step_time_s holds '1e999', not a finite number >= 0"),
    ("t.csv", ("tokens_per_s", "-5"), "row 1: tokens_per_s holds '-5', not a finite number >= 0"),
    ("t.csv", ("mfu", "nan"), "row 1: mfu holds 'nan', not a finite number >= 0"),
    ("t.jsonl", ("step_time_s", float("nan")), "row 1: step_time_s holds nan, not a finite number >= 0"),
    ("t.jsonl", ("step_time_s", float("inf")), "row 1: step_time_s holds inf, not a finite number >= 0"),
])
def test_resume_refuses_an_edited_metric(folder, capsys, name, edit, says):
    """--resume keeps the rows already written and ranks them with the new ones: a metric edited to infinity, NaN
    or a negative value is refused, naming the row and column (the audit found 'best: inf s per step' at exit 0);
    the file is left as it was."""
    import csv
    import json

    args = ["sweep", "base.yaml", "--grid", "training.micro_batch=1,2", "--out", name, "--workers", "1"]
    assert run_cli(args, capsys)[0] == 0
    path = folder / name
    column, value = edit
    if name.endswith(".csv"):
        rows = list(csv.reader(path.open(newline="")))
        rows[1][rows[0].index(column)] = value
        with path.open("w", newline="") as fh:
            csv.writer(fh).writerows(rows)
    else:
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        rows[0][column] = value
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    before = path.read_bytes()
    code, _, err = run_cli([*args, "--resume"], capsys)
    assert code == 2, err
    assert err.startswith(f"error: {name}: cannot resume: it is not a") and says in err
    assert len(err.strip().splitlines()) == 1 and path.read_bytes() == before
