"""A Result as a notebook shows it: a one-line repr, a compact HTML summary, DataFrames of stages and devices.

The HTML holds what `simtrain run` (or `simtrain memory`) prints first: the header figures, the per-stage table and
the memory verdict, with the warnings; ``result.summary()`` is that text report itself.
"""

from __future__ import annotations

import html
from typing import Any

from simtrain.spec.units import format_bytes, format_time


def _layout(result: Any) -> str:
    par = result.config.get("parallel", {})
    text = f"dp{par.get('dp')} tp{par.get('tp')} pp{par.get('pp')}"
    if (par.get("vpp") or 1) > 1:
        text += f" vpp{par.get('vpp')}"
    return text + f" {par.get('schedule')} zero{par.get('zero')}"


def headroom_note(result: Any) -> str | None:
    """A warning when the run fits with less headroom than the memory ledger's measured error."""
    from simtrain.report.accuracy import LEDGER_ERROR

    fraction = result.peak_memory_bytes_max / result.capacity_bytes
    if not result.fits_in_memory or 1.0 - fraction >= LEDGER_ERROR:
        return None
    return (f"the peak is {fraction:.1%} of the GPU's memory: its headroom {1 - fraction:.1%} is inside the memory "
            f"ledger's measured error ({LEDGER_ERROR:.1%}), so it may not fit")


def result_repr(result: Any) -> str:
    """One line: what ran, how fast, how much memory."""
    c = result.config
    memory = (f"peak {format_bytes(result.peak_memory_bytes_max)} of {format_bytes(result.capacity_bytes)}"
              f"{'' if result.fits_in_memory else ' DOES NOT FIT'}{' (tight)' if headroom_note(result) else ''}")
    head = f"{result.scenario}: {result.gpus} x {c.get('gpu')}, {c.get('model')}, {_layout(result)}"
    if result.step_time_s is None:
        return f"<Result (memory only) {head}; {memory}>"
    return (f"<Result {head}; step {format_time(result.step_time_s)}, {result.tokens_per_s:,.0f} tokens/s, "
            f"MFU {result.mfu:.1%}; {memory}>")


def _table(head: list[str], rows: list[list[Any]]) -> str:
    cells = "".join("<tr>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in row) + "</tr>" for row in rows)
    return ("<table><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in head) + "</tr>" + cells + "</table>")


def result_html(result: Any) -> str:
    """The header table, the per-stage table and the verdict, in a few kB of HTML."""
    from simtrain.report.text import verdict

    c = result.config
    header = [["scenario", result.scenario], ["GPUs", f"{result.gpus} x {c.get('gpu')} ({c.get('hardware')})"],
              ["model", f"{c.get('model')} ({result.params_total / 1e9:.2f} B)"], ["layout", _layout(result)],
              ["micro-batches", result.microbatches]]
    if result.step_time_s is not None:
        header += [["step time", format_time(result.step_time_s)],
                   ["tokens/s", f"{result.tokens_per_s:,.0f} ({result.tokens_per_s / result.gpus:,.0f} per GPU)"],
                   ["MFU / HFU", f"{result.mfu:.1%} / {result.hfu:.1%}"],
                   ["pipeline bubble", f"{result.bubble_fraction:.1%}"],
                   ["exposed comm", ", ".join(f"{k.upper()} {format_time(v)}"
                                              for k, v in result.exposed_comm_s.items())]]
    stage_rows = []
    for st in result.stages:
        row = [st.pp, st.layers]
        if result.step_time_s is not None:
            exposed = sum(st.exposed_comm_s.values()) if st.exposed_comm_s is not None else None
            row += [format_time(st.compute_s), "-" if exposed is None else format_time(exposed),
                    format_time(st.bubble_s)]
        row += [format_bytes(st.peak_memory_bytes), f"{st.peak_memory_bytes / result.capacity_bytes:.1%}"]
        stage_rows.append(row)
    stage_head = ["stage", "layers"] + (["compute", "exp. comm", "bubble"] if result.step_time_s is not None else [])
    notes = verdict(result) + [f"warning: {w}" for w in result.warnings if not w.startswith("does not fit")]
    if headroom_note(result):
        notes.append(f"warning: {headroom_note(result)}")
    return ("<div class='simtrain-result'>" + _table(["", ""], header)
            + _table(stage_head + ["peak mem", "of cap"], stage_rows)
            + "".join(f"<p>{html.escape(n)}</p>" for n in notes)
            + "<p><small>result.summary(), .stages_frame(), .devices_frame(), .gantt(), .memory_figure()</small></p>"
            + "</div>")


def stages_frame(result: Any):
    """One row per pipeline stage: layers, compute, bubble and exposed communication (s), peak memory and its parts
    (bytes; ``memory_params``...), and what "other" holds (``other_fragmentation``...) when known."""
    import pandas as pd

    rows = []
    for st in result.stages:
        row: dict[str, Any] = {"pp": st.pp, "layers": st.layers, "compute_s": st.compute_s, "bubble_s": st.bubble_s}
        for kind, value in (st.exposed_comm_s or {}).items():
            row[f"exposed_{kind}_s"] = value
        row["peak_memory_bytes"] = st.peak_memory_bytes
        row["peak_memory_fraction"] = st.peak_memory_bytes / result.capacity_bytes
        row.update({f"memory_{k}": v for k, v in st.memory.items()})
        row.update({f"other_{k}": v for k, v in (st.other_detail or {}).items()})
        rows.append(row)
    frame = pd.DataFrame(rows)
    return frame.astype({c: "float64" for c in frame.columns if c not in ("pp", "layers")})


def devices_frame(result: Any):
    """One row per GPU (or per class of GPUs, with ``count``, past the report's device limit): its coordinates,
    peak memory and parts (bytes), and, for a simulated step, its busy time per stream, utilisation, bubble and
    exposed communication (s)."""
    import pandas as pd

    rows = []
    for d in result.devices:
        row: dict[str, Any] = {"rank": d.rank, "node": d.node, "dp": d.dp, "tp": d.tp, "pp": d.pp,
                               "count": len(d.ranks) if d.ranks is not None else 1,
                               "peak_memory_bytes": d.peak_memory_bytes}
        row.update({f"memory_{k}": v for k, v in d.memory.items()})
        if d.busy_s is not None:
            row.update({f"busy_{k}_s": v for k, v in d.busy_s.items()})
            row.update(compute_utilization=d.compute_utilization, bubble_s=d.bubble_s)
            row.update({f"exposed_{k}_s": v for k, v in (d.exposed_comm_s or {}).items()})
        rows.append(row)
    frame = pd.DataFrame(rows)
    whole = ("rank", "node", "dp", "tp", "pp", "count")
    return frame.astype({c: ("int64" if c in whole else "float64") for c in frame.columns})
