"""Activation-offload copies as flows on the cluster graph (engine/host_copies.py): each copy crosses its GPU's PCIe
link to the NIC; alone the compute waits what the closed form (plan.offload.offload_stalls) says, and a DP flow on
the same link slows the copy by the equal share per flow the fluid network gives (engine/fluid.py)."""

from __future__ import annotations

import pytest
import simpy
from conftest import gpt_model, make_scenario

from simtrain.engine.fluid import FluidNetwork, LinkCapacity
from simtrain.engine.host_copies import HostCopies
from simtrain.engine.lane import Lane
from simtrain.engine.simulation import simulate
from simtrain.plan.build import build_plan
from simtrain.plan.collectives import Phase
from simtrain.plan.offload import offload_stalls

PCIE = 64e9                     # dgx-h100 inter_node.pcie_bandwidth, bytes/s per direction
D2H = ("gpu0", "nic0.0")        # GPU 0's x16 link towards its NIC (and the host)


def _two_nodes(**parallel):
    """A GPT of 8 layers on two DGX H100 (dp 16: the DP rings cross every GPU's PCIe link to its NIC), 2 offloaded."""
    return make_scenario(hardware="dgx-h100", nodes=2, model=gpt_model(layers=8),
                         training={"seq_len": 2048, "global_batch": 64, "activation_offload_layers": 2},
                         parallel={"dp": 16, **parallel})


def test_copies_ride_on_the_gpus_pcie_link():
    """Lane 0 (folded: replica 0, stage 0) copies on gpu0 -> nic0.0 and back, at the link's 64 GB/s."""
    plan = build_plan(_two_nodes())
    env = simpy.Environment()
    copies = HostCopies(env, FluidNetwork(env, LinkCapacity(plan.scenario.cluster, {})), plan, lambda *a: None)
    assert copies.links(Lane(index=0, dp=None, rank=0)) == (D2H, D2H[::-1], PCIE)


def test_alone_on_the_link_the_waits_are_the_closed_form():
    """DP synchronised after the backward (overlap_dp off), nothing else crosses the PCIe link during the copies:
    the exposed offload time is the micro-batches times offload_stalls' waits for the chunk's layer times."""
    sc = _two_nodes(zero=1)
    sc = sc.with_overrides({"simulation.overlap_dp": False})
    c = build_plan(sc).chunks[0]
    f, b = c.fwd_layer + c.tp_fwd_layer, c.bwd_layer + c.tp_bwd_layer
    f_wait, b_wait = offload_stalls([f] * 8, [b] * 8, c.offload_copy_s, 2)
    expected = sc.microbatches * (sum(f_wait) + sum(b_wait))
    assert expected > 0
    assert simulate(sc).exposed_comm_s["offload"] == pytest.approx(expected, rel=1e-9)


def test_a_dp_flow_on_the_link_stretches_the_copy():
    """A copy of c seconds and a DP flow of D = B c / 4 bytes start together on GPU 0's PCIe link (B = 64 GB/s):
    each gets B / 2 while both run, so the DP flow ends at 2D / B = c / 2, and the copy, which has moved B c / 4
    by then and moves the rest at B, at c + D / B = 5c / 4."""
    plan = build_plan(_two_nodes())
    c = plan.chunks[0]
    copy_s, dp_bytes = c.offload_copy_s, PCIE * c.offload_copy_s / 4
    env = simpy.Environment()
    net = FluidNetwork(env, LinkCapacity(plan.scenario.cluster, {}))
    records, ends = [], {}
    copies = HostCopies(env, net, plan, lambda *rec: records.append(rec))
    lane = Lane(index=0, dp=None, rank=0)
    lane.exposed["offload"] = 0.0
    copies.begin(lane)

    def forward():
        yield from copies.after_forward(lane, c, 0, 0, 0)   # layer 0's activations leave, no wait (window: 3)

    def dp():
        yield from net.run_phase(Phase(flow_bytes=dp_bytes, latency=0.0, links=((D2H, 1),)))
        ends["dp"] = env.now

    env.process(forward())
    env.process(dp())
    env.run()
    assert ends["dp"] == pytest.approx(2 * dp_bytes / PCIE, rel=1e-9)
    (_lane, stream, kind, start, end, *_rest), = records
    assert (stream, kind, start) == ("offload", "offload_d2h", 0.0)
    assert end == pytest.approx(copy_s + dp_bytes / PCIE, rel=1e-9)


def test_a_copy_the_other_way_does_not_meet_it():
    """The link is full duplex (one capacity per direction): a reload (host to device) beside a DP flow leaving
    the GPU takes its c seconds alone."""
    plan = build_plan(_two_nodes())
    c = plan.chunks[0]
    env = simpy.Environment()
    net = FluidNetwork(env, LinkCapacity(plan.scenario.cluster, {}))
    records = []
    copies = HostCopies(env, net, plan, lambda *rec: records.append(rec))
    lane = Lane(index=0, dp=None, rank=0)
    lane.exposed["offload"] = 0.0
    copies.begin(lane)

    def backward():   # the head's backward done: before layer 7 (group 1's window) its reload is issued
        yield from copies.before_backward(lane, c, 7, 0, 0)

    env.process(backward())
    env.process(net.run_phase(Phase(flow_bytes=PCIE * c.offload_copy_s, latency=0.0, links=((D2H, 1),))))
    env.run()
    (_lane, _stream, kind, start, end, *_rest), = records
    assert kind == "offload_h2d" and end - start == pytest.approx(c.offload_copy_s, rel=1e-9)


def test_full_fidelity_agrees_with_folded():
    """ZeRO-2 reduce-scatters every micro-batch's gradients while the reloads run, on the same PCIe links: the 16
    replica lanes, each copying on its own GPU's link, give the folded run's step, exposed and busy offload; the
    copies are slower than alone (4 copies of c per micro-batch)."""
    sc = _two_nodes(zero=2)
    folded, full = simulate(sc, fidelity="folded"), simulate(sc, fidelity="full")
    assert full.step_time_s == pytest.approx(folded.step_time_s, rel=1e-12)
    assert full.exposed_comm_s["offload"] == pytest.approx(folded.exposed_comm_s["offload"], rel=1e-12)
    assert full.devices[0].busy_s["offload"] == pytest.approx(folded.devices[0].busy_s["offload"], rel=1e-12)
    alone = sc.microbatches * 4 * build_plan(sc).chunks[0].offload_copy_s
    assert folded.devices[0].busy_s["offload"] > alone * (1 + 1e-6)
