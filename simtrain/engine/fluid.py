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
from operator import truediv

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
    links: tuple              # (link, flows on it) pairs
    names: tuple              # the links alone
    done: simpy.Event
    rate: float = 0.0
    stamp: float = 0.0
    finish: float = 0.0       # when it ends at its current rate


@dataclass(eq=False)
class FluidNetwork:
    env: simpy.Environment
    capacity: dict                       # link -> bytes/s (after efficiency and degradation)
    load: dict = field(default_factory=lambda: defaultdict(int))
    on_link: dict = field(default_factory=lambda: defaultdict(dict))   # link -> {flow: None}, ordered
    active: dict = field(default_factory=dict)                          # {flow: None}, ordered
    _generation: int = 0
    _names: dict = field(default_factory=dict)   # id(phase links) -> (phase links, the links alone)

    def run_phase(self, phase: Phase):
        """simpy process body: wait out a phase's latency, then move its bytes."""
        if phase.latency > 0:
            yield self.env.timeout(phase.latency)
        if phase.flow_bytes > 0:
            flow = _Flow(phase.flow_bytes, phase.links, self._link_names(phase.links), self.env.event(),
                         stamp=self.env.now)
            self.active[flow] = None
            load, on_link = self.load, self.on_link
            sharing: dict = {}    # the flows in flight that cross at least one of its links, itself included
            for link, count in flow.links:
                load[link] += count
                flows = on_link[link]
                flows[flow] = None
                sharing.update(flows)
            self._rerate(sharing)
            yield flow.done

    def _link_names(self, links: tuple) -> tuple:
        """The links of a phase's (link, flows) pairs: a ring shape's phases share one tuple of pairs, so the names
        are worked out once per shape (the entry holds the tuple, so its identity cannot be reused)."""
        hit = self._names.get(id(links))
        if hit is None or hit[0] is not links:
            hit = self._names[id(links)] = (links, tuple(link for link, _ in links))
        return hit[1]

    def _rerate(self, flows) -> None:
        now = self.env.now
        cap, load = self.capacity, self.load
        for f in flows:
            f.remaining -= f.rate * (now - f.stamp)
            f.stamp = now
            f.rate = min(map(truediv, map(cap.__getitem__, f.names), map(load.__getitem__, f.names)))
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
        touched: dict = {}    # the flows in flight that shared a link with a finished one
        load, on_link = self.load, self.on_link
        for flow in finished:
            del self.active[flow]
            for link, count in flow.links:
                load[link] -= count
                flows = on_link[link]
                del flows[flow]
                touched.update(flows)
            flow.done.succeed()
        self._rerate(f for f in touched if f in self.active)
