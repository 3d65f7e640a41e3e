"""The discrete-event engine: plays one optimizer step out in simpy.

The unit it simulates is a *lane*: the TP group of one pipeline rank in one DP
replica (TP ranks synchronise at every layer, so they move in lock-step). In
``folded`` fidelity there is one lane per pipeline rank, standing for all DP
replicas (homogeneous clusters are symmetric); in ``full`` fidelity one lane
per (DP replica, pipeline rank); with symmetry ``classes`` (:mod:`simtrain.engine.classes`)
one lane per (class of alike replicas, pipeline rank). Each lane runs its schedule's operations in
order on its compute stream; pipeline sends, DP/ZeRO collectives and
ZeRO-3 gathers run as flows on the shared :class:`~simtrain.engine.fluid.FluidNetwork`.

The engine computes no costs: it reads them from the :class:`~simtrain.plan.build.Plan`.
"""

from __future__ import annotations

import math

from simtrain.engine.classes import ReplicaClasses
from simtrain.engine.comm import CommMixin, dp_buckets
from simtrain.engine.dualpipe import mirror_gradient_sum
from simtrain.engine.ep_flows import EPFlows
from simtrain.engine.finalize import finalize_gradients
from simtrain.engine.fluid import FluidNetwork, LinkCapacity
from simtrain.engine.host_copies import HostCopies
from simtrain.engine.lane import (  # noqa: F401  (Record, Timeline re-exported)
    CountingEnvironment,
    EventLimitReached,
    Lane,
    Record,
    Timeline,
)
from simtrain.engine.limits import estimate_events, over_limit
from simtrain.engine.merged_pair import play_merged_pair
from simtrain.engine.op_play import SegmentMixin
from simtrain.plan.build import Plan
from simtrain.plan.schedules import split_backwards


class Engine(CommMixin, SegmentMixin):
    """Runs one step of a plan; ``run()`` returns a :class:`Timeline`."""

    def __init__(self, plan: Plan, *, full: bool = False, classes: ReplicaClasses | None = None,
                 detail_limit: int = 300_000, slowdowns: dict[int, float] | None = None,
                 link_scale: dict | None = None, jitter: float = 0.0, seed: int = 0) -> None:
        self.plan = plan
        self.full = full and classes is None
        self.classes = classes
        self.sc = plan.scenario
        par = self.sc.parallel
        # dp counts the replicas holding the same weights, dp x cp: gradients are reduced over them (Megatron-Core's
        # dp_cp group) and, at full fidelity, each is a lane of its own
        self.pp, self.dp, self.vpp = par.pp, plan.placement.dp, par.vpp
        self.V = self.pp * self.vpp
        # lanes per pipeline rank: the replicas played (their first members for classes; None: folded, all of them)
        self.replicas = ([c[0] for c in classes.members] if classes is not None
                         else list(range(self.dp)) if self.full else [None])
        self.every = self.replicas != [None]     # lanes per replica (or class), not per stage
        self.zero = par.zero if self.dp > 1 else 0
        self.sim = self.sc.simulation
        self.jitter = jitter
        self.seed = seed
        self.env = CountingEnvironment(limit=self.sim.max_events)
        cluster = self.sc.cluster
        scale = link_scale or {}

        self.net = FluidNetwork(self.env, LinkCapacity(cluster, scale))
        self.records: list[Record] = []
        self.recv: dict = {}
        self.sent_at: dict = {}
        self.rendezvous: dict = {}
        self.slowdowns = slowdowns or {}
        lanes_n = self.pp * len(self.replicas)
        per_lane_layers = sum(c.layers for c in plan.chunks) / self.pp
        est_records = lanes_n * sum(len(o) for o in plan.schedule) / self.pp * per_lane_layers * 2
        self.layer_detail = est_records <= detail_limit
        self.events = 0
        self._factor_cache: dict = {}
        self._segments: dict = {}        # per-chunk segment lists, read-only once built
        # EP all-to-alls as flows sharing links with the DP and PP traffic (engine.ep_flows)
        self.ep_flows = EPFlows(self.env, self.net, plan, len(self.replicas), folded=not self.every) \
            if EPFlows.applies(self.sc) else None
        # activation copies to and from host memory on each lane's copy streams (engine.host_copies)
        self.host_copies = HostCopies(self.env, self.net, plan, self._record) if HostCopies.applies(plan) else None

    def _make_lanes(self) -> list[Lane]:
        lanes = []
        pl = self.plan.placement
        for d in self.replicas:
            for r in range(self.pp):
                # folded: the slowest replica of the stage sets the pace (classes: their members are alike)
                dps = range(self.dp) if d is None else self.classes.of(d) if self.classes is not None else [d]
                slow = max((self.slowdowns.get(pl.rank(dd, t, r), 1.0) for dd in dps for t in range(pl.tp)),
                           default=1.0) if self.slowdowns else 1.0
                idx = len(lanes)
                rng = None
                if self.jitter > 0:
                    import numpy as np  # only variation needs numpy: keep the common path light

                    rng = np.random.default_rng([self.seed, idx])
                lane = Lane(index=idx, dp=d, rank=r, slowdown=slow, rng=rng, tp_scale=self.plan.tp_scale(r, d))
                if self.plan.has_experts:   # an EP key only where there are experts (dense reports keep theirs)
                    lane.busy["ep"] = 0.0
                    lane.exposed["ep"] = 0.0
                if self.plan.has_cp:       # a CP key only with context parallelism (other reports keep theirs)
                    lane.busy["cp"] = 0.0
                    lane.exposed["cp"] = 0.0
                if self.plan.has_amax:     # FP8 amax all-reduces (other reports keep their keys)
                    lane.busy["amax"] = 0.0
                    lane.exposed["amax"] = 0.0
                if self.plan.has_offload or self.plan.optimizer_host:   # waits for copies to and from the host
                    lane.busy["offload"] = 0.0
                    lane.exposed["offload"] = 0.0
                lanes.append(lane)
        return lanes

    def run(self) -> Timeline:
        replicas = len(self.replicas) if self.classes else None
        # refused before any work only on the floor of the count (engine.event_counts: without the events that happen
        # only some of the time), so that a run that fits is not refused for events it does not play
        floor = estimate_events(self.plan, self.full, replicas, upper=False)
        if floor > self.sim.max_events:
            raise over_limit(self.sc, self.full, f"this run needs at least about {floor:,} simulated events, more "
                                                 f"than simulation.max_events={self.sim.max_events:,}")
        self.lanes = self._make_lanes()
        for lane in self.lanes:
            self.env.process(self._lane(lane))
        try:
            self.env.run()
        except EventLimitReached:          # the estimate fell short: stop at the limit all the same
            raise over_limit(self.sc, self.full,
                             f"this run reached simulation.max_events={self.sim.max_events:,} simulated events "
                             f"before its step ended (estimated {floor:,} to "
                             f"{estimate_events(self.plan, self.full, replicas):,} beforehand)") from None
        step = max(lane.end for lane in self.lanes)
        self.records.sort(key=lambda r: (r[0], r[3], r[4], r[1]))
        return Timeline(step_time=step, lanes=self.lanes, records=self.records,
                        events=self.env.scheduled, full=self.every,
                        classes=None if self.classes is None else self.classes.members)

    def _factor(self, lane: Lane) -> float:
        f = lane.slowdown
        if lane.rng is not None:
            sigma = math.sqrt(math.log1p(self.jitter ** 2))
            f *= float(lane.rng.lognormal(-sigma * sigma / 2, sigma))   # mean 1, CV = jitter
        return f

    def _record(self, lane, stream, kind, start, end, mb=-1, vstage=-1, lo=-1, hi=-1, nbytes=0.0):
        if end > start:
            self.records.append((lane.index, stream, kind, start, end, mb, vstage, lo, hi, nbytes))
            lane.busy[stream] += end - start

    def _compute(self, lane: Lane, work: float):
        """Advance ``work`` seconds of compute. While collectives run on the lane, compute progresses at
        1/f of its speed, f = the largest overlap slowdown among them (issue 6, overlap realism): the
        slowdown lasts as long as the overlap, not the whole op. Every collective that starts or ends
        during the op re-rates it."""
        env = self.env
        while work > 1e-15:
            f = max((x for x, n in lane.comm_factors.items() if n > 0), default=1.0)
            change = lane.comm_change
            if change is None:
                change = lane.comm_change = env.event()
            t0 = env.now
            timer = env.timeout(work * f)
            yield timer | change
            if timer.processed or env.now - t0 >= work * f:
                return
            work -= (env.now - t0) / f

    def _forward(self, lane: Lane, mb: int, chunk: int, paired: bool = False):
        layout = self.plan.layout
        v = layout.v_of(lane.rank, chunk)
        c = self.plan.chunks[v]
        if layout.prev[v] >= 0 and not paired:
            yield from self._wait_recv(lane, (lane.dp, v, mb, "F"))
        self._alloc(lane, c.act_bytes)
        if self.zero >= 3:
            yield from self._zero3_forward(lane, c, mb)
        elif paired:
            yield from self._locked(lane, self._forward_segments(c), mb, v)
        elif c.offload_groups:
            yield from self._forward_with_copies(lane, c, mb, v)
        else:
            yield from self._coarse(lane, self._forward_segments(c), mb, v)
        if layout.next[v] >= 0 and not paired:
            self._send(lane, "F", mb, v, layout.next[v])

    def _backward(self, lane: Lane, mb: int, chunk: int, part: str, buckets: bool, paired: bool = False):
        """A backward, whole or its input-gradient half (``part``); ``buckets``: its gradients leave in DP
        buckets as its layers finish."""
        layout = self.plan.layout
        v = layout.v_of(lane.rank, chunk)
        c = self.plan.chunks[v]
        if layout.next[v] >= 0 and not paired:
            yield from self._wait_recv(lane, (lane.dp, v, mb, "B"))
        if self.zero >= 3:
            yield from self._zero3_backward(lane, c, mb)
        elif buckets:   # a pair's backward with buckets runs its compute alone (no overlap modelled)
            yield from self._backward_with_buckets(lane, c, mb, self._grad_kind)
        elif paired:
            yield from self._locked(lane, self._backward_segments(c, part, lane.tp_scale), mb, v)
        elif c.offload_groups:
            yield from self._backward_with_copies(lane, c, mb, v, part)
        else:
            yield from self._coarse(lane, self._backward_segments(c, part, lane.tp_scale), mb, v)
        if c.metrics_bwd > 0:   # training metrics over the logits, after the whole backward
            yield from self._segment(lane, "compute", "backward", c.metrics_bwd, mb, v, None)
        self._free(lane, c.act_bytes - (c.act_w_bytes if part == "input" else 0.0))
        if layout.prev[v] >= 0 and not paired:
            self._send(lane, "B", mb, v, layout.prev[v])

    def _weight(self, lane: Lane, mb: int, chunk: int, buckets: bool):
        """A split backward's W: the weight gradients, then the activations only they needed are freed."""
        v = self.plan.layout.v_of(lane.rank, chunk)
        c = self.plan.chunks[v]
        if buckets:
            yield from self._backward_with_buckets(lane, c, mb, self._grad_kind, part="weight")
        else:
            yield from self._coarse(lane, self._backward_segments(c, "weight"), mb, v)
        self._free(lane, c.act_w_bytes)

    def _pair(self, lane: Lane, op, part: str, buckets: bool):
        """An overlapped forward and backward ("FB"), as DualPipe's ``_forward_backward_chunk`` runs it: both
        inputs received first, then both halves at once, their compute taking turns on the lane so that each
        one's communication runs under the other's compute; both outputs are sent when the pair ends."""
        layout = self.plan.layout
        vf, vb = layout.v_of(lane.rank, op.chunk), layout.v_of(lane.rank, op.chunk2)
        if layout.prev[vf] >= 0:
            yield from self._wait_recv(lane, (lane.dp, vf, op.mb, "F"))
        if layout.next[vb] >= 0:
            yield from self._wait_recv(lane, (lane.dp, vb, op.mb2, "B"))
        if self.sc.parallel.ep_overlap and not buckets and self.zero < 3:
            yield from play_merged_pair(self, lane, op, vf, vb, part)
        else:
            yield from self._overlapped_pair(lane, op, part, buckets)
        if layout.next[vf] >= 0:
            self._send(lane, "F", op.mb, vf, layout.next[vf])
        if layout.prev[vb] >= 0:
            self._send(lane, "B", op.mb2, vb, layout.prev[vb])

    def _overlapped_pair(self, lane: Lane, op, part: str, buckets: bool):
        """Both halves of a pair as processes, their compute taking turns under the lane's compute lock."""
        t0, busy0 = self.env.now, lane.busy["compute"] + lane.busy["tp"]
        fwd = self.env.process(self._forward(lane, op.mb, op.chunk, paired=True))
        bwd = self.env.process(self._backward(lane, op.mb2, op.chunk2, part, buckets, paired=True))
        yield fwd & bwd
        if "ep" in lane.exposed:   # the pair's compute stream idle: waiting for an all-to-all neither half hid
            lane.exposed["ep"] += max(0.0, self.env.now - t0 - (lane.busy["compute"] + lane.busy["tp"] - busy0))

    def _lane(self, lane: Lane):
        env, plan = self.env, self.plan
        ops = plan.schedule[lane.rank]
        split = split_backwards(ops)
        last_grad = {}   # chunk -> the op that finishes its gradients (its last whole backward or W)
        for i, op in enumerate(ops):
            if op.kind == "W" or (op.kind == "B" and (op.mb, op.chunk) not in split):
                last_grad[op.chunk] = i
            elif op.kind == "FB" and (op.mb2, op.chunk2) not in split:
                last_grad[op.chunk2] = i
        dp_sync = self.dp > 1
        overlap = self.sim.overlap_dp and dp_sync and self.zero < 3
        self._grad_kind = grad_kind = "all_reduce" if self.zero == 0 else "reduce_scatter"

        first_b = next((i for i, op in enumerate(ops) if op.kind in ("B", "FB")), len(ops))
        last_f = max((i for i, op in enumerate(ops) if op.kind in ("F", "FB")), default=-1)
        for i, op in enumerate(ops):
            lane.phase = "fill" if i <= first_b else ("drain" if i > last_f else "imbalance")
            # ZeRO-2 keeps only its shard of the gradients, so it reduce-scatters after every micro-batch's
            # backward (DeepSpeed does the same); DDP/ZeRO-1 sync once per step, after a chunk's last gradients
            chunk = op.chunk2 if op.kind == "FB" else op.chunk
            mb = op.mb2 if op.kind == "FB" else op.mb
            part = "input" if (mb, chunk) in split else "full"
            buckets = dp_sync and self.zero < 3 and part == "full" and (
                self.zero == 2 or (overlap and i == last_grad.get(chunk)))
            if op.kind == "F":
                yield from self._forward(lane, op.mb, op.chunk)
            elif op.kind == "B":
                yield from self._backward(lane, op.mb, op.chunk, part, buckets)
            elif op.kind == "W":
                yield from self._weight(lane, op.mb, op.chunk, dp_sync and self.zero < 3 and (
                    self.zero == 2 or (overlap and i == last_grad.get(chunk))))
            else:
                yield from self._pair(lane, op, part, buckets)

        if self.sc.parallel.schedule == "dualpipe" and self.pp > 1:   # the two model copies' gradients summed
            yield from mirror_gradient_sum(self, lane)
        # gradient synchronisation, optimizer step, ZeRO parameter all-gather
        t_compute_end = env.now
        if dp_sync and self.zero < 2 and not overlap:
            for v in plan.layout.stages_of(lane.rank):
                c = plan.chunks[v]
                total = c.grad_bytes_layers + c.grad_bytes_edge
                for nbytes in dp_buckets(total, self.sim.dp_bucket_size):
                    self._collective(lane, "dp", "dp_" + grad_kind,
                                     self._dp_phases(grad_kind, nbytes, lane.rank), nbytes,
                                     vstage=c.vstage)
        if self.plan.has_experts and dp_sync and self.zero < 2 and not overlap:
            self._expert_gradients(lane, grad_kind)
        tail = lane.chains.get("dp")   # every DP/ZeRO collective runs on the lane's one DP stream
        if tail is not None and not tail.processed:
            yield tail
        lane.exposed["dp"] += env.now - t_compute_end
        yield from finalize_gradients(self, lane)
        if plan.optimizer_host:   # the step on the host CPU: the GPU waits for each part in turn
            host = plan.optimizer_host[lane.rank]
            for kind, sec in (("optimizer_d2h", host.d2h), ("optimizer_cpu", host.cpu), ("optimizer_h2d", host.h2d)):
                lane.exposed["offload"] += sec
                yield from self._segment(lane, "offload", kind, sec, -1, -1, None)
        else:
            yield from self._segment(lane, "compute", "optimizer", plan.optimizer_time[lane.rank], -1, -1, None)
        if dp_sync and self.zero in (1, 2):
            t0 = env.now
            mem = plan.stage_memory[lane.rank]
            expert_bytes = plan.expert_params_local[lane.rank] * plan.param_bytes if plan.has_experts else 0.0
            nbytes = mem.params_local * plan.param_bytes - expert_bytes
            if expert_bytes and plan.placement.edp > 1:   # expert weights are gathered over their own group
                self._collective(lane, "dp", "edp_all_gather",
                                 plan.edp_phases("all_gather", expert_bytes, lane.rank), expert_bytes)
            yield self._collective(lane, "dp", "zero_all_gather",
                                   self._dp_phases("all_gather", nbytes, lane.rank), nbytes)
            lane.exposed["dp"] += env.now - t0
        lane.end = env.now

    def _expert_gradients(self, lane: Lane, grad_kind: str) -> None:
        """The routed experts' gradients, reduced over the expert data-parallel group in their own buckets after
        the lane's last backward (Megatron-Core keeps them in separate buffers, distributed_data_parallel.py)."""
        plan = self.plan
        if plan.placement.edp <= 1:
            return
        total = plan.expert_grad_bytes[lane.rank]
        for nbytes in dp_buckets(total, self.sim.dp_bucket_size):
            self._collective(lane, "dp", "edp_" + grad_kind, plan.edp_phases(grad_kind, nbytes, lane.rank), nbytes)

    def _alloc(self, lane: Lane, nbytes: float) -> None:
        lane.act_now += nbytes
        lane.act_peak = max(lane.act_peak, lane.act_now)
        lane.mem_events.append((self.env.now, lane.act_now))

    def _free(self, lane: Lane, nbytes: float) -> None:
        lane.act_now -= nbytes
        lane.mem_events.append((self.env.now, lane.act_now))
