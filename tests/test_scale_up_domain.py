"""Scale-up domains larger than a node (GB200 NVL72: 18 trays of 4 GPUs on one NVLink domain) and full-mesh fabrics
(MI300X Infinity Fabric): routes, placement and collectives against hand calculations."""

from __future__ import annotations

import simtrain
from simtrain.plan.build import build_plan
from simtrain.plan.collectives import collective_shape, p2p_phase
from simtrain.report.text import run_text
from simtrain.spec.placement import placement_of
from simtrain.spec.scenario import scenario_from_dict


def _nvl72(nodes: int, dp: int, tp: int, pp: int = 1):
    return scenario_from_dict({
        "hardware": "gb200-nvl72", "nodes": nodes, "model": "llama3-8b",
        "training": {"seq_len": 2048, "global_batch": dp * 2, "micro_batch": 1, "dropout": False},
        "parallel": {"dp": dp, "tp": tp, "pp": pp, "sequence_parallel": tp > 1}})


def test_trays_of_one_rack_share_the_nvlink_switch():
    """GPU 0 (tray 0) and GPU 5 (tray 1) of one rack talk through the rack's NVLink switch, not the network."""
    cluster = _nvl72(36, dp=18, tp=8).cluster
    assert cluster.domain_gpus == 72 and cluster.gpus_per_node == 4
    assert cluster.route(0, 5) == (("gpu0", "nvsw0"), ("nvsw0", "gpu5"))
    assert cluster.bandwidth(("gpu0", "nvsw0")) == 900e9 * 0.80   # NVLink 5 per direction x NCCL's 721.8/900


def test_racks_talk_over_the_rails():
    """GPU 0 (rack 0) and GPU 72 (rack 1, first GPU of tray 18) meet on rail 0 through their first NICs."""
    cluster = _nvl72(36, dp=18, tp=8).cluster
    assert cluster.route(0, 72) == (("gpu0", "nic0.0"), ("nic0.0", "rail0"), ("rail0", "nic18.0"), ("nic18.0", "gpu72"))


def test_placement_keeps_tp_inside_the_domain():
    """TP 8 spans two trays of a rack (GPUs 0-7) but never leaves it; DP groups (stride 8 over 144) cross racks."""
    scenario = _nvl72(36, dp=18, tp=8)
    place = placement_of(scenario).report()
    assert place["tp_group_crosses_nodes"] and not place["tp_group_crosses_domains"]
    assert place["dp_group_crosses_domains"]
    result = simtrain.simulate(scenario)
    text = run_text(result)
    assert "TP groups span trays inside one NVLink domain" in text
    assert "DP groups cross NVLink domains (scale-out network)" in text


def test_tp_collectives_stay_on_nvlink():
    """A TP 8 group across two trays runs its reduce-scatter on NVLink links only, as one flat 8-GPU ring."""
    scenario = _nvl72(18, dp=9, tp=8)
    plan = build_plan(scenario)
    groups = [plan.placement.tp_group(d, 0) for d in range(9)]
    shapes = collective_shape("reduce_scatter", groups, scenario.cluster)
    assert len(shapes) == 1 and shapes[0].n == 8
    assert {scenario.cluster._link(link)[2] for link, _ in shapes[0].links} == {"nvswitch"}


def _mi300x(tp: int, dp: int):
    return scenario_from_dict({
        "hardware": "mi300x", "model": "llama3-8b",
        "training": {"seq_len": 2048, "global_batch": dp, "micro_batch": 1, "dropout": False},
        "parallel": {"dp": dp, "tp": tp}})


def test_mesh_send_uses_one_link():
    """On MI300X a single transfer crosses its own 64 GB/s Infinity Fabric link at 75% (48 GB/s), nothing else."""
    cluster = _mi300x(1, 8).cluster
    assert cluster.route(0, 3) == (("gpu0", "gpu3"),)
    phase = p2p_phase(1e9, [(0, 3)], cluster)
    assert [link for link, _ in phase.links] == [("gpu0", "gpu3")]
    assert cluster.bandwidth(("gpu0", "gpu3")) == 64e9 * 0.75


def test_mesh_ring_runs_one_ring_per_link():
    """An 8-GPU ring collective on the mesh splits its bytes over 7 link-disjoint rings: each carries 1/7."""
    scenario = _mi300x(1, 8)
    plan = build_plan(scenario)
    shape = collective_shape("all_reduce", [plan.placement.dp_group(0, 0)], scenario.cluster)[0]
    assert shape.divisor == 7
    assert all(count == 1 for _, count in shape.links)
