"""The static SVG of a figure (simtrain.report.svg): what GitHub shows of a notebook's charts, since it runs no
JavaScript. Expected pixels are worked by hand from the figure's layout: plot box = canvas minus margins, and a data
value v on an axis with range [lo, hi] lands at box_start + (v - lo) / (hi - lo) x box_length."""

import xml.etree.ElementTree as ET

import plotly.graph_objects as go
import pytest

import simtrain
from simtrain.report.svg import figure_svg

NS = "{http://www.w3.org/2000/svg}"


def _tree(fig) -> ET.Element:
    return ET.fromstring(figure_svg(fig))


def _rects(root: ET.Element, fill: str) -> list[dict]:
    """The rectangles of that colour drawn inside a plot (traces are clipped to their plot; the legend is not)."""
    return [r.attrib for g in root.iter(NS + "g") if g.get("clip-path") for r in g.iter(NS + "rect")
            if r.get("fill") == fill]


def test_a_horizontal_bar_lands_where_its_base_and_length_put_it():
    """A Gantt-style bar, base 1 and length 2 on x in [0, 4], lane 0 of y in [-0.5, 0.5], width 0.8, on a 500 x 300
    canvas with margins l 100, r 0, t 0, b 100: plot box x 100-500, y 0-200. By hand: x from 100 + 1/4 x 400 = 200 to
    100 + 3/4 x 400 = 400; y from 200 - (0.4 + 0.5) x 200 = 20 to 200 - (-0.4 + 0.5) x 200 = 180."""
    fig = go.Figure(go.Bar(x=[2], y=[0], base=[1], orientation="h", width=0.8, marker=dict(color="#123456")))
    fig.update_layout(width=500, height=300, margin=dict(l=100, r=0, t=0, b=100),
                      xaxis=dict(range=[0, 4]), yaxis=dict(range=[-0.5, 0.5], tickvals=[0], ticktext=["a"]))
    (bar,) = _rects(_tree(fig), "#123456")
    assert (float(bar["x"]), float(bar["width"])) == (200, 200)
    assert (float(bar["y"]), float(bar["height"])) == (20, 160)


def test_a_log_axis_puts_ten_halfway_between_one_and_a_hundred():
    """On a log x axis with range [0, 2] (plotly's log10 units), x = 10 is at the middle of the box; y = 5 on a
    linear [0, 10] axis is at its middle too: (100 + 0.5 x 400, 200 - 0.5 x 200) = (300, 100)."""
    fig = go.Figure(go.Scatter(x=[10], y=[5], mode="markers", marker=dict(color="#abcdef", size=10)))
    fig.update_layout(width=500, height=300, margin=dict(l=100, r=0, t=0, b=100),
                      xaxis=dict(type="log", range=[0, 2]), yaxis=dict(range=[0, 10]))
    (dot,) = [c.attrib for c in _tree(fig).iter(NS + "circle")]
    assert (float(dot["cx"]), float(dot["cy"]), float(dot["r"])) == (300, 100, 5)


def test_stacked_areas_sum_their_layers():
    """Two layers of a stack group, 1 GB and 2 GB, over y in [0, 4]: the second layer's polygon spans from the
    first's top (1 -> 200 - 1/4 x 200 = 150 px) to the sum (3 -> 200 - 3/4 x 200 = 50 px)."""
    fig = go.Figure([go.Scatter(x=[0, 1], y=[1, 1], stackgroup="s", fillcolor="#111111", name="a"),
                     go.Scatter(x=[0, 1], y=[2, 2], stackgroup="s", fillcolor="#222222", name="b")])
    fig.update_layout(width=500, height=300, margin=dict(l=100, r=0, t=0, b=100),
                      xaxis=dict(range=[0, 1]), yaxis=dict(range=[0, 4]), showlegend=False)
    second = next(p.attrib for p in _tree(fig).iter(NS + "polygon") if p.get("fill") == "#222222")
    ys = sorted({float(pt.split(",")[1]) for pt in second["points"].split()})
    assert ys == [50, 150]


def test_a_trace_it_cannot_draw_is_named_not_guessed():
    """A pie chart is outside what simtrain draws: the image says so in words."""
    fig = go.Figure([go.Pie(values=[1, 2]), go.Bar(x=["a"], y=[1])])
    assert "a pie trace is not drawn in this static image" in figure_svg(fig)


@pytest.fixture(scope="module")
def figures():
    result = simtrain.simulate("pp4_dp4")
    table = simtrain.sweep("pp4_dp4", {"training.global_batch": [16, 32], "parallel.schedule": ["gpipe", "1f1b"]},
                           workers=1, progress=False)
    return {"gantt": result.gantt(), "memory": result.memory_figure(),
            "sweep": simtrain.charts.plot_sweep(table),
            "heatmap": simtrain.charts.heatmap_figure(table, "training.global_batch", "parallel.schedule",
                                                      "tokens_per_s"),
            "compare": simtrain.charts.plot_compare(simtrain.compare(["pp4_dp4", "dp8_baseline"]))}


def test_every_simtrain_chart_draws_whole_and_small(figures):
    """Each chart simtrain makes becomes well-formed SVG with no trace left undrawn, no script, the same bytes
    twice, and far smaller than its HTML (pp4_dp4's Gantt page is about 1 MB with plotly.js; its SVG under 100 kB)."""
    for name, fig in figures.items():
        text = figure_svg(fig)
        ET.fromstring(text)
        assert "not drawn" not in text and "<script" not in text, name
        assert figure_svg(fig) == text, name
    assert len(figure_svg(figures["gantt"])) < 100_000


def test_the_gantt_svg_has_one_bar_per_operation(figures):
    """Every bar of every Gantt trace becomes one rectangle of its colour (a forward of pp4_dp4: 4 stages x 16
    micro-batches = 64 bars, which the chart does not join at this size)."""
    fig = figures["gantt"]
    forward = next(t for t in fig.data if t.name == "forward")
    assert len(forward.x) == 64
    assert len(_rects(_tree(fig), forward.marker.color)) == 64


def test_static_renderer_gives_github_an_svg_and_no_html(figures):
    """notebook_renderer('static') makes a shown figure carry image/svg+xml (which GitHub draws) beside plotly's
    JSON (live in Jupyter), and no text/html a viewer would prefer and then strip of its script."""
    import plotly.io as pio
    from plotly.io._renderers import renderers

    before = pio.renderers.default
    try:
        assert simtrain.charts.notebook_renderer("static") == "plotly_mimetype+simtrain_svg"
        bundle = renderers._build_mime_bundle(figures["heatmap"].to_dict())
        assert set(bundle) == {"application/vnd.plotly.v1+json", "image/svg+xml"}
        assert bundle["image/svg+xml"] == figure_svg(figures["heatmap"])
    finally:
        pio.renderers.default = before


def test_a_notebook_run_with_the_static_renderer_stores_an_svg(tmp_path):
    """Executed in a Jupyter kernel with notebook_renderer('static'), a Gantt cell's output holds the SVG: what
    GitHub draws, and what `nbconvert --to html` keeps (its HTML exporter renders one MIME type per output, by
    display_data_priority: text/html, then image/svg+xml; plotly's JSON is not on its list; ipython/ipython commit
    6b1a0c9)."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        "import simtrain\nsimtrain.charts.notebook_renderer('static')\nsimtrain.simulate('pp4_dp4').gantt()")])
    nbclient.NotebookClient(nb, timeout=60, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    (shown,) = [o for o in nb.cells[0].outputs if o.get("output_type") in ("display_data", "execute_result")]
    assert "text/html" not in shown["data"]
    svg = ET.fromstring(shown["data"]["image/svg+xml"])
    assert any("pp4_dp4: one step" in (t.text or "") for t in svg.iter(NS + "text"))


def test_numpy_backed_figures_draw_their_numbers():
    """plotly (>= 6) stores numpy arrays as typed arrays (dtype + base64 bytes): they are read as numbers, so a
    scatter of x = 0, 1, 2 on [0, 2] puts its middle point at the box's middle (100 + 0.5 x 400 = 300 px), a bar
    base given as an array is read per bar, and a 2-D heatmap keeps its rows."""
    import numpy as np

    fig = go.Figure(go.Scatter(x=np.arange(3), y=np.array([0.0, 5.0, 10.0]), mode="markers", marker=dict(
        color="#abcdef")))
    fig.update_layout(width=500, height=300, margin=dict(l=100, r=0, t=0, b=100),
                      xaxis=dict(range=[0, 2]), yaxis=dict(range=[0, 10]))
    dots = sorted(float(c.get("cx")) for c in _tree(fig).iter(NS + "circle"))
    assert dots == [100, 300, 500]
    bar = go.Figure(go.Bar(x=np.array([2.0]), y=[0], base=np.array([1.0]), orientation="h",
                           marker=dict(color="#123456")))
    bar.update_layout(width=500, height=300, margin=dict(l=100, r=0, t=0, b=100),
                      xaxis=dict(range=[0, 4]), yaxis=dict(range=[-0.5, 0.5], tickvals=[0], ticktext=["a"]))
    (rect,) = _rects(_tree(bar), "#123456")
    assert (float(rect["x"]), float(rect["width"])) == (200, 200)
    heat = go.Figure(go.Heatmap(z=np.arange(6.0).reshape(2, 3)))
    cells = [r for g in _tree(heat).iter(NS + "g") if g.get("clip-path") for r in g.iter(NS + "rect")]
    assert len(cells) == 6
