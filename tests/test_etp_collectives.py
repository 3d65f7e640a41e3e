"""Expert tensor parallelism (etp > 1) with the alltoall dispatcher: Megatron-Core's MoEAlltoAllTokenDispatcher
all-gathers the rows each GPU received (BF16) and their probabilities (fp32) over the expert-TP group after the EP
all-to-all, and reduce-scatters the experts' output in fp32 before the combine (token_dispatcher.py @d98e8a6); the
backward mirrors each. Expected times are ring times by hand: (n - 1) steps of latency + (n - 1)/n x S / B."""

from __future__ import annotations

import pytest
from conftest import hardware_variant, make_scenario

from simtrain.engine.simulation import simulate
from simtrain.plan.build import build_plan
from simtrain.plan.build_moe import ep_time, etp_time
from simtrain.plan.memory_moe import moe_shape
from simtrain.spec.placement import placement_of

B = 100e9            # NVLink per direction in the test file
LATENCY = 1e-6       # GPU -> NVSwitch -> GPU
SEQ, HIDDEN, TOP_K, EXPERTS = 1024, 1024, 2, 8


def _scenario(tmp_path, etp=2, **parallel):
    hw = hardware_variant(tmp_path, {"intra_node.bandwidth": "100 GB/s", "intra_node.latency": "1 us"})
    model = {"layers": 2, "hidden": HIDDEN, "heads": 16, "ffn_hidden": 4096, "vocab": 8,
             "moe": {"experts": EXPERTS, "top_k": TOP_K, "expert_ffn_hidden": 512}}
    return make_scenario(hardware=hw, nodes=1, gpus_per_node=8, model=model,
                         training={"seq_len": SEQ, "global_batch": 4, "micro_batch": 1, "dropout": False},
                         parallel={"dp": 4, "tp": 2, "pp": 1, "ep": 4, "etp": etp, "sequence_parallel": True,
                                   **parallel})


def _ring(nbytes, n=2):
    """A ring all-gather (S = gathered output) or reduce-scatter (S = input) of n GPUs over NVSwitch, alone."""
    return (n - 1) * LATENCY + (n - 1) / n * nbytes / B


# rows one GPU holds after the all-gather: its b s / tp tokens x top_k, gathered over etp = 2 (balanced routing)
ROWS = SEQ / 2 * TOP_K * 2
TOKENS_BF16, PROBS_FP32, OUTPUT_FP32 = ROWS * HIDDEN * 2, ROWS * 4, ROWS * HIDDEN * 4


def test_ring_time_by_hand(tmp_path):
    """etp 2 on one node: forward = AG(rows x h x 2) + AG(rows x 4) + RS(rows x h x 4), each a 2-GPU ring on
    100 GB/s NVLink with 1 us a step; the backward mirrors the kinds at the same sizes, so it takes the same."""
    sc = _scenario(tmp_path)
    fwd, bwd = etp_time(sc, placement_of(sc), moe_shape(sc), 0, 2)
    expected = _ring(TOKENS_BF16) + _ring(PROBS_FP32) + _ring(OUTPUT_FP32)
    assert fwd == pytest.approx(expected, rel=1e-12)
    assert bwd == pytest.approx(expected, rel=1e-12)


def test_etp_groups_are_consecutive(tmp_path):
    """Megatron-Core's folding puts expert-TP rank j mod etp on local GPU j: the groups are pairs 0-1, 2-3, ..."""
    sc = _scenario(tmp_path)
    assert placement_of(sc).etp_groups(0) == [[0, 1], [2, 3], [4, 5], [6, 7]]


def test_the_ep_lane_plays_them(tmp_path):
    """A MoE layer's EP time is its all-to-alls plus the expert-TP collectives, forward and backward alike."""
    sc = _scenario(tmp_path)
    chunk = build_plan(sc).chunks[0]
    a2a = ep_time(sc, placement_of(sc), moe_shape(sc), 0, 2)
    hand = _ring(TOKENS_BF16) + _ring(PROBS_FP32) + _ring(OUTPUT_FP32)
    assert a2a > 0
    assert chunk.ep_fwd_layer == pytest.approx(a2a + hand, rel=1e-12)
    assert chunk.ep_bwd_layer == pytest.approx(a2a + hand, rel=1e-12)


def test_none_with_etp_one(tmp_path):
    """etp 1: no expert-TP collective (tp 2 splits attention only; the experts are whole on each EP rank)."""
    sc = _scenario(tmp_path, etp=1, ep=8)
    assert etp_time(sc, placement_of(sc), moe_shape(sc), 0, 2) == (0.0, 0.0)


def test_run_exposes_them(tmp_path):
    """In a run (ep 1 so that nothing else is on the EP lane), the step's exposed EP time is 2 layers x 1
    micro-batch x (forward + backward) x the hand ring time."""
    sc = _scenario(tmp_path, ep=1, dp=4)
    hand = _ring(SEQ * TOP_K * HIDDEN * 2) + _ring(SEQ * TOP_K * 4) + _ring(SEQ * TOP_K * HIDDEN * 4)
    assert simulate(sc).exposed_comm_s["ep"] == pytest.approx(2 * 1 * 2 * hand, rel=1e-9)
