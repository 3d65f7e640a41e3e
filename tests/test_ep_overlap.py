"""Megatron-Core's EP all-to-all overlap (``parallel.ep_overlap``): the merged 1F1B schedule as data, and the exposed
all-to-all of a merged forward-backward pair against a hand calculation.

The rule (Megatron-Core ``combined_1f1b.py`` and ``model_chunk_schedule_plan.py``, NVIDIA/Megatron-LM at d98e8a6):
in the steady state one micro-batch's forward and another's backward run merged, layer by layer, "EP A2A in forward
step is hidden by the attention/mlp computation in the backward step, and vice versa"; the all-to-alls run on a
communication stream, the layers' compute (TP collectives included) on the compute stream. Per merged layer pair,
with forward compute c_f, its dispatch + combine a_f, backward compute c_b and its all-to-alls a_b, the compute
stream's period is c_f + c_b + max(0, a_f - c_b, a_b - c_f): each all-to-all exposed by what the other half's
compute leaves uncovered. The first forward and the last backward run alone (no pair to hide under).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from conftest import make_scenario

from simtrain.engine.core import Engine
from simtrain.engine.simulation import simulate
from simtrain.plan.build import build_plan
from simtrain.plan.ep_overlap import merged_pair
from simtrain.plan.memory import memory_report
from simtrain.plan.pipeline_ops import Op
from simtrain.plan.schedules import build_schedule, inflight_peak, interleaved, merged_pair_rise
from simtrain.spec.errors import InputError


def _qwen(m: int = 4, seq: int = 1024, **parallel):
    """Qwen3-30B-A3B on one DGX-H100 node, EP 8 over dp 8 (or the given layout)."""
    par = {"dp": 8, "ep": 8, **parallel}
    return make_scenario(hardware="dgx-h100", nodes=1, model="qwen3-30b-a3b",
                         training={"seq_len": seq, "global_batch": m * par["dp"], "micro_batch": 1},
                         parallel=par)


def _chunk(af, mf, ab, wa, mb, wm, df, db, layers, plan=None):
    """A chunk whose every MoE layer takes attention forward af, MoE forward mf, attention input gradient ab and
    weight gradient wa, MoE input gradient mb and weight gradient wm, and one all-to-all of df (forward) or db
    (backward) seconds each way; no edges, TP, gradients to reduce."""
    plan = plan or build_plan(_qwen(m=2, ep_overlap=True))
    return replace(plan.chunks[0], layers=layers, fwd_layer=af + mf, moe_fwd_layer=mf, bwd_layer=ab + wa + mb + wm,
                   moe_bwd_layer=mb + wm, moe_wgrad_layer=wm, wgrad_layer=wa + wm, recompute_layer=0.0,
                   tp_fwd_layer=0.0, tp_bwd_layer=0.0, ep_fwd_layer=2 * df, ep_bwd_layer=2 * db, lead_layers=0,
                   embed_fwd=0.0, embed_bwd=0.0, head_fwd=0.0, head_bwd=0.0, has_embedding=False, has_head=False,
                   metrics_bwd=0.0, grad_bytes_layer=0.0, grad_bytes_edge=0.0, expert_grad_bytes_layer=0.0)


def _synthetic(times, layers, m, overlap):
    """Play a one-stage plan of :func:`_chunk` layers (no optimizer): (step time, exposed EP seconds)."""
    plan = build_plan(_qwen(m=m, ep_overlap=overlap))
    c = _chunk(*times, layers, plan)
    timeline = Engine(replace(plan, chunks=(c,), optimizer_time=(0.0,), expert_grad_bytes=(0.0,))).run()
    return timeline.step_time, timeline.lanes[0].exposed["ep"]


def test_no_pipelining_schedule_is_megatrons():
    """pp 1: F0, then F(i+1) merged with B(i), then the last B (combined_1f1b_schedule_for_no_pipelining)."""
    assert build_schedule("1f1b", 1, 4, 1, ep_overlap=True) == [[
        Op("F", 0, 0), Op("FB", 1, 0, 0, 0), Op("FB", 2, 0, 1, 0), Op("FB", 3, 0, 2, 0), Op("B", 3, 0)]]


@pytest.mark.parametrize(("pp", "m", "vpp"), [(2, 4, 2), (4, 8, 2), (4, 8, 3)])
def test_interleaved_has_one_more_warmup_forward_and_merged_pairs(pp, m, vpp):
    """Rank r runs (pp - r - 1) x 2 + (vpp - 1) x pp + 1 warm-up forwards (Megatron-Core get_pp_rank_microbatches
    with overlap_moe_expert_parallel_comm), then pairs F(k) with B(k - warmup) in interleaved 1F1B's own order."""
    plain = interleaved(pp, m, vpp)
    merged = build_schedule("interleaved-1f1b", pp, m, vpp, ep_overlap=True)
    for r in range(pp):
        warmup = (pp - r - 1) * 2 + (vpp - 1) * pp + 1
        ops = merged[r]
        assert [op.kind for op in ops[:warmup]] == ["F"] * warmup
        assert all(op.kind == "FB" for op in ops[warmup:m * vpp])
        assert all(op.kind == "B" for op in ops[m * vpp:])
        # the same forwards and backwards, in the same order, as plain interleaved 1F1B
        fwd = [(op.mb, op.chunk) for op in ops if op.kind in ("F", "FB")]
        bwd = [(op.mb2, op.chunk2) if op.kind == "FB" else (op.mb, op.chunk) for op in ops if op.kind in ("B", "FB")]
        assert fwd == [(op.mb, op.chunk) for op in plain[r] if op.kind == "F"]
        assert bwd == [(op.mb, op.chunk) for op in plain[r] if op.kind == "B"]


def test_extra_warmup_holds_one_more_microbatch_but_a_pair_only_one_more_layer():
    """The extra warm-up forward keeps one more micro-batch's activations in flight before the first pair: 2(pp - 1)
    + (vpp - 1) pp + 1 chunk-activations on rank 0, as many as plain interleaved 1F1B reaches with its first steady
    forward (Megatron's count). A merged pair then adds only one layer: Megatron-Core runs it layer by layer and
    autograd frees each backward layer as it ends, so with 4 layers per chunk the peak is plain + 1/4."""
    pp, m, vpp, L = 4, 8, 2, 4
    share = {c: 1.0 for c in range(vpp)}
    layers = {c: L for c in range(vpp)}
    plain = inflight_peak(interleaved(pp, m, vpp)[0], share, 0.0)
    ops = build_schedule("interleaved-1f1b", pp, m, vpp, ep_overlap=True)[0]
    assert plain == (pp - 1) * 2 + (vpp - 1) * pp + 1
    assert inflight_peak(ops, share, 0.0, layers) == plain + 1 / L


@pytest.mark.parametrize(("sf", "nf", "sb", "nb", "rise"), [
    (1.0, 4, 1.0, 4, 0.25),          # equal chunks: one forward layer before the first backward layer frees
    (2.0, 4, 1.0, 4, 1.25),          # forward layers twice as large: 0.5 - 0.25 a pair, peak after the 4th add
    (1.0, 2, 1.0, 4, 0.75),          # +0.5 -0.25 +0.5 (peak 0.75) -0.25, then the backward's last 2 layers free
    (1.0, 4, 1.0, 2, 0.25),          # +0.25 (peak) -0.5 +0.25 -0.5, then the forward's last 2 layers: back to 0
])
def test_merged_pair_rise_by_hand(sf, nf, sb, nb, rise):
    """A merged pair's rise above its start, layer by layer, worked by hand for four shapes."""
    assert merged_pair_rise(sf, nf, sb, nb) == pytest.approx(rise)


def test_engine_memory_peak_matches_the_ledger_with_ep_overlap():
    """The engine's peak memory under ep_overlap equals the ledger's (both count a pair layer by layer), and is
    within one layer's activations of the run without the overlap at pp 1 (no extra micro-batch in flight)."""
    plain = simulate(_qwen(m=4))
    over = simulate(_qwen(m=4, ep_overlap=True))
    ledger = memory_report(_qwen(m=4, ep_overlap=True))
    assert over.peak_memory_bytes_max == pytest.approx(ledger.peak_max, rel=1e-9)
    layers = 48
    act = plain.to_dict()["stages"][0]["memory"]["activations"]
    assert 0 < over.peak_memory_bytes_max - plain.peak_memory_bytes_max <= act / layers * 1.0001


# (attention fwd, MoE fwd, attention dgrad, attention wgrad, MoE dgrad, MoE wgrad, a2a fwd, a2a bwd) -> the period of
# one merged layer pair in the steady state, by hand on the two streams (module docstring):
HAND = [
    # every all-to-all shorter than the compute it hides under: the period is the compute, 2+2+3+1+3+1
    ((2, 2, 3, 1, 3, 1, 0.5, 0.5), 12.0),
    # forward all-to-alls of 6: the dispatch runs under the MoE dgrad + wgrad (4), the combine under the attention
    # dgrad + wgrad (4): 14 of compute + (6 - 4) + (6 - 4)
    ((4, 2, 3, 1, 3, 1, 6, 1), 18.0),
    # backward all-to-alls of 4: the combine backward starts when the attention dgrad ends and runs under the
    # delayed attention wgrad and the next attention forward (1 + 2); the dispatch backward under the MoE wgrad and
    # forward (1 + 2): 12 + (4 - 3) + (4 - 3)
    ((2, 2, 3, 1, 3, 1, 0.5, 4), 14.0),
]


def _period(times, slowdown: float = 1.0, L: int = 12) -> float:
    """Seconds one more merged layer pair adds (13 layers' pair minus 12 layers')."""
    one = merged_pair(_chunk(*times, L), _chunk(*times, L), slowdown)
    more = merged_pair(_chunk(*times, L + 1), _chunk(*times, L + 1), slowdown)
    return more.end - one.end


@pytest.mark.parametrize(("times", "period"), HAND)
def test_steady_state_pair_exposes_a2a_minus_the_compute_it_hides_under(times, period):
    """One more merged layer pair adds the hand-calculated period: compute + max(0, a2a - overlapping compute) of
    each all-to-all (Megatron-Core TransformerLayerSchedulePlan.run)."""
    assert _period(times) == pytest.approx(period)


# the same rows with compute 1.25x slower while an all-to-all runs (the hardware files' overlap slowdown), by hand:
# an all-to-all of a seconds over compute costs a (1 - 1/1.25) = 0.2 a more compute time, unless the all-to-all
# itself is the longer: then the period keeps its length
SLOWED = [
    # four all-to-alls of 0.5 s, each under compute: 12 + 4 x 0.5 x 0.2
    ((2, 2, 3, 1, 3, 1, 0.5, 0.5), 12.4),
    # the forward ones (6 s) outlast their compute even slowed (4 -> 5 s): unchanged; the backward ones (1 s) + 0.2
    # each
    ((4, 2, 3, 1, 3, 1, 6, 1), 18.4),
    # the backward ones (4 s) outlast their slowed compute (3 -> 3.75 s): unchanged; the forward ones + 0.1 each
    ((2, 2, 3, 1, 3, 1, 0.5, 4), 14.2),
]


@pytest.mark.parametrize(("times", "period"), SLOWED)
def test_compute_under_an_all_to_all_runs_at_the_overlap_slowdown(times, period):
    """Compute sharing the GPU with an all-to-all runs 1.25x slower while it is in flight (arXiv:2507.03114's
    slowdown, as for DP collectives): the hand-calculated steady-state periods above."""
    assert _period(times, 1.25) == pytest.approx(period)


@pytest.mark.parametrize("m", [2, 4])
def test_engine_plays_the_merged_pairs(m):
    """pp 1, m micro-batches: F0 alone, m - 1 merged pairs, the last B alone; with the all-to-alls of HAND's first
    row a pair hides all of them (the first combine backward under the first attention forward, the last combine
    forward under the last attention backward), the lone F and B (run as without the overlap) hide none. The pair's
    compute runs at DGX H100's overlap slowdown sigma (1.19) while each of its 4 L all-to-alls is in flight."""
    times, L = HAND[0][0], 6
    sigma = 1.19    # hardware/dgx-h100.yaml compute.overlap_slowdown (arXiv:2507.03114), NVLink EP
    af, mf, ab, wa, mb, wm, df, db = times
    plain, plain_ep = _synthetic(times, L, m, False)
    step, ep = _synthetic(times, L, m, True)
    assert plain == pytest.approx(m * L * (af + mf + ab + wa + mb + wm + 2 * df + 2 * db))
    assert plain_ep == pytest.approx(m * L * 2 * (df + db))
    lone_f = L * (af + mf + 2 * df)
    lone_b = L * (ab + wa + mb + wm + 2 * db)
    pair = L * (af + mf + ab + wa + mb + wm) + 4 * L * df * (1 - 1 / sigma)     # df = db here
    assert step == pytest.approx(lone_f + (m - 1) * pair + lone_b)
    assert ep == pytest.approx(L * 2 * df + L * 2 * db)
    assert step < plain


def test_a_straggler_pair_is_planned_with_its_slower_compute():
    """On a GPU 1.3x slow, a merged pair's compute takes 1.3x its nominal seconds and the all-to-alls meet that
    compute: with HAND's first row (L = 6 layers, all-to-alls of 0.5 s hidden) and DGX H100's overlap slowdown
    sigma = 1.19, the step at pp 1 and 2 micro-batches is lone F + pair + lone B with every compute x 1.3:
    L (af + mf) 1.3 + L 2 df, L 12 x 1.3 + 4 L df (1 - 1/sigma), L (ab + wa + mb + wm) 1.3 + L 2 db."""
    times, L, k, sigma = HAND[0][0], 6, 1.3, 1.19
    af, mf, ab, wa, mb, wm, df, db = times
    plan = build_plan(_qwen(m=2, ep_overlap=True))
    c = _chunk(*times, L, plan)
    plan = replace(plan, chunks=(c,), optimizer_time=(0.0,), expert_grad_bytes=(0.0,))
    timeline = Engine(plan, full=True, slowdowns={0: k}).run()
    lone_f = L * (af + mf) * k + L * 2 * df
    pair = L * (af + mf + ab + wa + mb + wm) * k + 4 * L * df * (1 - 1 / sigma)
    lone_b = L * (ab + wa + mb + wm) * k + L * 2 * db
    assert timeline.step_time == pytest.approx(lone_f + pair + lone_b)


@pytest.mark.parametrize("parallel", [{}, {"pp": 2, "dp": 4, "ep": 4, "vpp": 2, "schedule": "interleaved-1f1b"}])
def test_never_slower_on_a_real_moe(parallel):
    """On Qwen3-30B-A3B (EP in one NVLink node, all-to-alls shorter than a layer's compute) the overlap is never
    slower, and the exposed EP time falls."""
    plain = simulate(_qwen(m=8, **parallel))
    over = simulate(_qwen(m=8, ep_overlap=True, **parallel))
    assert over.step_time_s < plain.step_time_s
    assert over.to_dict()["exposed_comm_s"]["ep"] < plain.to_dict()["exposed_comm_s"]["ep"]


@pytest.mark.parametrize(("parallel", "says"), [
    ({"ep": 1}, "needs expert parallelism (ep > 1)"),
    ({"moe_dispatcher": "allgather"}, "runs with the alltoall, deepep or hybridep dispatcher only"),
    ({"pp": 2, "dp": 4, "ep": 4, "schedule": "zb-h1"}, "not 'zb-h1'"),
    ({"zero": 2}, "ep_overlap runs with zero 0 or 1"),
])
def test_megatrons_preconditions_are_refused(parallel, says):
    """What Megatron-Core asserts for overlap_moe_expert_parallel_comm (transformer_config.py) is refused, located."""
    with pytest.raises(InputError, match="parallel") as err:
        _qwen(ep_overlap=True, **parallel)
    assert says in str(err.value)


def test_full_recompute_is_refused():
    """Megatron-Core: 'disable full recomputation when enabling overlap_moe_expert_parallel_comm'."""
    with pytest.raises(InputError, match="recompute: full is refused by Megatron-Core"):
        make_scenario(hardware="dgx-h100", nodes=1, model="qwen3-30b-a3b",
                      training={"seq_len": 1024, "global_batch": 16, "micro_batch": 1, "recompute": "full"},
                      parallel={"dp": 8, "ep": 8, "ep_overlap": True})


@pytest.mark.parametrize("parallel", [{}, {"pp": 2, "dp": 4, "ep": 4, "vpp": 2, "schedule": "interleaved-1f1b"}])
def test_the_search_bound_stays_below_the_overlapped_step(parallel):
    """The analytic lower bound the search prunes with never exceeds the simulated step with ep_overlap (it
    counted every all-to-all in full, 1.48 s against 1.33 s simulated, and could prune the winner)."""
    from simtrain.decide.estimate import estimate

    s = _qwen(m=8, ep_overlap=True, **parallel)
    assert estimate(s).lower_bound_s <= simulate(s).step_time_s
