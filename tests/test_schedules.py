"""Pipeline schedules as plain data (issue 3, deliverable 4; style rule 6).

Rules from Narayanan et al. 2021 (arXiv:2104.04473), Sec. 2.2: GPipe runs all forwards then
all backwards; 1F1B (PipeDream-Flush) runs pp - r - 1 warm-up forwards on rank r; the
interleaved schedule follows Megatron-LM's ``forward_backward_pipelining_with_interleaving``
(warm-up (pp - r - 1) x 2 + (v - 1) x pp chunk forwards, micro-batches in groups of pp).
Pipeline makespans are checked with a small executor written here, independent of the engine:
with forward time t_f and backward t_b per stage, GPipe and 1F1B take (m + p - 1)(t_f + t_b),
the interleaved schedule m(t_f + t_b) + (p - 1)(t_f + t_b)/v (bubble cut by v, Sec. 2.2.2).
"""

from __future__ import annotations

from collections import Counter
from fractions import Fraction

import pytest

from simtrain.plan.schedules import Op, build_schedule

LAYOUTS = [(1, 1), (2, 4), (4, 4), (4, 8), (4, 2), (8, 16)]


def _execute(schedule, pp: int, vpp: int, tf, tb):
    """Run per-rank op lists with F(v) after F(v-1) and B(v) after B(v+1) and F(v); returns the makespan."""
    V = pp * vpp
    done: dict = {}
    pos, free = [0] * pp, [Fraction(0)] * pp
    remaining = sum(len(ops) for ops in schedule)
    while remaining:
        progressed = False
        for r in range(pp):
            if pos[r] == len(schedule[r]):
                continue
            op = schedule[r][pos[r]]
            v = op.chunk * pp + r
            deps = [("F", v - 1, op.mb)] if op.kind == "F" and v > 0 else []
            if op.kind == "B":
                deps = [("F", v, op.mb)] + ([("B", v + 1, op.mb)] if v + 1 < V else [])
            if all(d in done for d in deps):
                end = max([free[r]] + [done[d] for d in deps]) + (tf if op.kind == "F" else tb)
                done[(op.kind, v, op.mb)] = free[r] = end
                pos[r] += 1
                remaining -= 1
                progressed = True
        assert progressed, f"deadlock at positions {pos}"
    return max(done.values())


@pytest.mark.parametrize(("pp", "m"), LAYOUTS)
def test_1f1b_warmup_counts(pp, m):
    """1F1B: rank r runs w = min(pp - r - 1, m) warm-up forwards, m - w (F, B) pairs, then w backwards."""
    for r, ops in enumerate(build_schedule("1f1b", pp, m)):
        w = min(pp - r - 1, m)
        assert [op.kind for op in ops] == ["F"] * w + ["F", "B"] * (m - w) + ["B"] * w
        assert [op.mb for op in ops if op.kind == "F"] == list(range(m))
        assert [op.mb for op in ops if op.kind == "B"] == list(range(m))


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize(("pp", "m"), LAYOUTS)
def test_every_microbatch_forward_and_backward_once(name, pp, m):
    """Each rank runs F and B of every micro-batch exactly once, the F first."""
    for ops in build_schedule(name, pp, m):
        assert Counter(ops) == Counter([Op("F", i, 0) for i in range(m)] + [Op("B", i, 0) for i in range(m)])
        for i in range(m):
            assert ops.index(Op("F", i, 0)) < ops.index(Op("B", i, 0))


@pytest.mark.parametrize(("pp", "m", "v"), [(2, 4, 2), (4, 8, 2), (4, 4, 3), (8, 16, 4)])
def test_interleaved_every_chunk_once(pp, m, v):
    """Interleaved: each rank runs F and B of every (micro-batch, chunk) exactly once, the F first."""
    for ops in build_schedule("interleaved-1f1b", pp, m, v):
        expected = [Op(k, i, c) for k in "FB" for i in range(m) for c in range(v)]
        assert Counter(ops) == Counter(expected)
        for i in range(m):
            for c in range(v):
                assert ops.index(Op("F", i, c)) < ops.index(Op("B", i, c))


def test_gpipe_is_all_forwards_then_all_backwards():
    """GPipe: m forwards, then m backwards, on every rank."""
    for ops in build_schedule("gpipe", 3, 5):
        assert [op.kind for op in ops] == ["F"] * 5 + ["B"] * 5


def test_interleaved_megatron_order_pp2_v2_m4():
    """pp=2, v=2, m=4 follows Megatron-LM's order (warm-up 4 on rank 0 and 2 on rank 1), written out by hand."""
    F, B = (lambda mb, c: Op("F", mb, c)), (lambda mb, c: Op("B", mb, c))
    rank0 = [F(0, 0), F(1, 0), F(0, 1), F(1, 1),                       # warm-up (2-0-1)*2 + (2-1)*2 = 4
             F(2, 0), B(0, 1), F(3, 0), B(1, 1), F(2, 1), B(0, 0), F(3, 1), B(1, 0),
             B(2, 1), B(3, 1), B(2, 0), B(3, 0)]
    rank1 = [F(0, 0), F(1, 0),                                         # warm-up (2-1-1)*2 + (2-1)*2 = 2
             F(0, 1), B(0, 1), F(1, 1), B(1, 1), F(2, 0), B(0, 0), F(3, 0), B(1, 0),
             F(2, 1), B(2, 1), F(3, 1), B(3, 1),
             B(2, 0), B(3, 0)]
    assert [list(ops) for ops in build_schedule("interleaved-1f1b", 2, 4, 2)] == [rank0, rank1]


def test_interleaved_needs_microbatches_multiple_of_pp():
    """The interleaved schedule refuses m not a multiple of pp (Megatron-LM's requirement)."""
    with pytest.raises(ValueError):
        build_schedule("interleaved-1f1b", 4, 6, 2)


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize(("pp", "m"), LAYOUTS)
def test_makespan_gpipe_1f1b(name, pp, m):
    """Uniform stages, free communication: GPipe and 1F1B take (m + p - 1)(t_f + t_b)."""
    tf, tb = Fraction(1), Fraction(2)
    assert _execute(build_schedule(name, pp, m), pp, 1, tf, tb) == (m + pp - 1) * (tf + tb)


@pytest.mark.parametrize(("pp", "m", "v"), [(2, 4, 2), (4, 4, 2), (4, 8, 2), (4, 16, 4), (8, 8, 2)])
def test_makespan_interleaved(pp, m, v):
    """Interleaved with v chunks of t/v each: m(t_f + t_b) + (p - 1)(t_f + t_b)/v (Narayanan Sec. 2.2.2)."""
    tf, tb = Fraction(1, v), Fraction(2, v)
    sched = build_schedule("interleaved-1f1b", pp, m, v)
    assert _execute(sched, pp, v, tf, tb) == m * 3 + Fraction(3 * (pp - 1), v)


@pytest.mark.parametrize(("pp", "m"), [(4, 8), (4, 2), (8, 16)])
def test_peak_inflight_microbatches(pp, m):
    """Forwards not yet matched by their backward peak at min(m, pp - r) for 1F1B and m for GPipe."""
    for name, bound in (("1f1b", lambda r: min(m, pp - r)), ("gpipe", lambda r: m)):
        for r, ops in enumerate(build_schedule(name, pp, m)):
            live = peak = 0
            for op in ops:
                live += 1 if op.kind == "F" else -1
                peak = max(peak, live)
            assert peak == bound(r)
