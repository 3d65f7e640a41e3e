"""training.unfused_softmax: which softmax attention without a fused kernel runs (docs/model.md section 2.4), and
the warnings that say when Megatron's fused causal kernel would not run."""

from __future__ import annotations

import pytest
from conftest import make_scenario

from simtrain.plan import costs, unfused_attention
from simtrain.plan.build import build_plan


def _attention(softmax: str) -> tuple[float, float]:
    s = make_scenario(training={"flash_attention": False, "seq_len": 2048, "unfused_softmax": softmax})
    ch = build_plan(s).chunks[0]
    return ch.fwd_layer, ch.bwd_layer


def test_a_softmax_over_whole_rows_takes_longer_than_megatrons_causal_kernel():
    """full_row loads the whole score matrix, Megatron's causal kernel (s + 1) / 2s of it: both passes take longer."""
    mf, mb = _attention("megatron")
    ff, fb = _attention("full_row")
    assert ff > mf and fb > mb


def test_the_read_share_follows_the_kernel_and_the_mask():
    """(s + 1) / 2s for Megatron's causal kernel at s = 2,048: 2049 / 4096; 1 for whole rows, a window or no mask."""
    base = dict(tokens=2048, seq=2048, batch=1, hidden=512, ffn=2048, heads=8, kv_width=512, mlp_matrices=2, tp=1,
                sequence_parallel=False, flash=False)
    assert unfused_attention.unfused_softmax_read_share(costs.LayerShape(**base)) == 2049 / 4096
    assert unfused_attention.unfused_softmax_read_share(costs.LayerShape(**base, unfused_softmax="full_row")) == 1.0
    assert unfused_attention.unfused_softmax_read_share(costs.LayerShape(**base, window=128)) == 1.0
    assert unfused_attention.unfused_softmax_read_share(costs.LayerShape(**base, causal=False)) == 1.0


def test_megatrons_kernel_limits_are_warned_about():
    """Megatron-LM's fused softmax takes 16 < s <= 4,096 and micro_batch x heads / tp a multiple of 4: 8,192 tokens
    warn, and so does one micro-batch of 2 heads (2 is not a multiple of 4); 2,048 tokens with 32 heads do not."""
    long = make_scenario(training={"flash_attention": False, "seq_len": 8192})
    assert any("falls back to PyTorch's softmax" in w for w in long.warnings)
    ok = make_scenario(training={"flash_attention": False, "seq_len": 2048})
    assert not any("unfused_softmax" in w for w in ok.warnings)
    few = make_scenario(model={"layers": 2, "hidden": 256, "heads": 2, "ffn_hidden": 1024, "vocab": 1000},
                        training={"flash_attention": False, "seq_len": 2048, "micro_batch": 1})
    assert any("micro_batch x heads / tp = 2" in w for w in few.warnings)


def test_unfused_softmax_with_a_flash_kernel_is_said_to_do_nothing():
    """Set explicitly beside a fused attention kernel, the key warns that it has no effect; left unset it is silent."""
    s = make_scenario(training={"flash_attention": True, "unfused_softmax": "full_row"})
    assert any("training.unfused_softmax has no effect with flash_attention" in w for w in s.warnings)
    assert not any("unfused_softmax" in w for w in make_scenario(training={"flash_attention": True}).warnings)


def test_megatrons_pytorch_fallback_bytes_by_hand():
    """forward_torch_softmax (Megatron-LM @d98e8a6) on 16-bit scores in fp32: cast (2 + 4), masked_fill_ (4 + 4),
    softmax (4 + 4), cast back (4 + 2) = 28 bytes an element in 4 kernels; backward: the casts' gradients 6 + 6, the
    softmax's 12, the mask's 8 = 32. On fp32 scores no casts: 16 and 20 in 2 kernels."""
    assert unfused_attention.torch_softmax_bytes(2, backward=False) == (28, 4)
    assert unfused_attention.torch_softmax_bytes(2, backward=True) == (32, 4)
    assert unfused_attention.torch_softmax_bytes(4, backward=False) == (16, 2)
    assert unfused_attention.torch_softmax_bytes(4, backward=True) == (20, 2)


def test_beyond_the_kernels_limits_the_fallback_is_timed(tmp_path):
    """At 8,192 tokens (beyond 4,096) Megatron's softmax is PyTorch's: on a GPU of 1 TB/s at efficiency 1 with no
    launch cost, 16 heads, one sequence: 16 x 8,192^2 = 1.0737e9 score elements. Against a softmax over whole rows
    (fused: read e + write e forward, 2 reads + 1 write backward), the fallback adds (28 - 4) and (32 - 6) bytes an
    element: 25.77 ms forward and 27.92 ms backward, by hand. At 4,096 tokens the fused kernel runs."""
    from conftest import hardware_variant

    from simtrain.plan.layer_floor import layer_shapes, step_device

    hw = hardware_variant(tmp_path, {"gpu.memory_bandwidth": {"value": "1 TB/s", "source": "test"},
                                     "compute.kernel_overhead": {"value": "0 us", "source": "test"}})

    def shape_dev(seq, softmax="megatron"):
        s = make_scenario(hardware=hw, training={"flash_attention": False, "seq_len": seq,
                                                 "unfused_softmax": softmax, "global_batch": 1})
        _full, sh = layer_shapes(s.model, s.training, tp=1, sequence_parallel=False, cp=1, micro_batch=1)
        return sh, step_device(s.hardware, s.training, s.training.precision, s.model)

    sh, dev = shape_dev(8192)
    assert sh.unfused_softmax == "torch"
    assert shape_dev(4096)[0].unfused_softmax == "megatron"
    row, _ = shape_dev(8192, "full_row")
    elems = 16 * 8192 ** 2
    torch_f, torch_b = unfused_attention.unfused_attention_time(sh, dev)
    row_f, row_b = unfused_attention.unfused_attention_time(row, dev)
    assert torch_f - row_f == pytest.approx((28 - 4) * elems / 1e12, rel=1e-9)
    assert torch_b - row_b == pytest.approx((32 - 6) * elems / 1e12, rel=1e-9)


def test_the_fused_kernel_needs_16_bit_scores_and_8_rows_a_block_up_to_128_keys():
    """is_kernel_available requires 16-bit input: fp32 training always runs the fallback (and is warned). Up to 128
    keys each warp of the causal kernel takes two rows, 8 a block: micro_batch x heads / tp must be a multiple of 8
    (scaled_upper_triang_masked_softmax.h, batches_per_warp)."""
    from simtrain.plan.layer_floor import unfused_softmax_of
    from simtrain.spec.scenario_rules_kernels import megatron_softmax_fused

    fp32 = make_scenario(training={"flash_attention": False, "seq_len": 1024, "precision": "fp32"})
    assert unfused_softmax_of(fp32.training, 16) == "torch"
    assert any("falls back to PyTorch's softmax" in w for w in fp32.warnings)
    assert not megatron_softmax_fused(128, 4) and megatron_softmax_fused(128, 8)
    assert megatron_softmax_fused(256, 4)
