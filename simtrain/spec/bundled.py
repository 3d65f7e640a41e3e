"""What ships with simtrain, by name: example scenarios, hardware files and model presets.

``scenarios/`` (the checkout's folder) is installed as ``simtrain/scenario_data`` (pyproject package-dir), as
``hardware/`` is installed as ``simtrain/hardware_data``; a name such as ``pp4_dp4`` finds its file in either.
"""

from __future__ import annotations

from pathlib import Path

from simtrain.spec.errors import InputError, suggest

_PACKAGE = Path(__file__).resolve().parents[1]   # simtrain/
_REPO_SCENARIOS = _PACKAGE.parent / "scenarios"


def bundled_scenarios_dir() -> Path:
    """Where the bundled scenarios live: the installed package (a wheel), else the checkout (an editable install,
    whose package has no scenario_data folder)."""
    installed = _PACKAGE / "scenario_data"
    return installed if installed.is_dir() else _REPO_SCENARIOS


def scenario_names() -> list[str]:
    """The bundled scenarios' names (``simtrain.load_scenario(name)`` loads one)."""
    return sorted(p.stem for p in bundled_scenarios_dir().glob("*.yaml"))


def hardware_names() -> list[str]:
    from simtrain.spec.hardware import bundled_hardware_names

    return sorted(bundled_hardware_names())


def model_names() -> list[str]:
    from simtrain.spec.model_load import preset_names

    return sorted(preset_names())


def looks_like_name(text: str) -> bool:
    """A bare name (``pp4_dp4``), not a path: no folder, no ``.yaml`` suffix."""
    return "/" not in text and "\\" not in text and not text.endswith((".yaml", ".yml")) and text not in (".", "..")


def scenario_path(name_or_path: str | Path) -> Path:
    """The file of a scenario given by path or, when no such file exists and it is a bare name, by bundled name."""
    path = Path(name_or_path)
    text = str(name_or_path)
    if path.exists() or not looks_like_name(text):
        return path
    bundled = bundled_scenarios_dir() / f"{text}.yaml"
    if bundled.is_file():
        return bundled
    names = scenario_names()
    raise InputError(f"scenario '{text}' is neither a file nor a bundled scenario{suggest(text, names)} "
                     f"(bundled: {', '.join(names)})")
