"""Rank placement: TP innermost, then DP, then PP (issue 2, deliverable 6).

Megatron-LM's default rank order (Narayanan et al. 2021, Sec. 3; Megatron ``parallel_state``):
TP groups are consecutive ranks, so they stay inside a node whenever TP divides the
node size (reference article, rules 9 and 14).
"""

from __future__ import annotations

import itertools

import pytest
from conftest import make_scenario

from simtrain.spec.placement import Placement, placement_of


def test_tp_is_innermost():
    """Ranks of one TP group are consecutive; DP strides by TP; PP strides by TP x DP."""
    pl = Placement(dp=4, tp=2, pp=3, gpus_per_node=8)
    assert pl.tp_group(0, 0) == [0, 1]
    assert pl.tp_group(1, 0) == [2, 3]
    assert pl.dp_group(0, 0) == [0, 2, 4, 6]
    assert pl.dp_group(1, 1) == [9, 11, 13, 15]
    assert pl.pp_group(0, 0) == [0, 8, 16]
    assert pl.pp_group(3, 1) == [7, 15, 23]


def test_coord_inverts_rank():
    """coord(rank(dp, tp, pp)) gives back (dp, tp, pp) for every coordinate."""
    pl = Placement(dp=3, tp=4, pp=2, gpus_per_node=8)
    seen = set()
    for d, t, p in itertools.product(range(3), range(4), range(2)):
        r = pl.rank(d, t, p)
        c = pl.coord(r)
        assert (c.dp, c.tp, c.pp, c.rank) == (d, t, p, r)
        seen.add(r)
    assert seen == set(range(24))


@pytest.mark.parametrize("kind", ["tp", "dp", "pp"])
def test_groups_partition_the_ranks(kind):
    """The groups of each kind cover every rank exactly once."""
    pl = Placement(dp=2, tp=4, pp=3, gpus_per_node=8)
    if kind == "tp":
        groups = [pl.tp_group(d, p) for d in range(2) for p in range(3)]
    elif kind == "dp":
        groups = [pl.dp_group(t, p) for t in range(4) for p in range(3)]
    else:
        groups = [pl.pp_group(d, t) for d in range(2) for t in range(4)]
    flat = sorted(r for g in groups for r in g)
    assert flat == list(range(24))


def test_node_of_rank():
    """Rank r runs on node r // gpus_per_node."""
    pl = Placement(dp=4, tp=2, pp=2, gpus_per_node=8)
    assert [pl.node(r) for r in (0, 7, 8, 15)] == [0, 0, 1, 1]


@pytest.mark.parametrize(("dp", "tp", "pp", "gpn", "expected"), [
    (4, 2, 2, 8, {"tp": False, "dp": False, "pp": True}),    # a stage's 8 ranks fill one node
    (4, 2, 2, 4, {"tp": False, "dp": True, "pp": True}),     # DP group {0,2,4,6} spans two 4-GPU nodes
    (1, 8, 2, 8, {"tp": False, "dp": False, "pp": True}),    # TP=8 fills a node
    (1, 16, 1, 8, {"tp": True, "dp": False, "pp": False}),   # TP=16 cannot fit an 8-GPU node
    (8, 1, 1, 8, {"tp": False, "dp": False, "pp": False}),   # one node
])
def test_crosses_nodes_report(dp, tp, pp, gpn, expected):
    """crosses_nodes says, per group kind, whether a group spans nodes (hand-placed examples)."""
    assert Placement(dp=dp, tp=tp, pp=pp, gpus_per_node=gpn).crosses_nodes() == expected


def test_crosses_nodes_looks_at_every_group():
    """A kind crosses nodes if any of its groups does, not only the first."""
    pl = Placement(dp=4, tp=3, pp=1, gpus_per_node=4)
    assert pl.tp_group(1, 0) == [3, 4, 5]   # ranks 3 (node 0) and 4, 5 (node 1)
    assert pl.crosses_nodes()["tp"] is True


def test_scenario_placement_uses_node_size():
    """placement_of(scenario) takes the layout and the node size from the scenario."""
    s = make_scenario(nodes=2, model="llama2-7b", training={"seq_len": 1024, "global_batch": 8},
                      parallel={"dp": 2, "tp": 4, "pp": 2})
    pl = placement_of(s)
    assert (pl.dp, pl.tp, pl.pp, pl.gpus_per_node) == (2, 4, 2, 8)
    assert pl.crosses_nodes() == {"tp": False, "dp": False, "pp": True}
