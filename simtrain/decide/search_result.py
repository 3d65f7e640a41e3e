"""What a layout search returns: every candidate, the top K, and the way from a winner back to a scenario.

``result = simtrain.search(sc)``; ``result.best`` is the fastest layout (``result.best.scenario`` a runnable
:class:`~simtrain.spec.scenario.Scenario`), ``result.scenario(i)`` the i-th of the top K, ``result.table`` every
candidate as a DataFrame (:mod:`simtrain.decide.tables`), ``result.summary()`` the text of ``simtrain search``.
"""

from __future__ import annotations

import html
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from simtrain.report.accuracy import LEDGER_ERROR
from simtrain.spec.errors import InputError
from simtrain.spec.scenario import Scenario
from simtrain.spec.scenario_rules import HOST_ADAM_NOTE
from simtrain.spec.units import format_count, format_time

#: layout field -> scenario key
LAYOUT_KEYS = {"tp": "parallel.tp", "pp": "parallel.pp", "dp": "parallel.dp", "vpp": "parallel.vpp",
               "micro_batch": "training.micro_batch", "zero": "parallel.zero", "recompute": "training.recompute",
               "schedule": "parallel.schedule", "sequence_parallel": "parallel.sequence_parallel",
               "precision": "training.precision", "ep": "parallel.ep", "etp": "parallel.etp",
               "cp": "parallel.cp", "ep_overlap": "parallel.ep_overlap",
               "offload_optimizer": "parallel.offload_optimizer"}

#: what screening finds for a variant (decide.search_space.VARIANTS) -> its scenario key
RESOLVED = {"activation_offload_layers": "training.activation_offload_layers",
            "recompute_layers": "training.recompute_layers", "recompute_modules": "training.recompute_modules"}


def layout_overrides(layout: dict[str, Any]) -> dict[str, Any]:
    """The scenario keys that set ``layout`` (its fields as :data:`LAYOUT_KEYS` names them)."""
    out = {LAYOUT_KEYS[k]: layout[k] for k in LAYOUT_KEYS if k in layout}
    # an uneven split of the original layout does not carry over: even, or balanced (auto) where the search chose it
    out["parallel.layers_per_stage"] = layout.get("layers_per_stage")
    for key in RESOLVED:    # a variant's layout, once screening found its offloaded or recomputed layers or modules
        if layout.get(key):
            out[RESOLVED[key]] = layout[key]
    return out


def tight_note(row: dict[str, Any]) -> str | None:
    """A warning when a layout's headroom is inside the memory ledger's error (:data:`LEDGER_ERROR`)."""
    fraction = row.get("peak_memory_fraction")
    if fraction is None or 1.0 - fraction >= LEDGER_ERROR:
        return None
    return (f"its peak is {fraction:.1%} of the GPU's memory: the headroom {1 - fraction:.1%} is inside the memory "
            f"ledger's measured error ({LEDGER_ERROR:.1%}), so it may not fit")


@dataclass(frozen=True)
class Layout:
    """One searched layout: its fields and metrics (``layout["tp"]``, ``layout.row``) and, through
    ``.scenario``, the scenario that runs it."""

    row: dict[str, Any]
    base: Scenario = field(repr=False)
    overrides: dict[str, Any] = field(default_factory=dict, repr=False)   # the cluster size (gpus=)

    @property
    def scenario(self) -> Scenario:
        """The searched scenario with this layout set: ``simtrain.simulate(layout.scenario)`` runs it."""
        return self.base.with_overrides({**self.overrides, **layout_overrides(self.row)})

    def __getitem__(self, key: str) -> Any:
        return self.row[key]

    def __repr__(self) -> str:
        r = self.row
        speed = (f": {r['step_time_s']:.3f} s, {r['tokens_per_s']:,.0f} tokens/s" if r.get("step_time_s") is not None
                 else "")
        return f"<Layout {layout_text(r)}{speed}>"


class FrozenRow(dict):
    """A search row handed to the caller: a dict to read (and to copy with ``dict(row)``), not to change, so that a
    changed row cannot change what the result reports afterwards."""

    def _refuse(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("a search result's rows are read-only: copy one with dict(row) to change it")

    __setitem__ = __delitem__ = update = pop = popitem = clear = setdefault = _refuse  # type: ignore[assignment]
    __ior__ = _refuse  # type: ignore[assignment]

    def __reduce__(self):        # pickle rebuilds it whole, not item by item through __setitem__
        return (FrozenRow, (dict(self),))


@dataclass
class SearchResult:
    """Every candidate (layout fields, status, estimate, simulated metrics) and the top K. ``rows`` and ``top`` are
    tuples of read-only rows (:class:`FrozenRow`): an audit changed ``top[0]["tp"]`` and the result's summary and
    ``.best`` followed."""

    rows: list[dict[str, Any]]
    top: list[dict[str, Any]]
    tokens_per_step: int
    gpus: int
    seconds: float
    counts: dict[str, int] = field(default_factory=dict)
    max_memory: float = 1.0     # the fraction of the GPU's memory a layout could use to compete
    scenario_searched: Scenario | None = field(default=None, repr=False)
    overrides: dict[str, Any] = field(default_factory=dict, repr=False)   # the cluster size the search planned for
    # wall seconds of enumerating and screening ("screen") and of bounding and simulating ("simulate")
    phase_seconds: dict[str, float] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        frozen = {id(r): FrozenRow(r) for r in self.rows}
        self.rows = tuple(frozen[id(r)] for r in self.rows)                      # type: ignore[assignment]
        self.top = tuple(frozen.get(id(r)) or FrozenRow(r) for r in self.top)    # type: ignore[assignment]

    def __repr__(self) -> str:   # the rows run to thousands of candidates: a notebook cell shows the summary
        best = self.top[0] if self.top else None
        lead = (f"best tp{best['tp']} pp{best['pp']} dp{best['dp']}: {best['step_time_s']:.3f} s, "
                f"{best['tokens_per_s']:,.0f} tokens/s" + (" (tight memory)" if tight_note(best) else "")
                if best else "no layout fits")
        return (f"<SearchResult: {len(self.rows)} layouts of {self.gpus} GPUs, {self.counts.get('simulated', 0)} "
                f"simulated, top {len(self.top)}; {lead}; .best, .table, .summary()>")

    @property
    def table(self):
        """Every candidate as a pandas DataFrame with fixed dtypes: the layout's fields, its status (simulated,
        pruned, oom, tight, invalid, failed, unscreened), the estimate and the simulated metrics (SI units); a layout
        set aside by its floors alone has ``memory_floor_bytes`` (oom) or ``floor_s`` (unscreened) instead."""
        from simtrain.decide.tables import frame_of

        columns = list(dict.fromkeys(k for row in self.rows for k in row))
        return frame_of(self.rows, columns)

    @property
    def best(self) -> Layout | None:
        """The fastest layout that fits (None when none does); ``.best.scenario`` runs it."""
        return self.layout(0) if self.top else None

    def layout(self, i: int = 0) -> Layout:
        """The ``i``-th of the top layouts (0 is the best)."""
        if self.scenario_searched is None:
            raise ValueError("this search result holds no scenario (it was built by hand)")
        if isinstance(i, bool) or not isinstance(i, int):      # True was layout 1; "a" a TypeError from <=
            raise InputError(f"i={i!r}: give the place of a top layout, a whole number from 0 to "
                             f"{len(self.top) - 1} (0 is the best)", field="i")
        if not 0 <= i < len(self.top):
            raise IndexError(f"i={i}: the search kept {len(self.top)} layouts (top=)")
        return Layout(row=self.top[i], base=self.scenario_searched, overrides=self.overrides)

    def scenario(self, i: int = 0) -> Scenario:
        """The runnable scenario of the ``i``-th of the top layouts (0 is the best)."""
        return self.layout(i).scenario

    def summary(self) -> str:
        """The text `simtrain search` prints."""
        return search_text(self)

    def figure(self):
        """The top layouts' tokens/s as bars, each labelled with why it is slower than the best (plotly)."""
        from simtrain.report.charts_decide import search_figure

        return search_figure(self.top, f"{self.counts.get('enumerated', 0)} layouts of {self.gpus} GPUs")

    def _repr_html_(self) -> str:
        head = ["#", "layout", "step", "tokens/s", "MFU", "bubble", "peak mem", "why slower than #1"]
        body = "".join(
            "<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in (
                n, layout_text(r), f"{r['step_time_s']:.3f} s", f"{r['tokens_per_s']:,.0f}", f"{r['mfu']:.1%}",
                f"{r['bubble_fraction']:.1%}", f"{r.get('peak_memory_fraction', 0):.1%}", r["reason"])) + "</tr>"
            for n, r in enumerate(self.top, start=1))
        notes = [counts_text(self)] + [f"warning: {n}" for n in band_notes(self.top)] + (
            [f"warning: the best layout: {tight_note(self.top[0])}"] if self.top and tight_note(self.top[0]) else [])
        return ("<div><b>simtrain search</b><table><tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr>"
                + body + "</table>" + "".join(f"<p>{html.escape(n)}</p>" for n in notes) + "</div>")


def _pct(fraction: float) -> str:
    return f"{fraction:.0%}" if fraction >= 0.045 else f"{fraction:.1%}"


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.0f} ms"


def layout_text(row: dict[str, Any], fields=None) -> str:
    """'tp 2, pp 4, ...' for the given layout fields (all by default)."""
    text = ", ".join(f"{k} {row[k]}" for k in (fields or LAYOUT_KEYS) if k in row)
    if fields:
        return text
    if row.get("recompute_layers"):
        text += f", recompute_layers {row['recompute_layers']}"
    if row.get("recompute_modules"):
        text += f", recompute_modules [{', '.join(row['recompute_modules'])}]"
    return text + (f", offload {row['activation_offload_layers']} layers" if row.get("activation_offload_layers")
                   else "")


def recompute_text(row: dict[str, Any]) -> str:
    """The recompute cell of a layout: its mode, and what screening found for a variant (layers recomputed in
    full per stage, modules added to selective recompute, layers offloaded)."""
    text = row["recompute"]
    if row.get("recompute_layers"):
        n = row["recompute_layers"]
        text += f", {n} layer{'s' if n > 1 else ''} per stage"
    if row.get("recompute_modules"):
        text += " " + "+".join(row["recompute_modules"])
    if row.get("activation_offload_layers"):
        text += f", offload {row['activation_offload_layers']}"
    return text


def why_slower(row: dict[str, Any], best: dict[str, Any]) -> str:
    """The one or two largest contributors (seconds per step) to ``row`` being slower than ``best``."""
    def cell(r: dict[str, Any], k: str) -> Any:
        return recompute_text(r) if k == "recompute" else r.get(k, "-")

    differs = [k for k in LAYOUT_KEYS if cell(row, k) != cell(best, k)]
    rc_row, rc_best = row.get("recompute_s", 0.0), best.get("recompute_s", 0.0)
    work_row, work_best = row["compute_s"] - rc_row, best["compute_s"] - rc_best
    parts = [
        (row["bubble_fraction"] * row["step_time_s"] - best["bubble_fraction"] * best["step_time_s"],
         f"bubble {_pct(row['bubble_fraction'])} vs {_pct(best['bubble_fraction'])}"),
        (row["exposed_dp_s"] - best["exposed_dp_s"],
         f"exposed DP comm {_ms(row['exposed_dp_s'])} vs {_ms(best['exposed_dp_s'])}"),
        (row["exposed_tp_s"] - best["exposed_tp_s"],
         f"TP comm {_ms(row['exposed_tp_s'])} vs {_ms(best['exposed_tp_s'])}"),
        (row["exposed_pp_s"] - best["exposed_pp_s"],
         f"exposed PP comm {_ms(row['exposed_pp_s'])} vs {_ms(best['exposed_pp_s'])}"),
        (row.get("exposed_ep_s", 0.0) - best.get("exposed_ep_s", 0.0),
         f"EP all-to-all {_ms(row.get('exposed_ep_s', 0.0))} vs {_ms(best.get('exposed_ep_s', 0.0))}"),
        (rc_row - rc_best, f"recompute {recompute_text(row)} +{rc_row / max(work_row, 1e-30):.0%} compute"),
        (work_row - work_best, f"compute {format_time(work_row)} vs {format_time(work_best)}"),
    ]
    gap = row["step_time_s"] / best["step_time_s"] - 1.0
    found = [text for delta, text in sorted(parts, key=lambda p: -p[0]) if delta > 0.005 * best["step_time_s"]][:2]
    if not found:
        found = [f"within {gap:.1%}" if gap > 5e-4 else "ties with the best"]
    changes = ", ".join(f"{k} {cell(row, k)} vs {cell(best, k)}" for k in differs)
    return "; ".join(found) + (f" ({changes})" if changes else "")


def counts_text(result: SearchResult) -> str:
    """What the search did with its candidates, in one line."""
    c = result.counts
    return (f"{format_count(c['enumerated'], 'layout')} of {format_count(result.gpus, 'GPU')}: "
            f"{c['invalid']} invalid, {c['oom']} do not fit, "
            f"{c['tight']} fit above {result.max_memory:.0%} of memory (max_memory), "
            f"{c['pruned']} pruned by the analytic bound, "
            + (f"{c['unscreened']} not screened (their step-time floor loses to the top {len(result.top)}), "
               if c.get("unscreened") else "")
            + f"{c['simulated']} simulated"
            + (f", {c['failed']} failed" if c["failed"] else "") + f" ({result.seconds:.1f} s)")


def failed_text(result: SearchResult) -> str | None:
    """When no layout made the top and some failed with a simtrain bug (an exception other than an input error):
    how many, and the commonest failure; those failures, not memory, are why nothing is shown. None otherwise."""
    failed = [r for r in result.rows if r["status"] == "failed"]
    if result.top or not failed:
        return None
    reason, count = Counter(r.get("error") or "no reason given" for r in failed).most_common(1)[0]
    return (f"{len(failed):,} of the {len(result.rows):,} layouts of {format_count(result.gpus, 'GPU')} failed (a "
            f"simtrain bug) and none made the top; the commonest failure ({count:,} of them): {reason}")


def nothing_valid(result: SearchResult) -> str | None:
    """Why the search judged no layout at all, when every one it enumerated was invalid (refused by the scenario
    rules or a limit): how many, and the commonest reason (the first of the commonest, in enumeration order). None
    when any layout got further, or failed (:func:`failed_text` says so)."""
    rows = result.rows
    if not rows or any(r["status"] != "invalid" for r in rows):
        return None
    reason, count = Counter(r.get("error") or "no reason given" for r in rows).most_common(1)[0]
    every = "the one layout" if len(rows) == 1 else f"every one of the {len(rows):,} layouts"
    return (f"{every} of {format_count(result.gpus, 'GPU')} is invalid; the commonest reason "
            f"({count:,} of them): {reason}")


def _band_text(row: dict[str, Any]) -> str:
    low = row.get("step_time_band_low_s")
    return "-" if low is None else f"{low:.2f}-{row['step_time_band_high_s']:.2f} s"


def add_bands(top: list[dict[str, Any]], scenario: Scenario) -> None:
    """Each top layout's step-time band (``step_time_band_low_s``/``_high_s``): the errors of validated runs of the
    same GPU family and stack (report.bands), None where none resembles it."""
    from simtrain.report.bands import band, gpu_family, scenario_stack

    gpu = gpu_family(scenario.hardware.gpu.name)
    for r in top:
        b = band(r["step_time_s"], gpu, scenario_stack(scenario, zero=r["zero"], tp=r["tp"]))
        r["step_time_band_low_s"], r["step_time_band_high_s"] = (b.low_s, b.high_s) if b else (None, None)


def band_notes(top: list[dict[str, Any]]) -> list[str]:
    """The top layouts whose tokens/s band overlaps the best's: the validated runs' errors do not tell them apart."""
    if not top or top[0].get("step_time_band_low_s") is None:
        return []
    tokens = top[0]["tokens_per_s"] * top[0]["step_time_s"]
    lo0, hi0 = tokens / top[0]["step_time_band_high_s"], tokens / top[0]["step_time_band_low_s"]
    close = [n for n, r in enumerate(top[1:], start=2) if r.get("step_time_band_low_s") is not None
             and tokens / r["step_time_band_high_s"] <= hi0 and lo0 <= tokens / r["step_time_band_low_s"]]
    if not close:
        return []
    names = ", #".join(map(str, close))
    return [f"#1 and #{names} are closer than their bands (tokens/s of #1: {lo0:,.0f}-{hi0:,.0f}, from the errors "
            "of validated runs like each): the prediction does not tell them apart"]


def search_text(result: SearchResult) -> str:
    """The top layouts as a terminal table, with the search's own statistics."""
    c = result.counts
    experts = any("ep" in r for r in result.rows)   # a mixture of experts: ep, etp and EP-overlap (ovl) columns
    head = ["#", "tp", "pp", "dp", "vpp", "mb", "zero", "recompute", "schedule", "sp", "prec",
            *(["ep", "etp", "ovl"] if experts else []), "step", "band", "tokens/s", "MFU", "bubble", "peak mem",
            "why slower than #1"]
    body = []
    with_cp = any("cp" in r for r in result.top)
    if with_cp:
        head[3] = "dp x cp"
    for n, r in enumerate(result.top, start=1):
        dp = f"{r['dp']} x {r['cp']}" if with_cp else str(r["dp"])
        recompute = recompute_text(r)
        zero = f"{r['zero']}, host Adam" if r.get("offload_optimizer") else str(r["zero"])
        body.append([str(n), str(r["tp"]), str(r["pp"]), dp, str(r["vpp"]), str(r["micro_batch"]),
                     zero, recompute, r["schedule"], "yes" if r["sequence_parallel"] else "no",
                     r["precision"], *([str(r["ep"]), str(r["etp"]), "yes" if r.get("ep_overlap") else "no"]
                                       if experts else []),
                     f"{r['step_time_s']:.3f} s", _band_text(r), f"{r['tokens_per_s']:,.0f}", f"{r['mfu']:.1%}",
                     f"{r['bubble_fraction']:.1%}", f"{r['peak_memory_bytes_max'] / 1e9:.1f} GB", r["reason"]])
    widths = [max(len(row[i]) for row in [head, *body]) for i in range(len(head))]
    left = (7, 8, len(head) - 1)
    lines = ["  ".join(cell.ljust(w) if i in left else cell.rjust(w)
                       for i, (cell, w) in enumerate(zip(row, widths))).rstrip() for row in [head, *body]]
    lines.append(counts_text(result))
    lines += [f"warning: {note}" for note in band_notes(result.top)]
    if any(r.get("offload_optimizer") for r in result.top):
        hosts = ", ".join(f"#{n}" for n, r in enumerate(result.top, 1) if r.get("offload_optimizer"))
        lines.append(f"warning: {hosts} keep the optimizer on the host; {HOST_ADAM_NOTE}")
    if result.top and tight_note(result.top[0]):
        lines.append(f"warning: the best layout: {tight_note(result.top[0])}")
    if c["bound_violations"]:
        lines.append(f"warning: the analytic bound exceeded the simulated step on {c['bound_violations']} layout(s), "
                     "so pruning may have skipped a winner (a simtrain bug: estimate and engine disagree)")
    why_none = failed_text(result) or nothing_valid(result)
    if why_none:
        lines.append(why_none)
    elif not result.top:
        lines.append(f"no layout fits within {result.max_memory:.0%} of memory: try more GPUs (gpus), "
                     "a smaller global batch or a smaller model" + (", or a higher max_memory" if c["tight"] else ""))
    return "\n".join(lines) + "\n"
