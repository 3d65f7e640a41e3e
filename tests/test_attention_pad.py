"""A head width between two of FlashAttention's kernels runs at the wider kernel's cost (plan.layer_floor
``attention_kernel_pad``): flash-attn 0.2 to 1.0 dispatch d <= 32 / 64 / 128 to the 32, 64 and 128 kernels
(csrc/flash_attn/fmha_api.cpp ``run_fmha_fwd``, ``run_fmha_bwd`` @4a6eaa9f and v1.0.5); flash-attn 2.0 to 2.6 have
a kernel per multiple of 32 up to 256 (static_switch.h ``HEADDIM_SWITCH``, v2.0.8); FlashAttention-3 rounds up to
64, 96, 128, 192 or 256 (hopper/flash_api.cpp ``round_up_headdim`` @000090d0). Expected values are the widths'
ratios."""

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
    ("cudnn", 96, 1.0),          # no width table claimed for cuDNN or unfused attention
    ("flash3", 80, 96 / 80),     # FlashAttention-3: 64, 96, 128, 192, 256 kernels (hopper/flash_api.cpp)
    ("flash3", 96, 1.0),
    ("flash3", 160, 192 / 160),
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


def test_flash1_refuses_head_widths_above_128():
    """flash-attn 0.2 to 1.0 check head_size <= 128 (fmha_api.cpp): a head width of 256 under flash1 is refused."""
    from conftest import make_scenario

    from simtrain.spec.errors import InputError
    with pytest.raises(InputError, match="runs head widths up to 128.*this model's is 256"):
        make_scenario(hardware="dgx-a100", nodes=1, model={"layers": 2, "hidden": 2048, "heads": 8,
                                                           "ffn_hidden": 8192, "vocab": 128},
                      training={"flash_attention": "flash1"}, parallel={"dp": 8})


def test_flash3_refuses_head_widths_above_256():
    """FlashAttention-3 checks head_size <= get_max_headdim() = 256 (hopper/flash_api.cpp): 320 is refused."""
    from conftest import make_scenario

    from simtrain.spec.errors import InputError
    with pytest.raises(InputError, match="runs head widths up to 256.*this model's is 320"):
        make_scenario(hardware="dgx-h100", nodes=1, model={"layers": 2, "hidden": 2560, "heads": 8,
                                                           "ffn_hidden": 8192, "vocab": 128},
                      training={"flash_attention": "flash3"}, parallel={"dp": 8})


def test_context_parallel_pads_the_whole_attention():
    """With CP the padded width applies to every block, not only the local one: on the ideal test GPU (no launch
    overhead, attention time proportional to its FLOP at a given length) a layer's attention forward at pad p is p
    times that at pad 1, so the layer forward grows by (p - 1) x cp x the ring step's attention."""
    from dataclasses import replace

    from conftest import make_scenario

    from simtrain.plan import costs
    from simtrain.plan.context import cp_figures
    from simtrain.plan.layer_floor import step_device
    from simtrain.spec.placement import placement_of
    s = make_scenario(model={"layers": 2, "hidden": 1280, "heads": 16, "ffn_hidden": 5120, "vocab": 8},
                      training={"seq_len": 8192, "flash_attention": True}, parallel={"cp": 2}, gpus_per_node=2)
    full, local = layer_shapes(s.model, s.training, tp=1, sequence_parallel=False, cp=2, micro_batch=1)
    assert full.attn_pad == pytest.approx(96 / 80)
    dev = step_device(s.hardware, s.training, s.training.precision, s.model)
    placement = placement_of(s)

    def forward(shape_full, shape_local):
        return costs.layer_cost(shape_local, dev, "none").forward + \
            cp_figures(s, placement, shape_full, dev, 0, False).forward
    flat = replace(full, attn_pad=1.0), replace(local, attn_pad=1.0)
    step = cp_figures(s, placement, flat[0], dev, 0, False).step_attention
    assert forward(full, local) - forward(*flat) == pytest.approx((96 / 80 - 1) * 2 * step, rel=1e-9)
