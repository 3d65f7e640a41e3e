"""Symmetry classes of DP replicas: the replicas a fault leaves alike are simulated once.

A *replica* is one DP (x CP) index: the lanes of all its pipeline stages. Full fidelity plays every replica; a
straggler or a degraded link, though, makes only some of them behave differently. The engine's replicas meet in
three ways only:

- DP/ZeRO collectives: a rendezvous of every replica, then one flow per phase over the rings of *all* of them
  (``dp_phases(..., every=True)``), so its rate is the slowest link of any ring. It is one flow for everyone: a
  degraded link on a DP ring slows every replica alike and needs no class of its own.
- TP (and CP, EP) collectives: fixed times per lane (``Plan.tp_scale`` for a replica whose TP routes cross a
  degraded link); they meet no other replica's traffic.
- pipeline sends: one flow per replica and stage boundary over its own routes, sharing links with whatever else
  is in flight.

So a replica is *touched*, and gets lanes of its own, when one of its GPUs straggles, when a degraded link lies
on a route of its TP groups or its pipeline sends, or when its pipeline sends share a link with those of a
touched replica (they would meet the touched replica's flows at other times than the rest do; this closes
transitively). Every other replica is alike (the folded fidelity's symmetry assumption, restricted to them) and
they form one class, played by its first replica and carrying its multiplicity: the class's pipeline send loads
its representative's links with the sends of every member that crosses them, as the members' own flows would,
and the DP rendezvous counts one arrival per class. The class's other members' links carry no pipeline flow of
their own, so the DP flow over every ring keeps only the links that can set its pace: those in the scale-up
domains of the replicas played (representatives and touched replicas), those between two switches, and the
degraded ones; a member's links are a translation of its representative's, with the same bandwidth and the same
load in full fidelity (the folded fidelity's assumption), so the minimum rate is the same.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from simtrain.plan.build import Plan
from simtrain.plan.collectives import Phase, collective_shape, p2p_phase
from simtrain.spec.topology import Link


@dataclass(eq=False)
class ReplicaClasses:
    """The replicas of a run grouped into classes that behave alike; each class is played by its first member."""

    plan: Plan
    members: tuple[tuple[int, ...], ...]          # sorted classes, each sorted: members[k][0] represents class k
    degraded: frozenset = frozenset()             # links slower than the template's
    _of: dict = field(default_factory=dict, repr=False)
    _phases: dict = field(default_factory=dict, repr=False)
    _played: set | None = field(default=None, repr=False)   # scale-up domains of the replicas played
    _kept: dict = field(default_factory=dict, repr=False)    # link -> can it set a DP collective's pace

    def __post_init__(self) -> None:
        self._of = {c[0]: c for c in self.members}

    def of(self, representative: int) -> tuple[int, ...]:
        """The replicas the class played by ``representative`` stands for."""
        return self._of[representative]

    @property
    def touched(self) -> int:
        """Replicas simulated on their own (classes of one)."""
        return sum(1 for c in self.members if len(c) == 1)

    def pp_phase(self, nbytes: float, src_rank: int, dst_rank: int, representative: int) -> Phase:
        """A class's pipeline send: its representative's TP pairs set the pace; every member's pairs load the
        representative's links where they cross them (a class of one: exactly the full fidelity's send)."""
        key = (nbytes, src_rank, dst_rank, representative)
        hit = self._phases.get(key)
        if hit is None:
            pl = self.plan.placement
            pairs = [(pl.rank(d, t, src_rank), pl.rank(d, t, dst_rank)) for d in self.of(representative)
                     for t in range(pl.tp)]
            hit = self._phases[key] = p2p_phase(nbytes, pairs, self.plan.scenario.cluster, chosen=pl.tp)
        return hit


    def dp_phases(self, collective: str, nbytes: float, pp_rank: int) -> list[Phase]:
        """A DP/ZeRO collective of one stage over every ring, on the links that can set its pace (module text)."""
        if nbytes <= 0:
            return []
        key = ("dp", collective, pp_rank)
        shape = self._phases.get(key)
        if shape is None:
            plan, cluster = self.plan, self.plan.scenario.cluster
            if cluster.spec.explicit:      # no translation symmetry to lean on: every link
                shape = None
            else:
                shape = collective_shape(collective, plan._groups("dp", pp_rank, None), cluster, True,
                                         keep=self._keeps)
            self._phases[key] = shape
        if shape is None:
            return self.plan.dp_phases(collective, nbytes, pp_rank, True)
        return [s.phase(nbytes) for s in shape]

    def _keeps(self, link: Link) -> bool:
        if self._played is None:
            pl, cluster = self.plan.placement, self.plan.scenario.cluster
            self._played = {cluster.domain_of(pl.rank(c[0], t, p))
                            for c in self.members for p in range(pl.pp) for t in range(pl.tp)}
        hit = self._kept.get(link)
        if hit is None:
            domains = self.plan.scenario.cluster.local_domains((link,))
            hit = self._kept[link] = link in self.degraded or domains is None or not domains.isdisjoint(self._played)
        return hit


def _pp_rank_pairs(plan: Plan) -> list[tuple[int, int]]:
    """(source, destination) pipeline ranks of every send a step makes, forward and backward."""
    layout = plan.layout
    out = set()
    for v, nxt in enumerate(layout.next):
        a, b = layout.rank[v], layout.rank[nxt] if nxt >= 0 else -1
        if nxt >= 0 and a != b:
            out.update({(a, b), (b, a)})
    if plan.tied_ends is not None:   # the embedding's gradient sum between the ranks that hold it and its copy
        out.update({plan.tied_ends, plan.tied_ends[::-1]})
    if plan.scenario.parallel.schedule == "dualpipe":   # the mirror ranks' gradient sum
        pp = plan.scenario.parallel.pp
        out.update((r, pp - 1 - r) for r in range(pp) if r != pp - 1 - r)
    return sorted(out)


def _pp_gpu_pairs(plan: Plan, d: int, rank_pairs) -> list[tuple[int, int]]:
    pl = plan.placement
    return [(pl.rank(d, t, a), pl.rank(d, t, b)) for a, b in rank_pairs for t in range(pl.tp)]


def _tp_gpu_pairs(plan: Plan, d: int) -> list[tuple[int, int]]:
    """Every ordered pair of a replica's TP groups (a superset of the ring neighbours any collective form uses)."""
    pl = plan.placement
    out = []
    for p in range(pl.pp):
        group = pl.tp_group(d, p)
        out.extend((a, b) for a in group for b in group if a != b)
    return out


def _replicas_near(plan: Plan, links) -> range | set[int]:
    """The replicas whose routes can cross ``links``: those with a GPU in the scale-up domains that own them
    (every replica when a link joins two switches or the topology is explicit)."""
    pl, cluster = plan.placement, plan.scenario.cluster
    domains = cluster.local_domains(links)
    if domains is None:
        return range(pl.dp)
    per = cluster.domain_gpus
    return {pl.coord(g).dp for dom in domains for g in range(dom * per, min((dom + 1) * per, plan.scenario.gpus))}


def _crosses(cluster, pairs, links: set[Link]) -> bool:
    return any(link in links for a, b in pairs for link in cluster.route(a, b, cache=False))


def symmetry_classes(plan: Plan, slowdowns: dict[int, float], degraded: set[Link]) -> ReplicaClasses:
    """The classes of a run with stragglers (``slowdowns``: GPU rank -> factor) and ``degraded`` links."""
    pl, cluster = plan.placement, plan.scenario.cluster
    touched = {pl.coord(rank).dp for rank, f in slowdowns.items() if f != 1.0}
    rank_pairs = _pp_rank_pairs(plan)
    if degraded:
        for d in sorted(set(_replicas_near(plan, degraded)) - touched):
            if _crosses(cluster, _tp_gpu_pairs(plan, d) + _pp_gpu_pairs(plan, d, rank_pairs), degraded):
                touched.add(d)
    # the replicas whose pipeline sends share a link with a touched replica's, until none is left
    frontier = set(touched)
    while frontier:
        links = {link for d in frontier for a, b in _pp_gpu_pairs(plan, d, rank_pairs) for link in cluster.route(a, b)}
        frontier = set()
        if links:
            for d in sorted(set(_replicas_near(plan, links)) - touched):
                if _crosses(cluster, _pp_gpu_pairs(plan, d, rank_pairs), links):
                    frontier.add(d)
        touched |= frontier
    rest = tuple(d for d in range(pl.dp) if d not in touched)
    members = sorted([(d,) for d in touched] + ([rest] if rest else []))
    return ReplicaClasses(plan, tuple(members), frozenset(degraded))
