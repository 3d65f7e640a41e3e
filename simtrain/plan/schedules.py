"""Pipeline schedules as plain data (style rule 6).

A schedule is, for each pipeline rank, the ordered list of operations it runs:
``Op("F", mb, chunk)`` a forward, ``Op("B", mb, chunk)`` a backward, ``Op("W", mb, chunk)`` the weight-gradient
half of a backward, and ``Op("FB", mb, chunk, mb2, chunk2)`` a forward (mb, chunk) and a backward (mb2, chunk2)
run together so that each one's communication hides behind the other's compute (DualPipe's overlapped pair).
A ``B`` whose ``W`` appears in the same rank's list computes only the input gradient (Qi et al. 2024, Sec. 2:
"B" = gradient w.r.t. the input, "W" = w.r.t. the parameters); a ``B`` without one is the whole backward.

Where each chunk runs is a :class:`StageLayout`: virtual stage ``v`` runs on ``rank[v]`` as chunk ``chunk[v]``,
holds the layers of model stage ``model_stage[v]``, takes its input from ``prev[v]`` and feeds ``next[v]``.
F(v, mb) needs F(prev[v], mb)'s output; B(v, mb) needs B(next[v], mb)'s gradient; W(v, mb) needs B(v, mb).
The engine executes these lists and knows nothing of how they were made: a new schedule needs no engine change.

- GPipe (Huang et al. 2019): all forwards, then all backwards.
- 1F1B (PipeDream-Flush, Narayanan et al. 2021 Sec. 2.2.1): rank r runs
  pp - r - 1 warm-up forwards, then alternates one forward and one backward,
  then drains the remaining backwards.
- Interleaved 1F1B (Narayanan et al. 2021 Sec. 2.2.2): each rank holds vpp
  chunks; micro-batches go through the chunks in groups of pp, with
  (pp - r - 1) x 2 + (vpp - 1) x pp warm-up chunk forwards (Megatron-LM's count).
- Megatron-Core's EP all-to-all overlap (``parallel.ep_overlap``): interleaved 1F1B (or 1F1B with pp 1) with one
  more warm-up forward and every steady-state F and B merged into an "FB" pair (:func:`interleaved`).
- The zero-bubble and DualPipe schedules are in :mod:`simtrain.plan.schedules_zb`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property, lru_cache

from simtrain.plan import schedules_zb
from simtrain.plan.pipeline_ops import Op

#: schedules that run one chunk per rank, vpp chunks (interleaved), or two chunks in a V / in two directions
SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-v", "dualpipe", "dualpipev")
#: schedules whose ranks hold two chunks placed in a V: chunk 0 = stage r, chunk 1 = stage 2 pp - 1 - r
V_SHAPED = ("zb-v", "dualpipev")
#: schedules that split the backward into B and W
SPLIT_BACKWARD = ("zb-h1", "zb-v", "dualpipe", "dualpipev")


@dataclass(frozen=True)
class StageLayout:
    """Where every virtual stage runs and which stages it talks to (one entry per virtual stage)."""

    rank: tuple[int, ...]          # pipeline rank that runs the stage
    chunk: tuple[int, ...]         # its chunk index on that rank
    model_stage: tuple[int, ...]   # index into the scenario's layers_per_stage (which layers it holds)
    prev: tuple[int, ...]          # stage its forward input comes from, -1 for the first
    next: tuple[int, ...]          # stage its forward output goes to, -1 for the last

    def v_of(self, rank: int, chunk: int) -> int:
        return self._index[(rank, chunk)]

    @cached_property
    def _index(self) -> dict:
        return {(r, c): v for v, (r, c) in enumerate(zip(self.rank, self.chunk, strict=True))}

    def stages_of(self, rank: int) -> list[int]:
        """The virtual stages of one rank, by chunk."""
        return self._by_rank.get(rank, [])

    @cached_property
    def _by_rank(self) -> dict[int, list[int]]:
        out: dict[int, list[int]] = {}
        for v in sorted(range(len(self.rank)), key=lambda v: self.chunk[v]):
            out.setdefault(self.rank[v], []).append(v)
        return out


def chunks_per_rank(name: str, vpp: int) -> int:
    """Model chunks each rank holds: vpp, or two for DualPipe (one per direction: two model copies)."""
    return 2 if name == "dualpipe" else vpp


@lru_cache(maxsize=64)
def stage_layout(name: str, pp: int, vpp: int = 1) -> StageLayout:
    """The placement of virtual stages on ranks for a schedule (module docstring)."""
    if name == "dualpipe":
        # DeepSeek-V3 Sec. 3.2.1 and deepseek-ai/DualPipe dualpipe.py: rank r holds stage r of the copy fed from
        # rank 0 (chunk 0) and stage pp - 1 - r of the copy fed from rank pp - 1 (chunk 1)
        rank, chunk, model, prev, nxt = [], [], [], [], []
        for copy in (0, 1):
            for s in range(pp):
                v = copy * pp + s
                rank.append(s if copy == 0 else pp - 1 - s)
                chunk.append(copy)
                model.append(s)
                prev.append(v - 1 if s > 0 else -1)
                nxt.append(v + 1 if s < pp - 1 else -1)
        return StageLayout(tuple(rank), tuple(chunk), tuple(model), tuple(prev), tuple(nxt))
    n = pp * vpp
    if name in V_SHAPED:
        # Qi et al. 2024 Sec. 6 (ZB-V) and deepseek-ai/DualPipe dualpipev.py: chunk 0 of rank r is stage r,
        # chunk 1 is stage 2 pp - 1 - r, so a micro-batch goes down the ranks and back up
        rank = tuple(v if v < pp else 2 * pp - 1 - v for v in range(n))
        chunk = tuple(0 if v < pp else 1 for v in range(n))
    else:
        rank = tuple(v % pp for v in range(n))
        chunk = tuple(v // pp for v in range(n))
    return StageLayout(rank, chunk, tuple(range(n)), tuple(v - 1 for v in range(n)),
                       tuple(v + 1 if v + 1 < n else -1 for v in range(n)))


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


def interleaved(pp: int, m: int, vpp: int, ep_overlap: bool = False) -> list[list[Op]]:
    """Interleaved 1F1B (module docstring); with ``ep_overlap``, Megatron-Core's EP all-to-all overlap: one more
    warm-up forward, "so that the forward and backward computations are independent in all 1f1b steps", and each
    steady-state forward merged with its backward into one "FB" pair (megatron/core/pipeline_parallel/schedules.py
    get_pp_rank_microbatches and combined_1f1b.py, NVIDIA/Megatron-LM at d98e8a6). With pp = 1 and vpp = 1 this is
    forward_backward_no_pipelining's combined 1F1B: F0, then F(i+1) with B(i), then the last B."""
    return [interleaved_rank(pp, m, vpp, rank, ep_overlap) for rank in range(pp)]


def interleaved_rank(pp: int, m: int, vpp: int, rank: int, ep_overlap: bool = False) -> list[Op]:
    """One rank's list of :func:`interleaved` (the memory ledger walks one rank without building the others)."""
    if m % pp:
        raise ValueError(f"interleaved schedule needs micro-batches ({m}) to be a multiple of pp ({pp})")
    total = m * vpp
    warmup = min((pp - rank - 1) * 2 + (vpp - 1) * pp + (1 if ep_overlap else 0), total)
    ops = [Op("F", *_interleaved_op(k, pp, vpp, True)) for k in range(warmup)]
    f, b = warmup, 0
    while f < total:
        fwd, bwd = _interleaved_op(f, pp, vpp, True), _interleaved_op(b, pp, vpp, False)
        if ep_overlap:
            ops.append(Op("FB", *fwd, *bwd))
        else:
            ops.append(Op("F", *fwd))
            ops.append(Op("B", *bwd))
        f, b = f + 1, b + 1
    ops.extend(Op("B", *_interleaved_op(k, pp, vpp, False)) for k in range(b, total))
    return ops


def build_schedule(name: str, pp: int, m: int, vpp: int = 1, ep_overlap: bool = False) -> list[list[Op]]:
    """Each rank's op list; ``ep_overlap`` (1f1b with pp 1, or interleaved-1f1b) merges the steady state's pairs."""
    if ep_overlap:
        if name not in ("1f1b", "interleaved-1f1b") or (name == "1f1b" and pp > 1):
            raise ValueError(f"ep_overlap runs on 1f1b with pp 1 or interleaved-1f1b, not {name!r} with pp {pp}")
        return interleaved(pp, m, vpp, ep_overlap=True)
    if name == "gpipe":
        return gpipe(pp, m)
    if name == "1f1b":
        return one_f_one_b(pp, m)
    if name == "interleaved-1f1b":
        return interleaved(pp, m, vpp)
    if name == "zb-h1":
        return schedules_zb.zb_h1(pp, m)
    if name == "zb-v":
        return schedules_zb.zb_v(pp, m)
    if name == "dualpipe":
        return schedules_zb.dualpipe(pp, m)
    if name == "dualpipev":
        return schedules_zb.dualpipev(pp, m)
    raise ValueError(f"unknown schedule {name!r}")


@lru_cache(maxsize=4)
def rank_schedules(name: str, pp: int, m: int, vpp: int = 1, ep_overlap: bool = False) -> tuple[tuple[Op, ...], ...]:
    """``build_schedule`` as tuples, kept for the last few layouts: the memory ledger asks for one rank's list at a
    time, and a pure function of its arguments need not be built pp times."""
    return tuple(tuple(ops) for ops in build_schedule(name, pp, m, vpp, ep_overlap))


def virtual_stage(chunk: int, rank: int, pp: int) -> int:
    return chunk * pp + rank


def split_backwards(ops: list[Op] | tuple[Op, ...]) -> set[tuple[int, int]]:
    """(micro-batch, chunk) pairs whose backward this rank splits into B and a later W."""
    return {(op.mb, op.chunk) for op in ops if op.kind == "W"}


def merged_pair_rise(share_f: float, layers_f: int, share_b: float, layers_b: int) -> float:
    """How far an ep_overlap merged pair lifts a rank's activations above their level at its start, in the units of
    ``share``. Megatron-Core plays the pair layer by layer (forward layer i, then backward layer n_b - 1 - i, then
    the backward's and the forward's remaining layers: plan/ep_overlap.py), and autograd frees a layer's saved
    tensors when its backward ends: each forward layer adds share_f / n_f before the paired backward layer frees
    share_b / n_b."""
    nf, nb = max(1, layers_f), max(1, layers_b)
    step_f, step_b = share_f / nf, share_b / nb
    now = rise = 0.0
    for k in range(max(nf, nb)):
        if k < nf:
            now += step_f
            rise = max(rise, now)
        if k < nb:
            now -= step_b
    return rise


def inflight_peak(ops, share: dict[int, float], w_fraction: float | dict[int, float],
                  pair_layers: dict[int, int] | None = None) -> float:
    """Peak activations a rank holds in units of its layers' activations for one micro-batch: a forward adds its
    chunk's ``share``; a whole backward frees it; a split B frees all but ``w_fraction`` of it, which its W frees
    (Qi et al. 2024, Table 1: after B a stage keeps M_W until W). An "FB" pair allocates its forward before its
    backward frees (the two run together: DualPipe), or, with ``pair_layers`` (each chunk's layers; ep_overlap's
    merged pairs), layer by layer (:func:`merged_pair_rise`). ``w_fraction`` may differ by chunk (a mapping)."""
    split = split_backwards(ops)
    kept = w_fraction if isinstance(w_fraction, dict) else dict.fromkeys(share, w_fraction)
    now = peak = 0.0
    for op in ops:
        if op.kind == "FB" and pair_layers is not None:
            peak = max(peak, now + merged_pair_rise(share[op.chunk], pair_layers[op.chunk], share[op.chunk2],
                                                    pair_layers[op.chunk2]))
            now += share[op.chunk] - share[op.chunk2]
            continue
        if op.kind in ("F", "FB"):
            now += share[op.chunk]
            peak = max(peak, now)
        if op.kind in ("B", "FB"):
            mb, ch = (op.mb, op.chunk) if op.kind == "B" else (op.mb2, op.chunk2)
            now -= share[ch] * ((1.0 - kept[ch]) if (mb, ch) in split else 1.0)
        elif op.kind == "W":
            now -= share[op.chunk] * kept[op.chunk]
    return peak
