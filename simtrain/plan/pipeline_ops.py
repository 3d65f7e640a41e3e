"""The operation a pipeline schedule lists (:mod:`simtrain.plan.schedules` describes the kinds)."""

from __future__ import annotations

from typing import NamedTuple


class Op(NamedTuple):
    kind: str        # "F" forward, "B" backward (input gradient only if a W follows), "W" weight gradient, "FB" pair
    mb: int          # micro-batch index (the forward's, for "FB")
    chunk: int       # model chunk on this rank (0 unless the rank holds several)
    mb2: int = -1    # "FB" only: the backward's micro-batch
    chunk2: int = -1  # "FB" only: the backward's chunk
