"""`simtrain compare` (issue 5, deliverable 5): scenarios side by side, time to train a token budget,
cost from the hardware file's price per GPU-hour, board energy from its GPU power."""

from __future__ import annotations

import pytest
import yaml
from conftest import DATA, REPO, gpt_model, make_scenario, run_cli

from simtrain.decide.compare import compare, compare_text, warnings_for
from simtrain.engine.simulation import simulate
from simtrain.spec.scenario import load_scenario

H100 = REPO / "scenarios" / "compare_h100.yaml"
A100 = REPO / "scenarios" / "compare_a100.yaml"


def _hardware_yaml(name: str) -> dict:
    return yaml.safe_load((REPO / "hardware" / f"{name}.yaml").read_text(encoding="utf-8"))


def test_shipped_scenarios_compare_like_with_like():
    """compare_h100 and compare_a100 train the same model and batch, on DGX H100 and DGX A100, and fit."""
    a, b = load_scenario(H100), load_scenario(A100)
    assert (a.model.name, a.training.global_batch, a.training.seq_len) == \
        (b.model.name, b.training.global_batch, b.training.seq_len)
    assert a.model.name in ("llama2-13b", "llama3-8b")
    assert (a.hardware.name, b.hardware.name) == ("dgx-h100", "dgx-a100")
    rows = compare([a, b], tokens=1e12)
    assert all(r["fits_in_memory"] for r in rows)
    assert warnings_for(rows) == []


def test_time_cost_and_energy_follow_from_throughput():
    """time = tokens / tokens_per_s; cost = USD per GPU-hour x GPUs x hours; energy = W x GPUs x s,
    with the price and power read from the hardware file."""
    sc = load_scenario(H100)
    hw = _hardware_yaml("dgx-h100")
    price = float(hw["cost"]["price_per_gpu_hour"]["value"])
    watts = float(str(hw["gpu"]["power"]["value"]).split()[0])
    tokens_per_s = simulate(sc).tokens_per_s
    (row,) = compare([sc], tokens=3e11)
    seconds = 3e11 / tokens_per_s
    assert row["time_to_train_s"] == pytest.approx(seconds, rel=1e-12)
    assert row["cost_usd"] == pytest.approx(price * 16 * seconds / 3600, rel=1e-12)
    assert row["energy_j"] == pytest.approx(watts * 16 * seconds, rel=1e-12)


def test_no_price_or_power_shows_a_dash():
    """A hardware file without cost or GPU power: cost and energy are None and print as '-'."""
    sc = make_scenario(hardware=DATA / "core_two_nodes.yaml", nodes=1, gpus_per_node=2,
                       model=gpt_model(), parallel={"dp": 2})
    (row,) = compare([sc], tokens=1e9)
    assert row["cost_usd"] is None and row["energy_j"] is None
    cost_line = next(line for line in compare_text([row]).splitlines() if line.startswith("cost for 1B tokens"))
    assert cost_line.split()[-1] == "-"


def test_different_models_are_flagged():
    """Comparing different models or batches warns that it is not like for like."""
    a = make_scenario(model=gpt_model(layers=8), training={"global_batch": 8})
    b = make_scenario(model=gpt_model(layers=8, name="other"), training={"global_batch": 16})
    text = compare_text(compare([a, b], tokens=1e9))
    assert "different models" in text and "different global batches" in text


def test_differences_are_listed_in_the_scenarios_order():
    """The warning's values follow the columns (64 then 128), not text order ('128' < '64' as strings)."""
    a = make_scenario(training={"global_batch": 64})
    b = make_scenario(training={"global_batch": 128})
    text = compare_text(compare([a, b], tokens=1e9))
    assert "different global batches (64, 128)" in text


def test_cli_compare_table_and_plot(tmp_path, capsys):
    """`simtrain compare A B --tokens 1T --plot x.html`: one column per scenario, a board-power note, a chart."""
    plot = tmp_path / "c.html"
    code, out, err = run_cli(["compare", str(H100), str(A100), "--tokens", "1T", "--plot", str(plot)], capsys)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].split() == ["compare_h100", "compare_a100"]
    assert any(line.startswith("time for 1T tokens") for line in lines)
    assert any(line.startswith("cost for 1T tokens") and line.count("$") == 2 for line in lines)
    assert "board power (TDP) x GPUs x time only" in out
    assert plot.read_text().startswith("<!DOCTYPE html>")


def test_cli_compare_rejects_a_bad_token_count(capsys):
    """--tokens must be a count such as 1T or 300B: exit status 2 with the reason."""
    code, _, err = run_cli(["compare", str(H100), "--tokens", "lots"], capsys)
    assert code == 2
    assert "'lots' is not a count" in err


def test_small_budgets_print_in_small_units(capsys):
    """1M tokens on pp4_dp4 take 1e6 / (tokens/s) seconds, about 11 s, and cost 16 GPUs x that x $/GPU-hour / 3600,
    under a dollar: printed in seconds and cents, not as '0.0 h' and '$0'."""
    pp4 = simulate(load_scenario(REPO / "scenarios/pp4_dp4.yaml"))
    seconds = 1e6 / pp4.tokens_per_s
    price = yaml.safe_load((REPO / "hardware/dgx-h100.yaml").read_text())["cost"]["price_per_gpu_hour"]["value"]
    dollars = 16 * seconds * float(str(price).lstrip("$").split()[0]) / 3600
    code, out, _ = run_cli(["compare", str(REPO / "scenarios/pp4_dp4.yaml"), str(REPO / "scenarios/compare_h100.yaml"),
                            "--tokens", "1000000"], capsys)
    assert code == 0 and 1 < seconds < 60 and dollars < 100
    row = next(line for line in out.splitlines() if line.startswith("time for"))
    assert f"{seconds:.1f} s" in row
    cost = next(line for line in out.splitlines() if line.startswith("cost for"))
    assert f"${dollars:.2f}" in cost


def test_scenario_names_are_text_in_the_chart():
    """A scenario name with markup is shown as text on the bars' axis (escaped), as in the other charts."""
    from simtrain.decide.compare import compare_figure

    a = make_scenario(training={"global_batch": 8})
    rows = compare([a], tokens=1e9)
    rows[0]["scenario"] = "<b>x</b>"
    assert list(compare_figure(rows).data[0].x) == ["&lt;b&gt;x&lt;/b&gt;"]


def test_compare_repeats_each_scenario_warnings(tmp_path, capsys):
    """`simtrain run` warns of a hardware file without its `compute` section; `simtrain compare` must too, named by
    scenario."""
    hw = _hardware_yaml("dgx-h100")
    hw.pop("compute")
    (tmp_path / "hw.yaml").write_text(yaml.safe_dump(hw), encoding="utf-8")
    raw = yaml.safe_load(H100.read_text(encoding="utf-8"))
    raw.update(hardware="hw.yaml", name="bare")
    (tmp_path / "bare.yaml").write_text(yaml.safe_dump(raw), encoding="utf-8")
    code, out, err = run_cli(["compare", str(H100), str(tmp_path / "bare.yaml")], capsys)
    assert code == 0, err
    warned = [line for line in out.splitlines() if line.startswith("warning: ")]
    assert [line for line in warned if line.startswith("warning: bare: hardware") and "no compute section" in line]
    assert not [line for line in warned if line.startswith("warning: compare_h100:")]


def test_a_layout_that_does_not_fit_is_warned_of_once():
    """The run's own "does not fit: peak ..." warning is not repeated beside compare's "does not fit in memory"."""
    row = {"scenario": "big", "model": "m", "global_batch": 8, "seq_len": 2048, "fits_in_memory": False,
           "warnings": ["does not fit: peak 90.0 GB > 85.5 GB per GPU", "TP group of 16 spans nodes"]}
    assert warnings_for([row]) == ["big: does not fit in memory", "big: TP group of 16 spans nodes"]


def test_a_short_time_to_train_keeps_its_digits():
    """1,000 tokens at about 100,000 tokens/s take about 10 ms: shown in ms, not rounded to '0.0 s'."""
    from simtrain.decide.compare import _days
    assert (_days(0.00953), _days(42.0), _days(90.0), _days(7200.0), _days(172800.0)) == \
        ("9.53 ms", "42.0 s", "1.5 min", "2.0 h", "2.0 days")


def test_cli_compare_json_is_the_rows_and_warnings(tmp_path, capsys):
    """`simtrain compare A B --json c.json`: one row per scenario with the text's numbers (time = tokens /
    tokens_per_s, from the rows themselves), whole bytes, the warnings; byte-identical on a second run."""
    import json

    out1, out2 = tmp_path / "c1.json", tmp_path / "c2.json"
    for out in (out1, out2):
        code, _, err = run_cli(["compare", str(H100), str(A100), "--tokens", "300B", "--json", str(out)], capsys)
        assert code == 0, err
    assert out1.read_bytes() == out2.read_bytes()
    report = json.loads(out1.read_text(encoding="utf-8"))
    assert [r["scenario"] for r in report["rows"]] == ["compare_h100", "compare_a100"]
    for row in report["rows"]:
        assert row["tokens"] == 300e9
        assert row["time_to_train_s"] == pytest.approx(300e9 / row["tokens_per_s"], rel=1e-8)
        assert isinstance(row["peak_memory_bytes_max"], int) and isinstance(row["memory_capacity_bytes"], int)
    assert report["warnings"] == []
