"""Zero-bubble and DualPipe schedules (issue 22): the op lists against their papers' closed forms, then the engine
against the same closed forms with the plan's own times.

Closed forms (F: a chunk's forward, B: its input-gradient pass, W: its weight-gradient pass, B + W the whole
backward, F&B an overlapped pair; on the ideal hardware of ``tests/data/core_ideal.yaml`` nothing hides behind
anything, so F&B = F + B + W):

- 1F1B bubble (p - 1)(F + B + W), a fraction (p - 1)/(m + p - 1) of the step (Narayanan et al. 2021, Sec. 2.2.1);
- ZB-H1 bubble (p - 1)(F + B - W) (Qi et al. 2024, arXiv:2401.10241, Table 2);
- DualPipe bubble (PP/2 - 1)(F&B + B_full - 3W) with B_full = B + W (DeepSeek-V3 report, arXiv:2412.19437,
  Table 2, and deepseek-ai/DualPipe's README), for F = B as in the report's figure; DualPipeV is DualPipe folded
  into a V, so the same form with PP = 2 x ranks stages (derived here);
- peak activations: 1F1B and ZB-H1 p stage-activations on rank 0, ZB-H1 rank r (p - r) M_B + r M_W (Qi et al.
  Sec. 2.3, worker i = r + 1: (p - i + 1) M_B + (i - 1) M_W); ZB-V 2p chunk-activations = p stage-activations on
  every rank (Sec. 6); DualPipe PP + 1 chunk-activations (DeepSeek-V3 Table 2).
"""

from __future__ import annotations

from collections import Counter
from fractions import Fraction

import pytest
from conftest import gpt_model, make_scenario

from simtrain.engine.simulation import simulate
from simtrain.plan.build import build_plan
from simtrain.plan.schedules import build_schedule, inflight_peak, split_backwards, stage_layout

TIMES = [(1, 1, 1), (2, 2, 1), (3, 2, 1), (Fraction(27, 10), Fraction(28, 10), Fraction(26, 10))]


def _execute(name: str, pp: int, m: int, vpp: int, tf, tb, tw):
    """Play per-rank op lists with exact times: F after its previous stage's F, B after its F and its next
    stage's B, W after its B; an "FB" pair starts when both halves may and takes F + B. Returns the makespan and
    each rank's (first start, last end, busy time)."""
    sched, lay = build_schedule(name, pp, m, vpp), stage_layout(name, pp, vpp)
    splits = [split_backwards(ops) for ops in sched]

    def deps(r, kind, mb, ch):
        v = lay.v_of(r, ch)
        if kind == "F":
            return [("F", lay.prev[v], mb)] if lay.prev[v] >= 0 else []
        if kind == "B":
            return [("F", v, mb)] + ([("B", lay.next[v], mb)] if lay.next[v] >= 0 else [])
        return [("B", v, mb)]

    def dur(r, kind, mb, ch):
        return {"F": tf, "W": tw}.get(kind, tb if (mb, ch) in splits[r] else tb + tw)

    done, pos, free = {}, [0] * pp, [Fraction(0)] * pp
    first, busy = [None] * pp, [Fraction(0)] * pp
    left = sum(map(len, sched))
    while left:
        moved = False
        for r in range(pp):
            if pos[r] == len(sched[r]):
                continue
            op = sched[r][pos[r]]
            parts = [("F", op.mb, op.chunk), ("B", op.mb2, op.chunk2)] if op.kind == "FB" else [
                (op.kind, op.mb, op.chunk)]
            need = [d for part in parts for d in deps(r, *part)]
            if all(d in done for d in need):
                start = max([free[r]] + [done[d] for d in need])
                took = sum(dur(r, *part) for part in parts)
                for kind, mb, ch in parts:
                    done[(kind, lay.v_of(r, ch), mb)] = start + took
                first[r] = start if first[r] is None else first[r]
                free[r], busy[r] = start + took, busy[r] + took
                pos[r], left, moved = pos[r] + 1, left - 1, True
        assert moved, f"{name}: deadlock at {pos}"
    return max(done.values()), [(first[r], free[r], busy[r]) for r in range(pp)]


@pytest.mark.parametrize("name", ["zb-h1", "zb-v", "dualpipe", "dualpipev"])
@pytest.mark.parametrize(("pp", "m"), [(2, 4), (4, 8), (4, 12), (8, 16), (8, 20)])
def test_every_pass_runs_once(name, pp, m):
    """Each micro-batch runs one F and one B on every virtual stage, and one W for every B that leaves one."""
    vpp = 2 if name in ("zb-v", "dualpipev") else 1
    lay = stage_layout(name, pp, vpp)
    seen = Counter()
    for r, ops in enumerate(build_schedule(name, pp, m, vpp)):
        for op in ops:
            if op.kind == "FB":
                seen[("F", lay.v_of(r, op.chunk), op.mb)] += 1
                seen[("B", lay.v_of(r, op.chunk2), op.mb2)] += 1
            else:
                seen[(op.kind, lay.v_of(r, op.chunk), op.mb)] += 1
        assert {(mb, ch) for kind, v, mb in seen if kind == "W" and lay.rank[v] == r for ch in [lay.chunk[v]]} \
            == split_backwards(ops)
    copies = 2 if name == "dualpipe" else 1
    micro = {v: range(m // 2 * lay.chunk[v], m // 2 * (lay.chunk[v] + 1)) if copies == 2 else range(m)
             for v in range(len(lay.rank))}
    for v in range(len(lay.rank)):
        for mb in micro[v]:
            assert seen[("F", v, mb)] == 1 and seen[("B", v, mb)] == 1
    assert all(n == 1 for n in seen.values())


@pytest.mark.parametrize(("tf", "tb", "tw"), TIMES)
@pytest.mark.parametrize(("pp", "m"), [(4, 8), (8, 24), (4, 13)])
def test_zb_h1_bubble_is_table_2(tf, tb, tw, pp, m):
    """ZB-H1 bubble = (p - 1)(T_F + T_B - T_W) (Qi et al. 2024, Table 2); 1F1B's (p - 1)(T_F + T_B + T_W)."""
    tf, tb, tw = Fraction(tf), Fraction(tb), Fraction(tw)
    span, _ = _execute("zb-h1", pp, m, 1, tf, tb, tw)
    assert span - m * (tf + tb + tw) == (pp - 1) * (tf + tb - tw)
    span, _ = _execute("1f1b", pp, m, 1, tf, tb, tw)
    assert span - m * (tf + tb + tw) == (pp - 1) * (tf + tb + tw)


@pytest.mark.parametrize(("tf", "tw"), [(1, 1), (2, 1), (3, 2)])
@pytest.mark.parametrize(("pp", "m"), [(4, 8), (4, 12), (8, 16), (8, 20)])
def test_dualpipe_bubble_is_deepseek_table_2(tf, tw, pp, m):
    """DualPipe bubble = (PP/2 - 1)(F&B + B - 3W), F&B = F + B, B the whole backward (DeepSeek-V3 Table 2), F = B
    input; DualPipeV the same with PP = 2 x ranks (derived: DualPipeV is DualPipe folded into a V)."""
    tf, tw = Fraction(tf), Fraction(tw)
    tb = tf
    full = tb + tw
    span, _ = _execute("dualpipe", pp, m, 1, tf, tb, tw)
    assert span - m * (tf + full) == (Fraction(pp, 2) - 1) * ((tf + full) + full - 3 * tw)
    span, _ = _execute("dualpipev", pp, m, 2, tf, tb, tw)
    assert span - 2 * m * (tf + full) == (pp - 1) * ((tf + full) + full - 3 * tw)


@pytest.mark.parametrize(("pp", "m"), [(4, 8), (8, 24)])
def test_zb_v_has_no_bubble_inside_a_rank(pp, m):
    """ZB-V with T_F = T_B = T_W: every rank, once started, never idles (Qi et al. 2024 Sec. 6, "zero bubble")."""
    _, ranks = _execute("zb-v", pp, m, 2, 1, 1, 1)
    for start, end, busy in ranks:
        assert end - start == busy


@pytest.mark.parametrize(("pp", "m"), [(4, 8), (8, 16), (8, 20)])
def test_peak_chunk_activations_are_the_papers(pp, m):
    """Peak forwards without their backward: 1F1B and ZB-H1 rank r p - r (Qi et al. Table 2: p M_B), ZB-V 2p chunks
    on every rank (Sec. 6), DualPipe PP + 1 chunks (DeepSeek-V3 Table 2)."""
    for r, ops in enumerate(build_schedule("zb-h1", pp, m)):
        assert inflight_peak(ops, {0: 1.0}, 0.0) == pp - r
    for ops in build_schedule("zb-v", pp, m, 2):
        assert inflight_peak(ops, {0: 1.0, 1: 1.0}, 0.0) == 2 * pp
    for ops in build_schedule("dualpipe", pp, m):
        assert inflight_peak(ops, {0: 1.0, 1: 1.0}, 0.0) == pp + 1


def _pipeline(p: int, m: int, schedule: str, vpp: int = 1):
    return make_scenario(model=gpt_model(layers=2 * p * vpp), training={"seq_len": 512, "global_batch": m,
                                                                        "micro_batch": 1},
                         parallel={"pp": p, "vpp": vpp, "schedule": schedule})


def _times(s):
    """(T_F, T_B, T_W, t_opt) of a middle chunk from the plan: W = its layers' weight-gradient GEMMs."""
    plan = build_plan(s)
    c = plan.chunks[1]
    tw = c.layers * c.wgrad_layer
    return c.forward_time, c.backward_time - tw, tw, max(plan.optimizer_time), plan


@pytest.mark.parametrize(("p", "m"), [(4, 8), (8, 16)])
def test_engine_zb_h1_step(p, m):
    """The engine plays ZB-H1 in m(T_F + T_B + T_W) + (p - 1)(T_F + T_B - T_W) + t_opt (Qi et al. Table 2)."""
    s = _pipeline(p, m, "zb-h1")
    tf, tb, tw, topt, _ = _times(s)
    # the first/last stage add an embedding and a tiny (vocab 8) output layer: < 0.5% of the bubble
    assert simulate(s).step_time_s == pytest.approx(m * (tf + tb + tw) + (p - 1) * (tf + tb - tw) + topt, rel=1e-3)


@pytest.mark.parametrize(("p", "m"), [(4, 8), (8, 16)])
def test_engine_zb_h1_holds_the_papers_memory(p, m):
    """ZB-H1 rank r peaks at (p - r) M_B + r M_W (Qi et al. 2024 Sec. 2.3), M_W = the W share of M_B."""
    s = _pipeline(p, m, "zb-h1")
    plan = build_plan(s)
    for lane in simulate(s).timeline.lanes:
        c = plan.chunks[lane.rank]
        assert lane.act_peak == pytest.approx((p - lane.rank) * c.act_bytes + lane.rank * c.act_w_bytes)


@pytest.mark.parametrize(("p", "m"), [(4, 8), (4, 16)])
def test_engine_1f1b_bubble_unchanged(p, m):
    """1F1B still idles (p - 1)/(m + p - 1) of the step with the split costs in the plan (Narayanan Sec. 2.2.1)."""
    assert simulate(_pipeline(p, m, "1f1b")).bubble_fraction == pytest.approx((p - 1) / (m + p - 1), rel=0.01)


@pytest.mark.parametrize(("name", "p", "m", "vpp"), [("dualpipe", 4, 8, 1), ("dualpipe", 8, 16, 1),
                                                      ("dualpipev", 4, 8, 2)])
def test_engine_dualpipe_matches_the_op_lists(name, p, m, vpp):
    """The engine's DualPipe step equals the exact executor's makespan with the plan's F, B, W (+ t_opt)."""
    s = _pipeline(p, m, name, vpp)
    tf, tb, tw, topt, _ = _times(s)
    span, _ = _execute(name, p, m, vpp, tf, tb, tw)
    assert simulate(s).step_time_s == pytest.approx(span + topt, rel=2e-3)


def test_dualpipe_holds_two_model_copies():
    """DualPipe keeps two copies of the parameters (DeepSeek-V3 Table 2: Parameter 2x): each rank twice 1F1B's."""
    one = simulate(_pipeline(4, 8, "1f1b"))
    two = simulate(_pipeline(4, 8, "dualpipe"))
    for a, b in zip(one.stages[1:3], two.stages[1:3], strict=True):
        assert b.memory["params"] == pytest.approx(2 * a.memory["params"])


@pytest.mark.parametrize(("p", "m"), [(4, 8), (8, 16)])
def test_1f1b_bubble_breakdown(p, m):
    """1F1B stage r idles r t_f + (p-1-r) t_b before its first backward (fill) and (p-1-r) t_f + r t_b after its
    last forward (drain), nothing in the steady state: the (p - 1)(t_f + t_b) of Narayanan et al. Sec. 2.2.1."""
    s = _pipeline(p, m, "1f1b")
    tf, tb, tw, _, _ = _times(s)
    tb += tw
    r = simulate(s)
    for st in r.stages:
        parts = st.bubble_breakdown_s
        assert parts["fill"] == pytest.approx(st.pp * tf + (p - 1 - st.pp) * tb, rel=2e-3, abs=1e-3 * tf)
        assert parts["drain"] == pytest.approx((p - 1 - st.pp) * tf + st.pp * tb, rel=2e-3, abs=1e-3 * tf)
        assert parts["imbalance"] == pytest.approx(0.0, abs=2e-2 * tf)   # the last stage's head: < 2% of t_f
        assert parts["fill"] + parts["drain"] + parts["imbalance"] == pytest.approx(st.bubble_s)
    assert r.to_dict()["bubble_breakdown_s"]["fill"] == pytest.approx(
        sum(st.bubble_breakdown_s["fill"] for st in r.stages) / p)


def test_gantt_draws_w_directions_and_overlapped_pairs():
    """The Gantt gives W its own trace, DualPipe's second direction its own shades, and draws each overlapped
    F&B pair as two bars over the same time span on one row (issue 22, deliverable 5)."""
    from simtrain.report.charts_gantt import gantt_figure, gantt_rows

    names = {t.name for t in gantt_figure(simulate(_pipeline(4, 8, "zb-h1"))).data}
    assert "weight gradient (W)" in names
    result = simulate(_pipeline(4, 8, "dualpipe"))
    names = {t.name for t in gantt_figure(result).data}
    assert {"forward, second direction", "backward, second direction"} <= names
    rows, _ = gantt_rows(result.to_dict())
    pairs = [b for row in rows if row.stream == "compute" for b in row.bars if b.overlapped]
    # every rank runs 2 x (m/2 - pp + h + 1) + (pp/2 - h - 1) pairs (dualpipe.py steps 4 and 5), h = min(r, pp-1-r),
    # less one on the middle ranks, whose first pair of step 4 runs unoverlapped: 2 + 1, 4 - 1, 4 - 1, 2 + 1 for
    # pp 4, m 8; two bars per pair
    assert len(pairs) == 2 * (3 + 3 + 3 + 3)
    for bar in pairs:
        assert any(o is not bar and o.start < bar.end and bar.start < o.end for o in pairs)
