"""Symmetry folding (issue 7): one lane per pipeline stage standing for every DP replica gives the
same step as one lane per (DP replica, stage) on a homogeneous cluster.

Why they must agree: in a homogeneous cluster every DP replica runs the same schedule on the same
kind of GPUs and the same kind of links, and the folded lane counts the other replicas' flows on
every shared link. Nothing distinguishes one replica from another, so the full simulation's lanes
all finish together and at the folded lane's time. The layouts below cover every code path that
differs between the two modes: DP rings inside a node, across nodes (flat and hierarchical),
across a fat tree with shared NICs, pipeline sends across nodes, ZeRO 1/2/3 and the three
schedules, up to 128 GPUs.
"""

from __future__ import annotations

import pytest
from conftest import make_scenario

from simtrain.engine.simulation import simulate

#: (id, hardware, nodes, parallel, training); small GPT-style model (8 layers, h = 1024) so that each
#: case runs in well under a second even in full fidelity.
LAYOUTS = [
    ("dp8", "dgx-h100", 1, {"dp": 8}, {"global_batch": 16}),
    ("tp2_dp4_zero1_sp", "dgx-h100", 1, {"tp": 2, "dp": 4, "zero": 1, "sequence_parallel": True},
     {"global_batch": 16}),
    ("pp4_dp2_1f1b", "dgx-h100", 1, {"pp": 4, "dp": 2}, {"global_batch": 16}),
    ("pp2_dp4_gpipe", "dgx-h100", 1, {"pp": 2, "dp": 4, "schedule": "gpipe"}, {"global_batch": 16}),
    ("pp2_vpp2_dp4_interleaved", "dgx-h100", 1,
     {"pp": 2, "vpp": 2, "dp": 4, "schedule": "interleaved-1f1b"}, {"global_batch": 16}),
    ("dp8_zero3", "dgx-h100", 1, {"dp": 8, "zero": 3}, {"global_batch": 16}),
    ("pp2_dp4_zero3", "dgx-h100", 1, {"pp": 2, "dp": 4, "zero": 3}, {"global_batch": 16}),
    ("dp16_2nodes_hierarchical", "dgx-h100", 2, {"dp": 16}, {"global_batch": 32}),
    ("pp2_dp8_2nodes_sends_cross", "dgx-h100", 2, {"pp": 2, "dp": 8}, {"global_batch": 32}),
    ("tp4_pp2_dp4_4nodes", "dgx-h100", 4, {"tp": 4, "pp": 2, "dp": 4, "zero": 1}, {"global_batch": 32}),
    ("tp8_pp4_dp4_16nodes", "dgx-h100", 16, {"tp": 8, "pp": 4, "dp": 4, "zero": 1}, {"global_batch": 32}),
    ("pp2_dp64_16nodes_zero2", "dgx-h100", 16, {"pp": 2, "dp": 64, "zero": 2}, {"global_batch": 128}),
    ("tp2_pp4_vpp2_dp16_16nodes", "dgx-h100", 16,
     {"tp": 2, "pp": 4, "vpp": 2, "dp": 16, "schedule": "interleaved-1f1b", "zero": 1}, {"global_batch": 128}),
    ("fat_tree_shared_nics_tp2_pp2_dp32", "pcie-l40s", 16, {"tp": 2, "pp": 2, "dp": 32, "zero": 1},
     {"global_batch": 64}),
]


def _pair(hardware: str, nodes: int, parallel: dict, training: dict):
    sc = make_scenario(hardware=hardware, nodes=nodes, gpus_per_node=8, parallel=parallel, training=training)
    return simulate(sc, fidelity="folded"), simulate(sc, fidelity="full")


@pytest.mark.parametrize("case", LAYOUTS, ids=[c[0] for c in LAYOUTS])
def test_folded_and_full_give_the_same_step_time(case):
    """On a homogeneous cluster the folded step time equals the full-fidelity one (rel 1e-9)."""
    _, hardware, nodes, parallel, training = case
    folded, full = _pair(hardware, nodes, parallel, training)
    assert folded.fidelity == "folded" and full.fidelity == "full"
    assert folded.gpus == full.gpus <= 128
    assert folded.step_time_s == pytest.approx(full.step_time_s, rel=1e-9)


@pytest.mark.parametrize("case", LAYOUTS, ids=[c[0] for c in LAYOUTS])
def test_folded_and_full_give_the_same_peak_memory_per_device(case):
    """Every GPU's peak memory is the same in folded and full fidelity (rel 1e-9), rank by rank."""
    _, hardware, nodes, parallel, training = case
    folded, full = _pair(hardware, nodes, parallel, training)
    by_rank_folded = {d.rank: d.peak_memory_bytes for d in folded.devices}
    by_rank_full = {d.rank: d.peak_memory_bytes for d in full.devices}
    assert sorted(by_rank_folded) == sorted(by_rank_full) == list(range(folded.gpus))
    for rank, peak in by_rank_full.items():
        assert by_rank_folded[rank] == pytest.approx(peak, rel=1e-9), f"rank {rank}"
    assert folded.peak_memory_bytes_max == pytest.approx(full.peak_memory_bytes_max, rel=1e-9)


def test_full_fidelity_simulates_one_lane_per_replica_and_stage():
    """Full fidelity plays dp x pp lanes and folded pp lanes, so full schedules more events."""
    folded, full = _pair("dgx-h100", 2, {"pp": 2, "dp": 8}, {"global_batch": 32})
    assert len(full.timeline.lanes) == 8 * 2
    assert len(folded.timeline.lanes) == 2
    assert full.events > folded.events
