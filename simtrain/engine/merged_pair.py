"""Megatron-Core's merged forward-backward pair under the EP all-to-all overlap (``parallel.ep_overlap``), played
on a lane: the plan's two-stream timeline (:func:`simtrain.plan.ep_overlap.merged_pair`) replayed on the lane's
compute stream (compute under an all-to-all at the hardware's overlap slowdown), each wait for an all-to-all
counted as exposed EP time."""

from __future__ import annotations

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
        # _segment applies the lane's factor again: hand it the nominal seconds of the planned piece
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
