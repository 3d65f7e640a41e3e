"""NVIDIA NeMo's performance summary (simtrain/validation/nemo_performance_summary.yaml): the NeMo 24.07 DGX-H100 and
NeMo 25.02 DGX-H100/DGX-B200 FP8 pre-training rows, figures copied here by hand from the tables; settings pinned from
NeMo-Framework-Launcher 24.07 and NeMo v2.2.0."""

import math
from importlib import resources
from pathlib import Path

import pytest

from simtrain.decide import cases as case_files
from simtrain.decide import validate as v

CASES = Path(str(resources.files("simtrain.validation") / "nemo_performance_summary.yaml"))
SOURCE = "NVIDIA/NeMo docs/source/performance/performance_summary.md"

# NVIDIA/NeMo docs/source/performance/performance_summary.md @8e3d65dcfe ("24.07 perf numbers"), "Pretraining",
# Container NeMo24.07, System DGX-H100, FP8: #GPUs, GBS, MBS, sequence length, TP, PP, CP, VP, tokens/s/GPU,
# model TFLOP/s/GPU, as printed.
TABLE = {
    "nemo_2407_h100_gpt3_5b_fp8_64gpu": (64, 2048, 4, 2048, 1, 1, 1, 1, 23406, 765),
    "nemo_2407_h100_gpt3_20b_fp8_64gpu": (64, 256, 2, 2048, 2, 1, 1, 1, 5851, 750),
    "nemo_2407_h100_gpt3_175b_fp8_128gpu": (128, 256, 1, 2048, 4, 8, 1, 6, 716, 771),
    "nemo_2407_h100_llama2_7b_fp8_8gpu": (8, 128, 1, 4096, 1, 1, 1, 1, 16934, 780),
    "nemo_2407_h100_llama2_13b_fp8_16gpu": (16, 128, 1, 4096, 1, 4, 1, 10, 8715, 760),
    "nemo_2407_h100_llama2_70b_fp8_64gpu": (64, 128, 1, 4096, 4, 4, 1, 20, 1728, 768),
    "nemo_2407_h100_nemotron_8b_fp8_64gpu": (64, 256, 4, 4096, 2, 1, 1, 1, 12507, 643),
    "nemo_2407_h100_nemotron_22b_fp8_64gpu": (64, 256, 2, 4096, 2, 4, 1, 10, 4312, 562),
    "nemo_2407_h100_nemotron4_340b_fp8_128gpu": (128, 32, 1, 4096, 8, 8, 1, 12, 326, 686),
    "nemo_2407_h100_llama3_8b_fp8_8gpu": (8, 128, 1, 8192, 1, 1, 2, 1, 12273, 711),
    "nemo_2407_h100_llama3_70b_fp8_64gpu": (64, 128, 1, 8192, 4, 4, 2, 5, 1524, 734),
}
# the 25.02 edition ("at FP8 precision (using NeMo 2.0)", Container NeMo 25.02), from the stored copy of
# docs.nvidia.com/nemo-framework/user-guide/latest/performance/performance_summary.html: DGX-H100's first row and
# DGX-B200's rows but Mixtral-8x22B (its GBS and MBS cells misprinted); same columns as above
TABLE_2502 = {
    "nemo_2502_h100_gpt3_175b_fp8_512gpu": (512, 2048, 2, 2048, 4, 8, 1, 6, 866, 932),
    "nemo_2502_b200_gpt3_175b_fp8_512gpu": (512, 2048, 2, 2048, 4, 4, 1, 6, 1600, 1722),
    "nemo_2502_b200_llama3_8b_fp8_8gpu": (8, 128, 2, 8192, 1, 1, 1, 1, 26006, 1506),
    "nemo_2502_b200_llama3_70b_fp8_64gpu": (64, 128, 1, 8192, 2, 4, 2, 5, 3062, 1474),
    "nemo_2502_b200_llama31_405b_fp8_128gpu": (128, 64, 1, 8192, 4, 8, 2, 8, 625, 1658),
    "nemo_2502_b200_nemotron4_15b_fp8_64gpu": (64, 256, 2, 4096, 1, 1, 1, 1, 14760, 1387),
    "nemo_2502_b200_nemotron4_340b_fp8_128gpu": (128, 32, 1, 4096, 8, 4, 1, 12, 602, 1268),
    "nemo_2502_b200_mixtral_8x7b_fp8_64gpu": (64, 256, 2, 4096, 1, 1, 1, 1, 15457, 1282),
}
ALL = TABLE | TABLE_2502
# gated: every setting stated by the table and the release's scripts. Not gated: the Nemotron rows (squared-ReLU,
# LayerNorm1p and half-width RoPE are not simtrain features), the B200 Mixtral-8x7B row (unfused MoE permutation and
# per-layer CUDA graphs, which simtrain does not tell apart) and the B200 405B row (Megatron-Bridge's gated 25.11 row
# is the same simtrain scenario)
UNGATED = {"nemo_2407_h100_nemotron_8b_fp8_64gpu", "nemo_2407_h100_nemotron_22b_fp8_64gpu",
           "nemo_2407_h100_nemotron4_340b_fp8_128gpu", "nemo_2502_b200_nemotron4_15b_fp8_64gpu",
           "nemo_2502_b200_nemotron4_340b_fp8_128gpu", "nemo_2502_b200_mixtral_8x7b_fp8_64gpu",
           "nemo_2502_b200_llama31_405b_fp8_128gpu"}


@pytest.fixture(scope="module")
def cases():
    return {c["id"]: c for c in case_files.load_cases(CASES)[0]}


@pytest.fixture(scope="module")
def results():
    return v.validate(CASES)


def test_every_readable_pretraining_row_is_a_case_and_twelve_are_gated(cases):
    """19 cases: 24.07's 12 rows but the 512-GPU GPT3-175B (the 25.02 H100 row repeats its layout) and 25.02's 8
    readable H100/B200 rows; 12 gated, the 7 listed ungated."""
    assert set(cases) == set(ALL) and len(cases) == 19
    assert {i for i, c in cases.items() if not c["gate"]} == UNGATED
    assert sum(c["gate"] for c in cases.values()) == 12


def _layout(scenario: dict) -> dict:
    """A scenario without the FP8 amax keys: those follow the software that ran (delayed scaling in NeMo 25.02,
    current scaling in Megatron-Bridge 25.11), not the configuration."""
    training = {k: v for k, v in scenario["training"].items() if not k.startswith("fp8_amax")}
    return {**scenario, "training": training}


def test_no_gated_case_repeats_a_bundled_gated_scenario(cases):
    """A gated case's configuration is not that of a gated case in another bundled file (one configuration, one
    case): the B200 405B row, Megatron-Bridge's 25.11 configuration, is therefore ungated."""
    others = [_layout(c["scenario"]) for name, path in case_files.dev_case_files().items() if name != CASES.stem
              for c in case_files.load_cases(path)[0] if c.get("gate")]
    for case_id, case in cases.items():
        layout = _layout(case["scenario"])
        assert (layout in others) is (case_id == "nemo_2502_b200_llama31_405b_fp8_128gpu"), case_id
        assert not (case["gate"] and layout in others), case_id


def test_the_repeated_175b_layout_is_one_case(cases):
    """24.07's 512-GPU GPT3-175B row (825 tok/s, 888 TFLOP/s) is the 25.02 H100 case's other release, not a case."""
    other = cases["nemo_2502_h100_gpt3_175b_fp8_512gpu"]["other_releases"]
    assert [(o["tokens_per_s_per_gpu"], o["model_tflops_per_gpu"]) for o in other] == [(825, 888)]


def test_cases_carry_the_table_layout_and_figures(cases):
    """Each case's system, GPUs, batch, sequence, TP/PP/CP/VP and measured figures are the row's printed values."""
    for case_id, (gpus, gbs, mbs, seq, tp, pp, cp, vp, tokens, tflops) in ALL.items():
        sc = cases[case_id]["scenario"]
        tr, par = sc["training"], sc["parallel"]
        system = "dgx-b200" if "_b200_" in case_id else "dgx-h100"
        assert sc["hardware"] == system and sc["nodes"] * 8 == gpus, case_id
        assert (tr["global_batch"], tr["micro_batch"], tr["seq_len"]) == (gbs, mbs, seq), case_id
        assert (par["tp"], par["pp"], par.get("cp", 1), par["vpp"]) == (tp, pp, cp, vp), case_id
        assert par["dp"] * tp * pp * cp == gpus, case_id
        assert tr["precision"] == "fp8", case_id
        assert cases[case_id]["measured"] == {"tokens_per_s_per_gpu": tokens, "model_tflops_per_gpu": tflops}


def test_targets_are_the_published_throughput(cases):
    """target = GBS x sequence / (GPUs x tokens/s/GPU); GPT3-5B by hand: 2048 x 2048 / (64 x 23406) = 2.79997 s."""
    assert cases["nemo_2407_h100_gpt3_5b_fp8_64gpu"]["target_step_time_s"] == pytest.approx(2.79997, abs=1e-5)
    for case_id, (gpus, gbs, _mbs, seq, *_layout, tokens, _tflops) in ALL.items():
        assert cases[case_id]["target_step_time_s"] == pytest.approx(gbs * seq / (gpus * tokens), rel=1e-5)


def test_settings_pinned_from_the_launcher(cases):
    """The launcher's 24.07 settings: FlashAttention-2 (NVTE_FUSED_ATTN 0), GPT-3 dropout 0.1, Llama none, no
    recompute but Nemotron-340B's selective, bf16 gradient sync where the FP8 script sets it."""
    for case_id, case in cases.items():
        if not case_id.startswith("nemo_2407"):
            continue
        tr = case["scenario"]["training"]
        assert tr["flash_attention"] is True and tr["fp8_recipe"] == "tensorwise", case_id
        assert tr["dropout"] is ("gpt3" in case_id), case_id
        assert tr["recompute"] == ("selective" if "340b" in case_id else "none"), case_id
        assert tr["grad_dtype"] == ("fp32" if "nemotron_" in case_id else "bf16"), case_id


def test_settings_pinned_from_nemo_2_2(cases):
    """NeMo v2.2.0's scripts: cuDNN attention (NVTE_FUSED_ATTN 1), no dropout, no recompute, bf16 gradient reduce,
    fused cross entropy; the 405B's 126 layers over 64 virtual stages as 1, 2 x 62, 1."""
    for case_id, case in cases.items():
        if not case_id.startswith("nemo_2502"):
            continue
        tr = case["scenario"]["training"]
        assert tr["flash_attention"] == "cudnn" and tr["dropout"] is False and tr["recompute"] == "none", case_id
        assert tr["grad_dtype"] == "bf16" and tr["cross_entropy"] == "fused", case_id
    split = cases["nemo_2502_b200_llama31_405b_fp8_128gpu"]["scenario"]["parallel"]["layers_per_stage"]
    assert split == [1] + [2] * 62 + [1] and sum(split) == 126


def test_source_groups_as_its_own_source(cases, results):
    """Every case names the NeMo table, which no other bundled file cites, so it is one source of its own."""
    assert {v.source_name(c["source"]) for c in cases.values()} == {SOURCE}
    for name, path in case_files.dev_case_files().items():
        if name != CASES.stem:
            assert SOURCE not in {v.source_name(str(c.get("source", ""))) for c in case_files.load_cases(path)[0]}
    assert list(v.by_group([r for r in results if r.gate], lambda r: r.source_name)) == [SOURCE]


def test_every_case_predicts(results):
    """Each case, gated or not, runs to a finite predicted step time with no failure."""
    assert len(results) == len(ALL)
    for r in results:
        assert r.failure is None and r.predicted_step_time_s is not None, r.id
        assert math.isfinite(r.predicted_step_time_s) and r.predicted_step_time_s > 0, r.id
