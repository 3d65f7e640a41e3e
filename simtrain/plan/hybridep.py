"""NVIDIA's HybridEP dispatch and combine kernels (``parallel.moe_dispatcher: hybridep``), as Megatron-Core's flex
token dispatcher calls them, timed from HybridEP's published bandwidths on the cluster graph.

What it moves (deepseek-ai/DeepEP branch hybrid-ep @94a9f8f, docs/Hybrid-EP_Implementation.md section 8, "RDMA
communication pattern"): as DeepEP's normal kernels (``plan.deepep``), a token goes once to every EP rank that holds
one of its experts, and across NVLink domains once to every destination domain over RDMA, to the GPU of the same
local index ("peers"), which forwards it over NVLink; the IB transfer overlaps the NVLink forwarding. Megatron-Core
calls it with BF16 hidden states both ways (megatron/core/transformer/moe/fused_a2a.py @d98e8a6,
``init_hybrid_ep_buffer``: "assert not fp8_dispatch, 'HybridEP dispatcher does not support fp8 dispatch now'"; the
combine kernel is BF16 only, Hybrid-EP_Implementation.md section 8) through ``dispatch_with_permute`` and
``combine_with_unpermute`` (the Torch API). Megatron-Bridge's performance scripts give it 32 SMs
(scripts/performance/utils/overrides.py @v0.4.0, v0.4.2, v0.5.0: ``recipe.model.moe_hybridep_num_sms = 32`` for
every hybridep recipe); Megatron-Core alone leaves the count to HybridEP (24 in one NVLink domain, 8 across,
csrc/hybrid_ep/config.cuh ``Configurer``).

How fast: docs/README_Hybrid-EP.md (hybrid-ep @94a9f8f; the tables of commits 1dddd19 and 6ad6896) publishes
"algorithm bandwidth" at 4,096 tokens x hidden 7,168, top 8, 8 local experts, uniform random routing, Torch API
(the call Megatron-Core makes) and kernel-only. Its logical bytes are DeepEP's: NVLink = tokens a rank receives x
hidden x 2 (tests/test_mnnvlink_hybridep.py @6ad6896: ``dispatched_hidden.numel() * 2``), RDMA = (token,
destination node) pairs x hidden x 2, the own node included (tests/test_hybrid_ep.py and tests/utils.py
``count_rdma_send_from_routing_map`` @1dddd19: "we do not set the local node map to zeros"). simtrain uses:

- **one NVLink domain**: B200 EP 8 at 16 SMs, dispatch (BF16) 535.94 GB/s, combine 530.86 GB/s (Torch API), over
  B200's 900 GB/s NVLink per direction (NVIDIA DGX B200 user guide: 1.8 TB/s bidirectional per GPU);
- **across domains**: H100 EP 16, 32, 64 at 4, 8, 16 SMs, IB bandwidth (Torch API, BF16 dispatch and combine),
  over 50 GB/s per GPU. The README names no NIC; its figures need at least a 400 Gb/s one: at EP 16, 57.74 GB/s of
  logical RDMA bytes of which about half leave the node is 29 GB/s on the wire (EP 64: 36 GB/s), above a 200 Gb/s
  NIC's 25 GB/s, and a DGX H100 carries one 400 Gb/s ConnectX-7 per GPU (DeepEP's stated ~50 GB/s).

Each figure over its link's stated maximum is an efficiency on the *nominal* bandwidth of the links its hop uses
(the hardware file's bandwidth before its NCCL efficiency), so on the published platform a hop takes exactly
logical bytes / published bandwidth (+ the path's latency). Across domains the published figure is the whole
kernel's time expressed in RDMA bytes: it already covers the NVLink forwarding it pipelines, so that hop alone sets
the time. The SM count: the figure at the largest published count not above the 32 SMs used (16); the tables
saturate there (EP 32 and 64 change by under 4% from 8 to 16 SMs).

Outside the figures simtrain refuses rather than extrapolates (``spec.scenario_rules``): a GPU other than B200
within one NVLink domain, other than Hopper (H100, H200, H800: the same GH100 die and SM count) across domains, an EP
group over more than 8 domains (the figures fall with the group: 54.47, 47.36, 41.24 GB/s at 2, 4, 8 nodes, so the
trend beyond is not readable), an EP group that is not whole NVLink domains of equal parts (HybridEP asserts
``group_size % ranks_per_nvlink_domain == 0``, deep_ep/hybrid_ep_buffer.py), and the rest that DeepEP refuses.
Between the published node counts (3, 5 to 7 nodes) the figure is interpolated linearly in the node count.
Applied to other token counts and hidden sizes at the same rate: the fixed part of a call (the routing map's
all-gather, the preprocessing kernel) is not separated in the figures.
"""

from __future__ import annotations

from simtrain.plan.costs_moe import MoEShape
from simtrain.plan.deepep import HYBRIDEP_NUM_SMS, _hop_time, destinations, hop_shapes
from simtrain.spec.placement import Placement
from simtrain.spec.scenario import Scenario

NUM_SMS = HYBRIDEP_NUM_SMS   # Megatron-Bridge's performance recipes (overrides.py @v0.5.0), also under EP overlap
WIRE_BYTES = 2        # BF16 both ways (Megatron-Core fused_a2a.py asserts no FP8 dispatch)

# docs/README_Hybrid-EP.md @94a9f8f, "H100 Platform", Torch API columns, BF16 dispatch and combine (GB/s of logical
# RDMA bytes): EP ranks -> SM count -> (dispatch, combine). 8 GPUs per node: 16, 32, 64 ranks = 2, 4, 8 nodes.
H100_RDMA = {
    2: {4: (37.08e9, 42.47e9), 8: (57.74e9, 56.96e9), 16: (54.47e9, 53.35e9)},
    4: {4: (44.88e9, 43.60e9), 8: (46.54e9, 50.68e9), 16: (47.36e9, 52.53e9)},
    8: {4: (40.63e9, 41.00e9), 8: (41.46e9, 47.68e9), 16: (41.24e9, 46.57e9)},
}
RDMA_MAX = 50e9       # B/s, one 400 Gb/s ConnectX-7 per GPU (DGX H100; DeepEP docs "~50 GB/s")
# docs/README_Hybrid-EP.md @94a9f8f, "B200 Platform", HybridEP Torch API at 16 SMs, EP 8: (dispatch BF16, combine)
B200_NVLINK = {16: (535.94e9, 530.86e9)}
NVLINK_MAX = {"B200": 900e9}   # B/s per direction, NVLink 5 (DGX B200 user guide: 1.8 TB/s bidirectional per GPU)
#: GPU name prefixes whose RDMA figures are H100's (the same GH100 die: 132 SMs, same NVLink and NIC per GPU)
HOPPER = ("H100", "H200", "H800")
MAX_NODES = max(H100_RDMA)


def _at_sms(table: dict[int, tuple[float, float]]) -> tuple[float, float]:
    """The figure at the largest published SM count not above the SMs used."""
    return table[max(s for s in table if s <= NUM_SMS)]


def rdma_figure(nodes: int) -> tuple[float, float]:
    """(dispatch, combine) logical RDMA bytes/s of an EP group over ``nodes`` NVLink domains (2 to 8; between
    published counts linear in the node count)."""
    if nodes in H100_RDMA:
        return _at_sms(H100_RDMA[nodes])
    lo = max(n for n in H100_RDMA if n < nodes)
    hi = min(n for n in H100_RDMA if n > nodes)
    a, b = _at_sms(H100_RDMA[lo]), _at_sms(H100_RDMA[hi])
    w = (nodes - lo) / (hi - lo)
    return a[0] + w * (b[0] - a[0]), a[1] + w * (b[1] - a[1])


def nvlink_figure(gpu_name: str) -> tuple[float, float, float]:
    """(dispatch, combine, stated maximum) bytes/s of one NVLink domain on the GPU."""
    dispatch, combine = _at_sms(B200_NVLINK)
    return dispatch, combine, NVLINK_MAX["B200"]


def hybridep_time(scenario: Scenario, placement: Placement, msh: MoEShape, pp_rank: int) -> float:
    """Seconds of one MoE layer's dispatch and combine through HybridEP on one stage, every EP group of the stage
    running at once."""
    cluster, hw = scenario.cluster, scenario.hardware
    groups = placement.ep_groups(pp_rank)
    nvl_shape, rdma_shape, rails = hop_shapes(scenario, placement, pp_rank)
    token_bytes = msh.routed_tokens * msh.imbalance * msh.hidden * WIRE_BYTES     # dropless (capacity is refused)
    nodes = len(rails[0]) if rails else 1
    ranks, node_count = destinations(scenario, placement, msh, groups, nodes)
    total = 0.0
    if nodes == 1:
        dispatch, combine, stated = nvlink_figure(hw.gpu.name)
        for figure in (dispatch, combine):      # efficiency on the nominal NVLink: / the file's NCCL efficiency
            total += _hop_time(cluster, nvl_shape, token_bytes * ranks,
                               figure / stated / hw.intra_node.efficiency, "nvlink")
        return total
    for figure in rdma_figure(nodes):
        total += _hop_time(cluster, rdma_shape, token_bytes * node_count,
                           figure / RDMA_MAX / hw.inter_node.efficiency, "rdma")
    return total
