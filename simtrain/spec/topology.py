"""The cluster as a directed networkx graph, and routes through it.

Nodes are GPUs (``gpu{i}``), NVSwitch planes or PCIe host bridges
(``nvsw{d}``/``host{n}``), NICs (``nic{n}.{k}``) and network switches. An
NVSwitch fabric serves one scale-up domain ``d`` of ``domain_gpus`` GPUs: one
node unless the hardware file's ``intra_node.domain_gpus`` spans several (an
NVL72 rack: 18 trays of 4 GPUs on one switch fabric), so ``nvsw{d}`` is the
node's own hub on every 8-GPU file. A ``mesh`` fabric has no hub: every pair
of GPUs of a node has its own link (``gpu{i}`` to ``gpu{j}``). Every
physical link is two directed edges (one per direction) with ``bandwidth``
(bytes/s, already multiplied by the achievable ``efficiency``) and
``latency`` (s). A route is the tuple of directed edges a message crosses;
its latency is the sum of the edges' latencies.

Template topologies route structurally and compute a link's attributes from
its end points (:meth:`Cluster.link_attrs`, the one function the graph builder
also uses), so a 16,384-GPU step needs no graph search and no graph at all;
``cluster.graph`` is built on first use (charts, explicit topologies, link
checks). Explicit topologies route by fewest hops; a test checks that
structural routes equal the graph's shortest paths on the templates.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

if TYPE_CHECKING:   # networkx loads on first use of a graph: `import simtrain` stays fast
    import networkx as nx

from simtrain.spec.hardware import HardwareSpec

Link = tuple[str, str]


@dataclass(eq=False)
class Cluster:
    """GPUs and the network between them, for one hardware spec and size."""

    spec: HardwareSpec
    nodes: int
    gpus_per_node: int
    _routes: dict = field(default_factory=dict, repr=False)
    _attrs: dict = field(default_factory=dict, repr=False)
    shapes: dict = field(default_factory=dict, repr=False)   # ring shapes by (kind, layout, rank, every)

    @property
    def gpus(self) -> int:
        if self.spec.explicit:
            return len(self.spec.devices)
        return self.nodes * self.gpus_per_node

    def gpu(self, index: int) -> str:
        return f"gpu{index}"

    def __post_init__(self) -> None:
        if self.spec.explicit:
            nodes = [d.node for d in self.spec.devices]
            self.node_of = nodes.__getitem__          # type: ignore[method-assign]
        # GPUs per scale-up domain, looked up once: domain_of runs for every flow of a collective's neighbours
        self._domain_per = 0 if self.spec.explicit else self.domain_gpus

    def node_of(self, index: int) -> int:
        return index // self.gpus_per_node

    @property
    def domain_gpus(self) -> int:
        """GPUs of one scale-up domain (the GPUs that reach each other without the network)."""
        if self.spec.explicit:
            return self.gpus_per_node
        own = self.spec.intra_node.domain_gpus
        return own if own is not None else self.gpus_per_node

    def domain_of(self, index: int) -> int:
        """The scale-up domain of GPU ``index`` (its node on explicit topologies)."""
        per = self._domain_per
        return index // per if per else self.node_of(index)

    # --- the graph --------------------------------------------------------
    @cached_property
    def graph(self) -> nx.DiGraph:
        return _build_explicit(self.spec) if self.spec.explicit else _build_template(self)

    def _link(self, link: Link) -> tuple[float, float, str]:
        hit = self._attrs.get(link)
        if hit is None:
            if self.spec.explicit:
                data = self.graph.edges[link]
                hit = (data["bandwidth"], data["latency"], data["kind"])
            else:
                hit = self.link_attrs(*link)
            self._attrs[link] = hit
        return hit

    def bandwidth(self, link: Link) -> float:
        return self._link(link)[0]

    def latency(self, link: Link) -> float:
        return self._link(link)[1]

    def link_attrs(self, u: str, v: str) -> tuple[float, float, str]:
        """(bandwidth bytes/s after efficiency, latency s, kind) of the template link u -> v."""
        spec = self.spec
        intra, inter = spec.intra_node, spec.inter_node
        a, b = (u, v) if u < v else (v, u)          # attributes are the same both ways
        if a.startswith("gpu"):
            if b.startswith("gpu"):                  # a mesh fabric's point-to-point link
                return intra.bandwidth * intra.efficiency, intra.latency, intra.fabric
            if b.startswith(("nvsw", "host")):
                return intra.bandwidth * intra.efficiency, intra.latency / 2, intra.fabric
            if b.startswith("nic"):
                return inter.pcie_bandwidth or float("inf"), 0.0, "pcie"
        if a.startswith(("leaf", "nic", "rail")) or b.startswith(("nic", "rail", "spine", "switch", "leaf")):
            nic_bw = inter.nic_bandwidth * inter.efficiency
            if a.startswith("nic") or b.startswith("nic"):
                return nic_bw, inter.latency / 2, "network"
            if "spine" in (a, b):
                return nic_bw * self.nodes / inter.oversubscription, 0.0, "network"
        if "core" in (a, b):
            nic_bw = inter.nic_bandwidth * inter.efficiency
            per_leaf = inter.nodes_per_leaf * inter.nics_per_node * nic_bw
            return per_leaf / inter.oversubscription, 0.0, "network"
        raise KeyError(f"no template link {u} -> {v}")

    # --- routes -----------------------------------------------------------
    def _route_entry(self, a: int, b: int, cache: bool = True) -> tuple[tuple[Link, ...], float]:
        key = (a, b)
        hit = self._routes.get(key)
        if hit is None:
            nodes = self._explicit_path(a, b) if self.spec.explicit else self._template_path(a, b)
            links = tuple(zip(nodes[:-1], nodes[1:]))
            latency = 0.0
            for link in links:
                latency += self._link(link)[1]
            hit = (links, latency)
            if cache:
                self._routes[key] = hit
        return hit

    def route(self, a: int, b: int, cache: bool = True) -> tuple[Link, ...]:
        """Directed edges from GPU a to GPU b (``cache=False`` for one-off replica routes)."""
        if not cache and (a, b) not in self._routes:
            nodes = self._explicit_path(a, b) if self.spec.explicit else self._template_path(a, b)
            return tuple(zip(nodes[:-1], nodes[1:]))
        return self._route_entry(a, b, cache)[0]

    def local_domains(self, links) -> set[int] | None:
        """Scale-up domains whose own links (GPU, NIC, NVSwitch/host ends) are in ``links``; None if any
        link is shared between domains (a network switch to switch link) or the topology is explicit.
        Flows with neither end in these domains (``domain_of``) cannot cross these links."""
        if self.spec.explicit:
            return None
        per = self.domain_gpus
        trays = per // self.gpus_per_node
        domains: set[int] = set()
        for u, v in links:
            end = u if u.startswith(("gpu", "nic", "nvsw", "host")) else v
            if end.startswith("gpu"):
                domains.add(int(end[3:]) // per)
            elif end.startswith("nic"):
                domains.add(int(end[3:].split(".")[0]) // trays)
            elif end.startswith("nvsw"):
                domains.add(int(end[4:]))
            elif end.startswith("host"):
                domains.add(int(end[4:]) // trays)
            else:
                return None
        return domains

    def translation_period(self) -> int | None:
        """The smallest shift in GPUs that maps the template onto itself: moving every GPU index by a multiple of
        it keeps each route's links' kinds, bandwidths and latencies (same node-local GPU, same NIC and rail, the
        same place within a scale-up domain and under a fat-tree leaf). None for explicit topologies."""
        if self.spec.explicit:
            return None
        period = math.lcm(self.gpus_per_node, self.domain_gpus)
        inter = self.spec.inter_node
        if inter is not None and inter.topology == "fat-tree":
            period = math.lcm(period, inter.nodes_per_leaf * self.gpus_per_node)
        return period

    def shift_links(self, links: list[Link], gpus: int) -> list[Link]:
        """Template links moved by ``gpus`` GPU indices (a multiple of :meth:`translation_period`), each end name
        worked out once (a DP ring's 512 links share 260 ends). A moved link has the attributes of the link it was
        moved from (:meth:`link_attrs` reads only the kinds of its ends): those already looked up are carried over."""
        moved: dict[str, str] = {}
        attrs = self._attrs
        out = []
        for link in links:
            for end in link:
                if end not in moved:
                    moved[end] = self._shift_end(end, gpus)
            new = (moved[link[0]], moved[link[1]])
            if link in attrs and new not in attrs:
                attrs[new] = attrs[link]
            out.append(new)
        return out

    def _shift_end(self, end: str, gpus: int) -> str:
        if end.startswith("gpu"):
            return f"gpu{int(end[3:]) + gpus}"
        if end.startswith("nic"):
            node, k = end[3:].split(".")
            return f"nic{int(node) + gpus // self.gpus_per_node}.{k}"
        if end.startswith("nvsw"):
            return f"nvsw{int(end[4:]) + gpus // self.domain_gpus}"
        if end.startswith("host"):
            return f"host{int(end[4:]) + gpus // self.gpus_per_node}"
        if end.startswith("leaf"):
            return f"leaf{int(end[4:]) + gpus // (self.spec.inter_node.nodes_per_leaf * self.gpus_per_node)}"
        return end   # rails, the spine, the core and a single switch are shared by every node

    def has_link(self, a: str, b: str) -> bool:
        """Is ``a -> b`` a link of the cluster graph? On templates it is read from the names by the graph
        builder's rules (``_build_template``), so that checking a degraded link of 16,384 GPUs builds no graph."""
        if self.spec.explicit:
            return self.graph.has_edge(a, b)
        lower, upper = sorted((a, b), key=_level)
        return upper in self._links_up(lower)

    def _links_up(self, name: str) -> set[str]:
        """The template nodes ``name`` links to at its own level or above (empty for a name with no node)."""
        m = _NAME.fullmatch(name)
        if m is None or m.group(4):
            return set()
        kind, index, sub = m.group(1), int(m.group(2)), m.group(3)
        intra, inter, gpn = self.spec.intra_node, self.spec.inter_node, self.gpus_per_node
        trays = self.domain_gpus // gpn
        network = self.nodes > trays and inter is not None
        if kind == "gpu" and sub is None and index < self.gpus:
            n = index // gpn
            out = {f"nvsw{n // trays}"} if intra.fabric == "nvswitch" else {f"host{n}"} if intra.fabric == "pcie" \
                else {f"gpu{j}" for j in range(n * gpn, (n + 1) * gpn) if j != index}
            return out | ({self._nic(index)} if network else set())
        if not network:
            return set()
        if kind == "nic" and sub is not None and index < self.nodes and int(sub) < inter.nics_per_node:
            if inter.topology == "single-switch":
                return {"switch"}
            return {f"rail{sub}"} if inter.topology == "rail-optimized" else {f"leaf{index // inter.nodes_per_leaf}"}
        if kind == "rail" and sub is None and inter.topology == "rail-optimized" and index < inter.nics_per_node:
            return {"spine"}
        leaves = -(-self.nodes // inter.nodes_per_leaf)
        if kind == "leaf" and sub is None and inter.topology == "fat-tree" and index < leaves:
            return {"core"}
        return set()

    def route_latency(self, a: int, b: int) -> float:
        """Sum of the latencies of the route's edges."""
        return self._route_entry(a, b)[1]

    def _explicit_path(self, a: int, b: int) -> list[str]:
        import networkx as nx

        try:
            return nx.shortest_path(self.graph, self.gpu(a), self.gpu(b))
        except nx.NetworkXNoPath:
            from simtrain.spec.errors import InputError

            raise InputError(f"no path from {self.spec.devices[a].name} to {self.spec.devices[b].name}",
                             field="links") from None

    def _nic(self, index: int) -> str:
        n, local = divmod(index, self.gpus_per_node)
        nics = self.spec.inter_node.nics_per_node
        return f"nic{n}.{local * nics // self.gpus_per_node}"

    def _template_path(self, a: int, b: int) -> list[str]:
        gpn = self.gpus_per_node
        na, nb = a // gpn, b // gpn
        fabric = self.spec.intra_node.fabric
        if fabric == "nvswitch" and a // self.domain_gpus == b // self.domain_gpus:
            return [f"gpu{a}", f"nvsw{a // self.domain_gpus}", f"gpu{b}"]
        if na == nb:
            return [f"gpu{a}", f"gpu{b}"] if fabric == "mesh" else [f"gpu{a}", f"host{na}", f"gpu{b}"]
        nic_a, nic_b = self._nic(a), self._nic(b)
        return [self.gpu(a), nic_a, *self._fabric_path(na, nic_a, nb, nic_b), nic_b, self.gpu(b)]

    def _fabric_path(self, na: int, nic_a: str, nb: int, nic_b: str) -> list[str]:
        inter = self.spec.inter_node
        if inter.topology == "single-switch":
            return ["switch"]
        if inter.topology == "rail-optimized":
            ra, rb = nic_a.split(".")[1], nic_b.split(".")[1]
            return [f"rail{ra}"] if ra == rb else [f"rail{ra}", "spine", f"rail{rb}"]
        la, lb = na // inter.nodes_per_leaf, nb // inter.nodes_per_leaf
        return [f"leaf{la}"] if la == lb else [f"leaf{la}", "core", f"leaf{lb}"]


_NAME = re.compile(r"(gpu|nvsw|host|nic|rail|leaf)(\d+)(?:\.(\d+))?|(spine|core|switch)")
#: a template node's level: a link joins a node to one of the level above (or two GPUs of a mesh)
_LEVELS = {"gpu": 0, "nvsw": 1, "host": 1, "nic": 2, "rail": 3, "leaf": 3, "switch": 3, "spine": 4, "core": 4}


def _level(name: str) -> int:
    m = _NAME.fullmatch(name)
    return _LEVELS[m.group(1) or m.group(4)] if m else 5


def _add_link(edges: list, a: str, b: str, bandwidth: float, latency_each_way: float, kind: str) -> None:
    attrs = {"bandwidth": bandwidth, "latency": latency_each_way, "kind": kind}
    edges.append((a, b, attrs))
    edges.append((b, a, dict(attrs)))


def _build_template(cluster: Cluster) -> nx.DiGraph:
    """The template's graph; every edge's attributes come from ``cluster.link_attrs``."""
    import networkx as nx

    spec, gpn = cluster.spec, cluster.gpus_per_node
    intra, inter = spec.intra_node, spec.inter_node
    g = nx.DiGraph(name=spec.name)
    pairs: list[tuple[str, str]] = []
    trays = cluster.domain_gpus // gpn
    for n in range(cluster.nodes):
        if intra.fabric == "nvswitch" and n % trays == 0:
            g.add_node(f"nvsw{n // trays}", kind="nvswitch", node=n, domain=n // trays)
        elif intra.fabric == "pcie":
            g.add_node(f"host{n}", kind="pcie_host", node=n)
        for local in range(gpn):
            i = n * gpn + local
            g.add_node(f"gpu{i}", kind="gpu", node=n, local=local, index=i, domain=n // trays)
            if intra.fabric == "nvswitch":
                pairs.append((f"gpu{i}", f"nvsw{n // trays}"))
            elif intra.fabric == "pcie":
                pairs.append((f"gpu{i}", f"host{n}"))
            else:
                pairs.extend((f"gpu{n * gpn + other}", f"gpu{i}") for other in range(local))
        if cluster.nodes > trays and inter is not None:
            for k in range(inter.nics_per_node):
                g.add_node(f"nic{n}.{k}", kind="nic", node=n)
            for local in range(gpn):
                i = n * gpn + local
                pairs.append((f"gpu{i}", cluster._nic(i)))
            for k in range(inter.nics_per_node):
                if inter.topology == "single-switch":
                    up = "switch"
                elif inter.topology == "rail-optimized":
                    up = f"rail{k}"
                else:
                    up = f"leaf{n // inter.nodes_per_leaf}"
                pairs.append((f"nic{n}.{k}", up))
    if cluster.nodes > trays and inter is not None:
        if inter.topology == "rail-optimized":
            pairs.extend((f"rail{k}", "spine") for k in range(inter.nics_per_node))
        elif inter.topology == "fat-tree":
            leaves = -(-cluster.nodes // inter.nodes_per_leaf)
            pairs.extend((f"leaf{leaf}", "core") for leaf in range(leaves))
    edges: list = []
    for a, b in pairs:
        _add_link(edges, a, b, *cluster.link_attrs(a, b))
    g.add_edges_from(edges)
    for _node, data in g.nodes(data=True):
        data.setdefault("kind", "switch")
    return g


def _build_explicit(spec: HardwareSpec) -> nx.DiGraph:
    import networkx as nx

    g = nx.DiGraph(name=spec.name)
    for i, dev in enumerate(spec.devices):
        g.add_node(f"gpu{i}", kind="gpu", node=dev.node, index=i, label=dev.name)
    names = {dev.name: f"gpu{i}" for i, dev in enumerate(spec.devices)}
    for sw in spec.switches:
        g.add_node(sw.name, kind=sw.kind)
        names[sw.name] = sw.name
    edges: list = []
    for link in spec.links:
        _add_link(edges, names[link.a], names[link.b], link.bandwidth * link.efficiency, link.latency, link.kind)
    g.add_edges_from(edges)
    return g


def build_cluster(spec: HardwareSpec, *, nodes: int | None = None, gpus_per_node: int | None = None) -> Cluster:
    """The cluster for ``spec``, with the scenario's optional size overrides.

    Clusters are shared between scenarios on the same (immutable) spec and size, so that a sweep or
    a search computes each route and ring shape once, not once per candidate layout."""
    if spec.explicit:
        node_ids = {d.node for d in spec.devices}
        per = max(sum(1 for d in spec.devices if d.node == n) for n in node_ids)
        return _shared_cluster(spec, len(node_ids), per)
    return _shared_cluster(spec, nodes or spec.nodes, gpus_per_node or spec.gpus_per_node)


_SHARED: dict = {}   # (id(spec), nodes, gpus_per_node) -> Cluster; at most 8, oldest dropped first


def _shared_cluster(spec: HardwareSpec, nodes: int, gpus_per_node: int) -> Cluster:
    key = (id(spec), nodes, gpus_per_node)
    hit = _SHARED.get(key)
    if hit is None or hit.spec is not spec:     # `is` guards against a reused id of a dead spec
        hit = Cluster(spec, nodes, gpus_per_node)
        _SHARED[key] = hit
        while len(_SHARED) > 8:
            _SHARED.pop(next(iter(_SHARED)))
    return hit
