"""training.layer_kernels: nanotron's Llama decoder layer, its element-wise kernels and layout copies counted from
nanotron's code (huggingface/nanotron src/nanotron/models/llama.py @67c5ebb6) and timed at the HBM rate."""

from __future__ import annotations

import pytest
from conftest import gpt_model, hardware_variant, make_scenario

from simtrain.plan.build import build_plan

B = 1e12   # the test GPU's HBM: 1 TB/s, streaming efficiency 1, no launch gap (tests/data/core_ideal.yaml)
E = 2      # bf16 activations


def _llama(**extra):
    return gpt_model(layers=2, hidden=1024, heads=16, mlp="swiglu", ffn_hidden=2816, **extra)


def _pair(tmp_path, model, train, parallel=None):
    hw = hardware_variant(tmp_path, {"gpu.memory_bandwidth": "1 TB/s"}, name="hbm1")
    base = dict(hardware=hw, model=model, parallel=parallel or {"dp": 1})
    fused = build_plan(make_scenario(**base, training=train)).chunks[0]
    nano = build_plan(make_scenario(**base, training={**train, "layer_kernels": "nanotron"})).chunks[0]
    return fused, nano


def test_nanotron_mha_layer_moves_its_copies_and_eager_swiglu(tmp_path):
    """Multi-head, one sequence per micro-batch, h = 1024, F = 2816, T = 2048 tokens. Forward, per token, in bf16
    elements read + written: the QKV permute copy 2 x 3h, the key/value cat 2 x 2h and its permute copy 2 x 2h, the
    in-place rotary over q and k 2 x 2h, and the eager SwiGLU's silu + product (5F) beyond the fused 3F: 2F.
    Backward: the SwiGLU's autograd kernels (13F) beyond the fused 6F: 7F; the rotary's conjugate rotation 2 x 2h;
    the key/value split's cat 2 x 2h; unbind's stack and the reshape of its permuted view, 2 x 3h each."""
    h, f, t = 1024, 2816, 2048
    fused, nano = _pair(tmp_path, _llama(), {"seq_len": 2048, "global_batch": 1, "micro_batch": 1})
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
    fused, nano = _pair(tmp_path, _llama(kv_heads=4), {"seq_len": 1024, "global_batch": 2, "micro_batch": 2})
    fwd = 2 * (q + 2 * k) + 2 * 2 * k + 2 * 2 * k + 2 * (q + k) + 2 * f + 2 * q
    bwd = 7 * f + 2 * (q + k) + 2 * 2 * k + 2 * (q + 2 * k) + 2 * 2 * q
    assert nano.fwd_layer - fused.fwd_layer == pytest.approx(fwd * E * t / B, rel=1e-9)
    assert nano.bwd_layer - fused.bwd_layer == pytest.approx(bwd * E * t / B, rel=1e-9)


def test_nanotron_widths_are_the_tp_ranks_share(tmp_path):
    """With tp 2 each rank copies its own heads and MLP columns over all the micro-batch's tokens: the extra time per
    layer is half the tp 1 figure (widths / 2, same tokens)."""
    train = {"seq_len": 2048, "global_batch": 1, "micro_batch": 1}
    f1, n1 = _pair(tmp_path, _llama(), train)
    f2, n2 = _pair(tmp_path, _llama(), train, parallel={"tp": 2, "sequence_parallel": True})
    assert n2.fwd_layer - f2.fwd_layer == pytest.approx((n1.fwd_layer - f1.fwd_layer) / 2, rel=1e-9)
    assert n2.bwd_layer - f2.bwd_layer == pytest.approx((n1.bwd_layer - f1.bwd_layer) / 2, rel=1e-9)


def test_full_recompute_repeats_the_nanotron_forward(tmp_path):
    """Full recompute runs the forward again before the backward, its copies included: the recompute grows by the
    forward's extra."""
    train = {"seq_len": 2048, "global_batch": 1, "micro_batch": 1, "recompute": "full"}
    fused, nano = _pair(tmp_path, _llama(), train)
    assert nano.recompute_layer - fused.recompute_layer == pytest.approx(nano.fwd_layer - fused.fwd_layer, rel=1e-9)
