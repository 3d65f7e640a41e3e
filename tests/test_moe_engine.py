"""Expert parallelism: the EP all-to-all on the cluster graph, the MoE layer in the engine, its reports and FLOPs.

Expected values come from the hardware file's numbers and closed forms written here, never from the code under test:
dgx-h100 has 450 GB/s of NVLink per GPU at efficiency 0.82 and 0.6 us per message, 400 Gb/s per NIC at efficiency
0.94 and 14 us, one NIC per GPU (hardware/dgx-h100.yaml).
"""

from __future__ import annotations

import pytest
from conftest import make_scenario

from simtrain.engine.simulation import simulate
from simtrain.plan.collectives import all_to_all_shape, phase_time_alone
from simtrain.plan.flops import model_flops_per_token
from simtrain.spec.errors import InputError

NVLINK = 450e9 * 0.82      # bytes/s per GPU per direction
NVLINK_LATENCY = 0.6e-6    # GPU -> NVSwitch -> GPU
NIC = 400e9 / 8 * 0.94
NIC_LATENCY = 14e-6


def _qwen(model="qwen3-30b-a3b", **parallel):
    return make_scenario(hardware="dgx-h100", nodes=2, model=model,
                         training={"seq_len": 4096, "global_batch": 32, "micro_batch": 1, "dropout": False},
                         parallel={"dp": 16, "tp": 1, "pp": 1, **parallel})


def test_all_to_all_closed_form_in_one_node():
    """8 GPUs of one node: (n - 1)/n x bytes / NVLink bandwidth per GPU + one message latency."""
    cluster = _qwen(ep=8).cluster
    shape = all_to_all_shape([list(range(8))], cluster)
    nbytes = 64e6
    expected = 7 / 8 * nbytes / NVLINK + NVLINK_LATENCY
    assert phase_time_alone(shape.phase(nbytes), cluster) == pytest.approx(expected, rel=1e-12)


def test_all_to_all_across_nodes_is_nic_bound():
    """16 GPUs over 2 nodes: each GPU's 8 remote pair flows share its one NIC: 8/16 x bytes / NIC bandwidth
    (+ the NIC route's latency): over 4x slower than inside the node."""
    cluster = _qwen(ep=16).cluster
    nbytes = 64e6
    inside = phase_time_alone(all_to_all_shape([list(range(8))], cluster).phase(nbytes), cluster)
    across_shape = all_to_all_shape([list(range(16))], cluster)
    across = phase_time_alone(across_shape.phase(nbytes), cluster)
    assert across - across_shape.latency == pytest.approx(8 / 16 * nbytes / NIC, rel=1e-12)
    assert across_shape.latency >= NIC_LATENCY
    expected = (8 / 16 * nbytes / NIC + across_shape.latency) / (7 / 8 * nbytes / NVLINK + NVLINK_LATENCY)
    assert across / inside == pytest.approx(expected, rel=1e-12) and across / inside > 4


def test_ep_time_in_the_run_follows_the_dispatched_bytes():
    """The EP time of one run: 4 all-to-alls per MoE layer and micro-batch (dispatch and combine, forward and
    backward), each T k h e bytes per GPU: 4096 x 8 x 2048 x 2 (Qwen3-30B-A3B, EP 8 in one node)."""
    sc = _qwen(ep=8)
    result = simulate(sc)
    nbytes = 4096 * 8 * 2048 * 2
    one = 7 / 8 * nbytes / NVLINK + NVLINK_LATENCY
    microbatches = 32 // 16
    assert result.exposed_comm_s["ep"] == pytest.approx(4 * one * 48 * microbatches, rel=1e-9)
    assert result.config["placement"]["ep_group_crosses_nodes"] is False


def test_ep_key_only_for_moe_models():
    """Dense reports keep their keys: no 'ep' in exposed_comm_s, busy_s or the parallel section."""
    dense = simulate(make_scenario(hardware="dgx-h100", nodes=1, model="llama2-7b",
                                   training={"seq_len": 2048, "global_batch": 8}, parallel={"dp": 8}))
    assert "ep" not in dense.exposed_comm_s and "ep" not in dense.config["parallel"]
    assert "ep" not in dense.devices[0].busy_s
    moe = simulate(_qwen(ep=8))
    assert "ep" in moe.exposed_comm_s and moe.devices[0].busy_s["ep"] > 0


def test_crossing_nodes_slows_the_step():
    """EP 16 over two nodes sends half its tokens through the NICs: slower than EP 8 inside a node."""
    assert simulate(_qwen(ep=16)).exposed_comm_s["ep"] > 3 * simulate(_qwen(ep=8)).exposed_comm_s["ep"]


def test_imbalance_slows_the_most_loaded_rank():
    """moe.imbalance 1.5: the most loaded rank receives 1.5x the tokens; its all-to-alls take 1.5x the bytes."""
    base = _qwen(ep=8)
    model = base.model.model_dump()
    model["moe"]["imbalance"] = 1.5
    slow = simulate(_qwen(model=model, ep=8))
    fast = simulate(base)
    assert slow.step_time_s > fast.step_time_s
    latency_part = 4 * NVLINK_LATENCY * 48 * 2
    assert (slow.exposed_comm_s["ep"] - latency_part) == pytest.approx(
        1.5 * (fast.exposed_comm_s["ep"] - latency_part), rel=1e-9)


def test_active_flops_qwen3_30b():
    """Qwen3-30B-A3B at s = 4096: 6 x (48 x (attention 4096 x 2048 + 2 x 512 x 2048 + 2048 x 4096, router
    128 x 2048, 8 experts x 3 x 2048 x 768) + head 151936 x 2048) + 12 x 48 x 4096 x (32 x 128). Megatron-Bridge's
    23.006 GFLOP/token (moe.md section 2.1) leaves out the router and halves the scores: the same figure then."""
    per_layer = 4096 * 2048 + 2 * 512 * 2048 + 2048 * 4096 + 128 * 2048 + 8 * 3 * 2048 * 768
    weights = 48 * per_layer + 151936 * 2048
    scores = 12 * 48 * 4096 * 32 * 128
    got = model_flops_per_token(_qwen(ep=8))
    assert got == pytest.approx(6 * weights + scores, rel=1e-12)
    bridge = got - 6 * 48 * 128 * 2048 - scores / 2
    assert bridge / 1e9 == pytest.approx(23.006, abs=0.0005)


@pytest.mark.parametrize(("parallel", "field", "says"), [
    ({"ep": 3}, "parallel.ep", "3 does not divide experts=128"),
    ({"ep": 32}, "parallel.ep", "etp x ep = 1 x 32 = 32 does not divide tp x dp = 1 x 16 = 16"),
    ({"ep": 8, "moe_dispatcher": "hybridep"}, "parallel.moe_dispatcher",
     "'hybridep' within one NVLink domain on H100-SXM5-80GB is not simulated"),
])
def test_ep_rules(parallel, field, says):
    """EP that does not fold onto the experts or the GPUs is refused, naming the key."""
    with pytest.raises(InputError) as exc:
        _qwen(**parallel)
    assert exc.value.field == field and exc.value.message.startswith(says)


def test_ep_on_a_dense_model_is_refused():
    """ep > 1 without experts is refused, naming parallel.ep."""
    with pytest.raises(InputError) as exc:
        make_scenario(hardware="dgx-h100", nodes=1, model="llama2-7b", training={"seq_len": 2048, "global_batch": 8},
                      parallel={"dp": 8, "ep": 2})
    assert exc.value.field == "parallel.ep" and "no experts" in exc.value.message


@pytest.mark.parametrize("preset", ["mixtral-8x7b", "qwen3-30b-a3b", "gpt-oss-120b"])
def test_presets_run(preset):
    """Each MoE preset runs one step with its EP all-to-alls in the timeline."""
    sc = make_scenario(hardware="dgx-h100", nodes=1, model=preset,
                       training={"seq_len": 2048, "global_batch": 16, "recompute": "full"},
                       parallel={"dp": 8, "ep": 8 if preset != "mixtral-8x7b" else 4, "zero": 1})
    result = simulate(sc)
    assert result.step_time_s > 0 and any(r[1] == "ep" for r in result.timeline.records)
