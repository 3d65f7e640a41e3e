"""Collectives on the cluster graph, as phases of ring flows.

A ring collective over ``n`` GPUs runs ``steps`` ring steps; in each, every GPU
sends a chunk to its ring neighbour along the graph route between them. With
``S`` bytes per GPU (NCCL's convention, Thakur et al. 2005; NCCL docs
"Performance considerations"):

- all-reduce:     2(n-1) steps of S/n  -> 2(n-1)/n x S per flow
- reduce-scatter: (n-1) steps of S/n   -> (n-1)/n x S
- all-gather:     (n-1) steps of S/n   -> (n-1)/n x S   (S = the gathered size)

Alone on uniform links of bandwidth B and per-step latency alpha this is the
alpha-beta time ``steps x alpha + flow_bytes / B``: all-reduce
``2(n-1)/n x S/B + 2(n-1) alpha``.

A group that spans nodes with several members per node uses the hierarchical
form: reduce-scatter inside each node, the collective across nodes on 1/l of
the data (l members per node, l rings in parallel), all-gather inside the node.

A :class:`Phase` is what the network needs to time it: bytes each flow moves,
the fixed latency, and the load it puts on each link (flows per link, counting
every concurrent replica the phase stands for).

A collective of S bytes per GPU reaches only a fraction of the fabric's
large-message bandwidth (the message-size ramp, :class:`Ramp`); its flows move
their bytes divided by that fraction.
"""

from __future__ import annotations

from collections import OrderedDict, defaultdict
from dataclasses import dataclass, replace

from simtrain.spec.curves import Ramp, curve_ramp
from simtrain.spec.topology import Cluster, Link


@dataclass(frozen=True)
class Phase:
    """One ring phase: every flow moves ``flow_bytes`` after ``latency`` seconds of step latencies."""

    flow_bytes: float
    latency: float
    links: tuple[tuple[Link, int], ...]   # (directed link, flows on it)


STEPS = {"all_reduce": lambda n: 2 * (n - 1), "reduce_scatter": lambda n: n - 1,
         "all_gather": lambda n: n - 1}


@dataclass(frozen=True)
class RingShape:
    """Where one flat ring stage's flows go, independent of the message size."""

    kind: str
    n: int                                   # ring length
    divisor: int                             # the stage moves nbytes / divisor (hierarchical inter-node stage)
    links: tuple[tuple[Link, int], ...]      # (link, flows on it from every concurrent ring)
    step_latency: float                      # worst route latency between ring neighbours
    ramp: Ramp = Ramp()                      # the fabric's message-size ramp
    latency_rounds: int = 1                  # the stage's step latencies are paid this many times (flat ring)

    def phase(self, nbytes: float) -> Phase:
        """The phase for ``nbytes`` per GPU: its bytes move at the ramp's fraction of the bandwidth
        for this size (nccl-tests curves, docs/sources.md section 3). With a half-peak size that is
        the time of S + S_half bytes at the full bandwidth."""
        steps = STEPS[self.kind](self.n)
        size = nbytes / self.divisor
        flow = steps * size / self.n / self.ramp.fraction(size) if size > 0 else 0.0
        return Phase(flow_bytes=flow, latency=self.latency_rounds * steps * self.step_latency, links=self.links)


def _ring_shape(kind: str, rings: list[list[int]], cluster: Cluster, every: bool, divisor: int = 1,
                keep=None) -> RingShape:
    """All rings run concurrently; ``rings[0]`` is the one whose flows set the pace (symmetry),
    or, with ``every``, the slowest flow of any ring (no symmetry assumed); ``keep(link)``, when given, picks the
    links of those rings that can set the pace (the rest are alike, symmetry classes of replicas)."""
    counts: dict[Link, int] = defaultdict(int)
    own: set[Link] = set()
    latency = 0.0
    chosen = rings if every else rings[:1]
    for ring in chosen:
        n = len(ring)
        for j in range(n):
            a, b = ring[j], ring[(j + 1) % n]
            own.update(cluster.route(a, b))
            latency = max(latency, cluster.route_latency(a, b))
    every_link = own
    if keep is not None:
        own = {link for link in own if keep(link)} or own
    # other rings load the chosen rings' links only where they cross them; when every chosen link
    # belongs to one node (GPU, NIC or NVSwitch end), only flows starting or ending on those nodes can
    domains = cluster.local_domains(own)
    domain_of = cluster.domain_of
    for ring in rings:
        n = len(ring)
        for j in range(n):
            a, b = ring[j], ring[(j + 1) % n]
            if domains is not None and domain_of(a) not in domains and domain_of(b) not in domains:
                continue
            for link in cluster.route(a, b, cache=False):
                if link in own:
                    counts[link] += 1
    crosses = any(cluster._link(link)[2] == "network" for link in every_link)
    n = len(rings[0])
    if n > 2 and all(cluster._link(link)[2] == "mesh" for link in every_link):
        # a full mesh of n GPUs holds n - 1 link-disjoint directed rings (Tillson 1980: the complete digraph
        # decomposes into Hamiltonian cycles for n other than 4 and 6), and RCCL runs one per link: 8x MI300X
        # reach 161 GB/s all-reduce bus bandwidth at 8 MiB (crickett-hpe/hpc-ai-envs PR #30) over 48 GB/s links
        # (ROCm/rccl issue #1210). Each ring carries 1/(n - 1) of the bytes over its own links.
        divisor *= n - 1
    return RingShape(kind=kind, n=n, divisor=divisor,
                     links=tuple(sorted((link, counts[link]) for link in own)),
                     step_latency=latency, ramp=fabric_ramp(cluster, crosses))


def fabric_ramp(cluster: Cluster, crosses_network: bool) -> Ramp:
    """The message-size ramp of the fabric a ring runs on (none for explicit topologies)."""
    spec = cluster.spec
    fabric = spec.inter_node if crosses_network else spec.intra_node
    if fabric is None:
        return Ramp()
    curve = getattr(fabric, "busbw_curve", None)
    if curve is not None:
        return curve_ramp(curve, spec.curve_gpus, fabric.latency, fabric.bandwidth * fabric.efficiency)
    return Ramp(half_peak=fabric.half_peak_message)


def collective_shape(kind: str, groups: list[list[int]], cluster: Cluster, every: bool = False,
                     keep=None) -> list[RingShape]:
    """The ring stages of ``kind`` run at once by every group in ``groups`` (same size, same shape).

    ``groups[0]`` is the representative: its links, loaded by all groups' flows, set the rate (with ``every``,
    all groups' links, or those ``keep`` picks).
    A group spanning nodes with several members in each uses the hierarchical form.
    """
    n = len(groups[0])
    if n <= 1:
        return []
    per_node: dict[int, list[int]] = defaultdict(list)   # by scale-up domain (= node unless the file spans nodes)
    for r in groups[0]:
        per_node[cluster.domain_of(r)].append(r)
    local = max(len(v) for v in per_node.values())
    if len(per_node) == 1 or local == 1 or any(len(v) != local for v in per_node.values()):
        return [_ring_shape(kind, groups, cluster, every, keep=keep)]
    intra, inter = [], []
    for g in groups:   # each group's members by node, once (linear in the group size)
        by_node: dict[int, list[int]] = defaultdict(list)
        for r in g:
            by_node[cluster.domain_of(r)].append(r)
        nodes = sorted(by_node)
        intra.extend(by_node[nd] for nd in nodes)
        inter.extend([[by_node[nd][k] for nd in nodes] for k in range(local)])
    if kind == "all_reduce":
        return [_ring_shape("reduce_scatter", intra, cluster, every, keep=keep),
                _ring_shape("all_reduce", inter, cluster, every, local, keep=keep),
                _ring_shape("all_gather", intra, cluster, every, keep=keep)]
    # NCCL runs reduce-scatter and all-gather as one flat ring over all n ranks, whose chunks make n - 1
    # hops, n - nodes of them inside a node (tuning.cc: nsteps = nRanks - 1, nInterSteps = nNodes - 1):
    # the node stage's local - 1 step latencies are paid once per node. The bytes stay the two stages',
    # timed one after the other (docs/model.md section 4.3: that matches the one multi-node nccl-tests
    # all-gather found, where a ring pipelining NVLink and NICs would be about twice as fast).
    nodes = len(per_node)
    inside = replace(_ring_shape(kind, intra, cluster, every, keep=keep), latency_rounds=nodes)
    across = _ring_shape(kind, inter, cluster, every, local, keep=keep)
    return [inside, across] if kind == "reduce_scatter" else [across, inside]


def collective_phases(kind: str, nbytes: float, groups: list[list[int]], cluster: Cluster,
                      every: bool = False) -> list[Phase]:
    """Phases of ``kind`` over ``nbytes`` per GPU run at once by every group in ``groups``."""
    if nbytes <= 0:
        return []
    return [shape.phase(nbytes) for shape in collective_shape(kind, groups, cluster, every)]


def p2p_phase(nbytes: float, pairs: list[tuple[int, int]], cluster: Cluster, every: bool = False,
              chosen: int = 0) -> Phase:
    """Point-to-point sends running at once; ``pairs[0]`` is the representative (or all, with ``every``; or the
    first ``chosen``, whose links the other pairs load where they cross them)."""
    leading = pairs[:chosen] if chosen else pairs if every else pairs[:1]
    own = {link for a, b in leading for link in cluster.route(a, b)}
    counts: dict[Link, int] = defaultdict(int)
    domains = cluster.local_domains(own)
    for a, b in pairs:
        if domains is not None and cluster.domain_of(a) not in domains and cluster.domain_of(b) not in domains:
            continue
        for link in cluster.route(a, b, cache=False):
            if link in own:
                counts[link] += 1
    latency = max(cluster.route_latency(a, b) for a, b in leading)
    return Phase(flow_bytes=nbytes, latency=latency, links=tuple(sorted((link, counts[link]) for link in own)))


def phase_time_alone(phase: Phase, cluster: Cluster, scale: dict | None = None) -> float:
    """Time of a phase with no other traffic: latency + bytes at the bottleneck share."""
    if phase.flow_bytes <= 0:
        return phase.latency
    if scale or len(phase.links) < _KEEP_RATE_LINKS:
        rate = min(cluster.bandwidth(link) * (scale.get(link, 1.0) if scale else 1.0) / count
                   for link, count in phase.links)
    else:
        rate = bottleneck_rate(phase.links, cluster)
    return phase.latency + phase.flow_bytes / rate


#: phases over at least this many links keep their bottleneck rate (a ring over a 1,024-GPU DP group has thousands)
_KEEP_RATE_LINKS = 16
#: how many link tuples' rates a cluster keeps (a search's shapes are far fewer; plans built per layout at full
#: fidelity add pipeline-send tuples that would otherwise accumulate in a long notebook session)
_KEEP_RATES = 4096


def bottleneck_rate(links: tuple[tuple[Link, int], ...], cluster: Cluster) -> float:
    """Bytes/s of each flow at the phase's most loaded link, alone: min over links of bandwidth / flows. The links of
    a ring or all-to-all shape are one tuple shared by every phase made from it (and kept by the cluster's shape
    cache), so the minimum is taken once per shape and kept on the cluster, keyed by the tuple's identity (the
    entry holds the tuple, so the identity cannot be reused)."""
    rates = cluster.shapes.get("rates")
    if rates is None:
        rates = cluster.shapes["rates"] = OrderedDict()
    hit = rates.get(id(links))
    if hit is None or hit[0] is not links:
        hit = rates[id(links)] = (links, min(cluster.bandwidth(link) / count for link, count in links))
        if len(rates) > _KEEP_RATES:   # ad-hoc phases (a full-fidelity plan's sends) come and go: keep the newest
            rates.popitem(last=False)
    return hit[1]


@dataclass(frozen=True)
class AllToAllShape:
    """Where one all-to-all's flows go, independent of the message size.

    Every member of a group of n sends 1/n of its ``S`` bytes to each other member, all pairs at once (NCCL's
    all-to-all is n - 1 concurrent send/recv pairs per rank, nccl-tests doc/PERFORMANCE.md: busbw = algbw x
    (n - 1)/n). A pair flow carries S/n; the load on a link is the number of pair flows crossing it, from every
    group running the all-to-all at once. Alone on a uniform node with per-GPU bandwidth B (each GPU's port
    carries its n - 1 outgoing flows) this is ``(n - 1)/n x S / B + latency``; across nodes each GPU's flows
    to the other nodes share its own NIC ("Alltoall cannot aggregate the bandwidth of multiple NICs",
    nccl-tests#267), ``(n - l)/n x S / B_nic`` with l members per node.
    """

    n: int
    links: tuple[tuple[Link, int], ...]
    latency: float                       # worst route latency between two members: the pairs run concurrently
    crosses_network: bool

    def phase(self, nbytes: float) -> Phase:
        return Phase(flow_bytes=nbytes / self.n, latency=self.latency, links=self.links)


def all_to_all_shape(groups: list[list[int]], cluster: Cluster, every: bool = False) -> AllToAllShape | None:
    """The all-to-all run at once by every group in ``groups`` (same size); ``groups[0]`` is the representative
    whose links set the pace (or, with ``every``, all groups' links). None for groups of one."""
    n = len(groups[0])
    if n <= 1:
        return None
    chosen = groups if every else groups[:1]
    own: set[Link] = set()
    latency = 0.0
    counts: dict[Link, int] = defaultdict(int)
    for g in chosen:
        for a in g:
            for b in g:
                if a != b:
                    route = cluster.route(a, b)
                    own.update(route)
                    latency = max(latency, cluster.route_latency(a, b))
                    for link in route:
                        counts[link] += 1
    # the other groups' flows, where they can cross the chosen groups' links (symmetric template clusters: only
    # flows with an end in the same scale-up domains, when every chosen link belongs to one domain)
    nodes = cluster.local_domains(own)
    node_of = cluster.domain_of
    for g in groups:
        if not every and g is groups[0] or every:
            continue
        if nodes is not None and not any(node_of(r) in nodes for r in g):
            continue
        for a in g:
            for b in g:
                if a == b or (nodes is not None and node_of(a) not in nodes and node_of(b) not in nodes):
                    continue
                for link in cluster.route(a, b, cache=False):
                    if link in own:
                        counts[link] += 1
    crosses = any(cluster._link(link)[2] == "network" for link in own)
    return AllToAllShape(n=n, links=tuple(sorted((link, counts[link]) for link in own)), latency=latency,
                         crosses_network=crosses)


def shifted(shape, cluster: Cluster, gpus: int):
    """``shape`` (a ring or all-to-all shape) of groups moved by ``gpus`` GPU indices, a multiple of the cluster's
    translation period: the same flows on the moved links, so the same times (symmetric pipeline stages)."""
    if gpus == 0:
        return shape
    moved = cluster.shift_links([link for link, _ in shape.links], gpus)
    links = tuple(sorted(zip(moved, (count for _, count in shape.links))))
    return replace(shape, links=links)


def stage_shape(cluster: Cluster, key: tuple, offset: int, build):
    """The shape ``build()`` makes for the groups of a pipeline stage whose first GPU is ``offset``, cached under
    ``key``: stages whose offsets differ by a multiple of the cluster's translation period share one computation
    (the first one asked for), moved onto their own links. ``build`` returns a shape, a list of shapes or None."""
    exact = (*key, "at", offset)
    if exact in cluster.shapes:          # this stage's shape, built or moved before
        return cluster.shapes[exact]
    period = cluster.translation_period()
    if period is None:
        shape = cluster.shapes[exact] = build()
        return shape
    hit = cluster.shapes.get((*key, "mod", offset % period))
    if hit is None:
        hit = cluster.shapes[(*key, "mod", offset % period)] = (build(), offset)
    shape, base = hit
    if shape is not None and offset != base:
        shape = ([shifted(s, cluster, offset - base) for s in shape] if isinstance(shape, list)
                 else shifted(shape, cluster, offset - base))
    cluster.shapes[exact] = shape
    return shape
