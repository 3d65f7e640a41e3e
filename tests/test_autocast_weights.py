"""fp32 parameters under torch.autocast (``training.autocast_weights``, docs/model.md section 2.12e): every
micro-batch's forward casts each weight to 16 bits (read 4, write 2 bytes) as autocast's cache is dropped when its
context exits (pytorch torch/amp/autocast_mode.py ``autocast.__exit__``; PyTorch Lightning's
``NativeMixedPrecisionPlugin.forward_context`` opens one per forward), the backward casts the weight gradient back
(read 2, write 4), and autograd accumulates in fp32 ``.grad`` (3 x 4 bytes on m - 1 of m micro-batches).

Expected values are hand counts on ``core_ideal.yaml`` with its memory bandwidth set to 1 TB/s (efficiency 1, no
launch overhead): the default test layer (h 1,024, GELU MLP 4h, no biases, two LayerNorms) holds 12 h^2 + 4 h =
12,587,008 parameters; 8 micro-batches per step."""

from __future__ import annotations

import pytest
from conftest import hardware_variant, make_scenario

from simtrain.plan.build import build_plan
from simtrain.spec.errors import InputError

LAYER = 12 * 1024 ** 2 + 4 * 1024     # 12,587,008
BW = 1e12


@pytest.fixture
def hw(tmp_path):
    return hardware_variant(tmp_path, {"gpu.memory_bandwidth": {"value": "1 TB/s", "source": "test fixture"}})


def _chunk(hw, autocast, **training):
    s = make_scenario(hardware=hw, training={"autocast_weights": autocast, "grad_dtype": "fp32", "dropout": False,
                                             **training})
    return build_plan(s).chunks[0]


def test_forward_casts_each_weight_once_per_micro_batch(hw):
    """6 bytes per parameter: 12,587,008 x 6 / 1 TB/s = 75.52 us more per layer forward."""
    assert _chunk(hw, True).fwd_layer - _chunk(hw, False).fwd_layer == pytest.approx(LAYER * 6 / BW, rel=1e-9)


@pytest.mark.parametrize(("mode", "extra"), [
    # the gradient cast (6) plus fp32 accumulation 3 x 4 x 7/8 = 10.5, against 3 x 2 x 7/8 = 5.25 in 16 bits
    ("autograd", 6 + 10.5 - 5.25),
    ("fused", 6.0),                # no accumulation pass: the cast alone
])
def test_backward_casts_the_gradient_and_accumulates_in_fp32(hw, mode, extra):
    """The cast's backward and the add into fp32 .grad belong to the weight gradient (a split backward's W)."""
    on, off = _chunk(hw, True, grad_accumulation=mode), _chunk(hw, False, grad_accumulation=mode)
    assert on.bwd_layer - off.bwd_layer == pytest.approx(LAYER * extra / BW, rel=1e-9)
    assert on.wgrad_layer - off.wgrad_layer == pytest.approx(LAYER * extra / BW, rel=1e-9)


def test_output_layer_casts_its_weight(hw):
    """The output layer's chunk casts the edge parameters too: vocab 8 x h for the embedding and the untied output
    layer, and the final LayerNorm's 2h: 18,432 x 6 bytes = 110.6 ns."""
    assert _chunk(hw, True).head_fwd - _chunk(hw, False).head_fwd == pytest.approx(18_432 * 6 / BW, rel=1e-9)


@pytest.mark.parametrize(("training", "parallel", "says"), [
    ({"precision": "fp32"}, {}, "precision 'fp32'"),
    ({}, {"zero": 3, "dp": 2}, "zero 3"),
    ({"optimizer_kernel": "megatron"}, {}, "optimizer_kernel 'megatron'"),
])
def test_refused_where_parameters_are_not_fp32_under_autocast(hw, training, parallel, says):
    with pytest.raises(InputError, match=says):
        make_scenario(hardware=hw, training={"autocast_weights": True, **training}, parallel=parallel)
