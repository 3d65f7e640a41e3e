"""The device a kernel runs on: its time from FLOP and bytes moved, by the rule the :mod:`simtrain.plan.costs`
docstring states (GEMM and attention efficiency curves, memory-bound kernels, launch gaps), and the bytes per
element of each precision. All quantities in seconds, FLOP and bytes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from simtrain.spec.attention_kernels import forward_rate_factor
from simtrain.spec.hardware import ComputeModel, GpuSpec

#: bytes per element of activations and weights by training precision; fp8 training keeps its weights and the
#: activations between layers in BF16 (its FP8 copies are counted apart: ``FP8_COPY_BYTES``)
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4, "fp8": 2}

#: bytes per element of one FP8 copy of a tensor, scales included: tensorwise 1 (one FP32 scale per tensor);
#: blockwise 1 + 4/128 (an FP32 scale per 1x128 tile, DeepSeek-V3 Sec. 3.3.2; the 128x128 weight blocks add
#: 4/16384, counted as the same); mxfp8 1 + 1/32 (an E8M0 scale per 32 elements, OCP MX v1.0 / TE mxfp8.rst)
FP8_COPY_BYTES = {"tensorwise": 1.0, "blockwise": 1.0 + 4.0 / 128.0, "mxfp8": 1.0 + 1.0 / 32.0}

#: HBM bytes per element the quantization of one BF16 activation or gradient moves before an FP8 GEMM, by recipe
#: (pytorch/ao torchao/testing/training/roofline_utils.py, get_tensor_memory_traffic_ovhd_s): tensorwise current
#: scaling reads the tensor for its amax (2) and again to cast it (2), writing the rowwise and the columnwise FP8
#: copy (1 + 1) = 6 ("Quantization is a memory-bound operation that requires reading the tensor twice", TE
#: fp8_current_scaling.rst); blockwise and mxfp8 quantize rowwise and columnwise blocks independently from the
#: BF16 data (TE mxfp8.rst: "Both must be quantized independently"), each a read (2) and a write (copy bytes)
FP8_CAST_BYTES = {"tensorwise": 6.0, "blockwise": 2 * (2.0 + FP8_COPY_BYTES["blockwise"]),
                  "mxfp8": 2 * (2.0 + FP8_COPY_BYTES["mxfp8"])}
#: kernels per quantized tensor: amax + cast (tensorwise current scaling), rowwise + columnwise cast (block recipes)
FP8_CAST_KERNELS = 2


def _interpolate_log(curve: tuple[tuple[float, float], ...], size: float) -> float:
    """Piecewise-linear in log(size) through measured points, flat beyond the ends."""
    if size <= curve[0][0]:
        return curve[0][1]
    for (s0, f0), (s1, f1) in zip(curve, curve[1:]):
        if size <= s1:
            w = math.log(size / s0) / math.log(s1 / s0)
            return f0 + w * (f1 - f0)
    return curve[-1][1]


#: a kernel's launch gap inside a CUDA graph over its gap when launched eagerly (asynchronously): NVIDIA Technical
#: Blog, A. Gray, "Getting Started with CUDA Graphs" (2019): a 2.9 us kernel takes 3.8 us per kernel launched back to
#: back and 3.4 us inside a graph, gaps of 0.9 and 0.5 us: 0.5 / 0.9
GRAPH_GAP_FRACTION = (3.4 - 2.9) / (3.8 - 2.9)


def graph_gap(compute: ComputeModel) -> float:
    """Seconds between two kernels of a captured CUDA graph: the eager gap x ``GRAPH_GAP_FRACTION``."""
    return compute.kernel_overhead * GRAPH_GAP_FRACTION


@dataclass(frozen=True)
class Device:
    """What a kernel's time depends on: the GPU, its efficiencies, the dtype."""

    gpu: GpuSpec
    compute: ComputeModel
    dtype: str
    attention_speed: float = 1.0   # the scenario's flash kernel relative to the hardware's FlashAttention-2 curve
    attention_forward_ratio: float = 1.0   # its forward's FLOP rate over its backward's (spec.attention_kernels)
    fp8_recipe: str = "tensorwise"  # fp8 training only: the scaling recipe of the linear layers' GEMMs
    graph_gap: float | None = None  # s, the launch gap between kernels inside a CUDA graph (None: eager gaps)

    @property
    def peak(self) -> float:
        """Peak of the 16-bit (or fp32) kernels: attention, the output layer, everything but FP8 linears."""
        return self.gpu.peak("bf16" if self.dtype == "fp8" else self.dtype)

    @property
    def kernel_overhead(self) -> float:
        return self.compute.kernel_overhead if self.graph_gap is None else self.graph_gap

    @property
    def fp8(self) -> bool:
        return self.dtype == "fp8"

    @property
    def element_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    def gemm_efficiency(self, m: float, n: float, k: float) -> float:
        """The benchmarked fraction of peak at this size, times the sustained fraction (power-limited clock)."""
        return self.compute.sustained_fraction * self._benchmark_gemm_efficiency(m, n, k)

    def _benchmark_gemm_efficiency(self, m: float, n: float, k: float) -> float:
        curve = self.compute.gemm_curve
        if curve:
            return _interpolate_log(curve, (m * n * k) ** (1.0 / 3.0))
        best = self.compute.gemm_efficiency
        half = self.compute.gemm_half_size
        if half <= 0:
            return best
        g3 = m * n * k   # g^3, g = geometric mean of the dimensions
        return best * g3 / (g3 + half ** 3)

    def gemm_time(self, m: float, n: float, k: float, memory_efficiency: float | None = None) -> float:
        """One GEMM (M x K) @ (K x N): 2MNK FLOP; reads A and B, writes C, at ``memory_efficiency`` of the HBM
        bandwidth (default: the streaming kernels' ``compute.memory_efficiency``)."""
        flops = 2.0 * m * n * k
        nbytes = self.element_bytes * (m * k + k * n + m * n)
        t_math = flops / (self.peak * self.gemm_efficiency(m, n, k))
        eff = self.compute.memory_efficiency if memory_efficiency is None else memory_efficiency
        t_mem = nbytes / (self.gpu.memory_bandwidth * eff)
        return max(t_math, t_mem) + self.kernel_overhead

    def linear_gemm_time(self, m: float, n: float, k: float) -> float:
        """A GEMM of a transformer layer's linear (QKV, output, MLP): in FP8 under fp8 training (TE runs forward,
        data-gradient and weight-gradient GEMMs of every linear in FP8, "4 Fprop + 4 Dgrad + 4 Wgrad" per layer,
        TE speedups.rst), at the FP8 (or MXFP8) peak times the measured FP8 GEMM curve and the sustained fraction;
        reads FP8 operands (scales included) and writes a BF16 result. Otherwise ``gemm_time``."""
        if not self.fp8:
            return self.gemm_time(m, n, k)
        peak = self.gpu.gemm_peak("fp8", self.fp8_recipe)
        curve = self.compute.fp8_gemm_curve
        size = (m * n * k) ** (1.0 / 3.0)
        frac = _interpolate_log(curve, size) if curve else self._benchmark_gemm_efficiency(m, n, k)
        t_math = 2.0 * m * n * k / (peak * self.compute.sustained_fraction * frac)
        nbytes = FP8_COPY_BYTES[self.fp8_recipe] * (m * k + k * n) + self.element_bytes * m * n
        t_mem = nbytes / (self.gpu.memory_bandwidth * self.compute.memory_efficiency)
        return max(t_math, t_mem) + self.kernel_overhead

    def fp8_cast_time(self, elements: float, tensors: int) -> float:
        """Quantizing ``elements`` BF16 values in ``tensors`` tensors for FP8 GEMMs (``FP8_CAST_BYTES``)."""
        return self.memory_time(elements * FP8_CAST_BYTES[self.fp8_recipe], kernels=FP8_CAST_KERNELS * tensors)

    def norm_time(self, nbytes: float, backward: bool, kernels: int) -> float:
        """Layer-norm kernels: bytes over HBM at the norm's own measured fraction of the bandwidth."""
        c = self.compute
        eff = c.norm_backward_efficiency if backward else c.norm_forward_efficiency
        if eff is None:
            return self.memory_time(nbytes, kernels)
        return nbytes / (self.gpu.memory_bandwidth * eff) + kernels * self.kernel_overhead

    def unfused_attention_efficiency(self, backward: bool) -> float:
        """Fraction of HBM bandwidth an unfused attention's score GEMMs and softmax reach (the hardware's measured
        figure, else the streaming kernels')."""
        c = self.compute
        eff = c.unfused_attention_backward_efficiency if backward else c.unfused_attention_forward_efficiency
        return c.memory_efficiency if eff is None else eff

    def memory_time(self, nbytes: float, kernels: int = 1) -> float:
        """Memory-bound kernels moving ``nbytes`` through HBM."""
        return nbytes / (self.gpu.memory_bandwidth * self.compute.memory_efficiency) + \
            kernels * self.kernel_overhead

    def attention_efficiency(self, seq: int) -> float:
        half = self.compute.attention_half_seq
        best = self.compute.attention_efficiency
        return self.attention_speed * (best if half <= 0 else best * seq / (seq + half))

    def attention_time(self, flops: float, seq: int, backward: bool = False) -> float:
        """A flash kernel's pass of ``flops`` (FlashAttention's count: the backward 2.5x the forward). The hardware
        file's rate is the forward + backward one; a kernel whose forward runs k times its backward's rate takes
        forward rate = (1 + 2.5 k) / 3.5 of it and backward rate = that / k, so one forward and its backward take
        what they take at the combined rate."""
        rate = forward_rate_factor(self.attention_forward_ratio)
        if backward:
            rate /= self.attention_forward_ratio
        return flops / (self.peak * self.attention_efficiency(seq) * rate) + self.kernel_overhead
