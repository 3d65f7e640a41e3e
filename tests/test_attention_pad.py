"""A head width between two of FlashAttention's kernels runs at the wider kernel's cost (plan.layer_floor
``attention_kernel_pad``): flash-attn 0.2 to 1.0 dispatch d <= 32 / 64 / 128 to the 32, 64 and 128 kernels
(csrc/flash_attn/fmha_api.cpp ``run_fmha_fwd``, ``run_fmha_bwd`` @4a6eaa9f and v1.0.5); flash-attn 2 rounds d up
to a multiple of 32 (flash_api.cpp ``head_size_rounded``, v2.0.8). Expected values are the widths' ratios."""

from __future__ import annotations

import pytest

from simtrain.plan.layer_floor import attention_kernel_pad, layer_shapes
from simtrain.spec.model import ModelSpec
from simtrain.spec.scenario_schema import Training


@pytest.mark.parametrize(("kernel", "head_dim", "pad"), [
    ("flash1", 96, 128 / 96),    # GPT-3 760M (h 1536, 16 heads) under flash-attn 0.2.2
    ("flash1", 80, 128 / 80),
    ("flash1", 48, 64 / 48),
    ("flash1", 64, 1.0),
    ("flash1", 128, 1.0),
    ("flash1", 24, 32 / 24),
    ("flash2", 96, 1.0),         # FlashAttention-2 has a 96 kernel
    ("flash2", 80, 96 / 80),
    ("flash2", 72, 96 / 72),
    ("cudnn", 96, 1.0),          # no width table claimed for cuDNN, FlashAttention-3 or unfused attention
    ("flash3", 80, 1.0),
    ("none", 96, 1.0),
])
def test_kernel_width_over_head_width(kernel, head_dim, pad):
    assert attention_kernel_pad(kernel, head_dim) == pytest.approx(pad, rel=1e-12)


@pytest.mark.parametrize(("heads", "kernel", "pad"), [(16, "flash1", 4 / 3), (16, True, 1.0), (12, "flash1", 1.0)])
def test_layer_shape_carries_the_pad(heads, kernel, pad):
    """h 1536 with 16 heads is a head width of 96 (flash1: the 128 kernel; flash2: its own); 12 heads are 128 wide."""
    model = ModelSpec(layers=2, hidden=1536, heads=heads, ffn_hidden=6144, vocab=128)
    tr = Training(seq_len=2048, global_batch=8, flash_attention=kernel)
    full, _local = layer_shapes(model, tr, tp=1, sequence_parallel=False, cp=1, micro_batch=1)
    assert full.attn_pad == pytest.approx(pad, rel=1e-12)
