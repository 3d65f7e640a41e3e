"""How the engine plays one operation's segments (:mod:`simtrain.plan.segments`): as one coarse op (compute, then
its exposed TP/CP communication, then its EP all-to-alls), segment by segment, or under a lane's compute lock when
two micro-batches' halves overlap. A mixin of :class:`simtrain.engine.core.Engine`: it reads the engine's clock,
its lanes' slowdown factors and records, and the EP flows it carries."""

from __future__ import annotations

import simpy

from simtrain.engine.lane import Lane
from simtrain.plan import segments
from simtrain.plan.chunk import ChunkPlan


class SegmentMixin:
    """The segment-playing half of the engine (module docstring)."""

    def _coarse(self, lane: Lane, segments: list, mb: int, v: int):
        """Run a list of (stream, kind, seconds, layer) as one op: its compute, then its TP communication
        (exposed), then its EP all-to-alls (as flows on the network when ``ep_flows`` carries them); per-layer
        records if detailed. Compute segments are stretched alike by the overlap slowdown the op met
        (``_compute``), EP segments alike by the sharing their flows met."""
        f = self._factor(lane)
        t = self.env.now
        work = sum(sec for stream, _k, sec, _l in segments if stream == "compute") * f
        if work > 0:
            yield from self._compute(lane, work)
        stretch = f * ((self.env.now - t) / work if work > 0 else 1.0)
        ep_scale = 1.0

        def seconds(stream: str, sec: float) -> float:
            return sec * stretch if stream == "compute" else sec * lane.tp_scale if stream == "tp" else \
                sec * ep_scale if stream == "ep" else sec
        planned = self._op_length(segments, seconds)
        ep = sum(sec for stream, _k, sec, _l in segments if stream == "ep") if self.ep_flows is not None else 0.0
        rest = t + planned - self.env.now - ep    # the TP (and CP, offload) communication, after the compute
        if rest > 0:
            yield self.env.timeout(rest)
        if ep > 0:                                # then the EP all-to-alls, as flows on the network
            t_ep = self.env.now
            yield from self.ep_flows.run(lane, ep, (mb, v, None))
            ep_scale = (self.env.now - t_ep) / ep
        total = 0.0
        if self.layer_detail:
            for stream, kind, sec, layer in segments:
                sec = seconds(stream, sec)
                lo, hi = (layer, layer + 1) if layer is not None else (-1, -1)
                if stream == "cp_hidden":   # under the compute just played: busy, not on the critical path
                    self._record(lane, "cp", kind, t + total - sec, t + total, mb, v, lo, hi)
                    continue
                self._record(lane, stream, kind, t + total, t + total + sec, mb, v, lo, hi)
                if stream != "compute":
                    lane.exposed[stream] += sec
                total += sec
        else:
            sums: dict = {}
            for stream, kind, sec, _layer in segments:
                sums[(stream, kind)] = sums.get((stream, kind), 0.0) + seconds(stream, sec)
            for (stream, kind), sec in sums.items():
                if stream == "cp_hidden":
                    self._record(lane, "cp", kind, t + total - sec, t + total, mb, v)
                    continue
                self._record(lane, stream, kind, t + total, t + total + sec, mb, v)
                if stream != "compute":
                    lane.exposed[stream] += sec
                total += sec

    def _op_length(self, segments: list, seconds) -> float:
        """An op's length as ``_coarse`` records it: its segments end to end (by stream and kind when coarse)."""
        total = 0.0
        if self.layer_detail:
            for stream, _kind, sec, _layer in segments:
                if stream != "cp_hidden":
                    total += seconds(stream, sec)
            return total
        sums: dict = {}
        for stream, kind, sec, _layer in segments:
            sums[(stream, kind)] = sums.get((stream, kind), 0.0) + seconds(stream, sec)
        for (stream, _kind), sec in sums.items():
            if stream != "cp_hidden":
                total += sec
        return total

    def _segment(self, lane: Lane, stream: str, kind: str, sec: float, mb: int, v: int, layer,
                 exposed: bool = True):
        start = self.env.now
        if stream == "cp_hidden":
            lo, hi = (layer, layer + 1) if layer is not None else (-1, -1)
            self._record(lane, "cp", kind, start - sec, start, mb, v, lo, hi)
            return
        if stream == "compute":
            yield from self._compute(lane, sec * self._factor(lane))
        elif stream == "ep" and self.ep_flows is not None:
            if sec > 0:
                yield from self.ep_flows.run(lane, sec, (mb, v, layer))
            if exposed:
                lane.exposed["ep"] += self.env.now - start
        else:
            if stream == "tp":
                sec *= lane.tp_scale
            if stream in ("tp", "ep", "cp", "amax") and exposed:
                lane.exposed[stream] += sec
            if sec <= 0:
                return
            yield self.env.timeout(sec)
        lo, hi = (layer, layer + 1) if layer is not None else (-1, -1)
        self._record(lane, stream, kind, start, self.env.now, mb, v, lo, hi)

    def _forward_with_copies(self, lane: Lane, c: ChunkPlan, mb: int, v: int):
        """A forward whose first layers' activations go to host memory: segment by segment, the copy streams told
        as each layer's forward ends (``engine.host_copies``)."""
        copies = self.host_copies
        copies.begin(lane)
        segs = self._forward_segments(c)
        for k, (stream, kind, sec, layer) in enumerate(segs):
            yield from self._segment(lane, stream, kind, sec, mb, v, layer)
            if layer is not None and (k + 1 == len(segs) or segs[k + 1][3] != layer):
                yield from copies.after_forward(lane, c, layer - c.layer_lo, mb, v)

    def _backward_with_copies(self, lane: Lane, c: ChunkPlan, mb: int, v: int, part: str):
        """A backward (whole or its input-gradient half) of such a chunk: each layer's reload waited for and
        issued where the handler does, then its segments one by one."""
        self.host_copies.begin(lane)
        head, embed = self._edge_segments(c, part, lane.tp_scale)
        for seg in head:
            yield from self._segment(lane, *seg[:3], mb, v, seg[3])
        for layer, segs in self._backward_layers(c, part, lane.tp_scale):
            yield from self.host_copies.before_backward(lane, c, layer - c.layer_lo, mb, v)
            for seg in segs:
                yield from self._segment(lane, *seg[:3], mb, v, seg[3])
        for seg in embed:
            yield from self._segment(lane, *seg[:3], mb, v, seg[3])

    def _once(self, key: tuple, build, c: ChunkPlan) -> list:
        """``build(c)``, computed once per chunk and kept in ``self._segments``."""
        hit = self._segments.get(key)
        if hit is None:
            hit = self._segments[key] = build(c)
        return hit

    def _forward_segments(self, c: ChunkPlan) -> list:
        """A chunk's forward as (stream, kind, seconds, layer) segments; built once per chunk."""
        return self._once(("F", c.vstage), segments.forward_segments, c)

    def _backward_layers(self, c: ChunkPlan, part: str = "full", tp_scale: float = 1.0) -> list:
        """Per layer (in backward order): its segments; built once per chunk, part and lane TP scale."""
        return self._once(("B", c.vstage, part, tp_scale),
                          lambda ch: segments.backward_layers(ch, part, tp_scale), c)

    def _edge_segments(self, c: ChunkPlan, part: str, tp_scale: float = 1.0) -> tuple[list, list]:
        return segments.edge_segments(c, part, tp_scale)

    def _backward_segments(self, c: ChunkPlan, part: str = "full", tp_scale: float = 1.0) -> list:
        """A chunk's whole backward (output layer, layers in reverse, embedding) as one segment list."""
        return self._once(("Bflat", c.vstage, part, tp_scale),
                          lambda ch: segments.backward_segments(ch, part, self._backward_layers(ch, part, tp_scale),
                                                                tp_scale),
                          c)

    def _locked(self, lane: Lane, segments: list, mb: int, v: int):
        """Run segments one by one, compute under the lane's compute lock: the other half of an overlapped pair
        computes while this one communicates (DeepSeek-V3 Sec. 3.2.1, Fig. 4). TP collectives hold the lock too:
        they run inside the attention and MLP modules on the compute stream, and so do the FP8 amax all-reduces the
        next GEMM waits for; only the EP dispatch and combine (and the pipeline sends) run on the communication stream
        (Megatron-Core model_chunk_schedule_plan.py)."""
        if lane.compute_lock is None:
            lane.compute_lock = simpy.Resource(self.env, capacity=1)
        i, n = 0, len(segments)
        while i < n:
            if segments[i][0] not in ("compute", "tp", "amax"):
                yield from self._segment(lane, *segments[i][:3], mb, v, segments[i][3], exposed=False)
                i += 1
                continue
            with lane.compute_lock.request() as req:   # one compute segment and the TP collectives after it
                yield req
                yield from self._segment(lane, *segments[i][:3], mb, v, segments[i][3])
                i += 1
                while i < n and segments[i][0] in ("tp", "amax"):
                    yield from self._segment(lane, *segments[i][:3], mb, v, segments[i][3])
                    i += 1
