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


@pytest.mark.parametrize("case", list(_cases()))
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
    import simtrain.engine.simulation

    def broken(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(simtrain.engine.simulation, "simulate", broken)
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
    from simtrain.spec.errors import InputError
    from simtrain.spec.scenario import load_scenario

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


# --- safe input and output (deliverable 7) -------------------------------------------------------

def test_yaml_is_only_read_with_the_safe_loader():
    """Every YAML parse in simtrain goes through yamlio's loader, which derives from yaml.SafeLoader;
    no unsafe, full or plain Loader appears anywhere in the package."""
    import ast

    import simtrain
    from simtrain.spec import yamlio

    assert issubclass(yamlio._Loader, yaml.SafeLoader)
    package = Path(simtrain.__file__).parent
    for source in sorted(package.rglob("*.py")):
        tree = ast.parse(source.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "yaml":
                assert node.attr not in {"unsafe_load", "full_load", "load_all", "unsafe_load_all", "full_load_all",
                                         "Loader", "FullLoader", "UnsafeLoader",
                                         "UnsafeConstructor"}, (source, node.attr)
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "load"
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "yaml"):
                loader = {k.arg: k.value for k in node.keywords}.get("Loader")
                assert isinstance(loader, ast.Name) and loader.id == "_Loader", source


def test_python_tags_are_never_executed(tmp_path, capsys):
    """A !!python/object/apply tag is refused by the loader: the command it names never runs."""
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.yaml"
    path.write_text(f"name: !!python/object/apply:os.system ['touch {marker}']\n", encoding="utf-8")
    code, _, err = run_cli(["run", str(path)], capsys)
    assert code == 2 and "unsupported YAML" in err
    assert not marker.exists()


def test_scenario_names_are_escaped_in_html(tmp_path):
    """A scenario named '<script>alert(1)</script>' appears escaped in the Gantt and memory charts."""
    charts = pytest.importorskip("simtrain.report.charts")
    from simtrain.engine.simulation import simulate
    from simtrain.spec.scenario import load_scenario

    name = "<script>alert(1)</script>"
    result = simulate(load_scenario(BASE, {"name": name}))
    gantt, memory = tmp_path / "gantt.html", tmp_path / "memory.html"
    charts.write_outputs(result, gantt=str(gantt), memory=str(memory))
    for page in (gantt, memory):
        html = page.read_text(encoding="utf-8")
        assert name not in html and "<script>alert" not in html
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html       # shown, as text


def test_references_resolve_against_the_scenario_folder(tmp_path, monkeypatch):
    """'../good/hw.yaml' in tests/bad_inputs/scenarios means the file beside the scenario's folder,
    whatever the working folder ('..' in the user's own path is allowed)."""
    from simtrain.spec.scenario import load_scenario

    monkeypatch.chdir(tmp_path)
    scenario = load_scenario(CORPUS / "scenarios" / "global_batch_divide.yaml", {"training.global_batch": 8})
    assert Path(scenario.hardware_file) == (CORPUS / "good" / "hw.yaml").resolve()


def test_referenced_files_cannot_name_further_files(tmp_path, capsys):
    """A hardware or model file has no key that opens another file: 'include:' is an unknown key."""
    hw = tmp_path / "hw.yaml"
    hw.write_text((CORPUS / "good" / "hw.yaml").read_text(encoding="utf-8") + "include: /etc/passwd\n",
                  encoding="utf-8")
    scenario = tmp_path / "s.yaml"
    scenario.write_text(BASE.read_text(encoding="utf-8").replace("hardware: hw.yaml", f"hardware: {hw}")
                        .replace("model: model.yaml", f"model: {CORPUS / 'good' / 'model.yaml'}"), encoding="utf-8")
    code, _, err = run_cli(["run", str(scenario)], capsys)
    assert code == 2 and f"{hw}:{_line_of(hw, 'include:')}: include: unknown key" in err


@pytest.mark.skipif(sys.platform == "win32", reason="FIFOs and /dev/zero are POSIX")
@pytest.mark.parametrize("kind", ["fifo", "device-symlink"])
def test_special_files_are_refused_without_reading(tmp_path, capsys, kind):
    """A FIFO or a symlink to /dev/zero named as hardware is refused (not read, so nothing blocks)."""
    import os

    special = tmp_path / "hw.yaml"
    if kind == "fifo":
        os.mkfifo(special)
    else:
        special.symlink_to("/dev/zero")
    scenario = tmp_path / "s.yaml"
    scenario.write_text(BASE.read_text(encoding="utf-8").replace("model: model.yaml",
                                                                 f"model: {CORPUS / 'good' / 'model.yaml'}"),
                        encoding="utf-8")
    code, _, err = run_cli(["run", str(scenario)], capsys)
    assert code == 2 and "hardware file 'hw.yaml' is not a regular file" in err


def test_oversized_files_are_refused_without_reading(tmp_path, capsys):
    """A 'scenario' of 100 MiB (a wrong path, surely) is refused from its size, not parsed."""
    path = tmp_path / "big.yaml"
    with open(path, "wb") as fh:
        fh.truncate(100 * 2**20)                  # sparse: no disk used
    code, _, err = run_cli(["run", str(path)], capsys)
    assert code == 2 and "is 100 MiB, larger than any simtrain input (16 MiB)" in err


if __name__ == "__main__":   # pragma: no cover - convenience
    sys.exit(pytest.main([__file__, "-q"]))
