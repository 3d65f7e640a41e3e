"""From a scenario to a plan: every cost the engine needs, computed once, without simpy.

The plan holds, per virtual stage (chunk), the per-layer compute times, the
TP communication each layer waits for, the activation bytes one micro-batch
leaves behind, the gradient bytes for DP buckets and the parameter bytes
ZeRO-3 gathers; plus the schedule (plain data) and the collective phases on
the cluster graph. The analytic estimate and the engine both read it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

from simtrain.plan import costs
from simtrain.plan.collectives import (
    Phase,
    collective_shape,
    p2p_phase,
    phase_time_alone,
)
from simtrain.plan.memory import (
    StageMemory,
    edge_params,
    layer_params_per_rank,
    stage_memory,
    state_bytes_per_param,
    weight_grad_fraction,
)
from simtrain.plan.schedules import Op, StageLayout, rank_schedules, stage_layout
from simtrain.spec.placement import Placement, placement_of
from simtrain.spec.scenario import Scenario


@dataclass(frozen=True)
class ChunkPlan:
    """One virtual stage: a run of consecutive layers on one pipeline rank."""

    vstage: int
    rank: int
    chunk: int
    layer_lo: int
    layers: int
    has_embedding: bool
    has_head: bool
    fwd_layer: float          # s, compute of one layer forward
    bwd_layer: float          # s, compute of one layer backward (without recompute)
    recompute_layer: float    # s, recomputed forward work before a layer's backward
    tp_fwd_layer: float       # s, TP collectives of one layer forward (on the critical path)
    tp_bwd_layer: float       # s, TP collectives of one layer backward (+ recomputed forward's)
    embed_fwd: float
    embed_bwd: float
    head_fwd: float
    head_bwd: float
    act_bytes: float          # activation bytes one micro-batch leaves on this rank until its backward
    grad_bytes_layer: float   # gradient bytes of one layer (per TP rank) for DP buckets
    grad_bytes_edge: float    # embedding / output-layer gradient bytes held by this chunk
    zero3_layer_bytes: float  # full (unsharded) 16-bit weights of one layer, per TP rank
    zero3_edge_bytes: float = 0.0  # full embedding / output-layer weights held by this chunk (ZeRO-3 gathers)
    metrics_bwd: float = 0.0  # s, training metrics over the logits after the chunk's backward (output-layer chunk)
    grad_prep_per_byte: float = 0.0  # s per gradient byte spent before its reduce-scatter (zero_impl fsdp1)
    wgrad_layer: float = 0.0  # s, the weight-gradient part of bwd_layer (a split backward's W per layer)
    embed_wgrad: float = 0.0  # s, the weight-gradient part of embed_bwd
    head_wgrad: float = 0.0   # s, the weight-gradient part of head_bwd
    act_w_bytes: float = 0.0  # of act_bytes, what a split backward keeps from its B until its W

    @property
    def forward_time(self) -> float:
        return self.embed_fwd + self.layers * (self.fwd_layer + self.tp_fwd_layer) + self.head_fwd

    @property
    def backward_time(self) -> float:
        per = self.recompute_layer + self.bwd_layer + self.tp_bwd_layer
        return self.head_bwd + self.layers * per + self.embed_bwd + self.metrics_bwd


@dataclass(frozen=True)
class Plan:
    scenario: Scenario
    placement: Placement
    chunks: tuple[ChunkPlan, ...]            # by virtual stage
    schedule: tuple[tuple[Op, ...], ...]     # per pipeline rank
    layout: StageLayout                      # where each virtual stage runs, which stages it talks to
    microbatches: int
    stage_memory: tuple[StageMemory, ...]
    optimizer_time: tuple[float, ...]        # per pipeline rank
    model_flops_per_step: float
    hardware_flops_per_step: float
    dtype_bytes: int
    framework_overhead_layer: float = 0.0    # s per layer and micro-batch charged for the framework (FSDP1 hooks)
    phases: dict = field(default_factory=dict, repr=False)

    # --- collectives -------------------------------------------------------
    def _groups(self, kind: str, pp_rank: int, dp_index: int | None) -> list[list[int]]:
        pl = self.placement
        if kind == "dp":
            return [pl.dp_group(t, pp_rank) for t in range(pl.tp)]
        if kind == "tp":
            dps = range(pl.dp) if dp_index is None else [dp_index]
            return [pl.tp_group(d, pp_rank) for d in dps]
        raise ValueError(kind)

    def dp_phases(self, collective: str, nbytes: float, pp_rank: int, every: bool = False) -> list[Phase]:
        """A DP/ZeRO collective of one stage: the tp DP groups of that stage run it together."""
        pl = self.placement
        cluster = self.scenario.cluster
        key = ("dp", collective, pl.dp, pl.tp, pl.pp, pp_rank, every)   # the groups follow from the layout
        shape = cluster.shapes.get(key)
        if shape is None:
            shape = collective_shape(collective, self._groups("dp", pp_rank, None), cluster, every)
            cluster.shapes[key] = shape
        return [s.phase(nbytes) for s in shape] if nbytes > 0 else []

    def pp_phase(self, nbytes: float, src_rank: int, dst_rank: int, dp_index: int | None) -> Phase:
        """Activation/gradient send between adjacent stages by every TP rank (and DP replica if folded)."""
        key = ("pp", nbytes, src_rank, dst_rank, dp_index)
        hit = self.phases.get(key)
        if hit is None:
            pl = self.placement
            dps = range(pl.dp) if dp_index is None else [dp_index]
            pairs = [(pl.rank(d, t, src_rank), pl.rank(d, t, dst_rank)) for d in dps for t in range(pl.tp)]
            if dp_index is not None:
                pairs.sort(key=lambda p: p[0] != pl.rank(dp_index, 0, src_rank))
            hit = p2p_phase(nbytes, pairs, self.scenario.cluster, every=dp_index is not None)
            self.phases[key] = hit
        return hit

    def tp_scale(self, pp_rank: int, dp_index: int | None) -> float:
        """How much slower one replica's TP collectives run than the symmetric (folded) figure the
        chunks carry: 1 unless degraded links break the symmetry (full fidelity only)."""
        if dp_index is None or self.placement.tp == 1 or not self.scenario.simulation.degraded_links:
            return 1.0
        tr, m = self.scenario.training, self.scenario.model
        nbytes = tr.micro_batch * tr.seq_len * m.hidden * self.dtype_bytes
        base = _tp_time(self.scenario, self.placement, nbytes, pp_rank)
        own = _tp_time(self.scenario, self.placement, nbytes, pp_rank, dp_index)
        return own / base if base > 0 else 1.0

    @cached_property
    def pp_bytes(self) -> float:
        """b x s x h activations in 16-bit, split over the TP ranks (Megatron scatter/gather)."""
        tr, m = self.scenario.training, self.scenario.model
        return tr.micro_batch * tr.seq_len * m.hidden * self.dtype_bytes / self.placement.tp


def _tp_time(scenario: Scenario, placement: Placement, nbytes: float, pp_rank: int,
             dp_index: int | None = None) -> float:
    """Seconds of the TP collectives of one layer pass: 2 all-reduces of the activations
    (Megatron: one after attention, one after the MLP), or with sequence parallelism
    2 all-gathers + 2 reduce-scatters of the same size (Korthikanti et al. 2022, Sec. 4.2.2).
    ``dp_index`` None: all replicas' TP groups at once (folded); an index: that replica's group alone,
    its slowest flow setting the pace (full fidelity, degraded links)."""
    if placement.tp == 1:
        return 0.0
    cluster = scenario.cluster
    kinds = ("all_gather", "reduce_scatter") if scenario.parallel.sequence_parallel else ("all_reduce",)
    scale = {(d.a, d.b): d.factor for d in scenario.simulation.degraded_links}
    one = 0.0
    for kind in kinds:
        key = ("tp", kind, placement.dp, placement.tp, placement.pp, pp_rank, dp_index)
        shapes = cluster.shapes.get(key)
        if shapes is None:
            dps = range(placement.dp) if dp_index is None else [dp_index]
            groups = [placement.tp_group(d, pp_rank) for d in dps]
            shapes = collective_shape(kind, groups, cluster, every=dp_index is not None)
            cluster.shapes[key] = shapes
        one += sum(phase_time_alone(shape.phase(nbytes), cluster, scale) for shape in shapes)
    return 2.0 * one


#: the backward's TP collectives, in forward-collective units, per recompute mode: full recompute runs the forward's
#: again; torchtitan's op-level policy (selective_op) re-runs the collective after the attention output (an
#: all-reduce, or with sequence parallelism the all-gathers before the attention and the MLP; reduce-scatter outputs
#: are kept), i.e. half of them
_TP_RECOMPUTE = {"full": 2.0, "selective_op": 1.5}


def build_plan(scenario: Scenario) -> Plan:
    par, tr, m, hw = scenario.parallel, scenario.training, scenario.model, scenario.hardware
    dev = costs.Device(gpu=hw.gpu, compute=hw.compute, dtype=tr.precision,
                       attention_speed=hw.compute.attention_speed(tr.attention_kernel))
    placement = placement_of(scenario)
    mb = scenario.microbatches
    tokens = tr.micro_batch * tr.seq_len
    shape = costs.LayerShape(tokens=tokens, seq=tr.seq_len, batch=tr.micro_batch, hidden=m.hidden,
                             ffn=m.ffn_hidden, heads=m.heads, kv_width=m.kv_width, mlp_matrices=m.mlp_matrices,
                             tp=par.tp, sequence_parallel=par.sequence_parallel and par.tp > 1,
                             flash=tr.attention_kernel != "none", dropout=tr.dropout)
    lc = costs.layer_cost(shape, dev, tr.recompute)
    edge = costs.edge_cost(tokens, m.hidden, m.vocab, par.tp, dev, tr.cross_entropy)
    metrics = costs.train_metrics_time(tokens, m.vocab, par.tp, dev, tr.train_metrics)
    state = state_bytes_per_param(tr.precision, tr.optimizer, tr.grad_dtype)
    act_full = tokens * m.hidden * dev.element_bytes
    mems = tuple(stage_memory(scenario, r) for r in range(par.pp))
    tp_cost = [_tp_time(scenario, placement, act_full, r) for r in range(par.pp)]

    per_layer_local = layer_params_per_rank(m, par.tp)
    # PyTorch FSDP's flat-parameter gradient handling (parallel.zero_impl: fsdp1), ZeRO-2/3 over 2+ ranks
    fsdp1 = par.zero_impl == "fsdp1" and par.zero >= 2 and par.dp > 1
    cat_pp, prep_pp = costs.fsdp1_grad_bytes(state.weights, state.grads) if fsdp1 else (0.0, 0.0)
    unit_overhead = costs.FSDP1_UNIT_OVERHEAD if fsdp1 else 0.0   # per layer (FSDP unit) and micro-batch
    # per gradient byte; the two kernels' launch gaps (cast, pre-divide) are below a microsecond per unit and left out
    prep_per_byte = dev.memory_time(prep_pp / state.grads, kernels=0)

    def cat_time(n_params: float) -> float:
        return dev.memory_time(n_params * cat_pp, kernels=1) if cat_pp and n_params else 0.0
    vstages = scenario.virtual_stages
    layout = stage_layout(par.schedule, par.pp, par.vpp)
    w_fraction = weight_grad_fraction(scenario)
    starts = [sum(scenario.layers_per_stage[:s]) for s in range(vstages)]
    chunks = []
    for v, model_stage in enumerate(layout.model_stage):
        n_layers = scenario.layers_per_stage[model_stage]
        lo = starts[model_stage]
        chunk, rank = layout.chunk[v], layout.rank[v]
        first, last = model_stage == 0, model_stage == vstages - 1
        rank_layers = mems[rank].layers
        share = n_layers / rank_layers if rank_layers else 1.0
        act = mems[rank].activation_per_microbatch * share
        n_edge = edge_params(m, par.tp, par.pp, first=first, last=last)
        edge_grad = n_edge * state.grads
        tp_fwd = tp_cost[rank]
        tp_bwd = tp_cost[rank] * _TP_RECOMPUTE.get(tr.recompute, 1.0)
        chunks.append(ChunkPlan(
            vstage=v, rank=rank, chunk=chunk, layer_lo=lo, layers=n_layers, has_embedding=first, has_head=last,
            fwd_layer=lc.forward + unit_overhead / 3.0,
            bwd_layer=lc.backward + cat_time(per_layer_local) + 2.0 * unit_overhead / 3.0, recompute_layer=lc.recompute,
            tp_fwd_layer=tp_fwd, tp_bwd_layer=tp_bwd,
            embed_fwd=edge.embed_forward if first else 0.0,
            embed_bwd=edge.embed_backward + cat_time(n_edge) if first else 0.0,
            head_fwd=edge.head_forward if last else 0.0,
            head_bwd=edge.head_backward + (cat_time(n_edge) if not first else 0.0) if last else 0.0,
            act_bytes=act, grad_bytes_layer=per_layer_local * state.grads, grad_bytes_edge=edge_grad,
            zero3_layer_bytes=per_layer_local * state.weights, zero3_edge_bytes=n_edge * state.weights,
            metrics_bwd=metrics if last else 0.0, grad_prep_per_byte=prep_per_byte,
            wgrad_layer=lc.backward_weight, embed_wgrad=edge.embed_backward_weight if first else 0.0,
            head_wgrad=edge.head_backward_weight if last else 0.0, act_w_bytes=act * w_fraction))

    opt = tuple(costs.optimizer_time(mems[r].params_local / (par.dp if par.zero >= 1 else 1), tr.optimizer, dev,
                                     max(0.0, state.grads - state.weights), kernel=tr.optimizer_kernel,
                                     grad_bytes=4.0 if fsdp1 else state.grads)   # FSDP upcasts the shard
                for r in range(par.pp))
    model_flops = model_flops_per_step(scenario)
    hw_flops_fwd_layer = lc.hardware_flops * par.tp
    hardware_flops = (hw_flops_fwd_layer * m.layers + 3.0 * edge.head_model_flops * par.tp) * mb * par.dp
    schedule = rank_schedules(par.schedule, par.pp, mb, par.vpp)
    return Plan(scenario=scenario, placement=placement, chunks=tuple(chunks), schedule=schedule, layout=layout,
                microbatches=mb,
                stage_memory=mems, optimizer_time=opt, model_flops_per_step=model_flops,
                hardware_flops_per_step=hardware_flops, dtype_bytes=dev.element_bytes,
                framework_overhead_layer=unit_overhead)


def model_flops_per_token(scenario: Scenario) -> float:
    """Model FLOP per token for MFU: 6 N + 12 L h s (Narayanan et al. 2021 Eq. 3 without the
    recompute term; PaLM, Chowdhery et al. 2022, App. B), with N the weights of the matrix
    multiplies: every layer's QKV, output, MLP matrices and the output projection (vocab x h).
    Norm weights and biases do no matrix multiply and are left out."""
    m = scenario.model
    n_matmul = m.layers * m.matmul_params_per_layer + m.vocab * m.hidden
    return 6.0 * n_matmul + 12.0 * m.layers * m.hidden * scenario.training.seq_len


def model_flops_per_step(scenario: Scenario) -> float:
    return model_flops_per_token(scenario) * scenario.tokens_per_step
