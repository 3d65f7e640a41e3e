"""The simpy events one lane of the engine schedules, counted from the plan before the run (for
:func:`simtrain.engine.limits.estimate_events`). simpy schedules an event when a timeout is made and when an event
succeeds: a process's start (``Initialize``) and end, a condition (``a | b``, ``a & b``), a resource's request and
release. Each count below says which engine code it is read from. They follow the engine's choices op by op (which
backward sends its gradients in buckets, which op plays segment by segment). What it does only some of the time (a
flow's end re-rates flows still in flight, a collective launched during a backward starts and ends while the lane
computes, a coarse op's rounding timeout) is counted always in the upper count and never in the floor. A stage's
rendezvous and all-to-all meetings are shared by its lanes: a share of them per lane.
"""

from __future__ import annotations

from simtrain.engine.ep_flows import EPFlows
from simtrain.plan import ep_overlap, segments

#: fluid.FluidNetwork.run_phase: the re-rating timer its flow starts with, its done event, the timer set as it ends
FLOW = 3
#: core.Engine._compute: a timeout and the ``timer | change`` condition
COMPUTE = 2
#: comm._comm_running: a collective's start and its end each succeed the lane's change event and re-time the compute
#: they interrupt (core.Engine._compute: its timeout and condition again)
INTERRUPT = 2 * (1 + COMPUTE)


class LaneEvents:
    """Events per lane of a run with ``lanes`` lanes per pipeline rank."""

    def __init__(self, plan, lanes: int, upper: bool = True) -> None:
        self.plan, self.lanes, self.memo = plan, lanes, {}
        # three events happen only some of the time: a collective re-times the compute only where one is running
        # when it starts or ends (comm._comm_running: lane.comm_change); a flow's end sets a re-rating timer only
        # where other flows are in flight; a coarse op's rounding timeout only where its two lengths differ. The
        # upper count takes them always, the floor (what a run is refused on beforehand) never
        self.interrupt = INTERRUPT if upper else 0
        self.flow = FLOW if upper else FLOW - 1
        # comm.CommMixin._send to another rank: its process (initialize, end), the phase's latency timeout, its flow,
        # the receive event; host_copies.HostCopies._copy: its process, its flow (no latency), its done event
        self.send, self.copy = 2 + 1 + self.flow + 1, 2 + self.flow + 1
        self.rounding = 0.5 if upper else 0.0
        sc = plan.scenario
        self.par, self.sim, self.dp = sc.parallel, sc.simulation, plan.placement.dp
        self.zero = self.par.zero if self.dp > 1 else 0
        # ep_flows.EPFlows.run: one lane per stage runs the flow itself; else the stage's meeting runs it once in a
        # process of its own (initialize, end, done event); without EP flows an EP segment is a timeout
        self.ep = (self.flow if lanes == 1 else (3 + self.flow) / lanes) if EPFlows.applies(sc) else None

    def once(self, key, count, *args):
        if key not in self.memo:
            self.memo[key] = count(*args)
        return self.memo[key]

    def collective(self, phases: list, live: bool, local: float = 0.0) -> float:
        """comm.CommMixin._collective: the lane's process (initialize, end) and done event, its start and end
        re-timing the lane's compute when ``live`` (launched during a backward); once per stage the rendezvous'
        started event, the _run_phases process (initialize, end, done) and its phases (fluid.run_phase: a latency
        timeout, a flow), ``local`` of them ahead of the network (comm._fsdp_phases' local phase: a timeout)."""
        ph = sum((p.latency > 0) + self.flow * (p.flow_bytes > 0) for p in phases)
        return 3 + self.interrupt * live + (4 + ph + (local > 0)) / self.lanes

    def dp_coll(self, kind: str, r: int, live: bool, local: float = 0.0) -> float:
        return self.once(("dp", kind, r, live, local > 0), self.collective, self.plan.dp_phases(kind, 1.0, r), live,
                          local)

    def play(self, segs: list, how: str) -> float:
        """op_play.SegmentMixin: ``coarse`` (_coarse: the compute once, one timeout for the TP/CP communication after
        it, the EP all-to-alls in one flow), ``each`` (_segment one by one: compute COMPUTE, EP its flow, another
        stream a timeout, cp_hidden none) or ``locked`` (_locked: as each, plus the compute lock's request and
        release for each compute segment and the TP / amax segments after it)."""
        ep = self.ep if self.ep is not None else 1
        live = [s for s, _k, sec, _l in segs if sec > 0]
        if how == "coarse":
            # the timeout is made where the op's planned length passes the time its compute took: by the
            # communication's length, or without any by a rounding error of either sign (counted half)
            rest = {"tp", "cp", "amax"} | ({"ep"} if self.ep is None else set())
            wait = 1.0 if rest.intersection(live) else self.rounding * ("compute" in live)
            return COMPUTE * ("compute" in live) + wait + ep * (self.ep is not None and "ep" in live)
        n = sum(COMPUTE if s == "compute" else ep if s == "ep" else s != "cp_hidden" for s in live)
        if how == "locked":
            streams = [s for s, _k, _sec, _l in segs]
            n += 2 * sum(s == "compute" or (s in ("tp", "amax") and (i == 0 or streams[i - 1] not in
                                                                     ("compute", "tp", "amax")))
                         for i, s in enumerate(streams))
        return n

    def forward(self, r: int, v: int, how: str) -> float:
        """core.Engine._forward (sends apart): ZeRO-3's layer by layer (comm._zero3_forward: a gather per layer and
        one for the edges), or its segments coarse, locked (a pair's half) or one by one with offload copies."""
        c = self.plan.chunks[v]
        segs = segments.forward_segments(c)
        if self.zero >= 3:
            gather = self.dp_coll("all_gather", r, True, c.gather_prep_per_byte)
            return self.play(segs, "each") + gather * (c.layers + (c.zero3_edge_bytes > 0))
        if how == "coarse" and c.offload_groups:   # op_play._forward_with_copies, host_copies.after_forward
            return self.play(segs, "each") + self.copy * c.offload_groups
        return self.play(segs, how)

    def backward(self, r: int, v: int, part: str, buckets: bool, how: str) -> float:
        """core.Engine._backward and _weight (sends apart), as forward; with ``buckets``
        comm._backward_with_buckets: segment by segment, a collective per bucket as it fills."""
        c = self.plan.chunks[v]
        n = COMPUTE * (c.metrics_bwd > 0 and part != "weight")
        layers = segments.backward_layers(c, part)
        segs = segments.backward_segments(c, part, layers)
        grad = "all_reduce" if self.zero == 0 else "reduce_scatter"
        if self.zero >= 3 and part != "weight":
            gather = self.dp_coll("all_gather", r, True, c.gather_prep_per_byte)
            scatter = self.dp_coll("reduce_scatter", r, True, c.grad_prep_per_byte)
            return n + self.play(segs, "each") + gather * (c.layers + (c.zero3_edge_bytes > 0)) + scatter * (
                c.layers + (c.grad_bytes_edge > 0))
        copies = self.copy * c.offload_groups if part != "weight" else 0
        if buckets:
            n += copies + self.play(segs, "each")
            size, edp = self.sim.dp_bucket_size, self.plan.has_experts and self.plan.placement.edp > 1
            pending = c.grad_bytes_edge if c.has_head and not c.has_embedding else 0.0
            expert = launches = experts = 0
            for layer, _segs in layers:
                pending += c.layer_costs(layer - c.layer_lo)[5]
                if pending >= size:
                    launches, pending = launches + 1, 0.0
                if edp and layer - c.layer_lo >= c.lead_layers:
                    expert += c.expert_grad_bytes_layer
                    if expert >= size:
                        experts, expert = experts + 1, 0.0
            launches += pending + (c.grad_bytes_edge if c.has_embedding else 0.0) > 0
            if edp:
                n += (experts + (expert > 0)) * self.collective(self.plan.edp_phases(grad, 1.0, r), True)
            return n + launches * self.dp_coll(grad, r, True, c.grad_prep_per_byte)
        if how == "coarse" and c.offload_groups:   # op_play._backward_with_copies, host_copies.before_backward
            return n + self.play(segs, "each") + copies
        return n + self.play(segs, how)

    def pair(self, r: int, vf: int, vb: int, part: str, buckets: bool) -> float:
        """core.Engine._pair (sends apart): under ep_overlap merged_pair._play_live (its communication stream's
        process; a compute piece COMPUTE, an amax piece a timeout; an all-to-all its flow, its start and end re-timing
        the compute, the event the compute stream waits on; without EP flows the plan's timeline replayed, a gap's
        timeout before each compute piece), else _overlapped_pair: its halves' processes (initialize, end), their
        ``&`` condition, each half locked."""
        if self.par.ep_overlap and not buckets and self.zero < 3:
            pieces = ep_overlap.pair_pieces(self.plan.chunks[vf], self.plan.chunks[vb])
            comm = 0 if self.ep is None else (self.ep + self.interrupt + 1)
            return 2 + sum((1 if kind == ep_overlap.AMAX else COMPUTE) + (self.ep is None) if stream == "comp" else
                           comm * (sec > 0) for stream, _side, kind, _layer, sec, _after in pieces)
        return 5 + self.forward(r, vf, "locked") + self.backward(r, vb, part, buckets, "locked")
