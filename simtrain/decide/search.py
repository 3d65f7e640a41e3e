"""Automatic parallelism search: the fastest layouts for a model, a cluster and a global batch.

1. Enumerate every layout (tp, pp, dp, vpp, micro_batch, zero, recompute, schedule,
   sequence_parallel) for the GPU count: TP within a node, PP dividing the layers,
   DP from the rest; each candidate is ``scenario.with_overrides(...)``, and those
   the scenario rules reject (InputError) are dropped.
2. Drop the layouts that do not fit by the memory model (``simtrain.plan.memory``), or fit with less headroom than
   ``max_memory`` leaves (default 95% of the GPU, where ``simtrain run`` warns of allocator retries).
3. Bound the rest with the analytic estimate (:mod:`simtrain.decide.estimate`): its
   ``lower_bound_s`` never exceeds the simulated step, so ``tokens / lower_bound``
   is an optimistic throughput.
4. Simulate candidates in order of their estimate, skipping any whose optimistic
   throughput is below the K-th best simulated so far: a skipped layout cannot be
   in the top K, so the answer equals simulating every candidate (a test checks it). Candidates go in
   rounds of ``SIMULATE_BATCH``, whatever the worker count, so the table is the same on every machine.

Screening and simulation run on the sweep's executors (:mod:`simtrain.decide.sweep`).
"""

from __future__ import annotations

import math
import time
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any

from simtrain.decide.sweep import ScenarioPayload, error_text
from simtrain.decide.workers import open_executor, progress_bar, run_tasks
from simtrain.plan.memory import EDGE_OF_MEMORY
from simtrain.spec.errors import InputError, SimulationLimitError
from simtrain.spec.scenario import Scenario
from simtrain.spec.units import as_whole, format_count, format_time

#: layout field -> scenario key
LAYOUT_KEYS = {"tp": "parallel.tp", "pp": "parallel.pp", "dp": "parallel.dp", "vpp": "parallel.vpp",
               "micro_batch": "training.micro_batch", "zero": "parallel.zero", "recompute": "training.recompute",
               "schedule": "parallel.schedule", "sequence_parallel": "parallel.sequence_parallel"}
RECOMPUTE = ("none", "selective", "selective_op", "full")


#: layouts a search screens at most unless its caller raises it: each costs a memory check and an estimate
#: (measured ~4.5 ms on pp4_dp4's 5,080 layouts), so 20,000 is about 90 s of one core before any simulation
MAX_LAYOUTS = 20_000


def _divisors(n: int) -> list[int]:
    """The divisors of ``n`` in increasing order, in O(sqrt n) steps (a global batch of 2**30 is instant)."""
    small, large = [], []
    d = 1
    while d * d <= n:
        if n % d == 0:
            small.append(d)
            if d * d != n:
                large.append(n // d)
        d += 1
    return small + large[::-1]


def gpu_overrides(scenario: Scenario, gpus: int | None) -> dict[str, Any]:
    """Scenario keys that give the cluster ``gpus`` GPUs: nodes = gpus / gpus_per_node."""
    if gpus is None:
        return {}
    gpn = scenario.gpus_per_node
    whole = as_whole(gpus)
    if whole is None:
        raise InputError(f"--gpus {gpus!r}: give a whole number of GPUs", field="gpus")
    gpus = whole
    if gpus < 1:
        raise InputError(f"--gpus {gpus}: give a positive GPU count", field="gpus")
    if gpus > scenario.simulation.max_gpus:
        raise SimulationLimitError(f"--gpus {gpus:,} is more than simulation.max_gpus={scenario.simulation.max_gpus:,}"
                                   ": building the network graph and plan takes time and memory in proportion; "
                                   "raise simulation.max_gpus (e.g. --set simulation.max_gpus=N) if you mean it",
                                   field="gpus")
    if scenario.hardware.explicit:
        raise InputError("--gpus cannot resize an explicit topology (its hardware file lists the devices)",
                         field="gpus")
    if gpus < gpn:
        return {"nodes": 1, "gpus_per_node": gpus}
    if gpus % gpn:
        raise InputError(f"--gpus {gpus} is not a whole number of {gpn}-GPU nodes", field="gpus")
    return {"nodes": gpus // gpn}


def enumerate_layouts(scenario: Scenario, gpus: int | None = None, max_layouts: int | None = None
                      ) -> list[dict[str, Any]]:
    """Every layout worth validating for the scenario's model, cluster size (or ``gpus``) and global
    batch, in a fixed order. Cheap arithmetic only; the scenario rules have the last word (:func:`screen`).
    Layouts that cannot differ are listed once: ZeRO needs dp > 1, sequence parallelism tp > 1, and
    with one stage the schedule is moot (1F1B)."""
    m, tr = scenario.model, scenario.training
    sizes = gpu_overrides(scenario, gpus)
    gpn = sizes.get("gpus_per_node", scenario.gpus_per_node)
    total = gpn * sizes.get("nodes", scenario.nodes)
    out = []
    for tp in _divisors(gpn):
        if total % tp or m.heads % tp or m.num_kv_heads % tp or m.ffn_hidden % tp:
            continue
        for pp in _divisors(total // tp):
            if m.layers % pp:
                continue
            dp = total // (tp * pp)
            if tr.global_batch % dp:
                continue
            for mb in _divisors(tr.global_batch // dp):
                micro = tr.global_batch // (mb * dp)
                shapes = [("1f1b", 1)] if pp == 1 else [("gpipe", 1), ("1f1b", 1)]
                if pp > 1 and micro % pp == 0:
                    shapes += [("interleaved-1f1b", v) for v in _divisors(m.layers // pp) if v >= 2]
                for schedule, vpp in shapes:
                    for zero in ((0, 1, 2, 3) if dp > 1 else (0,)):
                        for recompute in RECOMPUTE:
                            for sp in ((False, True) if tp > 1 else (False,)):
                                out.append({"tp": tp, "pp": pp, "dp": dp, "vpp": vpp, "micro_batch": mb,
                                            "zero": zero, "recompute": recompute, "schedule": schedule,
                                            "sequence_parallel": sp})
                if max_layouts is not None and len(out) > max_layouts:
                    raise SimulationLimitError(
                        f"this search would screen more than {max_layouts:,} layouts (about "
                        f"{max_layouts * 4.5e-3:,.0f} s of one core before any simulation), more than max_layouts="
                        f"{max_layouts:,}; fix part of the layout with --set, search fewer GPUs or a smaller global "
                        "batch, or raise the limit (--max-layouts, search(max_layouts=...))", field="max_layouts")
    return out


def _overrides(layout: dict[str, Any]) -> dict[str, Any]:
    out = {LAYOUT_KEYS[k]: v for k, v in layout.items()}
    out["parallel.layers_per_stage"] = None   # an uneven split of the original layout does not carry over
    return out


def screen(payload: ScenarioPayload, base: dict[str, Any], layouts: list[dict[str, Any]],
           max_memory: float = 1.0) -> list[dict[str, Any]]:
    """Validate, check memory and estimate each layout (runs in a worker); never raises. Status:
    'invalid' (rejected by the scenario rules), 'oom', 'tight' (fits, above ``max_memory`` of the GPU),
    'fits' (then estimated) or 'failed'."""
    from simtrain.decide.estimate import estimate
    from simtrain.engine.simulation import memory

    scenario = payload.build()
    out = []
    for layout in layouts:
        row: dict[str, Any] = {"status": "invalid"}
        try:
            sc = scenario.with_overrides({**base, **_overrides(layout)})
            mem = memory(sc)
            row.update(status="oom", peak_memory_bytes_max=round(mem.peak_memory_bytes_max))
            if mem.fits_in_memory and mem.peak_memory_bytes_max > max_memory * mem.capacity_bytes:
                row.update(status="tight")
            elif mem.fits_in_memory:
                est = estimate(sc)
                row.update(status="fits", estimate_s=est.step_time_s, lower_bound_s=est.lower_bound_s,
                           compute_s=est.compute_s, recompute_s=est.recompute_s)
        except InputError as err:        # the scenario rules reject this layout
            row.update(status="invalid", error=error_text(err))
        except Exception as err:  # noqa: BLE001 - a failing layout is reported, not fatal
            row.update(status="failed", error=error_text(err))
        out.append(row)
    return out


def simulate_layout(payload: ScenarioPayload, base: dict[str, Any], layout: dict[str, Any]) -> dict[str, Any]:
    """Simulate one layout (runs in a worker); never raises."""
    from simtrain.engine.simulation import simulate

    try:
        r = simulate(payload.build().with_overrides({**base, **_overrides(layout)}))
    except Exception as err:  # noqa: BLE001
        return {"status": "failed", "error": error_text(err)}
    return {"status": "simulated", "step_time_s": r.step_time_s, "tokens_per_s": r.tokens_per_s, "mfu": r.mfu,
            "bubble_fraction": r.bubble_fraction, "peak_memory_bytes_max": round(r.peak_memory_bytes_max),
            "exposed_tp_s": r.exposed_comm_s.get("tp", 0.0), "exposed_pp_s": r.exposed_comm_s.get("pp", 0.0),
            "exposed_dp_s": r.exposed_comm_s.get("dp", 0.0),
            "compute_s": max(st.compute_s for st in r.stages)}


@dataclass
class SearchResult:
    """Every candidate (layout fields, status, estimate, simulated metrics) and the top K."""

    rows: list[dict[str, Any]]
    top: list[dict[str, Any]]
    tokens_per_step: int
    gpus: int
    seconds: float
    counts: dict[str, int] = field(default_factory=dict)
    max_memory: float = 1.0     # the fraction of the GPU's memory a layout could use to compete

    def __repr__(self) -> str:   # the rows run to thousands of candidates: a notebook cell shows the summary
        best = self.top[0] if self.top else None
        lead = (f"best tp{best['tp']} pp{best['pp']} dp{best['dp']}: {best['step_time_s']:.3f} s, "
                f"{best['tokens_per_s']:,.0f} tokens/s" if best else "no layout fits")
        return (f"<SearchResult: {len(self.rows)} layouts of {self.gpus} GPUs, {self.counts.get('simulated', 0)} "
                f"simulated, top {len(self.top)}; {lead}; .top, .table(), search_text(result)>")

    def table(self):
        """Every candidate as a pandas DataFrame (floats rounded as in the JSON reports): the layout's fields,
        its status (simulated, pruned, oom, tight, invalid, failed), the estimate and the simulated metrics."""
        import pandas as pd

        from simtrain.spec.units import report_float

        return pd.DataFrame([{k: report_float(v) if isinstance(v, float) else v for k, v in row.items()}
                             for row in self.rows])


#: layouts simulated per round; the pruning bound is updated between rounds. A constant, not the worker count,
#: so that which layouts are simulated or pruned (and so ``--out``) is the same on every machine.
SIMULATE_BATCH = 4


def search(scenario: Scenario, *, gpus: int | None = None, top: int = 5, workers: int | None = None,
           executor: Executor | None = None, progress: bool | None = None,
           max_memory: float = EDGE_OF_MEMORY, max_layouts: int = MAX_LAYOUTS) -> SearchResult:
    """The ``top`` layouts by simulated tokens/s (module docstring for the method), among those whose peak memory
    stays within ``max_memory`` of the GPU's. More than ``max_layouts`` candidate layouts is refused up front."""
    whole = as_whole(top)
    if whole is None or whole < 1:
        raise InputError(f"--top {top!r}: give a whole number, 1 or more", field="top")
    top = whole
    if isinstance(max_memory, bool) or not isinstance(max_memory, (int, float)) or not 0 < max_memory <= 1:
        raise InputError(f"--max-memory {max_memory!r}: give a fraction of the GPU's memory in (0, 1]",
                         field="max_memory")
    started = time.perf_counter()
    base = gpu_overrides(scenario, gpus)
    total = base.get("gpus_per_node", scenario.gpus_per_node) * base.get("nodes", scenario.nodes)
    limit = as_whole(max_layouts)
    if limit is None or limit < 1:
        raise InputError(f"max_layouts={max_layouts!r}: give a whole number, 1 or more", field="max_layouts")
    layouts = enumerate_layouts(scenario, gpus, limit)
    if not layouts:
        raise InputError(f"no layout of {total} GPUs divides the model and the global batch of "
                         f"{scenario.training.global_batch}")
    payload = ScenarioPayload.of(scenario)
    rows = [dict(layout) for layout in layouts]
    with open_executor(workers, executor, len(layouts)) as ex:
        lanes = getattr(ex, "_max_workers", None) or workers or 1
        size = max(8, min(128, math.ceil(len(layouts) / (4 * lanes))))
        chunks = [list(range(i, min(i + size, len(layouts)))) for i in range(0, len(layouts), size)]
        with progress_bar(len(layouts), progress, "screen") as bar:
            for c, value in run_tasks(screen, [(payload, base, [layouts[i] for i in ch], max_memory) for ch in chunks],
                                      ex):
                for i, info in zip(chunks[c], value if isinstance(value, list) else []):
                    rows[i].update(info)
                if not isinstance(value, list):
                    for i in chunks[c]:
                        rows[i].update(status="invalid", error=error_text(value))
                bar.update(len(chunks[c]))
        tokens = scenario.tokens_per_step
        order = sorted((i for i, r in enumerate(rows) if r["status"] == "fits"),
                       key=lambda i: (rows[i]["estimate_s"], i))
        best: list[tuple[float, int]] = []      # (-tokens/s, index) of simulated layouts, sorted

        def threshold() -> float:
            return -best[top - 1][0] if len(best) >= top else 0.0

        with progress_bar(len(order), progress, "simulate") as bar:
            pos = 0
            while pos < len(order):
                batch = []
                while pos < len(order) and len(batch) < SIMULATE_BATCH:
                    i = order[pos]
                    pos += 1
                    bound = rows[i]["lower_bound_s"]
                    if bound > 0 and tokens / bound < threshold():
                        rows[i]["status"] = "pruned"
                        bar.update(1)
                        continue
                    batch.append(i)
                for k, value in run_tasks(simulate_layout, [(payload, base, layouts[i]) for i in batch], ex):
                    i = batch[k]
                    if isinstance(value, BaseException):
                        value = {"status": "failed", "error": error_text(value)}
                    rows[i].update(value)
                    if value["status"] == "simulated":
                        best.append((-value["tokens_per_s"], i))
                        best.sort()
                    bar.update(1)
    for r in rows:
        r["reason"] = ""
    winners = [rows[i] for _, i in best[:top]]
    for r in winners[1:]:
        r["reason"] = why_slower(r, winners[0])
    if winners:
        winners[0]["reason"] = "best"
    counts = {s: sum(1 for r in rows if r["status"] == s)
              for s in ("invalid", "oom", "tight", "pruned", "simulated", "failed")}
    counts["enumerated"] = len(rows)
    # the pruning is exact only if the bound holds; check it on every layout that was simulated
    counts["bound_violations"] = sum(1 for r in rows if r["status"] == "simulated"
                                     and r["lower_bound_s"] > r["step_time_s"])
    return SearchResult(rows=rows, top=winners, tokens_per_step=tokens, gpus=total,
                        seconds=time.perf_counter() - started, counts=counts, max_memory=max_memory)


def _pct(fraction: float) -> str:
    return f"{fraction:.0%}" if fraction >= 0.045 else f"{fraction:.1%}"


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.0f} ms"


def layout_text(row: dict[str, Any], fields=None) -> str:
    """'tp 2, pp 4, ...' for the given layout fields (all by default)."""
    return ", ".join(f"{k} {row[k]}" for k in (fields or LAYOUT_KEYS))


def why_slower(row: dict[str, Any], best: dict[str, Any]) -> str:
    """The one or two largest contributors (seconds per step) to ``row`` being slower than ``best``."""
    differs = [k for k in LAYOUT_KEYS if row[k] != best[k]]
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
        (rc_row - rc_best, f"recompute {row['recompute']} +{rc_row / max(work_row, 1e-30):.0%} compute"),
        (work_row - work_best, f"compute {format_time(work_row)} vs {format_time(work_best)}"),
    ]
    gap = row["step_time_s"] / best["step_time_s"] - 1.0
    found = [text for delta, text in sorted(parts, key=lambda p: -p[0]) if delta > 0.005 * best["step_time_s"]][:2]
    if not found:
        found = [f"within {gap:.1%}" if gap > 5e-4 else "ties with the best"]
    changes = ", ".join(f"{k} {row[k]} vs {best[k]}" for k in differs)
    return "; ".join(found) + (f" ({changes})" if changes else "")


def search_text(result: SearchResult) -> str:
    """The top layouts as a terminal table, with the search's own statistics."""
    c = result.counts
    head = ["#", "tp", "pp", "dp", "vpp", "mb", "zero", "recompute", "schedule", "sp", "step", "tokens/s", "MFU",
            "bubble", "peak mem", "why slower than #1"]
    body = []
    for n, r in enumerate(result.top, start=1):
        body.append([str(n), str(r["tp"]), str(r["pp"]), str(r["dp"]), str(r["vpp"]), str(r["micro_batch"]),
                     str(r["zero"]), r["recompute"], r["schedule"], "yes" if r["sequence_parallel"] else "no",
                     f"{r['step_time_s']:.3f} s", f"{r['tokens_per_s']:,.0f}", f"{r['mfu']:.1%}",
                     f"{r['bubble_fraction']:.1%}", f"{r['peak_memory_bytes_max'] / 1e9:.1f} GB", r["reason"]])
    widths = [max(len(row[i]) for row in [head, *body]) for i in range(len(head))]
    lines = ["  ".join(cell.ljust(w) if i in (7, 8, 15) else cell.rjust(w)
                       for i, (cell, w) in enumerate(zip(row, widths))).rstrip() for row in [head, *body]]
    lines.append(f"{format_count(c['enumerated'], 'layout')} of {format_count(result.gpus, 'GPU')}: "
                 f"{c['invalid']} invalid, {c['oom']} do not fit, "
                 f"{c['tight']} fit above {result.max_memory:.0%} of memory (--max-memory), "
                 f"{c['pruned']} pruned by the analytic bound, {c['simulated']} simulated"
                 + (f", {c['failed']} failed" if c["failed"] else "") + f" ({result.seconds:.1f} s)")
    if c["bound_violations"]:
        lines.append(f"warning: the analytic bound exceeded the simulated step on {c['bound_violations']} layout(s), "
                     "so pruning may have skipped a winner (a simtrain bug: estimate and engine disagree)")
    if not result.top:
        lines.append(f"no layout fits within {result.max_memory:.0%} of memory: try more GPUs (--gpus), "
                     "a smaller global batch or a smaller model" + (", or a higher --max-memory" if c["tight"] else ""))
    return "\n".join(lines) + "\n"
