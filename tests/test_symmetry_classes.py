"""Symmetry classes (issue 25): a run with stragglers or degraded links plays the DP replicas a fault touches on
their own and the others once, as a class carrying its multiplicity, and must give the full fidelity's report.

The expected values are the full-fidelity runs (``fidelity="full"``: one lane per replica and stage, every
replica's own pipeline flows), which share no class code: every report field but the fidelity, the event count,
the notice and the timeline must be the same, to the report's rounding, device by device. The classes
themselves follow by hand from the placement (rank = tp + TP x (dp + DP x pp), GPU = rank) and the routes of
simtrain/spec/topology.py (GPU i of a node sends through NIC i x nics / gpus_per_node of that node).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import make_scenario

from simtrain.engine.classes import symmetry_classes
from simtrain.engine.simulation import _slowdowns, simulate
from simtrain.plan.build import build_plan
from simtrain.spec.scenario import load_scenario

REPO = Path(__file__).resolve().parent.parent


def _report(result) -> dict:
    out = result.to_dict(timeline=False)
    for key in ("fidelity", "events", "warnings"):
        out.pop(key)
    return out


def _agree(sc):
    """Run ``sc`` as its faults make it run and at full fidelity; assert the reports agree; return both."""
    classes, full = simulate(sc), simulate(sc, fidelity="full")
    assert classes.fidelity == "classes" and full.fidelity == "full"
    assert _report(classes) == _report(full)
    notice = [w for w in classes.warnings if "fidelity: classes" in w]
    assert len(notice) == 1
    assert [w for w in classes.warnings if w not in notice] == list(full.warnings)
    return classes, full


def _classes(sc) -> tuple:
    plan = build_plan(sc)
    link_scale = {(d.a, d.b): d.factor for d in sc.simulation.degraded_links}
    return symmetry_classes(plan, _slowdowns(sc), set(link_scale)).members


def _small(hardware: str, nodes: int, parallel: dict, training: dict, simulation: dict):
    return make_scenario(hardware=hardware, nodes=nodes, gpus_per_node=8, parallel=parallel, training=training,
                         simulation=simulation)


@pytest.mark.parametrize("name", ["straggler", "degraded_link"])
def test_bundled_fault_scenarios_agree_with_full_fidelity(name):
    """scenarios/straggler.yaml and degraded_link.yaml: the class run's report is the full run's, field by field."""
    classes, full = _agree(load_scenario(REPO / "scenarios" / f"{name}.yaml"))
    assert classes.events < full.events


def test_bundled_straggler_touches_replica_0_only():
    """straggler.yaml: rank 4 = dp 0 of stage 1 (tp 1, dp 4); replicas 1-3 share no link with replica 0's sends
    (GPU 4 + d -> NIC 0.(4 + d) -> rail 4 + d -> spine -> rail d: one rail pair per replica), so one class of 3."""
    assert _classes(load_scenario(REPO / "scenarios" / "straggler.yaml")) == ((0,), (1, 2, 3))


def test_degraded_link_on_the_dp_ring_only_leaves_one_class():
    """degraded_link.yaml: nic0.0 -> rail0 carries only TP rank 0's DP all-reduce (TP inside the node, pp 1), a
    collective every replica takes part in, so both replicas stay alike."""
    assert _classes(load_scenario(REPO / "scenarios" / "degraded_link.yaml")) == ((0, 1),)


#: pp 2 x dp 8 on two DGX H100 nodes: stage 0 on node 0 (GPU d = replica d), stage 1 on node 1 (GPU 8 + d)
PP2_DP8 = ("dgx-h100", 2, {"pp": 2, "dp": 8}, {"global_batch": 32})


def test_straggler_with_dp_8_plays_two_classes():
    """Rank 11 = dp 3 of stage 1 slows x1.3: replica 3 alone, the seven others as one class, as at full."""
    sc = _small(*PP2_DP8, {"stragglers": [{"rank": 11, "slowdown": 1.3}]})
    assert _classes(sc) == ((0, 1, 2, 4, 5, 6, 7), (3,))
    classes, full = _agree(sc)
    assert classes.events < full.events / 2


def test_degraded_link_on_one_replicas_sends_touches_only_it():
    """nic0.2 -> rail2 at 1/4 carries replica 2's stage-0 -> stage-1 sends only (GPU 2 -> NIC 0.2 -> rail 2 ->
    NIC 1.2 -> GPU 10); stage 0's DP ring stays on node 0's NVSwitch. Replica 2 alone, seven alike."""
    sc = _small(*PP2_DP8, {"degraded_links": [{"a": "nic0.2", "b": "rail2", "factor": 0.25}]})
    assert _classes(sc) == ((0, 1, 3, 4, 5, 6, 7), (2,))
    slowed, _ = _agree(sc)
    healthy = simulate(_small(*PP2_DP8, {}))
    assert slowed.step_time_s > healthy.step_time_s      # the degraded sends do cost time: the test can fail


def test_replicas_sharing_a_nic_with_a_touched_one_get_their_own_lanes():
    """pcie-l40s (4 NICs for 8 GPUs: GPUs 2k and 2k + 1 share NIC k): a straggler in replica 2 (rank 2, stage 0)
    meets replica 3's pipeline sends on NIC 0.1, so replica 3 is simulated on its own too; agrees with full."""
    sc = _small("pcie-l40s", 2, {"pp": 2, "dp": 8}, {"global_batch": 32},
                {"stragglers": [{"rank": 2, "slowdown": 1.3}]})
    assert _classes(sc) == ((0, 1, 4, 5, 6, 7), (2,), (3,))
    _agree(sc)


@pytest.mark.parametrize("parallel, rank", [
    ({"pp": 2, "dp": 4, "zero": 3}, 5),                                     # ZeRO-3 gathers, replica 1
    ({"pp": 2, "vpp": 2, "dp": 4, "schedule": "interleaved-1f1b"}, 2),      # interleaved, replica 2
    ({"pp": 2, "dp": 4, "zero": 2}, 6),                                     # ZeRO-2 per-micro-batch scatters
], ids=["zero3", "interleaved", "zero2"])
def test_straggler_classes_agree_with_full_across_schedules_and_zero(parallel, rank):
    """One straggler on a single node, through ZeRO-2/3 collectives and an interleaved schedule: as at full."""
    sc = _small("dgx-h100", 1, parallel, {"global_batch": 16}, {"stragglers": [{"rank": rank, "slowdown": 1.4}]})
    _agree(sc)


def test_straggler_across_nodes_with_tp_agrees_with_full():
    """tp 4 x pp 2 x dp 4 on 4 nodes (DP rings and sends over the network): rank 4 x 1 + ... = dp 1 of stage 0
    slows; replica 1 alone, the rest alike, as at full."""
    sc = _small("dgx-h100", 4, {"tp": 4, "pp": 2, "dp": 4, "zero": 1}, {"global_batch": 32},
                {"stragglers": [{"rank": 4, "slowdown": 1.3}]})
    assert _classes(sc) == ((0, 2, 3), (1,))
    _agree(sc)


def test_jitter_still_plays_every_lane_and_says_so():
    """Jitter varies every kernel of every GPU: no two replicas are alike, so the run is full and says why."""
    sc = _small(*PP2_DP8, {"jitter": 0.05})
    result = simulate(sc)
    assert result.fidelity == "full"
    assert any("jitter" in w and "fidelity: full" in w for w in result.warnings)


def test_forced_full_fidelity_stays_full():
    """fidelity='full' (--full) overrides the class simulation of a faulted run."""
    sc = _small(*PP2_DP8, {"stragglers": [{"rank": 11, "slowdown": 1.3}]})
    assert simulate(sc, fidelity="full").fidelity == "full"


def test_degraded_link_on_a_dp_ring_far_from_the_played_replica_still_sets_the_pace():
    """dp 16 on two nodes (replica d on GPU d): nic1.3 -> rail3 carries only the cross-node DP ring of GPU 11's
    local rank, a collective of every replica, so all 16 stay one class played by replica 0 on node 0; the
    degraded link on node 1 must still slow the all-reduce as at full."""
    degraded = {"degraded_links": [{"a": "nic1.3", "b": "rail3", "factor": 0.1}]}
    sc = _small("dgx-h100", 2, {"dp": 16}, {"global_batch": 32}, degraded)
    assert _classes(sc) == (tuple(range(16)),)
    slowed, _ = _agree(sc)
    assert slowed.step_time_s > simulate(_small("dgx-h100", 2, {"dp": 16}, {"global_batch": 32}, {})).step_time_s


def test_past_512_gpus_devices_are_listed_per_class_and_stage_with_the_full_runs_figures():
    """640 GPUs (tp 8 x pp 2 x dp 40): as folded lists one entry per stage past 512 GPUs, the class run lists one per
    (class, stage), whose ranks cover every GPU once; rank 331 = tp 3 of replica 1 (331 // 8 % 40) on stage 1
    (331 // 320) makes replica 1 a class of its own. Each entry's figures are those of every member replica's
    entry in the full run (one per replica and stage)."""
    sc = _small("dgx-h100", 80, {"tp": 8, "pp": 2, "dp": 40}, {"global_batch": 80},
                {"stragglers": [{"rank": 331, "slowdown": 1.5}]})
    classes, full = simulate(sc), simulate(sc, fidelity="full")
    assert classes.step_time_s == full.step_time_s
    entries = [d.to_dict() for d in classes.devices]
    assert [(d["dp"], d["pp"], d["count"]) for d in entries] == [(0, 0, 312), (1, 0, 8), (0, 1, 312), (1, 1, 8)]
    assert sorted(r for d in classes.devices for r in d.ranks) == list(range(640))
    by_replica = {(d["dp"], d["pp"]): d for d in (e.to_dict() for e in full.devices)}
    figures = ("busy_s", "exposed_comm_s", "bubble_s", "compute_utilization", "memory")
    for entry, device in zip(entries, classes.devices, strict=True):
        for d in sorted({r // 8 % 40 for r in device.ranks}):
            assert {k: entry[k] for k in figures} == {k: by_replica[(d, entry["pp"])][k] for k in figures}


def test_straggler_with_context_parallelism_agrees_with_full():
    """cp 2: replicas are the dp x cp ranks of a stage (placement d = c + CP x dp); rank 3 = tp 1 of replica 1
    (3 // 2 % 4) on stage 0 is one class, the other three another, as at full."""
    sc = _small("dgx-h100", 2, {"tp": 2, "cp": 2, "pp": 2, "dp": 2}, {"global_batch": 8, "seq_len": 8192},
                {"stragglers": [{"rank": 3, "slowdown": 1.3}]})
    assert _classes(sc) == ((0, 2, 3), (1,))
    _agree(sc)


def test_dualpipe_mirror_sum_over_a_degraded_link_agrees_with_full_fidelity():
    """DualPipe's gradient sum between mirror ranks r and pp - 1 - r is a pipeline flow: a degraded link on one
    replica's mirror route only gives that replica lanes of its own, and the class run equals full fidelity (it was
    1.52 s against 4.35 s when the mirror pairs were not among the routes that make a replica touched)."""
    sc = load_scenario(REPO / "scenarios" / "pp4_dp4.yaml", {
        "nodes": 4, "parallel.dp": 4, "parallel.pp": 8, "parallel.schedule": "dualpipe",
        "simulation.degraded_links": [{"a": "nic0.1", "b": "rail1", "factor": 0.05}]})
    _agree(sc)
