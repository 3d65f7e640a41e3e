"""Recomputing the dense MLP under FP8 (training.recompute_modules: [mlp] with precision: fp8): Megatron-Core runs it
through Transformer Engine's te_checkpoint, which keeps the residual (the fused norm's input) and drops fc1's FP8
input copy, the fc1 outputs and FC2's FP8 input copy; the backward re-runs the norm, both FP8 casts and both GEMMs.

Llama 3 8B on one DGX H100 (dp 8): h 4096, SwiGLU ffn 14336, sequence 2048, one micro-batch in flight per layer
(stage 0 of one stage, micro-batch 1). Every byte count is written out here by hand.
"""

from __future__ import annotations

import pytest

from simtrain.plan import device
from simtrain.plan.build import build_plan
from simtrain.plan.memory import stage_memory
from simtrain.spec.errors import InputError
from simtrain.spec.scenario import scenario_from_dict

H, FFN, LAYERS, SEQ = 4096, 14336, 32, 2048


def _scenario(recipe: str = "tensorwise", modules=None, precision: str = "fp8"):
    training = {"seq_len": SEQ, "global_batch": 8, "micro_batch": 1, "precision": precision, "dropout": False,
                "recompute": "selective", "recompute_modules": modules or ["core_attn"]}
    if precision == "fp8":
        training["fp8_recipe"] = recipe
    raw = {"hardware": "dgx-h100", "model": "llama3-8b", "training": training, "parallel": {"dp": 8, "zero": 1}}
    return scenario_from_dict(raw)


@pytest.mark.parametrize(("recipe", "copy"), [("tensorwise", 1.0), ("blockwise", 1 + 4 / 128)])
def test_fp8_mlp_recompute_drops_the_mlp_but_its_input(recipe, copy):
    """Per layer the MLP stops keeping fc1's FP8 input (copy x s h), the gate and up outputs (2 x 2 s f) and FC2's
    FP8 input (copy x s f)."""
    kept = stage_memory(_scenario(recipe), 0).activations
    dropped = stage_memory(_scenario(recipe, ["core_attn", "mlp"]), 0).activations
    per_layer = copy * SEQ * H + 2 * 2 * SEQ * FFN + copy * SEQ * FFN
    assert kept - dropped == pytest.approx(LAYERS * per_layer, rel=1e-12)


def test_fp8_mlp_recompute_reruns_norm_casts_and_gemms():
    """The recomputed forward of one layer: the fused norm (read and write s h), the two FP8 casts of the GEMM
    inputs (s h and s f elements) and the MLP's GEMMs with the SwiGLU pass, as the device prices each."""
    sc = _scenario("tensorwise", ["core_attn", "mlp"])
    plain = build_plan(_scenario("tensorwise")).chunks[0]
    plan = build_plan(sc).chunks[0]
    hw = sc.hardware
    dev = device.Device(gpu=hw.gpu, compute=hw.compute, dtype="fp8", fp8_recipe="tensorwise",
                        attention_speed=hw.compute.attention_speed(sc.training.attention_kernel))
    gemms = [(SEQ, 2 * FFN, H), (SEQ, H, FFN)]            # fc1 (gate and up), fc2
    by_hand = sum(dev.linear_gemm_time(m, n, k) for m, n, k in gemms)
    by_hand += dev.memory_time(3 * SEQ * FFN * 2, kernels=1)                       # SwiGLU: gate, up in, act out
    by_hand += dev.norm_time(2 * SEQ * H * 2, backward=False, kernels=1)           # the norm fused into fc1
    by_hand += dev.fp8_cast_time(SEQ * H + SEQ * FFN, 2)
    assert plan.recompute_layer - plain.recompute_layer == pytest.approx(by_hand, rel=1e-9)


def test_bf16_mlp_recompute_unchanged_by_fp8_terms():
    """Under BF16 the mlp module keeps Korthikanti's count: the SwiGLU internals, 6 s f bytes per layer."""
    kept = stage_memory(_scenario(modules=["core_attn"], precision="bf16"), 0).activations
    dropped = stage_memory(_scenario(modules=["core_attn", "mlp"], precision="bf16"), 0).activations
    assert kept - dropped == pytest.approx(LAYERS * 6 * SEQ * FFN, rel=1e-12)


def test_layernorm_under_fp8_is_still_refused():
    """layernorm recompute under FP8 (TE's saved-original-input path) is not simulated: refused at its key."""
    with pytest.raises(InputError, match=r"training.recompute_modules.*'layernorm' is not simulated yet with fp8"):
        _scenario("tensorwise", ["layernorm"])
