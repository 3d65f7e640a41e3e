"""MosaicML's extra A100 80GB tables (simtrain/validation/llm_foundry_sweeps.yaml): a micro-batch sweep and the
same configurations on two software images.

Source of every expected figure: mosaicml/llm-foundry @beb8dee6922c5e31d27a24a713a1315b4013185d,
scripts/train/benchmarking/larger_mb_1.md and torches.md (columns MicroBatchSize, GradAccum, GlobalBatchSize,
Throughput (T/s/GPU), NumParams), copied into the cases' measured values and checked by hand below.
"""

from importlib import resources
from pathlib import Path

import pytest

from simtrain.decide import cases as case_files
from simtrain.decide import validate as v
from simtrain.spec.scenario import scenario_from_dict

SWEEP_CASES = Path(str(resources.files("simtrain.validation") / "llm_foundry_sweeps.yaml"))

# Rows used: larger_mb_1.md 6 of 9 (the A100 40GB row and the two activation-CPU-offload rows are left out),
# torches.md all 24 (11 on the pytorch 2.0.1 image, 13 on 1.13.1).
ROWS = 6 + 24
SEQ = 2048   # every sweep row
GPUS = 8


def per_microbatch_s(micro_batch: int, tokens_per_s_per_gpu: float) -> float:
    """Seconds one GPU spends on one micro-batch: its tokens over the GPU's measured rate."""
    return micro_batch * SEQ / tokens_per_s_per_gpu


@pytest.fixture(scope="module")
def cases():
    return {c["id"]: c for c in case_files.load_cases(SWEEP_CASES)[0]}


@pytest.fixture(scope="module")
def results():
    return {r.id: r for r in v.validate(SWEEP_CASES)}


def test_one_case_per_row(cases):
    assert len(case_files.load_cases(SWEEP_CASES)[0]) == ROWS == len(cases)
    assert sum("_mb_sweep_" in c for c in cases) == 6
    assert sum("_torch201_" in c for c in cases) == 11
    assert sum("_torch113_" in c for c in cases) == 13


def test_bundled_by_name():
    assert case_files.resolve_cases("llm_foundry_sweeps") == SWEEP_CASES


def test_every_case_simulates(results):
    assert [r.id for r in results.values() if r.failure] == []


def test_target_step_time_by_hand(cases):
    """larger_mb_1.md row 3: 7b, micro-batch 6, GradAccum 2, GlobalBatchSize 96, 4715 T/s/GPU:
    96 x 2048 / (8 x 4715) = 196608 / 37720 = 5.2123 s."""
    c = cases["mosaic_a100_80gb_mb_sweep_7b_s2048_mb6_3"]
    t = c["scenario"]["training"]
    assert (t["micro_batch"], t["global_batch"], c["measured"]["tokens_per_s_per_gpu"]) == (6, 96, 4715)
    assert c["target_step_time_s"] == pytest.approx(5.2123, abs=5e-5)


@pytest.mark.parametrize("case_id, num_params", [
    ("mosaic_a100_80gb_mb_sweep_7b_s2048_mb1_6", 6658859008),
    ("mosaic_a100_80gb_torch201_13b_s32768_mb1_10", 13011240960),
    ("mosaic_a100_80gb_torch113_30b_s8192_mb1_18", 30019254272),
])
def test_model_matches_the_numparams_column(cases, case_id, num_params):
    sc = scenario_from_dict(dict(cases[case_id]["scenario"]), base_dir=SWEEP_CASES.parent)
    assert sc.model.params_total == num_params


def _line(points: list[tuple[int, float]]) -> tuple[float, float]:
    """Slope and intercept of the straight line through the first and last (micro-batch, seconds) points."""
    (b0, t0), (b1, t1) = points[0], points[-1]
    slope = (t1 - t0) / (b1 - b0)
    return slope, t0 - slope * b0


# (model, [(micro-batch, case id, T/s/GPU from the table)], GradAccum)
SWEEPS = [
    ("7b", [(2, "mosaic_a100_80gb_mb_sweep_7b_s2048_mb2_5", 4044),
            (6, "mosaic_a100_80gb_mb_sweep_7b_s2048_mb6_3", 4715)]),
    ("13b", [(1, "mosaic_a100_80gb_mb_sweep_13b_s2048_mb1_2", 1867),
             (2, "mosaic_a100_80gb_mb_sweep_13b_s2048_mb2_1", 2228)]),
]


@pytest.mark.parametrize("model, rows", SWEEPS, ids=[m for m, _ in SWEEPS])
def test_cost_of_one_more_sequence(results, model, rows):
    """The measured time per micro-batch grows by a fixed amount per sequence (the slope of the sweep); simtrain's
    grows by the same amount within 5%. 7b by hand: (6 x 2048 / 4715 - 2 x 2048 / 4044) / 4 = (2.6062 - 1.0129) / 4
    = 0.3983 s per sequence; 13b: 2 x 2048 / 2228 - 2048 / 1867 = 1.8384 - 1.0969 = 0.7415 s."""
    measured = _line([(b, per_microbatch_s(b, tps)) for b, _, tps in rows])[0]
    assert measured == pytest.approx({"7b": 0.3983, "13b": 0.7415}[model], abs=5e-4)
    predicted = _line([(b, results[cid].predicted_step_time_s / 2) for b, cid, _ in rows])[0]   # GradAccum 2
    assert predicted == pytest.approx(measured, rel=0.05)


@pytest.mark.parametrize("model, rows", SWEEPS, ids=[m for m, _ in SWEEPS])
def test_fixed_cost_of_a_microbatch(results, model, rows):
    """The intercept of the sweep (test_measured_fixed_cost_by_hand): simtrain within 20% of it. It was short by
    40% until FSDP1's fixed cost per unit and micro-batch (1.875 ms, YaFSDP's measured gap; docs/model.md
    section 2.12) was counted: 32 and 40 layers add 0.060 and 0.075 s. The pass rests on that constant, whose form
    was chosen for this residual; 13B is at -19% of a 20% tolerance, so it is a guard, not independent evidence."""
    measured = _line([(b, per_microbatch_s(b, tps)) for b, _, tps in rows])[1]
    predicted = _line([(b, results[cid].predicted_step_time_s / 2) for b, cid, _ in rows])[1]
    assert predicted == pytest.approx(measured, rel=0.20)


@pytest.mark.parametrize("model, rows", SWEEPS, ids=[m for m, _ in SWEEPS])
def test_measured_fixed_cost_by_hand(model, rows):
    """The intercept of the measured sweep, what a micro-batch costs whatever its size. 7b by hand:
    1.0129 - 2 x 0.3983 = 0.2163 s; 13b: 1.0969 - 0.7415 = 0.3554 s."""
    measured = _line([(b, per_microbatch_s(b, tps)) for b, _, tps in rows])[1]
    assert measured == pytest.approx({"7b": 0.2163, "13b": 0.3554}[model], abs=5e-4)


def test_two_images_measure_the_same_run_a_few_percent_apart(cases):
    """The noise floor of the source itself: the same configuration on two software images. 7b, 2048 tokens,
    micro-batch 32: 3918 (pytorch 2.0.1) and 3790 (1.13.1) T/s/GPU, 3.4% apart."""
    a = cases["mosaic_a100_80gb_torch201_7b_s2048_mb32_16"]["measured"]["tokens_per_s_per_gpu"]
    b = cases["mosaic_a100_80gb_torch113_7b_s2048_mb32_29"]["measured"]["tokens_per_s_per_gpu"]
    assert (a, b) == (3918, 3790)
    assert a / b - 1 == pytest.approx(0.0338, abs=5e-4)


# Regression guard, not a target: today's output (2026-11-29, sixth session) is a mean |error| of 5.2% over the
# 30 cases and 2.9% over the 11 activation-checkpointed runs on the pytorch 2.0.1 image; with FlashAttention-1 at
# its measured A100 speed (thirteenth session) 5.1% and 4.3%; with MPT's Triton kernel as its own (flash1_triton,
# fourteenth session) 4.5% and 3.2%; with that kernel's own per-pass ratio (xformers#479; fifteenth session) 4.2% and
# 2.7%; rounded up to the next whole percent.
def test_error_does_not_regress(results):
    everything = v.summarize(list(results.values()))
    assert everything.cases == ROWS and everything.mean_abs_error <= 0.05
    torch201 = v.summarize([r for r in results.values() if "_torch201_" in r.id])
    assert torch201.mean_abs_error <= 0.03


def test_the_bands_error_table_is_this_validation(results):
    """The errors `simtrain run` draws its band from are the sweep companion's as validated now."""
    from conftest import assert_error_table_matches

    assert_error_table_matches(results.values(), "llm_foundry_sweeps")
