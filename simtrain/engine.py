"""The discrete-event engine: plays one optimizer step out in simpy.

The unit it simulates is a *lane*: the TP group of one pipeline rank in one DP
replica (TP ranks synchronise at every layer, so they move in lock-step). In
``folded`` fidelity there is one lane per pipeline rank, standing for all DP
replicas (homogeneous clusters are symmetric); in ``full`` fidelity one lane
per (DP replica, pipeline rank). Each lane runs its schedule's operations in
order on its compute stream; pipeline sends, DP/ZeRO collectives and
ZeRO-3 gathers run as flows on the shared :class:`~simtrain.fluid.FluidNetwork`.

The engine computes no costs: it reads them from the :class:`~simtrain.plan.Plan`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import simpy

from simtrain.errors import SimulationLimitError
from simtrain.fluid import FluidNetwork
from simtrain.plan import ChunkPlan, Plan

#: Record fields: lane, stream, kind, start, end, micro-batch, virtual stage, first layer, last layer+1, bytes
Record = tuple


class _CountingEnvironment(simpy.Environment):
    """A simpy environment that counts the events it schedules (for reports and benchmarks)."""

    def __init__(self) -> None:
        super().__init__()
        self.scheduled = 0

    def schedule(self, event, priority=1, delay=0):
        self.scheduled += 1
        super().schedule(event, priority, delay)


@dataclass(eq=False)
class Lane:
    index: int
    dp: int | None            # None: folded, stands for every DP replica
    rank: int                 # pipeline rank
    slowdown: float = 1.0
    rng: object | None = None          # numpy.random.Generator when jitter is on
    chains: dict = field(default_factory=dict)
    counters: dict = field(default_factory=dict)
    comm_busy: int = 0
    comm_factors: dict = field(default_factory=dict)   # overlap slowdown -> collectives in flight
    busy: dict = field(default_factory=lambda: {"compute": 0.0, "tp": 0.0, "pp": 0.0, "dp": 0.0})
    exposed: dict = field(default_factory=lambda: {"tp": 0.0, "pp": 0.0, "dp": 0.0})
    bubble: float = 0.0
    end: float = 0.0
    act_now: float = 0.0
    act_peak: float = 0.0
    mem_events: list = field(default_factory=list)
    buf_now: float = 0.0          # ZeRO-3 gathered weights and unsharded gradients awaiting their reduce-scatter
    buf_peak: float = 0.0
    buf_events: list = field(default_factory=list)


@dataclass(eq=False)
class _Rendezvous:
    needed: int
    arrived: int = 0
    started: simpy.Event | None = None
    done: simpy.Event | None = None
    start_time: float = 0.0


@dataclass
class Timeline:
    """What the engine leaves behind: records of every operation and per-lane totals."""

    step_time: float
    lanes: list[Lane]
    records: list[Record]
    events: int
    full: bool


def estimate_events(plan: Plan, full: bool) -> int:
    """Simpy events the run will schedule, counted from the plan before running it."""
    par = plan.scenario.parallel
    lanes = par.pp * (par.dp if full else 1)
    ops = sum(len(ops) for ops in plan.schedule) / max(par.pp, 1)
    per_op = 4
    if par.zero >= 3 and par.dp > 1:
        per_op += 4 * max(c.layers for c in plan.chunks)
    return int(lanes * ops * per_op + lanes * 64)


class Engine:
    """Runs one step of a plan; ``run()`` returns a :class:`Timeline`."""

    def __init__(self, plan: Plan, *, full: bool = False, detail_limit: int = 300_000,
                 slowdowns: dict[int, float] | None = None, link_scale: dict | None = None,
                 jitter: float = 0.0, seed: int = 0) -> None:
        self.plan = plan
        self.full = full
        self.sc = plan.scenario
        par = self.sc.parallel
        self.pp, self.dp, self.vpp = par.pp, par.dp, par.vpp
        self.V = self.pp * self.vpp
        self.zero = par.zero if par.dp > 1 else 0
        self.sim = self.sc.simulation
        self.jitter = jitter
        self.seed = seed
        self.env = _CountingEnvironment()
        cluster = self.sc.cluster
        scale = link_scale or {}

        class _Capacity(dict):
            def __missing__(self, link):
                value = cluster.bandwidth(link) * scale.get(link, 1.0)
                self[link] = value
                return value

        self.net = FluidNetwork(self.env, _Capacity())
        self.records: list[Record] = []
        self.recv: dict = {}
        self.sent_at: dict = {}
        self.rendezvous: dict = {}
        self.slowdowns = slowdowns or {}
        lanes_n = self.pp * (self.dp if full else 1)
        per_lane_layers = sum(c.layers for c in plan.chunks) / self.pp
        est_records = lanes_n * sum(len(o) for o in plan.schedule) / self.pp * per_lane_layers * 2
        self.layer_detail = est_records <= detail_limit
        self.events = 0
        self._factor_cache: dict = {}

    # --- lanes ---------------------------------------------------------------
    def _make_lanes(self) -> list[Lane]:
        lanes = []
        pl = self.plan.placement
        for d in (range(self.dp) if self.full else [None]):
            for r in range(self.pp):
                ranks = pl.tp_group(d if d is not None else 0, r)
                if d is None:   # folded: the slowest replica of the stage sets the pace
                    ranks = [pl.rank(dd, t, r) for dd in range(self.dp) for t in range(pl.tp)]
                slow = max((self.slowdowns.get(x, 1.0) for x in ranks), default=1.0)
                idx = len(lanes)
                rng = None
                if self.jitter > 0:
                    import numpy as np   # only variation needs numpy: keep the common path light

                    rng = np.random.default_rng([self.seed, idx])
                lanes.append(Lane(index=idx, dp=d, rank=r, slowdown=slow, rng=rng))
        return lanes

    def run(self) -> Timeline:
        est = estimate_events(self.plan, self.full)
        if est > self.sim.max_events:
            raise SimulationLimitError(
                f"this run needs about {est:,} simulated events, more than simulation.max_events="
                f"{self.sim.max_events:,}; use simulation.fidelity: folded (one lane per stage) or raise the limit",
                field="simulation.max_events")
        self.lanes = self._make_lanes()
        for lane in self.lanes:
            self.env.process(self._lane(lane))
        self.env.run()
        step = max(lane.end for lane in self.lanes)
        self.records.sort(key=lambda r: (r[0], r[3], r[4], r[1]))
        return Timeline(step_time=step, lanes=self.lanes, records=self.records,
                        events=self.env.scheduled, full=self.full)

    # --- helpers -------------------------------------------------------------
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

    def _recv_event(self, key):
        ev = self.recv.get(key)
        if ev is None:
            ev = self.recv[key] = self.env.event()
        return ev

    def _collective(self, lane: Lane, chain: str, kind: str, phases: list, nbytes: float,
                    mb: int = -1, vstage: int = -1, lo: int = -1, hi: int = -1) -> simpy.Event:
        """Queue a DP/ZeRO collective on one of the lane's FIFO comm streams; returns its done event."""
        env = self.env
        prev = lane.chains.get(chain)
        done = env.event()
        lane.chains[chain] = done
        count = lane.counters.get(chain, 0)
        lane.counters[chain] = count + 1
        key = (chain, lane.rank, count)
        factor = self._overlap_factor(phases)
        lane.comm_busy += 1   # queued or running: the lane's comm stream is busy until it is done
        lane.comm_factors[factor] = lane.comm_factors.get(factor, 0) + 1

        def proc():
            if prev is not None and not prev.processed:
                yield prev
            rv = self.rendezvous.get(key)
            if rv is None:
                rv = self.rendezvous[key] = _Rendezvous(needed=self.dp if self.full else 1,
                                                        started=env.event(), done=env.event())
            rv.arrived += 1
            if rv.arrived == rv.needed:
                rv.start_time = env.now
                rv.started.succeed()
                env.process(self._run_phases(phases, rv.done))
            yield rv.started
            yield rv.done
            lane.comm_busy -= 1
            lane.comm_factors[factor] -= 1
            self._record(lane, "dp", kind, rv.start_time, env.now, mb, vstage, lo, hi, nbytes)
            done.succeed()

        env.process(proc())
        return done

    def _overlap_factor(self, phases) -> float:
        """The compute slowdown of the fabric a collective uses (network if any of its links is one)."""
        # phases' link tuples come from ring shapes cached (and kept alive) by the plan
        key = tuple(id(ph.links) for ph in phases)
        hit = self._factor_cache.get(key)
        if hit is None:
            cluster = self.sc.cluster
            crosses = any(cluster._link(link)[2] == "network" for ph in phases for link, _ in ph.links)
            hit = self.sc.hardware.overlap_slowdown(crosses)
            self._factor_cache[key] = hit
        return hit

    def _run_phases(self, phases, done):
        for phase in phases:
            yield from self.net.run_phase(phase)
        done.succeed()

    def _send(self, lane: Lane, direction: str, mb: int, src_v: int, dst_v: int):
        """Activation (F) or gradient (B) from virtual stage src_v to dst_v."""
        key = (lane.dp, dst_v, mb, direction)
        ev = self._recv_event(key)
        src_rank, dst_rank = src_v % self.pp, dst_v % self.pp
        self.sent_at[key] = self.env.now
        if src_rank == dst_rank:
            ev.succeed()
            return
        phase = self.plan.pp_phase(self.plan.pp_bytes, src_rank, dst_rank, lane.dp)

        def proc():
            start = self.env.now
            yield from self.net.run_phase(phase)
            self._record(lane, "pp", "send_" + ("act" if direction == "F" else "grad"), start, self.env.now,
                         mb, src_v, -1, -1, self.plan.pp_bytes)
            ev.succeed()

        self.env.process(proc())

    def _wait_recv(self, lane: Lane, key):
        ev = self._recv_event(key)
        if ev.processed:
            return
        t0 = self.env.now
        yield ev
        t1 = self.env.now
        sent = self.sent_at.get(key, t1)
        pp_part = t1 - max(t0, sent)
        lane.exposed["pp"] += pp_part
        lane.bubble += (t1 - t0) - pp_part

    # --- compute ---------------------------------------------------------------
    def _coarse(self, lane: Lane, segments: list, mb: int, v: int):
        """Run a list of (stream, kind, seconds, layer) as one timeout; per-layer records if detailed.

        Compute is slowed by the overlap factor when a collective is in flight as the op starts
        (as in ``_segment``; a collective that ends part-way still counts for the whole op)."""
        f = self._factor(lane)
        if lane.comm_busy:
            f *= max(x for x, n in lane.comm_factors.items() if n > 0)
        t = self.env.now
        total = 0.0
        if self.layer_detail:
            for stream, kind, sec, layer in segments:
                sec = sec * f if stream == "compute" else sec
                lo, hi = (layer, layer + 1) if layer is not None else (-1, -1)
                self._record(lane, stream, kind, t + total, t + total + sec, mb, v, lo, hi)
                if stream == "tp":
                    lane.exposed["tp"] += sec
                total += sec
        else:
            sums: dict = {}
            for stream, kind, sec, layer in segments:
                sec = sec * f if stream == "compute" else sec
                sums[(stream, kind)] = sums.get((stream, kind), 0.0) + sec
            for (stream, kind), sec in sums.items():
                self._record(lane, stream, kind, t + total, t + total + sec, mb, v)
                if stream == "tp":
                    lane.exposed["tp"] += sec
                total += sec
        if total > 0:
            yield self.env.timeout(total)

    def _segment(self, lane: Lane, stream: str, kind: str, sec: float, mb: int, v: int, layer):
        if stream == "compute":
            sec *= self._factor(lane)
            if lane.comm_busy:
                sec *= max(f for f, n in lane.comm_factors.items() if n > 0)
        elif stream == "tp":
            lane.exposed["tp"] += sec
        if sec <= 0:
            return
        lo, hi = (layer, layer + 1) if layer is not None else (-1, -1)
        start = self.env.now
        yield self.env.timeout(sec)
        self._record(lane, stream, kind, start, self.env.now, mb, v, lo, hi)

    def _forward_segments(self, c: ChunkPlan) -> list:
        segs = []
        if c.has_embedding:
            segs.append(("compute", "forward", c.embed_fwd, None))
        for i in range(c.layers):
            segs.append(("compute", "forward", c.fwd_layer, c.layer_lo + i))
            segs.append(("tp", "tp_comm", c.tp_fwd_layer, c.layer_lo + i))
        if c.has_head:
            segs.append(("compute", "forward", c.head_fwd, None))
        return segs

    def _backward_layers(self, c: ChunkPlan) -> list:
        """Per layer (in backward order): its segments."""
        out = []
        for i in reversed(range(c.layers)):
            layer = c.layer_lo + i
            segs = []
            if c.recompute_layer > 0:
                segs.append(("compute", "recompute", c.recompute_layer, layer))
            segs.append(("compute", "backward", c.bwd_layer, layer))
            segs.append(("tp", "tp_comm", c.tp_bwd_layer, layer))
            out.append((layer, segs))
        return out

    # --- one lane ---------------------------------------------------------------
    def _lane(self, lane: Lane):
        env, plan = self.env, self.plan
        ops = plan.schedule[lane.rank]
        last_b = {}
        for i, op in enumerate(ops):
            if op.kind == "B":
                last_b[op.chunk] = i
        dp_sync = self.dp > 1
        overlap = self.sim.overlap_dp and dp_sync and self.zero < 3
        grad_kind = "all_reduce" if self.zero == 0 else "reduce_scatter"

        for i, op in enumerate(ops):
            v = op.chunk * self.pp + lane.rank
            c = plan.chunks[v]
            if op.kind == "F":
                if v > 0:
                    yield from self._wait_recv(lane, (lane.dp, v, op.mb, "F"))
                self._alloc(lane, c.act_bytes)
                if self.zero >= 3:
                    yield from self._zero3_forward(lane, c, op.mb)
                else:
                    yield from self._coarse(lane, self._forward_segments(c), op.mb, v)
                if v + 1 < self.V:
                    self._send(lane, "F", op.mb, v, v + 1)
            else:
                if v + 1 < self.V:
                    yield from self._wait_recv(lane, (lane.dp, v, op.mb, "B"))
                if self.zero >= 3:
                    yield from self._zero3_backward(lane, c, op.mb)
                elif dp_sync and (self.zero == 2 or (overlap and i == last_b[op.chunk])):
                    # ZeRO-2 keeps only its shard of the gradients, so it reduce-scatters after every
                    # micro-batch's backward (DeepSpeed does the same); DDP/ZeRO-1 sync once per step
                    yield from self._backward_with_buckets(lane, c, op.mb, grad_kind)
                else:
                    segs = [("compute", "backward", c.head_bwd, None)] if c.has_head else []
                    for _layer, layer_segs in self._backward_layers(c):
                        segs.extend(layer_segs)
                    if c.has_embedding:
                        segs.append(("compute", "backward", c.embed_bwd, None))
                    yield from self._coarse(lane, segs, op.mb, v)
                self._free(lane, c.act_bytes)
                if v > 0:
                    self._send(lane, "B", op.mb, v, v - 1)

        # gradient synchronisation, optimizer step, ZeRO parameter all-gather
        t_compute_end = env.now
        if dp_sync and self.zero < 2 and not overlap:
            for ch in range(self.vpp):
                c = plan.chunks[ch * self.pp + lane.rank]
                total = c.grad_bytes_layer * c.layers + c.grad_bytes_edge
                for nbytes in _buckets(total, self.sim.dp_bucket_size):
                    self._collective(lane, "dp", "dp_" + grad_kind, plan.dp_phases(grad_kind, nbytes, lane.rank, self.full),
                                     nbytes, vstage=c.vstage)
        for chain in ("dp", "rs"):
            tail = lane.chains.get(chain)
            if tail is not None and not tail.processed:
                yield tail
        lane.exposed["dp"] += env.now - t_compute_end
        yield from self._segment(lane, "compute", "optimizer", plan.optimizer_time[lane.rank], -1, -1, None)
        if dp_sync and self.zero in (1, 2):
            t0 = env.now
            mem = plan.stage_memory[lane.rank]
            nbytes = mem.params_local * plan.dtype_bytes
            yield self._collective(lane, "dp", "zero_all_gather", plan.dp_phases("all_gather", nbytes, lane.rank, self.full),
                                   nbytes)
            lane.exposed["dp"] += env.now - t0
        lane.end = env.now

    def _alloc(self, lane: Lane, nbytes: float) -> None:
        lane.act_now += nbytes
        lane.act_peak = max(lane.act_peak, lane.act_now)
        lane.mem_events.append((self.env.now, lane.act_now))

    def _buffer(self, lane: Lane, nbytes: float) -> None:
        lane.buf_now += nbytes
        lane.buf_peak = max(lane.buf_peak, lane.buf_now)
        lane.buf_events.append((self.env.now, lane.buf_now))

    def _gather(self, lane: Lane, gather, c: ChunkPlan, mb: int, layer: int):
        """A ZeRO-3 layer all-gather; its full weights occupy memory from launch until released."""
        self._buffer(lane, c.zero3_layer_bytes)
        return self._collective(lane, "dp", "zero3_all_gather", gather, c.zero3_layer_bytes, mb, c.vstage,
                                layer, layer + 1)

    def _free(self, lane: Lane, nbytes: float) -> None:
        lane.act_now -= nbytes
        lane.mem_events.append((self.env.now, lane.act_now))

    def _backward_with_buckets(self, lane: Lane, c: ChunkPlan, mb: int, grad_kind: str):
        """The last backward of a chunk: gradients leave in buckets as layers finish (DDP overlap)."""
        bucket = self.sim.dp_bucket_size
        pending = 0.0
        v = c.vstage

        def launch(nbytes):
            self._collective(lane, "dp", "dp_" + grad_kind, self.plan.dp_phases(grad_kind, nbytes, lane.rank, self.full),
                             nbytes, vstage=v)

        if c.has_head:
            yield from self._segment(lane, "compute", "backward", c.head_bwd, mb, v, None)
            pending += c.grad_bytes_edge if not c.has_embedding else 0.0
        for _layer, segs in self._backward_layers(c):
            for stream, kind, sec, layer in segs:
                yield from self._segment(lane, stream, kind, sec, mb, v, layer)
            pending += c.grad_bytes_layer
            if pending >= bucket:
                launch(pending)
                pending = 0.0
        if c.has_embedding:
            yield from self._segment(lane, "compute", "backward", c.embed_bwd, mb, v, None)
            pending += c.grad_bytes_edge
        if pending > 0:
            launch(pending)

    def _gather_edge(self, lane: Lane, c: ChunkPlan, mb: int):
        """ZeRO-3: the embedding / output-layer weights are gathered like a layer's (16-bit, like the grads)."""
        if c.grad_bytes_edge <= 0:
            return
        phases = self.plan.dp_phases("all_gather", c.grad_bytes_edge, lane.rank, self.full)
        done = self._collective(lane, "dp", "zero3_all_gather", phases, c.grad_bytes_edge, mb, c.vstage)
        t0 = self.env.now
        yield done
        lane.exposed["dp"] += self.env.now - t0

    def _zero3_forward(self, lane: Lane, c: ChunkPlan, mb: int):
        v = c.vstage
        gather = self.plan.dp_phases("all_gather", c.zero3_layer_bytes, lane.rank, self.full)
        yield from self._gather_edge(lane, c, mb)
        if c.has_embedding:
            yield from self._segment(lane, "compute", "forward", c.embed_fwd, mb, v, None)
        pending = [self._gather(lane, gather, c, mb, c.layer_lo)] if c.layers else []
        for i in range(c.layers):
            layer = c.layer_lo + i
            ready = pending.pop(0)
            if i + 1 < c.layers:   # prefetch the next layer's weights
                pending.append(self._gather(lane, gather, c, mb, layer + 1))
            if not ready.processed:
                t0 = self.env.now
                yield ready
                lane.exposed["dp"] += self.env.now - t0
            yield from self._segment(lane, "compute", "forward", c.fwd_layer, mb, v, layer)
            yield from self._segment(lane, "tp", "tp_comm", c.tp_fwd_layer, mb, v, layer)
            self._buffer(lane, -c.zero3_layer_bytes)   # resharded after its forward
        if c.has_head:
            yield from self._segment(lane, "compute", "forward", c.head_fwd, mb, v, None)

    def _zero3_backward(self, lane: Lane, c: ChunkPlan, mb: int):
        v = c.vstage
        gather = self.plan.dp_phases("all_gather", c.zero3_layer_bytes, lane.rank, self.full)
        scatter = self.plan.dp_phases("reduce_scatter", c.grad_bytes_layer, lane.rank, self.full)
        yield from self._gather_edge(lane, c, mb)
        if c.has_head:
            yield from self._segment(lane, "compute", "backward", c.head_bwd, mb, v, None)
        layers = self._backward_layers(c)
        pending = [self._gather(lane, gather, c, mb, layers[0][0])] if layers else []
        for j, (layer, segs) in enumerate(layers):
            ready = pending.pop(0)
            if j + 1 < len(layers):
                pending.append(self._gather(lane, gather, c, mb, layers[j + 1][0]))
            if not ready.processed:
                t0 = self.env.now
                yield ready
                lane.exposed["dp"] += self.env.now - t0
            for stream, kind, sec, lyr in segs:
                yield from self._segment(lane, stream, kind, sec, mb, v, lyr)
            self._buffer(lane, c.grad_bytes_layer - c.zero3_layer_bytes)   # weights resharded, gradient unsharded
            done = self._collective(lane, "rs", "zero3_reduce_scatter", scatter, c.grad_bytes_layer, mb, v, layer,
                                    layer + 1)
            done.callbacks.append(lambda _e, n=c.grad_bytes_layer: self._buffer(lane, -n))
        if c.has_embedding:
            yield from self._segment(lane, "compute", "backward", c.embed_bwd, mb, v, None)
        if c.grad_bytes_edge > 0:
            edge = self.plan.dp_phases("reduce_scatter", c.grad_bytes_edge, lane.rank, self.full)
            self._collective(lane, "rs", "zero3_reduce_scatter", edge, c.grad_bytes_edge, mb, v)


def _buckets(total: float, size: float) -> list[float]:
    if total <= 0:
        return []
    n = max(1, math.ceil(total / size))
    return [total / n] * n
