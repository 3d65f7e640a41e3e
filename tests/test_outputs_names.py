"""Output names the audit found mishandled: an empty name exited 0 and wrote nothing (`run --json ''`, `--gantt ''`,
`compare --json ''`); `--json /dev/full` said "No space left on device" without the file; a file under a regular
file was called a missing folder; a legal 255-byte name was refused because the temporary '.NAME.XXXXXXXX.tmp'
beside it was longer than the file system allows."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from conftest import REPO, run_cli

from simtrain.report import outputs
from simtrain.spec.errors import InputError

SCENARIO = str(Path(__file__).resolve().parent / "bad_inputs" / "good" / "base.yaml")


@pytest.mark.parametrize(("args", "says"), [
    (["run", SCENARIO, "--json", ""], "error: --json was given an empty file name; give a file name"),
    (["memory", SCENARIO, "--json", ""], "error: --json was given an empty file name; give a file name"),
    (["compare", str(REPO / "scenarios" / "pp4_dp4.yaml"), "--json", ""],
     "error: --json was given an empty file name; give a file name"),
    (["run", SCENARIO, "--gantt", ""], "error: Invalid value for '--gantt': the file name is empty; give a file name"),
    (["run", SCENARIO, "--trace", ""], "error: Invalid value for '--trace': the file name is empty; give a file name"),
])
def test_an_empty_output_name_is_refused(tmp_path, capsys, monkeypatch, args, says):
    """An empty output name is bad input: exit 2, one line naming the option, nothing written (it exited 0)."""
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(args, capsys)
    assert (code, out, err) == (2, "", says + "\n")
    assert list(tmp_path.iterdir()) == []


def test_write_atomic_refuses_an_empty_name():
    """From Python an empty name is an InputError, not a write to '.'."""
    with pytest.raises(InputError, match="the file name is empty"):
        outputs.write_atomic("", "x")


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")
def test_a_full_device_is_named(capsys):
    """--json /dev/full: exit 2, one line that names /dev/full (it said only 'No space left on device')."""
    code, _, err = run_cli(["run", SCENARIO, "--json", "/dev/full"], capsys)
    assert (code, err) == (2, "error: /dev/full: No space left on device\n")


@pytest.mark.parametrize("below", ["x.json", "deeper/x.json"])
def test_a_file_where_a_folder_should_be_is_called_not_a_folder(tmp_path, capsys, below):
    """--json t.sh/x.json where t.sh is a regular file: 't.sh' is not a folder (it said the folder does not exist)."""
    (tmp_path / "t.sh").write_text("echo hi\n", encoding="utf-8")
    target = tmp_path / "t.sh" / below
    code, _, err = run_cli(["run", SCENARIO, "--json", str(target)], capsys)
    assert (code, err) == (2, f"error: --json {target}: '{tmp_path / 't.sh'}' is not a folder\n")


def test_write_atomic_says_not_a_folder_too(tmp_path):
    (tmp_path / "t.sh").write_text("echo hi\n", encoding="utf-8")
    with pytest.raises(InputError, match=r"'.*t\.sh' is not a folder"):
        outputs.write_atomic(tmp_path / "t.sh" / "x.json", "x")


@pytest.mark.skipif(sys.platform == "win32", reason="NAME_MAX is a POSIX limit")
def test_a_name_of_the_longest_legal_length_is_written(tmp_path, capsys, monkeypatch):
    """A 255-byte name (250 letters and '.html', the ext4/xfs/tmpfs NAME_MAX) is written: the temporary name is
    cut to fit; nothing else is left in the folder."""
    if os.pathconf(tmp_path, "PC_NAME_MAX") != 255:
        pytest.skip("the test folder's file system does not allow 255-byte names")
    monkeypatch.chdir(tmp_path)
    name = "b" * 250 + ".html"
    assert len(name.encode()) == 255
    code, _, err = run_cli(["run", SCENARIO, "--gantt", name], capsys)
    assert code == 0, err
    assert [p.name for p in tmp_path.iterdir()] == [name]
    assert (tmp_path / name).read_bytes().startswith(b"<!DOCTYPE html>")


@pytest.mark.skipif(sys.platform == "win32", reason="NAME_MAX is a POSIX limit")
def test_a_long_name_in_utf8_is_cut_by_bytes_not_characters(tmp_path):
    """125 'é' (250 bytes in UTF-8) and '.json', 255 bytes in all: the temporary name is cut by bytes (a cut by
    characters would leave it 14 bytes too long); the file is written and nothing else is left."""
    if os.pathconf(tmp_path, "PC_NAME_MAX") != 255:
        pytest.skip("the test folder's file system does not allow 255-byte names")
    name = "é" * 125 + ".json"
    assert len(name.encode()) == 255
    outputs.write_json(tmp_path / name, {"new": 1})
    assert [p.name for p in tmp_path.iterdir()] == [name]


def test_an_output_under_a_symlink_loop_names_the_option_and_the_folder(tmp_path, capsys, monkeypatch):
    """loop -> loop: --json loop/x.json is refused naming the option and why the folder cannot be reached (the
    review found the device check, moved first, letting the OSError out unexplained)."""
    monkeypatch.chdir(tmp_path)
    os.symlink("loop", "loop")
    code, out, err = run_cli(["run", SCENARIO, "--json", "loop/x.json"], capsys)
    assert code == 2 and out == "", err
    assert err.startswith("error: --json loop/x.json: folder 'loop' cannot be reached: "), err
