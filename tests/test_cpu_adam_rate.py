"""The CPU Adam step's rate (plan.offload_optimizer): a measured CPU-Adam rate on a named host, as a fraction of that
host's peak DRAM bandwidth, applied to the target host's peak.

Cited figures the hand calculations start from (hardware/dgx-h100.yaml gives each source in full):
- ZeRO-Offload (Ren et al., USENIX ATC 2021, arXiv:2101.06840) Table 4: CPU-Adam steps 10 billion parameters in
  2.57 s; Table 2: on a DGX-2 with two Xeon Platinum 8168 and 2666 MHz DDR4;
- a Xeon Platinum 8168 has six DRAM channels (Azure docs, HC-series virtual machine overview);
- DGX H100: 563.2 GB/s peak DRAM bandwidth (2 x 8 DDR5 channels x 4400 MT/s x 8 B), 8 GPUs, 64 GB/s PCIe per direction;
- Adam streams 28 B per parameter (read fp32 copy, m, v, gradient; write copy, m, v).
"""

from __future__ import annotations

import pytest
from conftest import REPO, gpt_model, hardware_variant, make_scenario

from simtrain.engine.simulation import simulate
from simtrain.plan.memory import stage_memory
from simtrain.plan.offload_optimizer import cpu_adam_bandwidth, host_step
from simtrain.spec.errors import InputError
from simtrain.spec.hardware import load_hardware

DGX2_PEAK = 2 * 6 * 2666e6 * 8        # two Xeon 8168 x 6 DDR4 channels x 2666 MT/s x 8 B = 255.9 GB/s
MEASURED_PARAMS, MEASURED_S = 10e9, 2.57   # ZeRO-Offload Table 4, the largest row
H100_PEAK = 2 * 8 * 4400e6 * 8        # DGX H100's two Xeon 8480C: 563.2 GB/s


def _dgx_h100():
    return load_hardware(str(REPO / "hardware" / "dgx-h100.yaml"), base_dir=REPO, file="test.yaml")[0]


def test_bundled_efficiency_is_the_measured_rate_over_the_measured_hosts_peak():
    """host_adam_efficiency in dgx-h100.yaml is 28 B x 10e9 / 2.57 s over 255.9 GB/s (0.4257), to its 3 digits."""
    measured = 28 * MEASURED_PARAMS / MEASURED_S / DGX2_PEAK
    assert measured == pytest.approx(0.4257, abs=1e-4)
    assert _dgx_h100().host_adam_efficiency == pytest.approx(measured, abs=5e-4)


def test_dgx_h100_cpu_step_seconds_by_hand():
    """A 1e9-parameter shard on a DGX H100 (8 GPUs stepping at once): 28e9 B / (563.2 GB/s x 0.426 / 8) = 0.934 s of
    CPU Adam, and 4e9 B / 64 GB/s = 62.5 ms each way over PCIe."""
    hw = _dgx_h100()
    step = host_step(1e9, hw.inter_node.pcie_bandwidth, cpu_adam_bandwidth(hw), 8)
    assert step.cpu == pytest.approx(28e9 / (563.2e9 * 0.426 / 8), rel=1e-12)
    assert step.cpu == pytest.approx(0.9336, abs=1e-4)
    assert (step.d2h, step.h2d) == pytest.approx((0.0625, 0.0625), rel=1e-12)


def test_step_is_the_measured_time_scaled_by_the_bandwidth_ratio():
    """The 28 bytes cancel: the DGX H100 step of one GPU's 1e9 parameters is the measured 2.57 s per 1e10 parameters
    times 255.9 / (563.2 / 8) GB/s (0.934 s), to the rounding of the file's 0.426."""
    hw = _dgx_h100()
    scaled = MEASURED_S * (1e9 / MEASURED_PARAMS) * DGX2_PEAK / (H100_PEAK / 8)
    assert scaled == pytest.approx(0.9343, abs=1e-4)
    assert host_step(1e9, 64e9, cpu_adam_bandwidth(hw), 8).cpu == pytest.approx(scaled, rel=1e-3)


def test_without_the_efficiency_the_step_is_the_peak_bandwidth_lower_bound(tmp_path):
    """A hardware file with host_memory_bandwidth but no host_adam_efficiency times the CPU step at peak DRAM
    bandwidth: 28e9 B / (80 GB/s / 8) = 2.8 s for 1e9 parameters."""
    path = hardware_variant(tmp_path, {"host_memory_bandwidth": {"value": "80 GB/s", "source": "test"}})
    hw = load_hardware(str(path), base_dir=tmp_path, file="test.yaml")[0]
    assert hw.host_adam_efficiency is None
    assert host_step(1e9, 10e9, cpu_adam_bandwidth(hw), 8).cpu == pytest.approx(2.8, rel=1e-12)


def test_simulated_host_step_uses_the_efficiency(tmp_path):
    """With host_adam_efficiency 0.5 on 80 GB/s over 4 GPUs, the exposed offload time is 4 B/param / 10 GB/s each way
    plus 28 B/param / (80 GB/s x 0.5 / 4) of CPU Adam for the GPU's ZeRO-1 shard."""
    path = hardware_variant(tmp_path, {"inter_node.pcie_bandwidth": {"value": "10 GB/s", "source": "test"},
                                       "host_memory_bandwidth": {"value": "80 GB/s", "source": "test"},
                                       "host_adam_efficiency": {"value": 0.5, "source": "test"}})
    sc = make_scenario(hardware=path, model=gpt_model(layers=4, hidden=4096, heads=32),
                       training={"seq_len": 256, "global_batch": 8, "optimizer": "adam"},
                       parallel={"dp": 4, "zero": 1, "offload_optimizer": True})
    shard = stage_memory(sc, 0).params_local / 4
    expected = 8 * shard / 10e9 + 28 * shard / (80e9 * 0.5 / 4)
    assert simulate(sc).exposed_comm_s["offload"] == pytest.approx(expected, rel=1e-9)


def test_efficiency_above_one_is_bad_input(tmp_path):
    """host_adam_efficiency is a fraction of peak: 1.5 is refused naming the key."""
    path = hardware_variant(tmp_path, {"host_adam_efficiency": {"value": 1.5, "source": "test"}})
    with pytest.raises(InputError, match="host_adam_efficiency"):
        load_hardware(str(path), base_dir=tmp_path, file="test.yaml")
