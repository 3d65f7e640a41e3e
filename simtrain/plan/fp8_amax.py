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
  :data:`PER_PAIR`).
- ``none``: no reduction on the critical path (MXFP8 and blockwise scales are local; an asynchronous TP-only
  reduction, MLPerf v3.1's ``NVTE_ASYNC_AMAX_REDUCTION=1`` with ``NVTE_DP_AMAX_REDUCE_INTERVAL=0``, runs under the
  next chunk's compute).

The payload is a few dozen floats, so each all-reduce costs its latency alone. That latency is NCCL's own tuner
model (NVIDIA/nccl ``src/graph/tuning.cc`` @b6475625, docs/sources.md section 3): the LL protocol, whichever of tree
and ring NCCL's model finds faster:

- tree: ``baseLat + 2((ranks per node - 1) intraLat + log2i(nodes) interLat)``;
- ring: ``baseLat + (2(n - 1) - nInter) intraLat + nInter interLat``, ``nInter = 2(nodes - 1)``.

A "node" here is NCCL's: the GPUs that reach each other without the network (a whole NVLink domain on rack-scale
systems).
"""

from __future__ import annotations

import math

#: NCCL tuning.cc @b6475625, LL protocol, microseconds: base latency per algorithm
BASE_LAT_US = {"tree": 6.8, "ring": 6.6}
#: NCCL tuning.cc @b6475625, LL protocol hardware latencies (us) per hop kind and algorithm
HW_LAT_US = {"nvlink": {"tree": 0.6, "ring": 0.6}, "pci": {"tree": 1.0, "ring": 1.0},
             "net": {"tree": 5.0, "ring": 2.7}}

#: per_linear: reductions per TE column/row-parallel linear pair and micro-batch, (forward, backward), with sequence
#: parallelism. TE's current scaling reduces a quantized tensor's amax over the TP group where the tensor is sharded
#: and then gathered in FP8: a column-parallel linear's input in the forward, a row-parallel linear's output gradient
#: in the backward (TE v2.8 ``module/linear.py`` ``_customize_quantizers_float8_current_scaling``, the same in
#: ``layernorm_linear.py`` and ``layernorm_mlp.py``; ``csrc/quantizer.cpp``: ``allreduce(amax, MAX)->wait()``). A
#: dense layer has two pairs (attention QKV/projection, MLP up/down); a MoE layer one (attention) plus one for its
#: shared experts; routed experts (``GroupedLinear``) reduce nothing
PER_PAIR = (1, 1)


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
    inter_steps = 2 * (nodes - 1) if nodes > 1 else 0
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


def chunk_amax(scenario, placement, c, recompute_factor: float) -> tuple[float, float]:
    """(forward, backward) seconds of the amax all-reduces of chunk ``c`` (a ChunkPlan) per micro-batch
    (``training.fp8_amax_reduction``). ``recompute_factor``: the scenario's TP-collective factor for recompute; the
    linears whose inputs a recomputed forward gathers again quantize them again (current scaling; delayed scaling
    reuses the forward's scales)."""
    tr, par, m = scenario.training, scenario.parallel, scenario.model
    fabric = getattr(scenario.hardware.intra_node, "fabric", "nvswitch")   # explicit device lists: NVLink
    intra = "pci" if fabric == "pcie" else "nvlink"
    if tr.fp8_amax_reduction == "per_chunk":
        one = small_allreduce_s(*group_span(_group(placement, c.rank, tr.fp8_amax_group), placement.domain), intra)
        return one, one
    if tr.fp8_amax_reduction == "per_linear" and par.sequence_parallel and par.tp > 1:
        one = small_allreduce_s(*group_span(placement.tp_group(0, c.rank), placement.domain), intra)
        if m.moe is None:
            pairs = 2 * c.layers
        else:   # leading dense layers: two pairs; MoE layers: attention, and shared experts if any
            pairs = 2 * c.lead_layers + (1 + (m.moe.shared_experts > 0)) * (c.layers - c.lead_layers)
        fwd, bwd = PER_PAIR
        return pairs * fwd * one, pairs * (bwd + fwd * (recompute_factor - 1.0)) * one
    return 0.0, 0.0
