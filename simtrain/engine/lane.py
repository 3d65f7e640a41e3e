"""The engine's state: lanes, rendezvous of collectives, the timeline it leaves behind."""

from __future__ import annotations

from dataclasses import dataclass, field

import simpy

#: Record fields: lane, stream, kind, start, end, micro-batch, virtual stage, first layer, last layer+1, bytes
Record = tuple


class EventLimitReached(Exception):
    """The run scheduled more simpy events than its limit (``simulation.max_events``)."""


class CountingEnvironment(simpy.Environment):
    """A simpy environment that counts the events it schedules (for reports and benchmarks) and stops a run
    at ``limit`` of them."""

    def __init__(self, limit: int | None = None) -> None:
        super().__init__()
        self.scheduled = 0
        self.limit = limit

    def schedule(self, event, priority=1, delay=0):
        self.scheduled += 1
        if self.limit is not None and self.scheduled > self.limit:
            raise EventLimitReached(self.scheduled)
        super().schedule(event, priority, delay)


@dataclass(eq=False)
class Lane:
    index: int
    dp: int | None            # None: folded, stands for every DP replica
    rank: int                 # pipeline rank
    slowdown: float = 1.0
    tp_scale: float = 1.0     # this replica's TP collectives vs the symmetric figure (degraded links)
    rng: object | None = None          # numpy.random.Generator when jitter is on
    chains: dict = field(default_factory=dict)
    counters: dict = field(default_factory=dict)
    comm_factors: dict = field(default_factory=dict)   # overlap slowdown -> collectives running now
    comm_change: simpy.Event | None = None   # fires when a collective starts or ends on this lane
    busy: dict = field(default_factory=lambda: {"compute": 0.0, "tp": 0.0, "pp": 0.0, "dp": 0.0})
    exposed: dict = field(default_factory=lambda: {"tp": 0.0, "pp": 0.0, "dp": 0.0})
    bubble: float = 0.0
    # the bubble by where it falls: before the lane's first backward (fill), after its last forward (drain), between
    # them (imbalance: waiting for a slower stage in the steady state); set by the lane's schedule position
    bubble_parts: dict = field(default_factory=lambda: {"fill": 0.0, "drain": 0.0, "imbalance": 0.0})
    phase: str = "fill"
    end: float = 0.0
    act_now: float = 0.0
    act_peak: float = 0.0
    mem_events: list = field(default_factory=list)
    buf_now: float = 0.0          # ZeRO-3 gathered weights and unsharded gradients awaiting their reduce-scatter
    buf_peak: float = 0.0
    buf_events: list = field(default_factory=list)
    compute_lock: simpy.Resource | None = None   # made when overlapped pairs ("FB") share the compute stream


@dataclass(eq=False)
class Rendezvous:
    needed: int
    arrived: int = 0
    started: simpy.Event | None = None
    done: simpy.Event | None = None
    start_time: float = 0.0


@dataclass
class Timeline:
    """What the engine leaves behind: records of every operation and per-lane totals."""

    step_time: float
    lanes: list[Lane]
    records: list[Record]
    events: int
    full: bool                  # lanes per replica (or class of replicas), not one per stage
    classes: tuple[tuple[int, ...], ...] | None = None   # symmetry classes: the replicas each lane's dp stands for
