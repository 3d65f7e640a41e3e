"""Automatic parallelism search: the fastest layouts for a model, a cluster and a global batch.

1. Enumerate every layout (tp, pp, dp, vpp, micro_batch, zero, recompute, schedule,
   sequence_parallel, precision; for a mixture of experts ep and etp) for the GPU count: TP within a node
   (within the scale-up domain where the hardware file's NVLink domain spans several nodes, as on NVL72 racks),
   bf16 and fp8 where the GPU has an FP8 peak (and the scenario trains in either), PP dividing the layers,
   EP dividing the experts with etp x ep dividing the stage's tp x dp GPUs (Megatron-Core's folding) and etp
   a divisor of tp that divides the expert width,
   DP from the rest; each candidate is ``scenario.with_overrides(...)``, and those
   the scenario rules reject (InputError) are dropped.
2. Drop the layouts that do not fit by the memory model (``simtrain.plan.memory``), or fit with less headroom than
   ``max_memory`` leaves (default :data:`DEFAULT_MAX_MEMORY`: the memory ledger's measured error kept free).
3. Bound the rest with the analytic estimate (:mod:`simtrain.decide.estimate`): its
   ``lower_bound_s`` never exceeds the simulated step, so ``tokens / lower_bound``
   is an optimistic throughput.
4. Simulate candidates in order of their estimate, skipping any whose optimistic
   throughput is below the K-th best simulated so far: a skipped layout cannot be
   in the top K, so the answer equals simulating every candidate (a test checks it). Candidates go in
   rounds of ``SIMULATE_BATCH``, whatever the worker count, so the table is the same on every machine.

Screening and simulation run on the sweep's executors (:mod:`simtrain.decide.sweep`). ``fix`` narrows the
enumeration itself (``{"parallel.zero": 1, "parallel.tp": [4, 8]}``). The screening (validity, memory, estimate) does
not depend on ``max_memory``, so it is kept for the last few searched scenarios in this process and a second search
at another ``max_memory`` only simulates.
"""

from __future__ import annotations

import json
import math
import time
from collections import OrderedDict
from concurrent.futures import Executor
from typing import Any

from simtrain.decide.search_result import (  # noqa: F401 - re-exported: the search's names in one place
    LAYOUT_KEYS,
    SearchResult,
    add_bands,
    layout_overrides,
    layout_text,
    search_text,
    why_slower,
)
from simtrain.decide.sweep import ScenarioPayload, error_text
from simtrain.decide.workers import open_executor, progress_bar, run_tasks
from simtrain.plan.schedules import SPLIT_BACKWARD
from simtrain.plan.shared_costs import shared_costs
from simtrain.report.accuracy import LEDGER_ERROR
from simtrain.spec.errors import InputError, SimulationLimitError
from simtrain.spec.scenario import Scenario
from simtrain.spec.units import as_whole

RECOMPUTE = ("none", "selective", "selective_op", "full")
#: the default ``max_memory``: keep the memory ledger's measured error free (1 - 0.078, rounded down to 0.92), so
#: that a winner fits even if the ledger underestimates it as much as it has been off where a peak was measured
DEFAULT_MAX_MEMORY = math.floor((1.0 - LEDGER_ERROR) * 100) / 100
#: screened rows of the last few searches, by what they depend on (scenario, hardware, cluster size, layouts)
_SCREENED: OrderedDict[str, dict[str, dict[str, Any]]] = OrderedDict()
_SCREENED_KEEP = 4
#: context parallelism is enumerated where every CP rank still holds at least this many tokens of a sequence (Llama 3's
#: long-context stage: 131,072 tokens over cp 16, Dubey et al. 2024 Table 4); shorter sequences search cp 1 only
CP_MIN_TOKENS = 8192


#: layouts a search screens at most unless its caller raises it: each costs a memory check and an estimate
#: (measured ~4.5 ms on pp4_dp4's 5,080 layouts), so 200,000 is about 15 minutes of one core before any simulation;
#: precision, context and expert parallelism and the split-backward schedules make 20,000-50,000 common at 1,024 GPUs
MAX_LAYOUTS = 200_000


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
        raise InputError(f"gpus={gpus!r}: give a whole number of GPUs", field="gpus")
    gpus = whole
    if gpus < 1:
        raise InputError(f"gpus={gpus}: give a positive GPU count", field="gpus")
    if gpus > scenario.simulation.max_gpus:
        raise SimulationLimitError(f"gpus={gpus:,} is more than simulation.max_gpus={scenario.simulation.max_gpus:,}"
                                   ": building the network graph and plan takes time and memory in proportion; "
                                   "raise simulation.max_gpus (e.g. --set simulation.max_gpus=N) if you mean it",
                                   field="gpus")
    if scenario.hardware.explicit:
        raise InputError("gpus= cannot resize an explicit topology (its hardware file lists the devices)",
                         field="gpus")
    if gpus < gpn:
        return {"nodes": 1, "gpus_per_node": gpus}
    if gpus % gpn:
        raise InputError(f"gpus={gpus} is not a whole number of {gpn}-GPU nodes", field="gpus")
    return {"nodes": gpus // gpn}


def check_fix(fix: dict[str, Any] | None) -> dict[str, list]:
    """``fix`` as {layout field: [allowed values]}; its keys are layout fields (``zero``) or their scenario keys
    (``parallel.zero``), a value one value or a list of them."""
    if fix is None:
        return {}
    if not isinstance(fix, dict):
        raise InputError(f"fix={fix!r}: give a mapping such as {{'parallel.zero': 1, 'parallel.tp': [4, 8]}}",
                         field="fix")
    by_key = {v: k for k, v in LAYOUT_KEYS.items()}
    out: dict[str, list] = {}
    for key, values in fix.items():
        name = by_key.get(key, key)
        if name not in LAYOUT_KEYS:
            raise InputError(f"fix: {key!r} is not a searched layout key (allowed: "
                             f"{', '.join(LAYOUT_KEYS.values())})", field="fix")
        values = list(values) if isinstance(values, (list, tuple, set)) else [values]
        # numpy scalars (a DataFrame's cells) compare as the Python values they hold
        values = [v.item() if hasattr(v, "item") and not isinstance(v, (str, bytes)) else v for v in values]
        if not values:
            raise InputError(f"fix: {key!r} lists no value", field="fix")
        out[name] = values
    return out


def enumerate_layouts(scenario: Scenario, gpus: int | None = None, fix: dict[str, Any] | None = None,
                      max_layouts: int | None = None) -> list[dict[str, Any]]:
    """Every layout worth validating for the scenario's model, cluster size (or ``gpus``) and global
    batch, in a fixed order, keeping only the values ``fix`` allows (:func:`check_fix`). Cheap arithmetic
    only; the scenario rules have the last word (:func:`screen`). Layouts that cannot differ are listed once:
    ZeRO needs dp > 1, sequence parallelism tp > 1, and with one stage the schedule is moot (1F1B)."""
    fixed = check_fix(fix)

    def ok(name: str, value: Any) -> bool:
        return name not in fixed or any(value == v and type(value) is type(v) or
                                        (isinstance(v, int) and not isinstance(v, bool) and value == v)
                                        for v in fixed[name])

    m, tr, par = scenario.model, scenario.training, scenario.parallel
    sizes = gpu_overrides(scenario, gpus)
    gpn = sizes.get("gpus_per_node", scenario.gpus_per_node)
    total = gpn * sizes.get("nodes", scenario.nodes)
    hw = scenario.hardware
    domain = hw.intra_node.domain_gpus if not hw.explicit and hw.intra_node.domain_gpus else gpn
    peaks = hw.gpu.peak_flops
    has_fp8 = "fp8" in peaks or ("mxfp8" in peaks and tr.fp8_recipe == "mxfp8")
    precisions = ("bf16", "fp8") if tr.precision in ("bf16", "fp8") and has_fp8 else (tr.precision,)
    # a mixture of experts: ZeRO-3 and selective_op recompute are refused by the scenario rules (not simulated yet
    # for MoE layers), so they are not listed
    zeros = (0, 1, 2) if m.moe is not None else (0, 1, 2, 3)
    recomputes = tuple(r for r in RECOMPUTE if m.moe is None or r != "selective_op")
    varied = m.layers_differ
    cps = [c for c in _divisors(total) if tr.seq_len % (2 * c) == 0 and tr.seq_len // c >= CP_MIN_TOKENS]
    cps = cps if len(cps) > 1 else [None]     # None: the layouts carry no cp key (short sequences)
    out = []
    grid = [(t, p, c) for t in _divisors(min(domain, total)) for p in _divisors(total // t) for c in cps]
    for tp, pp, cp in grid:
        if total % tp or m.heads % tp or m.num_kv_heads % tp or m.ffn_hidden % tp or not ok("tp", tp):
            continue
        if (total // (tp * pp)) % (cp or 1) or not ok("pp", pp) or (cp and not ok("cp", cp)) or pp > m.layers:
            continue
        # layers that do not split evenly over the ranks are balanced (layers_per_stage: auto; dense models only)
        split = None if m.layers % pp == 0 else "auto"
        if split and varied:
            continue
        dp = total // (tp * pp * (cp or 1))
        if tr.global_batch % dp or not ok("dp", dp):
            continue
        for mb in (d for d in _divisors(tr.global_batch // dp) if ok("micro_batch", d)):
            micro = tr.global_batch // (mb * dp)
            # GPipe with a balanced split is left out: it takes 1F1B's time with more memory (Narayanan 2021 2.2.1)
            shapes = [("1f1b", 1)] if pp == 1 or split else [("gpipe", 1), ("1f1b", 1)]
            if pp > 1 and micro % pp == 0 and split is None:
                shapes += [("interleaved-1f1b", v) for v in _divisors(m.layers // pp) if v >= 2]
            # the split-backward schedules; for models whose layers differ only with even splits (auto is refused)
            shapes += _split_shapes(pp, micro, m.layers, split, auto_ok=not varied)
            for schedule, vpp in ((sc, v) for sc, v in shapes if ok("schedule", sc) and ok("vpp", v)):
                # zero-bubble and DualPipe schedules run with ZeRO 0 or 1 (scenario rules)
                allowed_zero = zeros if schedule not in SPLIT_BACKWARD else (0, 1)
                lps = None if m.layers % (pp * vpp) == 0 else "auto"
                for zero in (z for z in (allowed_zero if dp * (cp or 1) > 1 else (0,)) if ok("zero", z)):
                    for recompute in (r for r in recomputes if ok("recompute", r)):
                        for sp in (b for b in ((False, True) if tp > 1 else (False,)) if ok("sequence_parallel", b)):
                            out.extend({"tp": tp, "pp": pp, "dp": dp, "vpp": vpp, "micro_batch": mb,
                                        "zero": zero, "recompute": recompute, "schedule": schedule,
                                        "sequence_parallel": sp, "precision": precision,
                                        **({"cp": cp} if cp else {}), **experts,
                                        "layers_per_stage": lps}
                                       for precision in precisions if ok("precision", precision)
                                       for experts in _expert_layouts(m, tp, dp * (cp or 1))
                                       for experts in _with_overlap(experts, tr, par, m, pp, schedule, zero, recompute)
                                       if all(ok(k, v) for k, v in experts.items()))
            if max_layouts is not None and len(out) > max_layouts:
                raise SimulationLimitError(
                    f"this search would screen more than {max_layouts:,} layouts (about "
                    f"{max_layouts * 4.5e-3:,.0f} s of one core before any simulation), more than max_layouts="
                    f"{max_layouts:,}; narrow it with fix=, search fewer GPUs or a smaller global batch, or raise "
                    "the limit (--max-layouts, search(max_layouts=...))", field="max_layouts")
    why = {"cp": f"context parallelism is searched only where every CP rank keeps at least {CP_MIN_TOKENS:,} tokens "
                 f"of a sequence (seq_len {tr.seq_len:,})",
           "ep": "expert parallelism is searched only for a mixture of experts",
           "etp": "expert tensor parallelism is searched only for a mixture of experts"}
    for name in ("cp", "ep", "etp"):   # a fixed key no layout carries would otherwise be ignored silently
        if name in fixed and not any(name in layout for layout in out):
            raise InputError(f"fix: {LAYOUT_KEYS[name]} = {fixed[name]}: no searched layout has it ({why[name]})",
                             field="fix")
    return out


def _split_shapes(pp: int, micro: int, layers: int, split: str | None, auto_ok: bool = True) -> list[tuple[str, int]]:
    """The zero-bubble and DualPipe schedules that apply (scenario rules): zb-h1 on any pipeline; zb-v and dualpipev
    with two chunks per rank (an even split of 2 pp chunks, else auto when 2 pp <= layers + 2 and ``auto_ok``);
    dualpipe with an even pp, at least 2 pp micro-batches, an even count, and an even split; dualpipe(v) with
    micro-batches >= 2 pp."""
    if pp == 1:
        return []
    out = [("zb-h1", 1)]
    v_ok = layers % (2 * pp) == 0 or (auto_ok and 2 * pp <= layers + 2)
    if v_ok:
        out.append(("zb-v", 2))
    if pp % 2 == 0 and micro >= 2 * pp and micro % 2 == 0 and split is None:
        out.append(("dualpipe", 1))
    if v_ok and micro >= 2 * pp:
        out.append(("dualpipev", 2))
    return out


def _with_overlap(experts: dict, tr, par, model, pp: int, schedule: str, zero: int, recompute: str) -> list[dict]:
    """A mixture of experts' layout without and, where the scenario rules take it, with Megatron-Core's EP
    all-to-all overlap (ep > 1, interleaved 1F1B or 1F1B at pp 1, ZeRO 0/1, no full recompute, at most one MTP
    module, the alltoall or deepep dispatcher, no 'moe' recompute module); dense layouts carry no such key."""
    if not experts:
        return [experts]
    out = [{**experts, "ep_overlap": False}]
    if (experts["ep"] > 1 and (schedule == "interleaved-1f1b" or (schedule == "1f1b" and pp == 1)) and zero <= 1
            and recompute != "full" and model.mtp_layers <= 1 and par.moe_dispatcher in ("alltoall", "deepep")
            and "moe" not in (tr.recompute_modules or ()) and not tr.activation_offload_layers):
        out.append({**experts, "ep_overlap": True})
    return out


def _expert_layouts(model, tp: int, dp: int) -> list[dict[str, int]]:
    """The (ep, etp) pairs of a mixture of experts on a stage of tp x dp GPUs: ep divides the experts, etp divides
    tp and the expert width, etp x ep divides tp x dp (Megatron-Core's folding). [{}] for a dense model, whose
    layouts carry no expert keys."""
    moe = model.moe
    if moe is None:
        return [{}]
    return [{"ep": ep, "etp": etp} for etp in _divisors(tp) if moe.expert_ffn_hidden % etp == 0
            for ep in _divisors(moe.experts) if (tp * dp) % (etp * ep) == 0]


def screen(payload: ScenarioPayload, base: dict[str, Any], layouts: list[dict[str, Any]],
           max_memory: float = 1.0) -> list[dict[str, Any]]:
    """Validate, check memory and estimate each layout (runs in a worker); never raises. Status:
    'invalid' (rejected by the scenario rules), 'oom', 'tight' (fits, above ``max_memory`` of the GPU; estimated
    too, so that another ``max_memory`` can reuse the row), 'fits' (then estimated) or 'failed'."""
    scenario = payload.build()
    with shared_costs():      # figures the layouts share (simtrain.plan.shared_costs) are computed once per chunk
        return [_screen_one(scenario, base, layout, max_memory) for layout in layouts]


def _screen_one(scenario: Scenario, base: dict[str, Any], layout: dict[str, Any], max_memory: float) -> dict:
    """One layout's screening row (:func:`screen`)."""
    from simtrain.decide.estimate import estimate
    from simtrain.plan.balance import resolve_split
    from simtrain.plan.build import build_plan
    from simtrain.plan.memory import memory_report

    row: dict[str, Any] = {"status": "invalid"}
    try:
        sc = resolve_split(scenario.with_overrides({**base, **layout_overrides(layout)}))
        mem = memory_report(sc)     # the ledger of simtrain.memory(sc), without its per-GPU report
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


def simulate_layout(payload: ScenarioPayload, base: dict[str, Any], layout: dict[str, Any]) -> dict[str, Any]:
    """Simulate one layout (runs in a worker); never raises."""
    from simtrain.engine.simulation import simulate

    try:
        r = simulate(payload.build().with_overrides({**base, **layout_overrides(layout)}))
    except Exception as err:  # noqa: BLE001
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
    total = base.get("gpus_per_node", scenario.gpus_per_node) * base.get("nodes", scenario.nodes)
    limit = as_whole(max_layouts)
    if limit is None or limit < 1:
        raise InputError(f"max_layouts={max_layouts!r}: give a whole number, 1 or more", field="max_layouts")
    layouts = enumerate_layouts(scenario, gpus, fix, limit)
    if not layouts:
        narrowed = f" with fix={fix!r}" if fix else ""
        raise InputError(f"no layout of {total} GPUs{narrowed} divides the model and the global batch of "
                         f"{scenario.training.global_batch}", field="fix" if fix else None)
    payload = ScenarioPayload.of(scenario)
    rows = [dict(layout) for layout in layouts]
    key = _screen_key(scenario, base)
    known = _SCREENED.get(key, {})
    todo = [i for i, layout in enumerate(layouts) if json.dumps(layout, sort_keys=True) not in known]
    for i in set(range(len(layouts))) - set(todo):
        rows[i].update(known[json.dumps(layouts[i], sort_keys=True)])
    with open_executor(workers, executor, len(layouts)) as ex:     # the simulations use it too, screened or not
        lanes = getattr(ex, "_max_workers", None) or workers or 1
        size = max(8, min(128, math.ceil(len(todo) / (4 * lanes))))
        chunks = [todo[i:i + size] for i in range(0, len(todo), size)]
        with progress_bar(len(layouts), progress, "screen", unit="layout") as bar:
            bar.update(len(layouts) - len(todo))
            for c, value in run_tasks(screen, [(payload, base, [layouts[i] for i in ch]) for ch in chunks], ex):
                for i, info in zip(chunks[c], value if isinstance(value, list) else []):
                    rows[i].update(info)
                if not isinstance(value, list):
                    for i in chunks[c]:
                        rows[i].update(status="invalid", error=error_text(value))
                bar.update(len(chunks[c]))
        screened = known if key in _SCREENED else {}
        for i in todo:
            screened[json.dumps(layouts[i], sort_keys=True)] = {k: v for k, v in rows[i].items() if k not in layouts[i]}
        _SCREENED[key] = screened
        _SCREENED.move_to_end(key)
        while len(_SCREENED) > _SCREENED_KEEP:
            _SCREENED.popitem(last=False)
        for r in rows:      # the screening ran at max_memory 1: which fit above this search's limit is decided here
            if r["status"] in ("fits", "tight"):
                r["status"] = "tight" if r["peak_memory_fraction"] > max_memory else "fits"
        screened_at = time.perf_counter()
        tokens = scenario.tokens_per_step
        order = sorted((i for i, r in enumerate(rows) if r["status"] == "fits"),
                       key=lambda i: (rows[i]["estimate_s"], i))
        best: list[tuple[float, int]] = []      # (-tokens/s, index) of simulated layouts, sorted

        def threshold() -> float:
            return -best[top - 1][0] if len(best) >= top else 0.0

        # most candidates are pruned, not simulated: the bar counts both and shows no remaining time
        with progress_bar(len(order), progress, "bound and simulate", eta=False, unit="layout") as bar:
            pos, pruned, simulated, events = 0, 0, 0, 0
            while pos < len(order):
                batch = []
                while pos < len(order) and len(batch) < SIMULATE_BATCH:
                    i = order[pos]
                    pos += 1
                    bound = rows[i]["lower_bound_s"]
                    if bound > 0 and tokens / bound < threshold():
                        rows[i]["status"] = "pruned"
                        pruned += 1
                        bar.update(1)
                        continue
                    batch.append(i)
                for k, value in run_tasks(simulate_layout, [(payload, base, layouts[i]) for i in batch], ex):
                    i = batch[k]
                    if isinstance(value, BaseException):
                        value = {"status": "failed", "error": error_text(value)}
                    events += value.pop("events", 0)     # the benchmark's events per second, not a table column
                    rows[i].update(value)
                    if value["status"] == "simulated":
                        best.append((-value["tokens_per_s"], i))
                        best.sort()
                    simulated += 1
                    bar.set_postfix_str(f"pruned {pruned}, simulated {simulated}", refresh=False)
                    bar.update(1)
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
              for s in ("invalid", "oom", "tight", "pruned", "simulated", "failed")}
    counts["enumerated"] = len(rows)
    counts["events"] = events     # simpy events of the simulated layouts
    # the pruning is exact only if the bound holds; check it on every layout that was simulated
    counts["bound_violations"] = sum(1 for r in rows if r["status"] == "simulated"
                                     and r["lower_bound_s"] > r["step_time_s"])
    return SearchResult(rows=rows, top=winners, tokens_per_step=tokens, gpus=total,
                        seconds=time.perf_counter() - started, counts=counts, max_memory=max_memory,
                        scenario_searched=scenario, overrides=base,
                        phase_seconds={"screen": screened_at - started, "simulate": finished - screened_at})
