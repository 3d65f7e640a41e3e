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
# @6fe954378e, v4.1 @b87b9e396f, v5.0 @0fdc28f013, v5.1 @441d65f444): per case the config's nodes, MINIBS, TP, PP,
# CP, micro-batch and INTERLEAVED_PIPELINE (1: none), and the logs' global_batch_size and
# gradient_accumulation_steps; the step time of each run from the mllog block_start/block_stop time_ms and their
# epoch_count / samples_count / step (v3.1 and later) or train_step_timing (v3.0).
H, B = "dgx-h100", "dgx-b200"
CW, AZ, NB = "coreweave-hgx-h100", "azure-nd-h100-v5", "nebius-h200"   # other submitters' systems
RUNS = {
    #                             hardware nodes MINIBS tp pp cp mbs vpp gbs ga  per-run step time (s)
    "mlperf_v30_h100_gpt3_175b_512gpu": (H, 64, 128, 4, 8, 1, 1, 12, 2048, 128, (12.0873, 12.0744, 12.0830)),
    "mlperf_v31_h100_gpt3_175b_768gpu": (H, 96, 128, 4, 8, 1, 1, 12, 3072, 128, (11.1083, 11.1048, 11.0968)),
    "mlperf_v31_h100_gpt3_175b_4096gpu": (H, 512, 16, 4, 8, 1, 1, 12, 2048, 16, (1.6295, 1.6293, 1.6328)),
    "mlperf_v31_h100_gpt3_175b_6144gpu": (H, 768, 16, 4, 8, 1, 1, 12, 3072, 16, (1.6377, 1.6398, 1.6397)),
    "mlperf_v31_h100_gpt3_175b_8192gpu": (H, 1024, 16, 4, 8, 1, 1, 12, 4096, 16, (1.6441, 1.6425, 1.6431)),
    "mlperf_v31_h100_gpt3_175b_10240gpu": (H, 1280, 8, 4, 8, 1, 1, 12, 2560, 8, (0.9500, 0.9487, 0.9491)),
    "mlperf_v31_h100_gpt3_175b_10752gpu": (H, 1344, 8, 4, 8, 1, 1, 12, 2688, 8, (0.9553, 0.9544, 0.9547)),
    "mlperf_v30_coreweave_h100_gpt3_175b_768gpu": (CW, 96, 128, 4, 8, 1, 1, 12, 3072, 128, (12.3279, 12.2780, 12.3351)),
    "mlperf_v30_coreweave_h100_gpt3_175b_1536gpu": (CW, 192, 64, 4, 8, 1, 1, 12, 3072, 64, (6.3186, 6.3493, 6.3308)),
    "mlperf_v30_coreweave_h100_gpt3_175b_3584gpu": (CW, 448, 24, 4, 8, 1, 1, 12, 2688, 24, (2.5890, 2.5951, 2.5957)),
    "mlperf_v31_azure_h100_gpt3_175b_10752gpu": (AZ, 1344, 8, 4, 8, 1, 1, 12, 2688, 8, (0.9811, 0.9804, 0.9856)),
    "mlperf_v41_h100_gpt3_175b_256gpu": (H, 32, 256, 4, 8, 1, 2, 6, 2048, 128, (18.4073, 18.4075, 18.4598)),
    "mlperf_v41_h100_gpt3_175b_512gpu": (H, 64, 128, 4, 8, 1, 2, 6, 2048, 64, (9.5360, 9.7011, 9.5406)),
    "mlperf_v40_h100_gpt3_175b_10752gpu": (H, 1344, 6, 4, 6, 1, 1, 8, 2688, 6, (0.9207, 0.9204, 0.9208)),
    "mlperf_v40_h100_gpt3_175b_11616gpu": (H, 1452, 6, 4, 6, 1, 1, 8, 2904, 6, (0.9222, 0.9214, 0.9214)),
    "mlperf_v50_h100_llama31_405b_512gpu": (H, 64, 288, 8, 8, 2, 1, 8, 1152, 288, (55.1993, 55.2334, 55.2146)),
    "mlperf_v50_h100_llama31_405b_2048gpu": (H, 256, 72, 8, 8, 2, 1, 8, 1152, 72, (14.2392, 14.3445, 14.2598)),
    "mlperf_v50_h100_llama31_405b_2432gpu": (H, 304, 64, 8, 8, 2, 1, 8, 1216, 64, (12.7302, 12.9138, 13.0684)),
    "mlperf_v50_h100_llama31_405b_2560gpu": (H, 320, 56, 8, 8, 2, 1, 8, 1120, 56, (11.3485, 11.2257, 11.4438)),
    "mlperf_v50_h100_llama31_405b_8192gpu": (H, 1024, 24, 8, 8, 2, 1, 8, 1536, 24, (5.2461, 5.2421, 5.2596)),
    "mlperf_v51_nebius_h200_llama31_405b_512gpu": (NB, 64, 144, 4, 8, 2, 1, 8, 1152, 144, (50.0879, 50.0678, 50.0103)),
    "mlperf_v51_nebius_h200_llama31_405b_1024gpu": (NB, 128, 72, 4, 8, 2, 1, 8, 1152, 72, (25.4193, 25.3574, 25.3750)),
    "mlperf_v51_b200_llama31_8b_8gpu": (B, 1, 2, 1, 1, 1, 2, 1, 16, 1, (0.5445, 0.5446, 0.5459, 0.5460, 0.5444,
                                                                        0.5459, 0.5443, 0.5460, 0.5491, 0.5440)),
    "mlperf_v51_b200_llama31_8b_16gpu": (B, 2, 2, 1, 1, 1, 2, 1, 32, 1, (0.5723, 0.5740, 0.5763, 0.5772, 0.5777,
                                                                         0.5724, 0.5739, 0.5766, 0.5771, 0.5776)),
    "mlperf_v51_b200_llama31_8b_32gpu": (B, 4, 1, 1, 1, 2, 1, 1, 16, 1, (0.1924, 0.1926, 0.1937, 0.1924, 0.1939,
                                                                         0.1924, 0.1937, 0.1939, 0.1942, 0.1936)),
    "mlperf_v51_b200_llama31_8b_64gpu": (B, 8, 1, 1, 1, 2, 1, 1, 32, 1, (0.1904, 0.1904, 0.1904, 0.1905, 0.1906,
                                                                         0.1905, 0.1906, 0.1912, 0.1905, 0.1905)),
    "mlperf_v51_b200_llama31_8b_128gpu": (B, 16, 1, 1, 1, 2, 1, 1, 64, 1, (0.1941, 0.1942, 0.1942, 0.1941, 0.1941,
                                                                           0.1941, 0.1941, 0.1966, 0.1941, 0.1941)),
    "mlperf_v51_b200_llama31_8b_256gpu": (B, 32, 1, 1, 1, 2, 1, 1, 128, 1, (0.2226, 0.2226, 0.2226, 0.2233, 0.2226,
                                                                            0.2226, 0.2227, 0.2375, 0.2227, 0.2226)),
    "mlperf_v51_b200_llama31_405b_256gpu": (B, 32, 144, 4, 8, 2, 1, 8, 576, 144, (27.6118, 27.6340, 27.7036)),
    "mlperf_v51_b200_llama31_405b_448gpu": (B, 56, 144, 4, 8, 2, 1, 8, 1008, 144, (27.9992, 27.9762, 28.0031)),
}
# gated: the configs state every setting that moves the step by more than about 2% (v3.0/v3.1 GPT-3, the one-node 8B
# run, the 405B DGX B200 runs); the others add settings simtrain cannot express (multicast TP overlap, FP8 weight
# gathers on an exposed DP all-gather, VBOOST)
GATED = {i for i in RUNS if i.startswith(("mlperf_v30_", "mlperf_v31_", "mlperf_v51_b200_llama31_405b_"))}
GATED.add("mlperf_v51_b200_llama31_8b_8gpu")
# the Llama 3.1 405B rows use the Mixtral 8x22B tokenizer (the v5.0 README: "we replace the paper's TikTokenizer with
# the Mixtral 8x22b tokenizer"): vocab 32,768


def _cases() -> dict[str, dict]:
    return {c["id"]: c for c in case_files.load_cases(CASES)[0]}


@pytest.fixture(scope="module")
def results():
    """The gated cases simulated (the ungated ones run in `simtrain validate mlperf_training`)."""
    return [v.run_case(c, CASES.parent, str(CASES), CASES.stem) for c in _cases().values() if c["gate"]]


def test_the_cases_and_the_gated_ones():
    """30 cases, 14 of them gated, each citing its round's results and its config."""
    cases = _cases()
    assert set(cases) == set(RUNS)
    assert {i for i, c in cases.items() if c["gate"]} == GATED and len(GATED) == 14
    for case_id, case in cases.items():
        assert isinstance(case["assumed"], list) and case["target_from"].strip(), case_id
        version = case_id.split("_")[1]                                   # v30 -> v3.0
        assert f"training_results_v{version[1]}.{version[2]} @" in case["source"], case_id
        assert "/config_DGX" in case["source"] and "/results/" in case["source"], case_id
        assert not case["gate"] or all("%" in a for a in case["assumed"]), case_id   # gated: assumptions sized


def test_layouts_follow_the_configs_and_the_logs():
    """dp = GPUs / (tp x pp x cp); global batch = MINIBS x dp = dp x micro-batch x accumulation steps, as logged."""
    for case_id, case in _cases().items():
        hardware, nodes, minibs, tp, pp, cp, mbs, vpp, gbs, ga, _ = RUNS[case_id]
        sc = case["scenario"]
        par, tr = sc["parallel"], sc["training"]
        dp = nodes * 8 // (tp * pp * cp)
        assert (sc["hardware"], sc["nodes"], par["tp"], par["pp"], par.get("cp", 1), par.get("vpp", 1), par["dp"]) == (
            hardware, nodes, tp, pp, cp, vpp, dp), case_id
        assert tr["global_batch"] == gbs == minibs * dp == dp * mbs * ga, case_id
        assert tr["micro_batch"] == mbs and tr["recompute"] == "none" and tr["precision"] == "fp8", case_id
        assert tr["seq_len"] == (2048 if "gpt3" in case_id else 8192), case_id
        if "405b" in case_id:
            assert sc["model"]["vocab"] == 32768 and sc["model"]["layers"] == 126, case_id
            assert par["layers_per_stage"] == [1] + [2] * 62 + [1], case_id     # 126 layers + embedding + loss


def test_targets_are_the_mean_of_the_logged_runs():
    """target_step_time_s is the mean of the runs' step times written above (rounded to 0.1 ms)."""
    for case_id, case in _cases().items():
        runs = RUNS[case_id][-1]
        assert case["target_step_time_s"] == pytest.approx(sum(runs) / len(runs), abs=1e-4), case_id
        assert case["measured"]["step_time_s_per_run"] == pytest.approx(list(runs), abs=1e-4), case_id


def test_every_case_predicts(results):
    """Each gated case runs to a predicted step time without a failure."""
    assert {r.id for r in results} == GATED
    for r in results:
        assert r.failure is None and r.predicted_step_time_s and r.predicted_step_time_s > 0, r.id


def test_groups_as_one_source_of_its_own(results):
    """Every round and submitter groups under one source name, distinct from every other bundled source."""
    assert {r.source_name for r in results} == {SOURCE}
    assert {v.source_name(c["source"]) for c in _cases().values()} == {SOURCE}
    gated = v.by_group([r for r in results if r.gate], lambda r: r.source_name)
    assert list(gated) == [SOURCE] and gated[SOURCE].cases == len(GATED)
    others = set()
    for name, path in case_files.dev_case_files().items():
        if name != CASES.stem:
            others |= {v.source_name(str(c.get("source", ""))) for c in case_files.load_cases(path)[0]}
    assert SOURCE not in others
    assert CASES.stem in case_files.dev_case_files()


# Other submitters' systems, copied by hand from their systems/*.json: (file, GPUs and NICs per node, NIC Gb/s,
# host memory TB, the dgx file whose GPU blocks they share)
SYSTEMS = {
    "coreweave-hgx-h100": (8, 8, 400, 1.0, "dgx-h100"),   # "Compute: 8x ConnectX-7 InfiniBand NDR 400Gb/Sec", "1.0 TB"
    "azure-nd-h100-v5": (8, 8, 400, 1.8, "dgx-h100"),     # "8x NVIDIA Quantum-2 CX7 InfiniBand (400Gb/s)", "1.8 TB"
    "nebius-h200": (8, 8, 400, 1.6, "hgx-h200"),          # "8x ConnectX-7 IB NDR 400Gb/s + ...", "1.6 TB"
}


@pytest.mark.parametrize("name", sorted(SYSTEMS))
def test_system_files_change_only_the_system(name):
    """A submitter's system file keeps its GPU's blocks (same GPU as the DGX file) and states its own NICs and host."""
    import yaml

    from simtrain.spec.hardware import load_hardware
    repo = CASES.parents[2]
    gpus, nics, gbps, host_tb, base = SYSTEMS[name]
    own, ref = (yaml.safe_load((repo / "hardware" / f"{n}.yaml").read_text()) for n in (name, base))
    for block in ("gpu", "intra_node", "compute", "memory_overheads"):
        assert own[block] == ref[block], (name, block)
    spec = load_hardware(str(repo / "hardware" / f"{name}.yaml"), base_dir=repo, file="t.yaml")[0]
    assert (spec.gpus_per_node, spec.inter_node.nics_per_node) == (gpus, nics)
    assert spec.inter_node.nic_bandwidth == pytest.approx(gbps * 1e9 / 8)
    assert spec.host_memory == pytest.approx(host_tb * 1e12)
    assert "json" in own["inter_node"]["nic_bandwidth"]["source"]
    assert {c["scenario"]["hardware"] for c in _cases().values()} >= {name}
