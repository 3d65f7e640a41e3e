"""The search's step-time floor over the whole layout table (issue 25, "screen layouts in bulk"): it is the plan's own
per-layer figures, it follows the pipeline recurrence written out by hand, and it never exceeds the analytic lower
bound of any layout the scenario rules accept (else a layout that could win would go unscreened)."""

from __future__ import annotations

import pytest
import yaml
from conftest import DATA, hardware_variant, make_scenario, resolve_variant
from test_search_scale import SIX, TWO_NODES, _hardware

from simtrain.decide.bulk import floors
from simtrain.decide.search import enumerate_layouts, screen
from simtrain.decide.search_result import layout_overrides
from simtrain.decide.sweep import ScenarioPayload
from simtrain.plan.build import build_plan
from simtrain.plan.layer_floor import layer_floor
from simtrain.spec.scenario import load_scenario


@pytest.fixture
def cases(tmp_path):
    """Short and long sequences (cp 2 searched), FP8, every schedule, auto splits, on 2 x 2 GPUs."""
    return [make_scenario(hardware=_hardware(tmp_path, 1.2), nodes=2, gpus_per_node=2, model=SIX,
                          training={"global_batch": 8, "seq_len": 2048}, parallel={"dp": 4}),
            make_scenario(hardware=_hardware(tmp_path, 5), nodes=2, gpus_per_node=2, model=SIX,
                          training={"global_batch": 4, "seq_len": 16384}, parallel={"dp": 4})]


def test_floor_never_exceeds_the_analytic_lower_bound(cases):
    """Rule: a layout is left unscreened only if its floor loses, so the floor must be at most the analytic lower
    bound (itself at most the simulated step) on every layout the rules accept; and it is not vacuous: positive
    on every layout."""
    for scenario in cases:
        layouts = enumerate_layouts(scenario)
        floor = floors(scenario, {}, layouts)
        rows = screen(ScenarioPayload.of(scenario), {}, layouts)
        bounded = [(f, r["lower_bound_s"]) for f, r in zip(floor, rows) if "lower_bound_s" in r]
        assert len(bounded) > 100 and all(f > 0 for f in floor)
        assert all(f <= lb for f, lb in bounded), max(f / lb for f, lb in bounded)


def test_memory_floor_never_exceeds_the_ledger(cases):
    """Rule: a layout whose memory floor passes the GPU's memory is reported as not fitting without being screened,
    so the floor must be at most the ledger's peak on every layout the rules accept; and it is more than the fixed
    overheads on every layout."""
    from simtrain.decide.bulk import memory_floors

    for scenario in cases:
        layouts = enumerate_layouts(scenario)
        floor = memory_floors(scenario, {}, layouts)
        rows = screen(ScenarioPayload.of(scenario), {}, layouts)
        peaks = [(f, r["peak_memory_bytes_max"], x["schedule"]) for f, r, x in zip(floor, rows, layouts)
                 if "peak_memory_bytes_max" in r]
        assert len(peaks) > 100 and all(f > 0 for f in floor)
        assert all(f <= peak for f, peak, _ in peaks), max(f / peak for f, peak, _ in peaks)
        ov = scenario.hardware.memory_overheads
        assert all(f > ov.cuda_context + ov.workspace + ov.comm_buffers for f in floor)


def test_floors_hold_on_a_sample_of_a_large_search():
    """The same two rules on every 97th layout of the Llama-3-70B search on 1,024 H100 (tp to 8, pp to 80, fp8,
    every schedule and recompute mode): floors at most the analytic bound and the ledger's peak."""
    from simtrain.decide.bulk import memory_floors

    sc = load_scenario("benchmarks/scenarios/llama3_70b_1024_h100.yaml")
    layouts = enumerate_layouts(sc)[::97]
    floor, memory = floors(sc, {}, layouts), memory_floors(sc, {}, layouts)
    rows = screen(ScenarioPayload.of(sc), {}, layouts)
    assert all(f <= r["lower_bound_s"] for f, r in zip(floor, rows) if "lower_bound_s" in r)
    assert all(f <= r["peak_memory_bytes_max"] for f, r in zip(memory, rows) if "peak_memory_bytes_max" in r)
    assert sum("lower_bound_s" in r for r in rows) > 20


@pytest.fixture
def uneven_links(tmp_path):
    """TP groups that differ: a degraded NVLink port (factor 0.01) on 2 x 4 GPUs, and an explicit 8-GPU star with one
    GPU's link at 1 GB/s (found by review: a floor timing one group's TP for every group exceeded the bound)."""
    degraded = make_scenario(hardware=_hardware(tmp_path, 1.2), nodes=2, gpus_per_node=4, model=SIX,
                             training={"global_batch": 8, "seq_len": 2048}, parallel={"dp": 8},
                             simulation={"degraded_links": [{"a": "gpu0", "b": "nvsw0", "factor": 0.01}]})
    star = yaml.safe_load((DATA / "core_star8.yaml").read_text(encoding="utf-8"))
    star["links"][0]["bandwidth"] = "1 GB/s"
    (tmp_path / "star.yaml").write_text(yaml.safe_dump(star), encoding="utf-8")
    explicit = make_scenario(hardware=tmp_path / "star.yaml", nodes=None, model=SIX,
                             training={"global_batch": 8, "seq_len": 2048}, parallel={"dp": 8})
    return [degraded, explicit]


def test_floor_holds_where_tp_groups_differ(uneven_links):
    """Rule: with a degraded link or an explicit topology the floor still never exceeds the bound (TP collectives
    are left out of it there), and the search still equals brute force."""
    from simtrain.decide.search import search
    from simtrain.engine.simulation import simulate

    for scenario in uneven_links:
        layouts = enumerate_layouts(scenario)
        floor = floors(scenario, {}, layouts)
        rows = screen(ScenarioPayload.of(scenario), {}, layouts)
        bounded = [(f, r["lower_bound_s"]) for f, r in zip(floor, rows) if "lower_bound_s" in r]
        assert len(bounded) > 50 and all(f <= lb for f, lb in bounded), max(f / lb for f, lb in bounded)
    scenario = uneven_links[1]
    result = search(scenario, top=1, workers=1, progress=False, max_memory=1.0)
    best = 0.0
    for layout in enumerate_layouts(scenario):
        resolved = resolve_variant(scenario, layout, 1.0)
        if resolved is not None:
            best = max(best, simulate(resolved[0]).tokens_per_s)
    assert result.top[0]["tokens_per_s"] == best


def test_host_adam_floor_counts_the_searched_nodes_gpus(tmp_path):
    """Rule: searching 2 GPUs of a 4-GPU node (gpus=2) shares the host's memory bandwidth over 2 GPUs, as the plan
    does; the host-Adam floor must use the same count (found by review: it used the file's 4, doubling the CPU step
    and exceeding the bound)."""
    hw = hardware_variant(tmp_path, {"gpu.memory": {"value": "40 GiB", "source": "test fixture"},
                                     "inter_node.pcie_bandwidth": {"value": "64 GB/s", "source": "test fixture"},
                                     "host_memory": {"value": "1 TB", "source": "test fixture"},
                                     "host_memory_bandwidth": {"value": "20 GB/s", "source": "test fixture"}},
                          base=TWO_NODES)
    sc = make_scenario(hardware=hw, nodes=1, gpus_per_node=4, model=SIX, training={"global_batch": 8},
                       parallel={"dp": 4})
    base = {"nodes": 1, "gpus_per_node": 2}
    layouts = [x for x in enumerate_layouts(sc, gpus=2) if x.get("offload_optimizer")]
    floor = floors(sc, base, layouts)
    rows = screen(ScenarioPayload.of(sc), base, layouts)
    bounded = [(f, r["lower_bound_s"]) for f, r in zip(floor, rows) if "lower_bound_s" in r]
    assert len(bounded) > 5 and all(0 < f <= lb for f, lb in bounded), max(f / lb for f, lb in bounded)


def test_floor_is_the_plans_own_layer_figures():
    """A dense layer's floor is the plan's figure for it: forward = compute + TP collectives of one layer, backward =
    compute + recompute + the backward's TP collectives (Llama-3-70B, tp 8, sequence parallelism, full recompute)."""
    sc = load_scenario("benchmarks/scenarios/llama3_70b_1024_h100.yaml",
                       {"training.recompute": "full", "parallel.pp": 8, "parallel.dp": 16})
    chunk = build_plan(sc).chunks[3]
    lf = layer_floor(sc, micro_batch=1, precision="bf16", recompute="full")
    assert lf.forward == chunk.fwd_layer + chunk.tp_fwd_layer
    assert lf.backward == chunk.bwd_layer + chunk.recompute_layer + chunk.tp_bwd_layer
    assert lf.compute == chunk.fwd_layer + chunk.bwd_layer + chunk.recompute_layer
    last = build_plan(sc).chunks[-1]
    assert lf.head == last.head_fwd + last.head_bwd


def test_floor_follows_the_pipeline_recurrence_by_hand(cases):
    """1F1B over p = 2 ranks of n = 3 layers, m = 4 micro-batches (global batch 8, dp 1, micro-batch 2):
    (p - 1) n (f + b) + m (n (f + b) + h); ZB-H1 on the same stages gets the larger of the mean work
    m (L (f + b) + h) / p and the last rank's wait for the first forward, (p - 1) n f + m (n (f + b) + h)."""
    scenario = cases[0]
    base = {"tp": 2, "pp": 2, "dp": 1, "vpp": 1, "micro_batch": 2, "zero": 0, "recompute": "none",
            "schedule": "1f1b", "sequence_parallel": False, "precision": "bf16", "layers_per_stage": None}
    zb = {**base, "schedule": "zb-h1"}
    got = floors(scenario, {}, [base, zb])
    lf = layer_floor(scenario.with_overrides(layout_overrides(base)), micro_batch=2, precision="bf16",
                     recompute="none")
    t = lf.forward + lf.backward
    assert got[0] == pytest.approx((1 * 3 * t + 4 * (3 * t + lf.head)), rel=1e-8)
    assert got[1] == pytest.approx(max(4 * (6 * t + lf.head) / 2, 3 * lf.forward + 4 * (3 * t + lf.head)), rel=1e-8)


def test_models_whose_layers_differ_get_no_floor(tmp_path):
    """Experts (or latent / sliding-window attention): no floor (0), so every layout is screened as before."""
    from test_search_moe import MOE8

    sc = make_scenario(hardware=_hardware(tmp_path, 1.6), nodes=2, gpus_per_node=2, model=MOE8,
                       training={"global_batch": 4}, parallel={"dp": 4})
    layouts = enumerate_layouts(sc)
    assert layouts and not floors(sc, {}, layouts).any()


def test_search_tries_activation_offloading_and_agrees_with_brute_force(tmp_path):
    """Rule (issue 21): the search tries Megatron's activation offloading where it applies (pp 1, no recompute) with
    the fewest layers that make the layout fit, and the optimizer on the host (ZeRO-1/2, the hardware file giving the
    host's memory bandwidth); its top 3 equal those of simulating every layout that fits, each
    offloading variant with that fewest count (found here by bisection on the ledger, independently of the
    search)."""
    from simtrain.decide.search import search
    from simtrain.engine.simulation import simulate

    # 1.65 GiB: with no recompute, one stage and micro-batch 1 the ledger needs 1.706 GiB; offloading 4 of the 6
    # layers brings it to 1.640 GiB
    hw = hardware_variant(tmp_path, {"gpu.memory": {"value": "1.65 GiB", "source": "test fixture"},
                                     "inter_node.pcie_bandwidth": {"value": "64 GB/s", "source": "test fixture"},
                                     "host_memory": {"value": "1 TB", "source": "test fixture"},
                                     "host_memory_bandwidth": {"value": "400 GB/s", "source": "test fixture"}},
                            base=TWO_NODES)
    sc = make_scenario(hardware=hw, nodes=1, gpus_per_node=2, model=SIX,
                       training={"global_batch": 8, "seq_len": 2048}, parallel={"dp": 2})
    result = search(sc, top=3, workers=1, progress=False, max_memory=1.0)
    scored = []
    for i, layout in enumerate(enumerate_layouts(sc)):
        resolved = resolve_variant(sc, layout, 1.0)
        if resolved is not None:
            scored.append((-simulate(resolved[0]).tokens_per_s, i, resolved[1]))
    scored.sort(key=lambda x: (x[0], x[1]))
    brute = [(layout, -neg) for neg, _, layout in scored[:3]]
    assert any(layout.get("activation_offload_layers") == 4 for _, _, layout in scored)
    assert any(layout.get("offload_optimizer") for _, _, layout in scored)
    found = [({k: r.get(k) for k in layout}, r["tokens_per_s"]) for (layout, _), r in zip(brute, result.top)]
    assert len(result.top) == len(brute) and found == brute


def test_a_128k_token_llama_3_70b_run_needs_context_parallelism():
    """Rule (issue 21): on 64 H100 (TP 8, bf16, ZeRO-1, 131,072-token sequences, 16 per step) the search's best layout
    splits each sequence over CP ranks; with CP fixed at 1 the best is slower (if any layout fits at all)."""
    from simtrain.decide.search import search

    sc = load_scenario("benchmarks/scenarios/llama3_70b_1024_h100.yaml",
                       {"nodes": 8, "parallel.dp": 2, "training.seq_len": 131072, "training.global_batch": 16})
    fix = {"parallel.tp": 8, "training.precision": "bf16", "parallel.zero": 1}
    found = search(sc, top=1, workers=1, progress=False, fix=fix)
    assert found.best["cp"] >= 2
    alone = search(sc, top=1, workers=1, progress=False, fix={**fix, "parallel.cp": 1})
    assert not alone.top or alone.top[0]["tokens_per_s"] < found.top[0]["tokens_per_s"]


def test_memory_advice_names_the_fewest_recomputed_layers_that_fit():
    """Rule (issue 21): when a run does not fit, `simtrain memory` offers full recompute of the fewest layers per
    stage that make it fit: with that many every stage fits, with one fewer it does not (the ledger, run by
    simtrain.memory on the scenario the tip names)."""
    import re

    import simtrain

    sc = load_scenario("benchmarks/scenarios/llama3_70b_1024_h100.yaml",
                       {"training.micro_batch": 4, "parallel.pp": 2, "parallel.dp": 64})
    report = simtrain.memory(sc)
    assert not report.fits_in_memory
    tip = next(t for t in report.advice if "recompute_layers" in t)
    n = int(re.search(r"training\.recompute_layers: (\d+)", tip).group(1))
    fits = [simtrain.memory(sc.with_overrides({"training.recompute": "full", "training.recompute_layers": k}))
            .fits_in_memory for k in (n - 1, n)]
    assert fits == [False, True]
