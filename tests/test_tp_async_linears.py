"""nanotron's asynchronous tensor-parallel linears (``parallel.tp_async_linears``; huggingface/nanotron
src/nanotron/parallel/tensor_parallel/functional.py @67c5ebb6, REDUCE_SCATTER mode): a column-parallel linear
gathers its input under its own shard's GEMM (1/t of it) and, backward, gathers again under the data-gradient GEMM
and reduce-scatters under the weight-gradient GEMM; a row-parallel linear reduce-scatters exposed and, backward,
gathers the output gradient under its own shard's data-gradient GEMM. Expected values are hand calculations."""

from __future__ import annotations

import pytest
from conftest import gpt_model, hardware_variant, make_scenario

from simtrain.plan.build import build_plan
from simtrain.plan.tp_overlap import exposed_tp_async_linears
from simtrain.spec.errors import InputError


def test_the_layers_exposure_by_hand():
    """AG 10, RS 8; GEMMs (forward, data gradient, weight gradient), each pass its own time: QKV (40, 44, 48),
    output (20, 24, 28), MLP up (80, 84, 88), down (60, 64, 68); t = 4. Forward: QKV's gather under 40 / 4 = 10
    hides whole, the output's RS 8 exposed, up's gather under 80 / 4 = 20 hides, the down RS 8 exposed: 16.
    Backward: the column linears' reduce-scatters exposed (8 + 8; their re-gathers not counted, the layers'
    convention), the output's gradient gather under 24 / 4 = 6 leaves 4, down's under 64 / 4 = 16 hides: 20. With a
    1.2 slowdown the hidden time costs 0.2 of itself: forward 20 hidden -> 20, backward 16 hidden -> 23.2."""
    gemms = [(40.0, 44.0, 48.0), (20.0, 24.0, 28.0), (80.0, 84.0, 88.0), (60.0, 64.0, 68.0)]
    assert exposed_tp_async_linears(10.0, 8.0, gemms, 4, 1.0) == pytest.approx((16.0, 20.0))
    assert exposed_tp_async_linears(10.0, 8.0, gemms, 4, 1.2) == pytest.approx((20.0, 23.2))


BW = 100e9   # NVLink per GPU and direction in this test's hardware; zero latency, 1,000 TFLOP/s flat GEMMs


def _scenario(tmp_path, **par):
    hw = hardware_variant(tmp_path, {"intra_node.bandwidth": "100 GB/s"})
    return make_scenario(hardware=hw, model=gpt_model(layers=2, hidden=1024, heads=16),
                         training={"seq_len": 512, "global_batch": 1, "micro_batch": 1},
                         parallel={"tp": 2, "sequence_parallel": True, **par})


def test_a_gpt_layer_at_tp_2(tmp_path):
    """512 tokens, h 1,024, MLP 4h, t = 2: each all-gather and reduce-scatter moves half of 512 x 1,024 x 2 bytes at
    100 GB/s, 5.24288 us. Per TP rank the GEMMs (2 M N K at 1e15 FLOP/s): QKV 512 x 1,536 x 1,024 = 1.610613 us,
    output 512 x 1,024 x 512 = 0.536871 us, up 512 x 2,048 x 1,024 = 2.147484 us, down 512 x 1,024 x 2,048 =
    2.147484 us. Forward: (5.24288 - 0.805306) + 5.24288 + (5.24288 - 1.073742) + 5.24288 = 19.092472 us (without
    the overlap, 20.97152). Backward: the column linears' reduce-scatters 2 x 5.24288, the output's gradient gather
    5.24288 - 0.268435, the down projection's 5.24288 - 1.073742: 19.629343 us (without, 20.97152)."""
    c = build_plan(_scenario(tmp_path, tp_async_linears=True)).chunks[0]
    assert c.tp_fwd_layer == pytest.approx(19.092472e-6, abs=1e-12)
    assert c.tp_bwd_layer == pytest.approx(19.629343e-6, abs=1e-12)
    plain = build_plan(_scenario(tmp_path)).chunks[0]
    assert plain.tp_fwd_layer == pytest.approx(20.97152e-6, abs=1e-12)


def test_with_userbuffers_it_is_refused(tmp_path):
    """The two stacks' overlaps of the same collectives cannot both run: exit 2, naming the key."""
    with pytest.raises(InputError, match="parallel.tp_async_linears"):
        _scenario(tmp_path, tp_async_linears=True, tp_comm_overlap=True)


def test_without_sequence_parallelism_it_warns_and_changes_nothing(tmp_path):
    s = make_scenario(model=gpt_model(layers=2), parallel={"tp": 2, "tp_async_linears": True})
    assert any("tp_async_linears has no effect" in w for w in s.warnings)
    base = make_scenario(model=gpt_model(layers=2), parallel={"tp": 2})
    assert build_plan(s).chunks[0].tp_fwd_layer == build_plan(base).chunks[0].tp_fwd_layer


def test_with_latent_attention_it_is_refused(tmp_path):
    """Both overlaps are costed under a multi-head attention layer's four GEMMs: multi-head latent attention is
    refused (exit 2, naming the key), not crashed on."""
    hw = hardware_variant(tmp_path, {"intra_node.bandwidth": "100 GB/s"})
    mla = {"kind": "mla", "q_lora_rank": 256, "kv_lora_rank": 128, "qk_nope_head_dim": 64, "qk_rope_head_dim": 64,
           "v_head_dim": 64}
    for key in ("tp_async_linears", "tp_comm_overlap"):
        with pytest.raises(InputError, match=f"parallel.{key}"):
            make_scenario(hardware=hw, model=gpt_model(layers=2, hidden=1024, heads=16, attention=mla),
                          training={"seq_len": 512, "global_batch": 1, "micro_batch": 1},
                          parallel={"tp": 2, "sequence_parallel": True, key: True})
