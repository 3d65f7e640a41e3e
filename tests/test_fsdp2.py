"""parallel.zero_impl fsdp2: PyTorch FSDP2's copies around its collectives, counted from its code
(pytorch/pytorch torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py: foreach_all_gather,
foreach_all_gather_copy_out, foreach_reduce) and timed at the hardware's streaming rate.

The hand counts, per parameter of a unit, bf16 weights with an fp32 master and fp32 gradients (w = 2, g = 4):
all-gather copy-in 4 + 2 (cast of the fp32 shard) + 2 + 2 (copy into the all-gather input) = 10 B per *sharded*
parameter; copy-out 2 + 2 B; reduce-scatter copy-in (chunk_cat with the widening cast) 2 + 4 B.
"""

from __future__ import annotations

import pytest
from conftest import gpt_model, hardware_variant, make_scenario

from simtrain.engine.simulation import simulate
from simtrain.plan.build import build_plan
from simtrain.plan.memory import edge_params, layer_params_per_rank

B = 1e12   # the test GPU's HBM: 1 TB/s, streaming efficiency 1, no launch gap (tests/data/core_ideal.yaml)


def _pair(tmp_path, zero: int, **training):
    hw = hardware_variant(tmp_path, {"gpu.memory_bandwidth": "1 TB/s"}, name="hbm1")
    base = dict(hardware=hw, model=gpt_model(layers=2),
                training={"seq_len": 512, "global_batch": 16, "micro_batch": 2, **training})
    return (make_scenario(**base, parallel={"dp": 2, "zero": zero}),
            make_scenario(**base, parallel={"dp": 2, "zero": zero, "zero_impl": "fsdp2"}))


def test_fsdp2_zero3_copies_per_layer(tmp_path):
    """FSDP2, ZeRO-3 over 2 ranks, fp32 gradients: each layer's forward runs the copy-out, 4n / B, on the compute
    stream; its backward the copy-out and the reduce-scatter copy-in, (4 + 6) n / B; each all-gather of 2n weight
    bytes is preceded on its stream by the copy-in of the n/2-parameter shard, 10 (n/2) / B, i.e. 2.5 / B per
    gathered byte. The layer holds 12 h^2 weights plus its biases and norms (h = 1024): 12,582,912 < n < 12,600,000."""
    generic, fsdp2 = _pair(tmp_path, 3, grad_dtype="fp32")
    n = layer_params_per_rank(generic.model, 1)
    assert 12 * 1024 ** 2 < n < 12_600_000
    g, f = build_plan(generic).chunks[0], build_plan(fsdp2).chunks[0]
    assert f.fwd_layer - g.fwd_layer == pytest.approx(4 * n / B, rel=1e-9)
    assert f.bwd_layer - g.bwd_layer == pytest.approx(10 * n / B, rel=1e-9)
    assert f.gather_prep_per_byte * f.zero3_layer_bytes == pytest.approx(10 * (n / 2) / B, rel=1e-9)
    assert g.gather_prep_per_byte == 0.0
    # the embedding and output layer are one more unit (one stage holds both): the same per-parameter copies
    n_e = edge_params(generic.model, 1, 1, first=True, last=True)
    assert f.embed_fwd - g.embed_fwd == pytest.approx(4 * n_e / B, rel=1e-9)
    assert f.embed_bwd - g.embed_bwd == pytest.approx(10 * n_e / B, rel=1e-9)


def test_fsdp2_with_zero2_is_refused(tmp_path):
    """FSDP2 without resharding after the forward still reshards after each backward and gathers before every
    micro-batch's forward (PyTorch FSDPParamGroup.post_backward), which simtrain's ZeRO-2 does not play: refused,
    naming the field and what is allowed."""
    from simtrain.spec.errors import InputError

    with pytest.raises(InputError, match=r"parallel\.zero_impl: 'fsdp2' with zero 2 is not simulated.*allowed"):
        _pair(tmp_path, 2)


def test_fsdp2_shards_over_dp_times_cp(tmp_path):
    """ZeRO shards over dp x cp ranks: with dp 2 and cp 2 each copy-in covers a quarter of the layer's n parameters,
    10 (n/4) / B for its 2n gathered bytes, half the dp 2 cp 1 figure."""
    hw = hardware_variant(tmp_path, {"gpu.memory_bandwidth": "1 TB/s"}, name="hbm1")
    base = dict(hardware=hw, model=gpt_model(layers=2), training={"seq_len": 512, "global_batch": 16,
                "micro_batch": 2, "grad_dtype": "fp32"})
    s = make_scenario(**base, gpus_per_node=4, parallel={"dp": 2, "cp": 2, "zero": 3, "zero_impl": "fsdp2"})
    n = layer_params_per_rank(s.model, 1)
    c = build_plan(s).chunks[0]
    assert c.gather_prep_per_byte * c.zero3_layer_bytes == pytest.approx(10 * (n / 4) / B, rel=1e-9)


def test_fsdp2_fp16_gradients_are_divided_before_the_reduce_scatter(tmp_path):
    """fp16 gradients: FSDP2 pre-divides the reduce-scatter input in place against overflow (read 2 + write 2 B
    per parameter, 2 / B per gradient byte, on the reduce-scatter's stream); bf16 ones are averaged by NCCL."""
    hw = hardware_variant(tmp_path, {"gpu.memory_bandwidth": "1 TB/s"}, name="hbm1")
    base = dict(hardware=hw, model=gpt_model(layers=2), parallel={"dp": 2, "zero": 3, "zero_impl": "fsdp2"})
    fp16 = make_scenario(**base, training={"seq_len": 512, "global_batch": 16, "micro_batch": 2, "precision": "fp16"})
    bf16 = make_scenario(**base, training={"seq_len": 512, "global_batch": 16, "micro_batch": 2})
    assert build_plan(fp16).chunks[0].grad_prep_per_byte == pytest.approx(2 / B, rel=1e-12)
    assert build_plan(bf16).chunks[0].grad_prep_per_byte == 0.0


def test_fsdp2_step_pays_the_compute_copies_and_at_most_every_copy_in(tmp_path):
    """The played step of the ZeRO-3 pair grows by at least the compute-stream copies, m x (L (4 + 10) n + 14 n_e)
    / B, and by at most that plus every all-gather's copy-in (m micro-batches x (2 L layer gathers x 5n + 2 edge
    gathers x 5 n_e) / B), which may hide behind compute. m = 4, L = 2."""
    generic, fsdp2 = _pair(tmp_path, 3, grad_dtype="fp32")
    n, n_e = layer_params_per_rank(generic.model, 1), edge_params(generic.model, 1, 1, first=True, last=True)
    compute = 4 * (2 * 14 * n + 14 * n_e) / B
    copy_in = 4 * (2 * 2 * 5 * n + 2 * 5 * n_e) / B
    delta = simulate(fsdp2).step_time_s - simulate(generic).step_time_s
    assert compute * (1 - 1e-9) <= delta <= (compute + copy_in) * (1 + 1e-9)
    assert delta > compute * 1.05   # the first gather of each micro-batch cannot hide its copy-in

