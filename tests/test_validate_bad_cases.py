"""Bad values in a cases file (`simtrain validate CASES`): exit 2 and one line naming the file, the line, the case's
key, the value and what is allowed (docs/errors.md, "Cases files"), never an internal error and never a value read
as something else (a quoted "false" read as gated).

Each test starts from one valid case (CASE, below) and changes one of its values; the expected line numbers are
those of CASE as written here.
"""

from __future__ import annotations

import pytest
from conftest import run_cli

from simtrain.decide import cases as case_files

CASE = """\
- id: x
  source: hand-written
  scenario:
    hardware: dgx-h100
    model: llama2-7b
    training: {seq_len: 4096, global_batch: 8, micro_batch: 1}
    parallel: {dp: 8}
  measured: {tokens_per_s_per_gpu: 3000, mfu: 0.4}
  target_step_time_s: 1.0
  gate: true
"""

SECOND = """\
- id: y
  scenario: {hardware: dgx-h100, model: llama2-7b, training: {seq_len: 4096, global_batch: 8}, parallel: {dp: 8}}
  target_step_time_s: 2.0
  compare_to: x
"""

SCENARIO = """\
  scenario:
    hardware: dgx-h100
    model: llama2-7b
    training: {seq_len: 4096, global_batch: 8, micro_batch: 1}
    parallel: {dp: 8}
"""


def _validate(tmp_path, monkeypatch, capsys, text: str) -> tuple[int, str, str]:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "c.yaml").write_text(text, encoding="utf-8")
    return run_cli(["validate", "c.yaml"], capsys)


def _assert_one_line_error(code: int, out: str, err: str, expected: str) -> None:
    """Exit 2, nothing on stdout, and exactly the one expected line on stderr (no traceback)."""
    assert (code, out) == (2, "")
    assert "Traceback" not in err and err.count("\n") == 1
    assert err == f"error: {expected}\n"


ID_RULE = "(allowed: a text that names the case's row in the report, e.g. 'llama2_7b_dp8')"
GATE_RULE = "(allowed: true or false, unquoted; false reports the case without counting it towards the targets)"
JSON_RULE = "(allowed: finite numbers, texts, true, false and lists or mappings of them; quote a date)"
SCENARIO_RULE = ("(allowed: a mapping of the scenario's keys written under scenario:, as in a scenario file (hardware, "
                 "model, training, parallel, ...); a case does not name a scenario file)")


@pytest.mark.parametrize("old, new, expected", [
    ("id: x", "id: 7", f"c.yaml:1: id: case 0: 7 is a number, not a name {ID_RULE}"),
    ("id: x", "id: [a]", f'c.yaml:1: id: case 0: ["a"] is a list, not a name {ID_RULE}'),
    ("id: x", "id: ''", f"c.yaml:1: id: case 0: '' is empty, not a name {ID_RULE}"),
    ("gate: true", 'gate: "false"', f"c.yaml:10: gate: case 'x': 'false' is a text, not true or false {GATE_RULE}"),
    ("gate: true", "gate: maybe", f"c.yaml:10: gate: case 'x': 'maybe' is a text, not true or false {GATE_RULE}"),
    ("gate: true", "gate: 1", f"c.yaml:10: gate: case 'x': 1 is a number, not true or false {GATE_RULE}"),
    ("gate: true", "gate: null", f"c.yaml:10: gate: case 'x': null is no value, not true or false {GATE_RULE}"),
    (SCENARIO, "  scenario: pp4_dp4\n",
     f"c.yaml:3: scenario: case 'x': 'pp4_dp4' is a text, not a scenario {SCENARIO_RULE}"),
    (SCENARIO, "  scenario: /path/x.yaml\n",
     f"c.yaml:3: scenario: case 'x': '/path/x.yaml' is a text, not a scenario {SCENARIO_RULE}"),
    ("measured: {tokens_per_s_per_gpu: 3000, mfu: 0.4}", "measured: 5",
     "c.yaml:8: measured: case 'x': 5 is a number, not a table of figures (allowed: a mapping of what the source "
     "measured, e.g. {tokens_per_s_per_gpu: 3000, mfu: 0.45})"),
    ("mfu: 0.4", "mfu: high",
     "c.yaml:8: measured.mfu: case 'x': 'high' is not a measured figure (allowed: a number from 1e-12 to 1e+12, "
     "which simtrain compares with its prediction)"),
    # 1e300 x the target over the prediction overflowed to inf, which the --json report cannot hold (exit 1)
    ("mfu: 0.4", "mfu: 1.0e+300",
     "c.yaml:8: measured.mfu: case 'x': 1e+300 is not a measured figure (allowed: a number from 1e-12 to 1e+12, "
     "which simtrain compares with its prediction)"),
    # a denormal target made the error inf% (exit 1 with --json); time's range is docs/errors.md's 1 ps to 1 day
    ("target_step_time_s: 1.0", "target_step_time_s: 4.9e-324",
     "c.yaml:9: target_step_time_s: case x: 5e-324 is not a measured step time; give the seconds per step, a "
     "number from 1e-12 to 86400 (1 ps to 1 day)"),
    ("target_step_time_s: 1.0", "target_step_time_s: 1.0e+6",
     "c.yaml:9: target_step_time_s: case x: 1000000.0 is not a measured step time; give the seconds per step, a "
     "number from 1e-12 to 86400 (1 ps to 1 day)"),
    ("mfu: 0.4", "mfu: 0.4, when: 2024-01-01",
     f"c.yaml:8: measured.when: case 'x': 2024-01-01 is a date, which the report (JSON) cannot hold {JSON_RULE}"),
    ("mfu: 0.4", "mfu: 0.4, runs: [1.0, .inf]",
     f"c.yaml:8: measured.runs.1: case 'x': inf is an infinite or NaN number, which the report (JSON) cannot hold "
     f"{JSON_RULE}"),
])
def test_a_bad_case_value_is_one_located_line_with_exit_2(tmp_path, monkeypatch, capsys, old, new, expected):
    """Rule: a case's id is a text, its scenario a mapping, measured a mapping of what JSON can hold (its compared
    figures numbers > 0) and gate a real boolean; anything else is exit 2 at the key's line, naming the value and
    what is allowed."""
    assert old in CASE
    _assert_one_line_error(*_validate(tmp_path, monkeypatch, capsys, CASE.replace(old, new)), expected)


def test_compare_to_naming_no_case_is_refused(tmp_path, monkeypatch, capsys):
    """Rule: compare_to names another case of the file; an unknown id (here 'X' for 'x') is exit 2 at its line,
    naming the case, the unknown id and the close one, not silently dropped from the speed-ups."""
    text = CASE + SECOND.replace("compare_to: x", "compare_to: X")
    _assert_one_line_error(*_validate(tmp_path, monkeypatch, capsys, text),
                           "c.yaml:14: compare_to: case 'y': 'X' names no case of this file (did you mean 'x'?) "
                           "(allowed: the id of another case of this file, the run this case's speed-up is "
                           "measured against)")


def test_compare_to_naming_its_own_case_is_refused(tmp_path, monkeypatch, capsys):
    """Rule: a case's speed-up over itself means nothing: compare_to: y in case y is exit 2."""
    text = CASE + SECOND.replace("compare_to: x", "compare_to: y")
    _assert_one_line_error(*_validate(tmp_path, monkeypatch, capsys, text),
                           "c.yaml:14: compare_to: case 'y': 'y' is the case itself (allowed: the id of another "
                           "case of this file, the run this case's speed-up is measured against)")


def test_a_valid_case_pair_still_loads(tmp_path):
    """Rule: the checks refuse only bad values: gate false, a compare_to naming another case and a measured
    mapping holding texts beside numbers are accepted as written."""
    path = tmp_path / "c.yaml"
    path.write_text(CASE.replace("gate: true", "gate: false").replace("mfu: 0.4", "mfu: 0.4, note: per GPU")
                    + SECOND, encoding="utf-8")
    cases, _ = case_files.load_cases(path)
    assert [(c["id"], c.get("gate"), c.get("compare_to")) for c in cases] == [("x", False, None), ("y", None, "x")]
    assert cases[0]["measured"] == {"tokens_per_s_per_gpu": 3000, "mfu": 0.4, "note": "per GPU"}



def test_a_boolean_is_quoted_as_the_file_wrote_it(tmp_path, monkeypatch, capsys):
    """id: true is shown as true, YAML's spelling, not Python's True, also inside a list (found by review)."""
    code, out, err = _validate(tmp_path, monkeypatch, capsys, CASE.replace("id: x", "id: true"))
    assert code == 2 and "id: case 0: true is" in err and "True" not in err, err
    code, out, err = _validate(tmp_path, monkeypatch, capsys, CASE.replace("id: x", "id: [true, null]"))
    assert code == 2 and "[true, null] is a list" in err, err
