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
    over 2 ranks, HBM at 1 TB/s. Fused accumulation adds the embedding table's gradient the same way (Megatron's DDP
    hook, test below), so the embedding unit differs by the rest of it: the output layer and the final norm."""
    hw = hardware_variant(tmp_path, {"gpu.memory_bandwidth": "1 TB/s"}, name="hbm1")
    base = dict(hardware=hw, model=gpt_model(layers=2), parallel={"dp": 2})
    train = {"seq_len": 512, "global_batch": 16, "micro_batch": 2, "grad_dtype": "fp32"}
    fused = make_scenario(**base, training=train)
    unfused = make_scenario(**base, training={**train, "grad_accumulation": "unfused"})
    n, n_e = layer_params_per_rank(fused.model, 1), edge_params(fused.model, 1, 1, first=True, last=True)
    a, b = build_plan(fused).chunks[0], build_plan(unfused).chunks[0]
    assert b.fwd_layer == a.fwd_layer
    assert b.bwd_layer - a.bwd_layer == pytest.approx(10 * n / B, rel=1e-9)
    table = fused.model.vocab * fused.model.hidden
    assert b.embed_bwd - a.embed_bwd == pytest.approx(10 * (n_e - table) / B, rel=1e-9)



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


def _embedding_unit(tmp_path, **training):
    hw = hardware_variant(tmp_path, {"gpu.memory_bandwidth": "1 TB/s"}, name="hbm1")
    tied = training.pop("tied", False)
    sc = make_scenario(hardware=hw, model=gpt_model(layers=2, vocab=32768, tied_embeddings=tied),
                       training={"seq_len": 512, "global_batch": 2, "micro_batch": 2, **training})
    return build_plan(sc).chunks[0]


def test_the_embedding_backward_writes_a_dense_gradient_of_the_whole_table(tmp_path):
    """PyTorch's CUDA embedding backward (EmbeddingBackwardKernel.cu) zero-fills a [vocab, h] gradient (2 B an
    entry in bf16) and sums the 1,024 tokens' rows through fp32 partials: read 2 + write 4 + read 4 + write 2 = 12 B
    per token and hidden unit. One micro-batch, autograd accumulation (nothing to accumulate): 32,768 x 1,024 x 2 +
    1,024 x 1,024 x 12 bytes at 1 TB/s."""
    c = _embedding_unit(tmp_path, grad_accumulation="autograd")
    assert c.embed_bwd == pytest.approx((32768 * 1024 * 2 + 1024 * 1024 * 12) / B, rel=1e-9)


def test_fused_accumulation_adds_the_table_gradient_by_the_ddp_hook(tmp_path):
    """Megatron's gradient_accumulation_fusion fuses the linears' weight gradients only: its DDP hook adds the
    embedding's .grad into the fp32 main_grad (read 2 + read 4 + write 4 = 10 B an entry); not under ZeRO-3."""
    fused = _embedding_unit(tmp_path, grad_dtype="fp32")
    auto = _embedding_unit(tmp_path, grad_dtype="fp32", grad_accumulation="autograd")
    assert fused.embed_bwd - auto.embed_bwd == pytest.approx(32768 * 1024 * 10 / B, rel=1e-9)


def test_a_tied_table_on_one_stage_sums_its_two_gradients(tmp_path):
    """At pp 1 a tied table gets the output layer's gradient and the lookup's; autograd sums them before the
    accumulation (read 2 + read 2 + write 2 = 6 B an entry). Untied, each has its own parameter: no sum."""
    tied = _embedding_unit(tmp_path, grad_accumulation="autograd", tied=True)
    untied = _embedding_unit(tmp_path, grad_accumulation="autograd")
    assert tied.embed_bwd - untied.embed_bwd == pytest.approx(32768 * 1024 * 6 / B, rel=1e-9)


def test_fused_accumulation_of_a_tied_table_sums_megatrons_zeroed_dummy(tmp_path):
    """At pp 1 Megatron's fused output layer hands autograd a zero-filled dummy gradient of the table
    (zero_out_wgrad): filled (2 B) and summed with the lookup's (6 B) before the hook adds it (10 B, fp32)."""
    tied = _embedding_unit(tmp_path, grad_dtype="fp32", tied=True)
    untied = _embedding_unit(tmp_path, grad_dtype="fp32")
    assert tied.embed_bwd - untied.embed_bwd == pytest.approx(32768 * 1024 * 8 / B, rel=1e-9)
