"""A step-time floor for every layout of a search at once: what lets a search skip building most layouts.

Screening one layout (its scenario, memory ledger and analytic estimate) costs milliseconds of Python; a search
enumerates tens of thousands. Most of them cannot reach the top K whatever their memory: their compute alone is
slower than the K-th best simulated step. This module bounds every layout's step from below over the whole layout
table with numpy, from per-layer figures computed once per (tp, sequence parallelism, cp, micro-batch, precision,
recompute) (:func:`simtrain.plan.layer_floor.layer_floor`), and the search screens a layout only while its floor
can still beat the K-th best.

With ``p`` pipeline ranks, ``v`` chunks per rank, ``m`` micro-batches, ``n = L / (p v)`` layers per chunk, a layer's
forward ``f`` and backward ``b`` floors and the output layer's ``h`` (forward and backward):

- 1F1B, GPipe and interleaved 1F1B with an even split: the analytic bound's recurrence
  (:mod:`simtrain.decide.estimate`) with every chunk at its floor and the embedding, sends and the tail (DP
  gradients, optimizer, parameter gathers) left out: ``(p - 1) n (f + b) + m (v n (f + b) + h)`` (the fill through
  the first p - 1 stages, the last rank's work, the drain back);
- an uneven (auto) split, and the zero-bubble and DualPipe schedules: the busiest rank's work at least the mean,
  ``m (L (f + b) + h) / p``, and (one chunk per rank) at least ``m ceil(L/p) (f + b)``; with one stage per rank
  and no split backward, also the recurrence's fill and drain with the last stage's layers unknown,
  ``L (f + b) + m h``; ZB-H1 (1F1B's stages) with an even split at least ``(p - 1) n f + m (n (f + b) + h)`` (the
  last rank waits for the first forward); DualPipe's overlapped pairs may hide communication, so its layers count
  their compute alone;
- with the optimizer on the host (``offload_optimizer``) and the recurrence's schedules, plus the first rank's
  host step for at least its layers' and embedding's share of the parameters (``plan.offload_optimizer``);
- times the smallest compute slowdown under overlapped collectives (1 unless a hardware file says otherwise).

Every term is one the analytic lower bound also counts, with per-layer figures no larger than the plan's, so the
floor never exceeds the lower bound, which never exceeds the simulated step (a test checks both on every layout of
several searches). Models whose layers differ (experts, latent or sliding-window attention) get no floor (0): every
one of their layouts is screened, as before.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from simtrain.decide.search_result import layout_overrides
from simtrain.plan.layer_floor import layer_floor, memory_floor
from simtrain.plan.memory import edge_params, layer_params_per_rank
from simtrain.plan.offload_optimizer import cpu_adam_bandwidth, host_step
from simtrain.plan.schedules import SPLIT_BACKWARD
from simtrain.spec.errors import InputError
from simtrain.spec.scenario import Scenario

#: relative slack on the floor: it adds the same floats as the bound in another order
_ROUNDING = 1e-9
#: the keys a layer's floor depends on
FLOOR_KEYS = ("tp", "sequence_parallel", "cp", "micro_batch", "precision", "recompute")


def floors(scenario: Scenario, base: dict[str, Any], layouts: list[dict[str, Any]]) -> np.ndarray:
    """Each layout's step-time floor in seconds (module docstring); 0 where none is known."""
    out = np.zeros(len(layouts))
    model = scenario.model
    if not layouts or model.layers_differ or scenario.simulation.jitter > 0 or scenario.simulation.stragglers:
        return out
    reps: dict[tuple, Scenario | None] = {}       # (tp, sequence parallelism, cp) -> a layout's scenario
    per_key: dict[tuple, tuple[float, float, float, float]] = {}
    f, b, c, h = (np.zeros(len(layouts)) for _ in range(4))
    known = np.zeros(len(layouts), dtype=bool)
    def time_figures(rep: Scenario, layout: dict, recompute: str) -> tuple[float, float, float, float]:
        lf = layer_floor(rep, micro_batch=layout["micro_batch"], precision=layout["precision"], recompute=recompute)
        return lf.forward, lf.backward, lf.compute, lf.head

    for i in range(len(layouts)):
        # a partial-recompute variant recomputes some layers: no more than none; added modules: no less than selective
        figures = _figures(scenario, base, layouts, i, reps, per_key, time_figures,
                           "none" if layouts[i].get("partial") else layouts[i]["recompute"])
        f[i], b[i], c[i], h[i] = figures
        known[i] = figures != (0.0, 0.0, 0.0, 0.0)
    col = {k: np.array([layout[k] for layout in layouts]) for k in ("pp", "vpp", "dp", "micro_batch")}
    p, v = col["pp"].astype(float), col["vpp"].astype(float)
    m = scenario.training.global_batch / (col["dp"] * col["micro_batch"]).astype(float)
    L = float(model.layers)
    schedule = np.array([layout["schedule"] for layout in layouts])
    split = np.isin(schedule, list(SPLIT_BACKWARD))
    paired = np.isin(schedule, ["dualpipe", "dualpipev"])
    uneven = np.array([layout.get("layers_per_stage") == "auto" for layout in layouts]) | (L % (p * v) != 0)
    layer = np.where(paired, c, f + b)
    n = L / (p * v)
    recurrence = (p - 1) * n * layer + m * (v * n * layer + h)
    mean = m * (L * layer + h) / p
    busiest = np.where((v == 1) & ~paired, m * np.ceil(L / p) * layer, 0.0)
    # one stage per rank, not split: the first micro-batch's forward and backward through every layer, then the
    # last stage's other micro-batches (the recurrence with the last stage's layers unknown, at least 0)
    chain = np.where((v == 1) & ~split, L * layer + m * h, 0.0)
    # ZB-H1 (1F1B's stages): the last rank starts once the first micro-batch has gone forward through the others
    zb_fill = np.where((schedule == "zb-h1") & ~uneven, (p - 1) * n * f + m * (n * layer + h), 0.0)
    floor = np.where(split | uneven, np.maximum.reduce([mean, busiest, chain, zb_fill]), recurrence)
    # the optimizer on the host: the recurrence ends with the first rank's last backward, then its host step (the
    # analytic bound's tail): its shard is at least its layers' parameters (and the embedding's) over dp x cp
    host = np.zeros(len(layouts))
    hw = scenario.hardware
    for i, layout in enumerate(layouts):
        if layout.get("offload_optimizer") and not (split[i] or uneven[i]) and known[i]:
            pp, tp = layout["pp"], layout["tp"]
            shard = ((L // pp) * layer_params_per_rank(model, tp) + edge_params(model, tp, pp, first=True,
                                                                                   last=pp == 1)) \
                / (layout["dp"] * layout.get("cp", 1))
            host[i] = host_step(shard, hw.inter_node.pcie_bandwidth, cpu_adam_bandwidth(hw),
                                base.get("gpus_per_node", scenario.gpus_per_node)).total   # the searched cluster's
    floor = floor + host
    slow = min(1.0, hw.overlap_slowdown(False), hw.overlap_slowdown(True))
    return np.where(known, floor * slow * (1.0 - _ROUNDING), 0.0)


def memory_floors(scenario: Scenario, base: dict[str, Any], layouts: list[dict[str, Any]],
                  cache: dict | None = None) -> np.ndarray:
    """Each layout's peak memory floor in bytes on its busiest GPU; 0 where none is known (models whose layers
    differ). The ledger's terms (``simtrain.plan.memory.stage_memory``) that every layout pays, with the rest (the
    embedding and output layer, FP8 weight copies, ZeRO-3 and CP buffers, masks, transient peaks) left out:

    - weights, gradients and optimizer state of the rank with the most layers (at least ceil(L / p); DualPipe holds
      two chunks of L / p), each sharded over dp x cp as ZeRO shards it; with an uneven split, also one micro-batch's
      activations of those layers (held together once its last forward there ends), the output layer's rank's edges
      and one micro-batch's logits, and on the second rank (with
      three or more, its chunks are middle stages of at least a layer each) a layer's activations per chunk
      forward it keeps in flight;
    - with an even split and no activation offloading, the ranks holding the embedding, the output layer and the
      most micro-batches: their layers and edges, and their layers' activations (and the loss's logits, 4 or 2
      bytes each, on the output layer's rank when it holds one chunk and B is not split) times the micro-batches
      each holds at its peak (``inflight_microbatches``; for the split-backward schedules ``inflight_peak`` of its
      op list with the ledger's share kept from B to W);
    - a recomputed layer's short-lived peak, on every rank under full or op-level recompute;
    - the hardware's fixed overheads (CUDA context, workspace, communication buffers) and fragmentation on the
      tensors counted.
    """
    from simtrain.plan.memory import fsdp1_sharded_state, inflight_microbatches, state_bytes_per_param
    from simtrain.plan.schedules import inflight_peak, rank_schedules, stage_layout

    out = np.zeros(len(layouts))
    model, tr, par = scenario.model, scenario.training, scenario.parallel
    if not layouts or model.layers_differ:
        return out
    cache = {} if cache is None else cache     # what calls on parts of one search's layouts share
    reps: dict[tuple, Scenario | None] = cache.setdefault("reps", {})
    per_key: dict[tuple, tuple[float, float, float, float]] = cache.setdefault("per_key", {})
    states: dict[str, tuple[float, float, float]] = cache.setdefault("states", {})
    inflight: dict[tuple, tuple] = cache.setdefault("inflight", {})   # (schedule, pp, m, vpp, B-W share) -> peaks
    op_lists: dict[tuple, tuple] = cache.setdefault("ops", {})        # (schedule, pp, m, vpp) -> op lists
    L = model.layers

    def ops_of(schedule: str, pp: int, m: int, vpp: int) -> tuple:
        key = (schedule, pp, m, vpp)
        if key not in op_lists:
            op_lists[key] = rank_schedules(schedule, pp, m, vpp)
        return op_lists[key]
    def memory_figures(rep: Scenario, layout: dict, recompute: str) -> tuple[float, float, float, float]:
        def of(mode: str) -> tuple[float, float, float, float]:
            return memory_floor(rep, micro_batch=layout["micro_batch"], precision=layout["precision"], recompute=mode)

        if recompute != "selective+":
            return of(recompute)
        # modules added to selective recompute: a layer keeps at least what full recompute keeps (its input), and
        # the added modules' short-lived peak is left out
        sel, full = of("selective"), of("full")
        return sel[0], min(sel[1], full[1]), 0.0, min(sel[3], full[3])

    for i, layout in enumerate(layouts):
        # a partial-recompute variant keeps at least what full recompute keeps; one adding modules, see above
        mode = "full" if layout.get("partial") else "selective+" if layout.get("modules") else layout["recompute"]
        params, act, transient, w_share = _figures(scenario, base, layouts, i, reps, per_key, memory_figures, mode)
        if not params:
            continue
        precision, zero, pp, vpp = layout["precision"], layout["zero"], layout["pp"], layout["vpp"]
        shards = layout["dp"] * layout.get("cp", 1)
        if precision not in states:
            st = state_bytes_per_param(precision, tr.optimizer, tr.grad_dtype)
            fs = fsdp1_sharded_state(st) if par.zero_impl == "fsdp1" and precision != "fp32" else st
            states[precision] = (min(st.weights, fs.weights), min(st.grads, fs.grads),
                                 min(st.optimizer, fs.optimizer))
        w, g, o = states[precision]
        o = 0.0 if par.offload_optimizer or layout.get("offload_optimizer") else o   # its state in host memory
        per_param = w / (shards if zero >= 3 else 1) + g / (shards if zero >= 2 else 1) + \
            o / (shards if zero >= 1 else 1)
        schedule = layout["schedule"]
        even = layout.get("layers_per_stage") is None and L % (pp * vpp) == 0
        busiest = 2 * L // pp if schedule == "dualpipe" else -(-L // pp)
        floor = busiest * params * per_param
        offloads = tr.activation_offload_layers or layout.get("offload")   # activations may go to host memory
        if not even and schedule != "dualpipe" and not offloads:
            # any split: the rank with the most layers holds all their activations of the first micro-batch once its
            # last forward there ends (its backwards all come after; a V-shape's second chunk runs before the first's)
            floor += busiest * max(0.0, act)
            # the output layer's rank: its edges, and one micro-batch's logits held from its forward to its backward
            lay = stage_layout(schedule, pp, vpp)
            last_stage = max(lay.model_stage)
            r = lay.rank[lay.model_stage.index(last_stage)]
            stages = {lay.model_stage[v] for v in lay.stages_of(r)}
            logits = (2.0 if tr.cross_entropy == "fused" else 4.0) * (tr.seq_len // layout.get("cp", 1)) * \
                layout["micro_batch"] * model.vocab / layout["tp"] * (2.0 if precision == "fp32" else 1.0)
            floor = max(floor, edge_params(model, layout["tp"], pp, first=0 in stages, last=True) * per_param
                        + logits)
            if pp >= 3:
                # the second rank's chunks are all middle stages, each at least one layer (balance.py's lower
                # bounds): its peak holds at least one layer per chunk forward it keeps in flight
                m = tr.global_batch // (layout["dp"] * layout["micro_batch"])
                key = ("rank 1", schedule, pp, m, vpp, w_share)
                if key not in inflight:
                    chunks = [stage_layout(schedule, pp, vpp).chunk[v]
                              for v in stage_layout(schedule, pp, vpp).stages_of(1)]
                    units = inflight_peak(ops_of(schedule, pp, m, vpp)[1], {c: 1.0 for c in chunks},
                                          w_share) \
                        if schedule in SPLIT_BACKWARD else inflight_microbatches(schedule, m, pp, 1, vpp) * vpp
                    inflight[key] = (len(chunks), units)
                k, units = inflight[key]
                floor = max(floor, k * params * per_param + max(0.0, act) * units)
        if even and not offloads:
            m = tr.global_batch // (layout["dp"] * layout["micro_batch"])
            lay = stage_layout(schedule, pp, vpp)
            key = (schedule, pp, m, vpp, w_share)
            if key not in inflight:
                if schedule in SPLIT_BACKWARD:
                    ops = ops_of(schedule, pp, m, vpp)
                    held_by_rank = []
                    for r in range(pp):
                        chunks = [lay.chunk[v] for v in lay.stages_of(r)]
                        held_by_rank.append(inflight_peak(ops[r], {c: 1.0 / len(chunks) for c in chunks}, w_share))
                else:
                    held_by_rank = [inflight_microbatches(schedule, m, pp, r, vpp) for r in range(pp)]
                inflight[key] = (len(lay.stages_of(0)), held_by_rank)
            k, held = inflight[key]
            layers = k * L // (pp * vpp)      # every chunk holds L / (p v) layers
            logits = (2.0 if tr.cross_entropy == "fused" else 4.0) * (tr.seq_len // layout.get("cp", 1)) * \
                layout["micro_batch"] * model.vocab / layout["tp"] * (2.0 if precision == "fp32" else 1.0)
            last_stage = max(lay.model_stage)
            busiest_held = max(range(pp), key=lambda r: held[r])
            for r in {lay.rank[lay.model_stage.index(0)], lay.rank[lay.model_stage.index(last_stage)], busiest_held}:
                stages = {lay.model_stage[v] for v in lay.stages_of(r)}
                first, last = 0 in stages, last_stage in stages
                # the ledger's rank r: its layers and edges, its activations and (the output layer's rank) logits,
                # times the micro-batches it holds at its peak; a rank of several chunks keeps the logits only on
                # the last stage's chunk, whose in-flight count its peak does not bound, and a split backward keeps
                # the logits' gradient, not the logits, from B to W (plan/memory_chunks.py), so there they are left
                # out
                with_logits = last and k == 1 and schedule not in SPLIT_BACKWARD
                edges = edge_params(model, layout["tp"], pp, first=first, last=last)
                floor = max(floor, (layers * params + edges) * per_param +
                            max(0.0, act * layers + (logits if with_logits else 0.0)) * held[r])
        out[i] = floor + transient     # every rank's peak has a recomputed layer's on top (the ledger's)
    ov = scenario.hardware.memory_overheads
    fixed = ov.cuda_context + ov.workspace + ov.comm_buffers
    return np.where(out > 0, out * (1.0 + ov.fragmentation) + fixed, 0.0) * (1.0 - _ROUNDING)


def _figures(scenario: Scenario, base: dict[str, Any], layouts: list[dict[str, Any]], i: int, reps: dict,
             per_key: dict, compute, recompute: str) -> tuple:
    """Layout i's per-key figures, ``compute(representative scenario, layout, recompute)``, once per
    :data:`FLOOR_KEYS` value (with ``recompute`` for the layout's own); zeros where the rules accept no layout of
    its (tp, sequence parallelism, cp)."""
    layout = layouts[i]
    key = (*(layout.get(k, 1) for k in FLOOR_KEYS[:-1]), recompute)
    figures = per_key.get(key)
    if figures is None:
        shape = key[:3]
        if shape not in reps:
            reps[shape] = _representative(scenario, base, layouts, i, shape)
        rep = reps[shape]
        figures = per_key[key] = (0.0, 0.0, 0.0, 0.0) if rep is None else compute(rep, layout, recompute)
    return figures


def _representative(scenario: Scenario, base: dict[str, Any], layouts: list[dict[str, Any]], start: int,
                    shape: tuple) -> Scenario | None:
    """The scenario of the first layout from ``start`` on with this (tp, sequence parallelism, cp) that the scenario
    rules accept (its other keys do not enter a layer's floor), or None."""
    tried = 0
    for layout in layouts[start:]:
        if tuple(layout.get(k, 1) for k in FLOOR_KEYS[:3]) != shape:
            continue
        try:
            return scenario.with_overrides({**base, **layout_overrides(layout)})
        except InputError:
            tried += 1
            if tried >= 8:     # a tp/cp the rules keep refusing: no floor for it (its layouts are all screened)
                return None
    return None
