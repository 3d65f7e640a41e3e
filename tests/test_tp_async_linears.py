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
    """AG 10, RS 8; GEMMs (forward, data gradient, weight gradient): QKV 40, output 20, MLP up 80, down 80; t = 4.
    Forward: QKV's gather under 40 / 4 = 10 hides whole, the output's RS 8 exposed, up's gather under 20 hides, the
    down RS 8 exposed: 16. Backward: QKV's re-gather under 40 and RS under 40 hide, the output's gradient gather
    under 20 / 4 = 5 leaves 5, up's hide, down's gather under 80 / 4 = 20 hides: 5. With a 1.2 slowdown the hidden
    time costs 0.2 of itself: forward 20 hidden -> +4, backward 51 hidden -> +10.2."""
    gemms = [(40.0, 40.0, 40.0), (20.0, 20.0, 20.0), (80.0, 80.0, 80.0), (80.0, 80.0, 80.0)]
    assert exposed_tp_async_linears(10.0, 8.0, gemms, 4, 1.0) == pytest.approx((16.0, 5.0))
    assert exposed_tp_async_linears(10.0, 8.0, gemms, 4, 1.2) == pytest.approx((20.0, 15.2))


BW = 100e9   # NVLink per GPU and direction in this test's hardware; zero latency, 1,000 TFLOP/s flat GEMMs


def _scenario(tmp_path, **par):
    hw = hardware_variant(tmp_path, {"intra_node.bandwidth": "100 GB/s"})
    return make_scenario(hardware=hw, model=gpt_model(layers=2, hidden=1024, heads=16),
                         training={"seq_len": 512, "global_batch": 1, "micro_batch": 1},
                         parallel={"tp": 2, "sequence_parallel": True, **par})


def test_a_gpt_layer_at_tp_2(tmp_path):
    """512 tokens, h 1,024, MLP 4h, t = 2: each all-gather and reduce-scatter moves half of 512 x 1,024 x 2 bytes at
    100 GB/s, 5.243 us. Per TP rank the GEMMs (2 M N K at 1e15 FLOP/s): QKV 512 x 1,536 x 1,024 = 1.611 us, output
    512 x 1,024 x 512 = 0.537 us, up 512 x 2,048 x 1,024 = 2.147 us, down 512 x 1,024 x 2,048 = 2.147 us, each
    pass alike. Forward: (5.243 - 1.611 / 2) + 5.243 + (5.243 - 2.147 / 2) + 5.243 = 19.09 us (without the overlap,
    20.97). Backward: (5.243 - 1.611) + (5.243 - 1.611) + (5.243 - 0.537 / 2) + (5.243 - 2.147) x 2
    + (5.243 - 2.147 / 2) = 18.29 us."""
    coll = 0.5 * 512 * 1024 * 2 / BW
    qkv, proj, up, down = (2 * 512 * n * k / 1e15 for n, k in ((1536, 1024), (1024, 512), (2048, 1024), (1024, 2048)))
    c = build_plan(_scenario(tmp_path, tp_async_linears=True)).chunks[0]
    fwd = (coll - qkv / 2) + coll + (coll - up / 2) + coll
    bwd = 2 * (coll - qkv) + (coll - proj / 2) + 2 * (coll - up) + (coll - down / 2)
    assert c.tp_fwd_layer == pytest.approx(fwd, rel=1e-9)
    assert c.tp_bwd_layer == pytest.approx(bwd, rel=1e-9)
    plain = build_plan(_scenario(tmp_path)).chunks[0]
    assert plain.tp_fwd_layer == pytest.approx(4 * coll, rel=1e-9)


def test_with_userbuffers_it_is_refused(tmp_path):
    """The two stacks' overlaps of the same collectives cannot both run: exit 2, naming the key."""
    with pytest.raises(InputError, match="parallel.tp_async_linears"):
        _scenario(tmp_path, tp_async_linears=True, tp_comm_overlap=True)


def test_without_sequence_parallelism_it_warns_and_changes_nothing(tmp_path):
    s = make_scenario(model=gpt_model(layers=2), parallel={"tp": 2, "tp_async_linears": True})
    assert any("tp_async_linears has no effect" in w for w in s.warnings)
    base = make_scenario(model=gpt_model(layers=2), parallel={"tp": 2})
    assert build_plan(s).chunks[0].tp_fwd_layer == build_plan(base).chunks[0].tp_fwd_layer
