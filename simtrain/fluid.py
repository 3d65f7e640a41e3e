"""A fluid model of the network inside a simpy environment.

Transfers share links: each flow gets an equal share of its busiest link,
``rate = min over links of capacity / flows on the link``, counting the flows
of every transfer in flight. Rates are recomputed whenever a transfer starts
or finishes, so a collective slows while another crosses the same NIC and
speeds up again when it ends. (Equal share at the bottleneck is a simple,
conservative stand-in for max-min fairness.)
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import simpy

from simtrain.collectives import Phase

_EPS = 1e-12


@dataclass(eq=False)
class _Flow:
    remaining: float
    links: tuple
    done: simpy.Event
    rate: float = 0.0


@dataclass(eq=False)
class FluidNetwork:
    env: simpy.Environment
    capacity: dict                       # link -> bytes/s (after efficiency and degradation)
    load: dict = field(default_factory=lambda: defaultdict(int))
    active: list = field(default_factory=list)
    _stamp: float = 0.0
    _generation: int = 0

    def run_phase(self, phase: Phase):
        """simpy process body: wait out a phase's latency, then move its bytes."""
        if phase.latency > 0:
            yield self.env.timeout(phase.latency)
        if phase.flow_bytes > 0:
            flow = _Flow(phase.flow_bytes, phase.links, self.env.event())
            self._advance()
            self.active.append(flow)
            for link, count in flow.links:
                self.load[link] += count
            self._rerate()
            yield flow.done

    def _advance(self) -> None:
        now = self.env.now
        dt = now - self._stamp
        if dt > 0:
            for flow in self.active:
                flow.remaining -= flow.rate * dt
        self._stamp = now

    def _rerate(self) -> None:
        cap, load = self.capacity, self.load
        soonest = None
        for flow in self.active:
            flow.rate = min(cap[link] / load[link] for link, _ in flow.links)
            t = max(flow.remaining, 0.0) / flow.rate
            soonest = t if soonest is None or t < soonest else soonest
        self._generation += 1
        if soonest is not None:
            gen = self._generation
            timer = self.env.timeout(soonest)
            timer.callbacks.append(lambda _e, g=gen: self._wake(g))

    def _wake(self, generation: int) -> None:
        if generation != self._generation:
            return
        self._advance()
        finished = [f for f in self.active if f.remaining <= _EPS * max(1.0, f.rate)]
        if not finished:   # floating point: finish the closest one
            finished = [min(self.active, key=lambda f: f.remaining / f.rate)]
        for flow in finished:
            self.active.remove(flow)
            for link, count in flow.links:
                self.load[link] -= count
            flow.done.succeed()
        self._rerate()
