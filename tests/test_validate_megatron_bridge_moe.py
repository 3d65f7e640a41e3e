"""The MoE Megatron-Bridge cases (simtrain/validation/megatron_bridge_moe.yaml): NVIDIA's published Qwen3, DeepSeek-V3
and GPT-OSS throughput on DGX-H100 and DGX-B200, copied from the shared dev file
(../shared/validation/modern_dev_cases.yaml) where every key has a simtrain equivalent."""

from importlib import resources
from pathlib import Path

import pytest

from simtrain.decide import cases as case_files
from simtrain.decide import validate as v

CASES = Path(str(resources.files("simtrain.validation") / "megatron_bridge_moe.yaml"))
# the expressible MoE rows of the shared file, by hand: the ones that set no tp_comm_overlap (the file's
# header lists the others and the key each lacks); ep_overlap rows since 2026-12-01, the deepep row since DeepEP is
# simulated, the DeepSeek-V3 rows with recompute_modules mlp under FP8 since it is simulated, the three gated GPT-OSS
# BF16 rows (recompute_modules [layernorm, moe_act]) since the third session of 2026-12-01, the three hybridep rows
# since the dispatcher is simulated (fourth session)
HYBRIDEP = {"mbridge_2606_h100_qwen3_30b_a3b_fp8cs_16gpu", "mbridge_260401_b200_qwen3_30b_a3b_mxfp8_8gpu",
            "mbridge_2604_b200_deepseek_v3_mxfp8_256gpu"}
EXPRESSIBLE = HYBRIDEP | {
    "mbridge_2509_h100_qwen3_30b_a3b_fp8cs_16gpu", "mbridge_2509_b200_qwen3_30b_a3b_fp8cs_8gpu",
    "mbridge_2602_b200_qwen3_30b_a3b_mxfp8_8gpu",
    "mbridge_2509_b200_qwen3_235b_a22b_fp8cs_64gpu", "mbridge_2509_b200_qwen3_235b_a22b_mxfp8_64gpu",
    "mbridge_260401_b200_qwen3_235b_a22b_mxfp8_256gpu", "mbridge_2509_b200_deepseek_v3_fp8cs_256gpu",
    "mbridge_2509_b200_deepseek_v3_mxfp8_256gpu", "mbridge_2511_h100_gpt_oss_120b_bf16_64gpu",
    "mbridge_2511_b200_gpt_oss_120b_bf16_64gpu",
    "mbridge_2511_h100_qwen3_30b_a3b_fp8cs_16gpu", "mbridge_2511_h100_qwen3_235b_a22b_fp8cs_256gpu",
    "mbridge_260401_h100_qwen3_235b_a22b_fp8cs_256gpu", "mbridge_2511_b200_qwen3_235b_a22b_mxfp8_64gpu",
    "mbridge_2602_h100_qwen3_30b_a3b_fp8cs_16gpu", "mbridge_2509_h100_deepseek_v3_fp8cs_1024gpu",
    "mbridge_2511_b200_deepseek_v3_mxfp8_256gpu", "mbridge_260401_b200_deepseek_v3_mxfp8_256gpu",
    "mbridge_260401_h100_gpt_oss_120b_bf16_64gpu", "mbridge_2602_b200_gpt_oss_120b_bf16_64gpu",
    "mbridge_260401_b200_gpt_oss_120b_bf16_64gpu"}
DEEPSEEK_GATED = {"mbridge_2509_h100_deepseek_v3_fp8cs_1024gpu", "mbridge_2511_b200_deepseek_v3_mxfp8_256gpu",
                  "mbridge_260401_b200_deepseek_v3_mxfp8_256gpu"}
GATED = DEEPSEEK_GATED | HYBRIDEP | {
    "mbridge_2509_h100_qwen3_30b_a3b_fp8cs_16gpu", "mbridge_2602_b200_qwen3_30b_a3b_mxfp8_8gpu",
    "mbridge_260401_b200_qwen3_235b_a22b_mxfp8_256gpu", "mbridge_2511_h100_qwen3_235b_a22b_fp8cs_256gpu",
    "mbridge_260401_h100_qwen3_235b_a22b_fp8cs_256gpu", "mbridge_2602_h100_qwen3_30b_a3b_fp8cs_16gpu",
    "mbridge_260401_h100_gpt_oss_120b_bf16_64gpu", "mbridge_2602_b200_gpt_oss_120b_bf16_64gpu",
    "mbridge_260401_b200_gpt_oss_120b_bf16_64gpu"}


@pytest.fixture(scope="module")
def results():
    return v.validate(CASES)


def test_the_expressible_moe_rows_are_bundled():
    """Every MoE row simtrain can express is a case, with its gate as the shared file has it, and nothing else."""
    cases = case_files.load_cases(CASES)[0]
    assert {c["id"] for c in cases} == EXPRESSIBLE
    assert {c["id"] for c in cases if c["gate"]} == GATED


def test_no_rack_scale_rows():
    """Only DGX-H100 and DGX-B200 rows: the GB200/GB300 rows are reserved for an independent check."""
    assert {c["scenario"]["hardware"] for c in case_files.load_cases(CASES)[0]} == {"dgx-h100", "dgx-b200"}


def test_targets_are_the_published_throughput():
    """Each target is global_batch x seq_len / (GPUs x measured tokens/s/GPU), as the source states it."""
    for case in case_files.load_cases(CASES)[0]:
        sc = case["scenario"]
        gpus = sc["nodes"] * 8
        implied = sc["training"]["global_batch"] * sc["training"]["seq_len"] / (
            gpus * case["measured"]["tokens_per_s_per_gpu"])
        assert case["target_step_time_s"] == pytest.approx(implied, rel=2e-3)


# Today's state (not the target, mean <= 10% and worst <= 20%): every case predicts too fast; gated mean
# |error| 46.5%, worst -69.4% (Qwen3-30B-A3B MXFP8 dropless on 8 B200, measured at half the 25.09 token-drop row's
# speed on the same GPUs). It was 32.1% / -63.6% while the expert GEMMs ran at the BF16 rate under fp8 (a defect:
# Transformer Engine's GroupedLinear runs them in FP8), over four gated rows: the Qwen3-235B H100 row (-21.0%) left
# when tp_comm_overlap with a mixture of experts became a refusal (its cost was a dense layer's). The FP8 quantize
# kernels of the expert inputs are not costed yet. With parallel.ep_overlap simulated (2026-12-01) the two gated
# Qwen3-235B H100 rows that use it joined: -28.5% and -25.2% (all-to-alls hidden under compute slowed 1.19x), so the
# gated mean is 38.7% over 5. With DeepEP simulated the gated Qwen3-30B-A3B H100 deepep row joined at -68.5% (16.16 s
# for 51.27 s; its EP time is small, the miss is elsewhere; the shared file notes that the 26.02.01 re-run of the same
# table row measured 9058 tok/s/GPU, a 28.94 s step, -44% from this prediction): gated mean 43.6% over 6. With the
# dense MLP's recompute under FP8 and group-limited routing simulated, three gated DeepSeek-V3 rows joined: H100 EP 64
# deepep -19.8%, B200 alltoall -36.3%, B200 EP 32 deepep -5.7% (without group-limited routing -13.9% and +5.0%):
# gated mean 36.0% over 9. The three gated GPT-OSS-120B BF16 rows (bundled as they are, nothing changed for them)
# joined at -42.0% (H100), -23.3% and -37.0% (B200): gated mean 35.5% over 12. Fourth session: the FP8 casts and
# per-expert padding copies and GPT-OSS's expert bias costed (31.8%), the three hybridep rows bundled (-21.6%, -10.1%,
# -18.8%), a MoE layer's TP collectives as Megatron runs them and the EP-overlap pairs as flows (Qwen3-235B H100
# -9.4% and -3.2%): gated mean 25.8% over 15, worst -64.5% (Qwen3-30B-A3B MXFP8 on 8 B200). Guards are today's
# figures rounded up.
def test_gated_error_does_not_regress(results):
    """The gated MoE cases' mean |error| stays at or below 26% and the worst at or below 65%."""
    gated = [r for r in results if r.gate]
    assert len(gated) == 15
    s = v.summarize(gated)
    assert s.mean_abs_error <= 0.26
    assert s.worst_abs_error <= 0.65
