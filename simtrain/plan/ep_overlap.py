"""Megatron-Core's EP all-to-all overlap (``parallel.ep_overlap``): one merged forward-backward pair ("FB") as the
timeline of a compute stream and a communication stream. Pure: the engine replays it.

Megatron-Core (NVIDIA/Megatron-LM at d98e8a6) runs a merged pair layer by layer
(``TransformerModelChunkSchedulePlan.run``): the forward chunk's embedding and the backward chunk's loss and
output layer first, then forward layer i with backward layer n - 1 - i, then the backward's remaining layers, then
the forward's, then the forward's output layer and the backward's embedding. Within one layer pair
(``TransformerLayerSchedulePlan.run``, with ``--delay-wgrad-compute``) the compute stream runs, in this order,

    attention forward (+ router) | MLP input-gradient, MLP weight-gradient, MLP forward | attention backward, its
    weight gradient

and the communication stream

    combine backward | dispatch forward, dispatch backward | combine forward

each all-to-all waiting for the compute that produces its input (the dispatch backward for the MLP's input
gradient only: its weight gradient is delayed to run under it), each compute for the all-to-all that feeds it. So
each all-to-all hides under the other micro-batch's compute listed above it and shows only by what that compute
leaves uncovered: max(0, a2a - overlapping compute). The TP collectives run inside the attention and MLP modules
on the compute stream (counted with them here).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Step:
    """One piece of a merged pair: its side ("F" or "B"), kind, layer (None for the embedding or output layer),
    planned start (s from the pair's start) and seconds."""

    side: str
    kind: str
    layer: int | None
    start: float
    seconds: float


@dataclass(frozen=True)
class Merged:
    compute: tuple[Step, ...]   # the compute stream, in order
    comm: tuple[Step, ...]      # the all-to-alls, in order
    end: float                  # s, when both halves are done


def forward_parts(c, i: int) -> tuple[float, float, float]:
    """(attention part with its TP and CP collectives, MoE block, one all-to-all) of chunk ``c``'s i-th layer
    forward; a dense layer has no MoE part or all-to-all."""
    fwd, _bwd, _rec, ep_fwd, _ep_bwd, _grads = c.layer_costs(i)
    moe = c.moe_fwd_layer if ep_fwd > 0 else 0.0
    return fwd - moe + c.tp_fwd(i) + c.cp_fwd_layer, moe, ep_fwd / 2.0


def backward_parts(c, i: int) -> tuple[float, float, float, float, float]:
    """(attention input gradient with recompute and collectives, its weight gradient, MoE input gradient, MoE weight
    gradient, one all-to-all) of chunk ``c``'s i-th layer backward."""
    _fwd, bwd, rec, _ep_fwd, ep_bwd, _grads = c.layer_costs(i)
    tp_bwd, cp_bwd, _hidden = c.bwd_comm(i)
    wgrad = c.layer_wgrad(i)
    moe, moe_w = (c.moe_bwd_layer, c.moe_wgrad_layer) if ep_bwd > 0 else (0.0, 0.0)
    attn_w = wgrad - moe_w
    return rec + bwd - moe - attn_w + tp_bwd + cp_bwd, attn_w, moe - moe_w, moe_w, ep_bwd / 2.0


#: the kind of a merged pair's FP8 amax all-reduce piece (played on the engine's amax stream)
AMAX = "amax_allreduce"


class _Streams:
    """The two streams' programs: each piece waits for the piece before it on its stream and for the piece whose
    output it needs (``after``); :meth:`play` times them."""

    def __init__(self, scale: float = 1.0) -> None:
        self.pieces: list[tuple[str, str, str, int | None, float, int | None]] = []   # stream, side, kind, ...
        self.scale = scale          # compute seconds x scale: a straggling GPU's kernels

    def run(self, side: str, kind: str, layer, seconds: float, after: int | None = None) -> int:
        self.pieces.append(("comp", side, kind, layer, seconds * self.scale, after))
        return len(self.pieces) - 1

    def wait_amax(self, side: str, seconds: float, after: int | None) -> int:
        """An FP8 amax all-reduce the compute stream waits for (plan.fp8_amax): a latency, neither scaled with a
        straggler's kernels nor slowed under an all-to-all."""
        self.pieces.append(("comp", side, AMAX, None, seconds, after))
        return len(self.pieces) - 1

    def send(self, side: str, layer, seconds: float, after: int | None) -> int:
        self.pieces.append(("comm", side, "ep_comm", layer, seconds, after))
        return len(self.pieces) - 1

    def play(self, slowdown: float) -> Merged:
        """Times of every piece: an all-to-all takes its seconds; compute runs ``slowdown`` times slower while an
        all-to-all is in flight (the hardware file's overlap slowdown, as under the DP collectives)."""
        end: dict[int, float] = {}
        queues = {name: [k for k, piece in enumerate(self.pieces) if piece[0] == name] for name in ("comp", "comm")}
        pos = {"comp": 0, "comm": 0}
        free = {"comp": 0.0, "comm": 0.0}
        started: dict[int, float] = {}
        running: dict[str, int | None] = {"comp": None, "comm": None}
        left = {"comp": 0.0}                # work (s at full speed) the running compute piece still has
        now = 0.0
        while len(end) < len(self.pieces):
            for name in ("comm", "comp"):   # start what can start now
                if running[name] is None and pos[name] < len(queues[name]):
                    k = queues[name][pos[name]]
                    after = self.pieces[k][5]
                    if after is None or after in end:
                        t = max(free[name], end.get(after, 0.0))
                        if t <= now:
                            running[name], started[k] = k, now
                            left[name] = self.pieces[k][4]
            events = []
            for name in ("comm", "comp"):
                k = running[name]
                if k is None and pos[name] < len(queues[name]):
                    after = self.pieces[queues[name][pos[name]]][5]
                    if after is None or after in end:
                        events.append(max(free[name], end.get(after, 0.0)))
            if running["comm"] is not None:
                events.append(started[running["comm"]] + self.pieces[running["comm"]][4])
            comp = running["comp"]
            rate = slowdown if running["comm"] is not None and (comp is None or self.pieces[comp][2] != AMAX) else 1.0
            if running["comp"] is not None:
                events.append(now + left["comp"] * rate)
            t = min(events)
            if running["comp"] is not None:
                left["comp"] -= (t - now) / rate
            now = t
            for name in ("comm", "comp"):   # finish what ends now
                k = running[name]
                if k is None:
                    continue
                done = (now >= started[k] + self.pieces[k][4]) if name == "comm" else left["comp"] <= 1e-12 * max(
                    1.0, self.pieces[k][4])
                if done:
                    end[k], free[name], running[name] = now, now, None
                    pos[name] += 1
        steps = {name: tuple(Step(side, kind, layer, started[k], end[k] - started[k])
                             for k, (stream, side, kind, layer, seconds, _a) in enumerate(self.pieces)
                             if stream == name and seconds > 0) for name in ("comp", "comm")}
        return Merged(steps["comp"], steps["comm"], max(end.values(), default=0.0))


def merged_pair(cf, cb, slowdown: float = 1.0, scale: float = 1.0) -> Merged:
    """The merged forward of chunk ``cf`` and backward of chunk ``cb`` (module docstring), compute ``slowdown``
    times slower while an all-to-all runs and every compute piece ``scale`` times its nominal seconds (a straggler)."""
    return pair_program(cf, cb, scale).play(slowdown)


def pair_pieces(cf, cb) -> list[tuple[str, str, str, int | None, float, int | None]]:
    """The merged pair's program, untimed: (stream "comp" or "comm", side, kind, layer, nominal seconds, index of the
    piece it waits for or None), each stream's pieces in order; the engine plays it with the all-to-alls as flows
    (``engine.merged_pair``)."""
    return pair_program(cf, cb).pieces


def pair_program(cf, cb, scale: float = 1.0) -> _Streams:
    """The two streams' programs of a merged pair (``merged_pair``), not yet timed."""
    s = _Streams(scale)
    # the edges' TP collectives with their compute, as a layer's are (forward_parts)
    f_in = s.run("F", "forward", None, cf.embed_fwd + cf.embed_tp_fwd) if cf.has_embedding else None
    b_in = s.run("B", "backward", None, cb.head_bwd + cb.head_tp_bwd) if cb.has_head else None
    nf, nb = cf.layers, cb.layers
    pairs = min(nf, nb)
    # forward layer i with backward layer nb - 1 - i, then the backward's remaining layers, then the forward's
    order = [(i, nb - 1 - i) for i in range(pairs)] + [(None, nb - 1 - i) for i in range(pairs, nb)] + \
        [(i, None) for i in range(pairs, nf)]
    for f, j in order:
        fl = cf.layer_lo + f if f is not None else None
        bl = cb.layer_lo + j if j is not None else None
        if j is not None:
            pre_b, attn_w, mlp_b, mlp_w, a2a_b = backward_parts(cb, j)
            combine_b = s.send("B", bl, a2a_b, b_in)
        if f is not None:
            pre_f, mlp_f, a2a_f = forward_parts(cf, f)
            pre_f_end = s.run("F", "forward", fl, pre_f, f_in)
        if j is not None:
            mlp_b_end = s.run("B", "backward", bl, mlp_b, combine_b)
        if f is not None:
            dispatch_f = s.send("F", fl, a2a_f, pre_f_end)
        if j is not None:
            s.run("B", "wgrad", bl, mlp_w)
            dispatch_b = s.send("B", bl, a2a_b, mlp_b_end)
        if f is not None:
            mlp_f_end = s.run("F", "forward", fl, mlp_f, dispatch_f)
            f_in = s.send("F", fl, a2a_f, mlp_f_end)
        if j is not None:
            b_in = s.run("B", "backward", bl, pre_b, dispatch_b)
            s.run("B", "wgrad", bl, attn_w)
    if cf.amax_fwd > 0:   # the FP8 amax all-reduces the compute waits for (plan.fp8_amax)
        f_in = s.wait_amax("F", cf.amax_fwd, f_in)
    if cb.amax_bwd > 0:
        b_in = s.wait_amax("B", cb.amax_bwd, b_in)
    if cf.has_head:
        s.run("F", "forward", None, cf.head_fwd + cf.head_tp_fwd, f_in)
    if cb.has_embedding:
        s.run("B", "backward", None, cb.embed_bwd + cb.embed_tp_bwd, b_in)
    if cb.metrics_bwd > 0:
        s.run("B", "backward", None, cb.metrics_bwd, b_in)
    return s
