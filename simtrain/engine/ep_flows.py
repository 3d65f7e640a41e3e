"""EP dispatch and combine as flows on the shared fluid network, so that they meet the DP gradient buckets, the
pipeline sends and each other on the links they share.

The plan prices one MoE layer's all-to-alls alone (``plan.build_moe.ep_time``: every EP group of the stage at once,
DeepEP's hops at its published efficiencies). Here that time becomes bytes on a *carrier*: the links the stage's
all-to-all flows load, with their flow counts (the alltoall dispatcher: every pair of each EP group,
``collectives.all_to_all_shape``; DeepEP and HybridEP: their NVLink hop's and RDMA hop's flows together,
``deepep.hop_shapes``, one flow crossing both since the hops are pipelined). A segment of ``s`` seconds moves
``s x r`` bytes per flow, ``r`` the carrier's bottleneck rate alone (min over its links of bandwidth / flows), so
alone it takes exactly ``s``; when DP or PP flows cross one of its links the fluid network shares the link (equal
share per flow) and both slow. The lanes of a stage (replicas at full fidelity, classes) meet at each all-to-all, as
the EP group's ranks do; the last lane to arrive starts the flow. A folded run (one lane for every replica of a
stage, its GPUs alike) carries the all-to-all on the links of the stage's first GPU alone (its NVLink port, its PCIe
path to its NIC and the NIC's network links, both ways, with the flow counts the stage's all-to-all puts there, and
the bytes set by those links' own bottleneck, so that alone it still takes its planned time): the DP rings and
pipeline sends of the folded lane cover every GPU of the stage, so that GPU meets what every GPU meets, at a few
links to re-rate instead of thousands (DeepSeek-V3 on 2,048 H100: 6 links, not 400 for one EP group).

The allgather dispatcher's all-gather and reduce-scatter ride the same way: their carrier is the rings' links over
each expert tp x ep block (every ring stage, each link at its largest count, since the two collectives and a
hierarchical ring's stages run one after another). Under ``parallel.ep_overlap`` the merged pairs' all-to-alls are
carried too: ``engine.merged_pair`` plays the pair's two streams live, each all-to-all of the communication stream
a call of :meth:`EPFlows.run`. With one lane per stage (folded) the flow runs in the caller's process, no meeting.
"""

from __future__ import annotations

import simpy

from simtrain.engine.lane import Lane, Rendezvous
from simtrain.plan.collectives import Phase, all_to_all_shape, collective_shape, stage_shape
from simtrain.plan.deepep import hop_shapes


class EPFlows:
    """The EP all-to-alls of every lane, played on the engine's fluid network."""

    def __init__(self, env: simpy.Environment, net, plan, lanes_per_stage: int, folded: bool = False) -> None:
        self.env, self.net, self.plan = env, net, plan
        self.scenario = plan.scenario
        self.lanes_per_stage = lanes_per_stage
        self.folded = folded          # carry the first EP group's flows alone
        self._carriers: dict[int, tuple[tuple, float] | None] = {}
        self._counts: dict[tuple, int] = {}               # (lane index, tag) -> all-to-alls it started
        self._meetings: dict[tuple, Rendezvous] = {}

    @staticmethod
    def applies(scenario) -> bool:
        par = scenario.parallel
        return scenario.model.moe is not None and par.ep > 1 and \
            par.moe_dispatcher in ("alltoall", "allgather", "deepep", "hybridep")

    def carrier(self, pp_rank: int) -> tuple[tuple, float] | None:
        """(links with their flow counts, bytes/s of each flow alone) of the stage's all-to-all flows."""
        if pp_rank not in self._carriers:
            sc, placement = self.scenario, self.plan.placement
            cluster = sc.cluster
            counts: dict = {}
            if sc.parallel.moe_dispatcher in ("deepep", "hybridep"):
                nvl, rdma, _rails = hop_shapes(sc, placement, pp_rank, first_group_only=self.folded)
                shapes = [s for s in (nvl, rdma) if s is not None]
            elif sc.parallel.moe_dispatcher == "allgather":
                shapes = []
                for link, n in _ring_links(sc, placement, pp_rank, self.folded):
                    counts[link] = max(counts.get(link, 0), n)
            else:
                offset = pp_rank * placement.tp * placement.dp
                layout = (placement.dp, placement.tp, placement.pp, placement.ep, placement.expert_tp)
                groups = placement.ep_groups(pp_rank)
                shapes = [stage_shape(cluster, ("ep", "all_to_all_carrier", *layout, self.folded), offset,
                                      lambda: all_to_all_shape(groups[:1] if self.folded else groups, cluster))]
            for shape in shapes:
                if shape is None:
                    continue
                for link, n in shape.phase(1.0).links:
                    counts[link] = counts.get(link, 0) + n
            links = tuple(counts.items())
            if self.folded and links:
                links = _around(links, f"gpu{placement.ep_groups(pp_rank)[0][0]}", cluster) or links
            self._carriers[pp_rank] = (links, min(cluster.bandwidth(lk) / n for lk, n in links)) if links else None
        return self._carriers[pp_rank]

    def run(self, lane: Lane, seconds: float, tag: tuple = ()):
        """simpy process body: one lane's share of an all-to-all of ``seconds`` alone; returns when it is done.
        ``tag`` (micro-batch, virtual stage, layer) names the all-to-all, so that the lanes of a stage meet at the
        same one even where a lane's two overlapped halves reach theirs in another order: the n-th call with a tag
        on a lane meets the n-th call with it on the others (a layer's forward before its backward)."""
        mine = (lane.index, tag)
        count = self._counts.get(mine, 0)
        self._counts[mine] = count + 1
        carrier = self.carrier(lane.rank)
        if carrier is None:
            yield self.env.timeout(seconds)
            return
        links, rate = carrier
        if self.lanes_per_stage == 1:   # no other lane to meet: the flow runs in the caller's process
            yield from self.net.run_phase(Phase(flow_bytes=seconds * rate, latency=0.0, links=links))
            return
        key = (lane.rank, tag, count)
        meeting = self._meetings.get(key)
        if meeting is None:
            meeting = self._meetings[key] = Rendezvous(needed=self.lanes_per_stage, started=self.env.event(),
                                                      done=self.env.event())
        meeting.arrived += 1
        if meeting.arrived == meeting.needed:
            self.env.process(self._move(Phase(flow_bytes=seconds * rate, latency=0.0, links=links), meeting.done))
        yield meeting.done

    def _move(self, phase: Phase, done: simpy.Event):
        yield from self.net.run_phase(phase)
        done.succeed()


def _around(links: tuple, gpu: str, cluster) -> tuple:
    """The links of ``links`` at one GPU: its own (NVLink port, PCIe to its NIC, both ways) and its NIC's (network
    uplink and downlink), with their flow counts."""
    nics = {b if a == gpu else a for (a, b), _ in links if gpu in (a, b) and cluster._link((a, b))[2] == "pcie"}
    near = {gpu} | nics
    return tuple((link, n) for link, n in links if link[0] in near or link[1] in near)


def _ring_links(sc, placement, pp_rank: int, folded: bool) -> list:
    """(link, flows) of the allgather dispatcher's rings on one stage: the all-gather (dispatch) and the
    reduce-scatter (combine) over every expert tp x ep block, each ring stage (a hierarchical ring's intra-node and
    inter-node stages); folded, the first block's links loaded by every block's flows (``collective_shape``'s
    representative). They run one after another, so the caller keeps each link's largest count."""
    cluster = sc.cluster
    blocks = [placement.expert_block(d, pp_rank) for d in range(placement.edp)]
    out = []
    for kind in ("all_gather", "reduce_scatter"):
        key = ("ep", kind, "carrier", placement.dp, placement.tp, placement.pp, placement.ep, placement.expert_tp,
               folded)
        shapes = stage_shape(cluster, key, pp_rank * placement.tp * placement.dp,
                             lambda kind=kind: collective_shape(kind, blocks, cluster, every=not folded))
        for shape in shapes:
            out.extend(shape.phase(1.0).links)
    return out
