"""Automatic parallelism search: the fastest layouts for a model, a cluster and a global batch.

1. Enumerate every layout (tp, pp, dp, vpp, micro_batch, zero, recompute, schedule,
   sequence_parallel, precision; for a mixture of experts ep and etp) for the GPU count: TP within a node
   (within the scale-up domain where the hardware file's NVLink domain spans several nodes, as on NVL72 racks),
   bf16 and fp8 where the GPU has an FP8 peak (and the scenario trains in either), PP dividing the layers,
   EP dividing the experts with etp x ep dividing the stage's tp x dp GPUs (Megatron-Core's folding) and etp
   a divisor of tp that divides the expert width,
   DP from the rest.
2. Floor every layout in bulk (:mod:`simtrain.decide.bulk`, numpy over the layout table): a step time it cannot go
   below, from per-layer figures computed once per (tp, sequence parallelism, cp, micro-batch, precision,
   recompute); and, a block at a time as the screening reaches them, a peak memory it cannot go below: a layout
   whose memory floor passes the GPU's memory does not fit and is never built.
3. Screen the others in waves of ``SCREEN_WAVE``, in order of their step-time floor: build the scenario (the rules
   reject some: InputError), drop those that do not fit by the memory model (``simtrain.plan.memory``) or fit with
   less headroom than ``max_memory`` leaves (default :data:`DEFAULT_MAX_MEMORY`: the memory ledger's measured error
   kept free), and bound the rest with the analytic estimate (:mod:`simtrain.decide.estimate`), whose
   ``lower_bound_s`` never exceeds the simulated step, so ``tokens / lower_bound`` is an optimistic throughput.
4. Simulate screened candidates in order of their estimate, in rounds of ``SIMULATE_BATCH`` (whatever the worker
   count, so the table is the same on every machine), skipping any whose optimistic throughput is below the K-th
   best simulated so far; screen another wave whenever a layout not yet screened has a floor below the best waiting
   estimate. Once the next floor's throughput is below the K-th best, every layout left is "unscreened": its floor
   never exceeds its bound, so none of them can be in the top K, and the answer equals simulating every layout
   that fits (tests check it against brute force, and the floors against the bound and the ledger).

Screening and simulation run on the sweep's executors (:mod:`simtrain.decide.sweep`). ``fix`` narrows the
enumeration itself (``{"parallel.zero": 1, "parallel.tp": [4, 8]}``). The screening (validity, memory, estimate) does
not depend on ``max_memory``, so it is kept for the last few searched scenarios in this process and a second search
at another ``max_memory`` screens only the layouts the first never reached.
"""

from __future__ import annotations

import heapq
import json
import math
import time
from collections import OrderedDict
from concurrent.futures import Executor
from typing import Any

from simtrain.decide.bulk import floors, memory_floors
from simtrain.decide.search_result import (  # noqa: F401 - re-exported: the search's names in one place
    LAYOUT_KEYS,
    RESOLVED,
    SearchResult,
    add_bands,
    layout_overrides,
    layout_text,
    search_text,
    why_slower,
)
from simtrain.decide.search_space import (  # noqa: F401 - re-exported: the enumeration's names, as before
    CP_MIN_TOKENS,
    MAX_LAYOUTS,
    RECOMPUTE,
    VARIANTS,
    _divisors,
    check_fix,
    enumerate_layouts,
    fix_text,
    gpu_overrides,
    searched_gpus,
)
from simtrain.decide.sweep import ScenarioPayload, error_text
from simtrain.decide.workers import open_executor, progress_bar, run_tasks
from simtrain.plan.shared_costs import shared_costs
from simtrain.report.accuracy import LEDGER_ERROR
from simtrain.spec.errors import InputError
from simtrain.spec.scenario import Scenario
from simtrain.spec.units import as_whole

#: the default ``max_memory``: keep the memory ledger's measured error free (1 - 0.078, rounded down to 0.92), so
#: that a winner fits even if the ledger underestimates it as much as it has been off where a peak was measured
DEFAULT_MAX_MEMORY = math.floor((1.0 - LEDGER_ERROR) * 100) / 100
#: screened rows of the last few searches, by what they depend on (scenario, hardware, cluster size, layouts)
_SCREENED: OrderedDict[str, dict[str, dict[str, Any]]] = OrderedDict()
_SCREENED_KEEP = 4
def screen(payload: ScenarioPayload, base: dict[str, Any], layouts: list[dict[str, Any]],
           max_memory: float = 1.0) -> list[dict[str, Any]]:
    """Validate, check memory and estimate each layout (runs in a worker); never raises. Status:
    'invalid' (rejected by the scenario rules), 'oom', 'tight' (fits, above ``max_memory`` of the GPU; estimated
    too, so that another ``max_memory`` can reuse the row), 'fits' (then estimated) or 'failed'. An offloading
    variant offloads the fewest layers that bring it within ``max_memory``."""
    scenario, cache = _worker_state(payload)
    with shared_costs(cache):   # figures the layouts share (simtrain.plan.shared_costs), once per search and process
        return [_screen_one(scenario, base, layout, max_memory) for layout in layouts]


#: (payload key, its scenario, its shared-cost cache) of the search this process screens for: a search screens in
#: waves, and each wave's chunk would otherwise rebuild the scenario and every shared figure
_WORKER: list = [None, None, None]


def _worker_state(payload: ScenarioPayload) -> tuple[Scenario, dict]:
    key = (json.dumps(payload.raw, sort_keys=True, default=str), payload.file, payload.base_dir)
    if _WORKER[0] != key:
        _WORKER[:] = [key, payload.build(), {}]
    return _WORKER[1], _WORKER[2]


def _screen_one(scenario: Scenario, base: dict[str, Any], layout: dict[str, Any], max_memory: float) -> dict:
    """One layout's screening row (:func:`screen`)."""
    from simtrain.decide.estimate import estimate
    from simtrain.plan.advice import fewest_offload_layers
    from simtrain.plan.balance import resolve_split
    from simtrain.plan.build import build_plan
    from simtrain.plan.memory import memory_report

    row: dict[str, Any] = {"status": "invalid"}
    try:
        sc = resolve_split(scenario.with_overrides({**base, **layout_overrides(layout)}))
        mem = memory_report(sc)     # the ledger of simtrain.memory(sc), without its per-GPU report
        if layout.get("partial") or layout.get("modules"):   # the cheapest granularity within max_memory
            found = _granularity(sc, mem, max_memory * mem.capacity, layout)
            if isinstance(found, str):
                return {"status": "invalid", "error": found}
            sc, mem, key, value = found
            row[key] = value
        if layout.get("offload"):   # the fewest offloaded layers that bring it within max_memory (plan.advice)
            if mem.peak_max <= max_memory * mem.capacity:
                return {"status": "invalid", "error": "fits within max_memory without offloading: the same layout "
                                                      "without it competes"}
            found = fewest_offload_layers(sc, mem, max_memory * mem.capacity)
            if found is not None:
                sc = sc.with_overrides({"training.activation_offload_layers": found[0]})
                mem = memory_report(sc)
                row["activation_offload_layers"] = found[0]
        row.update(status="oom", peak_memory_bytes_max=round(mem.peak_max),
                   peak_memory_fraction=mem.peak_max / mem.capacity)
        if mem.fits:
            est = estimate(sc, build_plan(sc, mem.stages))
            tight = mem.peak_max > max_memory * mem.capacity
            row.update(status="tight" if tight else "fits", estimate_s=est.step_time_s,
                       lower_bound_s=est.lower_bound_s, compute_s=est.compute_s, recompute_s=est.recompute_s)
    except InputError as err:        # the scenario rules reject this layout
        row.update(status="invalid", error=error_text(err))
    except Exception as err:  # noqa: BLE001 - a failing layout is reported, not fatal
        row.update(status="failed", error=error_text(err))
    return row


def _granularity(sc: Scenario, mem, limit: float, layout: dict[str, Any]):
    """A recompute-granularity variant (``partial``: the fewest layers per stage recomputed in full, ``modules``: the
    cheapest modules added to selective recompute, ``plan.advice.cheapest_recompute_modules``) that brings ``sc`` within
    ``limit`` bytes: (its scenario, its ledger, the row key, its value), or why the variant does not compete."""
    from simtrain.plan.advice import cheapest_recompute_modules, fewest_recompute_layers
    from simtrain.plan.balance import resolve_split
    from simtrain.plan.memory import memory_report

    if layout.get("partial"):
        if mem.peak_max > limit:     # every layer recomputed keeps the least: fewer cannot fit
            return "no partial recompute brings it within max_memory: even every layer recomputed does not"
        plain = resolve_split(sc.with_overrides({"training.recompute": "none"}))
        plain_mem = memory_report(plain)
        if plain_mem.peak_max <= limit:
            return "fits within max_memory without recompute: the same layout without it competes"
        found = fewest_recompute_layers(plain, plain_mem, limit)
        if found is None or found[0] >= min(sc.layers_per_stage):
            return "no partial recompute brings it within max_memory: the same layout recomputing every layer competes"
        sc = resolve_split(sc.with_overrides({"training.recompute_layers": found[0]}))
        return sc, memory_report(sc), "recompute_layers", found[0]
    if mem.peak_max <= limit:
        return "fits within max_memory with the scenario's recompute modules: that layout competes"
    found = cheapest_recompute_modules(sc, mem, limit)
    if found is not None:
        moved = resolve_split(sc.with_overrides({"training.recompute_modules": found[0]}))
        return moved, memory_report(moved), "recompute_modules", found[0]
    return "no added recompute module brings it within max_memory: full recompute competes"


def simulate_layout(payload: ScenarioPayload, base: dict[str, Any], layout: dict[str, Any]) -> dict[str, Any]:
    """Simulate one layout (runs in a worker); never raises."""
    from simtrain.engine.simulation import simulate

    try:
        r = simulate(_worker_state(payload)[0].with_overrides({**base, **layout_overrides(layout)}))
    except InputError as err:      # refused (a limit such as simulation.max_events): invalid, as in screening
        return {"status": "invalid", "error": error_text(err)}
    except Exception as err:  # noqa: BLE001 - a simtrain bug: reported in the row, not fatal to the search
        return {"status": "failed", "error": error_text(err)}
    return {"status": "simulated", "step_time_s": r.step_time_s, "tokens_per_s": r.tokens_per_s, "mfu": r.mfu,
            "bubble_fraction": r.bubble_fraction, "peak_memory_bytes_max": round(r.peak_memory_bytes_max),
            "exposed_tp_s": r.exposed_comm_s.get("tp", 0.0), "exposed_pp_s": r.exposed_comm_s.get("pp", 0.0),
            "exposed_dp_s": r.exposed_comm_s.get("dp", 0.0),
            "peak_memory_fraction": r.peak_memory_bytes_max / r.capacity_bytes,
            **({"exposed_ep_s": r.exposed_comm_s["ep"]} if "ep" in r.exposed_comm_s else {}),
            "compute_s": max(st.compute_s for st in r.stages), "events": r.events}


#: layouts simulated per round; the pruning bound is updated between rounds. A constant, not the worker count,
#: so that which layouts are simulated or pruned (and so ``--out``) is the same on every machine.
SIMULATE_BATCH = 4
#: layouts screened per wave, in order of their step-time floor; a constant for the same reason
SCREEN_WAVE = 64
#: the same for layouts with no floor (0: every one is screened), which sort first
UNFLOORED_WAVE = 1024


def _cache_key(layout: dict[str, Any], max_memory: float) -> str:
    """A screened row's key in :data:`_SCREENED`: its layout, and for an offloading variant the max_memory its
    offloaded layers were found for (other rows do not depend on it)."""
    return json.dumps([layout, max_memory] if any(layout.get(k) for k in VARIANTS) else layout, sort_keys=True)


def _layout_of(row: dict[str, Any], layout: dict[str, Any]) -> dict[str, Any]:
    """What simulates a screened layout: its fields, and the offloaded layers its screening found."""
    return {**layout, **{k: row[k] for k in RESOLVED if row.get(k)}}


def _screen_key(scenario: Scenario, base: dict[str, Any]) -> str:
    """What screened rows depend on: the scenario as given, the model and hardware it resolves to, the cluster."""
    from simtrain.decide.sweep_files import sweep_identity

    return json.dumps([sweep_identity(scenario, {}), base], sort_keys=True, default=str)


def search(scenario: Scenario, *, gpus: int | None = None, top: int = 5, workers: int | None = None,
           executor: Executor | None = None, progress: bool | None = None,
           max_memory: float = DEFAULT_MAX_MEMORY, fix: dict[str, Any] | None = None,
           max_layouts: int = MAX_LAYOUTS) -> SearchResult:
    """The ``top`` layouts by simulated tokens/s (module docstring for the method), among those whose peak memory
    stays within ``max_memory`` of the GPU's, and whose fields take the values ``fix`` allows. More than
    ``max_layouts`` candidate layouts is refused up front."""
    whole = as_whole(top)
    if whole is None or whole < 1:
        raise InputError(f"top={top!r}: give a whole number, 1 or more", field="top")
    top = whole
    if isinstance(max_memory, bool) or not isinstance(max_memory, (int, float)) or not 0 < max_memory <= 1:
        raise InputError(f"max_memory={max_memory!r}: give a fraction of the GPU's memory in (0, 1]",
                         field="max_memory")
    started = time.perf_counter()
    base = gpu_overrides(scenario, gpus)
    total = searched_gpus(scenario, base)
    limit = as_whole(max_layouts)
    if limit is None or limit < 1:
        raise InputError(f"max_layouts={max_layouts!r}: give a whole number, 1 or more", field="max_layouts")
    layouts = enumerate_layouts(scenario, gpus, fix, limit)
    if not layouts:
        # with fix=, the message is the field's ("fix: KEY=VALUES: ..."): the values once, the option once
        narrowed = f"{fix_text(fix)}: " if fix else ""
        raise InputError(f"{narrowed}no layout of {total} GPUs with these values divides the model and the global "
                         f"batch of {scenario.training.global_batch}" if fix else
                         f"no layout of {total} GPUs divides the model and the global batch of "
                         f"{scenario.training.global_batch}", field="fix" if fix else None)
    payload = ScenarioPayload.of(scenario)
    rows = [dict(layout) for layout in layouts]
    key = _screen_key(scenario, base)
    screened = _SCREENED[key] = _SCREENED.get(key, {})    # rows screened by earlier searches of the same scenario
    _SCREENED.move_to_end(key)
    while len(_SCREENED) > _SCREENED_KEEP:
        _SCREENED.popitem(last=False)
    floor = floors(scenario, base, layouts)      # every layout's step-time floor, in bulk (decide/bulk.py)
    capacity = scenario.hardware.gpu.memory
    memory_cache: dict = {}
    by_floor = sorted(range(len(layouts)), key=lambda i: (floor[i], i))
    floored_at = time.perf_counter()
    tokens = scenario.tokens_per_step
    best: list[tuple[float, int]] = []      # (-tokens/s, index) of simulated layouts, sorted
    waiting: list[tuple[float, int]] = []   # (estimate, index) of screened layouts that fit: a heap

    def threshold() -> float:
        return -best[top - 1][0] if len(best) >= top else 0.0

    def beaten(bound: float) -> bool:
        return bound > 0 and tokens / bound < threshold()

    pos = pruned = simulated = events = screen_count = set_aside = 0
    memory_floor: dict[int, float] = {}     # by layout index, computed as the screening reaches it
    screen_time = 0.0
    with open_executor(workers, executor, len(layouts)) as ex, \
            progress_bar(len(layouts), progress, "bound and simulate", eta=False, unit="layout") as bar:
        lanes = getattr(ex, "_max_workers", None) or workers or 1

        def screen_wave() -> None:
            """Screen the next SCREEN_WAVE layouts by floor (fewer where a floor already loses)."""
            nonlocal pos, screen_count, screen_time, set_aside
            started_wave = time.perf_counter()
            wave, taken = [], 0     # a wave takes SCREEN_WAVE layouts, screened now or by an earlier search
            # layouts with no floor (models whose layers differ) are all screened: in larger waves, so that the
            # workers do not wait for each other at every wave's end
            limit = SCREEN_WAVE if pos < len(by_floor) and floor[by_floor[pos]] > 0 else UNFLOORED_WAVE
            while pos < len(by_floor) and taken < limit and not beaten(floor[by_floor[pos]]):
                i = by_floor[pos]
                pos += 1
                if i not in memory_floor:     # the next layouts' memory floors, a block at a time
                    block = [j for j in by_floor[pos - 1:pos - 1 + 4 * SCREEN_WAVE] if j not in memory_floor]
                    memory_floor.update(zip(block, memory_floors(scenario, base, [layouts[j] for j in block],
                                                                 memory_cache).tolist()))
                if memory_floor[i] > capacity:    # cannot fit whatever else it costs: never built
                    rows[i].update(status="oom", memory_floor_bytes=memory_floor[i],
                                   error=f"its memory floor, {memory_floor[i] / 1e9:.1f} GB, is above the GPU's "
                                         f"{capacity / 1e9:.1f} GB: not built (nor checked against the scenario "
                                         "rules)")
                    set_aside += 1
                    bar.update(1)
                    continue
                taken += 1
                hit = screened.get(_cache_key(layouts[i], max_memory))
                if hit is None:
                    wave.append(i)
                else:
                    rows[i].update(hit)
                    _queue(i)
            size = max(8, math.ceil(len(wave) / (4 * lanes)))   # a few chunks per worker: none waits long
            chunks = [wave[k:k + size] for k in range(0, len(wave), size)]
            for c, value in run_tasks(screen, [(payload, base, [layouts[i] for i in ch], max_memory) for ch in chunks],
                                      ex):
                for i, info in zip(chunks[c], value if isinstance(value, list) else []):
                    rows[i].update(info)
                if not isinstance(value, list):     # the whole chunk raised: its input, or a simtrain bug
                    status = "invalid" if isinstance(value, InputError) else "failed"
                    for i in chunks[c]:
                        rows[i].update(status=status, error=error_text(value))
                for i in chunks[c]:
                    if rows[i]["status"] != "failed":      # a bug is not remembered for the next search
                        screened[_cache_key(layouts[i], max_memory)] = \
                            {k: v for k, v in rows[i].items() if k not in layouts[i]}
                    _queue(i)
            screen_count += len(wave)
            screen_time += time.perf_counter() - started_wave

        def _queue(i: int) -> None:
            """A screened layout: in the queue if it fits within max_memory (the screening ran at 1)."""
            r = rows[i]
            if r["status"] in ("fits", "tight"):
                r["status"] = "tight" if r["peak_memory_fraction"] > max_memory else "fits"
            if r["status"] == "fits":
                heapq.heappush(waiting, (r["estimate_s"], i))
            else:
                bar.update(1)

        while True:
            nxt = floor[by_floor[pos]] if pos < len(by_floor) else math.inf
            if pos < len(by_floor) and not beaten(nxt) and (not waiting or waiting[0][0] > nxt):
                screen_wave()      # a layout not screened yet may have a smaller estimate than any waiting
                continue
            if not waiting:
                break
            batch = []
            while waiting and len(batch) < SIMULATE_BATCH:
                _, i = heapq.heappop(waiting)
                if beaten(rows[i]["lower_bound_s"]):
                    rows[i]["status"] = "pruned"
                    pruned += 1
                    bar.update(1)
                    continue
                batch.append(i)
            for k, value in run_tasks(simulate_layout, [(payload, base, _layout_of(rows[i], layouts[i]))
                                                        for i in batch], ex):
                i = batch[k]
                if isinstance(value, BaseException):
                    value = {"status": "failed", "error": error_text(value)}
                events += value.pop("events", 0)     # the benchmark's events per second, not a table column
                rows[i].update(value)
                if value["status"] == "simulated":
                    best.append((-value["tokens_per_s"], i))
                    best.sort()
                simulated += 1
                bar.update(1)
            bar.set_postfix_str(f"screened {screen_count}, pruned {pruned}, simulated {simulated}", refresh=False)
        for i in by_floor[pos:]:     # never screened: their floor loses to the K-th best simulated step
            rows[i].update(status="unscreened", floor_s=float(floor[i]))
        bar.update(len(by_floor) - pos)
    finished = time.perf_counter()
    for r in rows:
        r["reason"] = ""
    winners = [rows[i] for _, i in best[:top]]
    for r in winners[1:]:
        r["reason"] = why_slower(r, winners[0])
    if winners:
        winners[0]["reason"] = "best"
    add_bands(winners, scenario)
    counts = {s: sum(1 for r in rows if r["status"] == s)
              for s in ("invalid", "oom", "tight", "pruned", "simulated", "failed", "unscreened")}
    counts["enumerated"] = len(rows)
    counts["screened"] = pos - set_aside    # layouts screened (here, or by an earlier search of the same scenario)
    counts["events"] = events     # simpy events of the simulated layouts
    # the pruning is exact only if the bound holds; check it on every layout that was simulated
    counts["bound_violations"] = sum(1 for r in rows if r["status"] == "simulated"
                                     and r["lower_bound_s"] > r["step_time_s"])
    return SearchResult(rows=rows, top=winners, tokens_per_step=tokens, gpus=total,
                        seconds=time.perf_counter() - started, counts=counts, max_memory=max_memory,
                        scenario_searched=scenario, overrides=base,
                        phase_seconds={"floor": floored_at - started, "screen": screen_time,
                                       "simulate": finished - floored_at - screen_time})
