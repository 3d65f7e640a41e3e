"""The gradient collectives after a lane's DP reduction and before its optimizer step (``plan.grad_finalize``):
the TP all-reduce of the replicated weights' gradients, then the embedding's gradient sum between the pipeline ranks
that hold it and its copy, in Megatron-LM's order (``finalize_model_grads`` @d98e8a6)."""

from __future__ import annotations

from simtrain.engine.lane import Lane
from simtrain.plan.grad_finalize import tied_partner


def finalize_gradients(engine, lane: Lane):
    """Both collectives on the lane's critical path: the TP sum as exposed TP time, the embedding sum as the step's
    gradient synchronisation (DP time). The embedding sum starts when both ends have reached it (waiting for the
    other end's backward counts as bubble) and ends for both when both flows have (the two ranks' ring all-reduce
    moves the whole tensor each way once)."""
    plan, env = engine.plan, engine.env
    sec, nbytes = plan.replicated_grad_tp[lane.rank] if plan.replicated_grad_tp else (0.0, 0.0)
    if sec > 0:
        sec *= lane.tp_scale
        lane.exposed["tp"] += sec
        start = env.now
        yield env.timeout(sec)
        engine._record(lane, "tp", "tp_grad_all_reduce", start, env.now, -1, -1, -1, -1, nbytes)
    nbytes = plan.tied_grad_bytes[lane.rank] if plan.tied_grad_bytes else 0.0
    if nbytes <= 0:
        return
    partner = tied_partner(plan.tied_ends, lane.rank)
    # a collective: neither end starts before both have called it
    engine._recv_event((lane.dp, ("tied_ready", lane.rank), -1, "G")).succeed()
    ready = engine._recv_event((lane.dp, ("tied_ready", partner), -1, "G"))
    if not ready.processed:
        t0 = env.now
        yield ready
        lane.bubble += env.now - t0
        lane.bubble_parts[lane.phase] += env.now - t0
    start = env.now
    mine = engine._recv_event((lane.dp, ("tied", partner), -1, "G"))
    env.process(_flow(engine, lane, partner, nbytes, "dp", "embedding_grad_sum", mine))
    yield env.all_of([mine, engine._recv_event((lane.dp, ("tied", lane.rank), -1, "G"))])
    lane.exposed["dp"] += env.now - start


def _flow(engine, lane: Lane, partner: int, nbytes: float, stream: str, kind: str, done):
    """One flow of ``nbytes`` from this lane's rank to pipeline rank ``partner`` on the cluster graph, recorded as
    ``kind`` on ``stream``; ``done`` fires at its end."""
    start = engine.env.now
    yield from engine.net.run_phase((engine.classes or engine.plan).pp_phase(nbytes, lane.rank, partner, lane.dp))
    engine._record(lane, stream, kind, start, engine.env.now, -1, -1, -1, -1, nbytes)
    done.succeed()


def exchange(engine, lane: Lane, partner: int, nbytes: float, tag: str, kind: str):
    """Send ``nbytes`` to pipeline rank ``partner`` and wait for its bytes (DualPipe's mirror sum, PP stream): waiting
    for the partner's bytes past the transfer is bubble, the transfer exposed PP time (a pipeline receive's rule)."""
    out = (lane.dp, (tag, partner), -1, "G")
    engine.sent_at[out] = engine.env.now
    engine.env.process(_flow(engine, lane, partner, nbytes, "pp", kind, engine._recv_event(out)))
    yield from engine._wait_recv(lane, (lane.dp, (tag, lane.rank), -1, "G"))
