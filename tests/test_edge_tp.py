"""The embedding's, output layer's and loss's tensor-parallel collectives (``simtrain.plan.edge_tp``, docs/model.md
section 6.1), read from NVIDIA/Megatron-LM @d98e8a6: ``VocabParallelEmbedding`` all-reduces its output (a
reduce-scatter under sequence parallelism); the output layer's ``ColumnParallelLinear`` all-gathers its input under
sequence parallelism and, in its backward, all-reduces the input gradient under the weight-gradient GEMM (under
sequence parallelism reduce-scatters it, on the critical path as a layer's); the vocabulary-parallel loss
all-reduces 3 per-token fp32 figures (the fused loss 2: 4 and 8 bytes a token).

Every expected value is a hand calculation on ``core_ideal.yaml`` (1,000 TFLOP/s at efficiency 1, memory time nil,
zero latency) with NVLink at 500 GB/s and an overlap slowdown of 1.2; the test model is h 1,024, 512 tokens, micro-
batch 1, at TP 2, ring collectives: all-reduce 2 (n - 1) / n x bytes / bandwidth, all-gather and reduce-scatter
(n - 1) / n x bytes / bandwidth.
"""

from __future__ import annotations

import pytest
from conftest import gpt_model, hardware_variant, make_scenario

from simtrain.plan.build import build_plan
from simtrain.plan.segments import backward_segments, edge_segments, forward_segments

BW = 500e9
ACT = 512 * 1024 * 2                       # b x s x h in bf16: 1,048,576 bytes
AR = 2 * (2 - 1) / 2 * ACT / BW            # 2.0972 us
AG = RS = (2 - 1) / 2 * ACT / BW           # 1.0486 us
VOCAB = 32768
# the output layer's GEMMs at TP 2: 2 T h (V / 2) FLOP at 1e15 FLOP/s = 17.18 us each (input and weight gradients)
HEAD_GEMM = 2 * 512 * 1024 * (VOCAB // 2) / 1e15


def loss_ar(bytes_per_token: float) -> float:
    """One all-reduce of the loss's per-token figures over the 512 tokens."""
    return 2 * (2 - 1) / 2 * 512 * bytes_per_token / BW


@pytest.fixture
def hw(tmp_path):
    return hardware_variant(tmp_path, {"intra_node.bandwidth": "500 GB/s", "compute.overlap_slowdown": 1.2})


def _chunk(hw, *, training=None, **par):
    s = make_scenario(hardware=hw, model=gpt_model(vocab=VOCAB), training=training,
                      parallel={"tp": 2, **par})
    return build_plan(s).chunks[0]


def test_without_sequence_parallelism_the_embedding_all_reduces_and_the_head_all_reduces_its_input_gradient(hw):
    """Hand: the embedding's forward all-reduce is whole (2.0972 us), its backward none (an all-reduce's backward is
    the identity); the output layer's forward none (eager loss), its backward all-reduce runs under its 17.18 us
    weight gradient: exposed 0, hidden all of it at 0.2 extra = 0.4194 us. A split B waits for it whole."""
    c = _chunk(hw)
    assert c.embed_tp_fwd == pytest.approx(AR, rel=1e-9)
    assert c.embed_tp_bwd == 0.0
    assert c.head_tp_fwd == 0.0
    assert HEAD_GEMM > AR
    assert c.head_tp_bwd == pytest.approx(0.2 * AR, rel=1e-9)
    assert c.head_tp_bwd_alone == pytest.approx(AR, rel=1e-9)


def test_a_stack_without_the_asynchronous_backward_exposes_the_heads_all_reduce_whole(hw):
    c = _chunk(hw, tp_async_allreduce=False)
    assert c.head_tp_bwd == pytest.approx(AR, rel=1e-9)


def test_sequence_parallelism_reduce_scatters_the_embedding_and_gathers_the_heads_input(hw):
    """Hand: embedding forward a reduce-scatter (1.0486 us), backward an all-gather (1.0486 us); the output layer's
    forward an all-gather (1.0486 us); its backward a reduce-scatter of the input gradient, whole (1.0486 us), under
    the layers' convention (Megatron's re-gather under the input-gradient GEMM is not counted, and the
    reduce-scatter is not hidden under the weight gradient)."""
    c = _chunk(hw, sequence_parallel=True)
    assert c.embed_tp_fwd == pytest.approx(RS, rel=1e-9)
    assert c.embed_tp_bwd == pytest.approx(AG, rel=1e-9)
    assert c.head_tp_fwd == pytest.approx(AG, rel=1e-9)
    assert c.head_tp_bwd == pytest.approx(RS, rel=1e-9)
    assert c.head_tp_bwd_alone == pytest.approx(RS, rel=1e-9)


@pytest.mark.parametrize("loss, per_token", [("vocab_parallel", (4, 4, 4)), ("fused", (4, 8)), ("eager", ())])
def test_the_vocabulary_parallel_losses_all_reduce_their_per_token_figures(hw, loss, per_token):
    """Megatron-LM's cross_entropy.py: max, target logit, sum of exponentials (3 x 4 bytes a token); the fused loss:
    the max, then the other two concatenated (4 + 8 bytes a token); 512 tokens: 2.048 ns per 4 bytes."""
    c = _chunk(hw, training={"cross_entropy": loss})
    assert c.head_tp_fwd == pytest.approx(sum(loss_ar(b) for b in per_token), rel=1e-9, abs=1e-18)


def test_tp_1_runs_no_edge_collective(hw):
    s = make_scenario(hardware=hw, model=gpt_model(vocab=VOCAB))
    c = build_plan(s).chunks[0]
    assert (c.embed_tp_fwd, c.embed_tp_bwd, c.head_tp_fwd, c.head_tp_bwd, c.head_tp_bwd_alone) == (0.0,) * 5


def test_the_segments_put_each_collective_beside_its_compute(hw):
    """Forward: embedding, its collective, ..., output layer, its collective; backward: output layer, its
    collective, ..., the embedding's collective, then the embedding; a split W carries none."""
    c = _chunk(hw, sequence_parallel=True, training={"cross_entropy": "vocab_parallel"})
    f = forward_segments(c)
    assert f[:2] == [("compute", "forward", c.embed_fwd, None), ("tp", "tp_comm", c.embed_tp_fwd, None)]
    assert f[-2:] == [("compute", "forward", c.head_fwd, None), ("tp", "tp_comm", c.head_tp_fwd, None)]
    b = backward_segments(c)
    assert b[:2] == [("compute", "backward", c.head_bwd, None), ("tp", "tp_comm", c.head_tp_bwd, None)]
    assert b[-2:] == [("tp", "tp_comm", c.embed_tp_bwd, None), ("compute", "backward", c.embed_bwd, None)]
    head_w, embed_w = edge_segments(c, "weight")
    assert all(seg[0] == "compute" for seg in head_w + embed_w)
    head_b, _ = edge_segments(c, "input")
    assert ("tp", "tp_comm", c.head_tp_bwd_alone, None) in head_b


def test_the_step_exposes_the_edge_collectives_once_per_micro_batch(hw):
    """One GPU group of TP 2, 8 micro-batches: the report's exposed TP time is the layers' collectives plus the edges'
    (2.0972 + 0.4194 us) per micro-batch, by hand."""
    import simtrain

    s = make_scenario(hardware=hw, model=gpt_model(vocab=VOCAB), parallel={"tp": 2})
    r = simtrain.simulate(s)
    c = build_plan(s).chunks[0]
    per_mb = c.layers * (c.tp_fwd_layer + c.tp_bwd_layer) + AR + 0.2 * AR
    assert r.exposed_comm_s["tp"] == pytest.approx(8 * per_mb, rel=1e-6)


def test_a_lane_with_a_slower_ring_times_its_own_overlap(hw):
    """The engine multiplies a lane's TP segments by its ring's scale; the overlap is not linear in the all-reduce,
    so the output layer's segment carries the lane's own exposure. At 10x: AR 20.972 us outlasts the 17.18 us weight
    gradient, exposed (20.972 - 17.18) + 0.2 x 17.18 = 7.228 us, where scaling 0.2 x AR would give 4.194 us."""
    c = _chunk(hw)
    head, _ = edge_segments(c, "full", tp_scale=10.0)
    tp = [seg[2] for seg in head if seg[0] == "tp"]
    assert len(tp) == 1
    assert 10.0 * tp[0] == pytest.approx((10 * AR - HEAD_GEMM) + 0.2 * HEAD_GEMM, rel=1e-9)


def test_a_learned_position_table_makes_the_embedding_all_reduce_under_sequence_parallelism(hw):
    """Megatron's LanguageModelEmbedding reduce-scatters only without a learned position table; with one (GPT-3) it
    all-reduces (2.0972 us), adds the positions and splits to the sequence shards, whose backward all-gathers
    (1.0486 us)."""
    s = make_scenario(hardware=hw, model=gpt_model(vocab=VOCAB, position_embeddings=512),
                      parallel={"tp": 2, "sequence_parallel": True})
    c = build_plan(s).chunks[0]
    assert c.embed_tp_fwd == pytest.approx(AR, rel=1e-9)
    assert c.embed_tp_bwd == pytest.approx(AG, rel=1e-9)


def test_a_split_b_waits_for_the_heads_all_reduce_whole(hw):
    """Without sequence parallelism the whole backward hides the head's all-reduce under its weight gradient
    (0.2 x 2.0972 us exposed); a split B has no weight gradient to hide it under: 2.0972 us; W carries none."""
    c = _chunk(hw)
    head_b, _ = edge_segments(c, "input")
    head_w, _ = edge_segments(c, "weight")
    assert [seg[2] for seg in head_b if seg[0] == "tp"] == [pytest.approx(AR, rel=1e-9)]
    assert not [seg for seg in head_w if seg[0] == "tp"]


def test_zero3_plays_the_edge_collectives_too(hw):
    """ZeRO-3 (its own engine path): two replicas of TP 2, 4 micro-batches each; each lane's exposed TP is the layers'
    collectives plus the edges' 2.0972 + 0.4194 us per micro-batch, by hand."""
    import simtrain

    s = make_scenario(hardware=hw, model=gpt_model(vocab=VOCAB), parallel={"tp": 2, "dp": 2, "zero": 3})
    r = simtrain.simulate(s)
    c = build_plan(s).chunks[0]
    per_mb = c.layers * (c.tp_fwd_layer + c.tp_bwd_layer) + AR + 0.2 * AR
    assert r.exposed_comm_s["tp"] == pytest.approx(4 * per_mb, rel=1e-6)


def test_an_mtp_modules_eh_proj_without_sequence_parallelism(hw):
    """Megatron-Core's MTP eh_proj (a ColumnParallelLinear from the 2h-wide [embedding, hidden] to h, its output
    gathered over the hidden dimension): forward an all-gather of b x s x h (1.0486 us); backward an all-reduce of
    the 2h-wide input gradient, 2 x (2 - 1) / 2 x 2 x ACT / BW = 4.1943 us, under its weight-gradient GEMM: with a
    1 ms GEMM exposed 0 and hidden all of it at 0.2 extra, 0.8389 us; with a 1 us GEMM 3.1943 us exposed + 0.2 x
    1 us. A split B waits for the whole all-reduce."""
    from simtrain.plan.edge_tp import edge_tp
    from simtrain.spec.placement import placement_of

    s = make_scenario(hardware=hw, model=gpt_model(vocab=VOCAB), parallel={"tp": 2})
    ar2 = 2 * (2 - 1) / 2 * 2 * ACT / BW
    e = edge_tp(s, placement_of(s), ACT, 512, 0, head_wgrad=HEAD_GEMM, slowdown=1.2, mtp_wgrad=1e-3)
    assert e.mtp_proj_forward == pytest.approx(AG, rel=1e-9)
    assert e.mtp_proj_backward == pytest.approx(0.2 * ar2, rel=1e-9)
    assert e.mtp_proj_backward_alone == pytest.approx(ar2, rel=1e-9)
    short = edge_tp(s, placement_of(s), ACT, 512, 0, head_wgrad=HEAD_GEMM, slowdown=1.2, mtp_wgrad=1e-6)
    assert short.mtp_proj_backward == pytest.approx(ar2 - 1e-6 + 0.2 * 1e-6, rel=1e-9)


def test_nanotrons_asynchronous_lm_head_hides_its_gathers(hw):
    """nanotron's LM head is an asynchronous column-parallel linear (parallel.tp_async_linears): its input's gather
    (1.0486 us) runs under its own shard's GEMM (17.18 / 2 us), hidden, costing 0.2 of itself at the 1.2 slowdown;
    its backward is Megatron's, under the layers' convention: the reduce-scatter exposed (1.0486 us)."""
    c = _chunk(hw, sequence_parallel=True, tp_async_linears=True)
    assert c.head_tp_fwd == pytest.approx(0.2 * AG, rel=1e-9)
    assert c.head_tp_bwd == pytest.approx(RS, rel=1e-9)
    assert c.head_tp_bwd_alone == pytest.approx(RS, rel=1e-9)
    assert c.embed_tp_fwd == pytest.approx(RS, rel=1e-9)   # nanotron's embedding reduce-scatters as Megatron's
