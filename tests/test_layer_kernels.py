"""training.layer_kernels: nanotron's Llama decoder layer, its element-wise kernels and layout copies counted from
nanotron's code (huggingface/nanotron src/nanotron/models/llama.py @67c5ebb6) and timed at the HBM rate."""

from __future__ import annotations

import pytest
from conftest import gpt_model, hardware_variant, make_scenario

from simtrain.plan.build import build_plan

B = 1e12   # the test GPU's HBM: 1 TB/s, streaming efficiency 1, no launch gap (tests/data/core_ideal.yaml)
E = 2      # bf16 activations
ONE_SEQ = {"seq_len": 2048, "global_batch": 1, "micro_batch": 1, "dropout": False}   # Llama layers have no dropout
TWO_SEQ = {"seq_len": 1024, "global_batch": 2, "micro_batch": 2, "dropout": False}


def _llama(**extra):
    return gpt_model(layers=2, hidden=1024, heads=16, mlp="swiglu", ffn_hidden=2816, **extra)


def _pair(tmp_path, model, train, parallel=None, impl="nanotron"):
    """The first chunk's plan with the fused count and with ``impl``'s layer kernels, HBM at 1 TB/s."""
    hw = hardware_variant(tmp_path, {"gpu.memory_bandwidth": "1 TB/s"}, name="hbm1")
    base = dict(hardware=hw, model=model, parallel=parallel or {"dp": 1})
    fused = build_plan(make_scenario(**base, training=train)).chunks[0]
    other = build_plan(make_scenario(**base, training={**train, "layer_kernels": impl})).chunks[0]
    return fused, other


def test_nanotron_mha_layer_moves_its_copies_and_eager_swiglu(tmp_path):
    """Multi-head, one sequence per micro-batch, h = 1024, F = 2816, T = 2048 tokens. Forward, per token, in bf16
    elements read + written: the QKV permute copy 2 x 3h, the key/value cat 2 x 2h and its permute copy 2 x 2h, the
    in-place rotary over q and k 2 x 2h, and the eager SwiGLU's silu + product (5F) beyond the fused 3F: 2F.
    Backward: the SwiGLU's autograd kernels (13F) beyond the fused 6F: 7F; the rotary's conjugate rotation 2 x 2h;
    the key/value split's cat 2 x 2h; unbind's stack and the reshape of its permuted view, 2 x 3h each."""
    h, f, t = 1024, 2816, 2048
    fused, nano = _pair(tmp_path, _llama(), ONE_SEQ)
    fwd = 2 * 3 * h + 2 * 2 * h + 2 * 2 * h + 2 * 2 * h + 2 * f
    bwd = 7 * f + 2 * 2 * h + 2 * 2 * h + 2 * (2 * 3 * h)
    assert nano.fwd_layer - fused.fwd_layer == pytest.approx(fwd * E * t / B, rel=1e-9)
    assert nano.bwd_layer - fused.bwd_layer == pytest.approx(bwd * E * t / B, rel=1e-9)


def test_nanotron_gqa_and_several_sequences(tmp_path):
    """Grouped-query (16 query heads, 4 key/value heads of 64: q = 1024, k = 256), two sequences of 1024 per
    micro-batch. Forward: three transpose copies 2 (q + 2k), cat and permute 2 x 2k each, rotary 2 (q + k), SwiGLU 2F,
    and the output projection's copy of the transposed attention output 2q. Backward: SwiGLU 7F, rotary 2 (q + k),
    the split's cat 2 x 2k, the QKV split's cat 2 (q + 2k) once, and the output projection's contiguous() of its
    saved input and the reshape of the input gradient, 2q each."""
    q, k, f, t = 1024, 256, 2816, 2048
    fused, nano = _pair(tmp_path, _llama(kv_heads=4), TWO_SEQ)
    fwd = 2 * (q + 2 * k) + 2 * 2 * k + 2 * 2 * k + 2 * (q + k) + 2 * f + 2 * q
    bwd = 7 * f + 2 * (q + k) + 2 * 2 * k + 2 * (q + 2 * k) + 2 * 2 * q
    assert nano.fwd_layer - fused.fwd_layer == pytest.approx(fwd * E * t / B, rel=1e-9)
    assert nano.bwd_layer - fused.bwd_layer == pytest.approx(bwd * E * t / B, rel=1e-9)


def test_nanotron_widths_are_the_tp_ranks_share(tmp_path):
    """With tp 2 each rank copies its own heads and MLP columns over all the micro-batch's tokens: the extra time per
    layer is half the tp 1 figure (widths / 2, same tokens)."""
    train = ONE_SEQ
    f1, n1 = _pair(tmp_path, _llama(), train)
    f2, n2 = _pair(tmp_path, _llama(), train, parallel={"tp": 2, "sequence_parallel": True})
    assert n2.fwd_layer - f2.fwd_layer == pytest.approx((n1.fwd_layer - f1.fwd_layer) / 2, rel=1e-9)
    assert n2.bwd_layer - f2.bwd_layer == pytest.approx((n1.bwd_layer - f1.bwd_layer) / 2, rel=1e-9)


def test_full_recompute_repeats_the_nanotron_forward(tmp_path):
    """Full recompute runs the forward again before the backward, its copies included: the recompute grows by the
    forward's extra."""
    train = {**ONE_SEQ, "recompute": "full"}
    fused, nano = _pair(tmp_path, _llama(), train)
    assert nano.recompute_layer - fused.recompute_layer == pytest.approx(nano.fwd_layer - fused.fwd_layer, rel=1e-9)


def test_torchtitan_eager_block_norms_rotary_repeat_kv_and_swiglu(tmp_path):
    """torchtitan's eager Llama 3 block (@9dec370), bf16, h = 1024, 16 query heads and 4 key/value heads of 64 (q =
    1024, k = 256), F = 2816, T = 2048 tokens. Forward bytes per token beyond the fused count: two eager RMSNorms,
    each cast 2 + 4, pow 4 + 4, mean 4, x * rsqrt 4 + 4, cast back 4 + 2, * weight 2 + 2 = 36 against the fused 4;
    rotary on q and k, cast 2 + 4, complex product 4 + 4, cast back 4 + 2 = 20 per element; repeat_kv copies keys and
    values to the query width, each reading 2 bytes per k element and writing 2 per q element; SwiGLU 10 against 6
    per F element. Backward: each norm 92 against 6 (weight product 2 + 2 and 2 + 2 + 2 + sum 2, cast 2 + 4, row product
    4 + 4 and 4 + 4 + 4 + sum 4, mean 4, pow copy 4 + 4, scale 4 + 4, product 4 + 4 + 4, gradient sum 4 + 4 + 4, cast
    4 + 2); rotary 20 per element; repeat_kv's sum over repeats, read 2 per q element and write 2 per k element, for
    keys and values; SwiGLU 18 against 12 per F element; autograd's five input-gradient sums (the separate wq/wk/wv
    and w1/w3 projections, the two residual branches), 2 + 2 + 2 per h element each, against the fused 24."""
    h, q, k, f, t = 1024, 1024, 256, 2816, 2048
    fused, titan = _pair(tmp_path, _llama(kv_heads=4), ONE_SEQ, impl="torchtitan")
    norm_f = (2 + 4) + (4 + 4) + 4 + (4 + 4) + (4 + 2) + (2 + 2)
    norm_b = (2 + 2) + (2 + 2 + 2) + 2 + (2 + 4) + (4 + 4) + (4 + 4 + 4) + 4 + 4 + (4 + 4) + (4 + 4) + (4 + 4 + 4) \
        + (4 + 4 + 4) + (4 + 2)
    assert (norm_f, norm_b) == (36, 92)
    rope = (2 + 4) + (4 + 4) + (4 + 2)
    fwd = 2 * (norm_f - 4) * h + rope * (q + k) + 2 * (2 * k + 2 * q) + (10 - 6) * f
    # five adds (wq/wk/wv: 2, w1/w3: 1, the two residual branches), read 2 + 2 and write 2 bytes per h element each,
    # against the fused count's residual backward: twice its forward's two adds, 2 x 2 x (2 + 2 + 2)
    grad_sums = 5 * (2 + 2 + 2) - 2 * 2 * (2 + 2 + 2)
    bwd = 2 * (norm_b - 6) * h + rope * (q + k) + 2 * (2 * q + 2 * k) + (18 - 12) * f + grad_sums * h
    assert titan.fwd_layer - fused.fwd_layer == pytest.approx(fwd * t / B, rel=1e-9)
    assert titan.bwd_layer - fused.bwd_layer == pytest.approx(bwd * t / B, rel=1e-9)


def test_torchtitan_multi_head_has_no_repeat_kv(tmp_path):
    """With as many key/value heads as query heads repeat_kv returns its input: the forward's extra is the norms, the
    rotary over q and k (h each) and the SwiGLU only."""
    h, f, t = 1024, 2816, 2048
    fused, titan = _pair(tmp_path, _llama(), ONE_SEQ, impl="torchtitan")
    assert titan.fwd_layer - fused.fwd_layer == pytest.approx((2 * 32 * h + 20 * 2 * h + 4 * f) * t / B, rel=1e-9)


def test_torchtitan_is_refused_with_tensor_parallelism(tmp_path):
    """torchtitan's TP shards its norms over the sequence, which the count does not describe: tp 2 is refused."""
    from simtrain.spec.errors import InputError

    with pytest.raises(InputError, match="layer_kernels: 'torchtitan'"):
        _pair(tmp_path, _llama(), ONE_SEQ, parallel={"tp": 2, "sequence_parallel": True}, impl="torchtitan")


@pytest.mark.parametrize("impl", ["nanotron", "torchtitan"])
@pytest.mark.parametrize("model_change, train_change, says", [
    ({"bias": True}, {}, "bias: true"),
    ({"qkv_bias": True}, {}, "qkv_bias: true"),
    ({"attention_bias": True}, {}, "attention_bias: true"),
    ({"mlp_bias": True}, {}, "mlp_bias: true"),
    ({"position_embeddings": 2048}, {}, "position_embeddings: 2048"),
    ({"norm": "layernorm"}, {}, "norm: layernorm"),
    ({"head_dim": 128}, {}, "head_dim: 128"),
    ({}, {"dropout": True}, "dropout: true"),
])
def test_layer_kernels_refuse_layers_the_framework_does_not_build(tmp_path, impl, model_change, train_change, says):
    """Both frameworks' Llama layers have RMSNorms, no biases (not even Qwen2's on q, k and v), rotary positions,
    heads of hidden / heads and no dropout: a scenario that says otherwise is refused, naming the key."""
    from simtrain.spec.errors import InputError

    with pytest.raises(InputError, match=f"layer_kernels: '{impl}'.*{says}"):
        _pair(tmp_path, _llama(**model_change), {**ONE_SEQ, **train_change}, impl=impl)


@pytest.mark.parametrize("train_change, says", [
    ({"precision": "fp32"}, "precision: fp32"),
    ({"flash_attention": False}, "flash_attention: False"),
])
def test_torchtitan_refuses_fp32_and_kernels_sdpa_cannot_run(tmp_path, train_change, says):
    """torchtitan's count casts bf16 activations to fp32 and back (no-ops on fp32 ones), and its SDPA runs
    FlashAttention-2 or cuDNN: fp32 and unfused attention are refused (as are flash1 and flash3, which the test
    GPU does not list)."""
    from simtrain.spec.errors import InputError

    with pytest.raises(InputError, match=f"layer_kernels: 'torchtitan'.*{says}"):
        _pair(tmp_path, _llama(), {**ONE_SEQ, **train_change}, impl="torchtitan")
