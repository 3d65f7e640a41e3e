"""Megatron-Core's merged forward-backward pair under the EP all-to-all overlap (``parallel.ep_overlap``), played
on a lane. Where the engine carries the all-to-alls as flows (``engine.ep_flows``: ep > 1), the pair's two streams
(:func:`simtrain.plan.ep_overlap.pair_pieces`) are played live, the all-to-alls sharing the links with the DP and
PP traffic of the moment; otherwise the plan's two-stream timeline (:func:`simtrain.plan.ep_overlap.merged_pair`) is
replayed on the lane's compute stream. Either way compute under an all-to-all runs at the overlap slowdown and each
wait for an all-to-all counts as exposed EP time; alone on the network the two agree."""

from __future__ import annotations

from simtrain.engine.comm import _comm_running
from simtrain.engine.lane import Lane
from simtrain.plan import ep_overlap
from simtrain.plan.deepep import ep_overlap_slowdown
from simtrain.plan.schedules import merged_pair_rise


def play_merged_pair(engine, lane: Lane, op, vf: int, vb: int, part: str):
    """Run the forward (op.mb on virtual stage vf) and backward (op.mb2 on vb) merged; the engine's ``_segment``
    times each compute piece (stragglers, jitter, overlap slowdowns apply), the all-to-alls are drawn where the
    plan put them. Inputs were received before and outputs are sent after (the engine's pair)."""
    env = engine.env
    cf, cb = engine.plan.chunks[vf], engine.plan.chunks[vb]
    if engine.ep_flows is not None:   # the all-to-alls as flows on the network, the two streams played live
        freed = cb.act_bytes - (cb.act_w_bytes if part == "input" else 0.0)
        rise = merged_pair_rise(cf.act_bytes, cf.layers, freed, cb.layers)
        engine._alloc(lane, rise)
        yield from _play_live(engine, lane, op, vf, vb)
        engine._free(lane, rise - (cf.act_bytes - freed))
        return
    # a straggling lane's pair is planned with its slower compute, so the all-to-alls meet the compute they hide
    # under (jitter varies every kernel: its pairs keep the nominal plan and draw each piece's own factor)
    scale = lane.slowdown if lane.rng is None else 1.0
    key = ("FBm", vf, vb, scale)
    merged = engine._segments.get(key)
    if merged is None:
        # compute slows while an all-to-all runs: DeepEP's SMs taken, or the hardware file's figure for the fabric
        scenario = engine.plan.scenario
        crosses = engine.plan.placement.crosses_nodes().get("ep", False)
        slow = ep_overlap_slowdown(scenario, crosses)
        merged = engine._segments[key] = ep_overlap.merged_pair(cf, cb, slow, scale)
    # Megatron-Core plays the pair layer by layer and autograd frees each backward layer's tensors as it ends: the
    # pair lifts the rank's activations by merged_pair_rise over its start, and leaves them at + forward - backward
    freed = cb.act_bytes - (cb.act_w_bytes if part == "input" else 0.0)
    rise = merged_pair_rise(cf.act_bytes, cf.layers, freed, cb.layers)
    engine._alloc(lane, rise)
    t0, planned = env.now, 0.0
    for step in merged.compute:
        gap = step.start - planned
        if gap > 0:
            lane.exposed["ep"] += gap
            yield env.timeout(gap)
        mb, v = (op.mb, vf) if step.side == "F" else (op.mb2, vb)
        if step.kind == ep_overlap.AMAX:   # an FP8 amax all-reduce: a latency on its own stream
            yield from engine._segment(lane, "amax", step.kind, step.seconds, mb, v, None)
        else:   # _segment applies the lane's factor again: hand it the nominal seconds of the planned piece
            yield from engine._segment(lane, "compute", step.kind, step.seconds / scale, mb, v, step.layer)
        planned = step.start + step.seconds
    if merged.end > planned:
        lane.exposed["ep"] += merged.end - planned
        yield env.timeout(merged.end - planned)
    for step in merged.comm:
        mb, v = (op.mb, vf) if step.side == "F" else (op.mb2, vb)
        lo, hi = (step.layer, step.layer + 1) if step.layer is not None else (-1, -1)
        engine._record(lane, "ep", step.kind, t0 + step.start, t0 + step.start + step.seconds, mb, v, lo, hi)
    engine._free(lane, rise - (cf.act_bytes - freed))


def _play_live(engine, lane: Lane, op, vf: int, vb: int):
    """The pair's two streams played on the engine (``ep_overlap.pair_pieces``): the compute stream's pieces on the
    lane (``engine._segment``: stragglers, jitter, overlap slowdowns apply), the communication stream's all-to-alls
    as flows on the fluid network (``engine.ep_flows``), where DP buckets and pipeline sends crossing their links slow
    them and are slowed. Each piece waits for the piece it needs; while an all-to-all is in flight the lane's compute
    runs at the overlap slowdown, as the plan's timeline has it (``_comm_running``); the compute stream's waits are
    exposed EP time."""
    env = engine.env
    key = ("FBp", vf, vb)
    pieces = engine._segments.get(key)
    if pieces is None:
        pieces = engine._segments[key] = ep_overlap.pair_pieces(engine.plan.chunks[vf], engine.plan.chunks[vb])
    slow = engine._segments.get("FBslow")
    if slow is None:   # compute slows while an all-to-all runs: DeepEP's SMs taken, or the hardware file's figure
        crosses = engine.plan.placement.crosses_nodes().get("ep", False)
        slow = engine._segments["FBslow"] = ep_overlap_slowdown(engine.plan.scenario, crosses)
    ended: set[int] = set()              # pieces done
    waiting: dict = {}                   # piece -> the event its waiter holds (made only when someone waits)

    def where(side: str) -> tuple[int, int]:
        return (op.mb, vf) if side == "F" else (op.mb2, vb)

    def end(k: int) -> None:
        ended.add(k)
        if k in waiting:
            waiting.pop(k).succeed()

    def wait(k):
        if k not in ended:
            waiting[k] = event = env.event()
            yield event

    def comm_stream():
        for k, (stream, side, kind, layer, seconds, after) in enumerate(pieces):
            if stream != "comm":
                continue
            if after is not None:
                yield from wait(after)
            if seconds > 0:
                mb, v = where(side)
                start = env.now
                _comm_running(lane, slow, +1)
                yield from engine.ep_flows.run(lane, seconds, (mb, v, layer))
                _comm_running(lane, slow, -1)
                lo, hi = (layer, layer + 1) if layer is not None else (-1, -1)
                engine._record(lane, "ep", kind, start, env.now, mb, v, lo, hi)
            end(k)

    comm = env.process(comm_stream())
    for k, (stream, side, kind, layer, seconds, after) in enumerate(pieces):
        if stream != "comp":
            continue
        if after is not None and after not in ended:
            t0 = env.now
            yield from wait(after)
            lane.exposed["ep"] += env.now - t0
        mb, v = where(side)
        yield from engine._segment(lane, "amax" if kind == ep_overlap.AMAX else "compute", kind, seconds, mb, v, layer)
        end(k)
    if not comm.processed:
        t0 = env.now
        yield comm
        lane.exposed["ep"] += env.now - t0
