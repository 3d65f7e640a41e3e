"""The estimate's pipeline term for schedules that split the backward or overlap pairs (``zb-h1``, ``zb-v``,
``dualpipe``, ``dualpipev``): their op lists played out with fixed times, no simpy.

Each rank runs its ops in order; an op starts when the rank is free and its inputs are there: F after the previous
stage's F and the send between them, B after its own F and the next stage's B and their send, W after its B; an
"FB" pair after both halves' inputs, taking both halves' time (the engine runs them at once with their compute
taking turns, so only their communication can hide). With every op at its plan time alone and sends timed alone,
each rank's end is a time the engine cannot beat (it adds only waits and shared links), so the same play with
lower-bound op times bounds the step from below (module docstring of :mod:`simtrain.decide.estimate`).
"""

from __future__ import annotations

from simtrain.plan.build import Plan
from simtrain.plan.chunk import ChunkPlan
from simtrain.plan.schedules import split_backwards


def weight_time(c: ChunkPlan) -> float:
    """A split backward's W: the weight-gradient GEMMs of the chunk's layers (each its own: dense leading layers and
    MoE layers differ) and of its edges."""
    if not c.lead_layers:
        return c.layers * c.wgrad_layer + c.head_wgrad + c.embed_wgrad
    return sum(c.layer_wgrad(i) for i in range(c.layers)) + c.head_wgrad + c.embed_wgrad


def play(plan: Plan, send: dict, scale: float = 1.0, pair_compute_only: bool = False) -> tuple[list[float], list]:
    """(each rank's end, each rank's (F+B+W work)) for the plan's schedule; op times x ``scale``. ``send[(v, w)]``:
    seconds from virtual stage v to w. ``pair_compute_only``: a pair counts its compute alone (a bound: its TP,
    CP and EP collectives may run under the other half's compute)."""
    layout, chunks = plan.layout, plan.chunks
    pp = len(plan.schedule)
    splits = [split_backwards(ops) for ops in plan.schedule]

    def dur(r: int, kind: str, ch: int, paired: bool, split: bool) -> float:
        c = chunks[layout.v_of(r, ch)]
        # a pair's TP, CP and EP collectives may run under the other half's compute: the bound leaves them out
        hidden = paired and pair_compute_only
        moe = c.layers - c.lead_layers
        tp_f = c.tp_totals[0] + c.layers * c.cp_fwd_layer + moe * c.ep_fwd_layer if hidden else 0.0
        tp_b = c.tp_totals[1] + c.layers * c.cp_bwd_layer + moe * c.ep_bwd_layer if hidden else 0.0
        if kind == "F":
            return (c.forward_time - tp_f) * scale
        if kind == "W":
            return weight_time(c) * scale
        w = weight_time(c) if split else 0.0
        # a split B waits for the TP all-reduces a whole backward hides under its weight gradients (segments.py)
        back = (c.layers - c.lead_layers) * c.tp_wgrad_hidden if split and not hidden else 0.0
        if split:   # and the output layer's collectives its weight-gradient GEMM hid (plan.edge_tp)
            back += c.head_tp_bwd_alone - c.head_tp_bwd
        return (c.backward_time - w - tp_b + back) * scale

    # an op's duration depends on its rank, kind, chunk, pairing and (a B) whether it is split, not on its
    # micro-batch: each is computed once
    durations: dict = {}
    prev, nxt = layout.prev, layout.next
    n_v = len(prev)
    n_mb = 1 + max((max(op.mb, op.mb2 if op.kind == "FB" else 0) for ops in plan.schedule for op in ops), default=0)
    kinds = {"F": 0, "B": 1, "W": 2}

    def ident(kind: str, v: int, mb: int) -> int:
        """An op part's index in ``done``: (kind, virtual stage, micro-batch) as one integer."""
        return (kinds[kind] * n_v + v) * n_mb + mb

    v_of: dict = {}
    # per rank, per op: its parts' indices, its dependencies [(index, send seconds)] and its duration
    prepared = []
    for r, ops in enumerate(plan.schedule):
        rows = []
        split_here = splits[r]
        for op in ops:
            paired = op.kind == "FB"
            parts = [("F", op.mb, op.chunk), ("B", op.mb2, op.chunk2)] if paired else [(op.kind, op.mb, op.chunk)]
            keys, deps, took = [], [], 0.0
            for kind, mb, ch in parts:
                v = v_of.get((r, ch))
                if v is None:
                    v = v_of[(r, ch)] = layout.v_of(r, ch)
                keys.append(ident(kind, v, mb))
                dkey = (r, kind, ch, paired, kind == "B" and (mb, ch) in split_here)
                d = durations.get(dkey)
                if d is None:
                    d = durations[dkey] = dur(*dkey)
                took += d
                if kind == "F":
                    if prev[v] >= 0:
                        deps.append((ident("F", prev[v], mb), send.get((prev[v], v), 0.0)))
                elif kind == "W":
                    deps.append((ident("B", v, mb), 0.0))
                else:
                    deps.append((ident("F", v, mb), 0.0))
                    if nxt[v] >= 0:
                        deps.append((ident("B", nxt[v], mb), send.get((nxt[v], v), 0.0)))
            rows.append((keys, deps, took))
        prepared.append(rows)

    done = [-1.0] * (3 * n_v * n_mb)     # when each op part ends; -1: not yet
    pos, free, work = [0] * pp, [0.0] * pp, [0.0] * pp
    waiting: dict[int, list[int]] = {}   # an op part not done yet -> the ranks blocked on it
    runnable = list(range(pp - 1, -1, -1))
    while runnable:        # an op's times depend only on its inputs' and its rank's: any order gives the same
        r = runnable.pop()
        rows = prepared[r]
        at, start_free, done_work = pos[r], free[r], work[r]
        while at < len(rows):
            keys, deps, took = rows[at]
            start = start_free
            for key, delay in deps:
                t = done[key]
                if t < 0.0:
                    waiting.setdefault(key, []).append(r)
                    break
                if t + delay > start:
                    start = t + delay
            else:
                end = start + took
                for key in keys:
                    done[key] = end
                    runnable.extend(waiting.pop(key, ()))
                start_free, done_work = end, done_work + took
                at += 1
                continue
            break
        pos[r], free[r], work[r] = at, start_free, done_work
    if any(at < len(rows) for at, rows in zip(pos, prepared)):
        raise AssertionError(f"schedule deadlocks at {pos}")   # an internal invariant: the op lists are sound
    return free, work
