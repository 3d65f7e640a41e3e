"""Scenarios side by side: the "before buying hardware" view.

For each scenario: step time, tokens/s, MFU, peak memory, the time to train a
token budget (``tokens / tokens_per_s``), its cost when the hardware file gives
``cost.price_per_gpu_hour`` (USD x GPUs x hours) and its energy when it gives
``gpu.power``: board power (TDP) x GPUs x time. That energy is the GPU boards
only, at their rated maximum: it leaves out CPUs, memory, network, storage and
cooling (a data centre's PUE multiplies it again).
"""

from __future__ import annotations

from typing import Any

from simtrain.spec.errors import InputError
from simtrain.spec.scenario import Scenario
from simtrain.spec.units import format_bytes, format_time, parse_count

#: the token budget when none is given: 1e12 tokens ("1T")
DEFAULT_TOKENS = 1e12
ENERGY_NOTE = "energy: GPU board power (TDP) x GPUs x time only; no CPUs, network, cooling (PUE)"


def layout_text(s: Scenario) -> str:
    par, tr = s.parallel, s.training
    text = f"tp{par.tp} pp{par.pp} dp{par.dp}"
    if par.vpp > 1:
        text += f" vpp{par.vpp}"
    text += f" mb{tr.micro_batch} zero{par.zero} {par.schedule}"
    if tr.recompute != "none":
        text += f" recompute-{tr.recompute}"
    if par.sequence_parallel:
        text += " sp"
    if s.model.moe is not None:   # a mixture of experts: its expert layout (etp where it differs from tp)
        text += f" ep{par.ep}" + (f" etp{par.etp}" if (par.etp or par.tp) != par.tp else "")
    return text


def compare(scenarios: list[Scenario], tokens: float | str = DEFAULT_TOKENS) -> list[dict[str, Any]]:
    """One row per scenario (SI units; None where the hardware file gives no price or power). ``tokens`` is the
    budget for time, cost and energy: a number, or a count as the CLI takes it ('1T', '300B')."""
    from simtrain.engine.simulation import simulate

    tokens = parse_count(tokens)
    if tokens <= 0:
        raise InputError(f"tokens={tokens:g}: give a positive token count, e.g. 1e12 or '300B'", field="tokens")
    if not scenarios:
        raise InputError("nothing to compare: give one or more scenarios")
    rows = []
    for s in scenarios:
        r = simulate(s)
        seconds = tokens / r.tokens_per_s
        price = s.hardware.cost.price_per_gpu_hour
        power = s.hardware.gpu.power
        rows.append({
            "scenario": s.name, "file": s.file, "hardware": s.hardware.name, "gpu": s.hardware.gpu.name,
            "gpus": s.gpus, "model": s.model.name, "global_batch": s.training.global_batch,
            "seq_len": s.training.seq_len, "layout": layout_text(s),
            "step_time_s": r.step_time_s, "tokens_per_s": r.tokens_per_s, "mfu": r.mfu,
            "peak_memory_bytes_max": r.peak_memory_bytes_max, "memory_capacity_bytes": r.capacity_bytes,
            "fits_in_memory": r.fits_in_memory, "tokens": tokens, "time_to_train_s": seconds,
            "price_per_gpu_hour": price, "cost_usd": None if price is None else price * s.gpus * seconds / 3600.0,
            "gpu_power_w": power, "energy_j": None if power is None else power * s.gpus * seconds,
            "warnings": list(r.warnings),
        })
    return rows


def warnings_for(rows: list[dict[str, Any]]) -> list[str]:
    """Differences that make a comparison unfair (other models or batches), then each scenario's own warnings."""
    out = []
    for key, what in (("model", "models"), ("global_batch", "global batches"), ("seq_len", "sequence lengths")):
        values = list(dict.fromkeys(str(r[key]) for r in rows))   # distinct, in the scenarios' order
        if len(values) > 1:
            out.append(f"the scenarios train different {what} ({', '.join(values)}): not like for like")
    out += [f"{r['scenario']}: does not fit in memory" for r in rows if not r["fits_in_memory"]]
    out += [f"{r['scenario']}: {w}" for r in rows for w in r.get("warnings", ()) if not w.startswith("does not fit")]
    return out


def compare_report(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The JSON of ``simtrain compare --json``: the rows (SI units, floats rounded as in every report) and the
    warnings the text gives."""
    from simtrain.spec.units import report_float

    def clean(key: str, value: Any) -> Any:
        if isinstance(value, float) and "bytes" in key:
            return round(value)           # whole bytes, as in `simtrain run --json`
        return report_float(value) if isinstance(value, float) else value

    return {"rows": [{k: clean(k, v) for k, v in row.items()} for row in rows], "warnings": warnings_for(rows),
            "energy_note": ENERGY_NOTE}


def _days(seconds: float) -> str:
    if seconds >= 86400:
        return f"{seconds / 86400:.1f} days"
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds:.1f} s" if seconds >= 1 else format_time(seconds)


def _energy(joules: float) -> str:
    for unit, scale in (("MWh", 3.6e9), ("kWh", 3.6e6)):
        if joules >= scale:
            return f"{joules / scale:,.1f} {unit}"
    return f"{joules / 3.6e3:,.1f} Wh"


def _usd(dollars: float) -> str:
    return f"${dollars:,.0f}" if dollars >= 100 else f"${dollars:.2f}"


def _count(tokens: float) -> str:
    for suffix, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6)):
        if tokens >= scale:
            return f"{tokens / scale:g}{suffix}"
    return f"{tokens:g}"


def compare_text(rows: list[dict[str, Any]]) -> str:
    """A terminal table: one column per scenario."""
    budget = _count(rows[0]["tokens"]) if rows else ""
    lines = [
        ("", [r["scenario"] for r in rows]),
        ("hardware", [r["hardware"] for r in rows]),
        ("GPUs", [f"{r['gpus']} x {r['gpu']}" for r in rows]),
        ("model", [r["model"] for r in rows]),
        ("layout", [r["layout"] for r in rows]),
        ("step time", [f"{r['step_time_s']:.3f} s" for r in rows]),
        ("tokens/s", [f"{r['tokens_per_s']:,.0f}" for r in rows]),
        ("MFU", [f"{r['mfu']:.1%}" for r in rows]),
        ("peak memory / GPU", [f"{format_bytes(r['peak_memory_bytes_max'])} of "
                               f"{format_bytes(r['memory_capacity_bytes'])}" for r in rows]),
        (f"time for {budget} tokens", [_days(r["time_to_train_s"]) for r in rows]),
        ("price per GPU-hour", ["-" if r["price_per_gpu_hour"] is None else f"${r['price_per_gpu_hour']:.2f}"
                                for r in rows]),
        (f"cost for {budget} tokens", ["-" if r["cost_usd"] is None else _usd(r["cost_usd"]) for r in rows]),
        (f"energy for {budget} tokens *", ["-" if r["energy_j"] is None else _energy(r["energy_j"]) for r in rows]),
    ]
    width0 = max(len(label) for label, _ in lines)
    widths = [max(len(cells[i]) for _, cells in lines) for i in range(len(rows))]
    out = []
    for label, cells in lines:
        out.append("  ".join([label.ljust(width0)] + [c.rjust(w) for c, w in zip(cells, widths)]).rstrip())
    out.append(f"* {ENERGY_NOTE}")
    out += [f"warning: {w}" for w in warnings_for(rows)]
    return "\n".join(out) + "\n"


def compare_figure(rows: list[dict[str, Any]]):
    """Bars per scenario: tokens/s, MFU, time to train and, where known, cost and energy."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    budget = _count(rows[0]["tokens"]) if rows else ""
    panels = [("tokens/s", "tokens_per_s", 1.0), ("MFU (%)", "mfu", 100.0),
              (f"days for {budget} tokens", "time_to_train_s", 1 / 86400)]
    if any(r["cost_usd"] is not None for r in rows):
        panels.append((f"cost for {budget} tokens (USD)", "cost_usd", 1.0))
    if any(r["energy_j"] is not None for r in rows):
        panels.append((f"GPU board energy for {budget} tokens (MWh)", "energy_j", 1 / 3.6e9))
    fig = make_subplots(rows=1, cols=len(panels), subplot_titles=[p[0] for p in panels])
    import html

    names = [html.escape(str(r["scenario"])) for r in rows]   # plotly renders tags in axis labels
    for i, (_, key, scale) in enumerate(panels, start=1):
        values = [None if r[key] is None else r[key] * scale for r in rows]
        fig.add_trace(go.Bar(x=names, y=values, showlegend=False, marker_color="#4C78A8",
                             hovertemplate="%{x}: %{y:.4g}<extra></extra>"), row=1, col=i)
    fig.update_layout(title=dict(text=f"compare<br><sup>{ENERGY_NOTE}</sup>", x=0.01), template="plotly_white",
                      height=420, width=max(700, 300 * len(panels)))
    return fig
