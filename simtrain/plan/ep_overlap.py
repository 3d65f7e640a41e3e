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
    return fwd - moe + c.tp_fwd_layer + c.cp_fwd_layer, moe, ep_fwd / 2.0


def backward_parts(c, i: int) -> tuple[float, float, float, float, float]:
    """(attention input gradient with recompute and collectives, its weight gradient, MoE input gradient, MoE weight
    gradient, one all-to-all) of chunk ``c``'s i-th layer backward."""
    _fwd, bwd, rec, _ep_fwd, ep_bwd, _grads = c.layer_costs(i)
    tp_bwd, cp_bwd, _hidden = c.bwd_comm(i)
    wgrad = c.layer_wgrad(i)
    moe, moe_w = (c.moe_bwd_layer, c.moe_wgrad_layer) if ep_bwd > 0 else (0.0, 0.0)
    attn_w = wgrad - moe_w
    return rec + bwd - moe - attn_w + tp_bwd + cp_bwd, attn_w, moe - moe_w, moe_w, ep_bwd / 2.0


class _Streams:
    """The two streams as they fill: each piece starts when its stream is free and its input is ready."""

    def __init__(self) -> None:
        self.comp_t = self.comm_t = 0.0
        self.compute: list[Step] = []
        self.comm: list[Step] = []

    def run(self, side: str, kind: str, layer, seconds: float, ready: float = 0.0) -> float:
        start = max(self.comp_t, ready)
        if seconds > 0:
            self.compute.append(Step(side, kind, layer, start, seconds))
        self.comp_t = start + seconds
        return self.comp_t

    def send(self, side: str, layer, seconds: float, ready: float) -> float:
        start = max(self.comm_t, ready)
        if seconds > 0:
            self.comm.append(Step(side, "ep_comm", layer, start, seconds))
        self.comm_t = start + seconds
        return self.comm_t


def merged_pair(cf, cb) -> Merged:
    """The merged forward of chunk ``cf`` and backward of chunk ``cb`` (module docstring)."""
    s = _Streams()
    f_in = s.run("F", "forward", None, cf.embed_fwd) if cf.has_embedding else 0.0
    b_in = s.run("B", "backward", None, cb.head_bwd) if cb.has_head else 0.0
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
    if cf.has_head:
        s.run("F", "forward", None, cf.head_fwd, f_in)
    if cb.has_embedding:
        s.run("B", "backward", None, cb.embed_bwd, b_in)
    if cb.metrics_bwd > 0:
        s.run("B", "backward", None, cb.metrics_bwd, b_in)
    return Merged(tuple(s.compute), tuple(s.comm), max(s.comp_t, f_in, b_in))
