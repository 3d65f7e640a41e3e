"""Rank placement: which GPU runs which (dp, tp, pp) coordinate.

Megatron-LM's default order, TP innermost, then DP, then PP: global rank
``r = tp + TP * (dp + DP * pp)`` runs on GPU ``r``. TP groups are therefore
consecutive GPUs and stay inside a node whenever TP divides the node size
(reference article, rule 9 and 14: keep TP on the fastest links). The same
order fills a scale-up domain (an NVL72 rack of 18 four-GPU trays) before the
next one: TP, then DP, then PP groups stay on NVLink as long as they fit in
the domain, and only what does not fit crosses the scale-out network.

Expert parallelism folds onto the same GPUs as Megatron-Core does (parallel_state.initialize_model_parallel,
its expert RankGenerator, order tp-ep-dp-pp): within a pipeline stage, local index ``j = tp + TP x dp`` is expert
TP rank ``j % ETP``, EP rank ``(j // ETP) % EP`` and expert-DP rank ``j // (ETP x EP)``. An EP group therefore spans
ETP x EP consecutive GPUs and stays inside a node (the NVLink domain) whenever that block fits in one.

Context parallelism sits between TP and DP (Megatron-Core's order tp-cp-dp-pp): a placement built for cp > 1 has
``dp`` = the scenario's dp x cp, the ranks of a stage that hold the same weights (gradients are reduced and ZeRO
shards over them, and EP folds over tp x cp x dp), and replica index ``d = c + CP x dp``; the CP group of
(tp, dp, pp) is the CP consecutive replicas ``d = CP x dp .. CP x dp + CP - 1`` (ranks TP apart).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Coord:
    rank: int
    dp: int
    tp: int
    pp: int


@dataclass(frozen=True)
class Placement:
    dp: int
    tp: int
    pp: int
    gpus_per_node: int
    domain_gpus: int = 0      # GPUs of one scale-up domain; 0 = one node
    ep: int = 1
    etp: int = 0          # 0: = tp
    cp: int = 1           # context-parallel size; ``dp`` then counts dp x cp replicas

    @property
    def expert_tp(self) -> int:
        return self.etp or self.tp

    @property
    def edp(self) -> int:
        """Expert data-parallel size: the replicas of each expert within a stage (tp x dp / (etp x ep))."""
        return self.tp * self.dp // (self.expert_tp * self.ep)

    def _local(self, j: int, pp: int) -> int:
        return j + self.tp * self.dp * pp

    def ep_group(self, etp: int, edp: int, pp: int) -> list[int]:
        """The EP ranks holding the experts of one expert-TP shard and expert-DP replica."""
        t = self.expert_tp
        return [self._local(etp + t * (e + self.ep * edp), pp) for e in range(self.ep)]

    def ep_groups(self, pp: int) -> list[list[int]]:
        return [self.ep_group(x, d, pp) for d in range(self.edp) for x in range(self.expert_tp)]

    def etp_groups(self, pp: int) -> list[list[int]]:
        """The expert-TP groups (the alltoall dispatcher's all-gather and reduce-scatter of routed rows): the etp
        consecutive GPUs of each EP rank and expert-DP replica."""
        t = self.expert_tp
        return [[self._local(x + t * (e + self.ep * d), pp) for x in range(t)]
                for d in range(self.edp) for e in range(self.ep)]

    def expert_block(self, edp: int, pp: int) -> list[int]:
        """The expert tp x ep group (the all-gather dispatcher's group): ETP x EP consecutive GPUs."""
        n = self.expert_tp * self.ep
        return [self._local(edp * n + j, pp) for j in range(n)]

    def edp_group(self, etp: int, ep: int, pp: int) -> list[int]:
        """The ranks holding the same expert shard: expert gradients are reduced over them."""
        t = self.expert_tp
        return [self._local(etp + t * (ep + self.ep * d), pp) for d in range(self.edp)]

    def edp_groups(self, pp: int) -> list[list[int]]:
        return [self.edp_group(x, e, pp) for e in range(self.ep) for x in range(self.expert_tp)]

    def cp_group(self, dp: int, tp: int, pp: int) -> list[int]:
        """The CP ranks of one sequence (``dp``: the scenario's DP index), in ring order."""
        return [self.rank(self.cp * dp + c, tp, pp) for c in range(self.cp)]

    def cp_groups(self, pp: int) -> list[list[int]]:
        return [self.cp_group(d, t, pp) for d in range(self.dp // self.cp) for t in range(self.tp)]

    def rank(self, dp: int, tp: int, pp: int) -> int:
        return tp + self.tp * (dp + self.dp * pp)

    def coord(self, rank: int) -> Coord:
        tp = rank % self.tp
        dp = (rank // self.tp) % self.dp
        pp = rank // (self.tp * self.dp)
        return Coord(rank, dp, tp, pp)

    def node(self, rank: int) -> int:
        return rank // self.gpus_per_node

    def tp_group(self, dp: int, pp: int) -> list[int]:
        return [self.rank(dp, t, pp) for t in range(self.tp)]

    def dp_group(self, tp: int, pp: int) -> list[int]:
        return [self.rank(d, tp, pp) for d in range(self.dp)]

    def pp_group(self, dp: int, tp: int) -> list[int]:
        return [self.rank(dp, tp, p) for p in range(self.pp)]

    def domain(self, rank: int) -> int:
        return rank // (self.domain_gpus or self.gpus_per_node)

    def _spans(self, group: list[int], where=None) -> bool:
        return len({(where or self.node)(r) for r in group}) > 1

    def crosses_nodes(self, where=None) -> dict[str, bool]:
        """For each group kind: does any group of that kind span more than one node (or ``where``'s unit)?"""
        out = {
            "tp": any(self._spans(self.tp_group(d, p), where) for d in range(self.dp) for p in range(self.pp)),
            "dp": any(self._spans(self.dp_group(t, p), where) for t in range(self.tp) for p in range(self.pp)),
            "pp": any(self._spans(self.pp_group(d, t), where) for d in range(self.dp) for t in range(self.tp)),
        }
        if self.cp > 1:   # reported only where there are CP groups (reports without CP keep their keys)
            out["cp"] = any(self._spans(g, where) for p in range(self.pp) for g in self.cp_groups(p))
        if self.ep > 1:   # reported only where there are EP groups (dense reports keep their keys)
            out["ep"] = any(self._spans(g, where) for p in range(self.pp) for g in self.ep_groups(p))
        return out

    def crosses_domains(self) -> dict[str, bool]:
        """For each group kind: does any group of that kind leave its scale-up domain (use the network)?"""
        return self.crosses_nodes(self.domain)

    def report(self) -> dict[str, bool]:
        """The report's placement entries: per group kind, whether it crosses nodes, and, where the scale-up
        domain is larger than a node, whether it leaves the domain."""
        out = {f"{kind}_group_crosses_nodes": v for kind, v in self.crosses_nodes().items()}
        if self.domain_gpus and self.domain_gpus != self.gpus_per_node:
            out.update({f"{kind}_group_crosses_domains": v for kind, v in self.crosses_domains().items()})
        return out


def placement_of(scenario) -> Placement:
    par = scenario.parallel
    cluster = scenario.cluster
    dp = par.dp * par.cp
    if scenario.model.moe is not None:
        return Placement(dp, par.tp, par.pp, cluster.gpus_per_node, cluster.domain_gpus, ep=par.ep,
                         etp=par.etp or par.tp, cp=par.cp)
    return Placement(dp, par.tp, par.pp, cluster.gpus_per_node, cluster.domain_gpus, cp=par.cp)
