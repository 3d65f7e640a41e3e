"""A cheap analytic estimate of one step, and a lower bound the simulation can never beat.

The estimate reads the same per-operation costs the engine plays out (style rule 5):
``build_plan(scenario)`` gives each virtual stage's forward and backward time
(``chunks[v].forward_time`` / ``backward_time``, TP collectives included), the
optimizer time per pipeline rank, and the collective phases, timed alone on the
cluster graph with :func:`~simtrain.plan.collectives.phase_time_alone` (alpha-beta).

The pipeline term is a recurrence over pipeline ranks. Rank ``r`` cannot start
before micro-batch 0 has gone forward through the stages before it, and then
runs all of its work ``W_r = m x sum over its chunks of (F + B)`` in sequence;
its last backward (micro-batch m-1, chunk 0) also waits for the same backward
on the next rank::

    S_r = sum_{v<r} (F_v + send)          start of rank r
    E_r = max(S_r + W_r, E_{r+1} + send + B_r)   end of rank r's last backward

For ``p`` equal stages of ``t = F + B`` each this is ``(m + p - 1) t``: the bubble
fraction ``(p - 1) / (m + p - 1)`` of GPipe (Huang et al. 2019, Sec. 2.3) and
1F1B (Narayanan et al. 2021, Sec. 2.2.1); with ``v`` chunks per rank
(interleaved) it is ``m v t_chunk + (p - 1) t_chunk``, their bubble ``(p-1)/(v m)``
of the ideal time (Sec. 2.2.2). Every term of the recurrence is work the engine
must do in sequence, with network phases timed alone (the fluid network only ever
shares links, never speeds a flow up), so ``lower_bound_s`` never exceeds the
simulated step time. The estimate adds what the bound leaves out: DP/ZeRO
gradient buckets overlapping the last backward (every backward with ZeRO-2) and
the compute slowdown while they run (only while they run), ZeRO-3 per-layer gathers.

On a single stage (pp = dp = tp = 1) the engine adds nothing to the plan's costs:
the estimate, the bound and the simulation agree (a test says so).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from simtrain.decide.estimate_play import play
from simtrain.plan.balance import resolve_split
from simtrain.plan.build import Plan, build_plan
from simtrain.plan.chunk import ChunkPlan
from simtrain.plan.collectives import phase_time_alone
from simtrain.plan.grad_finalize import tied_partner
from simtrain.plan.schedules import SPLIT_BACKWARD
from simtrain.spec.scenario import Scenario

#: relative slack on the bound: the engine adds the same floats in another order
_ROUNDING = 1e-12


@dataclass(frozen=True)
class EstimateResult:
    """The analytic view of one step, in seconds (SI), for pruning searches and explaining them."""

    step_time_s: float        # the estimate
    lower_bound_s: float      # never more than the simulated step time (0 with jitter or speed-ups)
    compute_s: float          # busiest rank: forward + backward (+ recompute, TP) of all micro-batches
    recompute_s: float        # of compute_s, the recomputed forward work
    tp_comm_s: float          # of compute_s, the TP collectives (on the critical path)
    bubble_s: float           # pipeline fill and drain on the critical rank
    pp_comm_s: float          # pipeline sends on the fill and drain path
    dp_comm_s: float          # exposed DP / ZeRO communication (gradients, parameter gathers)
    optimizer_s: float
    tokens_per_s: float
    mfu: float

    @property
    def bubble_fraction(self) -> float:
        return self.bubble_s / self.step_time_s if self.step_time_s > 0 else 0.0


def _alone(plan: Plan, phases) -> float:
    return sum(phase_time_alone(p, plan.scenario.cluster) for p in phases)


def _full(s: Scenario) -> bool:
    """The engine's fidelity for this scenario (simulate() switches to full for asymmetric runs)."""
    from simtrain.engine.simulation import needs_full

    return s.simulation.fidelity == "full" or (needs_full(s) and s.dp_cp > 1)


def _dp_crosses_nodes(plan: Plan, pp_rank: int) -> bool:
    """Does a DP group of this pipeline rank leave its scale-up domain (its collectives then use the network)?"""
    pl = plan.placement
    return any(len({pl.domain(g) for g in pl.dp_group(t, pp_rank)}) > 1 for t in range(pl.tp))


def _dp_time(plan: Plan, kind: str, nbytes: float, rank: int, full: bool) -> float:
    return _alone(plan, plan.dp_phases(kind, nbytes, rank, full)) if nbytes > 0 else 0.0


def _slowed(t: float, work: float, busy_until: float, slowdown: float) -> float:
    """When ``work`` seconds of compute started at ``t`` end, if collectives run until ``busy_until``:
    compute progresses at 1/slowdown while they run (the engine's ``_compute``)."""
    overlap = busy_until - t
    if overlap <= 0:
        return t + work
    if work * slowdown <= overlap:
        return t + work * slowdown
    return busy_until + work - overlap / slowdown


def _bucketed_backward(c: ChunkPlan, bucket: float, comm, slowdown: float) -> tuple[float, float, float]:
    """The engine's last backward of a chunk with DDP buckets (``Engine._backward_with_buckets``),
    timed with each bucket alone on a FIFO queue: (op seconds with the overlap slowdown,
    seconds the queue runs past the op, bytes of the last bucket)."""
    t = free = pending = last = 0.0

    def seg(sec: float, compute: bool = True) -> None:
        nonlocal t
        t = _slowed(t, sec, free, slowdown) if compute else t + sec

    def launch(nbytes: float) -> None:
        nonlocal free, last
        free = max(t, free) + comm(nbytes)
        last = nbytes

    if c.has_head:
        seg(c.head_bwd)
        seg(c.head_tp_bwd, compute=False)
        pending += c.grad_bytes_edge if not c.has_embedding else 0.0
    for i in reversed(range(c.layers)):   # the engine's order (plan.segments.backward_layers)
        _fwd, bwd, rec, _ep_fwd, ep_bwd, grads = c.layer_costs(i)   # MoE and dense leading layers differ
        if rec > 0:
            seg(rec)
        seg(bwd)
        tp_bwd, cp_bwd, _hidden = c.bwd_comm(i)
        seg(tp_bwd + cp_bwd + ep_bwd + (c.amax_bwd if i == 0 else 0.0), compute=False)
        pending += grads
        if pending >= bucket:
            launch(pending)
            pending = 0.0
    if c.has_embedding:
        seg(c.embed_tp_bwd, compute=False)
        seg(c.embed_bwd)
        pending += c.grad_bytes_edge
    if pending > 0:
        launch(pending)
    seg(c.metrics_bwd)   # training metrics, after the whole backward
    return t, max(0.0, free - t), last


def _zero3_op(c: ChunkPlan, forward: bool, gather: float, scatter: float, slowdown: float,
              prefetch: str = "pre") -> tuple[float, float]:
    """One ZeRO-3 forward or backward of a chunk: each layer's weights gathered one layer ahead (in the
    backward as ``prefetch`` says: "pre" as a layer's compute starts, otherwise once it ends), gradients
    reduce-scattered after each layer, all on one FIFO queue (the engine's single DP stream); compute runs
    slower while the queue is busy. Returns (op seconds, of which waiting for gathers)."""
    waited = 0.0
    ahead = forward or prefetch == "pre"
    t = c.embed_fwd + c.embed_tp_fwd if forward else c.head_bwd + c.head_tp_bwd
    # training metrics after the backward
    head = c.head_fwd + c.head_tp_fwd if forward else c.embed_bwd + c.embed_tp_bwd + c.metrics_bwd
    done = q = t + gather                # layer 0's weights; q: when the collective queue is free
    for i in range(c.layers):
        waited += max(0.0, done - t)
        t = max(t, done)
        if ahead and i + 1 < c.layers:
            q = done = max(t, q) + gather          # prefetch the next layer
        rec = c.recompute_layer if c.recomputes(i) else 0.0
        for work in ((c.fwd_layer,) if forward else (rec, c.bwd_layer)):
            t = _slowed(t, work, q, slowdown)      # slower while a collective is in flight
        t += c.tp_fwd(i) + c.cp_fwd_layer if forward else sum(c.bwd_comm(i)[:2])
        t += (c.amax_fwd if i + 1 == c.layers else 0.0) if forward else (c.amax_bwd if i == 0 else 0.0)
        if not ahead and i + 1 < c.layers:
            q = done = max(t, q) + gather          # the next layer's weights, after this layer's gradients
        if not forward:
            q = max(t, q) + scatter
    return t + head, waited


def estimate(scenario: Scenario, plan: Plan | None = None) -> EstimateResult:
    """Estimate one optimizer step of ``scenario`` and bound it from below (module docstring)."""
    if not isinstance(scenario, Scenario):
        if isinstance(scenario, (str, os.PathLike)):
            from simtrain.spec.scenario import load_scenario

            scenario = load_scenario(scenario)
        else:
            raise TypeError(f"simtrain.estimate: scenario must be a Scenario (simtrain.load_scenario) or the path of "
                            f"a scenario file, not {type(scenario).__name__}")
    s = plan.scenario if plan is not None else resolve_split(scenario)
    plan = plan or build_plan(s)
    par, sim = s.parallel, s.simulation
    p, vpp, m = par.pp, par.vpp, plan.microbatches
    V = p * vpp
    full = _full(s)
    dp_sync = s.dp_cp > 1     # gradients are reduced over dp x cp
    zero = par.zero if dp_sync else 0
    hw = s.hardware
    # compute slows while a DP collective is queued or running, by the fabric it uses
    slow = [hw.overlap_slowdown(_dp_crosses_nodes(plan, r)) for r in range(p)]
    slow_lb = min(1.0, hw.overlap_slowdown(False), hw.overlap_slowdown(True))
    chunks = plan.chunks
    send = [_alone(plan, [plan.pp_phase(plan.pp_bytes, v % p, (v + 1) % p, 0 if full else None)])
            if (v % p) != ((v + 1) % p) else 0.0 for v in range(V - 1)] + [0.0]
    grad_kind = "all_reduce" if zero == 0 else "reduce_scatter"
    # ZeRO-2 reduce-scatters its gradients in buckets after every backward; DDP and ZeRO-1 only
    # after a chunk's last backward, and only when overlap_dp is on (else all at the end)
    bucketed = dp_sync and zero < 3 and (zero == 2 or sim.overlap_dp)

    def comm(r: int):
        # FSDP's cast and pre-divide ahead of each bucket (zero_impl fsdp1), per byte of rank r's chunks
        prep = next(c.grad_prep_per_byte for c in chunks if c.rank == r)
        return lambda nbytes: _dp_time(plan, grad_kind, nbytes, r, full) + prep * nbytes

    # per virtual stage: (lower-bound op times, estimated op times)
    f_lb, b_lb, f_est, b_est, zero3_wait = [], [], [], [], []
    for c in chunks:
        # with ep_overlap every all-to-all may hide under the other micro-batch's compute: the bound drops them
        hidden_ep = (c.layers - c.lead_layers) if par.ep_overlap else 0
        f_lb.append((c.forward_time - hidden_ep * c.ep_fwd_layer) * slow_lb)
        b_lb.append((c.backward_time - hidden_ep * c.ep_bwd_layer) * slow_lb)
        if zero >= 3:
            g = _dp_time(plan, "all_gather", c.zero3_layer_bytes, c.rank, full) \
                + c.gather_prep_per_byte * c.zero3_layer_bytes if c.layers else 0.0   # FSDP2's copy-in
            r = _dp_time(plan, "reduce_scatter", c.grad_bytes_layer, c.rank, full) \
                + c.grad_prep_per_byte * c.grad_bytes_layer   # FSDP's cast and pre-divide (zero_impl fsdp1)
            edge = _dp_time(plan, "all_gather", c.zero3_edge_bytes, c.rank, full) \
                + c.gather_prep_per_byte * c.zero3_edge_bytes   # embedding / output layer
            f_lb[-1] += g + edge
            b_lb[-1] += g + edge
            (tf, wf), (tb, wb) = (_zero3_op(c, True, g, r, slow[c.rank]),
                                  _zero3_op(c, False, g, r, slow[c.rank], par.backward_prefetch))
            f_est.append(tf + edge)
            b_est.append(tb + edge)
            zero3_wait.append(wf + wb + 2 * edge)
        elif zero == 2:
            op_time, past, _ = _bucketed_backward(c, sim.dp_bucket_size, comm(c.rank), slow[c.rank])
            b_est.append(op_time)
            # buckets still in flight when the next operation starts slow it while they run
            f_est.append(_slowed(0.0, c.forward_time, past, slow[c.rank]))
        else:
            f_est.append(c.forward_time)
            b_est.append(c.backward_time)

    def pipeline(f: list[float], b: list[float], last_b: list[float]) -> list[float]:
        """E_r for every rank (module docstring); ``last_b[r]``: rank r's final backward."""
        start = [sum(f[v] + send[v] for v in range(r)) for r in range(p)]
        work = [m * sum(f[c * p + r] + b[c * p + r] for c in range(vpp)) - b[r] + last_b[r] for r in range(p)]
        ends = [0.0] * p
        for r in reversed(range(p)):
            ends[r] = start[r] + work[r]
            if r + 1 < p:
                ends[r] = max(ends[r], ends[r + 1] + send[r] + last_b[r])
        return ends

    played = par.schedule in SPLIT_BACKWARD
    # the tail after each rank's last backward: DP gradient sync, optimizer, ZeRO-1/2 parameter gather
    tail_lb, tail_est, last_b_est = [], [], list(b_est[:p])
    for r in range(p):
        opt = plan.optimizer_time[r]
        gather = gather_est = 0.0
        if zero in (1, 2):
            # the dense weights over dp; a mixture of experts' routed weights over their own (expert data-parallel)
            # group, queued before them on the DP stream (the engine's end of step): the bound counts the dense
            # gather only, the estimate both
            expert_bytes = plan.expert_params_local[r] * plan.param_bytes if plan.has_experts else 0.0
            dense_bytes = plan.stage_memory[r].params_local * plan.param_bytes - expert_bytes
            gather = gather_est = _dp_time(plan, "all_gather", dense_bytes, r, full)
            if expert_bytes and plan.placement.edp > 1:
                gather_est += _alone(plan, plan.edp_phases("all_gather", expert_bytes, r))
        dp_lb = dp_est = 0.0
        if bucketed:      # the last bucket leaves when the last backward ends: at least its time is exposed
            op_time, past, last = _bucketed_backward(chunks[r], sim.dp_bucket_size, comm(r), slow[r])
            dp_lb, dp_est, last_b_est[r] = comm(r)(last), past, op_time
            if played:   # the last bucket of whichever chunk finishes last: at least the smallest of them
                dp_lb = min(comm(r)(_bucketed_backward(chunks[v], sim.dp_bucket_size, comm(r), slow[r])[2])
                            for v in plan.layout.stages_of(r))
        elif dp_sync and zero < 3:   # no overlap: every bucket after the last backward, one after another
            for v in plan.layout.stages_of(r):
                c = chunks[v]
                total = c.grad_bytes_layers + c.grad_bytes_edge
                if total > 0:
                    n = max(1, math.ceil(total / sim.dp_bucket_size))
                    dp_lb += n * comm(r)(total / n)
            dp_est = dp_lb
        # the tied embedding's gradient sum with the other end, the TP sum of replicated weights' (grad_finalize)
        tied_bytes = plan.tied_grad_bytes[r] if plan.tied_grad_bytes else 0.0
        tied = _alone(plan, [plan.pp_phase(tied_bytes, r, tied_partner(plan.tied_ends, r), 0 if full else None)]) \
            if tied_bytes else 0.0
        tp_grads = plan.replicated_grad_tp[r][0] if plan.replicated_grad_tp else 0.0
        tail_lb.append(dp_lb + tied + tp_grads + opt * slow_lb + gather)
        tail_est.append((dp_est + tied, opt, gather_est, tp_grads))

    if played:   # split backwards, V layouts, two directions, overlapped pairs: play the op lists out
        layout = plan.layout
        sends = {}
        for v, w in enumerate(layout.next):
            if w >= 0 and layout.rank[v] != layout.rank[w]:
                t = _alone(plan, [plan.pp_phase(plan.pp_bytes, layout.rank[v], layout.rank[w], 0 if full else None)])
                sends[(v, w)] = sends[(w, v)] = t
        ends_lb = play(plan, sends, slow_lb, pair_compute_only=True)[0]
    else:
        ends_lb = pipeline(f_lb, b_lb, b_lb[:p])
    lower = max(e + t for e, t in zip(ends_lb, tail_lb)) * (1.0 - _ROUNDING)
    if sim.jitter > 0 or any(st.slowdown < 1 for st in sim.stragglers):
        lower = 0.0   # random or faster kernels: no bound from nominal costs

    if played:   # the estimate: the same play at the plan's times (the bound's, when they are the same)
        pairs = any(op.kind == "FB" for ops in plan.schedule for op in ops)
        ends = ends_lb if slow_lb == 1.0 and not pairs else play(plan, sends)[0]
    else:
        ends = pipeline(f_est, b_est, last_b_est)
    finish = [e + sum(t) for e, t in zip(ends, tail_est)]
    crit = max(range(p), key=lambda r: (finish[r], -r))
    step = finish[crit]
    dp_exp, opt, gather, _ = tail_est[crit]
    # micro-batches through each chunk of a rank (DualPipe's two copies see half of them each)
    per_chunk = m / 2 if par.schedule == "dualpipe" else m
    own = [sum(f_est[v] + b_est[v] for v in plan.layout.stages_of(r)) * per_chunk for r in range(p)]
    busiest = max(range(p), key=lambda r: own[r])
    rank_chunks = [chunks[v] for v in plan.layout.stages_of(busiest)]
    # only the layers that re-run their forward (recompute_layers of each stage under partial recompute: the
    # chunk's own per-layer rule, as its backward_time charges it)
    recompute = per_chunk * sum(c.layer_costs(i)[2] for c in rank_chunks for i in range(c.layers))
    tp = per_chunk * sum(sum(c.tp_totals) + c.edge_tp for c in rank_chunks) + tail_est[busiest][3]
    pp_comm = 2.0 * sum(send[:p - 1])
    # idle time of the busiest rank while the pipeline fills and drains: (p - 1) t for equal stages
    bubble = max(0.0, max(ends) - own[busiest] - pp_comm) if p > 1 else 0.0
    if zero >= 3:   # parameter gathers the busiest rank's ZeRO-3 layers wait for
        dp_exp += per_chunk * sum(zero3_wait[c.vstage] for c in rank_chunks)
    peak = s.hardware.gpu.peak("bf16" if s.training.precision == "fp8" else s.training.precision)   # MFU: BF16
    return EstimateResult(
        step_time_s=step, lower_bound_s=lower, compute_s=own[busiest], recompute_s=recompute, tp_comm_s=tp,
        bubble_s=bubble, pp_comm_s=pp_comm, dp_comm_s=dp_exp + gather,
        optimizer_s=opt, tokens_per_s=s.tokens_per_step / step,
        mfu=plan.model_flops_per_step / (step * s.gpus * peak))
