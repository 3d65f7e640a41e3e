"""FP8 amax all-reduces on the compute stream (``training.fp8_amax_reduction``; docs/model.md section 2.13b).

Transformer Engine's tensorwise FP8 keeps one scale per tensor, set from the tensor's absolute maximum (amax). Where
the ranks that share a tensor must agree on its scale, the amaxes are all-reduced (max), synchronously, in the middle
of the compute: the next FP8 GEMM waits for the reduction.

- ``per_chunk`` (delayed scaling): the amaxes of all the FP8 tensors of one ``fp8_autocast`` region (one model chunk)
  are concatenated and reduced once as the region exits (forward) and once after the backward of the region's first
  FP8 module (the chunk's last backward operation), over the group Megatron passes (``training.fp8_amax_group``).
  TE release_v0.8 ``fp8.py`` (``NVTE_DP_AMAX_REDUCE_INTERVAL`` 1, ``NVTE_ASYNC_AMAX_REDUCTION`` 0, its defaults) and
  ``module.py`` ``_prepare_backward``; TE 1.6 to 2.x ``fp8.py`` ``reduce_and_update_fp8_tensors`` (one buffer per
  direction, ``async_op=False``; skipped for a group of one); Megatron-Core ``transformer_block.py`` (one
  ``fp8_autocast`` per block) and ``parallel_state.get_amax_reduction_group``.
- ``per_linear`` (current scaling): one reduction over the TP group per sequence-parallel FP8 input (see
  :func:`linear_counts`).
- ``none``: no reduction on the critical path (MXFP8 and blockwise scales are local; an asynchronous TP-only
  reduction, MLPerf v3.1's ``NVTE_ASYNC_AMAX_REDUCTION=1`` with ``NVTE_DP_AMAX_REDUCE_INTERVAL=0``, runs under the
  next chunk's compute).

The payload is a few dozen floats, so each all-reduce costs its latency alone. That latency is NCCL's own tuner
model (NVIDIA/nccl ``src/graph/tuning.cc`` @b6475625, docs/sources.md section 3): the LL protocol, whichever of tree
and ring NCCL's model finds faster:

- tree: ``baseLat + 2((ranks per node - 1) intraLat + log2i(nodes) interLat)``;
- ring: ``baseLat + (2(n - 1) - nInter) intraLat + nInter interLat``, ``nInter = 2 nodes`` across nodes (0 in one),
  where an inter-node ring's intraLat is at least the host's network overhead (:data:`NET_OVERHEAD_US`).

A "node" here is NCCL's: the GPUs that reach each other without the network (a whole NVLink domain on rack-scale
systems).
"""

from __future__ import annotations

import math

from simtrain.plan.recompute import modules_of

#: NCCL tuning.cc @b6475625, LL protocol, microseconds: base latency per algorithm
BASE_LAT_US = {"tree": 6.8, "ring": 6.6}
#: NCCL tuning.cc @b6475625, LL protocol hardware latencies (us) per hop kind and algorithm
HW_LAT_US = {"nvlink": {"tree": 0.6, "ring": 0.6}, "pci": {"tree": 1.0, "ring": 1.0},
             "net": {"tree": 5.0, "ring": 2.7}}
#: NCCL tuning.cc @b6475625 ``getNetOverhead``: the floor of an inter-node ring step's intraLat, 1.0 us on Intel x86
#: and non-x86 hosts, 2.0 us on AMD x86. The hardware files do not name the host CPU in a field: 1.0 us throughout,
#: which can only make a ring (the faster of the two only for groups of at most 4 GPUs per node) look faster
NET_OVERHEAD_US = 1.0

#: per_linear, current scaling with sequence parallelism: TE reduces a quantized tensor's amax over the TP group where
#: the tensor is sharded and then gathered in FP8, a column-parallel linear's input in the forward and a row-parallel
#: linear's output gradient in the backward, once per call (TE v2.8 ``module/linear.py``
#: ``_customize_quantizers_float8_current_scaling``, the same in ``layernorm_linear.py`` and ``layernorm_mlp.py``;
#: ``csrc/quantizer.cpp``: ``allreduce(amax, MAX)->wait()``). Per layer, (forward, backward) without recompute:
#: attention 1 + 1 (QKV, projection); multi-head latent attention 2 + 1 (Megatron-Core's up projections of the query
#: and key/value latents are column-parallel on the sequence-parallel latents; the down projections are duplicated
#: ``TELinear``, no reduction); a dense MLP, or a MoE layer's shared experts, 1 + 1 (up, down); routed experts
#: (``GroupedLinear``) none
ATTENTION = {"mha": (1, 1), "mla": (2, 1)}
MLP = (1, 1)


def linear_counts(model, training, dense: bool, recomputed: bool) -> tuple[int, int]:
    """(forward, backward) per_linear reductions of one layer and micro-batch. ``dense``: a dense layer (else a MoE
    layer); ``recomputed``: full recompute covers it. A recomputed forward quantizes the inputs it re-runs again:
    all of them under full recompute; under selective, ``mla_up_proj`` the two latent up projections, ``mlp`` a
    dense layer's MLP, ``moe`` / ``shared_experts`` the shared experts (the modules ``tp_comm.layer_tp_units``
    re-gathers)."""
    attn_f, attn_b = ATTENTION[model.attention.kind]
    mlp = dense or (model.moe is not None and model.moe.shared_experts > 0)
    fwd, bwd = attn_f + MLP[0] * mlp, attn_b + MLP[1] * mlp
    if recomputed:
        return fwd, bwd + fwd
    modules = modules_of(training)
    again = (attn_f if model.attention.kind == "mla" and "mla_up_proj" in modules else 0)
    if mlp and (("mlp" in modules and dense) or (not dense and ("moe" in modules or "shared_experts" in modules))):
        again += MLP[0]
    return fwd, bwd + again


def small_allreduce_s(ranks: int, nodes: int, intra: str = "nvlink") -> float:
    """Seconds of an all-reduce of a few bytes over ``ranks`` GPUs spread evenly over ``nodes`` NCCL nodes, by NCCL's
    tuner model (module docstring); 0 for a group of one."""
    if ranks <= 1:
        return 0.0
    nodes = max(1, min(nodes, ranks))
    per_node = ranks // nodes
    intra_tree, intra_ring = HW_LAT_US[intra]["tree"], HW_LAT_US[intra]["ring"]
    inter_tree, inter_ring = HW_LAT_US["net"]["tree"], HW_LAT_US["net"]["ring"]
    levels = int(math.floor(math.log2(nodes)))
    tree = BASE_LAT_US["tree"] + 2 * ((per_node - 1) * intra_tree + levels * inter_tree)
    inter_steps = 2 * nodes if nodes > 1 else 0
    if nodes > 1:
        intra_ring = max(intra_ring, NET_OVERHEAD_US)
    ring = BASE_LAT_US["ring"] + (2 * (ranks - 1) - inter_steps) * intra_ring + inter_steps * inter_ring
    return min(tree, ring) * 1e-6


def group_span(ranks: list[int], unit) -> tuple[int, int]:
    """(ranks, NCCL nodes) of a group; ``unit(rank)`` names the node (or NVLink domain) a rank sits in."""
    return len(ranks), len({unit(r) for r in ranks})


def _group(placement, rank: int, which: str) -> list[int]:
    """The ranks of one per_chunk amax group on pipeline rank ``rank``: the stage's TP x DP x CP ranks, or the TP x CP
    ranks of its first sequence, or its first TP group."""
    if which == "tp_dp_cp":
        size = placement.tp * placement.dp        # dp counts dp x cp replicas
        return list(range(size * rank, size * (rank + 1)))
    if which == "tp_cp":
        members = placement.cp_group(0, 0, rank)
        return sorted(r for c in members for r in placement.tp_group(placement.coord(c).dp, rank))
    return placement.tp_group(0, rank)


def chunk_amax(scenario, placement, c) -> tuple[float, float]:
    """(forward, backward) seconds of the amax all-reduces of chunk ``c`` (a ChunkPlan) per micro-batch
    (``training.fp8_amax_reduction``); none for a chunk without layers (no FP8 module runs there)."""
    tr, par, m = scenario.training, scenario.parallel, scenario.model
    if c.layers == 0:
        return 0.0, 0.0
    fabric = getattr(scenario.hardware.intra_node, "fabric", "nvswitch")   # explicit device lists: NVLink
    intra = "pci" if fabric == "pcie" else "nvlink"
    if tr.fp8_amax_reduction == "per_chunk":
        one = small_allreduce_s(*group_span(_group(placement, c.rank, tr.fp8_amax_group), placement.domain), intra)
        return one, one
    if tr.fp8_amax_reduction == "per_linear" and par.sequence_parallel and par.tp > 1:
        one = small_allreduce_s(*group_span(placement.tp_group(0, c.rank), placement.domain), intra)
        counts = [linear_counts(m, tr, m.moe is None or i < c.lead_layers, tr.recompute == "full" and c.recomputes(i))
                  for i in range(c.layers)]
        return sum(f for f, _ in counts) * one, sum(b for _, b in counts) * one
    return 0.0, 0.0
