"""Communication on a lane: collectives queued on FIFO streams, pipeline sends and receives,
DP gradient buckets and ZeRO-3 parameter gathers. A mixin of :class:`~simtrain.engine.core.Engine`:
it reads the engine's environment, network, plan and records.
"""

from __future__ import annotations

import math

import simpy

from simtrain.engine.lane import Lane, Rendezvous
from simtrain.plan.chunk import ChunkPlan
from simtrain.plan.collectives import Phase


class CommMixin:
    """Collectives, sends and ZeRO machinery of the engine (see engine.py for the attributes used)."""

    def _recv_event(self, key):
        ev = self.recv.get(key)
        if ev is None:
            ev = self.recv[key] = self.env.event()
        return ev

    def _collective(self, lane: Lane, chain: str, kind: str, phases: list, nbytes: float,
                    mb: int = -1, vstage: int = -1, lo: int = -1, hi: int = -1) -> simpy.Event:
        """Queue a DP/ZeRO collective on the lane's FIFO stream ``chain``; returns its done event."""
        env = self.env
        prev = lane.chains.get(chain)
        done = env.event()
        lane.chains[chain] = done
        count = lane.counters.get(chain, 0)
        lane.counters[chain] = count + 1
        key = (chain, lane.rank, count)
        factor = self._overlap_factor(phases)

        def proc():
            if prev is not None and not prev.processed:
                yield prev
            rv = self.rendezvous.get(key)
            if rv is None:
                rv = self.rendezvous[key] = Rendezvous(needed=len(self.replicas),
                                                        started=env.event(), done=env.event())
            rv.arrived += 1
            if rv.arrived == rv.needed:
                rv.start_time = env.now
                rv.started.succeed()
                env.process(self._run_phases(phases, rv.done))
            yield rv.started
            _comm_running(lane, factor, +1)   # compute slows from now on (issue 6, overlap realism)
            yield rv.done
            _comm_running(lane, factor, -1)
            self._record(lane, "dp", kind, rv.start_time, env.now, mb, vstage, lo, hi, nbytes)
            done.succeed()

        env.process(proc())
        return done

    def _dp_phases(self, collective: str, nbytes: float, pp_rank: int) -> list[Phase]:
        """A stage's DP/ZeRO collective: over its representative rings (folded), every ring (full), or the links
        of every ring that can set the pace (symmetry classes)."""
        if self.classes is not None:
            return self.classes.dp_phases(collective, nbytes, pp_rank)
        return self.plan.dp_phases(collective, nbytes, pp_rank, self.full)

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
        src_rank, dst_rank = self.plan.layout.rank[src_v], self.plan.layout.rank[dst_v]
        self.sent_at[key] = self.env.now
        if src_rank == dst_rank:
            ev.succeed()
            return
        source = self.classes or self.plan    # a class's send loads its members' links too
        phase = source.pp_phase(self.plan.pp_bytes, src_rank, dst_rank, lane.dp)

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
        lane.bubble_parts[lane.phase] += (t1 - t0) - pp_part

    def _fsdp_phases(self, c: ChunkPlan, kind: str, nbytes: float, rank: int) -> list:
        """A DP collective of ``nbytes`` preceded on its stream by the FSDP work ahead of it (``parallel.zero_impl``):
        the shard copy-in before an all-gather, the gradient cast / pre-divide before a reduction."""
        per_byte = c.gather_prep_per_byte if kind == "all_gather" else c.grad_prep_per_byte
        return _local_phase(per_byte * nbytes) + self._dp_phases(kind, nbytes, rank)

    def _buffer(self, lane: Lane, nbytes: float) -> None:
        lane.buf_now += nbytes
        lane.buf_peak = max(lane.buf_peak, lane.buf_now)
        lane.buf_events.append((self.env.now, lane.buf_now))

    def _gather(self, lane: Lane, gather, c: ChunkPlan, mb: int, layer: int):
        """A ZeRO-3 layer all-gather; its full weights occupy memory from launch until released."""
        self._buffer(lane, c.zero3_layer_bytes)
        return self._collective(lane, "dp", "zero3_all_gather", gather, c.zero3_layer_bytes, mb, c.vstage,
                                layer, layer + 1)

    def _backward_with_buckets(self, lane: Lane, c: ChunkPlan, mb: int, grad_kind: str, part: str = "full"):
        """A backward (or a split backward's W, ``part="weight"``) whose gradients leave in buckets as its layers
        finish: the last of a chunk (DDP / ZeRO-1 overlap) or, with ZeRO-2, every one."""
        bucket = self.sim.dp_bucket_size
        pending = 0.0
        v = c.vstage

        def launch(nbytes):
            phases = self._fsdp_phases(c, grad_kind, nbytes, lane.rank)
            self._collective(lane, "dp", "dp_" + grad_kind, phases, nbytes, vstage=v)

        # routed experts' gradients: their own buckets over the expert data-parallel group (Megatron-Core keeps
        # expert parameters in separate gradient buffers, distributed_data_parallel.py)
        experts = self.plan.has_experts and self.plan.placement.edp > 1
        pending_experts = 0.0

        def launch_experts(nbytes):
            self._collective(lane, "dp", "edp_" + grad_kind, self.plan.edp_phases(grad_kind, nbytes, lane.rank),
                             nbytes, vstage=v)

        head, embed = self._edge_segments(c, part, lane.tp_scale)
        if c.offload_groups and part != "weight":
            self.host_copies.begin(lane)
        if c.has_head:
            for stream, kind, sec, layer in head:
                yield from self._segment(lane, stream, kind, sec, mb, v, layer)
            pending += c.grad_bytes_edge if not c.has_embedding else 0.0
        for layer_index, segs in self._backward_layers(c, part, lane.tp_scale):
            if c.offload_groups and part != "weight":   # its activations back from host memory first
                yield from self.host_copies.before_backward(lane, c, layer_index - c.layer_lo, mb, v)
            for stream, kind, sec, layer in segs:
                yield from self._segment(lane, stream, kind, sec, mb, v, layer)
            pending += c.layer_costs(layer_index - c.layer_lo)[5]
            if pending >= bucket:
                launch(pending)
                pending = 0.0
            if experts and layer_index - c.layer_lo >= c.lead_layers:
                pending_experts += c.expert_grad_bytes_layer
                if pending_experts >= bucket:
                    launch_experts(pending_experts)
                    pending_experts = 0.0
        if c.has_embedding:
            for stream, kind, sec, layer in embed:
                yield from self._segment(lane, stream, kind, sec, mb, v, layer)
            pending += c.grad_bytes_edge
        if pending > 0:
            launch(pending)
        if pending_experts > 0:
            launch_experts(pending_experts)

    def _gather_edge(self, lane: Lane, c: ChunkPlan, mb: int):
        """ZeRO-3: the embedding / output-layer weights are gathered like a layer's (in the weights' dtype)."""
        if c.zero3_edge_bytes <= 0:
            return
        phases = self._fsdp_phases(c, "all_gather", c.zero3_edge_bytes, lane.rank)
        self._buffer(lane, c.zero3_edge_bytes)     # held until the op ends (released by _release_edge)
        done = self._collective(lane, "dp", "zero3_all_gather", phases, c.zero3_edge_bytes, mb, c.vstage)
        t0 = self.env.now
        yield done
        lane.exposed["dp"] += self.env.now - t0

    def _release_edge(self, lane: Lane, c: ChunkPlan) -> None:
        if c.zero3_edge_bytes > 0:
            self._buffer(lane, -c.zero3_edge_bytes)

    def _zero3_forward(self, lane: Lane, c: ChunkPlan, mb: int):
        v = c.vstage
        gather = self._fsdp_phases(c, "all_gather", c.zero3_layer_bytes, lane.rank)
        yield from self._gather_edge(lane, c, mb)
        if c.has_embedding:
            yield from self._segment(lane, "compute", "forward", c.embed_fwd, mb, v, None)
            yield from self._segment(lane, "tp", "tp_comm", c.embed_tp_fwd, mb, v, None)
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
            yield from self._segment(lane, "tp", "tp_comm", c.tp_fwd(i), mb, v, layer)
            if c.cp_fwd_layer or c.cp_fwd_hidden:
                yield from self._segment(lane, "cp_hidden", "cp_comm", c.cp_fwd_hidden, mb, v, layer)
                yield from self._segment(lane, "cp", "cp_comm", c.cp_fwd_layer, mb, v, layer)
            self._buffer(lane, -c.zero3_layer_bytes)   # resharded after its forward
        if c.amax_fwd > 0:
            yield from self._segment(lane, "amax", "amax_allreduce", c.amax_fwd, mb, v, None)
        if c.has_head:
            yield from self._segment(lane, "compute", "forward", c.head_fwd, mb, v, None)
            yield from self._segment(lane, "tp", "tp_comm", c.head_tp_fwd, mb, v, None)
        self._release_edge(lane, c)

    def _zero3_backward(self, lane: Lane, c: ChunkPlan, mb: int):
        v = c.vstage
        gather = self._fsdp_phases(c, "all_gather", c.zero3_layer_bytes, lane.rank)
        scatter = self._fsdp_phases(c, "reduce_scatter", c.grad_bytes_layer, lane.rank)
        yield from self._gather_edge(lane, c, mb)
        head, embed = self._edge_segments(c, "full", lane.tp_scale)
        for stream, kind, sec, lyr in head:
            yield from self._segment(lane, stream, kind, sec, mb, v, lyr)
        layers = self._backward_layers(c, "full", lane.tp_scale)
        # when the next layer's weights are gathered (FSDP's BackwardPrefetch): "pre" as this layer's
        # gradient computation starts, "post" once it is done, "none" when the next layer starts
        prefetch = self.sc.parallel.backward_prefetch
        ready = self._gather(lane, gather, c, mb, layers[0][0]) if layers else None
        for j, (layer, segs) in enumerate(layers):
            if ready is None:
                ready = self._gather(lane, gather, c, mb, layer)
            nxt = layers[j + 1][0] if j + 1 < len(layers) else None
            if not ready.processed:
                t0 = self.env.now
                yield ready
                lane.exposed["dp"] += self.env.now - t0
            ready = None
            if nxt is not None and prefetch == "pre":
                ready = self._gather(lane, gather, c, mb, nxt)
            for stream, kind, sec, lyr in segs:
                yield from self._segment(lane, stream, kind, sec, mb, v, lyr)
            self._buffer(lane, c.grad_bytes_layer - c.zero3_layer_bytes)   # weights resharded, gradient unsharded
            if nxt is not None and prefetch == "post":
                ready = self._gather(lane, gather, c, mb, nxt)
            # on the gathers' stream: PyTorch runs a process group's collectives on one NCCL stream, in the
            # order they are issued (FSDP gathers and reduce-scatters over the same group)
            done = self._collective(lane, "dp", "zero3_reduce_scatter", scatter, c.grad_bytes_layer, mb, v, layer,
                                    layer + 1)
            done.callbacks.append(lambda _e, n=c.grad_bytes_layer: self._buffer(lane, -n))
        for stream, kind, sec, lyr in embed:
            yield from self._segment(lane, stream, kind, sec, mb, v, lyr)
        self._release_edge(lane, c)
        if c.grad_bytes_edge > 0:
            edge = self._fsdp_phases(c, "reduce_scatter", c.grad_bytes_edge, lane.rank)
            self._collective(lane, "dp", "zero3_reduce_scatter", edge, c.grad_bytes_edge, mb, v)


def _local_phase(seconds: float) -> list:
    """Work a collective's stream does ahead of it without the network (``parallel.zero_impl``: FSDP1's cast and
    pre-divide, FSDP2's fp16 pre-divide ahead of a reduce-scatter, FSDP2's shard copy-in ahead of an all-gather), as
    a phase that moves no bytes; none when it takes no time."""
    return [Phase(flow_bytes=0.0, latency=seconds, links=())] if seconds > 0 else []


def _comm_running(lane, factor: float, delta: int) -> None:
    """A collective starts (+1) or ends (-1) on the lane: count it and wake the compute op in progress."""
    lane.comm_factors[factor] = lane.comm_factors.get(factor, 0) + delta
    change, lane.comm_change = lane.comm_change, None
    if change is not None:
        change.succeed()


def dp_buckets(total: float, size: float) -> list[float]:
    """A chunk's DP gradient bytes in equal buckets of at most ``size`` (the engine plays one collective per bucket;
    the event estimate counts them the same way)."""
    if total <= 0:
        return []
    n = max(1, math.ceil(total / size))
    return [total / n] * n
