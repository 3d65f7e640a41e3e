"""parallel.moe_dispatcher: hybridep, NVIDIA's HybridEP timed from its published Torch-API bandwidths
(deepseek-ai/DeepEP branch hybrid-ep, docs/README_Hybrid-EP.md: H100 EP 16-64 IB bandwidth, B200 EP 8 NVLink
bandwidth) on the cluster graph; every expected value is the published figure and the hypergeometric count of a
token's destinations."""

from __future__ import annotations

from math import comb

import pytest
from conftest import make_scenario

from simtrain.engine.simulation import simulate
from simtrain.plan.deepep import ep_overlap_slowdown
from simtrain.plan.hybridep import hybridep_time
from simtrain.plan.memory_moe import moe_shape
from simtrain.spec.errors import InputError
from simtrain.spec.placement import placement_of

NIC_LATENCY = 14e-6          # hardware/dgx-h100.yaml inter_node latency (the RDMA hop's path)
NVLINK_LATENCY = 0.6e-6      # hardware/dgx-b200.yaml intra_node latency, GPU -> NVSwitch -> GPU
TOKENS, HIDDEN = 4096, 7168  # the README's test configuration: 4,096 tokens a rank, hidden 7,168, top 8
TOKEN_BYTES = TOKENS * HIDDEN * 2                                  # BF16


def _published_config(hardware, nodes, experts, gpus_per_node=8, **parallel):
    """The README's configuration: 8 local experts a rank, top 8, one micro-batch of 4,096 tokens."""
    model = {"layers": 2, "hidden": HIDDEN, "heads": 56, "ffn_hidden": 2048, "vocab": 1024,
             "moe": {"experts": experts, "top_k": 8, "expert_ffn_hidden": 256}}
    gpus = nodes * gpus_per_node
    return make_scenario(hardware=hardware, nodes=nodes, gpus_per_node=gpus_per_node, model=model,
                         training={"seq_len": TOKENS, "global_batch": gpus, "micro_batch": 1, "dropout": False},
                         parallel={"dp": gpus, "tp": 1, "pp": 1, "ep": experts // 8, "moe_dispatcher": "hybridep",
                                   **parallel})


def _time(sc):
    return hybridep_time(sc, placement_of(sc), moe_shape(sc), 0)


def test_h100_ep16_is_the_published_figure():
    """EP 16 on two DGX H100 at the README's configuration: (token, node) pairs, 2 x (1 - C(64,8)/C(128,8)) a token,
    x 7168 x 2 bytes at the published 16-SM Torch-API IB bandwidth (dispatch 54.47, combine 53.35 GB/s) over the
    400 Gb/s NIC, plus the path latency each."""
    nodes = 2 * (1 - comb(64, 8) / comb(128, 8))
    logical = TOKEN_BYTES * nodes
    expected = logical / 54.47e9 + NIC_LATENCY + logical / 53.35e9 + NIC_LATENCY
    assert _time(_published_config("dgx-h100", 2, 128)) == pytest.approx(expected, rel=1e-12)


def test_h100_ep64_is_the_published_figure():
    """EP 64 on eight DGX H100 (512 experts): 8 x (1 - C(448,8)/C(512,8)) nodes a token at 41.24 and 46.57 GB/s."""
    nodes = 8 * (1 - comb(448, 8) / comb(512, 8))
    logical = TOKEN_BYTES * nodes
    expected = logical / 41.24e9 + NIC_LATENCY + logical / 46.57e9 + NIC_LATENCY
    assert _time(_published_config("dgx-h100", 8, 512)) == pytest.approx(expected, rel=1e-12)


def test_h100_three_nodes_interpolate():
    """EP 24 over three nodes lies between the published 2 and 4 nodes: the mean of their figures,
    (54.47 + 47.36) / 2 dispatch and (53.35 + 52.53) / 2 combine, with 3 x (1 - C(128,8)/C(192,8)) nodes a token."""
    nodes = 3 * (1 - comb(128, 8) / comb(192, 8))
    logical = TOKEN_BYTES * nodes
    expected = logical / ((54.47e9 + 47.36e9) / 2) + logical / ((53.35e9 + 52.53e9) / 2) + 2 * NIC_LATENCY
    assert _time(_published_config("dgx-h100", 3, 192)) == pytest.approx(expected, rel=1e-12)


def test_b200_ep8_is_the_published_figure():
    """EP 8 in one DGX B200 (64 experts): tokens received, 8 x (1 - C(56,8)/C(64,8)) ranks a token, x 7168 x 2 at
    the published 16-SM Torch-API NVLink bandwidth (dispatch 535.94, combine 530.86 GB/s) over 900 GB/s."""
    ranks = 8 * (1 - comb(56, 8) / comb(64, 8))
    logical = TOKEN_BYTES * ranks
    expected = logical / 535.94e9 + NVLINK_LATENCY + logical / 530.86e9 + NVLINK_LATENCY
    assert _time(_published_config("dgx-b200", 1, 64)) == pytest.approx(expected, rel=1e-12)


def test_a_run_plays_the_planned_time():
    """Qwen3-30B-A3B, EP 16 on two DGX H100, nothing else on the links: the EP time of a step is 2 micro-batches x
    48 layers x (forward + backward) x the kernel pair's time, (2 x (1 - C(64,8)/C(128,8))) x 4096 x 2048 x 2 bytes
    at 54.47 and 53.35 GB/s plus latencies."""
    sc = make_scenario(hardware="dgx-h100", nodes=2, model="qwen3-30b-a3b",
                       training={"seq_len": 4096, "global_batch": 32, "micro_batch": 1, "dropout": False},
                       parallel={"dp": 16, "tp": 1, "pp": 1, "ep": 16, "moe_dispatcher": "hybridep"})
    logical = 4096 * 2048 * 2 * 2 * (1 - comb(64, 8) / comb(128, 8))
    pair = logical / 54.47e9 + logical / 53.35e9 + 2 * NIC_LATENCY
    assert simulate(sc).exposed_comm_s["ep"] == pytest.approx(2 * 48 * 2 * pair, rel=1e-6)


def test_overlap_slowdown_is_the_sms_taken():
    """Under EP overlap HybridEP keeps the 32 SMs Megatron-Bridge gives it: compute runs on 148 - 32 of B200's 148."""
    sc = _published_config("dgx-b200", 1, 64, ep_overlap=True)
    assert ep_overlap_slowdown(sc, False) == pytest.approx(148 / 116, rel=1e-12)


@pytest.mark.parametrize(("hardware", "nodes", "experts", "parallel", "field", "says"), [
    ("dgx-h100", 1, 64, {}, "parallel.moe_dispatcher", "'hybridep' within one NVLink domain on H100-SXM5-80GB"),
    ("dgx-b200", 2, 128, {}, "parallel.moe_dispatcher", "'hybridep' across NVLink domains on B200-SXM-180GB"),
    ("dgx-h100", 16, 1024, {}, "parallel.ep", "128 with the hybridep dispatcher spans 16 NVLink domains"),
    ("dgx-h100", 3, 96, {"pp": 2, "dp": 12}, "parallel.ep", "12 with the hybridep dispatcher puts GPUs 0-11"),
    ("dgx-b200", 1, 64, {"ep": 4, "etp": 2}, "parallel.moe_dispatcher", "'hybridep' with expert tensor parallelism"),
])
def test_refusals(hardware, nodes, experts, parallel, field, says):
    """What HybridEP's published figures do not cover is refused, naming the key: the GPU of each hop, more than
    8 NVLink domains, EP groups split unevenly over domains (8 + 4 here), expert TP."""
    with pytest.raises(InputError) as exc:
        _published_config(hardware, nodes, experts, **parallel)
    assert exc.value.field == field and says in exc.value.message


def test_the_search_lists_only_the_ep_hybridep_can_run():
    """Rule: the search does not list hybridep layouts the scope rules refuse whatever the placement (found by
    review: 72% of a small search's layouts were screened only to be refused). On two DGX H100 nodes (8-GPU
    domains) an EP group of 8 or fewer GPUs lies in one domain or in parts under 8, both refused, so only ep 1 and
    16 are listed; every listed layout passes the hybridep rules."""
    from simtrain.decide.search import enumerate_layouts, screen
    from simtrain.decide.sweep import ScenarioPayload

    sc = make_scenario(hardware="dgx-h100", nodes=2,
                       model={"layers": 2, "hidden": 256, "heads": 4, "ffn_hidden": 512, "vocab": 128,
                              "moe": {"experts": 32, "top_k": 2, "expert_ffn_hidden": 128}},
                       training={"seq_len": 256, "global_batch": 16, "micro_batch": 1, "dropout": False},
                       parallel={"dp": 16, "ep": 16, "moe_dispatcher": "hybridep"})
    layouts = enumerate_layouts(sc, fix={"parallel.pp": 1, "parallel.zero": 1, "training.precision": "bf16"})
    assert {x["ep"] for x in layouts} == {1, 16}
    rows = screen(ScenarioPayload.of(sc), {}, layouts)
    assert not [r["error"] for r in rows if "hybridep" in r.get("error", "")]
