"""The optimizer step on the host (parallel.offload_optimizer): Megatron-Core's HybridDeviceOptimizer with the whole
shard on the CPU and no copy overlap; its times, the memory ledger, host memory, the rules and the memory advice.

Expected values are hand calculations written here: 4 bytes per parameter each way over PCIe (fp32 gradient down,
fp32 master up), 28 bytes per parameter of CPU Adam traffic (read master, m, v, gradient; write master, m, v) at the
node's DRAM bandwidth split over its GPUs, 16 bytes per parameter in host memory (master, m, v, gradient), and the
GPU's 12 bytes per parameter of Adam state (fp32 master, m, v) that leave it.
"""

from __future__ import annotations

import pytest
from conftest import gpt_model, hardware_variant, make_scenario

from simtrain.decide.estimate import estimate
from simtrain.engine.simulation import memory, simulate
from simtrain.plan.advice import advice
from simtrain.plan.build import build_plan
from simtrain.plan.memory import memory_report, stage_memory
from simtrain.plan.offload_optimizer import host_step
from simtrain.report.trace import trace_events
from simtrain.spec.errors import InputError

PCIE = 10e9          # host link of the test node variant, bytes/s per direction
HOST_BW = 80e9       # the node's DRAM bandwidth in the variant, bytes/s
DP = 4               # GPUs of the node, all in one data-parallel group


def _hw(tmp_path, **extra):
    changes = {"inter_node.pcie_bandwidth": {"value": "10 GB/s", "source": "test"},
               "host_memory_bandwidth": {"value": "80 GB/s", "source": "test"}, **extra}
    return hardware_variant(tmp_path, changes)


def _sc(hw, offload: bool, zero: int = 1, **training):
    return make_scenario(hardware=hw, model=gpt_model(layers=4, hidden=4096, heads=32),
                         training={"seq_len": 256, "global_batch": 8, "optimizer": "adam", **training},
                         parallel={"dp": DP, "zero": zero, "offload_optimizer": offload})


def test_host_step_parts_by_hand():
    """1e9 parameters, 10 GB/s PCIe, 80 GB/s of DRAM over 8 GPUs: 4e9 B / 10 GB/s = 0.4 s each way, 28e9 B / 10 GB/s =
    2.8 s of CPU Adam."""
    step = host_step(1e9, 10e9, 80e9, 8)
    assert (step.d2h, step.cpu, step.h2d) == pytest.approx((0.4, 2.8, 0.4), rel=1e-12)
    assert step.total == pytest.approx(3.6, rel=1e-12)


def test_gpu_memory_falls_by_the_optimizer_bytes(tmp_path):
    """The GPU's Adam shard (12 B per parameter) leaves it; weights and gradients stay; the host holds 16 B per
    parameter of the shard (fp32 master, m, v and the fp32 gradient buffer)."""
    hw = _hw(tmp_path)
    base, off = stage_memory(_sc(hw, False), 0), stage_memory(_sc(hw, True), 0)
    shard = base.params_local / DP                      # ZeRO-1: 1/dp of the stage's parameters on each GPU
    assert base.optimizer == pytest.approx(12 * shard, rel=1e-12)
    assert off.optimizer == 0.0
    assert base.total - off.total == pytest.approx(base.optimizer, rel=1e-12)   # the fixture has no fragmentation
    assert (off.params, off.grads) == (base.params, base.grads)
    assert off.host_optimizer == pytest.approx(16 * shard, rel=1e-12)
    assert base.host_optimizer == 0.0


def test_offloaded_step_is_copies_and_cpu_adam_in_turn(tmp_path):
    """The step grows by d2h + cpu + h2d of the shard (4 B/param / 10 GB/s each way, 28 B/param / (80 GB/s / 4
    GPUs)) less the GPU's own optimizer step, and the report shows the wait as exposed 'offload' time."""
    hw = _hw(tmp_path)
    shard = stage_memory(_sc(hw, False), 0).params_local / DP
    expected = 4 * shard / PCIE + 28 * shard / (HOST_BW / DP) + 4 * shard / PCIE
    base_plan = build_plan(_sc(hw, False))
    base, off = simulate(_sc(hw, False)), simulate(_sc(hw, True))
    assert off.exposed_comm_s["offload"] == pytest.approx(expected, rel=1e-9)
    assert off.step_time_s - base.step_time_s == pytest.approx(expected - base_plan.optimizer_time[0], rel=1e-9)
    assert "offload" not in base.exposed_comm_s


def test_plan_total_is_what_the_estimate_reads(tmp_path):
    """The plan's optimizer time (which the analytic estimate adds) is the sum of the three parts, and on one stage
    without contention the estimate and the engine agree (style rule 5)."""
    sc = _sc(_hw(tmp_path), True)
    plan = build_plan(sc)
    host = plan.optimizer_host[0]
    assert plan.optimizer_time[0] == pytest.approx(host.d2h + host.cpu + host.h2d, rel=1e-15)
    assert estimate(sc).step_time_s == pytest.approx(simulate(sc).step_time_s, rel=1e-12)


def test_host_memory_overflow_does_not_fit(tmp_path):
    """A node whose host memory is below its GPUs' offloaded optimizer state does not fit, with the figures."""
    hw = _hw(tmp_path, host_memory={"value": "1 MB", "source": "test"})
    sc = _sc(hw, True)
    node = DP * 16 * stage_memory(sc, 0).params_local / DP / 1e9
    run = simulate(sc)
    assert not run.fits_in_memory
    assert f"does not fit: offloaded optimizer state {node:.1f} GB > 0.0 GB of host memory per node" in run.warnings


@pytest.mark.parametrize(("change", "message"), [
    ({"zero": 0}, r"offload_optimizer: true with zero 0 is not simulated"),
    ({"zero": 3}, r"offload_optimizer: true with zero 3 is not simulated"),
    ({"optimizer": "sgd"}, r"offload_optimizer: true with optimizer 'sgd' is not simulated"),
])
def test_unmodelled_combinations_are_refused(tmp_path, change, message):
    """ZeRO 0 or 3 and optimizers other than Adam are bad input naming the key."""
    hw = _hw(tmp_path)
    zero = change.get("zero", 1)
    training = {"optimizer": change["optimizer"]} if "optimizer" in change else {}
    with pytest.raises(InputError, match=message):
        _sc(hw, True, zero=zero, **training)


def test_hardware_without_host_figures_is_refused(tmp_path):
    """No host link, or no host memory bandwidth, in the hardware file: bad input naming the missing figure."""
    no_link = hardware_variant(tmp_path, {"host_memory_bandwidth": {"value": "80 GB/s", "source": "test"}}, name="a")
    with pytest.raises(InputError, match=r"needs the GPUs' host link"):
        _sc(no_link, True)
    no_bw = hardware_variant(tmp_path, {"inter_node.pcie_bandwidth": {"value": "10 GB/s", "source": "test"}}, name="b")
    with pytest.raises(InputError, match=r"needs the host's memory bandwidth"):
        _sc(no_bw, True)


def test_memory_advice_offers_offload_where_it_makes_the_run_fit(tmp_path):
    """A GPU just too small for its Adam shard: the 'try:' lines name offload_optimizer with the hand-computed wait;
    one far too small for the weights alone gets no such line."""
    hw = _hw(tmp_path)
    base = stage_memory(_sc(hw, False), 0)
    shard = base.params_local / DP
    wait = 8 * shard / PCIE + 28 * shard / (HOST_BW / DP)
    fits_without = base.total - base.optimizer / 2          # capacity between the two peaks
    tight = _hw(tmp_path, **{"gpu.memory": {"value": f"{fits_without:.0f} B", "source": "test"}})
    tips = advice(_sc(tight, False), memory_report(_sc(tight, False)))
    line = next(t for t in tips if "parallel.offload_optimizer: true" in t)
    assert f"waits {wait:.2f} s" in line
    tiny = _hw(tmp_path, **{"gpu.memory": {"value": f"{base.params / 2:.0f} B", "source": "test"}})
    assert not any("offload_optimizer" in t for t in advice(_sc(tiny, False), memory_report(_sc(tiny, False))))


def test_trace_draws_the_host_step_on_its_own_row(tmp_path):
    """The trace has a 'host offload' thread holding the gradient copy, the CPU step and the weight copy, in turn."""
    events = trace_events(simulate(_sc(_hw(tmp_path), True)))["traceEvents"]
    tid = next(e["tid"] for e in events if e.get("ph") == "M" and e["args"].get("name") == "host offload")
    slices = sorted((e["ts"], e["name"]) for e in events if e.get("ph") == "X" and e["tid"] == tid and e["pid"] == 1)
    assert [name for _ts, name in slices] == ["optimizer_d2h", "optimizer_cpu", "optimizer_h2d"]


def test_memory_command_reports_and_checks_host_memory(tmp_path):
    """`simtrain memory` (no simulation) gives each stage's host bytes (16 B per shard parameter) and, as a run does,
    calls a node over its host memory a 'does not fit'."""
    roomy = memory(_sc(_hw(tmp_path), True))
    shard = stage_memory(_sc(_hw(tmp_path), False), 0).params_local / DP
    assert roomy.stages[0].host_memory_bytes == pytest.approx(16 * shard, rel=1e-12)
    assert roomy.fits_in_memory and roomy.to_dict()["stages"][0]["host_memory_bytes"] == round(16 * shard)
    assert "host_memory_bytes" not in memory(_sc(_hw(tmp_path), False)).to_dict()["stages"][0]
    tight = memory(_sc(_hw(tmp_path, host_memory={"value": "1 MB", "source": "test"}), True))
    assert not tight.fits_in_memory
    assert any(w.startswith("does not fit: offloaded optimizer state") for w in tight.warnings)
