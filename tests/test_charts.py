"""Gantt chart, memory timeline, sweep plots and the files the CLI writes.

The small scenario (tests/data/charts_tiny.yaml): 4 stages x 4 micro-batches, 1F1B,
one layer per stage, on a synthetic compute-bound system where communication and
the optimizer take (almost) no time. Its schedule is worked out by hand below from
the 1F1B rule (PipeDream-Flush, Narayanan et al. 2021, Sec. 2.2.1 and Fig. 4):
stage r runs p - r - 1 warm-up forwards, then one forward and one backward in
turn, then the remaining backwards.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from simtrain.cli import main
from simtrain.engine.simulation import simulate
from simtrain.report.charts import (
    gantt_figure,
    heatmap_figure,
    memory_figure,
    plot_saved,
    sweep_figure,
    write_outputs,
)
from simtrain.spec.errors import InputError
from simtrain.spec.scenario import load_scenario

DATA = Path(__file__).parent / "data"
ROOT = Path(__file__).parent.parent
P, M = 4, 4     # stages, micro-batches of charts_tiny.yaml

# 1F1B order per stage for p = 4, m = 4, written out by hand (F = forward, B = backward)
HAND_1F1B = {
    0: "F0 F1 F2 F3 B0 B1 B2 B3",
    1: "F0 F1 F2 B0 F3 B1 B2 B3",
    2: "F0 F1 B0 F2 B1 F3 B2 B3",
    3: "F0 B0 F1 B1 F2 B2 F3 B3",
}


@pytest.fixture(scope="module")
def tiny():
    return simulate(load_scenario(DATA / "charts_tiny.yaml"))


@pytest.fixture(scope="module")
def pp4_dp4():
    return simulate(load_scenario(ROOT / "scenarios" / "pp4_dp4.yaml"))


def _bars(fig) -> list[dict]:
    """Every drawn bar of a Gantt figure: row index, kind (legend name), start/end ms, text."""
    out = []
    for tr in fig.data:
        text = tr.text if tr.text is not None else [""] * len(tr.y)
        for y, base, x, t in zip(tr.y, tr.base, tr.x, text):
            out.append({"row": y, "name": tr.name, "start": base, "end": base + x, "text": t})
    return out


def _rows(fig) -> list[str]:
    return list(fig.layout.yaxis.ticktext)


def _idle_ms(label: str) -> float:
    return float(re.search(r"idle ([0-9.]+) ms", label).group(1))


def test_gantt_rows_are_stage_by_stream(tiny):
    """One row per stage and stream that has work: here compute and PP send (no TP, no DP)."""
    names = [re.sub(r" · idle .*", "", r) for r in _rows(gantt_figure(tiny))]
    assert names == [f"stage {s} · {stream}" for s in range(P) for stream in ("compute", "PP send")]


def test_gantt_compute_rows_follow_hand_1f1b(tiny):
    """Each compute row holds m forward and m backward bars in the 1F1B order, numbered by micro-batch, then the
    optimizer."""
    fig = gantt_figure(tiny)
    bars = _bars(fig)
    letter = {"forward": "F", "backward": "B"}
    for stage in range(P):
        row = 2 * stage
        ops = sorted((b for b in bars if b["row"] == row and b["name"] != "idle (bubble)"), key=lambda b: b["start"])
        assert " ".join(letter[b["name"]] + b["text"] for b in ops[:-1]) == HAND_1F1B[stage]
        assert ops[-1]["name"] == "optimizer step"


def test_gantt_send_rows_count_hand_sends(tiny):
    """Stage r sends m activations forward unless last, and m gradients backward unless first."""
    bars = _bars(gantt_figure(tiny))
    for stage in range(P):
        row = 2 * stage + 1
        acts = sum(1 for b in bars if b["row"] == row and b["name"] == "PP send activations")
        grads = sum(1 for b in bars if b["row"] == row and b["name"] == "PP send gradients")
        assert acts == (M if stage < P - 1 else 0)
        assert grads == (M if stage > 0 else 0)


def test_gantt_idle_is_the_1f1b_bubble(tiny):
    """With uniform stages every stage idles (p-1)(f+b) and the step is (m+p-1)(f+b) (Narayanan et al. 2021,
    Sec. 2.2.1)."""
    fig = gantt_figure(tiny)
    bars = _bars(fig)
    stage1 = [b for b in bars if b["row"] == 2]           # stage 1: no embedding, no output layer
    f = next(b["end"] - b["start"] for b in stage1 if b["name"] == "forward")
    b_ = next(b["end"] - b["start"] for b in stage1 if b["name"] == "backward")
    step_ms = fig.layout.xaxis.range[1]
    assert step_ms == pytest.approx((M + P - 1) * (f + b_), rel=0.01)
    for label in _rows(fig)[::2]:
        assert _idle_ms(label) == pytest.approx((P - 1) * (f + b_), rel=0.01)
    # warm-up diagonal: stage r starts its first forward after r forwards upstream
    for stage in range(P):
        first = min(b["start"] for b in bars if b["row"] == 2 * stage and b["name"] == "forward")
        assert first == pytest.approx(stage * f, rel=0.01, abs=1e-6)


def test_gantt_idle_bars_fill_the_label_sum(tiny):
    """The hatched idle bars of a compute row add up to the idle time in its label."""
    fig = gantt_figure(tiny)
    idle = [b for b in _bars(fig) if b["name"] == "idle (bubble)"]
    for stage, label in enumerate(_rows(fig)[::2]):
        drawn = sum(b["end"] - b["start"] for b in idle if b["row"] == 2 * stage)
        assert drawn == pytest.approx(_idle_ms(label), abs=0.06)


def test_gantt_joins_layers_into_one_bar(pp4_dp4):
    """Per-layer records of one operation make one bar: 16 forward + 16 backward + 1 optimizer per stage (pp4_dp4,
    10 layers each)."""
    fig = gantt_figure(pp4_dp4)
    bars = _bars(fig)
    rows = _rows(fig)
    for stage in range(4):
        row = rows.index(next(r for r in rows if r.startswith(f"stage {stage} · compute")))
        kinds = [b["name"] for b in bars if b["row"] == row and b["name"] != "idle (bubble)"]
        assert (kinds.count("forward"), kinds.count("backward"), kinds.count("optimizer step")) == (16, 16, 1)
    hover = next(tr for tr in fig.data if tr.name == "forward").hovertext[0]
    assert "layers 0-9 + embedding" in hover


def test_gantt_recompute_drawn_inside_backward():
    """With full recompute a stage still has m backward bars; each layer's recompute is a thin bar inside one."""
    sc = load_scenario(DATA / "charts_tiny.yaml", {"parallel.pp": 2, "gpus_per_node": 2,
                                                   "training.recompute": "full"})
    fig = gantt_figure(simulate(sc))
    layers_per_stage = 4 // 2
    back = next(t for t in fig.data if t.name == "backward")
    recompute = next(t for t in fig.data if t.name.startswith("recompute"))
    for row in (0, 2):                                   # the compute rows of stages 0 and 1
        spans = [(b, b + x) for y, b, x in zip(back.y, back.base, back.x) if y == row]
        inner = [(b, b + x) for y, b, x in zip(recompute.y, recompute.base, recompute.x) if y == row]
        assert len(spans) == M and len(inner) == M * layers_per_stage
        assert all(any(s0 <= a and c <= s1 for s0, s1 in spans) for a, c in inner)
    assert recompute.width < back.width


def test_gantt_same_from_saved_report(tiny):
    """A chart drawn from the saved JSON report equals the chart drawn from the Result."""
    saved = json.loads(json.dumps(tiny.to_dict()))
    assert gantt_figure(saved).to_plotly_json() == gantt_figure(tiny).to_plotly_json()


def test_gantt_coarsens_past_max_bars(pp4_dp4):
    """Past max_bars the chart joins bars of the steady state only, says so in the title, keeps the exact idle sums
    and every bar of the warm-up (before a stage's first backward) as it was (issue 22)."""
    full = gantt_figure(pp4_dp4)
    small = gantt_figure(pp4_dp4, max_bars=60)
    assert len(_bars(small)) < len(_bars(full))
    assert "in the steady state" in small.layout.title.text and "warm-up and cool-down at full detail" in \
        small.layout.title.text
    for row in {b["row"] for b in _bars(full)}:
        first_b = min((b["start"] for b in _bars(full) if b["row"] == row and b["name"] == "backward"), default=None)
        if first_b is None:
            continue
        def warm(fig, row=row, first_b=first_b):
            return sorted((b["name"], b["start"], b["end"]) for b in _bars(fig) if b["row"] == row
                          and b["end"] <= first_b and b["name"] != "idle (bubble)")
        assert warm(small) == warm(full)
    assert [_idle_ms(r) for r in _rows(small) if "idle" in r] == [_idle_ms(r) for r in _rows(full) if "idle" in r]


def test_gantt_full_fidelity_shows_replica_0():
    """In full fidelity the chart shows one row group per stage, for DP replica 0, and says so."""
    sc = load_scenario(DATA / "charts_tiny.yaml", {"parallel.dp": 2, "gpus_per_node": 8, "training.global_batch": 8,
                                                   "simulation.fidelity": "full"})
    fig = gantt_figure(simulate(sc))
    assert [r for r in _rows(fig) if "compute" in r].__len__() == P
    assert "DP replica 0 of 2" in fig.layout.title.text


def test_gantt_16_stages_16_microbatches_stays_small(tmp_path):
    """16 stages x 16 micro-batches with TP and recompute: the data beside plotly.js stays under 1.5 MB."""
    import plotly.offline

    sc = load_scenario(ROOT / "scenarios" / "pp4_dp4.yaml", {
        "model": "llama3-8b", "nodes": 4, "parallel.pp": 16, "parallel.dp": 1, "parallel.tp": 2, "parallel.zero": 0,
        "training.global_batch": 16, "training.recompute": "full"})
    out = tmp_path / "g.html"
    write_outputs(simulate(sc), gantt=str(out))
    extra = out.stat().st_size - len(plotly.offline.get_plotlyjs().encode())
    assert 0 < extra < 1.5e6


def test_memory_stack_reaches_reported_peak(tiny):
    """Each stage's stacked memory peaks at the report's peak, under the capacity line."""
    fig = memory_figure(tiny)
    report = tiny.to_dict()
    for stage in range(P):
        traces = [t for t in fig.data if t.stackgroup == f"stage{stage + 1}"]
        top = max(sum(vals) for vals in zip(*(t.y for t in traces)))
        assert top == pytest.approx(report["stages"][stage]["peak_memory_bytes"] / 1e9, rel=1e-5)   # 6 digits drawn
    caps = [t for t in fig.data if t.name == "device capacity"]
    assert len(caps) == P and all(c.y[0] == pytest.approx(report["memory_capacity_bytes"] / 1e9) for c in caps)


def test_memory_stash_is_p_minus_r(tiny):
    """In 1F1B stage r holds at most p - r micro-batches' activations (Narayanan et al. 2021, Sec. 2.2.1)."""
    fig = memory_figure(tiny)
    for stage in range(P):
        act = next(t for t in fig.data if t.stackgroup == f"stage{stage + 1}" and t.legendgroup == "activations")
        one = min(v for v in act.y if v > 0)     # one micro-batch's stash
        assert max(act.y) == pytest.approx((P - stage) * one, rel=1e-5)


def test_write_outputs_embeds_plotly_offline(tiny, tmp_path):
    """The Gantt HTML carries plotly.js itself and loads nothing from a CDN; the trace is JSON."""
    g, m, t = tmp_path / "g.html", tmp_path / "m.html", tmp_path / "t.json"
    write_outputs(tiny, gantt=str(g), memory=str(m), trace=str(t))
    page = g.read_text()
    assert re.search(r"<script[^>]*\ssrc=", page) is None    # no script loaded from anywhere
    assert "Plotly.newPlot" in page and len(page) > 3e6      # the library itself is inside
    assert "Plotly.newPlot" in m.read_text()
    assert json.loads(t.read_text())["traceEvents"]
    assert not list(tmp_path.glob(".*tmp"))                  # atomic writes leave no temporaries


def test_scenario_name_is_escaped(tmp_path):
    """A scenario name with markup is escaped in the page title and the chart title."""
    sc = load_scenario(DATA / "charts_tiny.yaml", {"name": "<b>evil</b>&co"})
    out = tmp_path / "g.html"
    write_outputs(simulate(sc), gantt=str(out))
    page = out.read_text()
    assert "<title>&lt;b&gt;evil&lt;/b&gt;&amp;co: one step</title>" in page
    assert "<b>evil</b>" not in page


def test_plot_saved_redraws_from_json(tiny, tmp_path):
    """`simtrain plot REPORT --gantt` redraws a saved run without simulating again."""
    report = tmp_path / "r.json"
    report.write_text(json.dumps(tiny.to_dict()))
    out = tmp_path / "g.html"
    with pytest.raises(SystemExit) as done:
        main(["plot", str(report), "--gantt", str(out), "--memory-plot", str(tmp_path / "m.html")])
    assert done.value.code == 0
    page = out.read_text(encoding="utf-8")
    # plotly writes the figure with orjson when it is installed (UTF-8) and with json otherwise (\u escapes)
    assert "stage 3 · PP send" in page or "stage 3 \\u00b7 PP send" in page


@pytest.mark.parametrize("content, message", [
    ("{not json", "not a JSON report"),
    ('{"scenario": "x"}', "has no timeline"),
])
def test_plot_saved_bad_report(tmp_path, content, message):
    """A report that is not JSON, or has no timeline, is an input error naming the file."""
    report = tmp_path / "r.json"
    report.write_text(content)
    with pytest.raises(InputError, match=message) as err:
        plot_saved(report, gantt=str(tmp_path / "g.html"))
    assert str(report) in str(err.value)


def test_plot_saved_needs_an_output(tiny, tmp_path):
    """`simtrain plot` with no output asks for one instead of doing nothing."""
    with pytest.raises(InputError, match="nothing to draw"):
        plot_saved(tmp_path / "r.json")


SWEEP = pd.DataFrame({
    "parallel.pp": [2, 4, 8, 2, 4, 8, 16],
    "training.micro_batch": [1, 1, 1, 2, 2, 2, 2],
    "step_time_s": [2.0, 1.5, 1.2, 1.8, 1.4, 1.3, None],
    "mfu": [0.30, 0.40, 0.50, 0.33, 0.43, 0.46, None],
    "fits_in_memory": [True, True, True, False, True, True, None],
    "error": [None, None, None, None, None, None, "layers not divisible by pp"],
})


def test_sweep_figure_one_line_per_other_key():
    """One line per micro_batch value and metric; MFU in %, step time in ms; failed and OOM points marked."""
    fig = sweep_figure(SWEEP, "parallel.pp")
    assert len(fig.data) == 2 * 2                    # 2 micro-batch values x 2 metrics
    mb1_mfu = next(t for t in fig.data if t.name == "training.micro_batch=1" and t.yaxis == "y2")
    assert list(mb1_mfu.x) == [2, 4, 8] and list(mb1_mfu.y) == pytest.approx([30, 40, 50])
    mb2_time = next(t for t in fig.data if t.name == "training.micro_batch=2" and t.yaxis == "y")
    assert list(mb2_time.y) == pytest.approx([1800, 1400, 1300])          # 16 failed: left out
    assert list(mb2_time.marker.symbol) == ["x", "circle", "circle"]      # pp=2, mb=2 does not fit
    assert "1 failed point" in fig.layout.title.text


def test_heatmap_figure_cells():
    """One cell per (x, y) pair, metric in display units; a failed point's cell says so, an untried one is empty."""
    fig = heatmap_figure(SWEEP, "parallel.pp", "training.micro_batch", "step_time_s")
    hm = fig.data[0]
    assert list(hm.x) == ["2", "4", "8", "16"] and list(hm.y) == ["1", "2"]
    assert list(hm.z[0][:3]) == pytest.approx([2000, 1500, 1200]) and hm.z[0][3] is None
    assert list(hm.z[1][:3]) == pytest.approx([1800, 1400, 1300]) and hm.z[1][3] is None
    assert hm.text[1][0] == "1,800 (OOM)" and hm.text[1][3] == "failed" and hm.text[0][3] == ""
    assert hm.reversescale is True                   # lower step time is better


def test_heatmap_cell_is_best_fitting_point():
    """Where a third key varies, a cell shows the best point that fits, and the title says over which key."""
    df = pd.DataFrame({"parallel.pp": [2, 2, 2], "training.micro_batch": [1, 1, 1], "parallel.zero": [0, 1, 3],
                       "tokens_per_s": [900.0, 800.0, 700.0], "fits_in_memory": ["False", "True", "True"],
                       "error": ["", "", ""]})                          # as read back from a CSV file
    fig = heatmap_figure(df, "parallel.pp", "training.micro_batch", "tokens_per_s")
    assert list(fig.data[0].z[0]) == pytest.approx([800.0]) and list(fig.data[0].text[0]) == ["800"]
    assert "highest over parallel.zero" in fig.layout.title.text


def test_sweep_figure_unknown_column():
    """Asking for a column the table lacks is an input error listing the columns."""
    with pytest.raises(InputError, match="no column 'parallel.tp'"):
        sweep_figure(SWEEP, "parallel.tp")


def test_import_does_not_load_plotly():
    """`import simtrain` and `import simtrain.report.charts` do not import plotly (it loads on first figure)."""
    code = "import sys, simtrain, simtrain.report.charts, simtrain.report.trace; print('plotly' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_gantt_bars_and_idle_cover_the_step_with_tp_and_pp():
    """With TP and PP both > 1 (dp8_pp4_tp2) each operation's bar ends with its last layer's TP all-reduce, so on
    every compute row the bars and the idle spans add up to the step (no unlabelled gap)."""
    from simtrain.report.charts_gantt import gantt_rows

    report = simulate(load_scenario(ROOT / "scenarios" / "dp8_pp4_tp2.yaml")).to_dict()
    rows, _ = gantt_rows(report)
    compute = [r for r in rows if r.stream == "compute"]
    assert len(compute) == 4
    for row in compute:
        covered = sum(b.end - b.start for b in row.bars)
        assert covered + row.idle_s == pytest.approx(report["step_time_s"], rel=1e-9), row.label


def test_plot_saved_writes_the_trace_run_would_write(tiny, tmp_path):
    """`simtrain plot REPORT --trace t.json` gives byte for byte the trace `simtrain run --trace` writes."""
    result = tiny
    report = tmp_path / "r.json"
    report.write_text(json.dumps(result.to_dict()), encoding="utf-8")
    write_outputs(result, trace=str(tmp_path / "run.json"))
    plot_saved(report, trace=str(tmp_path / "plot.json"))
    assert (tmp_path / "plot.json").read_bytes() == (tmp_path / "run.json").read_bytes()
