"""Symmetric pipeline stages share one EP shape: the shape computed for one stage, moved onto another stage's links,
equals the shape computed for that stage from scratch, and reports are byte-identical with and without the reuse."""

from __future__ import annotations

import json

import pytest
from conftest import REPO, hardware_variant, make_scenario

from simtrain.engine.simulation import simulate
from simtrain.plan.collectives import all_to_all_shape, collective_shape, stage_shape
from simtrain.spec.placement import placement_of
from simtrain.spec.topology import Cluster


def _scenario(hardware, nodes, dp, pp, ep, dispatcher="alltoall"):
    return make_scenario(hardware=hardware, nodes=nodes, model="qwen3-30b-a3b",
                         training={"seq_len": 1024, "global_batch": 2 * dp, "micro_batch": 1, "dropout": False},
                         parallel={"dp": dp, "tp": 1, "pp": pp, "ep": ep, "moe_dispatcher": dispatcher})


def _fat_tree(tmp_path):
    return hardware_variant(tmp_path, {"inter_node.topology": "fat-tree", "inter_node.nodes_per_leaf": 4},
                            base=REPO / "hardware" / "dgx-h100.yaml", name="fat_tree")


@pytest.mark.parametrize("where", ["rail", "fat_tree", "nvl72"])
def test_moved_shape_equals_the_stage_own_shape(where, tmp_path):
    """Every stage's all-to-all and all-gather shapes, reused from a symmetric stage, equal its own from scratch."""
    if where == "rail":       # 16-GPU stages over 2 nodes: period 8, every stage reuses stage 0
        sc = _scenario("dgx-h100", 8, 16, 4, 16)
    elif where == "fat_tree":   # 16-GPU stages, leaves of 4 nodes (32 GPUs): stages 0, 2 and 1, 3 pair up
        sc = _scenario(str(_fat_tree(tmp_path)), 8, 16, 4, 16)
    else:                        # one 72-GPU NVL72 domain per stage
        sc = _scenario("gb200-nvl72", 36, 72, 2, 8)
    cluster, pl = sc.cluster, placement_of(sc)
    cluster.shapes.clear()
    stage = pl.tp * pl.dp
    for p in range(pl.pp):
        own = all_to_all_shape(pl.ep_groups(p), cluster)
        reused = stage_shape(cluster, ("test", "a2a"), p * stage, lambda p=p: all_to_all_shape(pl.ep_groups(p),
                                                                                              cluster))
        assert reused == own
        blocks = [pl.expert_block(d, p) for d in range(pl.edp)]
        assert stage_shape(cluster, ("test", "ag"), p * stage, lambda blocks=blocks: collective_shape(
            "all_gather", blocks, cluster)) == collective_shape("all_gather", blocks, cluster)
    computed = [k for k in cluster.shapes if k[:2] == ("test", "a2a") and "mod" in k]   # built, not moved
    assert len(computed) == {"rail": 1, "fat_tree": 2, "nvl72": 1}[where]


@pytest.mark.parametrize("dispatcher", ["alltoall", "allgather"])
def test_reports_identical_without_reuse(dispatcher, monkeypatch):
    """A 4-stage EP run across nodes gives the same JSON report when every stage computes its own shapes."""
    sc = _scenario("dgx-h100", 8, 16, 4, 16, dispatcher)
    sc.cluster.shapes.clear()
    reused = json.dumps(simulate(sc).to_dict(), sort_keys=True)
    sc.cluster.shapes.clear()
    monkeypatch.setattr(Cluster, "translation_period", lambda self: None)
    own = json.dumps(simulate(sc).to_dict(), sort_keys=True)
    assert reused == own


def test_dp_collectives_of_every_stage_equal_their_own_shapes(tmp_path):
    """The DP reduce-scatter of each pipeline stage, built once and moved (stage_shape in Plan.dp_phases), has the
    same links and flow counts as the shape computed from that stage's own groups."""
    from simtrain.plan.build import build_plan
    from simtrain.spec.scenario import load_scenario

    s = load_scenario(REPO / "scenarios" / "dp8_pp4_tp2.yaml")     # 64 GPUs on 8 nodes: DP rings cross nodes
    plan = build_plan(s)
    pl = plan.placement
    for p in range(pl.pp):
        moved = plan.dp_phases("reduce_scatter", 1e9, p)
        own = [sh.phase(1e9) for sh in collective_shape("reduce_scatter", [pl.dp_group(t, p) for t in range(pl.tp)],
                                                        s.cluster)]
        assert moved == own


def test_the_ring_rate_cache_keeps_a_bounded_number_of_entries():
    """Bottleneck rates are kept per link tuple, at most _KEEP_RATES of them (the newest): ad-hoc phases of plans
    built per layout do not accumulate in a long session; a kept rate is min(bandwidth / flows) over the links."""
    from simtrain.plan import collectives
    from simtrain.spec.scenario import load_scenario

    s = load_scenario(REPO / "scenarios" / "pp4_dp4.yaml")
    cluster = s.cluster
    link = next(iter(cluster.graph.edges))
    tuples = [((link, k + 1),) for k in range(collectives._KEEP_RATES + 10)]
    rates = [collectives.bottleneck_rate(t, cluster) for t in tuples]
    assert rates[3] == pytest.approx(cluster.bandwidth(link) / 4)
    assert len(cluster.shapes["rates"]) == collectives._KEEP_RATES
