"""Shared helpers for the core test suites (issues 2 and 3).

The fixtures build small scenarios on hand-written hardware files in ``tests/data``
(``core_*.yaml``), so that expected values can be computed by hand in the tests.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
DATA = Path(__file__).resolve().parent / "data"
IDEAL_HW = DATA / "core_ideal.yaml"


def gpt_model(layers: int = 8, hidden: int = 1024, heads: int = 16, vocab: int = 8, **extra: Any) -> dict:
    """A GPT-style model mapping (gelu MLP of width 4h, no GQA); vocab tiny by default so that the
    embedding and output layer cost next to nothing and pipeline stages are uniform."""
    return {"layers": layers, "hidden": hidden, "heads": heads, "ffn_hidden": 4 * hidden, "vocab": vocab,
            "mlp": "gelu", **extra}


def scenario_dict(*, hardware: str | Path = IDEAL_HW, nodes: int | None = 1, gpus_per_node: int | None = None,
                  model: Any = None, training: dict | None = None, parallel: dict | None = None,
                  simulation: dict | None = None) -> dict:
    """A scenario mapping with sensible small defaults; ``gpus_per_node`` defaults to dp x tp x pp."""
    par = {"dp": 1, "tp": 1, "pp": 1, **(parallel or {})}
    raw: dict[str, Any] = {
        "name": "test",
        "hardware": str(hardware),
        "model": gpt_model() if model is None else model,
        "training": {"seq_len": 512, "global_batch": 8, "micro_batch": 1, **(training or {})},
        "parallel": par,
    }
    if nodes is not None:
        raw["nodes"] = nodes
        raw["gpus_per_node"] = gpus_per_node or par["dp"] * par["tp"] * par["pp"] // nodes
    if simulation:
        raw["simulation"] = simulation
    return raw


def make_scenario(**kwargs: Any):
    """A validated :class:`simtrain.spec.scenario.Scenario` from :func:`scenario_dict` keywords."""
    from simtrain.spec.scenario import scenario_from_dict

    return scenario_from_dict(scenario_dict(**kwargs), file="test.yaml", base_dir=DATA)


def hardware_variant(tmp_path: Path, changes: dict[str, Any], base: Path = IDEAL_HW, name: str = "hw") -> Path:
    """Write a copy of ``base`` with dotted keys replaced (e.g. ``{'intra_node.bandwidth': '50 GB/s'}``)."""
    data = copy.deepcopy(yaml.safe_load(base.read_text(encoding="utf-8")))
    for dotted, value in changes.items():
        node = data
        parts = dotted.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def run_cli(args: list[str], capsys) -> tuple[int, str, str]:
    """Run ``simtrain.cli.main(args)`` in-process; returns (exit status, stdout, stderr)."""
    from simtrain.cli import main

    with pytest.raises(SystemExit) as exc:
        main(args)
    out = capsys.readouterr()
    code = exc.value.code
    return (0 if code is None else int(code)), out.out, out.err


@pytest.fixture
def repo() -> Path:
    return REPO


@pytest.fixture
def simtrain_exe() -> list[str]:
    """The console script if installed beside this interpreter, else ``python -c`` on the entry point."""
    exe = Path(sys.executable).with_name("simtrain")
    if exe.exists():
        return [str(exe)]
    return [sys.executable, "-c", "import sys; from simtrain.cli import main; main(sys.argv[1:])"]


def assert_error_table_matches(results, file_name):
    """simtrain/validation/errors.json (the bands of `simtrain run`) holds exactly the gated errors a fresh
    validation of ``file_name`` gives; when the model moves, run tests/data/regenerate_validation_errors.py."""
    from simtrain.decide import validate as v
    from simtrain.report.bands import validation_errors

    fresh = [row for row in v.error_table(list(results))["cases"] if row["file"] == file_name]
    kept = [row for row in validation_errors() if row["file"] == file_name]
    assert kept == fresh, "simtrain/validation/errors.json is stale: run tests/data/regenerate_validation_errors.py"


def resolve_variant(scenario, layout: dict, max_memory: float):
    """A brute-force search's view of a layout (tests only, independent of decide.search): (its scenario, the layout
    with what its variant resolves to), or None where the rules refuse it, it does not fit within ``max_memory`` of
    the GPU, or its variant does not compete (the plain layout does the same). Variants are resolved by trying every
    count or module set in cost order, not by the search's bisection: offloading the fewest layers that fit (only
    where the plain layout does not); recomputing the fewest layers per stage in full that fit (only where the layout
    without recompute does not, and fewer than every layer); adding the first of [layernorm], [mlp],
    [layernorm, mlp] to selective recompute's modules that fits (only where the plain selective layout does not)."""
    from simtrain.decide.search_result import layout_overrides
    from simtrain.engine.simulation import memory
    from simtrain.spec.errors import InputError

    def within(sc) -> bool:
        mem = memory(sc)
        return mem.fits_in_memory and mem.peak_memory_bytes_max <= max_memory * mem.capacity_bytes

    try:
        sc = scenario.with_overrides(layout_overrides(layout))
    except InputError:
        return None
    plain = {k: v for k, v in layout.items() if k not in ("offload", "partial", "modules")}
    tries: list[tuple[str, Any, dict]] = []
    if layout.get("offload"):
        if within(sc):
            return None
        tries = [("activation_offload_layers", n, {"training.activation_offload_layers": n})
                 for n in range(1, sc.model.layers)]
    elif layout.get("partial"):
        if within(sc.with_overrides({"training.recompute": "none"})):
            return None
        tries = [("recompute_layers", n, {"training.recompute_layers": n})
                 for n in range(1, min(sc.layers_per_stage))]
    elif layout.get("modules"):
        if within(sc):
            return None
        base = list(sc.training.recompute_modules or ["core_attn"])
        tries = [("recompute_modules", base + extra, {"training.recompute_modules": base + extra})
                 for extra in (["layernorm"], ["mlp"], ["layernorm", "mlp"])]
    else:
        return (sc, plain) if within(sc) else None
    for key, value, keys in tries:
        try:
            moved = sc.with_overrides(keys)
        except InputError:
            continue
        if within(moved):
            return moved, {**plain, key: value}
    return None


def write_hf_config(tmp_path: Path, config: dict) -> Path:
    """Write ``config`` as an indented ``m/config.json`` under ``tmp_path`` (one key a line) and return its path."""
    import json

    path = tmp_path / "m" / "config.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(config, indent=2), encoding="utf-8")
    return path


def json_key_line(path: Path, key: str) -> int:
    """The line of ``"key":`` in a JSON file written one key a line."""
    return next(n for n, text in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if f'"{key}":' in text)
