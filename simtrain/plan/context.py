"""Context parallelism: one layer's attention when each sequence is split over cp GPUs (Megatron-Core with
Transformer Engine's context-parallel attention; /work/research/schedules_cp.md section 4).

Every token-local operation (norms, linears, MLP, loss) runs on the s/cp tokens a GPU holds, so the layer shape
the costs see has b s / cp tokens. The sequence is cut into 2 cp chunks and CP rank i holds chunks i and 2cp-1-i,
which gives every rank the same causal work: s^2 / (2 cp) query-key pairs per head (a causal s x s attention
computes s^2 / 2 of them). What differs is how the keys and values meet the queries:

- ``p2p`` (ring attention, TE ``AttnFuncWithCPAndKVP2P``): cp steps per layer forward; at each step the GPU runs
  its queries against one KV block, (s/cp)^2 / 2 pairs per head, while it sends the block it holds to the next CP
  rank and receives the next one (steps 0..cp-2 communicate). A step takes max(block attention, KV transfer): the
  transfer is exposed only where it outlasts the block. The backward runs cp steps in reverse; step 0 sends KV,
  steps 1..cp-2 send KV and the accumulated dKV together, and the last dKV goes home after the last step, exposed.
- ``a2a`` (Ulysses, TE ``AttnFuncWithCPAndQKVOA2A``): an all-to-all turns Q, K, V from sequence-split to
  head-split, attention runs over the whole sequence for heads / cp heads, an all-to-all brings the output back;
  the backward mirrors it (dO in; dQ, dK, dV out). On the critical path.
- ``allgather`` (TE ``AttnFuncWithCPAndKVAllGather``, the Llama 3 method): K and V all-gathered before the
  attention (two kernels, one per local query chunk); the backward gathers them again and reduce-scatters dK, dV.
  On the critical path ("The all-gather is not async, and cannot be overlapped", Megatron-Core).

Each step's kernel is timed at the attention curve's efficiency for a sequence of s / cp (a ring block holds the
pair count of a causal s / cp kernel); a2a's one kernel at s.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from simtrain.plan import costs, device
from simtrain.plan.collectives import all_to_all_shape, collective_shape, p2p_phase, phase_time_alone
from simtrain.spec.placement import Placement
from simtrain.spec.scenario import Scenario


@dataclass(frozen=True)
class CPFigures:
    """What context parallelism adds to one layer on one GPU, one micro-batch (seconds; FLOP)."""

    forward: float = 0.0        # attention compute beyond the local-shape kernel layer_cost timed
    backward: float = 0.0
    recompute: float = 0.0      # the same for a recomputed attention
    flops: float = 0.0          # forward FLOP beyond the local shape's (non-causal convention, as model_flops)
    fwd_exposed: float = 0.0    # CP communication on the critical path, forward
    fwd_hidden: float = 0.0     # CP communication under the blocks' attention, forward
    bwd_exposed: float = 0.0    # backward (with a recomputed forward's, where attention is recomputed)
    bwd_hidden: float = 0.0
    step_attention: float = 0.0   # p2p: one ring step's forward attention (s)
    step_transfer: float = 0.0    # p2p: one KV block's transfer to the ring neighbour (s)


def local_shape(shape: costs.LayerShape, cp: int) -> costs.LayerShape:
    """The layer as one CP rank runs it: s / cp of the micro-batch's tokens."""
    return replace(shape, tokens=shape.tokens // cp, seq=shape.seq // cp)


def kv_bytes(shape: costs.LayerShape, element_bytes: int) -> float:
    """K and V of one GPU's tokens (b s/cp), its TP share: 2 b (s/cp) (n_kv d_head / t) e; MLA: per-head keys
    (nope + rope) and values."""
    if shape.mla is not None:
        _q, _kv, nope, rope, v = shape.mla
        width = shape.heads * (nope + rope + v)
    else:
        width = 2 * shape.kv_width
    return shape.tokens * width / shape.tp * element_bytes


def qkvo_bytes(shape: costs.LayerShape, element_bytes: int) -> tuple[float, float]:
    """(Q, K and V; the attention output) of one GPU's tokens, its TP share: the two a2a tensors."""
    qo = shape.tokens * shape.q / shape.tp * element_bytes
    return qo + kv_bytes(shape, element_bytes), qo


def _cached(cluster, key, build):
    hit = cluster.shapes.get(key)
    if hit is None:
        hit = cluster.shapes[key] = build()
    return hit


def ring_transfer_time(scenario: Scenario, placement: Placement, nbytes: float, pp_rank: int) -> float:
    """One ring step: every GPU of the stage sends ``nbytes`` to its CP ring neighbour at once (their flows share
    the links), on the cluster graph."""
    cluster = scenario.cluster
    key = ("cp", "ring", placement.dp, placement.tp, placement.pp, placement.cp, pp_rank, nbytes)

    def build():
        pairs = [(g[c], g[(c + 1) % len(g)]) for g in placement.cp_groups(pp_rank) for c in range(len(g))]
        return phase_time_alone(p2p_phase(nbytes, pairs, cluster), cluster)
    return _cached(cluster, key, build)


def _collective_time(scenario: Scenario, placement: Placement, kind: str, nbytes: float, pp_rank: int) -> float:
    cluster = scenario.cluster
    groups_key = ("cp", kind, placement.dp, placement.tp, placement.pp, placement.cp, pp_rank)
    if kind == "all_to_all":
        shape = _cached(cluster, groups_key, lambda: all_to_all_shape(placement.cp_groups(pp_rank), cluster))
        return phase_time_alone(shape.phase(nbytes), cluster)
    shapes = _cached(cluster, groups_key, lambda: collective_shape(kind, placement.cp_groups(pp_rank), cluster))
    return sum(phase_time_alone(s.phase(nbytes), cluster) for s in shapes)


def cp_figures(scenario: Scenario, placement: Placement, full: costs.LayerShape, dev: device.Device, pp_rank: int,
               attention_recomputed: bool) -> CPFigures:
    """Context parallelism's share of one layer: ``full`` is the layer's shape over the whole sequence (the
    costs of the token-local work come from ``local_shape``), ``attention_recomputed`` whether the backward
    re-runs the attention forward (full recompute, or selective recompute of core_attn)."""
    cp = scenario.parallel.cp
    mode = scenario.parallel.cp_comm
    local = local_shape(full, cp)
    cf = costs.causal_fraction(full)
    # executed forward FLOP per GPU, at the flash kernel's head width (costs.LayerShape.attn_pad), as layer_cost times
    total = costs.attention_flops(full) * cf / cp * full.attn_pad
    own = costs.attention_flops(local) * costs.causal_fraction(local) * local.attn_pad   # what layer_cost timed
    own_f = dev.attention_time(own, local.seq)
    own_b = dev.attention_time(2.5 * own, local.seq, backward=True)   # the backward: 2.5x the forward FLOP
    e = dev.element_bytes
    if mode == "p2p":
        step_f = dev.attention_time(total / cp, local.seq)
        step_b = dev.attention_time(2.5 * total / cp, local.seq, backward=True)
        att_f, att_b = cp * step_f, cp * step_b
        x = ring_transfer_time(scenario, placement, kv_bytes(local, e), pp_rank)
        # forward: steps 0..cp-2 each max(block, transfer), the last block alone
        f_exp = (cp - 1) * max(0.0, x - step_f)
        f_hid = (cp - 1) * min(x, step_f)
        # backward: step 0 sends KV (x), steps 1..cp-2 KV + dKV (2x), the last dKV after the last step (x)
        b_exp = max(0.0, x - step_b) + (cp - 2) * max(0.0, 2 * x - step_b) + x
        b_hid = min(x, step_b) + (cp - 2) * min(2 * x, step_b)
    elif mode == "a2a":
        att_f = dev.attention_time(total, full.seq)
        att_b = dev.attention_time(2.5 * total, full.seq, backward=True)
        step_f = x = 0.0
        qkv, out = qkvo_bytes(local, e)
        f_exp = b_exp = _collective_time(scenario, placement, "all_to_all", qkv, pp_rank) + \
            _collective_time(scenario, placement, "all_to_all", out, pp_rank)
        f_hid = b_hid = 0.0
    else:   # allgather: two kernels, one per local query chunk
        att_f = 2 * dev.attention_time(total / 2, local.seq)
        att_b = 2 * dev.attention_time(2.5 * total / 2, local.seq, backward=True)
        step_f = x = 0.0
        gathered = cp * kv_bytes(local, e)     # the all-gather's output size
        f_exp = _collective_time(scenario, placement, "all_gather", gathered, pp_rank)
        b_exp = f_exp + _collective_time(scenario, placement, "reduce_scatter", gathered, pp_rank)
        f_hid = b_hid = 0.0
    flops = costs.attention_flops(full) / cp - costs.attention_flops(local)
    rec = att_f - own_f if attention_recomputed else 0.0
    if attention_recomputed:
        b_exp += f_exp
        b_hid += f_hid
    return CPFigures(forward=att_f - own_f, backward=att_b - own_b, recompute=rec,
                     flops=flops, fwd_exposed=f_exp, fwd_hidden=f_hid, bwd_exposed=b_exp, bwd_hidden=b_hid,
                     step_attention=step_f, step_transfer=x)


def cp_buffer_bytes(scenario: Scenario, element_bytes: int) -> float:
    """Bytes context parallelism holds while one layer's attention runs, beyond the kept activations
    (schedules_cp.md section 4.6): p2p two receive buffers of the local K and V and the cp per-step partial
    outputs with their fp32 log-sum-exp (kept until the final correction; a full local output each, the
    largest rank's count); allgather the gathered K and V (cp x local); a2a the head-split copies of Q, K, V and
    the output (one local size)."""
    par, tr, m = scenario.parallel, scenario.training, scenario.model
    cp = par.cp
    if cp == 1:
        return 0.0
    at = m.attention
    mla = (at.q_lora_rank or 0, at.kv_lora_rank, at.qk_nope_head_dim, at.qk_rope_head_dim, at.v_head_dim) \
        if at.kind == "mla" else None
    local = costs.LayerShape(tokens=tr.micro_batch * tr.seq_len // cp, seq=tr.seq_len // cp, batch=tr.micro_batch,
                             hidden=m.hidden, ffn=m.ffn_hidden, heads=m.heads, kv_width=m.kv_width,
                             mlp_matrices=m.mlp_matrices, tp=par.tp, sequence_parallel=False, flash=True,
                             q_width=m.q_width if m.q_width != m.hidden else 0, mla=mla)
    kv = kv_bytes(local, element_bytes)
    qkv, out = qkvo_bytes(local, element_bytes)
    if par.cp_comm == "p2p":
        lse = local.tokens * local.heads / local.tp * 4.0
        return 2 * kv + cp * (out + lse)
    if par.cp_comm == "allgather":
        return cp * kv
    return qkv + out
