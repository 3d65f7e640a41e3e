"""The work one run may do: the simpy events it will schedule, counted from the plan before it runs, and the
refusal of a run beyond ``simulation.max_events`` with the ways out that apply to it.
"""

from __future__ import annotations

from simtrain.plan.build import Plan
from simtrain.spec.errors import SimulationLimitError
from simtrain.spec.scenario import Scenario
from simtrain.spec.yamlio import locate


def estimate_events(plan: Plan, full: bool, replicas: int | None = None) -> int:
    """Simpy events the run will schedule, counted from the plan before running it; ``replicas``: the lanes per
    pipeline rank when given (symmetry classes), else dp (full) or 1 (folded)."""
    par = plan.scenario.parallel
    lanes = par.pp * (replicas if replicas is not None else par.dp if full else 1)
    ops = sum(len(ops) for ops in plan.schedule) / max(par.pp, 1)
    per_op = 4
    if par.zero >= 3 and par.dp > 1:
        # per layer: a gather (process start, rendezvous, phase timeouts, flow end, done) and two to
        # four compute/TP timeouts, plus the reduce-scatter in the backward: about 12
        per_op += 12 * max(c.layers for c in plan.chunks)
    offloaded = max((c.offload_groups for c in plan.chunks), default=0)
    if offloaded:
        # played segment by segment (about 3 events a layer) with a copy per offloaded layer in each pass (its
        # process, its flow's timeouts, its done: about 6; engine.host_copies)
        per_op += 3 * max(c.layers for c in plan.chunks) + 6 * offloaded
    if par.ep_overlap and par.ep > 1:
        # merged pairs played live (engine.merged_pair): per layer 5 compute pieces and 4 all-to-all flows, with the
        # overlap slowdown re-rating the compute and the network re-rating the flows as each starts and ends: about
        # 40 (engine counts per steady-state op and layer: 30.5-44.6 on three Qwen3-235B Megatron-Bridge rows, about
        # 41 on Qwen3-30B-A3B EP 8 at 8-16 micro-batches; it was 14, 2-3x low, found by review)
        per_op += 40 * max(c.layers for c in plan.chunks)
    layers_per_lane = max(sum(c.layers for c in plan.chunks) / max(par.pp, 1), 1)
    per_layer = 2 if par.dp > 1 and plan.scenario.simulation.overlap_dp else 0   # each layer's gradients ready
    return int(lanes * ops * per_op + lanes * 64 + lanes * layers_per_lane * per_layer)


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
