"""Rank placement: which GPU runs which (dp, tp, pp) coordinate.

Megatron-LM's default order, TP innermost, then DP, then PP: global rank
``r = tp + TP * (dp + DP * pp)`` runs on GPU ``r``. TP groups are therefore
consecutive GPUs and stay inside a node whenever TP divides the node size
(reference article, rule 9 and 14: keep TP on the fastest links).
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

    def _spans(self, group: list[int]) -> bool:
        return len({self.node(r) for r in group}) > 1

    def crosses_nodes(self) -> dict[str, bool]:
        """For each group kind: does any group of that kind span more than one node?"""
        return {
            "tp": any(self._spans(self.tp_group(d, p)) for d in range(self.dp) for p in range(self.pp)),
            "dp": any(self._spans(self.dp_group(t, p)) for t in range(self.tp) for p in range(self.pp)),
            "pp": any(self._spans(self.pp_group(d, t)) for d in range(self.dp) for t in range(self.tp)),
        }


def placement_of(scenario) -> Placement:
    par = scenario.parallel
    gpn = scenario.cluster.gpus_per_node
    return Placement(par.dp, par.tp, par.pp, gpn)
