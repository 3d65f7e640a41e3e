"""The dev cases from sources other than MosaicML (one cases file per source in simtrain/validation/).

Each test checks one file's bookkeeping against the published figures written here by hand: every case names
its source, lists what it assumes and says whether it is gated, and its target_step_time_s is the arithmetic its
target_from states. The prediction errors are reported by `simtrain validate FILE`, not asserted.
"""

from importlib import resources
from pathlib import Path

import pytest

from simtrain.decide import cases as case_files
from simtrain.spec.scenario import scenario_from_dict


def _cases(stem: str, prefix: str = "") -> dict[str, dict]:
    path = Path(str(resources.files("simtrain.validation") / f"{stem}.yaml"))
    cases, _ = case_files.load_cases(path)
    cases = [c for c in cases if str(c["id"]).startswith(prefix)]
    for case in cases:
        assert str(case.get("source", "")).strip(), case["id"]
        assert isinstance(case.get("assumed"), list), case["id"]
        assert all(isinstance(a, str) for a in case["assumed"]), case["id"]
        assert isinstance(case.get("gate"), bool), case["id"]
        assert str(case.get("target_from", "")).strip(), case["id"]
        assert not (case["gate"] and any("vpp" in a or "micro_batch" in a for a in case["assumed"])), case["id"]
        scenario_from_dict(dict(case["scenario"], name=case["id"]), base_dir=path.parent)   # a valid scenario
    return {c["id"]: c for c in cases}


def test_flashattn_training_targets_from_the_readme_table():
    """FlashAttention README GPT3 table: step = global batch x 2048 / node tokens/s, micro-batches from the configs."""
    cases = _cases("flashattn_training")
    # README @4a6eaa9f "Through put (tokens/sec)" on 8 x A100 80GB; global batch 0.5M tokens = 256 x 2048 (base.yaml
    # global_batch_size 256), 1M tokens = 512 x 2048 (gpt3xl-flash.yaml); per-GPU batch at gpu_mem = 82.
    table = {"125M": (256, 32, 1310e3, 0.40022), "355M": (256, 32, 503e3, 1.04232),
             "760M": (256, 16, 245e3, 2.13995), "1.3B": (512, 8, 169e3, 6.20459), "2.7B": (512, 4, 85e3, 12.3362)}
    assert len(cases) == len(table)
    for name, (global_batch, micro_batch, tokens_per_s, step_s) in table.items():
        case = cases[f"flashattn_gpt3_{name}_8xa100"]
        training = case["scenario"]["training"]
        assert (training["global_batch"], training["micro_batch"]) == (global_batch, micro_batch)
        assert case["measured"]["tokens_per_s"] == tokens_per_s
        assert case["target_step_time_s"] == pytest.approx(global_batch * 2048 / tokens_per_s, rel=1e-5)
        assert case["target_step_time_s"] == pytest.approx(step_s, rel=1e-5)
        assert case["gate"] is True and case["assumed"] == []


def test_korthikanti2022_targets_are_table5_iteration_times():
    """Korthikanti et al. 2022 Table 5: the target is the iteration time itself; only single-stage runs are gated."""
    cases = _cases("korthikanti2022")
    # Table 5 (s): full recompute / sequence parallelism + selective recompute; Table 3: GPUs, pipeline stages.
    table = {"22B": (1.42, 1.10, 8, 1), "175B": (18.13, 13.75, 64, 8), "530B": (49.05, 37.83, 280, 35),
             "1T": (94.42, 71.49, 512, 64)}
    assert len(cases) == 2 * len(table)
    for name, (full_s, present_s, gpus, pp) in table.items():
        for mode, step_s in (("full", full_s), ("sp_selective", present_s)):
            case = cases[f"korthikanti22_t5_{name}_{mode}"]
            assert case["target_step_time_s"] == step_s == case["measured"]["iteration_time_s"]
            scenario = case["scenario"]
            assert scenario["nodes"] * 8 == gpus and scenario["parallel"]["pp"] == pp
            assert scenario["parallel"]["sequence_parallel"] is (mode == "sp_selective")
            assert case["gate"] is (pp == 1)


def test_smith2022_mtnlg_targets_are_the_papers_iteration_times():
    """MT-NLG Sec. 2.4: 60.1 / 50.2 / 44.4 s per iteration of 1920 sequences on 280 / 350 / 420 DGX A100."""
    cases = _cases("smith2022_mtnlg")
    table = {280: 60.1, 350: 50.2, 420: 44.4}
    assert len(cases) == len(table)
    for nodes, step_s in table.items():
        case = cases[f"smith22_mtnlg_530B_{nodes * 8}gpu"]
        assert case["target_step_time_s"] == step_s == case["measured"]["iteration_time_s"]
        assert case["scenario"]["nodes"] == nodes
        assert case["scenario"]["parallel"]["dp"] * 8 * 35 == nodes * 8     # tp 8 x pp 35 per replica
        assert case["gate"] is False


def test_bloom176b_target_is_the_logged_iteration_time():
    """BLOOM tr11 log, iteration 85376: 104.70 s for 2048 samples, i.e. 2048 / 104.70 = 19.56 samples/s as logged."""
    cases = _cases("bloom176b")
    case = cases["bloom176b_tr11_iter85376"]
    assert case["target_step_time_s"] == 104.70
    assert 2048 / case["target_step_time_s"] == pytest.approx(case["measured"]["samples_per_s"], abs=5e-4)
    parallel = case["scenario"]["parallel"]
    assert parallel["dp"] * parallel["tp"] * parallel["pp"] == 384 == case["scenario"]["nodes"] * 8
    assert sum(parallel["layers_per_stage"]) == 70 and case["gate"] is False


def test_narayanan2021_table1_rows_follow_the_sc21_scripts():
    """Narayanan 2021 Table 1: layout of Megatron-LM examples/sc21/run_table_1.sh; target = Eq. 3 FLOPs / TFLOP/s."""
    cases = _cases("cases", prefix="narayanan21_t1_")
    # run_table_1.sh @de7dc40f: TP, PP, MBS, GBS, NLS, HS, NAH, NNODES, layers per virtual stage (0: not interleaved);
    # Table 1: achieved TFLOP/s per GPU
    table = {"1.7B": (1, 1, 16, 512, 24, 2304, 24, 4, 0, 137), "3.6B": (2, 1, 16, 512, 30, 3072, 32, 8, 0, 138),
             "7.5B": (4, 1, 16, 512, 36, 4096, 32, 16, 0, 142), "18.4B": (8, 1, 8, 1024, 40, 6144, 48, 32, 0, 135),
             "39.1B": (8, 2, 4, 1536, 48, 8192, 64, 64, 0, 138), "76.1B": (8, 4, 2, 1792, 60, 10240, 80, 128, 5, 140),
             "145.6B": (8, 8, 2, 2304, 80, 12288, 96, 192, 5, 148),
             "310.1B": (8, 16, 1, 2160, 96, 16384, 128, 240, 3, 155),
             "529.6B": (8, 35, 1, 2520, 105, 20480, 128, 315, 1, 163),
             "1008.0B": (8, 64, 1, 3072, 128, 25600, 160, 384, 0, 163)}
    assert len(cases) == len(table)
    for name, (tp, pp, mbs, gbs, layers, hidden, heads, nodes, per_virtual, tflops) in table.items():
        case = cases[f"narayanan21_t1_{name}"]
        sc = case["scenario"]
        model, training, parallel = sc["model"], sc["training"], sc["parallel"]
        assert (model["layers"], model["hidden"], model["heads"], model["vocab"]) == (layers, hidden, heads, 51200)
        assert (training["micro_batch"], training["global_batch"], training["seq_len"]) == (mbs, gbs, 2048)
        assert (training["precision"], training["recompute"]) == ("fp16", "full")   # CONFIG.sh --fp16, checkpointing
        assert (parallel["tp"], parallel["pp"], sc["nodes"]) == (tp, pp, nodes)
        assert parallel["dp"] * tp * pp == nodes * 8
        assert parallel["vpp"] == (layers // pp // per_virtual if per_virtual else 1)
        # Eq. 3: F = 96 B s l h^2 (1 + s / 6h + V / 16 l h), per GPU at the measured rate
        flops = 96 * gbs * 2048 * layers * hidden**2 * (1 + 2048 / (6 * hidden) + 51200 / (16 * layers * hidden))
        assert case["target_step_time_s"] == pytest.approx(flops / (nodes * 8 * tflops * 1e12), rel=5e-4)
        assert case["measured"]["tflops_per_gpu"] == tflops
        assert case["gate"] is True and case["assumed"] == []


def test_llama3_table4_targets_follow_the_stated_tflops():
    """Llama 3 Table 4: step = 2048 x 8192 x (6N + 12 L h s) / (GPUs x TFLOP/s); not gated (mbs, vpp unstated)."""
    cases = _cases("llama3_2024")
    # Table 4 rows at 8K tokens: GPUs, TP, PP, DP, batch size per DP group, TFLOPs/GPU; Table 3 dims, vocab 128,256
    table = {8192: (8, 16, 64, 32, 430), 16384: (8, 16, 128, 16, 400)}
    layers, hidden, kv, ffn, vocab, seq = 126, 16384, 8 * 128, 53248, 128256, 8192
    n = layers * (hidden * (hidden + 2 * kv) + hidden**2 + 3 * hidden * ffn) + vocab * hidden   # matmul weights
    flops_per_token = 6 * n + 12 * layers * hidden * seq
    assert len(cases) == len(table)
    for gpus, (tp, pp, dp, per_dp, tflops) in table.items():
        case = cases[f"llama3_405b_t4_{gpus}gpu"]
        sc = case["scenario"]
        assert (sc["parallel"]["tp"], sc["parallel"]["pp"], sc["parallel"]["dp"]) == (tp, pp, dp)
        assert tp * pp * dp == gpus == sc["nodes"] * 8
        assert sc["training"]["global_batch"] == dp * per_dp == 2048
        assert case["measured"]["tflops_per_gpu"] == tflops
        step = 2048 * seq * flops_per_token / (gpus * tflops * 1e12)
        assert case["target_step_time_s"] == pytest.approx(step, rel=1e-5)
        assert case["gate"] is False
