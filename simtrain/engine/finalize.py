"""The gradient collectives after a lane's DP reduction and before its optimizer step (``plan.grad_finalize``):
the TP all-reduce of the replicated weights' gradients, then the tied embedding's gradient sum between the first
and the last pipeline rank, in Megatron-LM's order (``finalize_model_grads`` @d98e8a6)."""

from __future__ import annotations

from simtrain.engine.lane import Lane


def finalize_gradients(engine, lane: Lane):
    """Both collectives on the lane's critical path. The tied sum starts when both ends have reached it (waiting for
    the other end's backward counts as bubble), then exchanges the gradients (the two ranks' ring all-reduce moves
    the whole tensor each way once), exposed PP time."""
    plan = engine.plan
    tp_sec = plan.replicated_grad_tp[lane.rank] if plan.replicated_grad_tp else 0.0
    if tp_sec > 0:
        yield from engine._segment(lane, "tp", "tp_grad_all_reduce", tp_sec, -1, -1, None)
    nbytes = plan.tied_grad_bytes[lane.rank] if plan.tied_grad_bytes else 0.0
    if nbytes <= 0:
        return
    yield from exchange(engine, lane, engine.pp - 1 - lane.rank, nbytes, "tied", "embedding_grad_sum",
                        rendezvous=True)


def exchange(engine, lane: Lane, partner: int, nbytes: float, tag: str, kind: str, rendezvous: bool):
    """Send ``nbytes`` to pipeline rank ``partner`` (one flow on the cluster graph) and wait for its bytes, recorded
    as ``kind`` on the PP stream; waiting for the partner's bytes past the transfer is bubble, the transfer exposed PP
    time (a pipeline receive's rule). With ``rendezvous`` neither side starts before both have called it (a
    collective); the wait for the other's call is bubble."""
    env = engine.env
    if rendezvous:
        engine._recv_event((lane.dp, (tag + "_ready", lane.rank), -1, "G")).succeed()
        ready = engine._recv_event((lane.dp, (tag + "_ready", partner), -1, "G"))
        if not ready.processed:
            t0 = env.now
            yield ready
            lane.bubble += env.now - t0
            lane.bubble_parts[lane.phase] += env.now - t0
    out = (lane.dp, (tag, partner), -1, "G")
    done = engine._recv_event(out)
    engine.sent_at[out] = env.now
    phase = (engine.classes or engine.plan).pp_phase(nbytes, lane.rank, partner, lane.dp)

    def send():
        start = env.now
        yield from engine.net.run_phase(phase)
        engine._record(lane, "pp", kind, start, env.now, -1, -1, -1, -1, nbytes)
        done.succeed()

    env.process(send())
    yield from engine._wait_recv(lane, (lane.dp, (tag, lane.rank), -1, "G"))
