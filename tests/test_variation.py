"""Variation and faults (issue 7): stragglers, degraded links, seeded jitter, ``--samples`` and the
bound on simulated work.

Expected values are hand calculations written next to each test: a straggler's extra compute in
closed form, a slowed link's extra transfer time from the bytes that must cross it, percentiles
by their definition. The idealised node ``tests/data/core_ideal.yaml`` (negligible communication,
ideal kernels) makes step times the pure compute formulas.
"""

from __future__ import annotations

import json
import time

import pytest
from conftest import REPO, make_scenario, run_cli

from simtrain.engine.simulation import simulate
from simtrain.plan.build import build_plan
from simtrain.report.outputs import dumps_json
from simtrain.spec.errors import SimulationLimitError
from simtrain.spec.scenario import load_scenario

SLOW = 1.3


def _straggle(rank: int, slowdown: float = SLOW) -> dict:
    return {"stragglers": [{"rank": rank, "slowdown": slowdown}]}


# --- stragglers -----------------------------------------------------------------------------

def test_straggler_in_pure_data_parallel_makes_the_step_its_slowdown_longer():
    """pp=1, dp=8, no communication cost: one GPU x1.3 slower makes the step (all compute) 1.3x."""
    healthy = simulate(make_scenario(parallel={"dp": 8}, training={"global_batch": 16}))
    slow = simulate(make_scenario(parallel={"dp": 8}, training={"global_batch": 16}, simulation=_straggle(3)))
    assert slow.fidelity == "classes"   # the replicas the fault leaves alike are played once
    assert slow.step_time_s == pytest.approx(SLOW * healthy.step_time_s, rel=1e-6)
    busy = {d.rank: d.busy_s["compute"] for d in slow.devices}
    assert busy[3] == pytest.approx(SLOW * busy[0], rel=5e-9)


def test_healthy_replicas_wait_for_the_straggler_in_exposed_dp_time():
    """pp=1, dp=8, negligible communication, all-reduce after the backward: every healthy GPU computes C and then
    waits (1.3 - 1) x C for the slow one inside the all-reduce. That wait is exposed DP time on each healthy
    device, so each device's compute + exposed communication + bubble is the step; the stage row shows the
    slowest replica (compute 1.3 C, nothing exposed), and the report says the replicas differ."""
    kw = dict(parallel={"dp": 8}, training={"global_batch": 16})
    slow = simulate(make_scenario(**kw, simulation={"overlap_dp": False, **_straggle(3)}))
    c = next(d.busy_s["compute"] for d in slow.devices if d.rank == 0)
    for d in slow.devices:
        wait = 0.0 if d.rank == 3 else (SLOW - 1) * c
        assert d.exposed_comm_s["dp"] == pytest.approx(wait, rel=1e-6, abs=1e-9)   # the ideal links: < 1 ns
        assert d.busy_s["compute"] + sum(d.exposed_comm_s.values()) + d.bubble_s == pytest.approx(slow.step_time_s,
                                                                                                rel=5e-9)
    (stage,) = slow.stages
    assert stage.compute_s == pytest.approx(SLOW * c, rel=5e-9)
    assert stage.compute_s + sum(stage.exposed_comm_s.values()) + stage.bubble_s == pytest.approx(slow.step_time_s,
                                                                                                 rel=5e-9)
    assert any(w.startswith("replicas differ: on stage 0, DP replica 0 spends") for w in slow.warnings)
    healthy = simulate(make_scenario(**kw, simulation={"overlap_dp": False}))
    assert not any(w.startswith("replicas differ") for w in healthy.warnings)


def test_straggler_fraction_slows_that_share_of_the_devices():
    """fraction 0.25 of 8 GPUs slows round(0.25 x 8) = 2 of them by 1.2x, and the step with them."""
    kw = dict(parallel={"dp": 8}, training={"global_batch": 16})
    healthy = simulate(make_scenario(**kw))
    slow = simulate(make_scenario(**kw, simulation={"stragglers": [{"fraction": 0.25, "slowdown": 1.2}]}))
    busy = sorted(d.busy_s["compute"] for d in slow.devices)
    assert busy[:6] == pytest.approx([busy[0]] * 6, rel=5e-9)
    assert busy[6:] == pytest.approx([1.2 * busy[0]] * 2, rel=5e-9)
    assert slow.step_time_s == pytest.approx(1.2 * healthy.step_time_s, rel=1e-6)


def test_straggler_holds_every_replica_at_the_gradient_all_reduce():
    """pp=1, dp=8 on a DGX H100 with the all-reduce after the backward: the step grows by exactly the
    slow replica's extra compute, (1.3 - 1) x compute, because the collective starts when it arrives."""
    kw = dict(hardware="dgx-h100", parallel={"dp": 8}, training={"global_batch": 16})
    sim = {"overlap_dp": False}
    healthy = simulate(make_scenario(**kw, simulation=sim))
    slow = simulate(make_scenario(**kw, simulation={**sim, **_straggle(5)}))
    compute = healthy.devices[0].busy_s["compute"]
    assert slow.step_time_s - healthy.step_time_s == pytest.approx((SLOW - 1) * compute, rel=1e-6)


@pytest.mark.parametrize("slow_stage", [0, 1, 2, 3])
def test_straggler_in_a_pipeline_is_bounded_by_its_extra_compute(slow_stage):
    """1F1B, p=4, m=8, one stage x1.3: the step is at least the upstream fill and drain plus all of the
    slow stage's work, and grows by at most the slow stage's extra compute (longest path, max-plus)."""
    p, m = 4, 8
    kw = dict(parallel={"pp": p}, training={"global_batch": m})
    healthy = simulate(make_scenario(**kw))
    slow = simulate(make_scenario(**kw, simulation=_straggle(slow_stage)))
    plan = build_plan(make_scenario(**kw))
    f = [c.forward_time for c in plan.chunks]
    b = [c.backward_time for c in plan.chunks]
    # Narayanan et al. 2021, Sec. 2.2: a 1F1B step on uniform stages takes (m + p - 1)(f + b).
    assert healthy.step_time_s == pytest.approx((m + p - 1) * (f[1] + b[1]), rel=1e-3)
    k = slow_stage
    lower = sum(f[:k]) + SLOW * m * (f[k] + b[k]) + sum(b[:k])
    extra = (SLOW - 1) * healthy.stages[k].compute_s
    assert slow.step_time_s >= lower * (1 - 1e-9)
    assert slow.step_time_s <= (healthy.step_time_s + extra) * (1 + 1e-9)
    if k == p - 1:   # the last stage never waits once it starts: the whole extra compute shows
        assert slow.step_time_s - healthy.step_time_s == pytest.approx((SLOW - 1) * m * (f[k] + b[k]), rel=1e-3)


# --- degraded links --------------------------------------------------------------------------

def _nic_bandwidth(scenario) -> float:
    inter = scenario.hardware.inter_node
    return inter.nic_bandwidth * inter.efficiency      # bytes/s on one NIC link


def test_degraded_link_slows_a_communication_bound_step_by_the_extra_transfer_time():
    """llama2-13b, TP 8 x DP 2 over 2 nodes, ZeRO-1, collectives after the backward: nic0.0 -> rail0 at
    1/4 adds bytes x (1/f - 1) / B, the bytes being the reduce-scatter and all-gather halves that cross it."""
    sc = load_scenario(REPO / "scenarios" / "degraded_link.yaml", {"simulation.overlap_dp": False})
    factor = sc.simulation.degraded_links[0].factor
    assert (sc.simulation.degraded_links[0].a, sc.simulation.degraded_links[0].b, factor) == ("nic0.0", "rail0", 0.25)
    healthy = simulate(sc.with_overrides({"simulation.degraded_links": []}))
    slow = simulate(sc)
    # Llama 2 13B has 13,015,864,320 parameters (Touvron et al. 2023; HF config); per TP rank ~ 1/8
    # (the norms, 0.003% of them, are replicated). bf16 gradients and weights: 2 bytes each.
    per_gpu_bytes = 13_015_864_320 / 8 * 2
    # ring of n = 2: reduce-scatter moves (n-1)/n S, all-gather (n-1)/n S through gpu0 -> gpu8's route
    crossing = 0.5 * per_gpu_bytes + 0.5 * per_gpu_bytes
    expected = crossing * (1 / factor - 1) / _nic_bandwidth(sc)
    assert slow.step_time_s - healthy.step_time_s == pytest.approx(expected, rel=0.01)
    assert slow.step_time_s > 1.05 * healthy.step_time_s


def test_degraded_link_barely_moves_a_compute_bound_pipeline():
    """pp4_dp4 (compute-bound): nic0.4 -> rail4 at 1/2 slows only the m stage-1 -> stage-2 activation sends
    of DP replica 0, so the step grows by at most m x bytes x (1/f - 1) / B, under 1% of the step."""
    sc = load_scenario(REPO / "scenarios" / "pp4_dp4.yaml")
    healthy = simulate(sc)
    slow = simulate(sc.with_overrides({"simulation.degraded_links": [{"a": "nic0.4", "b": "rail4", "factor": 0.5}]}))
    m, tr, model = sc.microbatches, sc.training, sc.model
    send_bytes = tr.micro_batch * tr.seq_len * model.hidden * 2     # b x s x h activations in bf16
    bound = m * send_bytes * (1 / 0.5 - 1) / _nic_bandwidth(sc)
    delta = slow.step_time_s - healthy.step_time_s
    assert -1e-12 <= delta <= bound
    assert bound < 0.01 * healthy.step_time_s


def test_degraded_link_that_is_not_the_bottleneck_changes_nothing():
    """A rail-to-spine uplink carries 2 NICs' worth on 2 nodes; at 0.6 it still out-runs the one NIC that
    feeds it, so the sends' rate (their slowest link) and the step are unchanged."""
    sc = load_scenario(REPO / "scenarios" / "pp4_dp4.yaml")
    healthy = simulate(sc)
    slow = simulate(sc.with_overrides({"simulation.degraded_links": [{"a": "rail4", "b": "spine", "factor": 0.6}]}))
    assert slow.fidelity == "classes"   # the replicas the fault leaves alike are played once
    assert slow.step_time_s == pytest.approx(healthy.step_time_s, rel=1e-12)


# --- jitter and samples ------------------------------------------------------------------------

def _run_json(tmp_path, capsys, name: str, *args: str) -> bytes:
    out = tmp_path / name
    code, _, err = run_cli(["run", str(REPO / "scenarios" / "straggler.yaml"), "--json", str(out), *args], capsys)
    assert code == 0, err
    return out.read_bytes()


def test_jitter_with_a_fixed_seed_is_deterministic(tmp_path, capsys):
    """The same seed gives byte-identical JSON reports; another seed gives another step time."""
    first = _run_json(tmp_path, capsys, "a.json", "--set", "simulation.jitter=0.05")
    second = _run_json(tmp_path, capsys, "b.json", "--set", "simulation.jitter=0.05")
    other = _run_json(tmp_path, capsys, "c.json", "--set", "simulation.jitter=0.05", "--set", "simulation.seed=1")
    assert first == second
    assert json.loads(first)["step_time_s"] != json.loads(other)["step_time_s"]


def test_jitter_is_deterministic_through_the_python_api():
    """Two simulations with the same seed give the same canonical JSON; seeds 0 and 1 differ."""
    sc = make_scenario(hardware="dgx-h100", parallel={"pp": 2, "dp": 2}, training={"global_batch": 8},
                       simulation={"jitter": 0.05, "seed": 0})
    assert dumps_json(simulate(sc).to_dict()) == dumps_json(simulate(sc).to_dict())
    assert simulate(sc, seed=0).step_time_s != simulate(sc, seed=1).step_time_s


def test_samples_report_mean_p50_p95_by_their_definition(tmp_path, capsys):
    """--samples 8 reports the mean, median and 95th percentile of the step times of seeds 0..7 (to the report's
    9 significant digits: a relative error below 5e-9)."""
    report = json.loads(_run_json(tmp_path, capsys, "s.json", "--set", "simulation.jitter=0.05", "--samples", "8"))
    stats = report["step_time_samples"]
    sc = load_scenario(REPO / "scenarios" / "straggler.yaml", {"simulation.jitter": 0.05})
    t = sorted(simulate(sc, seed=i).step_time_s for i in range(8))
    # linear-interpolated percentiles of 8 values: P50 at position 3.5, P95 at 0.95 x 7 = 6.65
    assert stats["samples"] == 8
    assert stats["mean_s"] == pytest.approx(sum(t) / 8, rel=5e-9)
    assert stats["p50_s"] == pytest.approx((t[3] + t[4]) / 2, rel=5e-9)
    assert stats["p95_s"] == pytest.approx(t[6] + 0.65 * (t[7] - t[6]), rel=5e-9)
    assert t[0] <= stats["p50_s"] <= stats["p95_s"] <= t[7]


# --- bounded work ------------------------------------------------------------------------------

def test_full_fidelity_on_100k_gpus_is_refused_quickly():
    """A full-fidelity 100,000-GPU step (4 stages x 25,000 replicas x 128 operations) is refused before
    it runs, in well under a second."""
    sc = make_scenario(hardware="dgx-h100", nodes=12_500, gpus_per_node=8, model="llama2-7b",
                       parallel={"pp": 4, "dp": 25_000}, training={"global_batch": 25_000 * 64, "seq_len": 4096})
    assert sc.gpus == 100_000
    started = time.perf_counter()
    with pytest.raises(SimulationLimitError):
        simulate(sc, fidelity="full")
    assert time.perf_counter() - started < 2.0
