"""Determinism (issue 8, deliverable 4): the same input gives byte-identical JSON reports across
runs, across PYTHONHASHSEED values and between a sweep worker process and a direct run.

The scenario exercises every source of randomness and ordering simtrain has: full fidelity (one
lane per replica), seeded jitter, a random fraction of straggling GPUs, and a pipeline of more
than one stage over two nodes.
"""

from __future__ import annotations

import multiprocessing
import os
import subprocess
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest

from simtrain.engine.simulation import simulate
from simtrain.report.outputs import dumps_json
from simtrain.spec.scenario import load_scenario, parse_set

SCENARIO = Path(__file__).resolve().parent / "bad_inputs" / "good" / "base.yaml"
SETS = ["nodes=2", "gpus_per_node=4", "parallel.dp=4", "training.global_batch=16", "simulation.fidelity=full",
        "simulation.jitter=0.1", "simulation.seed=7", "simulation.stragglers=[{fraction: 0.25, slowdown: 1.3}]"]


def _report_bytes(path: str, sets: list[str]) -> bytes:
    """The JSON report of a direct run, as `simtrain run --json` writes it."""
    result = simulate(load_scenario(path, parse_set(sets)))
    return dumps_json(result.to_dict()).encode("utf-8")


def _cli_args(json_path: Path) -> list[str]:
    args = ["run", str(SCENARIO), "--json", str(json_path)]
    for item in SETS:
        args += ["--set", item]
    return args


def test_same_input_twice_in_one_process():
    """Two runs of the same scenario in one process give byte-identical reports (seeded randomness)."""
    first, second = _report_bytes(str(SCENARIO), SETS), _report_bytes(str(SCENARIO), SETS)
    assert first == second
    assert b'"timeline"' in first and b'"fidelity": "full"' in first


def test_a_different_seed_changes_the_report():
    """The seed matters (so the test above is not trivially comparing constant output)."""
    other = [s if not s.startswith("simulation.seed=") else "simulation.seed=8" for s in SETS]
    assert _report_bytes(str(SCENARIO), SETS) != _report_bytes(str(SCENARIO), other)


def test_reports_identical_whatever_the_hash_seed(tmp_path, simtrain_exe):
    """`simtrain run --json` writes the same bytes under PYTHONHASHSEED=0, 1 and random, and the
    same bytes as a direct in-process run."""
    outputs = []
    for seed in ("0", "1", "random"):
        out = tmp_path / f"report-{seed}.json"
        env = {**os.environ, "PYTHONHASHSEED": seed}
        proc = subprocess.run([*simtrain_exe, *_cli_args(out)], env=env, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        outputs.append(out.read_bytes())
    assert outputs[0] == outputs[1] == outputs[2]
    assert outputs[0] == _report_bytes(str(SCENARIO), SETS)


def test_spawned_worker_matches_direct_run():
    """A report computed in a freshly spawned worker process (as sweeps run points) is byte-identical
    to the direct run's."""
    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        remote = pool.submit(_report_bytes, str(SCENARIO), SETS).result(timeout=120)
    assert remote == _report_bytes(str(SCENARIO), SETS)


def test_sweep_workers_match_direct_runs():
    """simtrain.sweep(..., workers=2) gives exactly (bit for bit) the metrics of direct runs of each point, as their
    JSON reports write them."""
    sweep_module = pytest.importorskip("simtrain.decide.sweep")
    scenario = load_scenario(SCENARIO, parse_set(SETS))
    grid = {"simulation.seed": [1, 2], "training.micro_batch": [1, 2]}
    table = sweep_module.sweep(scenario, grid, workers=2, progress=False)
    assert len(table) == 4 and table["error"].isna().all()
    for row in table.to_dict("records"):
        # a swept key's column is its dotted name with underscores (simtrain.decide.tables.column_name)
        direct = simulate(scenario.with_overrides({key: row[key.replace(".", "_")] for key in grid})) \
            .to_dict(timeline=False)
        for metric in ("step_time_s", "tokens_per_s", "mfu", "bubble_fraction", "peak_memory_bytes_max"):
            assert row[metric] == direct[metric], (row, metric)


def test_charts_are_the_same_page_twice(tmp_path):
    """The Gantt and memory pages of one report are byte-identical from run to run (plotly's div ids would
    otherwise be random)."""
    from simtrain.report import charts

    result = simulate(load_scenario(SCENARIO))
    pages = []
    for k in (1, 2):
        charts.write_outputs(result, gantt=tmp_path / f"g{k}.html", memory=tmp_path / f"m{k}.html")
        pages.append(((tmp_path / f"g{k}.html").read_bytes(), (tmp_path / f"m{k}.html").read_bytes()))
    assert pages[0] == pages[1]


def test_report_json_layout_is_a_key_a_line_and_a_row_a_line():
    """dumps_json's layout, written out by hand: sorted keys one per line, each list item (row, sentence) on its own
    line, a list of numbers on one line, empty containers inline; it parses back to the same value."""
    import json

    from simtrain.report.outputs import dumps_json

    value = {"b": [1, 2.5], "a": {"z": None, "y": []}, "rows": [{"k": 1, "j": [0, 1]}, {"k": 2}], "says": ["é"],
             "grid": [[1, 2], [3]], "empty": {}}
    expected = ('{\n "a": {\n  "y": [],\n  "z": null\n },\n "b": [1, 2.5],\n "empty": {},\n'
                ' "grid": [\n  [1, 2],\n  [3]\n ],\n "rows": [\n  {"j": [0, 1], "k": 1},\n  {"k": 2}\n ],\n'
                ' "says": [\n  "é"\n ]\n}\n')
    assert dumps_json(value) == expected
    assert json.loads(expected) == value


def test_report_json_rows_of_lists_are_cut_only_at_item_boundaries():
    """A list of lists is a row a line even when an item's text holds the "], [" the rows are cut at (a string,
    a nested list): written out by hand, it parses back to the same value."""
    import json

    from simtrain.report.outputs import dumps_json

    value = {"plain": [[1, "a"], [], [2.5, None]], "tricky": [["x], [y"], [[1], [2]], [3]],
             "nested": [[1, [2]], [[3], 4]]}
    expected = ('{\n "nested": [\n  [1, [2]],\n  [[3], 4]\n ],\n "plain": [\n  [1, "a"],\n  [],\n  [2.5, null]\n ],\n'
                ' "tricky": [\n  ["x], [y"],\n  [[1], [2]],\n  [3]\n ]\n}\n')
    assert dumps_json(value) == expected
    assert json.loads(expected) == value
