"""FP8 amax all-reduces on the critical path (``training.fp8_amax_reduction``, docs/model.md section 2.13b).

Each all-reduce costs NCCL's tuner latency for the LL protocol, the faster of tree and ring (NVIDIA/nccl
``src/graph/tuning.cc`` @b6475625: base latency tree 6.8 us, ring 6.6 us; per hop NVLink 0.6 us, network 5.0 us for
tree and 2.7 us for ring; tree depth log2i(nodes)). Every expected value is worked by hand below on
``core_ideal.yaml`` (1,000 TFLOP/s at efficiency 1, communication otherwise free), given a 2,000 TFLOP/s FP8 peak.
"""

from __future__ import annotations

import pytest
from conftest import hardware_variant, make_scenario

import simtrain
from simtrain.decide.estimate import estimate
from simtrain.plan.build import build_plan
from simtrain.plan.fp8_amax import small_allreduce_s
from simtrain.plan.segments import backward_layers, forward_segments

US = 1e-6


@pytest.mark.parametrize(("ranks", "nodes", "intra", "expected_us"), [
    # MLPerf v3.0 CoreWeave 3,584 GPUs: TP 4 x DP 112 = 448 ranks, 8 per node on 56 nodes. tree 6.8 + 2 (7 x 0.6 +
    # log2i(56) = 5 x 5.0) = 65.2; ring (intra floored at the 1.0 us net overhead) 6.6 + (894 - 112) x 1.0 +
    # 112 x 2.7 = 1090.0
    (448, 56, "nvlink", 65.2),
    # one node of 8: tree 6.8 + 2 x 7 x 0.6 = 15.2; ring 6.6 + 14 x 0.6 = 15.0
    (8, 1, "nvlink", 15.0),
    # a TP group of 4 inside a node: tree 6.8 + 2 x 3 x 0.6 = 10.4; ring 6.6 + 6 x 0.6 = 10.2
    (4, 1, "nvlink", 10.2),
    # 8 ranks over 2 nodes: tree 6.8 + 2 (3 x 0.6 + 1 x 5.0) = 20.4; ring 6.6 + (14 - 4) x 1.0 + 4 x 2.7 = 27.4
    (8, 2, "nvlink", 20.4),
    # 2 nodes of 1: tree 6.8 + 2 x 5.0 = 16.8; ring 6.6 + (2 - 4) x 1.0 + 4 x 2.7 = 15.4 (NCCL's formula as it is)
    (2, 2, "nvlink", 15.4),
    # 4 PCIe GPUs: tree 6.8 + 2 x 3 x 1.0 = 12.8; ring 6.6 + 6 x 1.0 = 12.6
    (4, 1, "pci", 12.6),
    (1, 1, "nvlink", 0.0),
])
def test_small_allreduce_is_nccls_tuner_latency(ranks, nodes, intra, expected_us):
    assert small_allreduce_s(ranks, nodes, intra) == pytest.approx(expected_us * US, rel=1e-12)


@pytest.fixture
def hw(tmp_path):
    return hardware_variant(tmp_path, {"gpu.peak_flops.fp8": {"value": "2000 TFLOPS", "source": "test fixture"}})


def _scenario(hw, mode, *, training=None, **par):
    tr = {"precision": "fp8", "fp8_amax_reduction": mode, "dropout": False, **(training or {})}
    return make_scenario(hardware=hw, training=tr, parallel={"tp": 2, **par})


def test_per_chunk_segments_sit_at_the_autocast_exit_and_after_the_first_layers_backward(hw):
    """Forward: one all-reduce after the chunk's last layer, before the output layer. Backward: one after the backward
    of the chunk's first layer (its B), none in a split backward's W. TP 2 on one node: 7.8 us (tree 6.8 + 2 x 0.6 =
    8.0; ring 6.6 + 2 x 0.6 = 7.8)."""
    c = build_plan(_scenario(hw, "per_chunk")).chunks[0]
    assert (c.amax_fwd, c.amax_bwd) == (pytest.approx(7.8 * US), pytest.approx(7.8 * US))
    fwd = forward_segments(c)
    amax = [k for k, seg in enumerate(fwd) if seg[1] == "amax_allreduce"]
    assert len(amax) == 1 and fwd[amax[0] - 1][3] == c.layer_lo + c.layers - 1 and fwd[amax[0] + 1][3] is None
    for part in ("full", "input"):
        layers = backward_layers(c, part)
        kinds = [[seg[1] for seg in segs] for _layer, segs in layers]
        assert layers[-1][0] == c.layer_lo and kinds[-1][-1] == "amax_allreduce"
        assert sum(k.count("amax_allreduce") for k in kinds) == 1
    assert not any(seg[1] == "amax_allreduce" for _l, segs in backward_layers(c, "weight") for seg in segs)


def test_per_chunk_adds_two_latencies_per_micro_batch_to_the_step(hw):
    """pp 1, 8 micro-batches, nothing overlaps the compute stream: the step grows by 8 x 2 x 7.8 us = 124.8 us."""
    base = simtrain.simulate(_scenario(hw, "none")).step_time_s
    amax = simtrain.simulate(_scenario(hw, "per_chunk"))
    assert amax.step_time_s - base == pytest.approx(8 * 2 * 7.8 * US, rel=1e-9)
    assert amax.to_dict()["exposed_comm_s"]["amax"] == pytest.approx(8 * 2 * 7.8 * US, rel=1e-9)


def test_per_chunk_group_is_the_stage_tp_x_dp_ranks(hw):
    """dp 4 x tp 2 on 2 nodes of 4: the stage's 8 ranks span 2 nodes, 20.4 us (tree 20.4, ring 27.4)."""
    s = make_scenario(hardware=hw, nodes=2, gpus_per_node=4,
                      training={"precision": "fp8", "fp8_amax_reduction": "per_chunk", "dropout": False},
                      parallel={"tp": 2, "dp": 4})
    assert build_plan(s).chunks[0].amax_fwd == pytest.approx(20.4 * US, rel=1e-12)


def test_per_linear_counts_the_sequence_parallel_inputs(hw):
    """TP 4 with sequence parallelism, 8 layers, no recompute: 2 per layer forward (QKV and MLP-up inputs), 2 per
    layer backward (projection and MLP-down output gradients), 10.2 us each (TP group of 4 in one node):
    8 x 2 x 10.2 = 163.2 us each way. Without sequence parallelism nothing is sharded: none."""
    c = build_plan(_scenario(hw, "per_linear", tp=4, sequence_parallel=True)).chunks[0]
    assert (c.amax_fwd, c.amax_bwd) == (pytest.approx(163.2 * US, rel=1e-12), pytest.approx(163.2 * US, rel=1e-12))
    plain = build_plan(_scenario(hw, "per_linear", tp=4)).chunks[0]
    assert (plain.amax_fwd, plain.amax_bwd) == (0.0, 0.0)


@pytest.mark.parametrize("pp", [2, 4])
def test_per_chunk_through_a_1f1b_pipeline(hw, pp):
    """1F1B on uniform stages: step = (m + p - 1)(F + B), so adding a to every forward and b to every backward adds
    (m + p - 1)(a + b): 8 micro-batches, a = b = 7.8 us (each stage's TP group of 2 is its amax group)."""
    expected = (8 + pp - 1) * 2 * 7.8 * US
    base = simtrain.simulate(_scenario(hw, "none", pp=pp)).step_time_s
    amax = simtrain.simulate(_scenario(hw, "per_chunk", pp=pp)).step_time_s
    assert amax - base == pytest.approx(expected, rel=1e-9)
    # the analytic estimate (decide.estimate) plays the same segments
    est = [estimate(_scenario(hw, mode, pp=pp)).step_time_s for mode in ("none", "per_chunk")]
    assert est[1] - est[0] == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize(("group", "expected_us"), [
    # dp 2 x cp 2 x tp 2 on 2 nodes of 4: ranks tp + 2 (replica), a sequence's CP pair is replicas 0 and 1
    ("tp_dp_cp", 20.4),   # the stage's 8 ranks over 2 nodes: tree 20.4, ring 27.4
    ("tp_cp", 10.2),      # ranks 0-3, one node: tree 10.4, ring 10.2
    ("tp", 7.8),          # ranks 0-1: tree 8.0, ring 7.8
])
def test_per_chunk_groups(hw, group, expected_us):
    """Megatron passes the TP x DP x CP ranks (Megatron-Core 0.11's default), TP x CP (0.8 to 0.10,
    tp_only_amax_red) or TP (0.7) to fp8_autocast."""
    s = make_scenario(hardware=hw, nodes=2, gpus_per_node=4,
                      training={"precision": "fp8", "fp8_amax_reduction": "per_chunk", "fp8_amax_group": group,
                                "dropout": False},
                      parallel={"tp": 2, "dp": 2, "cp": 2})
    assert build_plan(s).chunks[0].amax_fwd == pytest.approx(expected_us * US, rel=1e-12)


@pytest.mark.parametrize(("shared", "dense", "pairs"), [
    (0, 0, 2 * 1),            # 2 MoE layers, routed experts only: the attention pair each
    (1, 0, 2 * 2),            # a shared expert adds its pair
    (0, 1, 2 + 1),            # a leading dense layer (2 pairs) and a MoE layer (1)
])
def test_per_linear_in_moe_layers(hw, shared, dense, pairs):
    """Routed experts (TE GroupedLinear) reduce no amax; attention and shared experts do, one per pair each way.
    TP 2 in one node: 7.8 us each."""
    model = {"layers": 2, "hidden": 1024, "heads": 16, "ffn_hidden": 4096, "vocab": 8,
             "moe": {"experts": 4, "top_k": 2, "expert_ffn_hidden": 512, "shared_experts": shared,
                     "dense_layers": dense}}
    s = make_scenario(hardware=hw, nodes=1, gpus_per_node=2, model=model,
                      training={"precision": "fp8", "fp8_amax_reduction": "per_linear", "dropout": False},
                      parallel={"tp": 2, "ep": 1, "etp": 1, "sequence_parallel": True})
    c = build_plan(s).chunks[0]
    assert (c.amax_fwd, c.amax_bwd) == (pytest.approx(pairs * 7.8 * US, rel=1e-12),) * 2


def test_per_linear_recomputed_forward_quantizes_again(hw):
    """Full recompute gathers (and so quantizes) the column-parallel inputs again before the backward: 2 more per
    layer in the backward. TP 4, 8 layers: forward 8 x 2 x 10.2 = 163.2 us, backward 8 x 4 x 10.2 = 326.4 us."""
    c = build_plan(_scenario(hw, "per_linear", training={"recompute": "full"}, tp=4,
                             sequence_parallel=True)).chunks[0]
    assert (c.amax_fwd, c.amax_bwd) == (pytest.approx(163.2 * US, rel=1e-12), pytest.approx(326.4 * US, rel=1e-12))


def test_amax_key_needs_tensorwise_fp8(tmp_path):
    """per_chunk with blockwise scales is refused with the allowed values (block scales are local)."""
    from simtrain.spec.errors import InputError
    hw = hardware_variant(tmp_path, {"gpu.peak_flops.fp8": {"value": "2000 TFLOPS", "source": "test fixture"}})
    with pytest.raises(InputError, match="runs fp8_recipe 'blockwise' .allowed with it: none"):
        make_scenario(hardware=hw, training={"precision": "fp8", "fp8_recipe": "blockwise",
                                             "fp8_amax_reduction": "per_chunk"})


def _records(result, stream):
    tl = result.to_dict()["timeline"]
    f = tl["fields"]
    return [(r[f.index("lane")], r[f.index("start_s")], r[f.index("end_s")]) for r in tl["records"]
            if r[f.index("stream")] == stream]


def test_dualpipe_pairs_wait_for_the_all_reduce(hw):
    """In an overlapped forward-backward pair (DualPipe) the all-reduce holds the compute like the TP collectives:
    each lane waits for all its 2 x 16 of them, 32 x 7.8 us = 249.6 us, and no compute runs beside one."""
    tr = {"precision": "fp8", "fp8_amax_reduction": "per_chunk", "dropout": False, "global_batch": 16}
    result = simtrain.simulate(make_scenario(hardware=hw, training=tr,
                                             parallel={"tp": 2, "pp": 4, "schedule": "dualpipe"}))
    assert result.exposed_comm_s["amax"] == pytest.approx(32 * 7.8 * US, rel=1e-9)
    amax, compute = _records(result, "amax"), _records(result, "compute")
    for lane, a0, a1 in amax:
        assert not any(ln == lane and min(a1, c1) - max(a0, c0) > 1e-12 for ln, c0, c1 in compute)


def test_merged_ep_pairs_play_the_all_reduce_on_its_stream(hw):
    """A merged EP pair (ep_overlap) plays the all-reduces as latencies on their own stream, as without it: 4 MoE
    layers (routed experts only) over pp 2 x vpp 2, 8 micro-batches per lane, 1 + 1 per layer at 7.8 us:
    4 layers x 2 x 8 x 7.8 us / 2 stages = 249.6 us per lane, with the overlap or not."""
    model = {"layers": 4, "hidden": 1024, "heads": 16, "ffn_hidden": 4096, "vocab": 1024,
             "moe": {"experts": 4, "top_k": 2, "expert_ffn_hidden": 512}}
    for overlap in (False, True):
        s = make_scenario(hardware=hw, model=model, nodes=1, gpus_per_node=8,
                          training={"precision": "fp8", "fp8_amax_reduction": "per_linear", "dropout": False,
                                    "global_batch": 16},
                          parallel={"tp": 2, "dp": 2, "pp": 2, "vpp": 2, "ep": 2, "etp": 1, "sequence_parallel": True,
                                    "schedule": "interleaved-1f1b", "ep_overlap": overlap})
        result = simtrain.simulate(s)
        assert result.exposed_comm_s["amax"] == pytest.approx(249.6 * US, rel=1e-9), overlap
        assert sum(b - a for lane, a, b in _records(result, "amax") if lane == 0) == pytest.approx(249.6 * US,
                                                                                                    rel=1e-9)


@pytest.mark.parametrize(("modules", "bwd"), [(None, 1), (["mla_up_proj"], 3)])
def test_per_linear_latent_attention(hw, modules, bwd):
    """Multi-head latent attention: its query and key/value up projections are column-parallel on the
    sequence-parallel latents (2 forward), its output projection row-parallel (1 backward); mla_up_proj recompute
    re-runs both up projections (2 more). One MoE layer of routed experts only, TP 2: 7.8 us each."""
    model = {"layers": 1, "hidden": 1024, "heads": 16, "ffn_hidden": 4096, "vocab": 8,
             "attention": {"kind": "mla", "q_lora_rank": 256, "kv_lora_rank": 128, "qk_nope_head_dim": 64,
                           "qk_rope_head_dim": 64, "v_head_dim": 64},
             "moe": {"experts": 4, "top_k": 2, "expert_ffn_hidden": 512}}
    tr = {"precision": "fp8", "fp8_amax_reduction": "per_linear", "dropout": False,
          **({"recompute": "selective", "recompute_modules": modules} if modules else {})}
    s = make_scenario(hardware=hw, nodes=1, gpus_per_node=2, model=model, training=tr,
                      parallel={"tp": 2, "ep": 1, "etp": 1, "sequence_parallel": True})
    c = build_plan(s).chunks[0]
    assert (c.amax_fwd, c.amax_bwd) == (pytest.approx(2 * 7.8 * US), pytest.approx(bwd * 7.8 * US))


def test_a_stage_without_layers_reduces_nothing(hw):
    """A pipeline rank that holds no layer (layers_per_stage [8, 0]: the output layer alone) runs no FP8 module."""
    plan = build_plan(_scenario(hw, "per_chunk", pp=2, layers_per_stage=[8, 0]))
    assert [(c.amax_fwd, c.amax_bwd) for c in plan.chunks][1] == (0.0, 0.0)
    assert plan.chunks[0].amax_fwd == pytest.approx(7.8 * US)


def test_a_group_without_per_chunk_is_a_warning(hw):
    """fp8_amax_group sets per_chunk's ranks: with per_linear (or none) the scenario says it has no effect."""
    s = _scenario(hw, "per_linear", training={"fp8_amax_group": "tp"})
    assert any("fp8_amax_group has no effect with fp8_amax_reduction per_linear" in w for w in s.warnings)
    chunked = _scenario(hw, "per_chunk", training={"fp8_amax_group": "tp"})
    assert not any("fp8_amax_group" in w for w in chunked.warnings)
