"""``parallel.layers_per_stage: auto`` (issue 22, deliverable 4; reference article rule 11): the split whose
slowest pipeline rank is fastest with every rank's memory fitting, checked against a brute force over every split
written here; and explicit splits with an embedding-only first stage."""

from __future__ import annotations

import itertools

import pytest
from conftest import gpt_model, hardware_variant, make_scenario

from simtrain.engine.simulation import memory, simulate
from simtrain.plan.balance import balanced_split, even_split, resolve_split
from simtrain.plan.build import build_plan


def _scenario(hw=None, layers=10, pp=3, vocab=32000, **parallel):
    kwargs = {"hardware": hw} if hw else {}
    return make_scenario(model=gpt_model(layers=layers, vocab=vocab),
                         training={"seq_len": 512, "global_batch": 8, "micro_batch": 1},
                         parallel={"pp": pp, "schedule": "1f1b", "layers_per_stage": "auto", **parallel}, **kwargs)


def _slowest(s, split) -> float:
    """The slowest rank's compute of one micro-batch: n t + its embedding / output-layer work (plan costs)."""
    plan = build_plan(resolve_split(s.__class__(**{**s.__dict__, "parallel": s.parallel.model_copy(
        update={"layers_per_stage": list(split)})})))
    return max(sum(c.forward_time + c.backward_time for c in plan.chunks if c.rank == r)
               for r in range(s.parallel.pp))


def _splits(layers, pp):
    for cut in itertools.combinations(range(1, layers), pp - 1):
        yield [b - a for a, b in zip((0, *cut), (*cut, layers), strict=True)]


def _fits(s, split) -> bool:
    sc = s.__class__(**{**s.__dict__, "parallel": s.parallel.model_copy(update={"layers_per_stage": list(split)})})
    return memory(sc).fits_in_memory


def test_auto_is_as_fast_as_the_best_split():
    """With memory to spare, auto's slowest rank is no slower than that of any split of 10 layers over 3 ranks
    (a large vocabulary makes the last stage's output layer worth about a layer)."""
    s = _scenario()
    best = min(_slowest(s, sp) for sp in _splits(10, 3))
    assert _slowest(s, balanced_split(s)) == pytest.approx(best, rel=1e-12)
    assert balanced_split(s) != even_split(10, 3)


def test_auto_keeps_every_rank_in_memory(tmp_path):
    """On a GPU a little too small for the even split (its last stage keeps the logits, its first the most in-flight
    micro-batches), auto fits, and no split that fits has a faster slowest rank."""
    probe = _scenario()
    peaks = memory(probe.__class__(**{**probe.__dict__, "parallel": probe.parallel.model_copy(
        update={"layers_per_stage": even_split(10, 3)})})).stages
    capacity = 0.999 * max(st.peak_memory_bytes for st in peaks)
    hw = hardware_variant(tmp_path, {"gpu.memory": f"{capacity / 1e9:.6f} GB"})
    s = _scenario(hw=hw)
    assert not _fits(s, even_split(10, 3))
    split = balanced_split(s)
    assert _fits(s, split)
    fitting = [sp for sp in _splits(10, 3) if _fits(s, sp)]
    assert _slowest(s, split) == pytest.approx(min(_slowest(s, sp) for sp in fitting), rel=1e-12)


def test_run_reports_the_chosen_split():
    """`simulate` runs the balanced split and its report says it was chosen (config.layers_per_stage_auto)."""
    s = _scenario()
    r = simulate(s)
    assert [st.layers for st in r.stages] == balanced_split(s)
    assert r.config["layers_per_stage_auto"] is True
    from simtrain.report.text import run_text

    assert "layer split      auto: " + ", ".join(map(str, balanced_split(s))) in run_text(r)


def test_embedding_only_first_stage():
    """layers_per_stage may hold 0 for a first stage with only the embedding (Megatron's layouts): that stage computes
    the embedding's forward and backward alone."""
    s = make_scenario(model=gpt_model(layers=3, vocab=32000), training={"seq_len": 512, "global_batch": 8},
                      parallel={"pp": 4, "layers_per_stage": [0, 1, 1, 1]})
    plan = build_plan(s)
    c = plan.chunks[0]
    assert c.layers == 0 and c.has_embedding
    r = simulate(s)
    assert r.stages[0].compute_s == pytest.approx(8 * (c.embed_fwd + c.embed_bwd) + plan.optimizer_time[0], rel=1e-9)
