"""Search that scales with its space (issue 25): figures shared between layouts are the ones each layout would
compute alone, ``fix`` narrows the enumeration itself, and pruning stays exact on the newer dimensions (context
parallelism, FP8, the zero-bubble and DualPipe schedules, auto splits)."""

from __future__ import annotations

import pytest
from conftest import DATA, gpt_model, hardware_variant, make_scenario, resolve_variant

from simtrain.decide.search import enumerate_layouts, screen, search
from simtrain.decide.sweep import ScenarioPayload
from simtrain.engine.simulation import simulate
from simtrain.plan.shared_costs import shared, shared_costs

TWO_NODES = DATA / "core_two_nodes.yaml"
#: six layers: pp 4 splits them unevenly (auto), pp 2 and 3 evenly; layers alike, so every split schedule applies
SIX = gpt_model(layers=6, hidden=512, heads=8, vocab=32000)


def _hardware(tmp_path, gib: float):
    """The two-node fixture as 2 x 2 GPUs of ``gib`` GiB with an FP8 peak (2x BF16), so precision is searched."""
    return hardware_variant(tmp_path, {"gpu.memory": {"value": f"{gib} GiB", "source": "test fixture"},
                                       "gpu.peak_flops.fp8": {"value": "2000 TFLOPS", "source": "test fixture"}},
                            base=TWO_NODES)


@pytest.fixture
def long_case(tmp_path):
    """Sequences of 16,384 tokens (cp 2 is searched: 8,192 tokens per CP rank), FP8, 5 GiB GPUs."""
    return make_scenario(hardware=_hardware(tmp_path, 5), nodes=2, gpus_per_node=2, model=SIX,
                         training={"global_batch": 4, "seq_len": 16384}, parallel={"dp": 4})


@pytest.fixture
def split_case(tmp_path):
    """Sequences of 2,048 tokens, global batch 8, 1.2 GiB GPUs: auto splits of six layers over four stages compete
    with the even ones, under every schedule."""
    return make_scenario(hardware=_hardware(tmp_path, 1.2), nodes=2, gpus_per_node=2, model=SIX,
                         training={"global_batch": 8, "seq_len": 2048}, parallel={"dp": 4})


def _brute_force(scenario, max_memory: float, top: int) -> tuple[list, dict]:
    """Every enumerated layout the scenario rules accept, simulated if it fits within ``max_memory`` of the GPU (a
    variant as conftest.resolve_variant resolves it):
    the ``top`` by tokens/s (ties by enumeration order) and the tokens/s of each that competed, by index."""
    scored = []
    for i, layout in enumerate(enumerate_layouts(scenario)):
        resolved = resolve_variant(scenario, layout, max_memory)
        if resolved is not None:
            scored.append((-simulate(resolved[0]).tokens_per_s, i, resolved[1]))
    scored.sort(key=lambda x: (x[0], x[1]))
    return [(layout, -neg) for neg, _, layout in scored[:top]], {i: -neg for neg, i, _ in scored}


@pytest.mark.parametrize("case", ["long_case", "split_case"])
def test_search_agrees_with_brute_force_on_new_dimensions(case, request):
    """The top 3 equal those of simulating every layout that fits, with cp, fp8, zb-h1/zb-v/dualpipe/dualpipev and
    auto splits in the space; the bound never exceeds a simulated step (else pruning could skip a winner)."""
    scenario = request.getfixturevalue(case)
    result = search(scenario, top=3, workers=1, progress=False)
    brute, competed = _brute_force(scenario, result.max_memory, 3)
    found = [({k: r.get(k) for k in layout}, r["tokens_per_s"]) for (layout, _), r in zip(brute, result.top)]
    assert len(result.top) == len(brute) and found == brute
    unscreened = sum(1 for i in competed if result.rows[i]["status"] == "unscreened")
    assert result.counts["simulated"] + result.counts["pruned"] == len(competed) - unscreened
    assert all(competed[i] < brute[-1][1] for i in competed if result.rows[i]["status"] == "unscreened")
    assert result.counts["pruned"] > 0 and result.counts["bound_violations"] == 0
    rivals = [result.rows[i] for i in competed]     # every layout that fits: simulated, pruned or unscreened
    assert {r["schedule"] for r in rivals} >= {"1f1b", "zb-h1", "dualpipe"}
    assert result.counts["unscreened"] > 0
    if case == "long_case":
        assert {r["cp"] for r in rivals} == {1, 2} and {r["precision"] for r in rivals} == {"bf16", "fp8"}
    else:
        assert "auto" in {r["layers_per_stage"] for r in rivals}


def test_shared_figures_equal_the_ones_computed_alone(long_case, split_case, monkeypatch):
    """Screening with the per-search cache gives every layout the same row, float for float, as screening it with
    a fresh cache of its own (the cache's keys name every input of what they keep), over layouts with cp, fp8,
    split schedules and auto splits; and the cache is used (it is asked for more figures than it holds)."""
    import simtrain.plan.memory as ledger

    asked = []
    monkeypatch.setattr(ledger, "shared", lambda key, compute: asked.append(key) or shared(key, compute))
    for scenario in (long_case, split_case):
        layouts = enumerate_layouts(scenario)[::2]
        payload = ScenarioPayload.of(scenario)
        alone = [screen(payload, {}, [layout])[0] for layout in layouts]   # a fresh cache per layout
        asked.clear()
        with shared_costs() as cache:
            together = screen(payload, {}, layouts)
        assert together == alone
        assert 0 < len(cache) < len(asked) / 2


def test_fix_narrows_the_enumeration(split_case):
    """fix= removes layouts while enumerating: the narrowed list is exactly the full list's layouts with the fixed
    values, and the search enumerates (and so screens) only those."""
    every = enumerate_layouts(split_case)
    fixed = enumerate_layouts(split_case, fix={"parallel.tp": 2, "parallel.schedule": ["zb-h1", "dualpipe"]})
    assert fixed == [x for x in every if x["tp"] == 2 and x["schedule"] in ("zb-h1", "dualpipe")]
    assert 0 < len(fixed) < len(every) / 4
    result = search(split_case, fix={"parallel.tp": 2, "parallel.schedule": ["zb-h1", "dualpipe"]}, top=1,
                    workers=1, progress=False)
    assert result.counts["enumerated"] == len(fixed)


def test_band_notes_name_the_layouts_closer_than_their_bands():
    """Two layouts at 100 and 104 tokens/s with ±5% step-time bands overlap (#1's tokens/s band 95.2-105.3 reaches
    #2's 99.0-109.5); a third at 120 does not: only #2 is named."""
    from simtrain.decide.search_result import band_notes

    def row(tps):
        step = 1000.0 / tps          # 1,000 tokens a step
        return {"tokens_per_s": tps, "step_time_s": step, "step_time_band_low_s": step / 1.05,
                "step_time_band_high_s": step * 1.05}

    notes = band_notes([row(104.0), row(100.0), row(80.0)])
    assert len(notes) == 1 and notes[0].startswith("#1 and #2 are closer than their bands")
    assert band_notes([row(120.0), row(100.0)]) == []
    assert band_notes([{**row(100.0), "step_time_band_low_s": None, "step_time_band_high_s": None}]) == []


def test_search_rows_carry_the_run_band():
    """The top layouts of a search on DGX H100 carry the band `simtrain run` reports for that layout, and the text
    table shows it."""
    import simtrain

    found = simtrain.search("pp4_dp4", top=2, workers=1, progress=False, fix={"parallel.tp": 1, "parallel.pp": 4,
                                                                              "parallel.zero": 1})
    best = found.top[0]
    run = simulate(found.scenario(0))
    assert (best["step_time_band_low_s"], best["step_time_band_high_s"]) == pytest.approx(run.step_time_band_s)
    assert "band" in found.summary().splitlines()[0]
