"""The step-time band of `simtrain run`: from the errors of validated runs like the scenario (report.bands)."""

import pytest

from simtrain.report.bands import band, gpu_family, stack_of


def _rows(errors, gpu="H100", stack="ZeRO-3/FSDP"):
    return tuple({"id": f"{gpu}{stack}{i}", "file": "f", "source": "s", "gpu": gpu, "stack": stack, "error": e}
                 for i, e in enumerate(errors))


def test_ten_or_more_cases_give_the_10th_to_90th_percentile():
    """Errors -0.10, -0.08, ..., +0.08 (ten, step 0.02): numpy's linear 10th percentile is -0.10 + 0.9 x 0.02 =
    -0.082 and the 90th +0.08 - 0.9 x 0.02 = +0.062; a 2.0 s prediction gives 2.0 / 1.062 to 2.0 / 0.918 s."""
    rows = _rows([-0.10 + 0.02 * i for i in range(10)])
    b = band(2.0, "H100", "ZeRO-3/FSDP", rows)
    assert b.errors == pytest.approx((-0.082, 0.062))
    assert (b.low_s, b.high_s) == pytest.approx((2.0 / 1.062, 2.0 / 0.918))
    assert b.basis == "H100, ZeRO-3/FSDP" and len(b.cases) == 10


def test_fewer_cases_give_their_range():
    """Three cases -0.2, 0.0, +0.1: the band is 1.0 / 1.1 to 1.0 / 0.8 s."""
    b = band(1.0, "H100", "ZeRO-3/FSDP", _rows([-0.2, 0.0, 0.1]))
    assert (b.low_s, b.high_s) == pytest.approx((1 / 1.1, 1 / 0.8))
    assert b.to_dict()["percentiles"] == "min-max"


def test_the_same_gpu_family_stands_in_for_a_stack_with_too_few_cases():
    """Two DDP cases are too few (MIN_CASES 3): the GPU family's cases are used, and the basis says so."""
    rows = _rows([0.5, 0.5], stack="DDP/ZeRO-1/2") + _rows([-0.1, 0.0, 0.1])
    b = band(1.0, "H100", "DDP/ZeRO-1/2", rows)
    assert b.basis.startswith("H100, any stack") and len(b.cases) == 5
    assert (b.low_s, b.high_s) == pytest.approx((1 / 1.5, 1 / 0.9))


def test_no_similar_case_gives_no_band():
    """A GPU no validated case ran on has no band."""
    assert band(1.0, "B200", "DDP/ZeRO-1/2", _rows([0.0] * 20)) is None


def test_moe_and_dense_errors_stay_apart():
    """A dense scenario's band ignores MoE cases and a MoE scenario's uses only MoE cases, also when the GPU family
    stands in for the stack: dense -0.1, 0.0, +0.1 and MoE -0.3 x 3 give 1/1.1..1/0.9 and 1/0.7..1/0.7."""
    moe = stack_of(1, moe=True)
    rows = _rows([-0.1, 0.0, 0.1], stack="DDP/ZeRO-1/2") + _rows([-0.3] * 3, stack=moe)
    dense_band, moe_band = band(1.0, "H100", "DDP/ZeRO-1/2", rows), band(1.0, "H100", moe, rows)
    assert (dense_band.low_s, dense_band.high_s) == pytest.approx((1 / 1.1, 1 / 0.9))
    assert (moe_band.low_s, moe_band.high_s) == pytest.approx((1 / 0.7, 1 / 0.7))
    fallback = band(1.0, "H100", stack_of(3, moe=True), rows)
    assert fallback.basis.startswith("H100, any MoE stack") and len(fallback.cases) == 3
    assert band(1.0, "H100", stack_of(3, moe=True), rows[:3]) is None


def test_unfused_accumulation_is_a_stack_of_its_own():
    """A separate gradient-accumulation pass (training.grad_accumulation unfused, nanotron's) names its own stack:
    a fused-accumulation DDP scenario's band ignores those cases (-0.3 x 3) and uses the others' -0.1, 0.0, +0.1."""
    unfused = stack_of(1, grad_accumulation="unfused")
    assert unfused == "DDP/ZeRO-1/2, unfused accumulation" and stack_of(1, grad_accumulation="fused") == stack_of(1)
    assert stack_of(0, grad_accumulation="autograd") == "DDP/ZeRO-1/2, autograd accumulation"
    rows = _rows([-0.1, 0.0, 0.1], stack="DDP/ZeRO-1/2") + _rows([-0.3] * 3, stack=unfused)
    fused_band, unfused_band = band(1.0, "H100", stack_of(1), rows), band(1.0, "H100", unfused, rows)
    assert (fused_band.low_s, fused_band.high_s) == pytest.approx((1 / 1.1, 1 / 0.9))
    assert (unfused_band.low_s, unfused_band.high_s) == pytest.approx((1 / 0.7, 1 / 0.7))


def test_a_frameworks_layer_kernels_are_a_stack_of_their_own():
    """training.layer_kernels (nanotron's, torchtitan's eager block) names its own stack, after the accumulation: a
    nanotron scenario's band uses the nanotron cases (-0.1 x 3), not the fused stack's (+0.1 x 3)."""
    nano = stack_of(1, grad_accumulation="unfused", layer_kernels="nanotron")
    assert nano == "DDP/ZeRO-1/2, unfused accumulation, nanotron kernels"
    assert stack_of(3, layer_kernels="torchtitan") == "ZeRO-3/FSDP, torchtitan kernels"
    assert stack_of(1, layer_kernels="fused") == stack_of(1)
    rows = _rows([0.1] * 3, stack="DDP/ZeRO-1/2, unfused accumulation") + _rows([-0.1] * 3, stack=nano)
    b = band(1.0, "H100", nano, rows)
    assert (b.low_s, b.high_s) == pytest.approx((1 / 0.9, 1 / 0.9))


def test_nanotrons_async_tp_is_a_stack_of_its_own():
    """nanotron's asynchronous TP linears (tp > 1, sequence parallelism) name their own stack, after the kernels: its
    validated runs sit on a host-bound floor the TP-1 runs do not. A TP-2 playbook run's band is drawn from the 43
    gated one-node playbook runs with TP > 1 (ultrascale_playbook.yaml), the TP-1 run's from the 23 with TP 1."""
    import simtrain
    from simtrain.decide.cases import load_cases
    from simtrain.spec.scenario import scenario_from_dict

    assert stack_of(1, grad_accumulation="unfused", layer_kernels="nanotron", async_tp=True) == \
        "DDP/ZeRO-1/2, unfused accumulation, nanotron kernels, nanotron async TP"
    assert stack_of(0, async_tp=False) == stack_of(0)
    cases, path = load_cases("ultrascale_playbook")
    by_id = {c["id"]: c for c in cases}
    for cid, count in (("usp_1b_1n_dp4_tp2_pp1_mbs1_z0", 43), ("usp_1b_1n_dp8_tp1_pp1_mbs1_z0", 23)):
        sc = scenario_from_dict(dict(by_id[cid]["scenario"]), file=str(path), base_dir=path.parent)
        assert len(simtrain.simulate(sc).step_time_band["cases"]) == count, cid


def test_names_of_gpu_and_stack():
    """The GPU family is the name's first part; ZeRO-3 is the FSDP stack, the others Megatron-style."""
    assert gpu_family("H200-SXM-141GB") == "H200"
    assert stack_of(3) == "ZeRO-3/FSDP" and stack_of(1) == stack_of(0) == "DDP/ZeRO-1/2"


def test_run_reports_its_band_and_the_cases_behind_it():
    """pp4_dp4 (H100, ZeRO-1): the JSON has step_time_band_s around the measured-error range and names the cases."""
    from pathlib import Path

    import simtrain

    r = simtrain.simulate(Path(__file__).resolve().parent.parent / "scenarios" / "pp4_dp4.yaml")
    d = r.to_dict()
    lo, hi = d["step_time_band_s"]
    assert lo < hi and d["step_time_band"]["cases"]
    e_low, e_high = d["step_time_band"]["error_range"]
    assert lo == pytest.approx(r.step_time_s / (1 + e_high), rel=1e-6)
    assert hi == pytest.approx(r.step_time_s / (1 + e_low), rel=1e-6)


def test_compare_says_when_two_options_are_closer_than_their_bands():
    """Throughput bands from the step-time bands (tokens per step / step-band ends): A 1,000 tokens/s with a step
    band of 0.9-1.25 s per 1,000-token step gives 800-1,111 tokens/s; B at 1,050 tokens/s (band 875-1,167) overlaps
    it and is named; C at 2,000 (1,818-2,222) overlaps neither; a row without a band is never named."""
    from simtrain.decide.compare import closer_than_bands

    def row(name, tps, low, high):
        return {"scenario": name, "tokens_per_s": tps, "step_time_s": 1000 / tps,
                "step_time_band_low_s": low, "step_time_band_high_s": high}

    a = row("A", 1000.0, 0.9, 1.25)
    b = row("B", 1050.0, 1000 / 1167, 1000 / 875)
    c = row("C", 2000.0, 0.45, 0.55)
    none = row("D", 1000.0, None, None)
    said = closer_than_bands([a, b, c, none])
    assert len(said) == 1 and said[0].startswith("A and B are closer than their bands: 1,000 vs 1,050 tokens/s")
    assert "bands 800-1,111 and 875-1,167" in said[0]


def test_the_band_percentile_is_numpys_linear_percentile_to_the_bit():
    """bands.percentile is Hyndman & Fan's definition 7, numpy.percentile's default (the reference here), bit for
    bit: on sets of 1 to 40 errors, at the band's 10th and 90th percentiles and at 0, 50 and 100."""
    import random

    import numpy as np

    from simtrain.report.bands import percentile

    rng = random.Random(7)
    for n in range(1, 41):
        errors = [rng.uniform(-0.4, 0.2) for _ in range(n)]
        for p in (0, 10, 50, 90, 100):
            assert percentile(errors, p) == float(np.percentile(np.array(errors), p)), (n, p)


def test_running_a_scenario_does_not_import_numpy():
    """The run path (load, simulate, report with its band) stays free of numpy, whose import is about 0.15 s of a
    `simtrain run` process: checked in a fresh interpreter."""
    import subprocess
    import sys

    from conftest import REPO

    code = ("import sys, simtrain; r = simtrain.simulate('pp4_dp4'); r.to_dict(); "
            "print('numpy' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("step, tail", [
    (0.9, "; all above the prediction: runs like it measured slower than predicted)"),
    (1.5, "; all below the prediction: runs like it measured faster than predicted)"),
    (1.1, ")"),
])
def test_the_text_band_says_when_it_misses_the_prediction(step, tail):
    """The band is the prediction corrected by the errors of runs like it, so it can lie wholly above or below the
    prediction (compare_a100: 12.479 s, band 13.341-14.379 s); the text line says so instead of leaving the user to
    wonder (found by an audit). Band 1.0-1.2 s by hand; the step on either side and inside it."""
    from types import SimpleNamespace

    from simtrain.report.text import band_text

    result = SimpleNamespace(step_time_s=step, step_time_band_s=(1.0, 1.2),
                             step_time_band={"cases": ["a", "b"], "basis": "A100, DDP/ZeRO-1/2"})
    assert band_text(result) == ("1.000 s - 1.200 s  (10th-90th percentile of the errors of 2 validated runs: A100, "
                                 "DDP/ZeRO-1/2" + tail)
