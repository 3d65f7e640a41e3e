"""The search weighs recompute granularity (issue 21, item 4): Megatron's partial full recompute
(``training.recompute_layers``) and added selective modules (``training.recompute_modules``), each found for the
layout at the search's max_memory and competing with the plain recompute modes."""

from __future__ import annotations

from conftest import make_scenario
from test_search_scale import SIX, _hardware

from simtrain.decide.search import search
from simtrain.engine.simulation import memory, simulate

#: one stage of the six-layer model on each of 4 GPUs (ZeRO-2, bf16, micro-batch 1): 1.2 GiB GPUs hold it with full
#: recompute but not without any, nor with selective recompute of the attention core alone
FIX = {"parallel.tp": 1, "parallel.pp": 1, "training.micro_batch": 1, "parallel.zero": 2,
       "training.precision": "bf16"}


def _fits(sc, **keys) -> bool:
    return memory(sc.with_overrides(keys)).fits_in_memory


def test_search_recomputes_the_fewest_layers_and_adds_the_cheapest_modules_that_fit(tmp_path):
    """Rule: where no recompute does not fit, the search offers full recompute of the fewest layers per stage that
    fit (with one fewer it does not: the memory ledger run on its own) and selective recompute with the first module
    set of [layernorm], [mlp], [layernorm, mlp] added that fits; the partial one beats recomputing every layer
    (simulated: fewer forwards re-run)."""
    sc = make_scenario(hardware=_hardware(tmp_path, 1.2), nodes=2, gpus_per_node=2, model=SIX,
                       training={"global_batch": 8, "seq_len": 2048}, parallel={"dp": 4})
    result = search(sc, top=10, workers=1, progress=False, max_memory=1.0, fix=FIX)
    rows = [r for r in result.rows if r["status"] in ("simulated", "pruned")]
    partial = next(r for r in rows if r.get("recompute_layers"))
    modules = next(r for r in rows if r.get("recompute_modules"))
    base = sc.with_overrides({**FIX, "parallel.schedule": "1f1b", "parallel.dp": 4})
    assert not _fits(base, **{"training.recompute": "none"})
    assert not _fits(base, **{"training.recompute": "selective"})
    n = partial["recompute_layers"]
    full = {"training.recompute": "full"}
    assert 1 <= n < 6 and _fits(base, **full, **{"training.recompute_layers": n})
    assert n == 1 or not _fits(base, **full, **{"training.recompute_layers": n - 1})
    sel = {"training.recompute": "selective"}
    ladder = [["core_attn", "layernorm"], ["core_attn", "mlp"], ["core_attn", "layernorm", "mlp"]]
    first = next(m for m in ladder if _fits(base, **sel, **{"training.recompute_modules": m}))
    assert modules["recompute_modules"] == first
    # the winner's scenario carries what screening found, and partial recompute runs faster than full
    every = simulate(base.with_overrides(full)).step_time_s
    some = simulate(base.with_overrides({**full, "training.recompute_layers": n})).step_time_s
    assert some < every
    layout = next(i for i, r in enumerate(result.top) if r.get("recompute_layers") == n)
    assert result.scenario(layout).training.recompute_layers == n


def test_memory_advice_names_the_cheapest_recompute_modules_that_fit():
    """Rule (issue 21): when a run with selective recompute does not fit, `simtrain memory` offers the cheapest
    module list that makes it fit, cheapest first ([layernorm], [mlp], [layernorm, mlp] added to core_attn on a
    dense model): Llama-3-70B at TP 8, one stage, micro-batch 4 needs all three (the ledger, run by simtrain.memory on
    each list: the two cheaper ones do not fit)."""
    import re

    import simtrain
    from simtrain.spec.scenario import load_scenario

    sc = load_scenario("benchmarks/scenarios/llama3_70b_1024_h100.yaml",
                       {"training.micro_batch": 4, "parallel.pp": 1, "parallel.dp": 128,
                        "training.recompute": "selective"})
    assert not simtrain.memory(sc).fits_in_memory
    tip = next(t for t in simtrain.memory(sc).advice if "recompute_modules" in t)
    named = re.search(r"recompute_modules: \[([a-z_, ]+)\]", tip).group(1).split(", ")
    assert named == ["core_attn", "layernorm", "mlp"]
    fits = [simtrain.memory(sc.with_overrides({"training.recompute_modules": m})).fits_in_memory
            for m in (["core_attn", "layernorm"], ["core_attn", "mlp"], named)]
    assert fits == [False, False, True]


def test_memory_advice_offers_no_partial_recompute_where_the_rules_refuse_it():
    """Rule: partial recompute is refused for models whose layers differ (experts), so the advice must not offer it
    (found by review: Qwen3-235B-A22B with no recompute and micro-batch 4 was offered recompute_layers 25, which the
    rules then refused); it still offers full recompute."""
    import simtrain
    from simtrain.spec.scenario import load_scenario

    sc = load_scenario("benchmarks/scenarios/qwen3_235b_256_h100.yaml",
                       {"training.recompute": "none", "training.micro_batch": 4})
    report = simtrain.memory(sc)
    assert not report.fits_in_memory
    assert not any("recompute_layers" in tip for tip in report.advice)
    assert any("training.recompute" in tip for tip in report.advice)
