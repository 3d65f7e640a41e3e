"""The analytic estimate (issue 5, deliverable 4): one cost model with the engine, a bound the
simulation never beats, and the closed-form pipeline formulas on equal stages."""

from __future__ import annotations

import pytest
from conftest import DATA, REPO, gpt_model, make_scenario

from simtrain.decide.estimate import estimate
from simtrain.engine.simulation import simulate
from simtrain.plan.build import build_plan
from simtrain.spec.scenario import load_scenario

TWO_NODES = DATA / "core_two_nodes.yaml"
#: a small model with a real vocabulary: the first and last stages are heavier than the rest
SMALL = gpt_model(layers=8, hidden=1024, heads=16, vocab=32000)


@pytest.mark.parametrize("training", [
    {"global_batch": 4},
    {"global_batch": 4, "micro_batch": 2},
    {"global_batch": 2, "recompute": "full"},
    {"global_batch": 2, "recompute": "selective", "flash_attention": False},
    {"global_batch": 2, "recompute": "full", "recompute_layers": 3},
    {"global_batch": 2, "recompute": "selective", "recompute_modules": ["mlp", "layernorm"]},
])
def test_single_stage_estimate_equals_simulation(training):
    """pp = dp = tp = 1: the engine adds nothing to the plan's costs, so estimate = simulation (1e-9)."""
    sc = make_scenario(hardware="dgx-h100", model=SMALL, training=training)
    sim = simulate(sc).step_time_s
    est = estimate(sc)
    assert est.step_time_s == pytest.approx(sim, rel=1e-9)
    assert est.lower_bound_s == pytest.approx(sim, rel=1e-9)
    assert est.lower_bound_s <= sim


LAYOUTS = [
    {"pp": 2, "dp": 4},
    {"pp": 4, "dp": 2, "zero": 1},
    {"pp": 8},
    {"pp": 8, "schedule": "gpipe"},
    {"pp": 2, "dp": 2, "tp": 2, "sequence_parallel": True},
    {"tp": 4, "dp": 2, "zero": 3},
    {"dp": 8, "zero": 0},
    {"dp": 8, "zero": 2},
    {"dp": 8, "zero": 3},
    {"pp": 2, "dp": 4, "vpp": 2, "schedule": "interleaved-1f1b"},
    {"pp": 4, "tp": 2, "vpp": 2, "schedule": "interleaved-1f1b"},
    {"pp": 2, "tp": 2, "dp": 2, "schedule": "zb-h1"},   # TP without SP, split backward (test_tp_async)
]


@pytest.mark.parametrize("parallel", LAYOUTS, ids=lambda p: "-".join(f"{k}{v}" for k, v in p.items()))
@pytest.mark.parametrize("extra", [{}, {"training": {"recompute": "full"}},
                                   {"simulation": {"overlap_dp": False}}], ids=["base", "recompute", "no-overlap"])
def test_lower_bound_never_exceeds_simulation(parallel, extra):
    """Every term of the bound is work the engine must do in sequence: lower_bound_s <= simulated step."""
    training = {"global_batch": 16, **extra.get("training", {})}
    sc = make_scenario(hardware=TWO_NODES, nodes=2, gpus_per_node=4, model=SMALL, training=training,
                       parallel=parallel, simulation=extra.get("simulation"))
    sim = simulate(sc).step_time_s
    assert estimate(sc).lower_bound_s <= sim


@pytest.mark.parametrize("overrides", [{}, {"parallel.zero": 3},
                                       {"parallel.zero": 3, "parallel.backward_prefetch": "post"},
                                       {"parallel.pp": 2, "parallel.dp": 8},
                                       {"parallel.vpp": 2, "parallel.schedule": "interleaved-1f1b"},
                                       {"parallel.tp": 2, "parallel.dp": 2, "parallel.sequence_parallel": True}])
def test_bound_and_estimate_on_the_reference_layout(overrides):
    """On real hardware (DGX H100) the bound holds and the estimate is within 5% of the simulation."""
    sc = load_scenario(REPO / "scenarios" / "pp4_dp4.yaml", overrides)
    sim = simulate(sc).step_time_s
    est = estimate(sc)
    assert est.lower_bound_s <= sim
    assert est.step_time_s == pytest.approx(sim, rel=0.05)


@pytest.mark.parametrize("parallel, global_batch", [
    ({"pp": 4}, 8), ({"pp": 4, "schedule": "gpipe"}, 8), ({"pp": 2, "vpp": 2, "schedule": "interleaved-1f1b"}, 4),
    ({"pp": 4, "vpp": 2, "schedule": "interleaved-1f1b"}, 8)])
def test_equal_stages_follow_the_pipeline_formula(parallel, global_batch):
    """Equal stages of t = F + B per chunk: step = (m v + p - 1) t + optimizer, bubble (p-1)/(m v + p-1)
    (Huang et al. 2019; Narayanan et al. 2021 Sec. 2.2). Ideal links, tiny vocabulary."""
    sc = make_scenario(parallel=parallel, training={"global_batch": global_batch})
    plan = build_plan(sc)
    p, v, m = sc.parallel.pp, sc.parallel.vpp, sc.microbatches
    middle = plan.chunks[1]                      # no embedding, no output layer
    t = middle.forward_time + middle.backward_time
    est = estimate(sc, plan)
    assert est.step_time_s == pytest.approx((m * v + p - 1) * t + max(plan.optimizer_time), rel=1e-3)
    assert est.bubble_s / (est.bubble_s + est.compute_s) == pytest.approx((p - 1) / (m * v + p - 1), rel=1e-3)


def test_jitter_gives_no_bound():
    """Jitter can make kernels faster than nominal: no bound is claimed (0)."""
    sc = make_scenario(parallel={"pp": 2}, training={"global_batch": 4}, simulation={"jitter": 0.2})
    assert estimate(sc).lower_bound_s == 0.0


def test_estimate_reports_throughput_and_mfu_from_its_step_time():
    """tokens/s = global batch x seq_len / step; MFU = model FLOP / (step x GPUs x peak)."""
    sc = make_scenario(hardware="dgx-h100", model=SMALL, training={"global_batch": 4})
    plan = build_plan(sc)
    est = estimate(sc, plan)
    assert est.tokens_per_s == pytest.approx(4 * 512 / est.step_time_s)
    assert est.mfu == pytest.approx(plan.model_flops_per_step / (est.step_time_s * 1 * 989.5e12))


def test_context_parallel_estimate_equals_simulation():
    """One stage, dp 1, cp 2 without gradient overlap traffic to wait on: the CP exchange the engine plays (exposed
    and hidden) is the plan's, so the estimate of the step's compute path equals the simulation (1e-9) when the
    dp x cp gradient all-reduce has nothing to overlap (overlap_dp off, both add it after the backward)."""
    sc = make_scenario(hardware="dgx-h100", nodes=1, gpus_per_node=2, model=SMALL,
                       training={"global_batch": 2, "seq_len": 4096}, parallel={"cp": 2},
                       simulation={"overlap_dp": False})
    assert estimate(sc).step_time_s == pytest.approx(simulate(sc).step_time_s, rel=1e-9)


@pytest.mark.parametrize("parallel, recompute_layers, share", [
    ({"pp": 2}, 1, 1 / 4),   # 8 layers / pp 2 = 4 per stage, the first 1 re-runs: 1 of 4
    ({"pp": 2}, 3, 3 / 4),   # 3 of 4
    ({"pp": 2}, 4, 4 / 4),   # all 4: the same as full recompute
    # interleaved: 2 chunks of 2 layers per rank, the first 1 of every chunk re-runs: 2 of 4
    ({"pp": 2, "vpp": 2, "schedule": "interleaved-1f1b"}, 1, 2 / 4),
])
def test_recompute_seconds_count_only_the_recomputed_layers(parallel, recompute_layers, share):
    """Rule (docs/model.md, recompute granularity): with recompute_layers N only the first N layers of every
    (virtual) stage re-run their forward, so recompute_s is the share of full recompute's that those layers are
    (hand count above); the rest of compute_s falls by the same seconds."""
    training = {"global_batch": 4, "recompute": "full"}
    full = estimate(make_scenario(model=SMALL, parallel=parallel, training=training))
    part = estimate(make_scenario(model=SMALL, parallel=parallel,
                                  training={**training, "recompute_layers": recompute_layers}))
    assert full.recompute_s > 0
    assert part.recompute_s / full.recompute_s == pytest.approx(share, rel=1e-9)
    assert full.compute_s - part.compute_s == pytest.approx(full.recompute_s - part.recompute_s, rel=1e-6, abs=1e-12)
