"""Message-size ramps: how much of a fabric's large-message bandwidth a collective of S bytes reaches.

A hardware file gives either a half-peak message size or a measured nccl-tests bus-bandwidth curve; both
become a :class:`Ramp`, which the collectives (simtrain.plan.collectives) divide a flow's bytes by.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from dataclasses import dataclass
from functools import lru_cache


@dataclass(frozen=True)
class Ramp:
    """The fraction of a fabric's large-message bus bandwidth B that the bytes of a collective of
    ``size`` bytes per GPU move at, once the ring's step latencies are counted apart.

    Either a half-peak size S_half, busbw(S) = B x S / (S + S_half), or a measured curve of
    (size, fraction) points interpolated in log-log, held at the last point above it and falling
    in proportion to the size below the first (a latency-bound floor: constant time).
    """

    half_peak: float = 0.0
    sizes: tuple[float, ...] = ()
    fractions: tuple[float, ...] = ()

    def fraction(self, size: float) -> float:
        if self.sizes:
            xs, ys = self.sizes, self.fractions
            if size >= xs[-1]:
                return ys[-1]
            if size <= xs[0]:
                return ys[0] * size / xs[0]
            i = bisect_right(xs, size)
            w = math.log(size / xs[i - 1]) / math.log(xs[i] / xs[i - 1])
            return math.exp(math.log(ys[i - 1]) + w * math.log(ys[i] / ys[i - 1]))
        return size / (size + self.half_peak) if self.half_peak > 0 else 1.0


@lru_cache(maxsize=16)
def curve_ramp(curve: tuple[tuple[float, float], ...], ranks: int, latency: float, bus_bandwidth: float) -> Ramp:
    """The ramp of a measured all-reduce curve over ``ranks`` GPUs (nccl-tests busbw as fractions f of B).

    A point's time is 2(n-1)/n x S / (f B); without its 2(n-1) step latencies alpha the bytes take
    2(n-1)/n x S / (g B) with 1/g = 1/f - n alpha B / S, so the model (latency + bytes at g B)
    gives back the measured time at every point. g is capped at 1.
    """
    sizes, fractions = [], []
    for size, f in curve:
        rest = 1.0 / f - ranks * latency * bus_bandwidth / size
        if rest <= 0:
            raise ValueError(f"the curve point at {size:g} bytes is faster than the fabric's step latency allows")
        sizes.append(size)
        fractions.append(min(1.0, 1.0 / rest))
    return Ramp(sizes=tuple(sizes), fractions=tuple(fractions))
