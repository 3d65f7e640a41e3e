"""The notebook-first API (issue 24): one shape for the decision tools, results that read well in a cell, the way
from an answer to the next question, bundled material by name, money and calendar, sweeps as users mean them."""

from __future__ import annotations

import pandas as pd
import pytest
from conftest import DATA, REPO, gpt_model, hardware_variant, make_scenario, run_cli

import simtrain
from simtrain.decide.sweep_files import read_table, write_table
from simtrain.spec.errors import InputError

TWO_NODES = DATA / "core_two_nodes.yaml"
SMALL = gpt_model(layers=4, hidden=1024, heads=16, vocab=32000)


@pytest.fixture
def pipe():
    """Two equal stages on the ideal node, one micro-batch each."""
    return make_scenario(parallel={"pp": 2}, training={"global_batch": 4})


@pytest.fixture
def small_case(tmp_path):
    """2 nodes x 2 GPUs, global batch 8, 0.8 GiB GPUs so that some layouts do not fit."""
    hw = hardware_variant(tmp_path, {"gpu.memory": {"value": "0.8 GiB", "source": "test fixture"}}, base=TWO_NODES)
    return make_scenario(hardware=hw, nodes=2, gpus_per_node=2, model=SMALL, training={"global_batch": 8},
                         parallel={"dp": 4})


# --- 1. one shape: DataFrames with stable dtypes and plain names ------------------------------------------------

def test_sweep_columns_are_plain_names_with_fixed_dtypes(pipe):
    """A swept key's column is `parallel_pp` (an identifier); metrics are float64, fits a nullable boolean and
    error a string, whether or not a point failed (pp 3 does not divide the 8 layers)."""
    good = simtrain.sweep(pipe, {"parallel.pp": [2, 4]}, workers=1, progress=False)
    mixed = simtrain.sweep(pipe, {"parallel.pp": [2, 3]}, workers=1, progress=False)
    assert list(good.columns)[:2] == ["parallel_pp", "step_time_s"]
    assert mixed["error"].notna().tolist() == [False, True]
    expected = {"parallel_pp": "int64", "step_time_s": "float64", "tokens_per_s": "float64", "mfu": "float64",
                "bubble_fraction": "float64", "peak_memory_bytes_max": "float64", "fits_in_memory": "boolean",
                "error": "string"}
    assert {c: str(t) for c, t in good.dtypes.items()} == expected
    assert {c: str(t) for c, t in mixed.dtypes.items()} == expected


@pytest.mark.parametrize("suffix", [".csv", ".jsonl", ".parquet"])
def test_tables_keep_their_dtypes_through_a_file(pipe, tmp_path, suffix):
    """A sweep with a failed point, a search table and a comparison read back from CSV, JSON lines and Parquet
    with the dtypes and values they were written with."""
    tables = {"sweep": simtrain.sweep(pipe, {"parallel.schedule": ["gpipe", "1f1b"], "parallel.pp": [2, 3]},
                                      workers=1, progress=False),
              "search": simtrain.search(make_scenario(training={"global_batch": 8}), top=1, workers=1,
                                        progress=False).table,
              "compare": simtrain.compare([pipe], tokens="1B")}
    for name, table in tables.items():
        path = tmp_path / f"{name}{suffix}"
        write_table(table, path)
        back = read_table(path)
        pd.testing.assert_frame_equal(back, table, check_exact=True, obj=name)


def test_each_table_has_its_figure(pipe):
    """plot_sweep, plot_compare, plot_search and plot_validate return plotly Figures (nothing shown)."""
    import plotly.graph_objects as go

    charts = simtrain.charts
    assert isinstance(charts.plot_sweep(simtrain.sweep(pipe, {"parallel.pp": [2, 4]}, workers=1, progress=False)),
                      go.Figure)
    assert isinstance(charts.plot_compare(simtrain.compare([pipe], tokens="1B")), go.Figure)
    found = simtrain.search(make_scenario(training={"global_batch": 8}), top=2, workers=1, progress=False)
    assert isinstance(charts.plot_search(found), go.Figure)
    cases = simtrain.validate(only="torchtitan", progress=False)
    assert isinstance(charts.plot_validate(cases), go.Figure)
    assert str(cases["step_time_error"].dtype) == "float64" and str(cases["gate"].dtype) == "bool"


# --- 2. results in a notebook --------------------------------------------------------------------------------

def test_a_result_reads_well_in_a_cell():
    """repr one line; _repr_html_ a few kB with the header, the stage table and the verdict; summary() the text
    report; the frames one row per stage and per GPU; the figures plotly Figures."""
    import plotly.graph_objects as go

    from simtrain.report.text import memory_text, run_text
    from simtrain.spec.units import format_time

    r = simtrain.simulate("pp4_dp4")
    assert "\n" not in repr(r) and len(repr(r)) < 250 and f"step {format_time(r.step_time_s)}" in repr(r)
    page = r._repr_html_()
    assert len(page) < 5000 and "step time" in page and "fits: peak" in page and page.count("<tr>") >= 4 + 6
    assert r.summary() == run_text(r)
    assert len(r.stages_frame()) == 4 and len(r.devices_frame()) == 16
    assert r.devices_frame()["peak_memory_bytes"].max() == pytest.approx(r.peak_memory_bytes_max)
    assert isinstance(r.gantt(), go.Figure) and isinstance(r.memory_figure(), go.Figure)
    m = simtrain.memory("pp4_dp4")
    assert m.summary() == memory_text(m) and "memory only" in repr(m) and len(m._repr_html_()) < 5000
    with pytest.raises(ValueError, match="memory-only result has no timeline"):
        m.gantt()


def test_a_tight_fit_is_flagged():
    """A run whose headroom is below the ledger's measured error (7.8%) says so in its repr and HTML; pp4_dp4
    (27% free) does not."""
    from simtrain.report.notebook import headroom_note

    roomy = simtrain.memory("pp4_dp4")
    assert headroom_note(roomy) is None
    # the same run on a GPU of 1.05 x its peak: 4.8% free
    from dataclasses import replace

    tight = replace(roomy, capacity_bytes=roomy.peak_memory_bytes_max * 1.05)
    assert "inside the memory ledger's measured error (7.8%)" in headroom_note(tight)
    assert "(tight)" in repr(tight) and "may not fit" in tight._repr_html_()


# --- 3. from answer to next question -------------------------------------------------------------------------

def test_the_best_layout_is_a_runnable_scenario(small_case):
    """search(...).best.scenario simulates to the step time the search reported; .scenario(1) is the second."""
    found = simtrain.search(small_case, top=2, workers=1, progress=False)
    again = simtrain.simulate(found.best.scenario)
    assert again.step_time_s == found.top[0]["step_time_s"]
    second = found.scenario(1)
    assert (second.parallel.tp, second.parallel.pp, second.parallel.dp) == \
        (found.top[1]["tp"], found.top[1]["pp"], found.top[1]["dp"])
    assert "best tp" in repr(found) and len(found._repr_html_()) < 5000 and found.summary().startswith("#")


def test_fix_narrows_the_enumeration(small_case):
    """fix={'parallel.zero': 1, 'parallel.tp': [1, 2]} enumerates only those values; an unknown key is named."""
    from simtrain.decide.search import enumerate_layouts

    every = enumerate_layouts(small_case)
    fixed = enumerate_layouts(small_case, fix={"parallel.zero": 1, "parallel.tp": [1, 2]})
    assert fixed == [x for x in every if x["zero"] == 1 and x["tp"] in (1, 2)]
    found = simtrain.search(small_case, top=1, workers=1, progress=False, fix={"zero": 1})
    assert found.counts["enumerated"] == sum(1 for x in every if x["zero"] == 1) and found.best["zero"] == 1
    with pytest.raises(InputError, match="'parallel.zeros' is not a searched layout key") as err:
        simtrain.search(small_case, fix={"parallel.zeros": 1})
    assert err.value.field == "fix"
    assert str(err.value).startswith("fix: 'parallel.zeros'")   # the field named once (it read "fix: fix: ...")


def test_the_screening_is_reused_across_max_memory(small_case, monkeypatch):
    """A second search of the same scenario at another max_memory screens no layout the first screened again (only
    those the first never reached, and the variants whose offloaded or recomputed layers or modules are found for
    max_memory itself), and ranks as a fresh search at that max_memory does, row for row."""
    from simtrain.decide import search as search_module

    search_module._SCREENED.clear()
    first = simtrain.search(small_case, top=2, workers=1, progress=False, max_memory=1.0)
    calls = []
    real = search_module.screen
    monkeypatch.setattr(search_module, "screen",
                        lambda p, b, layouts, *a: calls.extend(layouts) or real(p, b, layouts, *a))
    second = simtrain.search(small_case, top=2, workers=1, progress=False, max_memory=0.6)
    assert first.counts["enumerated"] == second.counts["enumerated"]
    from simtrain.decide.search import VARIANTS, enumerate_layouts

    layouts = enumerate_layouts(small_case)    # the rows' order: a screened row is its layout's
    done_first = [layouts[i] for i, r in enumerate(first.rows) if r["status"] != "unscreened"
                  and "memory_floor_bytes" not in r and not any(layouts[i].get(k) for k in VARIANTS)]
    assert len(done_first) > 50
    assert calls and not any(layout in done_first for layout in calls)
    calls.clear()
    search_module._SCREENED.clear()
    fresh = simtrain.search(small_case, top=2, workers=1, progress=False, max_memory=0.6)
    assert calls and fresh.top == second.top and fresh.counts == second.counts and fresh.rows == second.rows


def test_the_default_margin_is_the_ledger_error():
    """The default max_memory keeps free the ledger's largest measured error: torchtitan's peaks, re-read from
    the bundled cases (predicted / measured - 1, both in GiB), are within LEDGER_ERROR, the largest within 0.1
    point of it; the default is 1 - LEDGER_ERROR rounded down to a hundredth."""
    from simtrain.decide.search import DEFAULT_MAX_MEMORY
    from simtrain.decide.validate import validate
    from simtrain.report.accuracy import LEDGER_ERROR

    errors = [c.predicted["memory_GiB"] / c.measured["memory_GiB"] - 1 for c in validate(only="torchtitan")]
    assert len(errors) == 2 and max(abs(e) for e in errors) == pytest.approx(LEDGER_ERROR, abs=1e-3)
    assert DEFAULT_MAX_MEMORY == 0.92


# --- 5. bundled material by name ----------------------------------------------------------------------------

def test_bundled_material_by_name(capsys):
    """load_scenario('pp4_dp4') loads the bundled file; scenarios/hardware/models list what ships, as does
    `simtrain list`; an unknown name suggests the nearest."""
    assert simtrain.load_scenario("pp4_dp4").raw == simtrain.load_scenario(REPO / "scenarios" / "pp4_dp4.yaml").raw
    assert simtrain.scenarios() == sorted(p.stem for p in (REPO / "scenarios").glob("*.yaml"))
    assert simtrain.hardware() == sorted(p.stem for p in (REPO / "hardware").glob("*.yaml"))
    assert "llama3-70b" in simtrain.models()
    with pytest.raises(InputError, match="did you mean 'pp4_dp4'"):
        simtrain.load_scenario("pp4_dp5")
    code, out, _ = run_cli(["list"], capsys)
    assert code == 0 and "pp4_dp4" in out and "dgx-h100" in out and "llama3-70b" in out


# --- 6. money and calendar -----------------------------------------------------------------------------------

def test_price_and_goodput(pipe):
    """A given price replaces the hardware file's; goodput 0.9 makes the days 1/0.9 longer; days, GPU-hours,
    USD and MWh follow from the throughput (hand formulas)."""
    base = simtrain.compare([pipe], tokens=1e9)
    priced = simtrain.compare([pipe], tokens=1e9, price_per_gpu_hour=2.0, goodput=0.9)
    row = priced.iloc[0]
    seconds = 1e9 / (row["tokens_per_s"] * 0.9)
    assert row["days"] == pytest.approx(seconds / 86400)
    assert row["gpu_hours"] == pytest.approx(2 * seconds / 3600)      # 2 GPUs (pp 2)
    assert row["cost_usd"] == pytest.approx(2.0 * 2 * seconds / 3600)
    assert row["days"] == pytest.approx(base.iloc[0]["days"] / 0.9)
    assert "steady-state" in base.attrs["time_note"] and "90%" in priced.attrs["time_note"]
    with pytest.raises(InputError, match="names no scenario or hardware"):
        simtrain.compare([pipe], price_per_gpu_hour={"dgx-z100": 1.0})
    with pytest.raises(InputError) as err:
        simtrain.compare([pipe], goodput=1.5)
    assert err.value.field == "goodput"


def test_a_scenario_overrides_the_hardware_price():
    """cost.price_per_gpu_hour in a scenario wins over the hardware file's list price; an argument wins over
    both."""
    sc = simtrain.load_scenario("compare_h100", {"cost.price_per_gpu_hour": 1.25})
    assert sc.price_per_gpu_hour == 1.25
    table = simtrain.compare([sc], tokens="1B")
    assert table["price_per_gpu_hour"].tolist() == [1.25] and table["price_source"].tolist() == ["scenario"]
    assert simtrain.compare([sc], tokens="1B", price_per_gpu_hour={"dgx-h100": 3.0})["price_per_gpu_hour"][0] == 3.0


def test_cli_compare_price_and_goodput(capsys):
    """`simtrain compare --price 2 --goodput 0.9` prints the given price, GPU-hours and the goodput note; a
    goodput out of range names the option."""
    path = str(REPO / "scenarios" / "pp4_dp4.yaml")
    code, out, _ = run_cli(["compare", path, "--tokens", "1B", "--price", "2", "--goodput", "0.9"], capsys)
    assert code == 0 and "$2.00 (given)" in out and "GPU-hours" in out and "goodput of 90%" in out
    code, _, err = run_cli(["compare", path, "--goodput", "2"], capsys)
    assert code == 2 and "--goodput 2" in err


# --- 7. sweeps as users mean them ----------------------------------------------------------------------------

def test_paired_points_and_zip(pipe):
    """A list of override dicts runs those points only; zip= pairs keys value by value, crossed with the rest."""
    listed = simtrain.sweep(pipe, [{"parallel.pp": 2, "training.global_batch": 4},
                                   {"parallel.pp": 4, "training.global_batch": 8}], workers=1, progress=False)
    assert listed[["parallel_pp", "training_global_batch"]].values.tolist() == [[2, 4], [4, 8]]
    zipped = simtrain.sweep(pipe, {"parallel.pp": [2, 4], "training.global_batch": [4, 8],
                                   "parallel.schedule": ["gpipe", "1f1b"]},
                            zip=["parallel.pp", "training.global_batch"], workers=1, progress=False)
    assert zipped[["parallel_pp", "training_global_batch", "parallel_schedule"]].values.tolist() == \
        [[2, 4, "gpipe"], [2, 4, "1f1b"], [4, 8, "gpipe"], [4, 8, "1f1b"]]
    with pytest.raises(InputError, match="one length"):
        simtrain.sweep(pipe, {"parallel.pp": [2, 4], "training.global_batch": [4]}, zip=["parallel.pp",
                                                                                         "training.global_batch"])


def test_dp_auto_follows_the_node_count():
    """parallel.dp: auto is GPUs / (tp x pp), so sweeping nodes scales DP: 2 and 4 DGX nodes with pp 4 give dp 4
    and 8."""
    sc = simtrain.load_scenario("pp4_dp4", {"parallel.dp": "auto", "training.global_batch": 64})
    assert sc.parallel.dp == 4
    assert sc.with_overrides({"nodes": 4}).parallel.dp == 8
    with pytest.raises(InputError, match="not a whole number of replicas of tp x pp x cp = 1 x 3 x 1"):
        sc.with_overrides({"parallel.pp": 3})


def test_a_grid_key_in_an_unknown_section_is_an_error_at_once(pipe):
    """`paralel.vpp` (a typo in the section) raises before any point runs, with a suggestion."""
    with pytest.raises(InputError, match=r"grid key 'paralel.vpp': unknown key \(did you mean 'parallel'"):
        simtrain.sweep(pipe, {"paralel.vpp": [1, 2]}, workers=1)


# --- 8. words for Python -------------------------------------------------------------------------------------

def test_python_errors_name_arguments_and_the_cli_names_flags(small_case, capsys):
    """From Python the message says gpus=, from the command line --gpus."""
    with pytest.raises(InputError, match=r"gpus=3 is not a whole number of 2-GPU nodes"):
        simtrain.search(small_case, gpus=3)
    code, _, err = run_cli(["search", str(REPO / "scenarios" / "pp4_dp4.yaml"), "--gpus", "12"], capsys)
    assert code == 2 and "--gpus 12 is not a whole number of 8-GPU nodes" in err


def test_an_override_error_names_no_flag_in_python_and_set_on_the_command_line(capsys):
    """A value from ``overrides=`` is "set by an override" in Python (no CLI flag named); the command line says
    --set, the flag the user typed."""
    path = REPO / "scenarios" / "pp4_dp4.yaml"
    with pytest.raises(InputError) as err:
        simtrain.load_scenario(path, {"parallel.tp": "abc"})
    assert "(value set by an override, not by the file)" in err.value.message and "--" not in err.value.message
    with pytest.raises(InputError) as err:          # a section rule: the keys an override set inside it
        simtrain.load_scenario(path, {"parallel.vpp": 3})
    assert "set by an override" in err.value.message and "--set" not in err.value.message
    code, _, err_text = run_cli(["run", str(path), "--set", "parallel.tp=abc"], capsys)
    assert code == 2 and "(value set by an override such as --set, not by the file)" in err_text


# --- 10. defaults from the model family ---------------------------------------------------------------------

def test_llama_presets_train_without_dropout_unless_the_scenario_says_so():
    """A Llama preset brings dropout false (Meta's reference code has none) and the report says it assumed so;
    an explicit training.dropout wins and nothing is assumed."""
    sc = simtrain.load_scenario("pp4_dp4")
    assert sc.model.dropout is False and sc.training.dropout is False
    assert sc.assumed and "training.dropout: false" in sc.assumed[0]
    result = simtrain.simulate(sc)
    assert "assumed: training.dropout: false" in result.summary()
    assert result.config["assumed"] == list(sc.assumed)
    explicit = simtrain.load_scenario("pp4_dp4", {"training.dropout": True})
    assert explicit.training.dropout is True and explicit.assumed == ()


@pytest.mark.parametrize("config, expected", [
    ({"model_type": "llama"}, False),                               # the family's default, no probability stated
    ({"model_type": "mistral", "attention_dropout": 0.0}, False),
    ({"model_type": "gpt2", "resid_pdrop": 0.1, "embd_pdrop": 0.1, "attn_pdrop": 0.1}, True),
    ({"model_type": "qwen2", "attention_dropout": 0.1}, True),      # a stated probability wins over the family
    ({"model_type": "falcon"}, None),                               # not known: training.dropout's own default
])
def test_hf_configs_bring_their_dropout(config, expected):
    """A HuggingFace config's dropout: from its stated probabilities, else from its family (Llama, Mistral, Qwen,
    DeepSeek: none), else unknown."""
    from simtrain.spec.model_hf import hf_dropout

    assert hf_dropout(config) is expected


def test_selective_recompute_with_flash_attention_is_flagged():
    """With flash attention, selective recompute keeps the same activations as none (the scores it would drop are
    never stored) and costs time: the ledger and the engine say so, and a warning names it."""
    base = simtrain.load_scenario("pp4_dp4")
    none = simtrain.simulate(base)
    selective = simtrain.simulate(base.with_overrides({"training.recompute": "selective"}))
    assert selective.peak_memory_bytes_max == none.peak_memory_bytes_max
    assert selective.step_time_s > none.step_time_s
    assert any("flash2 attention never stores" in w for w in selective.warnings)
    assert not any("never stores" in w for w in none.warnings)
    eager = simtrain.load_scenario("pp4_dp4", {"training.recompute": "selective", "training.flash_attention": False})
    assert not any("never stores" in w for w in eager.warnings)


# --- 4. progress, 9. charts that travel ----------------------------------------------------------------------

def test_search_progress_counts_pruned_and_simulated_without_an_eta(small_case, capsys):
    """Forced on, the search shows a screening bar, then one counting pruned and simulated layouts that gives no
    remaining time (tqdm writes it as '<mm:ss'); off by default on a captured stderr."""
    from simtrain.decide import search as search_module

    search_module._SCREENED.clear()
    simtrain.search(small_case, top=1, workers=1, progress=True)
    err = capsys.readouterr().err
    later = [line for line in err.replace("\r", "\n").splitlines() if line.startswith("bound and simulate")]
    assert "screen" in err and later and any("pruned" in line for line in later)
    assert not any("<" in line for line in later)
    search_module._SCREENED.clear()
    simtrain.search(small_case, top=1, workers=1)
    assert capsys.readouterr().err == ""


def test_notebook_renderer_sets_an_exportable_renderer():
    """notebook_renderer() makes figures carry an HTML copy (plotly's notebook renderer); an unknown mode is
    named."""
    import plotly.io as pio

    before = pio.renderers.default
    try:
        assert simtrain.charts.notebook_renderer() == "plotly_mimetype+notebook" == pio.renderers.default
        assert simtrain.charts.notebook_renderer("cdn").endswith("notebook_connected")
        with pytest.raises(InputError) as err:
            simtrain.charts.notebook_renderer("svg")
        assert err.value.field == "mode"
    finally:
        pio.renderers.default = before


def test_cli_search_fix(tmp_path, capsys):
    """`simtrain search --fix parallel.zero=1 --fix parallel.pp=1,2` ranks only such layouts; an unknown key is
    exit 2 naming --fix."""
    import yaml
    from conftest import scenario_dict

    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(scenario_dict(nodes=2, gpus_per_node=2, hardware=TWO_NODES, model=SMALL,
                                                 training={"global_batch": 8}, parallel={"dp": 4})))
    out = tmp_path / "all.csv"
    code, stdout, _ = run_cli(["search", str(path), "--fix", "parallel.zero=1", "--fix", "parallel.pp=1,2",
                               "--workers", "1", "--out", str(out)], capsys)
    table = read_table(out)
    assert code == 0 and set(table["zero"]) == {1} and set(table["pp"]) <= {1, 2}
    code, _, err = run_cli(["search", str(path), "--fix", "parallel.zeros=1", "--workers", "1"], capsys)
    assert code == 2 and "--fix 'parallel.zeros' is not a searched layout key" in err


def test_compare_flags_a_tight_fit(pipe):
    """compare warns when a scenario fits with less headroom than the ledger's measured error (7.8%): the same
    rows with the capacity set to 1.05 x the peak (4.8% free) warn, the roomy original does not."""
    from simtrain.decide.compare import compare, warnings_for

    rows = compare([pipe], tokens="1B")
    assert not any("ledger" in w for w in warnings_for(rows))
    tight = [{**rows[0], "memory_capacity_bytes": rows[0]["peak_memory_bytes_max"] * 1.05}]
    assert any("inside the memory ledger's measured error (7.8%)" in w for w in warnings_for(tight))
