"""The cluster as a directed networkx graph, and routes through it.

Nodes are GPUs (``gpu{i}``), NVSwitch planes or PCIe host bridges
(``nvsw{n}``/``host{n}``), NICs (``nic{n}.{k}``) and network switches. Every
physical link is two directed edges (one per direction) with ``bandwidth``
(bytes/s, already multiplied by the achievable ``efficiency``) and
``latency`` (s). A route is the tuple of directed edges a message crosses;
its latency is the sum of the edges' latencies.

Template topologies route structurally (no graph search), explicit ones by
fewest hops; a test checks that the two agree on the template graphs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import networkx as nx

from simtrain.hardware import HardwareSpec

Link = tuple[str, str]


@dataclass(eq=False)
class Cluster:
    """GPUs and the network between them, for one hardware spec and size."""

    spec: HardwareSpec
    nodes: int
    gpus_per_node: int
    _routes: dict = field(default_factory=dict, repr=False)

    @property
    def gpus(self) -> int:
        if self.spec.explicit:
            return len(self.spec.devices)
        return self.nodes * self.gpus_per_node

    def gpu(self, index: int) -> str:
        return f"gpu{index}"

    def node_of(self, index: int) -> int:
        if self.spec.explicit:
            return self.spec.devices[index].node
        return index // self.gpus_per_node

    # --- the graph --------------------------------------------------------
    @cached_property
    def graph(self) -> nx.DiGraph:
        return _build_explicit(self.spec) if self.spec.explicit else _build_template(self)

    def bandwidth(self, link: Link) -> float:
        return self.graph.edges[link]["bandwidth"]

    def latency(self, link: Link) -> float:
        return self.graph.edges[link]["latency"]

    # --- routes -----------------------------------------------------------
    def route(self, a: int, b: int) -> tuple[Link, ...]:
        """Directed edges from GPU a to GPU b."""
        key = (a, b)
        hit = self._routes.get(key)
        if hit is None:
            nodes = self._explicit_path(a, b) if self.spec.explicit else self._template_path(a, b)
            hit = tuple(zip(nodes[:-1], nodes[1:]))
            self._routes[key] = hit
        return hit

    def route_latency(self, a: int, b: int) -> float:
        edges = self.graph.edges
        return sum(edges[link]["latency"] for link in self.route(a, b))

    def _explicit_path(self, a: int, b: int) -> list[str]:
        try:
            return nx.shortest_path(self.graph, self.gpu(a), self.gpu(b))
        except nx.NetworkXNoPath:
            from simtrain.errors import InputError

            raise InputError(f"no path from {self.spec.devices[a].name} to {self.spec.devices[b].name}",
                             field="links") from None

    def _nic(self, index: int) -> str:
        n, local = divmod(index, self.gpus_per_node)
        nics = self.spec.inter_node.nics_per_node
        return f"nic{n}.{local * nics // self.gpus_per_node}"

    def _template_path(self, a: int, b: int) -> list[str]:
        na, nb = self.node_of(a), self.node_of(b)
        hub = "nvsw" if self.spec.intra_node.fabric == "nvswitch" else "host"
        if na == nb:
            return [self.gpu(a), f"{hub}{na}", self.gpu(b)]
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


def _add_link(edges: list, a: str, b: str, bandwidth: float, latency_each_way: float, kind: str) -> None:
    attrs = {"bandwidth": bandwidth, "latency": latency_each_way, "kind": kind}
    edges.append((a, b, attrs))
    edges.append((b, a, dict(attrs)))


def _build_template(cluster: Cluster) -> nx.DiGraph:
    spec, gpn = cluster.spec, cluster.gpus_per_node
    intra, inter = spec.intra_node, spec.inter_node
    g = nx.DiGraph(name=spec.name)
    edges: list = []
    hub = "nvsw" if intra.fabric == "nvswitch" else "host"
    intra_bw = intra.bandwidth * intra.efficiency
    for n in range(cluster.nodes):
        g.add_node(f"{hub}{n}", kind="nvswitch" if hub == "nvsw" else "pcie_host", node=n)
        for local in range(gpn):
            i = n * gpn + local
            g.add_node(f"gpu{i}", kind="gpu", node=n, local=local, index=i)
            # latency split over the two hops so that GPU -> hub -> GPU costs intra.latency
            _add_link(edges, f"gpu{i}", f"{hub}{n}", intra_bw, intra.latency / 2, intra.fabric)
        if cluster.nodes > 1 and inter is not None:
            nic_bw = inter.nic_bandwidth * inter.efficiency
            pcie = inter.pcie_bandwidth or float("inf")
            for k in range(inter.nics_per_node):
                g.add_node(f"nic{n}.{k}", kind="nic", node=n)
            for local in range(gpn):
                i = n * gpn + local
                _add_link(edges, f"gpu{i}", cluster._nic(i), pcie, 0.0, "pcie")
            for k in range(inter.nics_per_node):
                nic = f"nic{n}.{k}"
                if inter.topology == "single-switch":
                    up = "switch"
                elif inter.topology == "rail-optimized":
                    up = f"rail{k}"
                else:
                    up = f"leaf{n // inter.nodes_per_leaf}"
                _add_link(edges, nic, up, nic_bw, inter.latency / 2, "network")
    if cluster.nodes > 1 and inter is not None:
        nic_bw = inter.nic_bandwidth * inter.efficiency
        if inter.topology == "rail-optimized":
            for k in range(inter.nics_per_node):
                # a rail's spine uplink carries every node's NIC on that rail: non-blocking
                _add_link(edges, f"rail{k}", "spine", nic_bw * cluster.nodes / inter.oversubscription, 0.0, "network")
        elif inter.topology == "fat-tree":
            leaves = -(-cluster.nodes // inter.nodes_per_leaf)
            per_leaf = inter.nodes_per_leaf * inter.nics_per_node * nic_bw
            for leaf in range(leaves):
                _add_link(edges, f"leaf{leaf}", "core", per_leaf / inter.oversubscription, 0.0, "network")
    g.add_edges_from(edges)
    for node, data in g.nodes(data=True):
        data.setdefault("kind", "switch")
    return g


def _build_explicit(spec: HardwareSpec) -> nx.DiGraph:
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
    """The cluster for ``spec``, with the scenario's optional size overrides."""
    if spec.explicit:
        node_ids = {d.node for d in spec.devices}
        per = max(sum(1 for d in spec.devices if d.node == n) for n in node_ids)
        return Cluster(spec, len(node_ids), per)
    return Cluster(spec, nodes or spec.nodes, gpus_per_node or spec.gpus_per_node)
