"""``parallel.layers_per_stage: auto``: the layer split whose slowest pipeline rank is fastest, every rank fitting.

Reference article, rule 11: balance stages by compute and memory, not by layer count. The first model stage also
runs the embedding, the last the output layer and the loss (Llama 3, arXiv:2407.21783, Sec. 3.3.2: "we reduce one
Transformer layer each from the first and the last stages"), and early stages of 1F1B-like schedules hold more
micro-batches of activations (the memory ledger's in-flight counts). The split is found from the plan of an even
split: a layer costs the same everywhere, so rank r with n layers takes e_r + n t (t: one layer's forward and
backward with recompute and TP collectives; e_r: its embedding / output-layer work) and needs
M_r + (n - n_r) b_r bytes (b_r: one layer's weights, gradients, optimizer state and in-flight activations on that
rank, with fragmentation). The smallest bound T with sum over ranks of min(cap_r, floor((T - e_r) / t)) >= layers
gives each rank its share; layers beyond the total come off the slowest ranks, and a rank's share goes to its
chunks smallest-time first.
"""

from __future__ import annotations

import dataclasses
import math

from simtrain.plan.activations import activation_bytes_per_layer
from simtrain.plan.build import build_plan
from simtrain.plan.memory import (
    edge_params,
    memory_report,
    rank_edges,
    rank_layers,
    stage_layers,
)
from simtrain.plan.schedules import stage_layout
from simtrain.spec.scenario import Scenario


def _with_split(scenario: Scenario, split: list[int]) -> Scenario:
    par = scenario.parallel.model_copy(update={"layers_per_stage": list(split)})
    out = dataclasses.replace(scenario, parallel=par)
    if "cluster" in scenario.__dict__:    # the cluster graph does not depend on the split
        out.__dict__["cluster"] = scenario.__dict__["cluster"]
    return out


def even_split(layers: int, stages: int) -> list[int]:
    """Layers as even as possible, the extra ones on the middle stages (the edges carry embedding and loss)."""
    base, extra = divmod(layers, stages)
    order = sorted(range(stages), key=lambda v: (v in (0, stages - 1), v))
    split = [base] * stages
    for v in order[:extra]:
        split[v] += 1
    return split


def resolve_split(scenario: Scenario) -> Scenario:
    """The scenario itself, or with ``layers_per_stage: auto`` replaced by the balanced split."""
    if scenario.parallel.layers_per_stage != "auto":
        return scenario
    return _with_split(scenario, balanced_split(scenario))


def balanced_split(scenario: Scenario) -> list[int]:
    par, m = scenario.parallel, scenario.model
    pp, vstages = par.pp, scenario.virtual_stages
    even = even_split(m.layers, vstages)
    base = _with_split(scenario, even)
    rep = memory_report(base)
    if all(st.total > rep.capacity for st in rep.stages):
        # every rank is over with its even share; any split gives some rank at least its even share, and memory grows
        # with layers: nothing fits, and the even split says so as well as any
        return even
    plan = build_plan(base)
    layout = stage_layout(par.schedule, pp, par.vpp)
    c = next(ch for ch in plan.chunks if ch.layers > 0)
    t = c.fwd_layer + c.bwd_layer + c.recompute_layer + c.tp_fwd_layer + c.tp_bwd_layer
    edge = [sum(ch.embed_fwd + ch.embed_bwd + ch.head_fwd + ch.head_bwd + ch.metrics_bwd + ch.edge_tp
                for ch in plan.chunks if ch.rank == r) for r in range(pp)]
    frag = scenario.hardware.memory_overheads.fragmentation
    tr = scenario.training
    sp = par.sequence_parallel and par.tp > 1
    act_layer = activation_bytes_per_layer(
        tr.seq_len, tr.micro_batch, m.hidden, m.heads, ffn=m.ffn_hidden, kv=m.kv_width, mlp=m.mlp, t=par.tp,
        sequence_parallel=sp, attention_scores=not tr.flash_attention, recompute=tr.recompute,
        dropout=tr.dropout) * (2.0 if tr.precision == "fp32" else 1.0)
    caps = []
    for r, st in enumerate(rep.stages):
        n_r = st.layers
        first, last = rank_edges(base, r)
        state = (st.params + st.grads + st.optimizer)
        per_param = state / st.params_local if st.params_local else 0.0
        layer_params = (st.params_local - _edge_count(base, r, first, last)) / n_r if n_r else 0.0
        slope = (layer_params * per_param + act_layer * st.inflight) * (1.0 + frag)
        room = rep.capacity - st.total
        caps.append(n_r + math.floor(room / slope) if slope > 0 else m.layers)
    # lower bounds: every chunk that is neither the first nor the last model stage needs a layer
    need = [sum(1 for v in layout.stages_of(r) if layout.model_stage[v] not in (0, vstages - 1)) for r in range(pp)]
    caps = [max(cap, low) for cap, low in zip(caps, need, strict=True)]   # an over-full rank is reported, not hidden

    def allowed(bound: float) -> list[int]:
        return [max(low, min(cap, math.floor((bound - e) / t + 1e-9))) for cap, e, low in zip(caps, edge, need,
                                                                                               strict=True)]

    candidates = sorted({e + k * t for e in edge for k in range(m.layers + 1)})
    lo, hi = 0, len(candidates) - 1
    if sum(allowed(candidates[hi])) < m.layers:    # memory cannot hold the model: balance time alone
        caps = [m.layers] * pp
    while lo < hi:
        mid = (lo + hi) // 2
        if sum(allowed(candidates[mid])) >= m.layers:
            hi = mid
        else:
            lo = mid + 1
    share = allowed(candidates[lo])
    while sum(share) > m.layers:    # take the surplus off the slowest ranks (the last of equals)
        r = max((r for r in range(pp) if share[r] > need[r]), key=lambda r: (edge[r] + share[r] * t, r))
        share[r] -= 1
    split = [0] * vstages
    for r in range(pp):
        chunks = stage_layers(base, r)
        chunk_edge = {v: plan.chunks[v].embed_fwd + plan.chunks[v].embed_bwd + plan.chunks[v].head_fwd
                      + plan.chunks[v].head_bwd + plan.chunks[v].metrics_bwd + plan.chunks[v].edge_tp
                      for v in chunks}
        count = {v: 0 if layout.model_stage[v] in (0, vstages - 1) else 1 for v in chunks}
        for _ in range(share[r] - sum(count.values())):
            v = min(chunks, key=lambda v: (chunk_edge[v] + count[v] * t, layout.chunk[v]))
            count[v] += 1
        for v, n in count.items():
            split[layout.model_stage[v]] = n
    assert sum(split) == m.layers and sum(rank_layers(_with_split(scenario, split), 0).values()) == share[0]
    return split


def _edge_count(scenario: Scenario, rank: int, first: bool, last: bool) -> int:
    par = scenario.parallel
    return edge_params(scenario.model, par.tp, par.pp, first=first, last=last)
