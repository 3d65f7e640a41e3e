"""Zero-bubble and DualPipe schedules as plain data (the ``Op`` lists of :mod:`simtrain.plan.schedules`).

- ZB-H1 (Qi, Wan, Huang, Lin, *Zero Bubble Pipeline Parallelism*, ICLR 2024, arXiv:2401.10241, Sec. 3.1): 1F1B
  with the backward split into B and W; rank r starts its W's r micro-batches late, and the W's it owes fill the
  tail bubble. Order of the authors' ``get_hand_schedule(..., warmup_c=1)`` (sail-sg/zero-bubble-pipeline-
  parallelism, ``megatron/core/pipeline_parallel/efficiency.py`` at f68d3879): pp - r - 1 warm-up forwards;
  then per micro-batch one F (while any remain), one B, and one W once warm-up + i >= pp - 1; then the rest of
  the W's. Bubble (p - 1)(T_F + T_B - T_W) (Table 2), peak p M_B like 1F1B.
- ZB-V (same paper, Sec. 6; handcrafted order of ``handcrafted_zb_v.py`` at tag zero-bubble-v0.1.0): two chunks
  per rank in a V (chunk 0 = stage r, chunk 1 = stage 2p - 1 - r). Zero bubble for T_F = T_B = T_W with the peak
  memory of 1F1B.
- DualPipe and DualPipeV (DeepSeek-V3 Technical Report, arXiv:2412.19437, Sec. 3.2.1, Fig. 5, Table 2; order of
  deepseek-ai/DualPipe ``dualpipe.py`` / ``dualpipev.py`` at 3da1bbea, its eight steps): DualPipe feeds half the
  micro-batches from each end of the pipeline into two model copies; DualPipeV folds one copy into a V. The
  steady state pairs one micro-batch's forward chunk with another's backward chunk ("FB"); B's marked for zero
  bubble leave their W to a first-in first-out queue that the W steps drain.
"""

from __future__ import annotations

from collections import deque

from simtrain.plan.pipeline_ops import Op


def zb_h1(pp: int, m: int) -> list[list[Op]]:
    out = []
    for rank in range(pp):
        warmup = pp - rank - 1
        ops = [Op("F", i, 0) for i in range(min(warmup, m))]
        f, b, w = len(ops), 0, 0
        for i in range(m):
            if f < m:
                ops.append(Op("F", f, 0))
                f += 1
            ops.append(Op("B", b, 0))
            b += 1
            if warmup + i >= pp - 1:
                ops.append(Op("W", w, 0))
                w += 1
        ops.extend(Op("W", i, 0) for i in range(w, m))
        out.append(ops)
    return out


def zb_v(pp: int, m: int) -> list[list[Op]]:
    """The handcrafted ZB-V order (module docstring); slots of micro-batches >= m are dropped."""
    n = max(2 * pp - 1, m)
    out = []
    for r in range(pp):
        ops: list[Op] = []
        f0 = f1 = b0 = b1 = 0
        for _ in range(2 * (pp - r) - 1):
            ops.append(Op("F", f0, 0))
            f0 += 1
        for _ in range(r):
            ops += [Op("F", f1, 1), Op("F", f0, 0)]
            f1, f0 = f1 + 1, f0 + 1
        for _ in range(pp - r):
            ops += [Op("F", f1, 1), Op("B", b1, 1), Op("W", b1, 1)]
            f1, b1 = f1 + 1, b1 + 1
        while f1 < f0 or f0 < n:
            if f0 < n:
                ops.append(Op("F", f0, 0))
                f0 += 1
            ops += [Op("B", b0, 0), Op("W", b0, 0), Op("F", f1, 1), Op("B", b1, 1), Op("W", b1, 1)]
            b0, f1, b1 = b0 + 1, f1 + 1, b1 + 1
        w0, w1 = b0, b1
        for _ in range(r):
            ops += [Op("B", b0, 0), Op("B", b1, 1)]
            b0, b1 = b0 + 1, b1 + 1
        for _ in range(pp - r):
            ops += [Op("B", b0, 0), Op("W", w0, 0)]
            b0, w0 = b0 + 1, w0 + 1
        ops += [Op("W", i, 1) for i in range(w1, b1)]
        ops += [Op("W", i, 0) for i in range(w0, b0)]
        out.append([op for op in ops if op.mb < m])
    return out


class _DualPipeRank:
    """Builds one rank's list in DualPipe's vocabulary: phase 0 / 1 forward or backward chunks, zero-bubble B's
    that queue their W, and W steps that run the oldest queued W."""

    def __init__(self, chunk_of_phase: tuple[int, int], mb_base: tuple[int, int]) -> None:
        self.chunk_of_phase = chunk_of_phase
        self.mb_base = mb_base
        self.next_f = [0, 0]
        self.next_b = [0, 0]
        self.pending_w: deque = deque()
        self.ops: list[Op] = []

    def _fwd(self, phase: int) -> tuple[int, int]:
        mb = self.mb_base[phase] + self.next_f[phase]
        self.next_f[phase] += 1
        return mb, self.chunk_of_phase[phase]

    def _bwd(self, phase: int, zb: bool) -> tuple[int, int]:
        mb = self.mb_base[phase] + self.next_b[phase]
        self.next_b[phase] += 1
        chunk = self.chunk_of_phase[phase]
        if zb:
            self.pending_w.append((mb, chunk))
        return mb, chunk

    def f(self, phase: int) -> None:
        self.ops.append(Op("F", *self._fwd(phase)))

    def b(self, phase: int, zb: bool = False) -> None:
        self.ops.append(Op("B", *self._bwd(phase, zb)))

    def w(self) -> None:
        self.ops.append(Op("W", *self.pending_w.popleft()))

    def fb(self, f_phase: int, b_phase: int) -> None:
        mb, chunk = self._fwd(f_phase)
        mb2, chunk2 = self._bwd(b_phase, False)
        self.ops.append(Op("FB", mb, chunk, mb2, chunk2))


def _dual_steps(rk: _DualPipeRank, ranks_half: int, half_rank: int, chunks: int, middle: bool) -> list[Op]:
    """The eight steps of DualPipe's ``step`` (``ranks_half``: num_half_ranks, or num_ranks for DualPipeV;
    ``chunks``: micro-batches per direction, or all of them for DualPipeV)."""
    for _ in range((ranks_half - half_rank - 1) * 2):          # step 1: nF0
        rk.f(0)
    for _ in range(half_rank + 1):                             # step 2: nF0F1
        rk.f(0)
        rk.f(1)
    for _ in range(ranks_half - half_rank - 1):                # step 3: nB1W1F1 (zero bubble)
        rk.b(1, zb=True)
        rk.w()
        rk.f(1)
    for i in range(chunks - 2 * ranks_half + half_rank + 1):   # step 4: nF0B1F1B0 (main step)
        if i == 0 and middle:   # dualpipe.py: the middle ranks do not overlap this first pair
            rk.f(0)
            rk.b(1)
        else:
            rk.fb(0, 1)
        rk.fb(1, 0)
    for _ in range(ranks_half - half_rank - 1):                # step 5: nB1F1B0
        rk.b(1)
        rk.fb(1, 0)
    step6 = half_rank + 1                                      # step 6: nB1B0, second half zero bubble
    zb = False
    for i in range(step6):
        if i == step6 // 2 and half_rank % 2 == 1:
            zb = True
        rk.b(1, zb)
        if i == step6 // 2 and half_rank % 2 == 0:
            zb = True
        rk.b(0, zb)
    for _ in range(ranks_half - half_rank - 1):                # step 7: nWB0 (zero bubble)
        rk.w()
        rk.b(0, zb=True)
    for _ in range(half_rank + 1):                             # step 8: nW
        rk.w()
    return rk.ops


def dualpipe(pp: int, m: int) -> list[list[Op]]:
    """DualPipe: pp even, m >= 2 pp even; micro-batches 0..m/2-1 enter at rank 0 (chunk 0), m/2..m-1 at rank
    pp - 1 (chunk 1). A rank's phase 0 is the direction in which it is nearer the start (dualpipe.py:
    ``phase ^= is_in_second_half``)."""
    half = m // 2
    out = []
    for r in range(pp):
        second = r >= pp // 2
        rk = _DualPipeRank(chunk_of_phase=(1, 0) if second else (0, 1),
                           mb_base=(half, 0) if second else (0, half))
        half_rank = min(r, pp - 1 - r)
        middle = half_rank == pp // 2 - 1
        out.append(_dual_steps(rk, pp // 2, half_rank, half, middle))
    return out


def dualpipev(pp: int, m: int) -> list[list[Op]]:
    """DualPipeV: every micro-batch goes down chunk 0 (stage r) and back up chunk 1 (stage 2 pp - 1 - r)."""
    return [_dual_steps(_DualPipeRank(chunk_of_phase=(0, 1), mb_base=(0, 0)), pp, r, m, False) for r in range(pp)]
