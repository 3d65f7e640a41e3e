"""Activation offloading played out: each lane's copies to and from host memory on two copy streams beside its
compute, as Transformer Engine's ``AsyncDoubleBufferGroupOffloadHandler`` runs them (``plan.offload`` describes the
handler; ``plan.offload.offload_stalls`` is its closed form for one micro-batch alone on the link).

- After the forward of an offloaded layer its activations leave on the device-to-host stream (copies one after
  another); at a group's deadline layer (``layer_windows``) the compute waits for every copy queued so far.
- Before the backward of a deadline layer the compute waits for the reloads issued so far, then issues that
  group's reload on the host-to-device stream; an offloaded layer's backward waits for its own group, and the
  first layer's for every reload.

A copy is a flow on the engine's fluid network over the GPU's host link: in the cluster graph the GPU's x16 PCIe
link to its NIC (kind ``pcie``), device to host on the GPU -> NIC direction and back on the other, the same link
GPUDirect RDMA traffic of the DP, PP and EP flows crosses, so a gradient bucket leaving through that NIC during a
copy slows it and is slowed by it (the fluid network's equal share per flow). Where the graph gives the GPU no
such link (one node, no NIC) the copy runs on a link of its own at ``inter_node.pcie_bandwidth``. As for the EP
all-to-alls (``engine.ep_flows``), a copy of ``s`` seconds alone moves ``s`` x the link's bandwidth bytes, so
alone it takes exactly the plan's ``offload_copy_s``.

The GPU a lane copies on is its replica's first GPU of the stage (tensor-parallel rank 0): the TP ranks move in
lock-step and each copies its own share over its own link; a folded lane (every replica) uses replica 0's.

What the compute waits for is exposed offload time (``exposed["offload"]``); the copies themselves are drawn on
the lane's ``offload`` row (kinds ``offload_d2h``, ``offload_h2d``) and are its ``busy["offload"]``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import simpy

from simtrain.engine.lane import Lane
from simtrain.plan.collectives import Phase
from simtrain.plan.offload import layer_windows


@dataclass(eq=False)
class _Streams:
    """One lane's two copy streams in the current pass: the last copy queued on each, each group's reload."""

    d2h: simpy.Event | None = None
    h2d: simpy.Event | None = None
    back: dict = field(default_factory=dict)   # group -> its reload's done event


class HostCopies:
    """The activation copies of every lane (module docstring). ``record`` is the engine's record function."""

    def __init__(self, env: simpy.Environment, net, plan, record) -> None:
        self.env, self.net, self.plan, self.record = env, net, plan, record
        self._streams: dict[int, _Streams] = {}
        self._windows: dict[int, tuple[list[int], dict[int, int]]] = {}
        self._links: dict[int, tuple[tuple, tuple, float]] = {}

    @staticmethod
    def applies(plan) -> bool:
        return any(c.offload_groups for c in plan.chunks)

    def _window(self, c) -> tuple[list[int], dict[int, int]]:
        """(each group's deadline layer, deadline layer -> its group) of a chunk."""
        hit = self._windows.get(c.vstage)
        if hit is None:
            w = layer_windows(c.layers, c.offload_groups)
            hit = self._windows[c.vstage] = (w, {layer: g for g, layer in enumerate(w)})
        return hit

    def links(self, lane: Lane) -> tuple[tuple, tuple, float]:
        """(device-to-host link, host-to-device link, bytes/s of a copy alone on them) of the lane's GPU."""
        hit = self._links.get(lane.index)
        if hit is None:
            placement, cluster = self.plan.placement, self.plan.scenario.cluster
            gpu = cluster.gpu(placement.rank(lane.dp or 0, 0, lane.rank))
            nic = _host_link_end(cluster, gpu)
            if nic is None:       # no PCIe link in the graph: a link of the GPU's own, nothing else crosses it
                nic = f"{gpu}.host"
                rate = self.plan.scenario.hardware.inter_node.pcie_bandwidth
                self.net.capacity[(gpu, nic)] = self.net.capacity[(nic, gpu)] = rate
            else:
                rate = cluster.bandwidth((gpu, nic))
            hit = self._links[lane.index] = ((gpu, nic), (nic, gpu), rate)
        return hit

    def begin(self, lane: Lane) -> None:
        """A new forward or backward pass of the lane: its copy streams start idle (the handler's last wait in
        each pass covers every copy of the pass)."""
        self._streams[lane.index] = _Streams()

    def after_forward(self, lane: Lane, c, i: int, mb: int, v: int):
        """simpy process body: the chunk's i-th layer has run its forward."""
        st = self._streams[lane.index]
        windows, _issue = self._window(c)
        if i < c.offload_groups:
            d2h, _h2d, _rate = self.links(lane)
            st.d2h = self._copy(lane, st.d2h, d2h, "offload_d2h", c, mb, v, c.layer_lo + i)
        if i in windows:
            yield from self._wait(lane, st.d2h)

    def before_backward(self, lane: Lane, c, i: int, mb: int, v: int):
        """simpy process body: the chunk's i-th layer is about to run its backward."""
        st = self._streams[lane.index]
        _windows, issue = self._window(c)
        g = issue.get(i)
        if g is not None:
            yield from self._wait(lane, st.h2d)
            _d2h, h2d, _rate = self.links(lane)
            st.h2d = st.back[g] = self._copy(lane, st.h2d, h2d, "offload_h2d", c, mb, v, c.layer_lo + g)
        if i < c.offload_groups:
            yield from self._wait(lane, st.back.get(i))
        if i == 0:
            yield from self._wait(lane, st.h2d)

    def _wait(self, lane: Lane, event: simpy.Event | None):
        if event is None or event.processed:
            return
        t0 = self.env.now
        yield event
        lane.exposed["offload"] += self.env.now - t0

    def _copy(self, lane: Lane, prev: simpy.Event | None, link: tuple, kind: str, c, mb: int, v: int,
              layer: int) -> simpy.Event:
        """Queue one layer's copy on a stream after ``prev``; returns its done event."""
        env, done = self.env, self.env.event()
        rate = self.links(lane)[2]

        def proc():
            if prev is not None and not prev.processed:
                yield prev
            start = env.now
            yield from self.net.run_phase(Phase(flow_bytes=c.offload_copy_s * rate, latency=0.0, links=((link, 1),)))
            self.record(lane, "offload", kind, start, env.now, mb, v, layer, layer + 1, c.offload_bytes)
            done.succeed()

        env.process(proc())
        return done


def _host_link_end(cluster, gpu: str) -> str | None:
    """The far end of the GPU's ``pcie`` link in the cluster graph (its NIC), None where it has none."""
    if cluster.spec.explicit:
        graph = cluster.graph
        if gpu not in graph:
            return None
        return next((n for n in graph.successors(gpu) if cluster._link((gpu, n))[2] == "pcie"), None)
    return next((n for n in sorted(cluster._links_up(gpu)) if n.startswith("nic")), None)
