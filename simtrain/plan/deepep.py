"""DeepEP's normal (high-throughput) dispatch and combine kernels (``parallel.moe_dispatcher: deepep``), as
Megatron-Core's flex token dispatcher calls them, on the cluster graph.

What it moves (deepseek-ai/DeepEP docs/legacy.md, "DeepEP V1"; tests/test_internode.py @92fe2de): a token goes
once to every *rank* that holds one of its top-k experts (not once per expert, as the alltoall dispatcher's
permuted rows do), and across nodes once to every destination *node* over RDMA (to the GPU of the same local index
there), which forwards it over NVLink to the ranks of that node that need it. Megatron-Core's ``_DeepepManager``
(NVIDIA/Megatron-LM megatron/core/transformer/moe/token_dispatcher.py @d98e8a6) passes the BF16 hidden states to
``Buffer.dispatch`` (no FP8 tuple, also under FP8 training) and gives DeepEP 20 SMs
(``moe_flex_dispatcher_num_sms`` unset -> 20, DeepEP's ``Buffer.num_sms = 20``).

How fast: DeepEP's published "bottleneck bandwidth" of the normal kernels on H800 (~160 GB/s NVLink, one CX7
400 Gb/s NIC (~50 GB/s) per GPU; docs/legacy.md "Normal kernels with NVLink and RDMA forwarding") is a *logical*
rate: NVLink bytes = tokens received x hidden x 2 (each rank's own tokens included), RDMA bytes = (token,
destination node) pairs x hidden x 2 (the own node included). simtrain takes each figure over DeepEP's stated
maximum as an efficiency on the links the flows use (their bandwidth as the cluster graph has it): flows from each
GPU to the n - 1 other members of its hop (the node's EP ranks over NVLink; the same-index GPUs of the other nodes
over RDMA) carry the logical bytes / (n - 1), so alone on a GPU's port the hop takes
``logical bytes / (efficiency x link bandwidth) + latency``. Across nodes the two hops are pipelined (DeepEP
forwards chunks as they arrive): the slower hop sets the time.

The expected distinct destinations of a token whose top-k experts are spread uniformly over ``parts`` equal
parts of E experts (force-balanced routing, as the published benchmarks run) is the hypergeometric
``parts x (1 - C(E - E/parts, k) / C(E, k))``; with group-limited routing (``moe.n_group``/``topk_group``) it is
:func:`simtrain.plan.routing.expected_parts` over the experts each EP rank and each node of the group holds.
"""

from __future__ import annotations

from collections import defaultdict
from math import comb

from simtrain.plan.collectives import all_to_all_shape, phase_time_alone, stage_shape
from simtrain.plan.costs_moe import MoEShape
from simtrain.plan.routing import expected_parts, rank_parts
from simtrain.spec.placement import Placement
from simtrain.spec.scenario import Scenario

# deepseek-ai/DeepEP docs/legacy.md @dd758ca (= README.md @92fe2de), "Normal kernels with NVLink and RDMA
# forwarding", H800: bottleneck bandwidth over the stated maxima (~160 GB/s NVLink, ~50 GB/s CX7 RDMA).
NVLINK_MAX = 160e9                               # B/s, "H800 (~160 GB/s NVLink maximum bandwidth)"
RDMA_MAX = 50e9                                  # B/s, "CX7 InfiniBand 400 Gb/s RDMA network card (~50 GB/s ...)"
NVLINK_FIGURES = {"dispatch": 153e9, "combine": 158e9}    # B/s, Intranode EP 8
RDMA_FIGURES = {                                  # nodes of the EP group -> B/s (EP 16, 32, 64 on 8-GPU nodes)
    2: {"dispatch": 43e9, "combine": 43e9},
    4: {"dispatch": 58e9, "combine": 57e9},
    8: {"dispatch": 51e9, "combine": 50e9},
}
WIRE_BYTES = 2   # BF16 hidden states both ways (Megatron-Core _DeepepManager.dispatch passes the BF16 tensor)
NUM_SMS = 20     # Megatron-Core: moe_flex_dispatcher_num_sms None -> 20 (token_dispatcher.py @d98e8a6)
# HybridEP's SMs in Megatron-Bridge's performance recipes: moe_hybridep_num_sms = 32 for every hybridep recipe
# (NVIDIA-NeMo/Megatron-Bridge scripts/performance/utils/overrides.py @v0.4.0, v0.4.2, v0.5.0); plan.hybridep
HYBRIDEP_NUM_SMS = 32
DISPATCHER_SMS = {"deepep": NUM_SMS, "hybridep": HYBRIDEP_NUM_SMS}
# SMs per GPU: NVIDIA H100 Tensor Core GPU Architecture whitepaper (H100 SXM5: 132 SMs; H800 is the same die and
# SM count, DeepEP's tests run it with 132 SMs); A100 whitepaper: 108 SMs; B200: 148 SMs (2 x 74, NVIDIA Blackwell
# architecture technical brief).
GPU_SMS = {"H100-SXM5": 132, "H100-SXM": 132, "H800-SXM5": 132, "H200-SXM": 132, "A100-SXM4": 108, "B200": 148}


def distinct(experts: int, top_k: int, parts: int) -> float:
    """Expected distinct parts (of ``parts`` equal shares of the experts) that a token's top-k experts fall in."""
    if parts <= 1:
        return 1.0
    per = experts // parts
    return parts * (1.0 - comb(experts - per, top_k) / comb(experts, top_k))


def rdma_figure(nodes: int) -> dict[str, float]:
    """DeepEP's published RDMA figure for an EP group over ``nodes`` nodes: the largest published node count not
    above it (2, 4, 8)."""
    return RDMA_FIGURES[max(n for n in RDMA_FIGURES if n <= nodes)]


def gpu_sms(gpu_name: str) -> int | None:
    """SMs of the GPU, from its name (None when not known)."""
    for prefix, sms in GPU_SMS.items():
        if gpu_name.startswith(prefix):
            return sms
    return None


def compute_slowdown(gpu_name: str, taken: int = NUM_SMS) -> float:
    """Compute speed while DeepEP (or HybridEP) runs beside it: its SMs are taken, the others compute,
    sms / (sms - taken) (H100 with DeepEP's 20: 132 / 112 = 1.179)."""
    sms = gpu_sms(gpu_name)
    return sms / (sms - taken)


def ep_overlap_slowdown(scenario: Scenario, crosses_network: bool) -> float:
    """How much slower compute runs under an EP all-to-all in an EP-overlap pair: DeepEP's or HybridEP's SMs taken
    (when the GPU's SM count is known), else the hardware file's overlap slowdown (NCCL's all-to-all)."""
    taken = DISPATCHER_SMS.get(scenario.parallel.moe_dispatcher)
    if taken is not None and gpu_sms(scenario.hardware.gpu.name) is not None:
        return compute_slowdown(scenario.hardware.gpu.name, taken)
    return scenario.hardware.overlap_slowdown(crosses_network)


def _hops(groups: list[list[int]], cluster) -> tuple[list[list[int]], list[list[int]]]:
    """Each EP group's members by node (the NVLink hop's groups) and by local index across nodes (the RDMA
    hop's rails)."""
    intra, rails = [], []
    for g in groups:
        by_node: dict[int, list[int]] = defaultdict(list)
        for r in g:
            by_node[cluster.domain_of(r)].append(r)
        nodes = sorted(by_node)
        intra.extend(by_node[nd] for nd in nodes)
        local = min(len(by_node[nd]) for nd in nodes)
        rails.extend([[by_node[nd][k] for nd in nodes] for k in range(local)])
    return intra, rails


def _hop_time(cluster, shape, logical: float, efficiency: float, kind: str) -> float:
    """One hop alone: flows to the n - 1 peers carry logical / (n - 1) bytes at ``efficiency`` x the bandwidth of
    the links of ``kind`` (the others, e.g. a GPU's PCIe path to its NIC, as the graph has them)."""
    if shape is None:
        return 0.0
    phase = shape.phase(logical * shape.n / (shape.n - 1))
    scale = {link: efficiency for link, _ in phase.links if (cluster._link(link)[2] == "network") == (kind == "rdma")
             and cluster._link(link)[2] != "pcie"}
    return phase_time_alone(phase, cluster, scale)


def hop_shapes(scenario: Scenario, placement: Placement, pp_rank: int, first_group_only: bool = False):
    """The stage's NVLink-hop and RDMA-hop all-to-all shapes (every EP group of the stage, or its first alone), and
    the RDMA rails."""
    cluster = scenario.cluster
    groups = placement.ep_groups(pp_rank)
    intra, rails = _hops(groups[:1] if first_group_only else groups, cluster)
    offset = pp_rank * placement.tp * placement.dp
    layout = (placement.dp, placement.tp, placement.pp, placement.ep, placement.expert_tp, first_group_only)
    nvl_shape = stage_shape(cluster, ("ep", "deepep_nvl", *layout), offset, lambda: all_to_all_shape(intra, cluster))
    rdma_shape = stage_shape(cluster, ("ep", "deepep_rdma", *layout), offset,
                             lambda: all_to_all_shape(rails, cluster))
    return nvl_shape, rdma_shape, rails


def deepep_time(scenario: Scenario, placement: Placement, msh: MoEShape, pp_rank: int) -> float:
    """Seconds of one MoE layer's dispatch and combine through DeepEP on one stage, every EP group of the stage
    running at once."""
    cluster = scenario.cluster
    groups = placement.ep_groups(pp_rank)
    nvl_shape, rdma_shape, rails = hop_shapes(scenario, placement, pp_rank)
    token_bytes = msh.routed_tokens * msh.imbalance * msh.hidden * WIRE_BYTES   # dropless (capacity is refused)
    nodes = len(rails[0]) if rails else 1
    ranks, node_count = destinations(scenario, placement, msh, groups, nodes)
    to_ranks = token_bytes * ranks          # tokens received over NVLink
    to_nodes = token_bytes * node_count     # (token, node) pairs over RDMA
    total = 0.0
    for kind in ("dispatch", "combine"):
        nvl = _hop_time(cluster, nvl_shape, to_ranks, NVLINK_FIGURES[kind] / NVLINK_MAX, "nvlink")
        rdma = _hop_time(cluster, rdma_shape, to_nodes, rdma_figure(nodes)[kind] / RDMA_MAX, "rdma") \
            if nodes > 1 else 0.0
        total += max(nvl, rdma)
    return total


def destinations(scenario: Scenario, placement: Placement, msh: MoEShape, groups: list[list[int]],
                 nodes: int) -> tuple[float, float]:
    """Expected distinct EP ranks and nodes one token is sent to: the hypergeometric over equal parts, or with
    group-limited routing the exact expectation over the experts each rank and each node holds (the mean over the
    stage's EP groups)."""
    moe = scenario.model.moe
    if moe.n_group is None:
        return distinct(msh.experts, msh.top_k, msh.ep), distinct(msh.experts, msh.top_k, nodes)
    ranks = expected_parts(msh.experts, msh.top_k, rank_parts(msh.experts, msh.ep), moe.n_group, moe.topk_group)
    if nodes <= 1:
        return ranks, 1.0
    cluster = scenario.cluster
    per_group = []
    for g in groups:
        by_node: dict[int, list[int]] = defaultdict(list)
        for e, r in enumerate(g):          # list position = EP rank (Placement.ep_group)
            by_node[cluster.domain_of(r)].append(e)
        parts = rank_parts(msh.experts, msh.ep, [by_node[nd] for nd in sorted(by_node)])
        per_group.append(expected_parts(msh.experts, msh.top_k, parts, moe.n_group, moe.topk_group))
    return ranks, sum(per_group) / len(per_group)
