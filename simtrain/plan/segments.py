"""A chunk's passes as segments the engine runs: ``(stream, kind, seconds, layer)``, layer None for the embedding
or the output layer. Pure functions of a :class:`~simtrain.plan.chunk.ChunkPlan`.

A backward comes in three parts: ``full`` (the whole backward), ``input`` (a split backward's B: the gradient with
respect to the input, which the previous stage waits for) and ``weight`` (its W: the weight-gradient GEMMs alone,
which nothing downstream waits for; Qi et al. 2024, arXiv:2401.10241, Sec. 2). Recompute and the TP collectives
of the backward belong to B: the input gradient needs the recomputed activations and crosses the TP group.
"""

from __future__ import annotations

from simtrain.plan.tp_overlap import exposed_async_allreduce


def _lane_overlap(ar: float, wgrads: tuple, slowdown: float, tp_scale: float) -> float:
    """What a TP segment carrying an asynchronous all-reduce's exposure adds so that the engine's scaling by the
    lane's ``tp_scale`` gives the lane's own exposure (the overlap is not linear in the all-reduce)."""
    own, _ = exposed_async_allreduce(ar, wgrads, slowdown)
    mine, _ = exposed_async_allreduce(ar * tp_scale, wgrads, slowdown)
    return (mine - tp_scale * own) / tp_scale


def forward_segments(c) -> list:
    segs = []
    if c.has_embedding:
        segs.append(("compute", "forward", c.embed_fwd, None))
        if c.embed_tp_fwd > 0:   # the lookup's shards summed across the TP group (plan.edge_tp)
            segs.append(("tp", "tp_comm", c.embed_tp_fwd, None))
    for i in range(c.layers):
        layer = c.layer_lo + i
        fwd, _bwd, _rec, ep_fwd, _ep_bwd, _grads = c.layer_costs(i)
        segs.append(("compute", "forward", fwd, layer))
        segs.append(("tp", "tp_comm", c.tp_fwd(i), layer))
        if c.cp_fwd_hidden > 0:     # KV transfers under the blocks' attention: drawn, not waited for
            segs.append(("cp_hidden", "cp_comm", c.cp_fwd_hidden, layer))
        if c.cp_fwd_layer > 0:
            segs.append(("cp", "cp_comm", c.cp_fwd_layer, layer))
        if ep_fwd > 0:
            segs.append(("ep", "ep_comm", ep_fwd, layer))
    if c.amax_fwd > 0:   # the fp8_autocast region exits: its amaxes all-reduced before the output layer runs
        segs.append(("amax", "amax_allreduce", c.amax_fwd, None))
    if c.has_head:
        segs.append(("compute", "forward", c.head_fwd, None))
        if c.head_tp_fwd > 0:    # the output layer's input gather and the loss's all-reduces
            segs.append(("tp", "tp_comm", c.head_tp_fwd, None))
    return segs


def backward_layers(c, part: str = "full", tp_scale: float = 1.0) -> list:
    """Per layer, in backward order: (layer, its segments) for one part of the backward. A split backward's W is
    each layer's own weight-gradient GEMMs (``layer_wgrad``: a MoE layer's router, experts and shared experts with
    its attention's; a dense leading layer's its own); B is the rest, its all-to-alls included (the expert input
    gradient crosses the EP group, the weight gradients stay local)."""
    out = []
    for i in reversed(range(c.layers)):
        layer = c.layer_lo + i
        segs = []
        if part == "weight":
            segs.append(("compute", "wgrad", c.layer_wgrad(i), layer))
            out.append((layer, segs))
            continue
        _fwd, bwd, rec, _ep_fwd, ep_bwd, _grads = c.layer_costs(i)
        if rec > 0:
            segs.append(("compute", "recompute", rec, layer))
        segs.append(("compute", "backward", bwd - (c.layer_wgrad(i) if part == "input" else 0.0), layer))
        tp_bwd, cp_bwd, cp_hidden = c.bwd_comm(i)
        if part == "input" and i >= c.lead_layers:   # the async all-reduces' weight gradients wait for W
            tp_bwd += c.tp_wgrad_hidden
        elif c.tp_async and tp_scale != 1.0 and i >= c.lead_layers:
            # the engine multiplies TP segments by the lane's scale; the overlap is not linear in the all-reduce, so
            # the segment carries the lane's own exposure over that scale
            ar, w_qkv, w_up, slowdown = c.tp_async
            tp_bwd += _lane_overlap(ar, (w_qkv, w_up), slowdown, tp_scale)
        segs.append(("tp", "tp_comm", tp_bwd, layer))
        if cp_hidden > 0:
            segs.append(("cp_hidden", "cp_comm", cp_hidden, layer))
        if cp_bwd > 0:
            segs.append(("cp", "cp_comm", cp_bwd, layer))
        if ep_bwd > 0:
            segs.append(("ep", "ep_comm", ep_bwd, layer))
        if i == 0 and c.amax_bwd > 0:   # after the backward of the region's first FP8 module (B, not W)
            segs.append(("amax", "amax_allreduce", c.amax_bwd, None))
        out.append((layer, segs))
    return out


def edge_segments(c, part: str, tp_scale: float = 1.0) -> tuple[list, list]:
    """(the output layer's, the embedding's) backward segments for one part; their TP collectives (plan.edge_tp)
    belong to B, the output layer's whole where its weight-gradient GEMM, which hid part of them, moves to W. A
    lane whose TP ring runs ``tp_scale`` times the representative's times its own overlap (as backward_layers)."""
    head_tp = c.head_tp_bwd if part == "full" else c.head_tp_bwd_alone if part == "input" else 0.0
    if part == "full" and c.head_tp_async and tp_scale != 1.0:
        ar, wgrad, slowdown = c.head_tp_async
        head_tp += _lane_overlap(ar, (wgrad,), slowdown, tp_scale)
    embed_tp = c.embed_tp_bwd if part != "weight" else 0.0
    if part == "full":
        head_s, embed_s = c.head_bwd, c.embed_bwd
        kind = "backward"
    else:
        kind = "wgrad" if part == "weight" else "backward"
        head_s = c.head_wgrad if part == "weight" else c.head_bwd - c.head_wgrad
        embed_s = c.embed_wgrad if part == "weight" else c.embed_bwd - c.embed_wgrad
    head, embed = [], []
    if c.has_head:
        if head_s > 0 or part == "full":
            head.append(("compute", kind, head_s, None))
        if head_tp > 0:
            head.append(("tp", "tp_comm", head_tp, None))
    if c.has_embedding:
        if embed_tp > 0:   # the reduce-scatter's backward: the output gradient gathered before the table's
            embed.append(("tp", "tp_comm", embed_tp, None))
        if embed_s > 0 or part == "full":
            embed.append(("compute", kind, embed_s, None))
    return head, embed


def backward_segments(c, part: str = "full", layers: list | None = None, tp_scale: float = 1.0) -> list:
    """A chunk's whole backward part: output layer, layers in reverse, embedding."""
    head, embed = edge_segments(c, part, tp_scale)
    out = list(head)
    for _layer, segs in (backward_layers(c, part) if layers is None else layers):
        out.extend(segs)
    return out + embed
