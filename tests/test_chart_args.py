"""Rule: a chart function handed a value of the wrong kind says so in one sentence that names the function, the
argument, the kind given and the kinds allowed (a TypeError, as simtrain.simulate does for its scenario), instead of
Python's own AttributeError from deep inside the chart (the seventeenth session's audit left about eight of these).
The expected sentences are written out here by hand."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

import simtrain
from simtrain.report import charts

RUN = "a Result (simtrain.simulate) or its JSON report (a dict)"
ROWS = "a pandas DataFrame or a list of rows (dicts)"
PATH = "a file path (str or pathlib.Path)"


@pytest.mark.parametrize("call, sentence", [
    (lambda: charts.plot_gantt(5), f"simtrain.charts.plot_gantt: the run must be {RUN}, not int"),
    (lambda: charts.plot_memory(None), f"simtrain.charts.plot_memory: the run must be {RUN}, not NoneType"),
    (lambda: charts.gantt_figure("run.json"), f"simtrain.charts.gantt_figure: the run must be {RUN}, not str"),
    (lambda: charts.memory_figure([]), f"simtrain.charts.memory_figure: the run must be {RUN}, not list"),
    (lambda: charts.trace_events(1.5), f"simtrain.charts.trace_events: the run must be {RUN}, not float"),
    (lambda: charts.report_of(5), f"simtrain.charts.report_of: the run must be {RUN}, not int"),
    (lambda: charts.write_outputs(5, gantt="g.html"), f"simtrain.charts.write_outputs: the run must be {RUN}, not int"),
    (lambda: charts.gantt_figure({}, max_bars="9"), "simtrain.charts.gantt_figure: max_bars must be a whole number, "
                                                    "not str"),
    (lambda: charts.gantt_figure({}, max_bars=True), "simtrain.charts.gantt_figure: max_bars must be a whole number, "
                                                     "not bool"),
    (lambda: charts.plot_sweep([]), "simtrain.charts.plot_sweep: the table must be a pandas DataFrame "
                                    "(simtrain.sweep returns one), not list"),
    (lambda: charts.plot_sweep(pd.DataFrame({"a": [1]}), x=1), "simtrain.charts.plot_sweep: x must be a string or "
                                                               "None, not int"),
    (lambda: charts.sweep_figure(5, "a"), "simtrain.charts.sweep_figure: df must be a pandas DataFrame "
                                          "(simtrain.sweep returns one), not int"),
    (lambda: charts.heatmap_figure(pd.DataFrame({"a": [1]}), "a", None, "mfu"),
     "simtrain.charts.heatmap_figure: y must be a string, not NoneType"),
    (lambda: charts.plot_compare("ab"), f"simtrain.charts.plot_compare: the table must be {ROWS}, not str"),
    (lambda: charts.plot_compare([1]), "simtrain.charts.plot_compare: each row of the table must be a mapping of "
                                       "column names to values (a dict), not int"),
    (lambda: charts.compare_figure(5), f"simtrain.charts.compare_figure: the rows must be {ROWS}, not int"),
    (lambda: charts.search_figure(5), f"simtrain.charts.search_figure: top must be {ROWS}, not int"),
    (lambda: charts.validate_figure(5), f"simtrain.charts.validate_figure: cases must be {ROWS}, not int"),
    (lambda: charts.plot_validate("v"), f"simtrain.charts.plot_validate: the table must be {ROWS}, not str"),
    (lambda: charts.plot_search(5), "simtrain.charts.plot_search: result must be a SearchResult (simtrain.search), "
                                    "not int"),
    (lambda: charts.plot_saved(5, gantt="g.html"), f"simtrain.charts.plot_saved: report_json_path must be {PATH}, "
                                                   "not int"),
    (lambda: charts.plot_saved("r.json", trace=5), f"simtrain.charts.plot_saved: trace must be {PATH} or None, "
                                                   "not int"),
    (lambda: charts.write_figure(5, "t", []), f"simtrain.charts.write_figure: path must be {PATH}, not int"),
    (lambda: charts.write_figure("f.html", 5, []), "simtrain.charts.write_figure: title must be a string, not int"),
    (lambda: charts.write_figure("f.html", "t", 5), "simtrain.charts.write_figure: figures must be a list of plotly "
                                                    "Figures, not int"),
    (lambda: charts.figures_html("t", [5]), "simtrain.charts.figures_html: each item of figures must be a plotly "
                                            "Figure, not int"),
    (lambda: charts.figure_svg(5), "simtrain.charts.figure_svg: fig must be a plotly Figure or its to_dict(), "
                                   "not int"),
])
def test_wrong_kind_is_one_sentence(call, sentence, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(TypeError) as err:
        call()
    assert str(err.value) == sentence
    assert list(tmp_path.iterdir()) == []          # nothing written on the way


def test_max_bars_below_one_is_refused():
    with pytest.raises(ValueError, match=r"^simtrain.charts.gantt_figure: max_bars must be at least 1, not 0$"):
        charts.gantt_figure({}, max_bars=0)


def test_plot_sweep_of_a_table_without_swept_keys_says_so():
    # a table holding only result columns has no key to draw against (was an IndexError)
    with pytest.raises(simtrain.InputError, match="no swept key to draw against"):
        charts.plot_sweep(pd.DataFrame({"step_time_s": [1.0], "mfu": [0.5]}))


def test_right_kinds_still_draw(tmp_path):
    # the kinds the sentences allow are accepted: rows as a tuple of dicts, a figure's dict, a pathlib.Path
    rows = ({"scenario": "a", "tokens": 1e9, "tokens_per_s": 2.0e5, "mfu": 0.4, "time_to_train_s": 5.0e3},)
    fig = charts.compare_figure(rows)
    assert [t.y[0] for t in fig.data] == [2.0e5, 40.0, 5.0e3 / 86400]
    assert charts.figure_svg(fig.to_dict()).startswith("<svg")
    out = charts.write_figure(Path(tmp_path) / "c.html", "compare", [fig])
    assert out.read_text().startswith("<!DOCTYPE html>")


def test_numpy_integers_are_whole_numbers():
    # a review found max_bars=np.int64(100) refused as "not a whole number"; it is one (numbers.Integral)
    import numpy as np

    with pytest.raises(simtrain.InputError, match="no timeline to draw"):   # past the argument check
        charts.gantt_figure({}, max_bars=np.int64(100))


def test_write_outputs_checks_the_run_without_paths():
    # the check came after the early return when no path was given: write_outputs(3) returned None silently
    with pytest.raises(TypeError, match=r"^simtrain.charts.write_outputs: the run must be"):
        charts.write_outputs(3)
