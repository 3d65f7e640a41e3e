"""training.grad_accumulation: how micro-batches' gradients join the gradient buffer, counted from the frameworks'
code (nanotron's FP32GradientAccumulator; PyTorch autograd's AccumulateGrad) and timed at the HBM rate."""

from __future__ import annotations

import pytest
from conftest import gpt_model, hardware_variant, make_scenario

from simtrain.plan.build import build_plan
from simtrain.plan.memory import edge_params, layer_params_per_rank

B = 1e12   # the test GPU's HBM: 1 TB/s, streaming efficiency 1, no launch gap (tests/data/core_ideal.yaml)


def test_unfused_gradient_accumulation_adds_each_micro_batch(tmp_path):
    """training.grad_accumulation unfused (nanotron's FP32GradientAccumulator: fp32_grad.add_(half_param.grad) after
    each micro-batch's backward): read 2 + read 4 + write 4 = 10 B per parameter with bf16 weights and fp32
    gradients, on the backward of every layer and of the embedding/output unit; the forward is unchanged. DDP (ZeRO-0)
    over 2 ranks, HBM at 1 TB/s."""
    hw = hardware_variant(tmp_path, {"gpu.memory_bandwidth": "1 TB/s"}, name="hbm1")
    base = dict(hardware=hw, model=gpt_model(layers=2), parallel={"dp": 2})
    train = {"seq_len": 512, "global_batch": 16, "micro_batch": 2, "grad_dtype": "fp32"}
    fused = make_scenario(**base, training=train)
    unfused = make_scenario(**base, training={**train, "grad_accumulation": "unfused"})
    n, n_e = layer_params_per_rank(fused.model, 1), edge_params(fused.model, 1, 1, first=True, last=True)
    a, b = build_plan(fused).chunks[0], build_plan(unfused).chunks[0]
    assert b.fwd_layer == a.fwd_layer
    assert b.bwd_layer - a.bwd_layer == pytest.approx(10 * n / B, rel=1e-9)
    assert b.embed_bwd - a.embed_bwd == pytest.approx(10 * n_e / B, rel=1e-9)



def test_autograd_accumulation_adds_from_the_second_micro_batch(tmp_path):
    """training.grad_accumulation autograd (PyTorch's AccumulateGrad: the first micro-batch's gradient is stolen,
    each later one added in place into .grad): read 2 + read 2 + write 2 = 6 B per parameter with fp16 weights on
    m - 1 of m micro-batches, averaged over the step: m = 4 gives 4.5 n / B on each layer's backward; one micro-batch
    adds nothing."""
    hw = hardware_variant(tmp_path, {"gpu.memory_bandwidth": "1 TB/s"}, name="hbm1")
    base = dict(hardware=hw, model=gpt_model(layers=2), parallel={"dp": 2})
    train = {"seq_len": 512, "global_batch": 16, "micro_batch": 2, "precision": "fp16"}
    fused = make_scenario(**base, training=train)
    auto = make_scenario(**base, training={**train, "grad_accumulation": "autograd"})
    n = layer_params_per_rank(fused.model, 1)
    assert fused.microbatches == 4
    a, b = build_plan(fused).chunks[0], build_plan(auto).chunks[0]
    assert b.bwd_layer - a.bwd_layer == pytest.approx(6 * n * 3 / 4 / B, rel=1e-9)
    one = {**train, "global_batch": 4}
    assert build_plan(make_scenario(**base, training={**one, "grad_accumulation": "autograd"})).chunks[0].bwd_layer \
        == build_plan(make_scenario(**base, training=one)).chunks[0].bwd_layer


def test_a_split_backward_runs_the_accumulation_in_w(tmp_path):
    """The add needs the weight gradient, so a split backward (zb-h1) runs it in W: the weight-gradient part of the
    layer's backward grows by the same 10 n / B as the whole backward, and B (backward - W) not at all."""
    hw = hardware_variant(tmp_path, {"gpu.memory_bandwidth": "1 TB/s"}, name="hbm1")
    base = dict(hardware=hw, model=gpt_model(layers=4), parallel={"pp": 2, "schedule": "zb-h1"})
    train = {"seq_len": 512, "global_batch": 8, "micro_batch": 1, "grad_dtype": "fp32"}
    fused = make_scenario(**base, training=train)
    unfused = make_scenario(**base, training={**train, "grad_accumulation": "unfused"})
    n = layer_params_per_rank(fused.model, 1)
    a, b = build_plan(fused).chunks[0], build_plan(unfused).chunks[0]
    assert b.wgrad_layer - a.wgrad_layer == pytest.approx(10 * n / B, rel=1e-9)
    assert (b.bwd_layer - b.wgrad_layer) == pytest.approx(a.bwd_layer - a.wgrad_layer, rel=1e-12)


def test_sharded_gradients_refuse_a_separate_accumulation(tmp_path):
    """ZeRO-2/3 reduce-scatter every micro-batch and accumulate only their shard: a non-fused mode is refused there,
    naming the field and what is allowed."""
    from simtrain.spec.errors import InputError

    with pytest.raises(InputError, match=r"training\.grad_accumulation: 'unfused' is not simulated with zero 2.*"
                                         r"allowed"):
        make_scenario(model=gpt_model(layers=2), parallel={"dp": 2, "zero": 2},
                      training={"seq_len": 512, "global_batch": 8, "grad_accumulation": "unfused"})
