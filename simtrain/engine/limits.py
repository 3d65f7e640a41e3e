"""The work one run may do: the simpy events it will schedule, counted from the plan before it runs, and the
refusal of a run beyond ``simulation.max_events`` with the ways out that apply to it.
"""

from __future__ import annotations

import math

from simtrain.engine.comm import dp_buckets
from simtrain.engine.event_counts import COMPUTE, LaneEvents
from simtrain.plan.build import Plan
from simtrain.plan.schedules import split_backwards
from simtrain.spec.errors import SimulationLimitError
from simtrain.spec.scenario import Scenario
from simtrain.spec.yamlio import locate


def estimate_events(plan: Plan, full: bool, replicas: int | None = None, upper: bool = True) -> int:
    """Simpy events the run will schedule, counted from the plan before running it (engine.event_counts: per lane,
    what the engine's code schedules for each op, collective, send and copy); ``replicas``: the lanes per pipeline
    rank when given (symmetry classes), else dp (full) or 1 (folded); ``upper``: the upper count, else the floor."""
    lanes = replicas if replicas is not None else plan.placement.dp if full else 1
    count = LaneEvents(plan, lanes, upper)
    return math.ceil(lanes * sum(_lane(count, r) for r in range(plan.scenario.parallel.pp)))


def _lane(count: LaneEvents, r: int) -> float:
    """core.Engine._lane: its process (initialize, end), its ops with their sends (comm._send: count.send to another
    rank, the receive event on its own), then the end of its step."""
    plan, layout, sim, par, zero = count.plan, count.plan.layout, count.sim, count.par, count.zero
    ops = plan.schedule[r]
    split = split_backwards(ops)
    last_grad = {}
    for i, op in enumerate(ops):   # as core.Engine._lane: the op that finishes each chunk's gradients
        if op.kind == "W" or (op.kind == "B" and (op.mb, op.chunk) not in split):
            last_grad[op.chunk] = i
        elif op.kind == "FB" and (op.mb2, op.chunk2) not in split:
            last_grad[op.chunk2] = i
    sync = count.dp > 1
    overlap = sim.overlap_dp and sync and zero < 3
    grad = "all_reduce" if zero == 0 else "reduce_scatter"

    def send(v: int, to: int) -> int:
        return 0 if to < 0 else count.send if layout.rank[v] != layout.rank[to] else 1

    n = 2.0
    for i, op in enumerate(ops):
        chunk, mb = (op.chunk2, op.mb2) if op.kind == "FB" else (op.chunk, op.mb)
        part = "input" if (mb, chunk) in split else "full"
        grads = sync and zero < 3 and (zero == 2 or (overlap and i == last_grad.get(chunk)))
        v = layout.v_of(r, chunk)
        if op.kind == "F":
            n += count.once(("F", v), count.forward, r, v, "coarse") + send(v, layout.next[v])
        elif op.kind == "W":
            n += count.once(("B", v, "weight", grads), count.backward, r, v, "weight", grads, "coarse")
        elif op.kind == "B":
            b = grads and part == "full"
            n += count.once(("B", v, part, b), count.backward, r, v, part, b, "coarse") + send(v, layout.prev[v])
        else:
            vf, b = layout.v_of(r, op.chunk), grads and part == "full"
            n += count.once(("FB", vf, v, part, b), count.pair, r, vf, v, part, b)
            n += send(vf, layout.next[vf]) + send(v, layout.prev[v])
    if par.schedule == "dualpipe" and par.pp > 1:   # dualpipe.mirror_gradient_sum: finalize.exchange's flow
        n += count.send
    edp = plan.has_experts and plan.placement.edp > 1
    if sync and zero < 2 and not overlap:   # after the last backward: every chunk's buckets, the experts'
        for v in layout.stages_of(r):
            c = plan.chunks[v]
            n += len(dp_buckets(c.grad_bytes_layers + c.grad_bytes_edge, sim.dp_bucket_size)) * \
                count.dp_coll(grad, r, False)
        if edp:
            n += len(dp_buckets(plan.expert_grad_bytes[r], sim.dp_bucket_size)) * \
                count.collective(plan.edp_phases(grad, 1.0, r), False)
    # finalize.finalize_gradients: the TP sum's timeout; the tied embedding's sum: the ready event, a flow's process
    # (as a send's) and the all_of condition
    n += bool(plan.replicated_grad_tp and plan.replicated_grad_tp[r][0] > 0)
    n += (2 + count.send) * bool(plan.tied_grad_bytes and plan.tied_grad_bytes[r] > 0)
    n += 3 if plan.optimizer_host else COMPUTE   # the step: the host's three timeouts, or a compute
    if sync and zero in (1, 2):   # the parameter all-gather, the experts' over their own group
        n += count.dp_coll("all_gather", r, False)
        if edp and plan.expert_params_local[r] > 0:
            n += count.collective(plan.edp_phases("all_gather", 1.0, r), False)
    return n


def over_limit(scenario: Scenario, full: bool, what: str) -> SimulationLimitError:
    """The refusal of a run beyond simulation.max_events, with the ways out that apply to it."""
    sim = scenario.raw.get("simulation") if isinstance(scenario.raw, dict) else None
    # the file's line (or the override's note) only where max_events was set; at its default neither applies
    line, note = locate(scenario.raw, "simulation.max_events") if isinstance(sim, dict) and "max_events" in sim \
        else (None, "")
    # stragglers, jitter and degraded links need every lane: folding is then no way out
    can_fold = full and scenario.simulation.fidelity == "full"
    way = ("use simulation.fidelity: folded (one lane per stage), a larger micro_batch" if can_fold
           else "use a larger micro_batch (fewer micro-batches)")
    return SimulationLimitError(f"{what}; {way} or raise the limit{note}", file=scenario.file, line=line,
                                field="simulation.max_events")
