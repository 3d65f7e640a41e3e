"""The MLPerf Training GPT-3 175B cases (simtrain/validation/mlperf_training.yaml): NVIDIA's closed-division runs on
DGX H100, layouts from the submissions' configs, step times from their result logs."""

from importlib import resources
from pathlib import Path

import pytest

from simtrain.decide import cases as case_files
from simtrain.decide import validate as v

CASES = Path(str(resources.files("simtrain.validation") / "mlperf_training.yaml"))
SOURCE = "MLCommons MLPerf Training results"

# Copied by hand from the submissions (mlcommons/training_results_v3.0 @63e326c400, v3.1 @d06288b2bd, v4.0
# @6fe954378e, v4.1 @b87b9e396f): per case the config's nodes, MINIBS, TP, PP, micro-batch and INTERLEAVED_PIPELINE,
# and the logs' global_batch_size and gradient_accumulation_steps; the step time of each of the three runs from the
# mllog block_start/block_stop time_ms and epoch_count (v3.1 and later) or train_step_timing (v3.0).
RUNS = {
    #                                     nodes MINIBS tp pp mbs vpp  gbs   ga   per-run step time (s)
    "mlperf_v30_h100_gpt3_175b_512gpu": (64, 128, 4, 8, 1, 12, 2048, 128, (12.0873, 12.0744, 12.0830)),
    "mlperf_v31_h100_gpt3_175b_768gpu": (96, 128, 4, 8, 1, 12, 3072, 128, (11.1083, 11.1048, 11.0968)),
    "mlperf_v31_h100_gpt3_175b_4096gpu": (512, 16, 4, 8, 1, 12, 2048, 16, (1.6295, 1.6293, 1.6328)),
    "mlperf_v31_h100_gpt3_175b_6144gpu": (768, 16, 4, 8, 1, 12, 3072, 16, (1.6377, 1.6398, 1.6397)),
    "mlperf_v31_h100_gpt3_175b_8192gpu": (1024, 16, 4, 8, 1, 12, 4096, 16, (1.6441, 1.6425, 1.6431)),
    "mlperf_v31_h100_gpt3_175b_10240gpu": (1280, 8, 4, 8, 1, 12, 2560, 8, (0.9500, 0.9487, 0.9491)),
    "mlperf_v31_h100_gpt3_175b_10752gpu": (1344, 8, 4, 8, 1, 12, 2688, 8, (0.9553, 0.9544, 0.9547)),
    "mlperf_v41_h100_gpt3_175b_256gpu": (32, 256, 4, 8, 2, 6, 2048, 128, (18.4073, 18.4075, 18.4598)),
    "mlperf_v41_h100_gpt3_175b_512gpu": (64, 128, 4, 8, 2, 6, 2048, 64, (9.5360, 9.7011, 9.5406)),
    "mlperf_v40_h100_gpt3_175b_10752gpu": (1344, 6, 4, 6, 1, 8, 2688, 6, (0.9207, 0.9204, 0.9208)),
    "mlperf_v40_h100_gpt3_175b_11616gpu": (1452, 6, 4, 6, 1, 8, 2904, 6, (0.9222, 0.9214, 0.9214)),
}
# the v3.0 and v3.1 runs state every setting; the v4.x runs add settings simtrain cannot express (FP8 parameters,
# SHARP, deferred embedding weight gradients, multicast TP overlap, VBOOST)
GATED = {case_id for case_id in RUNS if case_id.startswith(("mlperf_v30_", "mlperf_v31_"))}


def _cases() -> dict[str, dict]:
    return {c["id"]: c for c in case_files.load_cases(CASES)[0]}


@pytest.fixture(scope="module")
def results():
    return v.validate(CASES)


def test_the_cases_and_the_gated_ones():
    """Eleven cases, seven of them gated (the v3.0 / v3.1 runs), each citing its round's results and config."""
    cases = _cases()
    assert set(cases) == set(RUNS)
    assert {i for i, c in cases.items() if c["gate"]} == GATED and len(GATED) == 7
    for case_id, case in cases.items():
        assert isinstance(case["assumed"], list) and case["target_from"].strip(), case_id
        version = case_id.split("_")[1]                                   # v30 -> v3.0
        assert f"training_results_v{version[1]}.{version[2]} @" in case["source"], case_id
        assert "config_DGXH100_" in case["source"] and "/results/" in case["source"], case_id


def test_layouts_follow_the_configs_and_the_logs():
    """dp = GPUs / (tp x pp); global batch = MINIBS x dp = dp x micro-batch x accumulation steps, as logged."""
    for case_id, case in _cases().items():
        nodes, minibs, tp, pp, mbs, vpp, gbs, ga, _ = RUNS[case_id]
        sc = case["scenario"]
        par, tr = sc["parallel"], sc["training"]
        dp = nodes * 8 // (tp * pp)
        assert (sc["nodes"], par["tp"], par["pp"], par["vpp"], par["dp"]) == (nodes, tp, pp, vpp, dp), case_id
        assert tr["global_batch"] == gbs == minibs * dp == dp * mbs * ga, case_id
        assert tr["micro_batch"] == mbs and tr["seq_len"] == 2048 and tr["recompute"] == "none", case_id
        assert tr["precision"] == "fp8" and par["sequence_parallel"] and par["tp_comm_overlap"], case_id
        assert sc["hardware"] == "dgx-h100" and sc["model"] == "gpt3-175b", case_id


def test_targets_are_the_mean_of_the_three_logged_runs():
    """target_step_time_s is the mean of the three runs' step times written above (rounded to 0.1 ms)."""
    for case_id, case in _cases().items():
        runs = RUNS[case_id][-1]
        assert case["target_step_time_s"] == pytest.approx(sum(runs) / 3, abs=1e-4), case_id
        assert case["measured"]["step_time_s_per_run"] == pytest.approx(list(runs), abs=1e-4), case_id


def test_every_case_predicts(results):
    """Each case, gated or not, runs to a predicted step time without a failure."""
    assert len(results) == len(RUNS)
    for r in results:
        assert r.failure is None and r.predicted_step_time_s and r.predicted_step_time_s > 0, r.id


def test_groups_as_one_source_of_its_own(results):
    """Every round and submitter groups under one source name, distinct from every other bundled source."""
    assert {r.source_name for r in results} == {SOURCE}
    gated = v.by_group([r for r in results if r.gate], lambda r: r.source_name)
    assert list(gated) == [SOURCE] and gated[SOURCE].cases == len(GATED)
    others = set()
    for name, path in case_files.dev_case_files().items():
        if name != CASES.stem:
            others |= {v.source_name(str(c.get("source", ""))) for c in case_files.load_cases(path)[0]}
    assert SOURCE not in others
    assert CASES.stem in case_files.dev_case_files()
