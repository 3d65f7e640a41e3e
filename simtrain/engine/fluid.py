"""A fluid model of the network inside a simpy environment.

Transfers share links: each flow gets an equal share of its busiest link,
``rate = min over links of capacity / flows on the link``, counting the flows
of every transfer in flight. Rates are recomputed whenever a transfer starts
or finishes, so a collective slows while another crosses the same NIC and
speeds up again when it ends. (Equal share at the bottleneck is a simple,
conservative stand-in for max-min fairness.)

Only the transfers that share a link with the one that started or finished
change rate, so only they are re-rated: the cost of an event grows with the
traffic it meets, not with everything in flight. Flows are kept in insertion-ordered dicts
(never sets) so that equal inputs replay in the same order: reports stay byte-identical.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import simpy

from simtrain.plan.collectives import Phase

_EPS = 1e-12


class LinkCapacity(dict):
    """Link -> bytes/s, looked up on first use: the cluster's bandwidth times the link's degradation factor."""

    def __init__(self, cluster, scale: dict) -> None:
        super().__init__()
        self.cluster, self.scale = cluster, scale

    def __missing__(self, link):
        value = self[link] = self.cluster.bandwidth(link) * self.scale.get(link, 1.0)
        return value


@dataclass(eq=False)
class _Flow:
    remaining: float          # bytes left at time `stamp`
    links: tuple
    done: simpy.Event
    rate: float = 0.0
    stamp: float = 0.0
    finish: float = 0.0       # when it ends at its current rate
    alone: float = 0.0        # its rate with no other flow: min over its links of capacity / its own flows there
    shared: dict = field(default_factory=dict)   # its links that other flows crossed since it started (ordered)


@dataclass(eq=False)
class FluidNetwork:
    env: simpy.Environment
    capacity: dict                       # link -> bytes/s (after efficiency and degradation)
    load: dict = field(default_factory=lambda: defaultdict(int))
    on_link: dict = field(default_factory=lambda: defaultdict(dict))   # link -> {flow: None}, ordered
    active: dict = field(default_factory=dict)                          # {flow: None}, ordered
    _generation: int = 0
    _alone_rates: dict = field(default_factory=dict)                    # id(links) -> (links, alone rate)

    def run_phase(self, phase: Phase):
        """simpy process body: wait out a phase's latency, then move its bytes."""
        if phase.latency > 0:
            yield self.env.timeout(phase.latency)
        if phase.flow_bytes > 0:
            flow = _Flow(phase.flow_bytes, phase.links, self.env.event(), stamp=self.env.now)
            flow.alone = self._alone(flow.links)
            self.active[flow] = None
            load, on_link, shared = self.load, self.on_link, flow.shared
            for link, count in flow.links:
                load[link] += count
                others = on_link[link]
                if others:
                    shared[link] = None
                    for other in others:
                        other.shared[link] = None
                others[flow] = None
            self._rerate(self._sharing(flow))
            yield flow.done

    def _alone(self, links: tuple) -> float:
        """min over the links of capacity / flows, kept per long link tuple (a collective's shapes reuse theirs)."""
        if len(links) < 16:
            cap = self.capacity
            return min(cap[link] / count for link, count in links)
        hit = self._alone_rates.get(id(links))
        if hit is None or hit[0] is not links:
            cap = self.capacity
            hit = self._alone_rates[id(links)] = (links, min(cap[link] / count for link, count in links))
        return hit[1]

    def _sharing(self, flow: _Flow) -> dict:
        """The flows in flight that cross at least one of ``flow``'s links (``flow`` included if active): only its
        shared links can hold others (``_Flow.shared``), so a flow that met few looks at those alone."""
        out: dict = {}
        if len(flow.shared) < len(flow.links):
            if flow in self.active:
                out[flow] = None
            for link in flow.shared:
                out.update(self.on_link[link])
            return out
        for link, _ in flow.links:
            out.update(self.on_link[link])
        return out

    def _rerate(self, flows) -> None:
        now = self.env.now
        cap, load = self.capacity, self.load
        for f in flows:
            f.remaining -= f.rate * (now - f.stamp)
            f.stamp = now
            # min over its links of capacity / flows: a link no other flow crossed gives capacity / its own flows,
            # never below ``alone``, so only the shared ones need a look (an all-to-all carries thousands of links)
            f.rate = min(f.alone, min((cap[link] / load[link] for link in f.shared), default=f.alone))
            f.finish = now + max(f.remaining, 0.0) / f.rate
        self._schedule()

    def _schedule(self) -> None:
        self._generation += 1
        if self.active:
            soonest = min(f.finish for f in self.active)
            gen = self._generation
            timer = self.env.timeout(max(soonest - self.env.now, 0.0))
            timer.callbacks.append(lambda _e, g=gen: self._wake(g))

    def _wake(self, generation: int) -> None:
        if generation != self._generation:
            return
        now = self.env.now
        finished = [f for f in self.active if f.finish <= now * (1 + _EPS) + _EPS]
        if not finished:   # floating point: finish the closest one
            finished = [min(self.active, key=lambda f: f.finish)]
        touched: dict = {}
        load, on_link = self.load, self.on_link
        for flow in finished:
            del self.active[flow]
            for link, count in flow.links:
                load[link] -= count
                del on_link[link][flow]
            touched.update(self._sharing(flow))
            flow.done.succeed()
        self._rerate(f for f in touched if f in self.active)
