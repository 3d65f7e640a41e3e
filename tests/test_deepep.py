"""parallel.moe_dispatcher: deepep, DeepEP's normal kernels timed from its published H800 figures
(deepseek-ai/DeepEP docs/legacy.md: NVLink 153/158 GB/s of ~160, RDMA EP16 43/43 GB/s of ~50) on the cluster graph."""

from __future__ import annotations

from math import comb

import pytest
from conftest import make_scenario

from simtrain.engine.simulation import simulate
from simtrain.plan.deepep import deepep_time, ep_overlap_slowdown
from simtrain.plan.memory_moe import moe_shape
from simtrain.spec.errors import InputError
from simtrain.spec.placement import placement_of

NVLINK = 450e9 * 0.82      # bytes/s per GPU per direction (hardware/dgx-h100.yaml intra_node bandwidth x efficiency)
NVLINK_LATENCY = 0.6e-6    # GPU -> NVSwitch -> GPU
NIC = 400e9 / 8 * 0.94     # hardware/dgx-h100.yaml inter_node nic_bandwidth x efficiency
NIC_LATENCY = 14e-6
TOKEN_BYTES = 4096 * 2048 * 2   # one micro-batch of Qwen3-30B-A3B: seq 4096 x hidden 2048 x BF16


def _qwen(nodes=2, **parallel):
    return make_scenario(hardware="dgx-h100", nodes=nodes, model="qwen3-30b-a3b",
                         training={"seq_len": 4096, "global_batch": 16 * nodes, "micro_batch": 1, "dropout": False},
                         parallel={"dp": 8 * nodes, "tp": 1, "pp": 1, "moe_dispatcher": "deepep", **parallel})


def _time(sc):
    return deepep_time(sc, placement_of(sc), moe_shape(sc), 0)


def test_one_node_closed_form():
    """EP 8 in one node: tokens x distinct ranks (8 x (1 - C(112,8)/C(128,8)) of 128 experts, top 8) x h x 2 bytes
    at 153/160 (dispatch) and 158/160 (combine) of the NVLink bandwidth, plus one latency each."""
    ranks = 8 * (1 - comb(112, 8) / comb(128, 8))          # 5.30 of 8 ranks per token
    logical = TOKEN_BYTES * ranks
    expected = sum(logical / (NVLINK * eff) + NVLINK_LATENCY for eff in (153 / 160, 158 / 160))
    assert _time(_qwen(nodes=1, ep=8)) == pytest.approx(expected, rel=1e-12)


def test_two_nodes_closed_form():
    """EP 16 over 2 nodes: the RDMA hop (tokens x distinct nodes 2 x (1 - C(64,8)/C(128,8)) x h x 2 at 43/50 of the
    NIC) is slower than the NVLink hop (distinct ranks of 16) and sets each kernel's time."""
    nodes = 2 * (1 - comb(64, 8) / comb(128, 8))
    rdma = TOKEN_BYTES * nodes / (NIC * 43 / 50) + NIC_LATENCY
    ranks = 16 * (1 - comb(120, 8) / comb(128, 8))
    nvl = TOKEN_BYTES * ranks / (NVLINK * 153 / 160) + NVLINK_LATENCY
    assert rdma > nvl
    assert _time(_qwen(nodes=2, ep=16)) == pytest.approx(2 * rdma, rel=1e-12)


def test_deepep_beats_alltoall_across_nodes():
    """Across nodes DeepEP sends a token once per node instead of once per expert: per GPU over its NIC
    1.99 T h e at 43/50 of the NIC against the NCCL all-to-all's k x (n - l)/n = 8 x 8/16 = 4 T h e at the full NIC,
    so its EP time in a run is (1.99 / 0.86) / 4 = 0.58 of the all-to-all's (message latencies aside)."""
    deep = simulate(_qwen(nodes=2, ep=16)).exposed_comm_s["ep"]
    nccl = simulate(_qwen(nodes=2, ep=16, moe_dispatcher="alltoall")).exposed_comm_s["ep"]
    hand = 2 * (1 - comb(64, 8) / comb(128, 8)) / (43 / 50) / 4
    assert deep < nccl
    assert deep / nccl == pytest.approx(hand, rel=0.02)


def test_overlap_slowdown_is_the_sms_taken():
    """Under EP overlap, compute keeps 132 - 20 of the H100's 132 SMs (Megatron-Core gives DeepEP 20)."""
    sc = _qwen(nodes=1, ep=8)
    assert ep_overlap_slowdown(sc, False) == pytest.approx(132 / 112, rel=1e-12)


@pytest.mark.parametrize(("change", "says"), [
    ({"ep": 8, "moe_dispatcher": "hybridep"}, "'hybridep' within one NVLink domain on H100-SXM5-80GB is not simulated"),
    ({"ep": 4, "etp": 2}, "'deepep' with expert tensor parallelism (etp 2)"),
])
def test_refusals(change, says):
    """What DeepEP (and HybridEP, tests/test_hybridep.py) cannot be timed for is refused, naming
    parallel.moe_dispatcher."""
    with pytest.raises(InputError) as exc:
        _qwen(nodes=1, **change)
    assert exc.value.field == "parallel.moe_dispatcher" and exc.value.message.startswith(says)
