"""A non-editable install (`pip install .`) carries every subpackage and data file."""

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_every_subpackage_is_listed_in_pyproject():
    """Each folder of simtrain/ with an __init__.py is in [tool.setuptools] packages (a wheel would miss it)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "simtrain").rglob("__init__.py")
             if "__pycache__" not in p.parts}
    assert found <= listed, sorted(found - listed)


def test_bundled_data_is_package_data():
    """Hardware files, model presets, validation cases and example scenarios ship as package data."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert config["package-dir"]["simtrain.hardware_data"] == "hardware"
    assert config["package-dir"]["simtrain.scenario_data"] == "scenarios"
    for package in ("simtrain.presets", "simtrain.validation", "simtrain.hardware_data", "simtrain.scenario_data"):
        assert "*.yaml" in config["package-data"][package]
