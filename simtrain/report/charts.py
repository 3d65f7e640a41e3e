"""Charts and traces of a simulated step, and the files the CLI writes.

The figures (plotly, imported on first use so ``import simtrain`` stays fast):

- :func:`gantt_figure`: where the time goes, stage by stage (simtrain.report.charts_gantt);
- :func:`memory_figure`: allocated bytes over the step per stage (simtrain.report.charts_memory);
- :func:`sweep_figure`, :func:`heatmap_figure`: sweep tables (simtrain.report.charts_sweep);

and :func:`trace_events`, the Chrome/Perfetto trace (simtrain.report.trace); :func:`figure_svg` draws any of the
figures as static SVG (simtrain.report.svg). Each takes
a :class:`~simtrain.report.result.Result` or its JSON report, so saved runs redraw
without a second simulation (``simtrain plot``).

HTML files embed plotly.js: they open offline, with nothing fetched from a CDN.
Every file is written atomically, never over a file simtrain did not write (simtrain.report.outputs.write_output).
"""

from __future__ import annotations

import html
import json
import os
import select
import stat
from pathlib import Path
from typing import Any

from simtrain.report.chart_args import need_figures, need_path, need_result, need_rows, need_str, need_table
from simtrain.report.charts_data import report_of
from simtrain.report.charts_decide import compare_figure, search_figure, validate_figure
from simtrain.report.charts_gantt import gantt_figure
from simtrain.report.charts_memory import memory_figure
from simtrain.report.charts_sweep import heatmap_figure, sweep_figure
from simtrain.report.outputs import write_output
from simtrain.report.svg import figure_svg
from simtrain.report.trace import trace_events
from simtrain.spec.errors import InputError

__all__ = ["gantt_figure", "memory_figure", "sweep_figure", "heatmap_figure", "trace_events", "figures_html",
           "write_figure", "write_outputs", "plot_saved", "plot_sweep", "plot_compare", "plot_search",
           "plot_validate", "plot_gantt", "plot_memory", "compare_figure", "search_figure", "validate_figure",
           "notebook_renderer", "figure_svg"]

#: notebook_renderer's modes -> plotly renderers. plotly_mimetype draws the figure live in JupyterLab and VS Code;
#: notebook adds an HTML copy with plotly.js embedded once per notebook (about 4.8 MB), which nbconvert --to html
#: and nbviewer keep and which opens offline; notebook_connected's HTML copy loads plotly.js from its CDN instead
#: (a small notebook; the reader's browser needs the network); simtrain_svg adds a static SVG drawn by
#: report/svg.py, the form GitHub shows (it runs no JavaScript), with no HTML copy that a viewer would prefer to it
RENDERERS = {"embedded": "plotly_mimetype+notebook", "cdn": "plotly_mimetype+notebook_connected",
             "static": "plotly_mimetype+simtrain_svg"}


def notebook_renderer(mode: str = "embedded") -> str:
    """Make the figures a notebook shows survive export: ``embedded`` (default) for ``jupyter nbconvert --to html``
    and nbviewer, offline; ``cdn`` for the same with a small notebook; ``static`` for GitHub too (a static SVG
    beside the live figure; exports show the SVG). Sets ``plotly.io.renderers.default`` (this process only) and
    returns it; nothing is shown or written."""
    import plotly.io as pio

    if mode not in RENDERERS:
        raise InputError(f"mode={mode!r}: give one of {', '.join(RENDERERS)}", field="mode")
    if mode == "static" and "simtrain_svg" not in pio.renderers:
        pio.renderers["simtrain_svg"] = _svg_renderer()
    pio.renderers.default = RENDERERS[mode]
    return pio.renderers.default


def _svg_renderer():
    """A plotly renderer whose display bundle is the figure as static SVG (image/svg+xml)."""
    from plotly.io.base_renderers import MimetypeRenderer

    class SvgRenderer(MimetypeRenderer):
        def to_mimebundle(self, fig_dict):
            return {"image/svg+xml": figure_svg(fig_dict)}

    return SvgRenderer()


# --- one name per table: the Figure the CLI writes for it ------------------------------------------------

#: the result columns of a sweep table; the others are its swept keys
_SWEEP_RESULTS = ("step_time_s", "tokens_per_s", "mfu", "hfu", "bubble_fraction", "peak_memory_bytes_max",
                  "fits_in_memory", "error")


def plot_sweep(table, x: str | None = None, metrics=("step_time_s", "tokens_per_s", "mfu", "bubble_fraction")):
    """A sweep's table (``simtrain.sweep``): each metric against the swept key ``x`` (default: the first), one line
    per combination of the other swept keys; the figure ``simtrain sweep --plot`` writes. ``plot_sweep_heatmap``
    is its two-key companion (:func:`heatmap_figure`)."""
    need_table("plot_sweep", table)
    need_str("plot_sweep", x, "x", optional=True)
    keys = [c for c in table.columns if c not in _SWEEP_RESULTS]
    if x is None and not keys:
        raise InputError("the sweep table has no swept key to draw against (only result columns); give x")
    return sweep_figure(table, x or keys[0], metrics=metrics)


def plot_compare(table):
    """A comparison (``simtrain.compare``): tokens/s, MFU, days, cost and energy per scenario, as
    ``simtrain compare --plot`` writes it."""
    need_rows("plot_compare", table, "the table")
    energy = getattr(table, "attrs", {}).get("energy_note", "")
    return compare_figure(table, energy)


def plot_search(result):
    """A search's top layouts (``simtrain.search``): tokens/s, with why each is slower than the best."""
    # duck-typed: the report layer does not import the decide layer (docs/architecture.md)
    if not (callable(getattr(result, "figure", None)) and hasattr(result, "top")):
        raise TypeError(f"simtrain.charts.plot_search: result must be a SearchResult (simtrain.search), not "
                        f"{type(result).__name__}")
    return result.figure()


def plot_validate(table):
    """A validation run (``simtrain.validate``): predicted against measured step time per case."""
    need_rows("plot_validate", table, "the table")
    return validate_figure(table)


def plot_gantt(result):
    """A run's Gantt chart (``simtrain run --gantt``): :func:`gantt_figure`."""
    need_result("plot_gantt", result)
    return gantt_figure(result)


def plot_memory(result):
    """A run's memory over the step (``simtrain run --memory-plot``): :func:`memory_figure`."""
    need_result("plot_memory", result)
    return memory_figure(result)


def figures_html(title: str, figures: list) -> str:
    """One self-contained HTML page holding ``figures``, with plotly.js embedded once."""
    need_str("figures_html", title, "title")
    need_figures("figures_html", figures)
    # fixed div ids (plotly draws random ones): the same report gives the same page, byte for byte
    divs = [fig.to_html(full_html=False, include_plotlyjs=(i == 0), div_id=f"simtrain-figure-{i}",
                        config={"displaylogo": False, "responsive": True})
            for i, fig in enumerate(figures)]
    return ("<!DOCTYPE html>\n<html>\n<head>\n<meta charset=\"utf-8\">\n"
            f"<title>{html.escape(title)}</title>\n"
            "<style>body{margin:0;padding:8px;font-family:sans-serif}</style>\n</head>\n<body>\n"
            + "\n".join(divs) + "\n</body>\n</html>\n")


def write_figure(path: str | Path, title: str, figures: list) -> Path:
    """Write figures as a self-contained HTML page, atomically."""
    need_path("write_figure", path, "path")
    need_str("write_figure", title, "title")
    need_figures("write_figure", figures)
    return write_output(path, figures_html(title, figures))


def _write(report: dict, gantt: str | None, memory: str | None, trace: str | None) -> None:
    name = str(report.get("scenario", "simtrain"))
    if gantt:
        # the memory timeline rides along under the Gantt chart: one page answers time and memory
        write_figure(gantt, f"{name}: one step", [gantt_figure(report), memory_figure(report)])
    if memory:
        write_figure(memory, f"{name}: memory over one step", [memory_figure(report)])
    if trace:
        write_output(trace, json.dumps(trace_events(report), separators=(",", ":"), allow_nan=False) + "\n")


def write_outputs(result: Any, gantt: str | None = None, memory: str | None = None,
                  trace: str | None = None) -> None:
    """The files `simtrain run` writes: Gantt (HTML, with the memory timeline), memory (HTML), trace (JSON)."""
    need_result("write_outputs", result)
    for argument, value in (("gantt", gantt), ("memory", memory), ("trace", trace)):
        need_path("write_outputs", value, argument, optional=True)
    if not (gantt or memory or trace):
        return
    _write(report_of(result, "write_outputs"), gantt, memory, trace)


#: the largest report ``simtrain plot`` reads, 64 MiB. The largest a run writes at the default simulation.max_events
#: (1,000,000), measured: 30.2 MB, benchmarks/scenarios/llama3_405b_128k_cp16_h100.yaml --full (16,384 GPUs, 811,538
#: events, 2,048 lanes, 370,048 records), drawn with --gantt and --trace in 21 s and 0.7 GB; the bundled scenarios
#: write 0.03-0.5 MB (0.15-2.0 MB with --full). At the cap a plot is bounded near 30-45 s and 1-1.5 GB (measured: a
#: 62.6 MB report of 65,000 copies of one lane, 27 s and 0.8 GB; a 191 MB one took 58 s and 2.3 GB before the cap).
MAX_REPORT_BYTES = 64 * 2**20


#: how long ``simtrain plot`` waits for a FIFO's writer to send the report's first bytes
PIPE_WAIT_S = 30.0


def _open_without_waiting(path: Path):
    """Open for reading without blocking on a FIFO that has no writer: the open does not wait, and the first bytes
    are waited for at most :data:`PIPE_WAIT_S` (then refused); the reads after them block as usual, so a pipe that
    is being written (``<(...)``, a named FIFO a writer opens late) is read whole."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    try:
        if stat.S_ISFIFO(os.fstat(fd).st_mode) and hasattr(select, "poll"):
            waiting = select.poll()
            waiting.register(fd, select.POLLIN)
            if not waiting.poll(PIPE_WAIT_S * 1000):
                raise InputError(f"is a pipe nobody wrote a report into within {PIPE_WAIT_S:g} s; give a report "
                                 "file", file=str(path))
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _read_report_text(path: Path) -> str:
    """The text of a saved report, refused beyond :data:`MAX_REPORT_BYTES` (read in a bounded amount, so a device
    such as /dev/zero or a file growing while it is read is refused too, not read without end)."""
    cap_mib = MAX_REPORT_BYTES // 2**20
    try:
        size = path.stat().st_size
        if size > MAX_REPORT_BYTES:
            raise InputError(f"the report is {size / 2**20:,.1f} MiB, more than the {cap_mib} MiB simtrain plot "
                             "reads (the largest report a run writes is about 30 MB); draw the charts in the run "
                             "itself with simtrain run --gantt/--trace", file=str(path))
        with _open_without_waiting(path) as fh:
            raw = fh.read(MAX_REPORT_BYTES + 1)
        if len(raw) > MAX_REPORT_BYTES:
            raise InputError(f"the report is more than the {cap_mib} MiB simtrain plot reads (the largest report a "
                             "run writes is about 30 MB); draw the charts in the run itself with simtrain run "
                             "--gantt/--trace", file=str(path))
        return raw.decode("utf-8")
    except FileNotFoundError:
        raise InputError(f"report '{path}' does not exist") from None
    except (OSError, UnicodeDecodeError) as err:
        raise InputError(f"cannot read the report: {err}", file=str(path)) from None


def plot_saved(report_json_path: str | Path, gantt: str | None = None, memory: str | None = None,
               trace: str | None = None) -> None:
    """Redraw the charts (and the trace) of a saved `simtrain run --json` report."""
    need_path("plot_saved", report_json_path, "report_json_path")
    for argument, value in (("gantt", gantt), ("memory", memory), ("trace", trace)):
        need_path("plot_saved", value, argument, optional=True)
    path = Path(report_json_path)
    if not (gantt or memory or trace):
        raise InputError("nothing to draw: give --gantt PATH.html, --memory-plot PATH.html and/or --trace PATH.json",
                         file=str(path))
    text = _read_report_text(path)
    try:
        report = json.loads(text)
    except json.JSONDecodeError as err:
        raise InputError(f"not a JSON report: {err.msg}", file=str(path), line=err.lineno) from None
    if not isinstance(report, dict):
        raise InputError("not a simtrain JSON report (expected an object)", file=str(path))
    try:
        report = report_of(report)
    except InputError as err:
        raise err.located(file=str(path)) from None
    _write(report, gantt, memory, trace)
