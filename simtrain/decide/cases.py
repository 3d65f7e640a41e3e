"""The cases files `simtrain validate` reads: the bundled ones (the dev set and its companions), a cases file
named by path or by the name of a bundled one, and the checks of each case's keys before any case runs.
"""

from __future__ import annotations

import math
from importlib import resources
from pathlib import Path

from simtrain.spec.bounds import FLOAT_RANGE, QUANTITY_RANGES
from simtrain.spec.errors import InputError, file_value, short_repr, suggest
from simtrain.spec.yamlio import line_of, load_yaml

#: bundled files that are not part of the dev set: MosaicML's A100 companion of its H100 table, and its A100
#: micro-batch and software-image sweeps (the same source and stack as the dev set's MosaicML rows)
COMPANIONS = ("llm_foundry_a100", "llm_foundry_sweeps")


def bundled_cases_path() -> Path:
    return Path(str(resources.files("simtrain.validation") / "cases.yaml"))


def bundled_case_files() -> dict[str, Path]:
    """The bundled cases files by name: ``cases`` and the other dev-set files, and the companions."""
    folder = bundled_cases_path().parent
    return {p.stem: p for p in sorted(folder.glob("*.yaml"))}


def dev_case_files() -> dict[str, Path]:
    """The dev set: every bundled cases file but the companions, ``cases`` first."""
    files = {name: path for name, path in bundled_case_files().items() if name not in COMPANIONS}
    return {name: files[name] for name in sorted(files, key=lambda n: (n != "cases", n))}


def resolve_cases(path: str | Path | None) -> Path:
    """A cases file path, or the name of a bundled one (``llm_foundry_a100``) when no such file exists."""
    if not path:
        return bundled_cases_path()
    given = Path(path)
    if not given.exists() and given.parent == Path(".") and given.suffix in ("", ".yaml"):
        bundled = bundled_case_files().get(given.stem)
        if bundled is not None:
            return bundled
        if given.suffix == "":
            raise InputError(f"cases file '{path}' does not exist and is not a bundled cases file (bundled: "
                             f"{', '.join(bundled_case_files())})")
    return given


#: the keys of one case in a cases file (listed in docs/errors.md, "Cases files"); needs (the simtrain features a
#: case exercises) and other_releases (the same run measured in other software releases) are informational
CASE_KEYS = ("id", "source", "scenario", "measured", "target_step_time_s", "target_from", "flops_convention",
             "gate", "assumed", "notes", "needs", "other_releases",
             "compare_to")


#: the measured figures `simtrain validate` computes with (scaled by the step-time ratio, compared, converted):
#: each must be a number where a case gives it
MEASURED_NUMBERS = ("tokens_per_s_per_gpu", "mfu", "tflops_per_gpu", "memory_GiB")


def load_cases(path: str | Path | None = None) -> tuple[list[dict], Path]:
    path = resolve_cases(path)
    data = load_yaml(path)
    if not isinstance(data, list):
        raise InputError("a cases file is a YAML list of cases (id, scenario, measured, target_step_time_s)",
                         file=str(path))
    seen: dict[str, int | None] = {}
    for i, case in enumerate(data):
        if not isinstance(case, dict):
            raise InputError(f"case {i} is not a mapping of {', '.join(CASE_KEYS)}", file=str(path),
                             line=getattr(case, "line", None))
        lines = getattr(case, "key_lines", {})
        name = f"case {short_repr(case['id'])}" if "id" in case else f"case {i}"
        for key in case:
            if key not in CASE_KEYS:
                raise InputError(f"{name}: unknown key{suggest(str(key), CASE_KEYS)}; a case has "
                                 f"{', '.join(CASE_KEYS)}", file=str(path), line=lines.get(key), field=str(key))
        for key in ("id", "scenario", "target_step_time_s"):
            if key not in case:
                raise InputError(f"{name} lacks '{key}'", file=str(path), line=getattr(case, "line", None))
        _check_values(case, i, str(path))
        case_id = case["id"]
        if case_id in seen:
            first = f" (line {seen[case_id]})" if seen[case_id] else ""
            raise InputError(f"case id {case_id!r} is given twice, first as case {list(seen).index(case_id)}{first}; "
                             "ids name the rows of the report", file=str(path), line=lines.get("id"), field="id")
        seen[case_id] = lines.get("id")
    for case in data:
        _check_compare_to(case, list(seen), str(path))
    return data, path.resolve().parent


#: what a YAML value is, in a person's words (bool before int: Python counts true as a number)
_KINDS = ((bool, "a boolean"), ((int, float), "a number"), (str, "a text"), (list, "a list"), (dict, "a mapping"),
          (type(None), "no value"))


def _kind(value: object) -> str:
    """'a text', 'a number', 'a list'... for a value a message quotes."""
    return next((name for types, name in _KINDS if isinstance(value, types)), f"a {type(value).__name__}")


def _positive_number(value: object) -> bool:
    """A finite number > 0 (a boolean is not a number here, though Python counts true as 1)."""
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value) and value > 0


def _not_json(value: object, dotted: str) -> tuple[str, object] | None:
    """(where, value) of the first value inside ``value`` that JSON cannot hold (a date, an infinity), or None."""
    if isinstance(value, dict):
        inner = (_not_json(item, f"{dotted}.{key}") for key, item in value.items())
    elif isinstance(value, list):
        inner = (_not_json(item, f"{dotted}.{i}") for i, item in enumerate(value))
    elif isinstance(value, (str, bool, int, type(None))) or (isinstance(value, float) and math.isfinite(value)):
        return None
    else:
        return dotted, value
    return next((found for found in inner if found), None)


def _check_values(case: dict, index: int, file: str) -> None:
    """The types and ranges of one case's values (its keys are known and the required ones present): each bad
    value an InputError naming the key's line, the case, the value and what is allowed."""
    lines = getattr(case, "key_lines", {})

    def refuse(key: str, what: str, allowed_text: str, name: str = f"case {index}") -> InputError:
        return InputError(f"{name}: {what} (allowed: {allowed_text})", file=file, line=line_of(case, key), field=key)

    case_id = case["id"]
    if not isinstance(case_id, str) or not case_id.strip():
        what = "empty" if isinstance(case_id, str) else _kind(case_id)
        raise refuse("id", f"{file_value(case_id)} is {what}, not a name", "a text that names the case's row in "
                     "the report, e.g. 'llama2_7b_dp8'")
    name = f"case {case_id!r}"
    scenario = case["scenario"]
    if not isinstance(scenario, dict):
        raise refuse("scenario", f"{file_value(scenario)} is {_kind(scenario)}, not a scenario", "a mapping of the "
                     "scenario's keys written under scenario:, as in a scenario file (hardware, model, training, "
                     "parallel, ...); a case does not name a scenario file", name)
    measured = case.get("measured")
    if measured is not None and not isinstance(measured, dict):
        raise refuse("measured", f"{file_value(measured)} is {_kind(measured)}, not a table of figures",
                     "a mapping of what the source measured, e.g. {tokens_per_s_per_gpu: 3000, mfu: 0.45}", name)
    low, high = FLOAT_RANGE
    for key, value in (measured or {}).items():
        if key in MEASURED_NUMBERS and not (_positive_number(value) and low <= value <= high):
            raise refuse(f"measured.{key}", f"{file_value(value)} is not a measured figure",
                         f"a number from {low:g} to {high:g}, which simtrain compares with its prediction", name)
    unwritable = _not_json(measured, "measured")
    if unwritable:
        where, value = unwritable
        kind = "an infinite or NaN number" if isinstance(value, float) else _kind(value)
        raise refuse(where, f"{value} is {kind}, which the report (JSON) cannot hold", "finite numbers, "
                     "texts, true, false and lists or mappings of them; quote a date", name)
    gate = case.get("gate", True)
    if not isinstance(gate, bool):
        raise refuse("gate", f"{file_value(gate)} is {_kind(gate)}, not true or false", "true or false, unquoted; "
                     "false reports the case without counting it towards the targets", name)
    compare_to = case.get("compare_to")
    if compare_to is not None and (not isinstance(compare_to, str) or compare_to == case_id):
        what = "the case itself" if compare_to == case_id else f"{_kind(compare_to)}, not a case id"
        raise refuse("compare_to", f"{file_value(compare_to)} is {what}", "the id of another case of this file, "
                     "the run this case's speed-up is measured against", name)
    assumed = case.get("assumed")
    if assumed is not None and (not isinstance(assumed, list)
                                or not all(isinstance(a, str) for a in assumed)):
        raise InputError(f"case {case_id}: assumed must be a list of texts (the scenario keys the source does not "
                         "state); quote an entry that holds ': '", file=file, line=lines.get("assumed"),
                         field="assumed")
    target = case["target_step_time_s"]
    low, high, _, span = QUANTITY_RANGES["time"]
    if not (_positive_number(target) and low <= target <= high):
        raise InputError(f"case {case_id}: {target!r} is not a measured step time; give the seconds per step, "
                         f"a number from {low:g} to {high:g} ({span})", file=file,
                         line=lines.get("target_step_time_s"), field="target_step_time_s")


def _check_compare_to(case: dict, ids: list[str], file: str) -> None:
    """A case's ``compare_to`` names another case of the same file (the report's speed-ups pair them)."""
    compare_to = case.get("compare_to")
    if compare_to is None or compare_to in ids:
        return
    others = [case_id for case_id in ids if case_id != case["id"]]
    raise InputError(f"case {case['id']!r}: {compare_to!r} names no case of this file{suggest(compare_to, others)} "
                     "(allowed: the id of another case of this file, the run this case's speed-up is measured "
                     "against)", file=file, line=getattr(case, "key_lines", {}).get("compare_to"), field="compare_to")
