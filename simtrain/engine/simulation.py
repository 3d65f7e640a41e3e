"""The pure core's entry points: ``memory(scenario)`` and ``simulate(scenario)``.

``load -> build plan -> run engine -> Result``; no files, no terminal.
"""

from __future__ import annotations

import statistics

from simtrain.engine.classes import symmetry_classes
from simtrain.engine.core import Engine
from simtrain.plan.advice import advice
from simtrain.plan.balance import resolve_split
from simtrain.plan.build import build_plan
from simtrain.plan.layer_kernels import host_floor_warning
from simtrain.plan.memory import EDGE_OF_MEMORY, StageMemory, memory_report
from simtrain.plan.offload import host_memory_warning
from simtrain.report.bands import band, gpu_family, no_band_text, scenario_stack
from simtrain.report.result import BUBBLE_PARTS, DEVICE_LIST_LIMIT, DeviceResult, Result, StageSummary
from simtrain.spec.errors import InputError
from simtrain.spec.placement import placement_of
from simtrain.spec.scenario import Scenario
from simtrain.spec.units import as_whole, format_time

MFU_DEFINITION = ("MFU = (6 N + 12 L h s) x tokens / (step time x GPUs x peak FLOP/s), N = layer weights + output "
                  "projection (Narayanan et al. 2021 Eq. 3 without recompute; PaLM App. B); HFU adds recomputed work")


#: keys a report's config lists only when they differ from their default, so that the reports of runs that do not
#: use them read as before the keys existed (fp8_recipe only with precision fp8)
_SHOWN_WHEN_SET = {"training": {"fp8_recipe": "tensorwise", "cuda_graphs": "none", "recompute_layers": None,
                                "recompute_modules": None, "activation_offload_layers": 0},
                   "parallel": {"tp_comm_overlap": False, "tp_async_linears": False, "cp": 1, "cp_comm": "p2p",
                                "offload_optimizer": False}}


def _dump(section: str, value, s: Scenario) -> dict:
    out = value.model_dump()
    for key, default in _SHOWN_WHEN_SET[section].items():
        keep = (key == "fp8_recipe" and s.training.precision == "fp8") or (key == "cp_comm" and s.parallel.cp > 1)
        if out.get(key) == default and not keep:
            out.pop(key, None)
    return out


def _config(s: Scenario) -> dict:
    parallel = _dump("parallel", s.parallel, s)
    if s.model.moe is None:   # the expert keys say nothing about a dense model (and its reports keep their keys)
        for key in ("ep", "etp", "moe_dispatcher"):
            parallel.pop(key, None)
    else:
        parallel["etp"] = s.parallel.etp or s.parallel.tp
    return {"hardware": s.hardware.name, "gpu": s.hardware.gpu.name, "nodes": s.nodes,
            "gpus_per_node": s.gpus_per_node, "model": s.model.name, "training": _dump("training", s.training, s),
            "parallel": parallel,
            **({"layers_per_stage_auto": True} if s.raw.get("parallel", {}).get("layers_per_stage") == "auto" else {}),
            "placement": placement_of(s).report(),
            "mfu_definition": MFU_DEFINITION, "assumed": list(s.assumed)}


def _memory_with_activations(stage: StageMemory, act_peak: float | None, frag: float,
                             buffer_peak: float | None = None) -> dict[str, float]:
    """A stage's breakdown, with the activation peak (and the ZeRO-3 buffer peak) taken from the
    simulated timeline when given."""
    mem = stage.breakdown()
    if act_peak is None:
        return mem
    transient = stage.activations - stage.kept_activations
    acts = act_peak + transient
    static_buffers = stage.other_detail.get("zero3_gather_buffers", 0.0)
    buffers = static_buffers if buffer_peak is None or not static_buffers else buffer_peak
    old_frag = stage.other_detail.get("fragmentation", 0.0)
    tensors = mem["params"] + mem["grads"] + mem["optimizer"] + acts + buffers
    mem["activations"] = acts
    mem["other"] = stage.other - old_frag - static_buffers + buffers + frag * tensors
    return mem


def _devices(s: Scenario, per_stage: list[dict], busy: dict | None = None,
             classes: tuple[tuple[int, ...], ...] | None = None) -> tuple[DeviceResult, ...]:
    """One entry per GPU, or per (pp rank) class past DEVICE_LIST_LIMIT GPUs (per (class of replicas, pp rank)
    with symmetry ``classes``).

    ``busy`` maps (dp or None, pp) -> (busy_s, utilization, bubble_s, memory dict, exposed_comm_s); with
    ``classes``, dp is the first replica of its class.
    """
    pl = placement_of(s)
    out = []
    played = {d: c[0] for c in classes for d in c} if classes else {}
    if s.gpus <= DEVICE_LIST_LIMIT:
        for rank in range(s.gpus):
            c = pl.coord(rank)
            extra = (busy.get((played.get(c.dp, c.dp), c.pp)) or busy.get((None, c.pp))) if busy else None
            mem = extra[3] if extra else per_stage[c.pp]
            out.append(DeviceResult(rank=rank, node=pl.node(rank), dp=c.dp, tp=c.tp, pp=c.pp,
                                    peak_memory_bytes=sum(mem.values()), memory=mem,
                                    busy_s=extra[0] if extra else None, compute_utilization=extra[1] if extra else None,
                                    bubble_s=extra[2] if extra else None,
                                    exposed_comm_s=extra[4] if extra else None))
        return tuple(out)
    keys = (sorted(busy, key=lambda k: (k[1], -1 if k[0] is None else k[0])) if busy
            else [(None, p) for p in range(s.parallel.pp)])
    for key in keys:
        d, p = key
        dps = range(pl.dp) if d is None else classes[[c[0] for c in classes].index(d)] if classes else [d]
        ranks = tuple(sorted(pl.rank(dd, t, p) for dd in dps for t in range(s.parallel.tp)))
        extra = busy.get(key) if busy else None
        mem = extra[3] if extra else per_stage[p]
        first = pl.coord(ranks[0])
        out.append(DeviceResult(rank=ranks[0], node=pl.node(ranks[0]), dp=first.dp, tp=first.tp, pp=p,
                                peak_memory_bytes=sum(mem.values()), memory=mem,
                                busy_s=extra[0] if extra else None, compute_utilization=extra[1] if extra else None,
                                bubble_s=extra[2] if extra else None, ranks=ranks,
                                exposed_comm_s=extra[4] if extra else None))
    return tuple(out)


def _replica_waits(lanes, step: float) -> list[str]:
    """A warning when the DP replicas of a stage wait for one another (a straggler, jitter, a slow link): the
    stage table shows its slowest replica, whose exposed communication does not hold that wait."""
    worst = (0.0, None, None)
    for p in sorted({ln.rank for ln in lanes}):
        own = [ln for ln in lanes if ln.rank == p]
        exposed = {ln.index: sum(ln.exposed.values()) for ln in own}
        waiter = max(own, key=lambda ln: (exposed[ln.index], -ln.index))
        least = min(own, key=lambda ln: (exposed[ln.index], ln.index))
        wait = exposed[waiter.index] - exposed[least.index]
        if wait > worst[0]:
            worst = (wait, waiter, least)
    wait, waiter, least = worst
    if waiter is None or wait <= 0.01 * step:
        return []
    return [f"replicas differ: on stage {waiter.rank}, DP replica {waiter.dp} spends {format_time(wait)} more per "
            f"step in exposed communication than replica {least.dp}, waiting for slower replicas (per device: "
            "devices[].exposed_comm_s in --json)"]


def memory(scenario: Scenario) -> Result:
    """The memory ledger alone (``simtrain memory``): no simulation."""
    scenario = resolve_split(scenario)
    rep = memory_report(scenario)
    per_stage = [st.breakdown() for st in rep.stages]
    stages = tuple(StageSummary(pp=st.pp, layers=st.layers, compute_s=None, bubble_s=None,
                                peak_memory_bytes=st.total, memory=st.breakdown(),
                                other_detail=dict(st.other_detail), experts=dict(st.experts) or None,
                                host_memory_bytes=(st.host_bytes + st.host_optimizer) or None)
                   for st in rep.stages)
    host = host_memory_warning(scenario, rep)   # the node's host memory, as a simulated run checks it
    fits = rep.fits and not host
    return Result(scenario=scenario.name, gpus=scenario.gpus, microbatches=scenario.microbatches,
                  params_total=rep.params_total, capacity_bytes=rep.capacity, fits_in_memory=fits,
                  peak_memory_bytes_max=rep.peak_max, devices=_devices(scenario, per_stage), stages=stages,
                  warnings=tuple(scenario.warnings) + ((host,) if host else ()),
                  advice=tuple(advice(scenario, rep)) if not fits else (), config=_config(scenario))


def _slowdowns(s: Scenario) -> dict[int, float]:
    out: dict[int, float] = {}
    rng = None
    for st in s.simulation.stragglers:
        if st.rank is not None:
            out[st.rank] = max(out.get(st.rank, 1.0), st.slowdown)
        else:
            if rng is None:     # a seeded choice of straggler ranks: numpy only here, off the common path
                import numpy as np

                rng = np.random.default_rng(s.simulation.seed)
            count = max(1, round(st.fraction * s.gpus))
            for r in sorted(rng.choice(s.gpus, size=count, replace=False).tolist()):
                out[int(r)] = max(out.get(int(r), 1.0), st.slowdown)
    return out


def needs_full(s: Scenario) -> bool:
    """Do the DP replicas differ (stragglers, jitter, degraded links)? Folding all of them into one lane is then
    wrong: jitter needs every lane, the others symmetry classes (``fidelity: classes``)."""
    sim = s.simulation
    return bool(sim.stragglers or sim.degraded_links or sim.jitter > 0)


def _classes_notice(members: tuple[tuple[int, ...], ...]) -> str:
    """What a symmetry-class run played, in one sentence."""
    alone = [c[0] for c in members if len(c) == 1]
    alike = max((len(c) for c in members), default=0)
    what = "stragglers or degraded links break the symmetry between DP replicas"
    if alike <= 1:
        played = f"simulated each of the {len(alone)} replicas on its own"
    elif not alone:
        played = f"they touch no replica's own routes: simulated the {alike} replicas as one class"
    else:
        named = ", ".join(str(d) for d in alone[:8]) + (", ..." if len(alone) > 8 else "")
        played = (f"simulated the {len(alone)} replica(s) they touch ({named}) on their own and the other {alike} as "
                  "one class")
    return f"{what}: {played} (fidelity: classes; --full simulates every rank)"


#: simulation.fidelity's values (docs/model.md section 4.5); a folded run whose replicas differ plays symmetry
#: classes, reported as fidelity "classes"
FIDELITIES = ("folded", "full")


def simulate(scenario: Scenario, *, fidelity: str | None = None, seed: int | None = None) -> Result:
    """Play one optimizer step out and report it. ``fidelity`` ('folded' or 'full') and ``seed`` replace the
    scenario's ``simulation.fidelity`` and ``simulation.seed`` for this run."""
    if fidelity is not None and fidelity not in FIDELITIES:
        raise InputError(f"{fidelity!r} is not a fidelity; allowed: {', '.join(FIDELITIES)}", field="fidelity")
    if seed is not None:
        whole = as_whole(seed)
        if whole is None:
            raise InputError(f"{seed!r} is not a seed; give a whole number", field="seed")
        from simtrain.spec.bounds import number_problem

        problem = number_problem("Simulation", "seed", whole)     # the range a file's simulation.seed has
        if problem:
            raise InputError(problem, field="seed")
        seed = whole
    s = resolve_split(scenario)
    sim = s.simulation
    mode = fidelity or sim.fidelity
    warnings = list(s.warnings)
    plan = build_plan(s)
    link_scale = {(d.a, d.b): d.factor for d in sim.degraded_links}
    slowdowns = _slowdowns(s)
    classes = None
    if mode == "folded" and needs_full(s) and s.dp_cp > 1:
        if sim.jitter > 0:
            mode = "full"
            warnings.append("jitter varies every kernel of every GPU, so no two DP replicas behave alike: simulated "
                            "every rank (fidelity: full)")
        else:
            mode = "classes"
            classes = symmetry_classes(plan, slowdowns, {link for link, f in link_scale.items() if f != 1.0})
            warnings.append(_classes_notice(classes.members))
    engine = Engine(plan, full=(mode == "full"), classes=classes, slowdowns=slowdowns, link_scale=link_scale,
                    jitter=sim.jitter, seed=sim.seed if seed is None else seed)
    tl = engine.run()
    step = tl.step_time
    rep = memory_report(s)
    frag = s.hardware.memory_overheads.fragmentation
    busy = {}
    bubbles = []
    weight = {c[0]: len(c) for c in classes.members} if classes else {}
    for lane in tl.lanes:
        stage = rep.stages[lane.rank]
        mem = _memory_with_activations(stage, lane.act_peak, frag, lane.buf_peak)
        util = lane.busy["compute"] / step if step > 0 else 0.0
        # waits on pipeline receives, plus the idle tail after the lane's last work while later
        # stages drain (stage k idles k x t_b at the end of 1F1B: Narayanan et al. 2021 Sec. 2.2.1)
        bubble = lane.bubble + (step - lane.end)
        busy[(lane.dp, lane.rank)] = (dict(lane.busy), util, bubble, mem, dict(lane.exposed))
        # a class's lane counts once per replica it stands for (fmean's exact sum makes the order immaterial)
        bubbles.extend([bubble / step if step > 0 else 0.0] * weight.get(lane.dp, 1))
    per_stage_mem = []
    stages = []
    for p in range(s.parallel.pp):
        lanes = [ln for ln in tl.lanes if ln.rank == p]
        worst = max(lanes, key=lambda ln: ln.act_peak)
        mem = busy[(worst.dp, p)][3]
        per_stage_mem.append(mem)
        # one replica's times (the slowest), so that compute + exposed comm + bubble = the step
        slow = max(lanes, key=lambda ln: (ln.busy["compute"], -ln.index))
        parts = dict(slow.bubble_parts)
        parts["drain"] += step - slow.end   # the idle tail while later stages drain
        parts["communication"] = slow.exposed["pp"]
        stages.append(StageSummary(pp=p, layers=rep.stages[p].layers, compute_s=slow.busy["compute"],
                                   bubble_s=slow.bubble + (step - slow.end), exposed_comm_s=dict(slow.exposed),
                                   peak_memory_bytes=sum(mem.values()), memory=mem,
                                   experts=dict(rep.stages[p].experts) or None, bubble_breakdown_s=parts,
                                   host_memory_bytes=(rep.stages[p].host_bytes + rep.stages[p].host_optimizer) or None))
    peak = max(st.peak_memory_bytes for st in stages)
    fits = peak <= rep.capacity
    if not fits:
        warnings.append(f"does not fit: peak {peak / 1e9:.1f} GB > {rep.capacity / 1e9:.1f} GB per GPU")
    elif peak > EDGE_OF_MEMORY * rep.capacity:
        warnings.append(f"at the edge of memory: peak {peak / 1e9:.1f} GB is {100 * peak / rep.capacity:.0f}% of "
                        f"{rep.capacity / 1e9:.1f} GB; PyTorch's caching allocator then frees and retries (cudaMalloc "
                        "retries), which simtrain does not time (in `simtrain validate`, the runs simtrain puts above "
                        "100% measured 1.5-27% slower than predicted; docs/model.md section 11)")
    floor = host_floor_warning(s.training.layer_kernels, s.parallel.pp, step / (plan.microbatches * s.model.layers))
    if floor:
        warnings.append(floor)
    host = host_memory_warning(s, rep)
    if host:
        fits = False
        warnings.append(host)
    critical = max(tl.lanes, key=lambda ln: (ln.end, -ln.index))
    warnings += _replica_waits(tl.lanes, step)
    gpu_peak = s.hardware.gpu.peak("bf16" if s.training.precision == "fp8" else s.training.precision)
    fp8_peak = s.hardware.gpu.gemm_peak("fp8", s.training.fp8_recipe) if s.training.precision == "fp8" else 0.0
    gpu, stack = gpu_family(s.hardware.gpu.name), scenario_stack(s)
    measured = band(step, gpu, stack)
    return Result(
        scenario=s.name, gpus=s.gpus, microbatches=s.microbatches, params_total=rep.params_total,
        capacity_bytes=rep.capacity, fits_in_memory=fits, peak_memory_bytes_max=peak,
        devices=_devices(s, per_stage_mem, busy, classes.members if classes else None), stages=tuple(stages),
        warnings=tuple(warnings),
        advice=tuple(advice(s, rep)) if not fits else (),
        step_time_s=step, tokens_per_s=s.tokens_per_step / step,
        mfu=plan.model_flops_per_step / (step * s.gpus * gpu_peak),
        hfu=plan.hardware_flops_per_step / (step * s.gpus * gpu_peak),
        mfu_fp8=plan.model_flops_per_step / (step * s.gpus * fp8_peak) if fp8_peak else None,
        bubble_fraction=statistics.fmean(bubbles), exposed_comm_s=dict(critical.exposed),
        bubble_breakdown_s={k: statistics.fmean(st.bubble_breakdown_s[k] for st in stages) for k in BUBBLE_PARTS},
        framework_overhead_s=plan.framework_overhead_layer * plan.microbatches
        * sum(c.layers for c in plan.chunks if c.rank == critical.rank),
        step_time_band_s=None if measured is None else (measured.low_s, measured.high_s),
        step_time_band=measured.to_dict() if measured else {"none": no_band_text(gpu, stack)},
        events=tl.events, fidelity=mode, config=_config(s), timeline=tl)
