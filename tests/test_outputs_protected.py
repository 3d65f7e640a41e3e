"""A file its owner protected is never replaced, and a symlink is written through (simtrain.report.outputs): an
audit found `chmod 444 keep.json` replaced (exit 0, mode back to 0644: a rename ignores the target's mode), a
symlinked report replaced by a regular file (the link lost, its target stale) and, for `chattr +i`, an error that
named simtrain's temporary file ('.keep.json._dlm9_00.tmp') instead of the user's."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import run_cli

from simtrain.report import outputs
from simtrain.spec.errors import InputError

SCENARIO = str(Path(__file__).resolve().parent / "bad_inputs" / "good" / "base.yaml")
OLD = '{\n "old": "report"\n}\n'   # an earlier simtrain report, in dumps_json's canonical form

posix_only = pytest.mark.skipif(sys.platform == "win32", reason="POSIX modes and symlinks")


def _names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


@posix_only
def test_a_read_only_report_is_refused_before_simulating_and_left_as_it_was(tmp_path, capsys):
    """--json onto a file of mode 0444: exit 2, one sentence naming the file and its mode, before the simulation
    (nothing on stdout); the file keeps its bytes and its mode (root too: the mode bits are read, not os.access)."""
    keep = tmp_path / "keep.json"
    keep.write_text(OLD, encoding="utf-8")
    keep.chmod(0o444)
    code, out, err = run_cli(["run", SCENARIO, "--json", str(keep)], capsys)
    assert code == 2 and out == "", (code, out, err)
    assert err == (f"error: cannot write '{keep}': it is read-only (mode 0444), and simtrain never replaces a file "
                   "its owner protected; make it writable or name another file\n")
    assert keep.read_text(encoding="utf-8") == OLD
    assert stat.S_IMODE(keep.stat().st_mode) == 0o444
    assert _names(tmp_path) == ["keep.json"]


@posix_only
def test_write_atomic_refuses_a_read_only_file_from_python(tmp_path):
    """The Python API (and a sweep's table, written by write_atomic) refuses a read-only target too."""
    keep = tmp_path / "t.csv"
    keep.write_text("a,step_time_s\n1,2\n", encoding="utf-8")
    keep.chmod(0o400)
    with pytest.raises(InputError, match=r"it is read-only \(mode 0400\)"):
        outputs.write_atomic(keep, "a,step_time_s\n3,4\n")
    assert keep.read_text(encoding="utf-8") == "a,step_time_s\n1,2\n"


@posix_only
def test_a_replaced_report_keeps_its_permission_bits(tmp_path):
    """A private report (0600) stays private when simtrain writes it again; a new file gets 0666 less the umask
    (0644 under umask 022), as open() would give it."""
    old_umask = os.umask(0o022)
    try:
        private = tmp_path / "private.json"
        private.write_text(OLD, encoding="utf-8")
        private.chmod(0o600)
        outputs.write_json(private, {"new": 1})
        assert stat.S_IMODE(private.stat().st_mode) == 0o600
        fresh = outputs.write_json(tmp_path / "fresh.json", {"new": 1})
        assert stat.S_IMODE(fresh.stat().st_mode) == 0o644
    finally:
        os.umask(old_umask)


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="only root can give a file away")
def test_root_keeps_the_owner_of_a_replaced_report(tmp_path):
    """Root writing again a report another user owns leaves it theirs (uid and gid 4321 here), not root's."""
    report = tmp_path / "theirs.json"
    report.write_text(OLD, encoding="utf-8")
    os.chown(report, 4321, 4321)
    outputs.write_json(report, {"new": 1})
    st = report.stat()
    assert (st.st_uid, st.st_gid) == (4321, 4321)
    assert report.read_text(encoding="utf-8") == '{\n "new": 1\n}\n'


@posix_only
def test_a_symlinked_report_is_written_through_and_the_link_kept(tmp_path, capsys, monkeypatch):
    """--json link.json where link.json -> store/real.json: the link stays a link and store/real.json gets the new
    report (it was replaced by a regular file, the link lost and real.json left stale)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "store").mkdir()
    real = tmp_path / "store" / "real.json"
    real.write_text(OLD, encoding="utf-8")
    os.symlink(os.path.join("store", "real.json"), "link.json")
    code, _, err = run_cli(["run", SCENARIO, "--json", "link.json"], capsys)
    assert code == 0, err
    assert os.readlink("link.json") == os.path.join("store", "real.json")
    assert real.read_text(encoding="utf-8").startswith('{\n "')
    assert real.read_text(encoding="utf-8") != OLD
    assert _names(tmp_path) == ["link.json", "store"] and _names(tmp_path / "store") == ["real.json"]


@posix_only
def test_a_symlink_to_a_read_only_file_is_refused_naming_both(tmp_path, capsys, monkeypatch):
    """The ownership checks apply to the file a link points to: a read-only target is refused, named with the link."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "store").mkdir()
    real = tmp_path / "store" / "real.json"
    real.write_text(OLD, encoding="utf-8")
    real.chmod(0o444)
    os.symlink(os.path.join("store", "real.json"), "link.json")
    code, out, err = run_cli(["run", SCENARIO, "--json", "link.json"], capsys)
    assert code == 2 and out == "", err
    assert err.startswith("error: cannot write 'link.json' (a symlink to 'store/real.json'): it is read-only "
                          "(mode 0444)"), err
    assert os.path.islink("link.json") and real.read_text(encoding="utf-8") == OLD


@posix_only
def test_a_dangling_symlink_makes_its_target(tmp_path):
    """A link to a file that does not exist yet: the file is made where the link points, as a shell's '>' does."""
    link = tmp_path / "link.json"
    link.symlink_to(tmp_path / "made.json")
    outputs.write_json(link, {"new": 1})
    assert link.is_symlink() and (tmp_path / "made.json").read_text(encoding="utf-8") == '{\n "new": 1\n}\n'


@posix_only
def test_a_symlink_loop_is_refused_in_one_sentence(tmp_path, capsys):
    """--json loop1 where loop1 -> loop2 -> loop1: exit 2 naming loop1."""
    (tmp_path / "loop1").symlink_to(tmp_path / "loop2")
    (tmp_path / "loop2").symlink_to(tmp_path / "loop1")
    code, _, err = run_cli(["run", SCENARIO, "--json", str(tmp_path / "loop1")], capsys)
    assert code == 2 and len(err.splitlines()) == 1, err
    assert f"'{tmp_path / 'loop1'}'" in err and "symlink" in err, err


def _chattr(flag: str, path: Path) -> bool:
    if shutil.which("chattr") is None:
        return False
    return subprocess.run(["chattr", flag, str(path)], capture_output=True).returncode == 0


@pytest.mark.parametrize(("flag", "says"), [("+i", "immutable (chattr +i)"), ("+a", "append-only (chattr +a)")])
def test_an_immutable_report_is_refused_naming_it_not_the_temporary(tmp_path, capsys, flag, says):
    """chattr +i (or +a) keep.json: exit 2 before simulating, one sentence naming keep.json (it named
    '.keep.json.XXXX.tmp'), no temporary file left."""
    keep = tmp_path / "keep.json"
    keep.write_text(OLD, encoding="utf-8")
    if not _chattr(flag, keep):
        pytest.skip("needs chattr on a file system with inode flags, as root")
    try:
        code, out, err = run_cli(["run", SCENARIO, "--json", str(keep)], capsys)
    finally:
        _chattr(flag.replace("+", "-"), keep)
    assert code == 2 and out == "", err
    assert err == (f"error: cannot write '{keep}': it is marked {says}, and simtrain never replaces a file its "
                   "owner protected; make it writable or name another file\n")
    assert keep.read_text(encoding="utf-8") == OLD
    assert _names(tmp_path) == ["keep.json"]


@posix_only
def test_a_failed_rename_names_the_users_file(tmp_path, monkeypatch):
    """Where the rename itself fails (the file made immutable after the checks, another user's file in a sticky
    folder), the error names the file asked for; the temporary file is removed."""
    target = tmp_path / "r.json"

    def refused(src, dst):
        raise PermissionError(1, "Operation not permitted", src)

    monkeypatch.setattr(outputs.os, "replace", refused)
    with pytest.raises(PermissionError) as caught:
        outputs.write_atomic(target, "x")
    assert caught.value.filename == str(target)
    assert _names(tmp_path) == []


def test_an_immutable_folder_is_refused_before_simulating(tmp_path, capsys):
    """chattr +i on the output's folder: no file can be made in it; exit 2 before the simulation (the review found
    the run simulated whole and then failed at the temporary file)."""
    folder = tmp_path / "imm"
    folder.mkdir()
    if not _chattr("+i", folder):
        pytest.skip("needs chattr on a file system with inode flags, as root")
    try:
        code, out, err = run_cli(["run", SCENARIO, "--json", str(folder / "x.json")], capsys)
    finally:
        _chattr("-i", folder)
    assert code == 2 and out == "", err
    assert err.endswith(f"folder '{folder}' is marked immutable (chattr +i): no file can be made in it\n"), err


@posix_only
def test_a_folder_not_writable_to_this_user_is_refused_before_simulating(tmp_path, capsys, monkeypatch):
    """A folder os.access says this user cannot write into (mode 0555 for anyone but root; simulated here, since
    the tests may run as root): exit 2 before the simulation, naming the folder."""
    folder = tmp_path / "ro"
    folder.mkdir()
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, *a, **k: False if str(p) == str(folder) else real(p, mode))
    code, out, err = run_cli(["run", SCENARIO, "--json", str(folder / "x.json")], capsys)
    assert code == 2 and out == "", err
    assert err.endswith(f"folder '{folder}' is not writable to this user\n"), err


@posix_only
def test_two_outputs_through_a_symlinked_folder_are_one_file(tmp_path, capsys):
    """d2 -> d1: --gantt d1/g.html and --memory-plot d2/g.html write one file; refused as named twice (the review
    found the Gantt chart silently replaced by the memory chart)."""
    (tmp_path / "d1").mkdir()
    (tmp_path / "d2").symlink_to(tmp_path / "d1")
    code, out, err = run_cli(["run", SCENARIO, "--gantt", str(tmp_path / "d1" / "g.html"),
                              "--memory-plot", str(tmp_path / "d2" / "g.html")], capsys)
    assert code == 2 and out == "", err
    assert "--gantt and --memory-plot both write" in err
    assert _names(tmp_path / "d1") == []


@posix_only
def test_a_sweep_through_a_symlink_locks_and_records_the_table_itself(tmp_path, monkeypatch):
    """a.csv -> t.csv: the sweep's lock and its record are t.csv's, so a second sweep through another link to
    t.csv is refused while the first holds it, and --resume --out t.csv finds the record."""
    from simtrain.decide import sweep_files
    from simtrain.decide.table_lock import table_lock
    from simtrain.spec.scenario import load_scenario

    monkeypatch.chdir(tmp_path)
    (tmp_path / "a.csv").symlink_to(tmp_path / "t.csv")
    frame = sweep_files.sweep_to_file(load_scenario(SCENARIO), {"training.micro_batch": [1, 2]}, "a.csv",
                                      workers=1, progress=False)
    assert len(frame) == 2 and (tmp_path / "a.csv").is_symlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.csv", "t.csv", "t.csv.sweep.json"]
    (tmp_path / "b.csv").symlink_to(tmp_path / "t.csv")
    with table_lock(tmp_path / "t.csv"):
        with pytest.raises(InputError, match="t.csv"):
            sweep_files.sweep_to_file(load_scenario(SCENARIO), {"training.micro_batch": [1, 2]}, "b.csv",
                                      workers=1, progress=False)
    again = sweep_files.sweep_to_file(load_scenario(SCENARIO), {"training.micro_batch": [1, 2]}, "t.csv",
                                      resume=True, workers=1, progress=False)
    assert again.attrs["resumed_points"] == 2


@pytest.mark.skipif(not os.path.exists("/dev/null"), reason="needs /dev/null")
def test_a_device_in_a_folder_this_user_cannot_write_is_still_written(capsys, monkeypatch):
    """--json /dev/null writes into the device (docs/errors.md), whose folder no ordinary user can write: the
    folder's writability is asked only of outputs that make a file (the review found /dev/null refused for
    non-root users; os.access is faked here, since the tests may run as root)."""
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, *a, **k: False if str(p) == "/dev" else real(p, mode))
    code, out, err = run_cli(["run", SCENARIO, "--json", "/dev/null"], capsys)
    assert code == 0, err
