"""The cases files `simtrain validate` reads: the bundled ones (the dev set and its companions), a cases file
named by path or by the name of a bundled one, and the checks of each case's keys before any case runs.
"""

from __future__ import annotations

import math
from importlib import resources
from pathlib import Path

from simtrain.spec.errors import InputError, suggest
from simtrain.spec.yamlio import load_yaml

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
        name = f"case {case['id']!r}" if "id" in case else f"case {i}"
        for key in case:
            if key not in CASE_KEYS:
                raise InputError(f"{name}: unknown key{suggest(str(key), CASE_KEYS)}; a case has "
                                 f"{', '.join(CASE_KEYS)}", file=str(path), line=lines.get(key), field=str(key))
        for key in ("id", "scenario", "target_step_time_s"):
            if key not in case:
                raise InputError(f"{name} lacks '{key}'", file=str(path), line=getattr(case, "line", None))
        case_id = str(case["id"])
        if case_id in seen:
            first = f" (line {seen[case_id]})" if seen[case_id] else ""
            raise InputError(f"case id {case_id!r} is given twice, first as case {list(seen).index(case_id)}{first}; "
                             "ids name the rows of the report", file=str(path), line=lines.get("id"), field="id")
        seen[case_id] = lines.get("id")
        assumed = case.get("assumed")
        if assumed is not None and (not isinstance(assumed, list)
                                    or not all(isinstance(a, str) for a in assumed)):
            raise InputError(f"case {case_id}: assumed must be a list of texts (the scenario keys the source does not "
                             "state); quote an entry that holds ': '", file=str(path), line=lines.get("assumed"),
                             field="assumed")
        target = case["target_step_time_s"]
        if isinstance(target, bool) or not isinstance(target, (int, float)) or not math.isfinite(target) or target <= 0:
            lines = getattr(case, "key_lines", {})
            raise InputError(f"case {case['id']}: {target!r} is not a measured step time; give the seconds per step, "
                             "a number > 0", file=str(path), line=lines.get("target_step_time_s"),
                             field="target_step_time_s")
    return data, path.resolve().parent
