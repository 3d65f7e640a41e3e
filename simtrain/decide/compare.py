"""Scenarios side by side: the "before buying hardware" view.

For each scenario: step time, tokens/s, MFU, peak memory, the time to train a
token budget (``tokens / (tokens_per_s x goodput)``), in days and GPU-hours, its cost
(USD x GPUs x hours) at a price per GPU-hour (given, else the scenario's
``cost.price_per_gpu_hour``, else the hardware file's) and its energy when the
hardware file gives ``gpu.power``: board power (TDP) x GPUs x time. That energy is
the GPU boards only, at their rated maximum: it leaves out CPUs, memory, network,
storage and cooling (a data centre's PUE multiplies it again).

Without a ``goodput`` the days are steady-state: every step as simulated, none lost to
failures, restarts, checkpoints or evaluation. ``goodput=0.9`` counts 90% of the wall
time as training.
"""

from __future__ import annotations

import re
from typing import Any

from simtrain.spec.bounds import QUANTITY_RANGES, float_range
from simtrain.spec.errors import InputError
from simtrain.spec.scenario import Scenario
from simtrain.spec.units import format_bytes, format_time, parse_count

#: the token budget when none is given: 1e12 tokens ("1T")
DEFAULT_TOKENS = 1e12
#: the token budgets taken (argument and --tokens): the largest training runs read tens of trillions (3e13)
TOKEN_RANGE = (1.0, 1e18)
#: a price per GPU-hour (argument and --price) in the range of a scenario's own cost.price_per_gpu_hour
PRICE_RANGE = float_range("ScenarioCost", "price_per_gpu_hour")
#: the smallest goodput: a fraction's smallest (simtrain.spec.bounds: below a millionth nothing runs)
GOODPUT_MIN = QUANTITY_RANGES["fraction"][0]
ENERGY_NOTE = "energy: GPU board power (TDP) x GPUs x time only; no CPUs, network, cooling (PUE)"
STEADY_NOTE = "days are steady-state (no failures, restarts or checkpoints): give a goodput to count them"


def short_g(x: float) -> str:
    """1e18, 1e-6, 2.5: a bound as a person writes it (not 1e+18, 1e-06)."""
    return re.sub(r"e\+?(-?)0*(\d)", r"e\1\2", f"{x:g}")


def _price_for(s: Scenario, price_per_gpu_hour: float | dict | None) -> tuple[float | None, str]:
    """The price per GPU-hour of ``s`` and where it comes from: the argument (one number, or a mapping by
    scenario name or hardware name), else the scenario's ``cost.price_per_gpu_hour``, else the hardware file's."""
    given = price_per_gpu_hour.get(s.name, price_per_gpu_hour.get(s.hardware.name)) \
        if isinstance(price_per_gpu_hour, dict) else price_per_gpu_hour
    if given is not None:
        return float(given), "given"
    if s.cost.price_per_gpu_hour is not None:
        return s.cost.price_per_gpu_hour, "scenario"
    price = s.hardware.cost.price_per_gpu_hour
    return price, "hardware file" if price is not None else "unknown"


def _check_prices(price_per_gpu_hour: Any, scenarios: list[Scenario]) -> None:
    def positive(value: Any, where: str) -> None:
        low, high = PRICE_RANGE
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
            raise InputError(f"price_per_gpu_hour{where}={value!r}: give USD per GPU-hour, a number from "
                             f"{short_g(low)} to {short_g(high)} (the range of a scenario's cost.price_per_gpu_hour)",
                             field="price_per_gpu_hour")

    if price_per_gpu_hour is None:
        return
    if not isinstance(price_per_gpu_hour, dict):
        positive(price_per_gpu_hour, "")
        return
    names = {s.name for s in scenarios} | {s.hardware.name for s in scenarios}
    for key, value in price_per_gpu_hour.items():
        if key not in names:
            raise InputError(f"price_per_gpu_hour: {key!r} names no scenario or hardware compared (these are: "
                             f"{', '.join(sorted(names))})", field="price_per_gpu_hour")
        positive(value, f"[{key!r}]")


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


def compare(scenarios: list[Scenario], tokens: float | str = DEFAULT_TOKENS, *,
            price_per_gpu_hour: float | dict[str, float] | None = None,
            goodput: float | None = None) -> list[dict[str, Any]]:
    """One row per scenario (SI units; None where no price or power is known). ``tokens`` is the budget for time,
    cost and energy: a number, or a count as the CLI takes it ('1T', '300B'). ``price_per_gpu_hour`` (USD) replaces
    the scenarios' prices: one number for all, or a mapping by scenario or hardware name. ``goodput`` (0, 1] is the
    fraction of wall time spent training; without it the days are steady-state."""
    from simtrain.engine.simulation import simulate

    tokens = parse_count(tokens)
    if not TOKEN_RANGE[0] <= tokens <= TOKEN_RANGE[1]:
        raise InputError(f"tokens={tokens:g}: give a token count from {short_g(TOKEN_RANGE[0])} to "
                         f"{short_g(TOKEN_RANGE[1])}, "
                         "e.g. 1e12 or '300B'", field="tokens")
    if not scenarios:
        raise InputError("nothing to compare: give one or more scenarios")
    if goodput is not None and (isinstance(goodput, bool) or not isinstance(goodput, (int, float))
                                or not GOODPUT_MIN <= goodput <= 1):
        raise InputError(f"goodput={goodput!r}: give the fraction of wall time spent training, in (0, 1] and at "
                         f"least {short_g(GOODPUT_MIN)}", field="goodput")
    _check_prices(price_per_gpu_hour, scenarios)
    rows = []
    for s in scenarios:
        r = simulate(s)
        seconds = tokens / (r.tokens_per_s * (goodput or 1.0))
        price, price_source = _price_for(s, price_per_gpu_hour)
        power = s.hardware.gpu.power
        rows.append({
            "scenario": s.name, "file": s.file, "hardware": s.hardware.name, "gpu": s.hardware.gpu.name,
            "gpus": s.gpus, "model": s.model.name, "global_batch": s.training.global_batch,
            "seq_len": s.training.seq_len, "layout": layout_text(s),
            "step_time_s": r.step_time_s, "tokens_per_s": r.tokens_per_s, "mfu": r.mfu,
            # the step-time band from validated runs like this one (report.bands): None where there is none
            "step_time_band_low_s": r.step_time_band_s[0] if r.step_time_band_s else None,
            "step_time_band_high_s": r.step_time_band_s[1] if r.step_time_band_s else None,
            "peak_memory_bytes_max": r.peak_memory_bytes_max, "memory_capacity_bytes": r.capacity_bytes,
            "fits_in_memory": r.fits_in_memory, "tokens": tokens, "goodput": goodput, "time_to_train_s": seconds,
            "days": seconds / 86400.0, "gpu_hours": s.gpus * seconds / 3600.0,
            "price_per_gpu_hour": price, "price_source": price_source,
            "cost_usd": None if price is None else price * s.gpus * seconds / 3600.0,
            "gpu_power_w": power, "energy_j": None if power is None else power * s.gpus * seconds,
            "energy_mwh": None if power is None else power * s.gpus * seconds / 3.6e9,
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
    out += closer_than_bands(rows)
    from simtrain.report.accuracy import LEDGER_ERROR

    out += [f"{r['scenario']}: its peak is {fraction:.1%} of the GPU's memory, a headroom inside the memory ledger's "
            f"measured error ({LEDGER_ERROR:.1%}): it may not fit"
            for r in rows if r["fits_in_memory"]
            and 1.0 - (fraction := r["peak_memory_bytes_max"] / r["memory_capacity_bytes"]) < LEDGER_ERROR]
    out += [f"{r['scenario']}: {w}" for r in rows for w in r.get("warnings", ()) if not w.startswith("does not fit")]
    return out


def _throughput_band(row: dict[str, Any]) -> tuple[float, float] | None:
    """Tokens/s at the ends of the row's step-time band (the band's high end is the lower throughput)."""
    low, high = row.get("step_time_band_low_s"), row.get("step_time_band_high_s")
    if low is None or high is None:
        return None
    per_step = row["tokens_per_s"] * row["step_time_s"]
    return per_step / high, per_step / low


def closer_than_bands(rows: list[dict[str, Any]]) -> list[str]:
    """Pairs of scenarios whose tokens/s bands overlap: the validated runs' errors do not tell them apart."""
    out = []
    for i, a in enumerate(rows):
        for b in rows[i + 1:]:
            band_a, band_b = _throughput_band(a), _throughput_band(b)
            if band_a and band_b and band_a[0] <= band_b[1] and band_b[0] <= band_a[1]:
                out.append(f"{a['scenario']} and {b['scenario']} are closer than their bands: {a['tokens_per_s']:,.0f} "
                           f"vs {b['tokens_per_s']:,.0f} tokens/s, bands {band_a[0]:,.0f}-{band_a[1]:,.0f} and "
                           f"{band_b[0]:,.0f}-{band_b[1]:,.0f} (from the errors of validated runs like each)")
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
            "energy_note": ENERGY_NOTE, "time_note": time_note(rows)}


def time_note(rows: list[dict[str, Any]]) -> str:
    """Whether the days are steady-state or count a goodput."""
    goodputs = sorted({r["goodput"] for r in rows if r.get("goodput") is not None})
    if not goodputs:
        return STEADY_NOTE
    return f"days count a goodput of {', '.join(f'{g:.0%}' for g in goodputs)} (the share of wall time training)"


def compare_frame(rows: list[dict[str, Any]]):
    """The rows as a DataFrame with fixed dtypes (:mod:`simtrain.decide.tables`); its ``attrs`` hold the warnings
    and the notes on energy and time (the per-scenario warnings are in ``attrs["warnings"]``, not a column)."""
    from simtrain.decide.tables import frame_of

    frame = frame_of([{k: v for k, v in r.items() if k != "warnings"} for r in rows])
    frame.attrs.update(warnings=warnings_for(rows), energy_note=ENERGY_NOTE, time_note=time_note(rows))
    return frame


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
        ("step time band", ["-" if r.get("step_time_band_low_s") is None else
                            f"{r['step_time_band_low_s']:.3f}-{r['step_time_band_high_s']:.3f} s" for r in rows]),
        ("tokens/s", [f"{r['tokens_per_s']:,.0f}" for r in rows]),
        ("MFU", [f"{r['mfu']:.1%}" for r in rows]),
        ("peak memory / GPU", [f"{format_bytes(r['peak_memory_bytes_max'])} of "
                               f"{format_bytes(r['memory_capacity_bytes'])}" for r in rows]),
        (f"time for {budget} tokens †", [_days(r["time_to_train_s"]) for r in rows]),
        ("GPU-hours", [f"{r['gpu_hours']:,.0f}" for r in rows]),
        ("price per GPU-hour", ["-" if r["price_per_gpu_hour"] is None else f"${r['price_per_gpu_hour']:.2f}"
                                + ("" if r.get("price_source") in (None, "hardware file") else
                                   f" ({r['price_source']})") for r in rows]),
        (f"cost for {budget} tokens", ["-" if r["cost_usd"] is None else _usd(r["cost_usd"]) for r in rows]),
        (f"energy for {budget} tokens *", ["-" if r["energy_j"] is None else _energy(r["energy_j"]) for r in rows]),
    ]
    width0 = max(len(label) for label, _ in lines)
    widths = [max(len(cells[i]) for _, cells in lines) for i in range(len(rows))]
    out = []
    for label, cells in lines:
        out.append("  ".join([label.ljust(width0)] + [c.rjust(w) for c, w in zip(cells, widths)]).rstrip())
    out.append(f"* {ENERGY_NOTE}")
    out.append(f"† {time_note(rows)}")
    out += [f"warning: {w}" for w in warnings_for(rows)]
    return "\n".join(out) + "\n"


def compare_figure(rows: list[dict[str, Any]]):
    """Bars per scenario: tokens/s, MFU, days to train and, where known, cost and energy
    (:func:`simtrain.report.charts_decide.compare_figure`)."""
    from simtrain.report.charts_decide import compare_figure as figure

    return figure(rows, ENERGY_NOTE)
