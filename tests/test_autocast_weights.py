"""fp32 parameters under torch.autocast (``training.autocast_weights``, docs/model.md section 2.12e): every
micro-batch's forward casts each weight to 16 bits (read 4, write 2 bytes) as autocast's cache is dropped when its
context exits (pytorch torch/amp/autocast_mode.py ``autocast.__exit__``; PyTorch Lightning's
``NativeMixedPrecisionPlugin.forward_context`` opens one per forward), the backward casts the weight gradient back
(read 2, write 4), and autograd accumulates in fp32 ``.grad`` (3 x 4 bytes on m - 1 of m micro-batches).

Expected values are hand counts on ``core_ideal.yaml`` with its memory bandwidth set to 1 TB/s (efficiency 1, no
launch overhead): the default test layer (h 1,024, GELU MLP 4h, no biases, two LayerNorms) holds 12 h^2 + 4 h =
12,587,008 parameters, of which the linears' 12 h^2 = 12,582,912 are cast (LayerNorm runs in fp32 under autocast);
8 micro-batches per step."""

from __future__ import annotations

import pytest
from conftest import hardware_variant, make_scenario

from simtrain.plan.build import build_plan
from simtrain.spec.errors import InputError

LAYER = 12 * 1024 ** 2 + 4 * 1024     # 12,587,008
LINEARS = 12 * 1024 ** 2              # 12,582,912
BW = 1e12


@pytest.fixture
def hw(tmp_path):
    return hardware_variant(tmp_path, {"gpu.memory_bandwidth": {"value": "1 TB/s", "source": "test fixture"}})


def _chunk(hw, autocast, **training):
    s = make_scenario(hardware=hw, training={"autocast_weights": autocast, "grad_dtype": "fp32", "dropout": False,
                                             **training})
    return build_plan(s).chunks[0]


def test_forward_casts_each_weight_once_per_micro_batch(hw):
    """6 bytes per linear weight: 12,582,912 x 6 / 1 TB/s = 75.50 us more per layer forward; a recomputed forward (full
    recompute) opens a fresh autocast context and casts again."""
    assert _chunk(hw, True).fwd_layer - _chunk(hw, False).fwd_layer == pytest.approx(LINEARS * 6 / BW, rel=1e-9)
    on, off = _chunk(hw, True, recompute="full"), _chunk(hw, False, recompute="full")
    assert on.recompute_layer - off.recompute_layer == pytest.approx(LINEARS * 6 / BW, rel=1e-9)


@pytest.mark.parametrize(("mode", "extra"), [
    # the gradient cast (6 B per linear weight) plus fp32 accumulation over every parameter, 3 x 4 x 7/8 = 10.5 B,
    # against 3 x 2 x 7/8 = 5.25 B in 16 bits
    ("autograd", LINEARS * 6 + LAYER * (10.5 - 5.25)),
    ("fused", LINEARS * 6),        # no accumulation pass: the cast alone
])
def test_backward_casts_the_gradient_and_accumulates_in_fp32(hw, mode, extra):
    """The cast's backward and the add into fp32 .grad belong to the weight gradient (a split backward's W)."""
    on, off = _chunk(hw, True, grad_accumulation=mode), _chunk(hw, False, grad_accumulation=mode)
    assert on.bwd_layer - off.bwd_layer == pytest.approx(extra / BW, rel=1e-9)
    assert on.wgrad_layer - off.wgrad_layer == pytest.approx(extra / BW, rel=1e-9)


def test_output_layer_casts_its_weight(hw):
    """The output layer casts its vocab 8 x h = 8,192 weights each way (6 bytes: 49.2 ns); the embedding lookup and
    the final LayerNorm are not autocast ops."""
    on, off = _chunk(hw, True), _chunk(hw, False)
    assert on.head_fwd - off.head_fwd == pytest.approx(8_192 * 6 / BW, rel=1e-9)
    assert on.head_bwd - off.head_bwd == pytest.approx(8_192 * 6 / BW, rel=1e-9)
    assert on.embed_fwd == off.embed_fwd


def test_ledger_and_gather_hold_fp32_parameters(hw):
    """ZeRO-1 over 8: fp32 parameters (4) with the 16-bit copies the linears save (2), fp32 gradients (4), Adam's
    moments sharded (8 / 8): 11 bytes per parameter against BF16 mixed precision's 2 + 4 + 12 / 8 = 7.5; the
    parameters gathered after the step are fp32 (4 bytes; ZeroRedundancyOptimizer broadcasts them)."""
    from simtrain.plan.memory import stage_memory

    def per_param(autocast):
        s = make_scenario(hardware=hw, training={"autocast_weights": autocast, "grad_dtype": "fp32"},
                          parallel={"dp": 8, "zero": 1})
        mem = stage_memory(s, 0)
        return (mem.params + mem.grads + mem.optimizer) / mem.params_local, build_plan(s).param_bytes
    assert per_param(True) == (pytest.approx(11.0, rel=1e-12), 4.0)
    assert per_param(False) == (pytest.approx(7.5, rel=1e-12), 2.0)


@pytest.mark.parametrize(("training", "parallel", "says"), [
    ({"precision": "fp32"}, {}, "precision 'fp32'"),
    ({}, {"zero": 3, "dp": 2}, "zero 3"),
    ({"optimizer_kernel": "megatron"}, {}, "optimizer_kernel 'megatron'"),
    ({"grad_dtype": "bf16"}, {}, "grad_dtype 'bf16'"),
])
def test_refused_where_parameters_are_not_fp32_under_autocast(hw, training, parallel, says):
    with pytest.raises(InputError, match=says):
        make_scenario(hardware=hw, training={"autocast_weights": True, **training}, parallel=parallel)
