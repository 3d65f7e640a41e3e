"""Megatron's asynchronous TP all-reduce (``parallel.tp_async_allreduce``, docs/model.md section 6.1): without
sequence parallelism each column-parallel linear (QKV, MLP up) all-reduces its input gradient while its weight
gradient runs (NVIDIA/Megatron-LM ``LinearWithGradAccumulationAndAsyncCommunication``, on by default since 2021-09;
Korthikanti et al. 2022 Sec. 5). Every expected value below is a hand calculation on ``core_ideal.yaml`` (1,000
TFLOP/s at efficiency 1, memory time nil) with its NVLink bandwidth set to 500 GB/s and an overlap slowdown of 1.2.
"""

from __future__ import annotations

import pytest
from conftest import hardware_variant, make_scenario

from simtrain.plan.build import build_plan
from simtrain.plan.segments import backward_layers
from simtrain.plan.tp_overlap import exposed_async_allreduce

US = 1e-6
# the default test model (h 1,024, MLP 4h, 512 tokens, micro-batch 1) at TP 2: weight-gradient GEMMs 2 T h (N / 2)
QKV_WGRAD = 2 * 512 * 1024 * (3 * 1024 // 2) / 1e15     # 1.6106 us
UP_WGRAD = 2 * 512 * 1024 * (4 * 1024 // 2) / 1e15      # 2.1475 us


def test_each_all_reduce_hides_under_its_weight_gradient_and_slows_it():
    """exposed = max(0, AR - W) + (slowdown - 1) x the hidden part, per linear. AR 1.0 ms; W 0.6 and 2.0 ms;
    slowdown 1.1: (0.4 + 0.1 x 0.6) + (0 + 0.1 x 1.0) = 0.56 ms. A split B, with no W under it, waits for both
    whole all-reduces: 2.0 ms, 1.44 ms more."""
    total, back = exposed_async_allreduce(1.0e-3, (0.6e-3, 2.0e-3), 1.1)
    assert total == pytest.approx(0.56e-3, rel=1e-12)
    assert back == pytest.approx(1.44e-3, rel=1e-12)
    assert total + back == pytest.approx(2 * 1.0e-3, rel=1e-12)


@pytest.fixture
def hw(tmp_path):
    return hardware_variant(tmp_path, {"intra_node.bandwidth": "500 GB/s", "compute.overlap_slowdown": 1.2})


def _chunk(hw, recompute="none", **par):
    s = make_scenario(hardware=hw, training={"recompute": recompute}, parallel={"tp": 2, **par})
    return build_plan(s).chunks[0]


#: one all-reduce of 512 x 1,024 bf16 activations over 2 GPUs at 500 GB/s, ring: 2 (n - 1) / n x bytes / bandwidth
AR = 2 * (2 - 1) / 2 * 512 * 1024 * 2 / 500e9            # 2.0972 us


def test_the_layer_backward_exposes_what_the_weight_gradients_cannot_hide(hw):
    """Hand: AR (2.0972 us) lies between the two weight gradients, so QKV's leaves AR - 1.6106 us exposed and hides
    1.6106 us at 0.2 extra; MLP-up's hides all of AR at 0.2 extra. Without the overlap the backward carries both
    all-reduces whole."""
    c = _chunk(hw)
    ar = AR
    assert c.tp_fwd_layer == pytest.approx(2 * AR, rel=1e-9)
    assert QKV_WGRAD < ar < UP_WGRAD
    assert c.tp_bwd_layer == pytest.approx((ar - QKV_WGRAD) + 0.2 * QKV_WGRAD + 0.2 * ar, rel=1e-9)
    assert c.tp_wgrad_hidden == pytest.approx(0.8 * QKV_WGRAD + 0.8 * ar, rel=1e-9)
    plain = _chunk(hw, tp_async_allreduce=False)
    assert plain.tp_bwd_layer == pytest.approx(2 * ar, rel=1e-12)
    assert plain.tp_wgrad_hidden == 0.0


def test_full_recompute_adds_the_recomputed_forwards_two_all_reduces_whole(hw):
    """The recomputed forward's all-reduces follow their row-parallel GEMMs synchronously: + 2 AR."""
    none, full = _chunk(hw), _chunk(hw, "full")
    assert full.tp_bwd_layer == pytest.approx(none.tp_bwd_layer + 2 * (none.tp_fwd_layer / 2), rel=1e-9)


def test_sequence_parallelism_is_untouched(hw):
    """With sequence parallelism there are no all-reduces to overlap this way (all-gathers and reduce-scatters):
    the setting changes nothing."""
    on = _chunk(hw, sequence_parallel=True)
    off = _chunk(hw, sequence_parallel=True, tp_async_allreduce=False)
    assert (on.tp_fwd_layer, on.tp_bwd_layer, on.tp_wgrad_hidden) == (off.tp_fwd_layer, off.tp_bwd_layer, 0.0)


def test_a_split_backward_waits_for_the_whole_all_reduces_in_b(hw):
    """A zero-bubble B runs before its W: its TP segment is the two all-reduces whole (2 AR); a whole backward's is
    the overlapped figure."""
    s = make_scenario(hardware=hw, training={"global_batch": 8},
                      parallel={"tp": 2, "pp": 2, "schedule": "zb-h1"}, nodes=1, gpus_per_node=4)
    c = build_plan(s).chunks[0]
    ar = c.tp_fwd_layer / 2
    tp_in = [seg[2] for _l, segs in backward_layers(c, "input") for seg in segs if seg[1] == "tp_comm"]
    tp_full = [seg[2] for _l, segs in backward_layers(c, "full") for seg in segs if seg[1] == "tp_comm"]
    assert tp_in == pytest.approx([2 * ar] * c.layers, rel=1e-9)
    assert tp_full == pytest.approx([c.tp_bwd_layer] * c.layers, rel=1e-12)
    assert c.tp_bwd_layer < 2 * ar


def test_setting_it_where_it_cannot_act_warns():
    from conftest import DATA, scenario_dict

    from simtrain.spec.scenario import scenario_from_dict

    raw = scenario_dict(parallel={"tp": 2, "sequence_parallel": True, "tp_async_allreduce": True})
    s = scenario_from_dict(raw, file="test.yaml", base_dir=DATA)
    assert any("tp_async_allreduce has no effect" in w for w in s.warnings)


def test_the_estimate_plays_a_split_b_with_the_whole_all_reduces(hw):
    """The estimate's zero-bubble play (decide.estimate_play) charges a split B the whole all-reduces, as the
    engine's segments do: its pp 2 zb-h1 step with TP 2 is within 1% of the simulation with the overlap as without
    it (charging B the overlapped figure instead puts it 11% short)."""
    from simtrain.decide.estimate import estimate
    from simtrain.engine.simulation import simulate

    for overlap in (True, False):
        s = make_scenario(hardware=hw, training={"global_batch": 8},
                          parallel={"tp": 2, "pp": 2, "schedule": "zb-h1", "tp_async_allreduce": overlap},
                          nodes=1, gpus_per_node=4)
        sim = simulate(s).step_time_s
        est = estimate(s)
        assert est.lower_bound_s <= sim
        assert est.step_time_s == pytest.approx(sim, rel=0.01)


def test_a_lane_whose_ring_runs_slower_times_its_own_overlap(hw):
    """Degraded links give each replica its own TP scale (plan.tp_scale). The overlap is not linear in the
    all-reduce, so a lane's backward TP segment must be its own exposure: at scale 10 the all-reduce (20.97 us)
    outlasts both weight gradients, exposed (10 AR - 1.6106) + (10 AR - 2.1475) + 0.2 x (1.6106 + 2.1475) us; at 0.1
    (0.2097 us) both hide, 2 x 0.2 x 0.1 AR. The engine multiplies the segment by the scale."""
    from simtrain.plan.segments import backward_layers

    c = _chunk(hw)
    for scale, want in ((10.0, (10 * AR - QKV_WGRAD) + (10 * AR - UP_WGRAD) + 0.2 * (QKV_WGRAD + UP_WGRAD)),
                        (0.1, 2 * 0.2 * 0.1 * AR)):
        tp = [seg[2] for _l, segs in backward_layers(c, "full", scale) for seg in segs if seg[1] == "tp_comm"]
        assert [t * scale for t in tp] == pytest.approx([want] * c.layers, rel=1e-9)


def test_a_healthy_replica_keeps_its_tp_time_when_another_is_degraded(hw):
    """Full fidelity, 2 replicas of TP 4, one link of replica 0's ring at a tenth of its speed: replica 1's TP
    busy time is the same as in a run without the degraded link (it was 59% higher when the lane scaled the
    overlapped figure linearly)."""
    from conftest import gpt_model

    from simtrain.engine.simulation import simulate

    busy = {}
    for degraded in ([], [{"a": "gpu0", "b": "nvsw0", "factor": 0.1}]):
        s = make_scenario(hardware=hw, model=gpt_model(layers=4, hidden=4096, heads=32), nodes=2, gpus_per_node=4,
                          training={"global_batch": 8, "seq_len": 2048}, parallel={"tp": 4, "dp": 2},
                          simulation={"degraded_links": degraded, "fidelity": "full"})
        tl = simulate(s).timeline
        busy[bool(degraded)] = {lane.dp: sum(r[4] - r[3] for r in tl.records
                                             if r[0] == lane.index and r[1] == "tp" and r[2] == "tp_comm")
                                for lane in tl.lanes}
    assert busy[True][1] == pytest.approx(busy[False][1], rel=1e-9)
    assert busy[True][0] > 5 * busy[False][0]


def test_latent_attention_keeps_its_backward_all_reduces_whole():
    """Multi-head latent attention's column-parallel up projections take the latents: the overlap's pairing is not
    modelled there, so both backward all-reduces stay whole (2 AR), as with the setting off."""
    from conftest import gpt_model

    m = gpt_model(layers=2, hidden=1024, heads=16)
    m["attention"] = {"kind": "mla", "q_lora_rank": 384, "kv_lora_rank": 256, "qk_nope_head_dim": 64,
                      "qk_rope_head_dim": 32, "v_head_dim": 64}
    c = build_plan(make_scenario(model=m, parallel={"tp": 2})).chunks[0]
    assert c.tp_bwd_layer == pytest.approx(c.tp_fwd_layer, rel=1e-12)
    assert c.tp_async == ()


def test_nanotron_layers_default_to_the_synchronous_all_reduce():
    """nanotron's column_linear all-reduces its input gradient after the backward unless
    tp_linear_async_communication is set (default off): layer_kernels nanotron turns the default off, says so, and
    an explicit value wins."""
    def scenario(**par):
        return make_scenario(model={"layers": 2, "hidden": 1024, "heads": 16, "ffn_hidden": 2816, "vocab": 8,
                                    "mlp": "swiglu", "norm": "rmsnorm", "bias": False},
                             training={"layer_kernels": "nanotron", "flash_attention": "flash2", "dropout": False},
                             parallel={"tp": 2, **par})
    s = scenario()
    assert not s.parallel.tp_async_allreduce
    assert any("tp_async_allreduce: false, nanotron's default" in a for a in s.assumed)
    assert scenario(tp_async_allreduce=True).parallel.tp_async_allreduce
    assert scenario(sequence_parallel=True).parallel.tp_async_allreduce   # no all-reduce to overlap: left as set


def test_setting_it_with_tp_1_warns():
    from conftest import DATA, scenario_dict

    from simtrain.spec.scenario import scenario_from_dict

    raw = scenario_dict(parallel={"tp": 1, "tp_async_allreduce": False})
    s = scenario_from_dict(raw, file="test.yaml", base_dir=DATA)
    assert any("tp_async_allreduce has no effect" in w for w in s.warnings)
