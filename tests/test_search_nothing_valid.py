"""A search none of whose layouts is valid says so: how many, and the commonest reason, exit status 2 (nothing in
the space is valid for this scenario: its input is at fault), instead of "no layout fits ... try more GPUs"."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from conftest import DATA, run_cli

from simtrain.decide.search import search
from simtrain.spec.scenario import load_scenario

# recompute_modules applies to selective recompute only (scenario rules), and --fix keeps recompute none only:
# every layout breaks that rule, whatever its tp, pp, dp
SCENARIO = (f"hardware: {DATA / 'core_two_nodes.yaml'}\nnodes: 1\ngpus_per_node: 4\n"
            "model: {layers: 4, hidden: 1024, heads: 16, ffn_hidden: 4096, vocab: 32000, mlp: gelu}\n"
            "training: {seq_len: 512, global_batch: 4, recompute: selective, recompute_modules: [mlp]}\n"
            "parallel: {dp: 4}\n")
RULE = "training.recompute_modules: ['mlp'] applies to recompute: selective (Megatron's --recompute-modules), but " \
       "recompute is 'none'"


@pytest.fixture
def scenario_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.yaml").write_text(SCENARIO, encoding="utf-8")
    return "s.yaml"


def test_cli_search_with_no_valid_layout_exits_2_with_the_count_and_reason(scenario_file, capsys):
    """Rule: exit 2, one sentence: every one of the N layouts (N = the rows --out holds) is invalid, the commonest
    reason, and where every layout's error is; --out is written first."""
    code, out, err = run_cli(["search", scenario_file, "--fix", "training.recompute=none", "--workers", "1",
                              "--out", "all.csv", "--no-progress"], capsys)
    with open("all.csv", newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert {r["status"] for r in rows} == {"invalid"}
    assert (code, out) == (2, "")
    assert err.startswith(f"error: every one of the {len(rows)} layouts of 4 GPUs is invalid; the commonest reason "
                          f"({len(rows)} of them): s.yaml:5: {RULE}")   # line 5: training
    assert err.endswith(" (all.csv holds every layout's error)\n") and err.count("\n") == 1
    assert "no layout fits" not in err


def test_summary_of_a_search_with_no_valid_layout_names_the_reason_not_memory(scenario_file):
    """The Python API returns the result; its summary ends with the same sentence, not 'try more GPUs'."""
    result = search(load_scenario(scenario_file), fix={"training.recompute": "none"}, workers=1, progress=False)
    last = result.summary().splitlines()[-1]
    assert last.startswith(f"every one of the {len(result.rows)} layouts of 4 GPUs is invalid; the commonest reason")
    assert RULE in last and "try more GPUs" not in result.summary()


def test_a_scenarios_context_parallelism_does_not_leak_into_layouts_without_it(tmp_path, monkeypatch):
    """seq_len 512 keeps cp out of the search (it is searched from 8,192 tokens a CP rank): the scenario's own
    cp 2 (dp 2 x cp 2 = 4 GPUs) was carried into every layout of tp x pp x dp = 4, each then 8 GPUs and invalid
    (found by the search fixes' helper). The layouts now say cp 1: some are valid, and each has tp x pp x dp = 4."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.yaml").write_text(SCENARIO.replace(", recompute: selective, recompute_modules: [mlp]", "")
                                     .replace("parallel: {dp: 4}", "parallel: {dp: 2, cp: 2}"), encoding="utf-8")
    result = search(load_scenario("s.yaml"), workers=1, progress=False)
    assert result.top and all(r.get("cp", 1) == 1 and r["tp"] * r["pp"] * r["dp"] == 4 for r in result.rows)


def _break(monkeypatch, module, name: str, scenario_file: str) -> None:
    """``module.name`` raises ZeroDivisionError (a stand-in for a simtrain bug); the screening cache starts empty;
    the scenario file is the one without recompute_modules, so layouts are valid until the broken call."""
    from collections import OrderedDict

    import simtrain.decide.search as search_module

    def broken(*args, **kwargs):
        raise ZeroDivisionError("float division by zero")

    monkeypatch.setattr(search_module, "_SCREENED", OrderedDict())
    monkeypatch.setattr(module, name, broken)
    Path(scenario_file).write_text(SCENARIO.replace(", recompute: selective, recompute_modules: [mlp]", ""),
                                   encoding="utf-8")


def test_a_search_whose_layouts_all_fail_with_a_bug_is_an_internal_error(scenario_file, capsys, monkeypatch):
    """A 'failed' layout is a simtrain bug (an exception other than an input error): when none made the top and
    some failed, the CLI takes the internal-error path (exit 1, 'this is a simtrain bug') and quotes the commonest
    failure, not the input's fault (the review found exit 2 blaming the input for a ZeroDivisionError). The
    screening cache is emptied first and is left without the failures (a review found them replayed into the next
    search of the same scenario)."""
    import simtrain.decide.search as search_module
    import simtrain.plan.memory as memory

    _break(monkeypatch, memory, "memory_report", scenario_file)
    code, out, err = run_cli(["search", scenario_file, "--workers", "1", "--no-progress"], capsys)
    assert code == 1 and out == "", err
    assert err.startswith("internal error: RuntimeError: ") and "failed (a simtrain bug) and none made the top" in err
    assert "the commonest failure" in err and "ZeroDivisionError: float division by zero" in err, err
    assert all(not any(row.get("status") == "failed" for row in cached.values())
               for cached in search_module._SCREENED.values())


def test_layouts_that_fit_but_fail_when_simulated_are_a_bug_not_a_memory_verdict(scenario_file, capsys,
                                                                                    monkeypatch):
    """Some layouts do not fit, the ones that fit fail in the engine with a bug: nothing makes the top, and the
    search says the failures are why (exit 1), not 'no layout fits ... try more GPUs' at exit 0 (found by review);
    the layouts screened invalid or out of memory stay in the table as they were."""
    import simtrain.engine.simulation as simulation

    _break(monkeypatch, simulation, "simulate", scenario_file)
    code, out, err = run_cli(["search", scenario_file, "--workers", "1", "--no-progress", "--out", "t.csv"], capsys)
    with open("t.csv", newline="", encoding="utf-8") as f:
        statuses = {r["status"] for r in csv.DictReader(f)}
    assert "failed" in statuses and statuses - {"failed"}, statuses
    assert code == 1 and "no layout fits" not in err, err
    assert "failed (a simtrain bug) and none made the top; the commonest failure" in err, err


def test_a_layout_the_engine_refuses_for_a_limit_is_invalid_not_failed():
    """simulate_layout: an input error raised while simulating (simulation.max_events, say) is the layout's input
    at fault: status invalid, as the scenario rules' refusals are in screening; only other exceptions are failed."""
    from simtrain.decide import search as search_module
    from simtrain.decide.sweep import ScenarioPayload
    from simtrain.spec.errors import SimulationLimitError

    def refuse(*args, **kwargs):
        raise SimulationLimitError("this run needs at least about 9 simulated events")

    sc = load_scenario(str(DATA.parent / "bad_inputs" / "good" / "base.yaml"))
    import simtrain.engine.simulation as simulation
    original = simulation.simulate
    try:
        simulation.simulate = refuse
        row = search_module.simulate_layout(ScenarioPayload.of(sc), {}, {"tp": 1, "pp": 2, "dp": 2})
    finally:
        simulation.simulate = original
    assert row["status"] == "invalid" and "simulated events" in row["error"]
