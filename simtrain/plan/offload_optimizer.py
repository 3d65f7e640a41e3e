"""The optimizer step on the host CPU (``parallel.offload_optimizer``), played as Megatron-Core's
``--optimizer-cpu-offload --optimizer-offload-fraction 1.0 --use-precision-aware-optimizer`` runs it without
``--overlap-cpu-optimizer-d2h-h2d`` (megatron/core/optimizer/cpu_offloading/hybrid_optimizer.py,
``HybridDeviceOptimizer``, NVIDIA/Megatron-LM at 0d41ecd):

- the distributed optimizer's shard of each GPU (ZeRO-1/2: the GPU's 1/dp of its stage's parameters) has its fp32
  copy, its Adam moments and an fp32 gradient buffer in pinned host memory (``param.detach().clone().cpu()`` then
  ``.float()`` with ``param_update_in_fp32``; ``cpu_copy_map_grad`` of the fp32 copy's dtype);
- at the step, the gradient shard goes device to host (``copy_(grad, non_blocking=True)``: PyTorch converts a
  non-blocking copy on the GPU, aten/src/ATen/native/cuda/Copy.cu, so 4 bytes per parameter cross PCIe), the CPU
  optimizer steps, and the fp32 shard comes back host to device (the same rule: the fp32 values cross PCIe and are
  cast to bf16 on the GPU), one after another on the compute stream (the streams are the current stream without
  the overlap flag; the CPU step waits on the copy's event);
- the CPU optimizer is PyTorch's AdamW with ``fused=True`` ("used to improve the performance of the cpu
  optimizer") and ``param_update_in_fp32=True`` (megatron/core/optimizer/__init__.py, same commit): one pass over
  the state per step;
- the GPU keeps its weights and gradient buffer: only the optimizer state leaves it.

The CPU step is timed from a measured CPU-Adam rate on a named host, moved to the target host by the ratio of the
two hosts' peak DRAM bandwidths: Adam over the state is memory-bound (7 x 4 = 28 bytes per parameter: read the fp32
copy, both moments and the gradient, write the copy and both moments), so a kernel's achieved fraction of peak DRAM
bandwidth is what carries over. ZeRO-Offload's CPU-Adam stepped 10 billion parameters in 2.57 s (Ren et al., USENIX
ATC 2021, arXiv:2101.06840, Table 4) on a DGX-2 whose two Xeon Platinum 8168 have 6 DDR4-2666 channels each (Table
2), 255.9 GB/s peak: 28 B x 1e10 / 2.57 s = 108.9 GB/s, 0.426 of peak. A hardware file carries that fraction as
``host_adam_efficiency`` beside its ``host_memory_bandwidth``; the node's CPU-Adam bandwidth (their product) is
shared evenly by the node's GPUs, which step at once. The 28 bytes cancel: the time is the measured seconds per
parameter scaled by the hosts' bandwidth ratio. Without ``host_adam_efficiency`` the step is timed at peak DRAM
bandwidth, a lower bound on its time (docs/model.md, optimizer offloading). Each copy runs at the GPU's host link
(``inter_node.pcie_bandwidth``, per direction) alone.
"""

from __future__ import annotations

from dataclasses import dataclass

from simtrain.spec.hardware import HardwareSpec

#: bytes per parameter crossing PCIe each way: the fp32 gradient down, the fp32 master copy up (module docstring)
GRAD_D2H_BYTES = 4.0
MASTER_H2D_BYTES = 4.0
#: Adam on the host: read fp32 copy, m, v and the fp32 gradient (16), write copy, m, v (12)
CPU_ADAM_BYTES = 28.0
#: host memory per parameter of the shard: fp32 copy (4), m and v (8), the fp32 gradient buffer (4)
HOST_STATE_BYTES = 16.0


@dataclass(frozen=True)
class HostStep:
    """One GPU's offloaded optimizer step, seconds, in the order it runs."""

    d2h: float        # gradient shard to host memory
    cpu: float        # the CPU Adam step over the shard
    h2d: float        # updated fp32 shard back to the GPU

    @property
    def total(self) -> float:
        return self.d2h + self.cpu + self.h2d


def cpu_adam_bandwidth(hw: HardwareSpec) -> float:
    """Bytes/s of Adam state (28 B per parameter) one node's CPUs stream: its peak DRAM bandwidth times the measured
    CPU-Adam fraction of peak, or the peak itself (a lower bound on the step) where the file gives no fraction."""
    assert hw.host_memory_bandwidth is not None, hw.name     # the scenario rules refuse offloading without it
    efficiency = 1.0 if hw.host_adam_efficiency is None else hw.host_adam_efficiency
    return hw.host_memory_bandwidth * efficiency


def host_step(shard_params: float, pcie_bandwidth: float, host_bandwidth: float, gpus_per_node: int) -> HostStep:
    """The three parts of the step for ``shard_params`` parameters on one GPU, ``host_bandwidth`` being the node's
    CPU-Adam bandwidth (``cpu_adam_bandwidth``): the node's ``gpus_per_node`` GPUs step at once, so each has
    1/gpus_per_node of it."""
    per_gpu = host_bandwidth / gpus_per_node
    return HostStep(d2h=shard_params * GRAD_D2H_BYTES / pcie_bandwidth,
                    cpu=shard_params * CPU_ADAM_BYTES / per_gpu,
                    h2d=shard_params * MASTER_H2D_BYTES / pcie_bandwidth)


def host_state_bytes(shard_params: float) -> float:
    """Host memory one GPU's offloaded optimizer holds."""
    return shard_params * HOST_STATE_BYTES
