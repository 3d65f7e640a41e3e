"""The bad-input corpus (issue 8, deliverables 1 and 2): every file in tests/bad_inputs gets one
located sentence and exit status 2 from the real command line, never a traceback.

``tests/bad_inputs/expected.yaml`` lists each bad file with the text on the line the error must
point at and a fragment of the message. Scenarios run directly; hardware files, model files and
HuggingFace configs run through a scenario (written here) that names them, so the message must
name *that* file and its line. The expected line is found by searching the case file for the
text, never taken from simtrain.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import run_cli

CORPUS = Path(__file__).resolve().parent / "bad_inputs"
EXPECTED = yaml.safe_load((CORPUS / "expected.yaml").read_text(encoding="utf-8"))
BASE = CORPUS / "good" / "base.yaml"
PREFIX = re.compile(r"^error: (?P<file>.+?)(?::(?P<line>\d+))?: ")


def _text(path: Path) -> str:
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return data.decode("latin-1")       # one byte per character: line numbers stay the same


def _line_of(path: Path, at: str) -> int:
    """1-based number of the first line of ``path`` that contains ``at`` (a plain text search)."""
    for number, line in enumerate(_text(path).splitlines(), 1):
        if at in line:
            return number
    raise AssertionError(f"'{at}' is not in {path}")


def _driver(case: str, tmp_path: Path) -> list[str]:
    """The command line that loads ``case``: the scenario itself, or a scenario that names the file."""
    entry = EXPECTED[case]
    if case.startswith("cli/"):
        return ["run", str(BASE), *entry["args"]]
    path = CORPUS / case
    if case.startswith("scenarios/"):
        return ["run", str(path), *entry.get("args", [])]
    text = BASE.read_text(encoding="utf-8").replace("hardware: hw.yaml", f"hardware: {BASE.parent / 'hw.yaml'}")
    key = "hardware" if case.startswith("hardware/") else "model"
    text = re.sub(rf"^{key}: .*$", f"{key}: {path}", text, count=1, flags=re.M)
    driver = tmp_path / "driver.yaml"
    driver.write_text(text, encoding="utf-8")
    return ["run", str(driver)]


def _cases():
    for case, entry in EXPECTED.items():
        marks = [pytest.mark.xfail(strict=True, reason=f"bug: {entry['bug']}")] if entry.get("bug") else []
        yield pytest.param(case, id=case, marks=marks)


def test_corpus_is_big_enough():
    """The issue asks for at least 40 bad inputs, of every kind: scenario, hardware, model, config.json."""
    files = [c for c in EXPECTED if not c.startswith("cli/")]
    assert len(files) >= 40
    for kind in ("scenarios/", "hardware/", "models/", "hf/"):
        assert any(c.startswith(kind) for c in files), kind


def test_every_corpus_file_is_listed():
    """Each file under tests/bad_inputs (except the good fixtures) has an expected message."""
    on_disk = {p.relative_to(CORPUS).as_posix() for p in CORPUS.rglob("*")
               if p.is_file() and p.name != "expected.yaml" and p.parts[len(CORPUS.parts)] != "good"}
    assert on_disk == {c for c in EXPECTED if not c.startswith("cli/")}


def test_good_base_runs(capsys):
    """The base scenario the bad ones differ from is valid, so each failure comes from its one defect."""
    code, out, err = run_cli(["run", str(BASE)], capsys)
    assert code == 0, err
    assert "step time" in out


@pytest.mark.parametrize("case", _cases())
def test_bad_input_gives_one_located_line(case, tmp_path, capsys):
    """A bad file exits 2 with exactly one line 'error: file:line: field: message' and no traceback."""
    entry = EXPECTED[case]
    code, out, err = run_cli(_driver(case, tmp_path), capsys)
    lines = err.strip().splitlines()
    assert code == 2, err
    assert "Traceback" not in err
    assert len(lines) == 1, err
    message = lines[0]
    for fragment in [entry["says"]] if isinstance(entry["says"], str) else entry["says"]:
        assert fragment in message, message
    match = PREFIX.match(message)
    named = entry.get("file", case)
    if named is None:                     # a problem with the command line itself
        assert match is None or not Path(match["file"]).exists(), message
        return
    assert match, message
    assert Path(match["file"]).resolve() == (CORPUS / named).resolve(), message
    if entry.get("at") is not None:
        assert match["line"] is not None, message
        assert int(match["line"]) == _line_of(CORPUS / named, entry["at"]), message
    elif entry.get("line") is not None:
        assert match["line"] is not None and int(match["line"]) == entry["line"], message
    else:
        assert match["line"] is None, message


@pytest.mark.parametrize("case", ["scenarios/yaml_python_tag.yaml", "scenarios/tp_heads.yaml",
                                  "scenarios/not_utf8.yaml"])
def test_console_script_exits_2_without_traceback(case, simtrain_exe):
    """The installed command (a separate process) also exits 2 with one line on stderr."""
    proc = subprocess.run([*simtrain_exe, "run", str(CORPUS / case)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert EXPECTED[case]["says"] in proc.stderr


def test_the_issue_example_reads_as_written(capsys):
    """The issue's own example: 'x.yaml:12: parallel.tp: 3 does not divide heads=40 (allowed: 1, 2, 4, 5, 8, ...'."""
    path = CORPUS / "scenarios/tp_heads.yaml"
    code, _, err = run_cli(["memory", str(path)], capsys)
    assert code == 2
    assert err.strip() == (f"error: {path}:{_line_of(path, 'tp: 3')}: parallel.tp: 3 does not divide heads=40 "
                           "(allowed: 1, 2, 4, 5, 8, 10, ...)")


def test_internal_error_is_one_line_and_debug_shows_traceback(monkeypatch, capsys):
    """A real bug exits 1 with one 'internal error' line; with --debug the exception propagates (traceback)."""
    import simtrain.simulate

    def broken(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(simtrain.simulate, "simulate", broken)
    code, _, err = run_cli(["run", str(BASE)], capsys)
    assert code == 1
    assert err.strip().splitlines() == ["internal error: RuntimeError: boom (this is a simtrain bug; rerun with "
                                        "--debug for the traceback)"]
    from simtrain.cli import main

    with pytest.raises(RuntimeError, match="boom"):
        main(["--debug", "run", str(BASE)])


def test_unwritable_output_is_an_input_error(tmp_path, capsys):
    """A --json path in a folder that does not exist is the user's input: exit 2, one line."""
    code, _, err = run_cli(["run", str(BASE), "--json", str(tmp_path / "no" / "such" / "r.json")], capsys)
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert "does not exist" in err


def test_python_api_raises_input_error_not_pydantic():
    """The Python API raises simtrain's InputError (with file and line) for a bad file, not a pydantic error."""
    from simtrain.errors import InputError
    from simtrain.scenario import load_scenario

    path = CORPUS / "scenarios/unknown_top_key.yaml"
    with pytest.raises(InputError) as exc:
        load_scenario(path)
    assert exc.value.file == str(path) and exc.value.line == _line_of(path, "paralel:")
    assert exc.value.field == "paralel"


def test_messages_stay_on_one_line_with_control_characters(tmp_path, capsys):
    """A name with a newline and a terminal escape is shown escaped: the message stays one line."""
    path = tmp_path / "s.yaml"
    path.write_text(BASE.read_text(encoding="utf-8").replace("hardware: hw.yaml", 'hardware: "a\\nb\\e[31m"'),
                    encoding="utf-8")
    code, _, err = run_cli(["run", str(path)], capsys)
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and "\x1b" not in err
    assert "unknown hardware 'a\\nb\\x1b[31m'" in err


if __name__ == "__main__":   # pragma: no cover - convenience
    sys.exit(pytest.main([__file__, "-q"]))
