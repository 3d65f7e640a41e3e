"""Pipeline schedules as plain data (style rule 6).

A schedule is, for each pipeline rank, the ordered list of operations it runs:
``Op("F", microbatch, chunk)`` or ``Op("B", microbatch, chunk)``. Virtual stage
``v = chunk x pp + rank`` holds the chunk's layers; F(v, mb) needs F(v-1, mb)'s
output, B(v, mb) needs B(v+1, mb)'s gradient. The engine executes these lists
and knows nothing of how they were made: a new schedule needs no engine change.

- GPipe (Huang et al. 2019): all forwards, then all backwards.
- 1F1B (PipeDream-Flush, Narayanan et al. 2021 Sec. 2.2.1): rank r runs
  pp - r - 1 warm-up forwards, then alternates one forward and one backward,
  then drains the remaining backwards.
- Interleaved 1F1B (Narayanan et al. 2021 Sec. 2.2.2): each rank holds vpp
  chunks; micro-batches go through the chunks in groups of pp, with
  (pp - r - 1) x 2 + (vpp - 1) x pp warm-up chunk forwards (Megatron-LM's count).
"""

from __future__ import annotations

from typing import NamedTuple


class Op(NamedTuple):
    kind: str        # "F" forward or "B" backward
    mb: int          # micro-batch index
    chunk: int       # model chunk on this rank (0 unless interleaved)


def gpipe(pp: int, m: int) -> list[list[Op]]:
    return [[Op("F", i, 0) for i in range(m)] + [Op("B", i, 0) for i in range(m)] for _ in range(pp)]


def one_f_one_b(pp: int, m: int) -> list[list[Op]]:
    out = []
    for rank in range(pp):
        warmup = min(pp - rank - 1, m)
        ops = [Op("F", i, 0) for i in range(warmup)]
        f, b = warmup, 0
        while f < m:
            ops.append(Op("F", f, 0))
            ops.append(Op("B", b, 0))
            f, b = f + 1, b + 1
        ops.extend(Op("B", i, 0) for i in range(b, m))
        out.append(ops)
    return out


def _interleaved_op(k: int, pp: int, vpp: int, forward: bool) -> tuple[int, int]:
    """(micro-batch, chunk) of the k-th forward (or backward) chunk-op of a rank (Megatron order)."""
    group, within = divmod(k, pp * vpp)
    chunk = within // pp
    if not forward:
        chunk = vpp - 1 - chunk
    return group * pp + within % pp, chunk


def interleaved(pp: int, m: int, vpp: int) -> list[list[Op]]:
    if m % pp:
        raise ValueError(f"interleaved schedule needs micro-batches ({m}) to be a multiple of pp ({pp})")
    total = m * vpp
    out = []
    for rank in range(pp):
        warmup = min((pp - rank - 1) * 2 + (vpp - 1) * pp, total)
        ops = [Op("F", *_interleaved_op(k, pp, vpp, True)) for k in range(warmup)]
        f, b = warmup, 0
        while f < total:
            ops.append(Op("F", *_interleaved_op(f, pp, vpp, True)))
            ops.append(Op("B", *_interleaved_op(b, pp, vpp, False)))
            f, b = f + 1, b + 1
        ops.extend(Op("B", *_interleaved_op(k, pp, vpp, False)) for k in range(b, total))
        out.append(ops)
    return out


def build_schedule(name: str, pp: int, m: int, vpp: int = 1) -> list[list[Op]]:
    if name == "gpipe":
        return gpipe(pp, m)
    if name == "1f1b":
        return one_f_one_b(pp, m)
    if name == "interleaved-1f1b":
        return interleaved(pp, m, vpp)
    raise ValueError(f"unknown schedule {name!r}")


def virtual_stage(chunk: int, rank: int, pp: int) -> int:
    return chunk * pp + rank
