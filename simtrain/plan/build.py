"""From a scenario to a plan: every cost the engine needs, computed once, without simpy.

The plan holds, per virtual stage (chunk), the per-layer compute times, the
TP communication each layer waits for, the activation bytes one micro-batch
leaves behind, the gradient bytes for DP buckets and the parameter bytes
ZeRO-3 gathers; plus the schedule (plain data) and the collective phases on
the cluster graph. The analytic estimate and the engine both read it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property

from simtrain.plan import costs
from simtrain.plan.activations import weight_grad_fraction
from simtrain.plan.build_moe import chunk_fields, layer_figures, varied_layers
from simtrain.plan.chunk import ChunkPlan
from simtrain.plan.collectives import Phase, collective_shape, p2p_phase, stage_shape
from simtrain.plan.context import CPFigures, cp_figures
from simtrain.plan.edge_tp import EdgeTP, edge_tp, mtp_tp_fields
from simtrain.plan.embedding_costs import embedding_grad_join_time
from simtrain.plan.flops import model_flops_per_step
from simtrain.plan.fp8_amax import chunk_amax
from simtrain.plan.fsdp import fsdp_costs
from simtrain.plan.grad_finalize import replicated_grad_sums, tied_embedding_grad_bytes, tied_ends
from simtrain.plan.layer_floor import dense_layer_cost, layer_shapes, step_device
from simtrain.plan.memory import (
    StageMemory,
    edge_params,
    fsdp1_sharded_state,
    layer_params_per_rank,
    stage_memory,
    state_bytes_per_param,
)
from simtrain.plan.memory_chunks import chunk_bytes, chunk_w_bytes
from simtrain.plan.memory_moe import expert_params_local
from simtrain.plan.offload import with_offload
from simtrain.plan.offload_optimizer import cpu_adam_bandwidth, host_step
from simtrain.plan.recompute import dense_share, modules_of, selective_tp_factor
from simtrain.plan.schedules import Op, StageLayout, rank_schedules, stage_layout
from simtrain.plan.tp_comm import TP_RECOMPUTE, mla_tp_units, moe_tp_fields, tp_collectives, tp_time
from simtrain.plan.tp_overlap import async_allreduce_wgrads, exposed_async_allreduce, exposed_tp
from simtrain.spec.placement import Placement, placement_of
from simtrain.spec.scenario import Scenario


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
    param_bytes: float                       # bytes of one parameter as ZeRO-1/2 gathers it after the step
    framework_overhead_layer: float = 0.0    # s per layer and micro-batch charged for the framework (FSDP1 hooks)
    phases: dict = field(default_factory=dict, repr=False)
    has_experts: bool = False                # a mixture-of-experts model: EP keys in the report
    has_cp: bool = False                     # context parallelism: CP keys in the report
    has_offload: bool = False                # activation offloading: offload keys in the report
    has_amax: bool = False                   # FP8 amax all-reduces on the critical path: amax keys in the report
    expert_grad_bytes: tuple[float, ...] = ()     # per pipeline rank: routed-expert gradient bytes of one GPU
    expert_params_local: tuple[int, ...] = ()     # per pipeline rank: routed-expert weights on one GPU
    optimizer_host: tuple = ()               # per pipeline rank: the offloaded step's parts (HostStep), if offloaded
    tied_grad_bytes: tuple[float, ...] = ()   # per pipeline rank: embedding gradient summed with its copy's
    tied_ends: tuple[int, int] | None = None   # the pipeline ranks holding the embedding and its copy, if summed
    replicated_grad_tp: tuple = ()   # per pipeline rank: (s, bytes) of the TP sum of replicated weights' gradients

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
        # the groups follow from the layout; stage pp_rank's are stage 0's moved by pp_rank x tp x dp GPUs (rank
        # order tp-dp-pp), so stages a translation period apart share one computation (stage_shape)
        shape = stage_shape(cluster, ("dp", collective, pl.dp, pl.tp, pl.pp, every), pp_rank * pl.tp * pl.dp,
                            lambda: collective_shape(collective, self._groups("dp", pp_rank, None), cluster, every))
        return [s.phase(nbytes) for s in shape] if nbytes > 0 else []

    def edp_phases(self, collective: str, nbytes: float, pp_rank: int) -> list[Phase]:
        """A collective of the routed experts' gradients or weights over the expert data-parallel groups of one
        stage, all of them at once."""
        pl = self.placement
        cluster = self.scenario.cluster
        key = ("edp", collective, pl.dp, pl.tp, pl.pp, pl.ep, pl.expert_tp, pp_rank)
        shape = cluster.shapes.get(key)
        if shape is None:
            shape = cluster.shapes[key] = collective_shape(collective, pl.edp_groups(pp_rank), cluster)
        return [s.phase(nbytes) for s in shape] if nbytes > 0 else []

    def pp_phase(self, nbytes: float, src_rank: int, dst_rank: int, dp_index: int | None) -> Phase:
        """Activation/gradient send between adjacent stages by every TP rank (and DP replica if folded)."""
        key = ("pp", nbytes, src_rank, dst_rank, dp_index)
        hit = self.phases.get(key)
        if hit is None:
            pl = self.placement
            cluster = self.scenario.cluster

            def build() -> Phase:
                dps = range(pl.dp) if dp_index is None else [dp_index]
                pairs = [(pl.rank(d, t, src_rank), pl.rank(d, t, dst_rank)) for d in dps for t in range(pl.tp)]
                if dp_index is not None:
                    pairs.sort(key=lambda p: p[0] != pl.rank(dp_index, 0, src_rank))
                return p2p_phase(nbytes, pairs, cluster, every=dp_index is not None)

            if dp_index is None:
                # the sends of every replica from stage s to s +- 1 are those from stage 0 to 1 (or 1 to 0) moved by
                # min(s, s +- 1) x tp x dp GPUs: stages a translation period apart share one computation (stage_shape)
                hit = stage_shape(cluster, ("pp", nbytes, dst_rank - src_rank, pl.dp, pl.tp, pl.pp),
                                  min(src_rank, dst_rank) * pl.tp * pl.dp, build)
            else:
                hit = build()
            self.phases[key] = hit
        return hit

    def tp_scale(self, pp_rank: int, dp_index: int | None) -> float:
        """How much slower one replica's TP collectives run than the symmetric (folded) figure the
        chunks carry: 1 unless degraded links break the symmetry (full fidelity only)."""
        if dp_index is None or self.placement.tp == 1 or not self.scenario.simulation.degraded_links:
            return 1.0
        tr, m = self.scenario.training, self.scenario.model
        nbytes = tr.micro_batch * tr.seq_len // self.placement.cp * m.hidden * self.dtype_bytes
        base = tp_time(self.scenario, self.placement, nbytes, pp_rank)
        own = tp_time(self.scenario, self.placement, nbytes, pp_rank, dp_index)
        return own / base if base > 0 else 1.0

    @cached_property
    def pp_bytes(self) -> float:
        """b x s x h activations in 16-bit, split over the TP ranks (Megatron scatter/gather)."""
        tr, m = self.scenario.training, self.scenario.model
        return tr.micro_batch * tr.seq_len * m.hidden * self.dtype_bytes / self.placement.tp / self.placement.cp


def build_plan(scenario: Scenario, stage_memories: tuple[StageMemory, ...] | None = None) -> Plan:
    """Every cost of ``scenario``'s step; ``stage_memories``: its memory ledger per pipeline rank where the caller
    has it already (``memory_report(scenario).stages``, as a search's screening does)."""
    par, tr, m, hw = scenario.parallel, scenario.training, scenario.model, scenario.hardware
    graphs = tr.cuda_graphs
    dev = step_device(hw, tr, tr.precision, m)
    # partial capture graphs the transformer layers (TE make_graphed_callables); full also the embedding, output
    # layer and loss (Megatron-Core full_iteration); the optimizer step runs eagerly in both
    edge_dev = dev if graphs == "full" else replace(dev, graph_gap=None)
    eager_dev = replace(dev, graph_gap=None)
    placement = placement_of(scenario)
    mb = scenario.microbatches
    cp = par.cp
    tokens = tr.micro_batch * tr.seq_len // cp     # each CP rank holds s / cp of every sequence
    full_shape, shape = layer_shapes(m, tr, tp=par.tp, sequence_parallel=par.sequence_parallel, cp=cp,
                                     micro_batch=tr.micro_batch)
    lc = dense_layer_cost(shape, dev, tr, tr.recompute)
    modules = modules_of(tr)
    partial = tr.recompute == "full" and tr.recompute_layers is not None
    attention_recomputed = tr.recompute == "full" or \
        (tr.recompute == "selective" and "core_attn" in (tr.recompute_modules or ["core_attn"]))
    cpf = [cp_figures(scenario, placement, full_shape, dev, r, attention_recomputed) if cp > 1 else CPFigures()
           for r in range(par.pp)]
    cpf_plain = [cp_figures(scenario, placement, full_shape, dev, r, False) if cp > 1 and partial else cpf[r]
                 for r in range(par.pp)]
    edge = costs.edge_cost(tokens, m.hidden, m.vocab, par.tp, edge_dev, tr.cross_entropy)
    metrics = costs.train_metrics_time(tokens, m.vocab, par.tp, edge_dev, tr.train_metrics)
    state = state_bytes_per_param(tr.precision, tr.optimizer, tr.grad_dtype)
    if tr.autocast_weights:   # fp32 parameters and .grad, no separate master copy (docs/model.md section 2.12e)
        state = fsdp1_sharded_state(state)
    act_full = tokens * m.hidden * dev.element_bytes
    mems = stage_memories or tuple(stage_memory(scenario, r) for r in range(par.pp))
    tp_cost = [tp_time(scenario, placement, act_full, r) for r in range(par.pp)]
    tp_factors = [selective_tp_factor(modules, dense_share(scenario, r)) if modules else
                  TP_RECOMPUTE.get(tr.recompute, 1.0) for r in range(par.pp)]
    tp_bwd_cost = [t * f for t, f in zip(tp_cost, tp_factors)]
    tp_bwd_plain = list(tp_cost)
    if (par.tp_comm_overlap or par.tp_async_linears) and par.sequence_parallel and par.tp > 1:
        gemm_times = [(dev.linear_gemm_time(mm, n, k), dev.linear_gemm_time(mm, k, n), dev.linear_gemm_time(k, n, mm))
                      for mm, n, k in costs.gemm_shapes(shape)]
        slowdown = hw.overlap_slowdown(False)
        tp_cost, tp_bwd_cost = [], []
        for r in range(par.pp):
            parts = tp_collectives(scenario, placement, act_full, r)
            fwd, bwd = exposed_tp(parts["all_gather"], parts["reduce_scatter"], gemm_times, par.tp, slowdown,
                                  nanotron=par.tp_async_linears)
            tp_cost.append(fwd)
            tp_bwd_plain[r] = bwd
            # a recomputed forward's collectives (full: all of them; selective_op: half) overlap as the forward's
            tp_bwd_cost.append(bwd + (tp_factors[r] - 1.0) * fwd)
    # the embedding's, output layer's and loss's TP collectives, per rank (plan.edge_tp)
    edge_tps = [edge_tp(scenario, placement, act_full, tokens, r,
                        head_wgrad=edge.head_backward_weight, slowdown=hw.overlap_slowdown(False),
                        mtp_wgrad=dev.gemm_time(2 * m.hidden, m.hidden // par.tp, tokens) if m.mtp_layers else 0.0)
                for r in range(par.pp)] if par.tp > 1 else [EdgeTP()] * par.pp
    tp_wgrad_hidden = [0.0] * par.pp
    async_wgrads = async_allreduce_wgrads(scenario, shape, dev)
    async_slowdown = hw.overlap_slowdown(False)
    if async_wgrads is not None:
        # the backward's two all-reduces under the QKV and MLP-up weight gradients; a recomputed forward's are not
        for r in range(par.pp):
            bwd, tp_wgrad_hidden[r] = exposed_async_allreduce(tp_cost[r] / 2.0, async_wgrads, async_slowdown)
            tp_bwd_plain[r] = bwd
            tp_bwd_cost[r] = bwd + (tp_factors[r] - 1.0) * tp_cost[r]

    per_layer_local = layer_params_per_rank(m, par.tp)
    # PyTorch FSDP's copies around its collectives (parallel.zero_impl), ZeRO-2/3 over 2+ ranks (plan.fsdp)
    fp16_reduce = tr.grad_dtype == "fp16" or (tr.grad_dtype == "auto" and tr.precision == "fp16")
    fsdp = fsdp_costs(par.zero_impl, par.zero, scenario.dp_cp, state.weights, state.grads, tr.precision != "fp32", dev,
                      fp16_reduce=fp16_reduce)
    unit_overhead = fsdp.unit_overhead   # per layer (FSDP unit) and micro-batch
    # fp32 parameters under torch.autocast (training.autocast_weights): .grad is fp32, and every micro-batch casts the
    # weights down in the forward and their gradients up in the backward
    cast = costs.AUTOCAST_CAST_BYTES if tr.autocast_weights else 0.0
    acc_pp = costs.grad_accumulation_bytes(tr.grad_accumulation, state.weights, state.grads, mb)

    def cast_pass(n_params: float) -> float:   # one cast kernel per unit's linear weights, as the adds
        return dev.memory_time(n_params * cast, kernels=1) if cast and n_params else 0.0
    # autocast casts what the linears take (weights; their biases, under 0.1% of them, are left out): a layer's
    # matrices, and the output layer's (tied or not); not the embedding lookup's table nor LayerNorm's parameters
    layer_cast = cast_pass(m.matmul_params_per_layer // par.tp if m.moe is None else per_layer_local)
    head_cast = cast_pass(m.vocab * m.hidden // par.tp)
    layer_fwd_extra = fsdp.forward(dev, per_layer_local) + unit_overhead / 3.0 + layer_cast

    def accumulate(n_params: float) -> float:   # one add kernel per unit's parameters (launch gaps: one per unit)
        return dev.memory_time(n_params * acc_pp, kernels=1) if acc_pp and n_params else 0.0
    # part of the weight-gradient work, a split backward's W: the accumulation, and autocast's cast of the gradients
    acc_layer = accumulate(per_layer_local) + layer_cast
    table_join = embedding_grad_join_time(scenario, state.weights, state.grads, edge_dev)
    layer_bwd_extra = fsdp.backward(dev, per_layer_local) + 2.0 * unit_overhead / 3.0 + acc_layer
    vstages = scenario.virtual_stages
    varied = varied_layers(scenario)
    figures = [layer_figures(scenario, dev, placement, shape, r) for r in range(par.pp)] if varied else []
    mtp_fwd = mtp_bwd = mtp_wgrad = 0.0
    if varied and m.mtp_layers:
        # each MTP module on the last stage: one layer like the model's last, its projection of [h; h] to h, and
        # its own output layer and loss (DeepSeek-V3 section 2.2; Megatron-Core runs them after the decoder)
        last_rank = stage_layout(par.schedule, par.pp, par.vpp).rank[-1]   # the last virtual stage's rank
        # the last rank's own last layer; a loss-only last rank (no layer) prices the model's last layer
        last = next((f for f in reversed(figures[last_rank]) if f), None) or \
            next(f for r in range(par.pp) for f in reversed(figures[r]) if f)
        proj_f = dev.gemm_time(tokens, m.hidden / par.tp, 2 * m.hidden)
        proj_b = dev.gemm_time(tokens, 2 * m.hidden, m.hidden / par.tp) + \
            dev.gemm_time(2 * m.hidden, m.hidden / par.tp, tokens)
        mtp_fwd = m.mtp_layers * (last.forward + last.ep_forward + proj_f + edge.head_forward)
        mtp_bwd = m.mtp_layers * (last.recompute + last.backward + last.ep_backward + proj_b + edge.head_backward)
        # a split backward's W of the MTP modules: their layer's, their projection's and their output layer's
        mtp_wgrad = m.mtp_layers * (last.wgrad + dev.gemm_time(2 * m.hidden, m.hidden / par.tp, tokens)
                                    + edge.head_backward_weight)
    layout = stage_layout(par.schedule, par.pp, par.vpp)
    w_fraction = weight_grad_fraction(scenario)
    starts = [sum(scenario.layers_per_stage[:s]) for s in range(vstages)]
    chunks = []
    for v, model_stage in enumerate(layout.model_stage):
        n_layers = scenario.layers_per_stage[model_stage]
        lo = starts[model_stage]
        chunk, rank = layout.chunk[v], layout.rank[v]
        first, last = model_stage == 0, model_stage == vstages - 1
        # this chunk's own layers and edge terms (plan/memory_chunks.py), as the memory ledger counts them
        mb_bytes = mems[rank].micro_batch_bytes
        act = chunk_bytes(mb_bytes, chunk, first=first, last=last)
        n_edge = edge_params(m, par.tp, par.pp, first=first, last=last)
        edge_grad = n_edge * state.grads
        tp_fwd = tp_cost[rank]
        tp_bwd = tp_bwd_cost[rank]
        cf = cpf[rank]
        chunks.append(ChunkPlan(
            vstage=v, rank=rank, chunk=chunk, layer_lo=lo, layers=n_layers, has_embedding=first, has_head=last,
            fwd_layer=lc.forward + cf.forward + layer_fwd_extra,
            bwd_layer=lc.backward + cf.backward + layer_bwd_extra,
            # a recomputed forward opens a fresh autocast context: it casts the weights again
            recompute_layer=lc.recompute + cf.recompute + (layer_cast if tr.recompute == "full" else 0.0),
            cp_fwd_layer=cf.fwd_exposed, cp_bwd_layer=cf.bwd_exposed, cp_fwd_hidden=cf.fwd_hidden,
            cp_bwd_hidden=cf.bwd_hidden, recompute_count=tr.recompute_layers if partial else -1,
            tp_bwd_plain=tp_bwd_plain[rank], cp_bwd_plain=cpf_plain[rank].bwd_exposed,
            cp_bwd_hidden_plain=cpf_plain[rank].bwd_hidden,
            tp_fwd_layer=tp_fwd, tp_bwd_layer=tp_bwd, tp_wgrad_hidden=tp_wgrad_hidden[rank],
            tp_async=(tp_cost[rank] / 2.0, *async_wgrads, async_slowdown) if async_wgrads is not None else (),
            embed_fwd=edge.embed_forward + fsdp.forward(dev, n_edge) if first else 0.0,
            embed_bwd=edge.embed_backward + fsdp.backward(dev, n_edge) + accumulate(n_edge) + table_join
            if first else 0.0,
            head_fwd=edge.head_forward + (fsdp.forward(dev, n_edge) if not first else 0.0) + head_cast
            if last else 0.0,
            head_bwd=edge.head_backward + head_cast + (fsdp.backward(dev, n_edge) + accumulate(n_edge) if not first
                                                       else 0.0)
            if last else 0.0,
            act_bytes=act, grad_bytes_layer=per_layer_local * state.grads, grad_bytes_edge=edge_grad,
            zero3_layer_bytes=per_layer_local * state.weights, zero3_edge_bytes=n_edge * state.weights,
            metrics_bwd=metrics if last else 0.0, grad_prep_per_byte=fsdp.grad_prep_per_byte,
            gather_prep_per_byte=fsdp.gather_prep_per_byte,
            wgrad_layer=lc.backward_weight + acc_layer,
            embed_wgrad=edge.embed_backward_weight + accumulate(n_edge) + table_join if first else 0.0,
            head_wgrad=edge.head_backward_weight + head_cast + (accumulate(n_edge) if not first else 0.0)
            if last else 0.0,
            act_w_bytes=chunk_w_bytes(mb_bytes, chunk, w_fraction, last=last),
            embed_tp_fwd=edge_tps[rank].embed_forward if first else 0.0,
            embed_tp_bwd=edge_tps[rank].embed_backward if first else 0.0,
            head_tp_fwd=edge_tps[rank].head_forward if last else 0.0,
            head_tp_bwd=edge_tps[rank].head_backward if last else 0.0,
            head_tp_bwd_alone=edge_tps[rank].head_backward_alone if last else 0.0,
            head_tp_async=edge_tps[rank].head_async if last else ()))
        if varied:
            fields = chunk_fields(figures[rank], lo, n_layers)
            fields["fwd_layer"] += layer_fwd_extra + cf.forward
            fields["bwd_layer"] += layer_bwd_extra + cf.backward
            fields["wgrad_layer"] += acc_layer
            fields["recompute_layer"] += cf.recompute
            if fields["lead_layers"]:
                fields.update(lead_fwd=fields["lead_fwd"] + cf.forward, lead_bwd=fields["lead_bwd"] + cf.backward,
                              lead_recompute=fields["lead_recompute"] + cf.recompute)
            if last:
                fields.update(head_fwd=chunks[-1].head_fwd + mtp_fwd, head_bwd=chunks[-1].head_bwd + mtp_bwd,
                              head_wgrad=chunks[-1].head_wgrad + mtp_wgrad)
            if m.moe is not None:   # a MoE layer runs its attention's TP pair and its shared experts' (tp_comm)
                fields.update(moe_tp_fields(tp_cost[rank] / 2.0, m.moe.shared_experts, tr.recompute, modules,
                                             main_moe=fields["expert_grad_bytes_layer"] > 0,
                                             attention=mla_tp_units(m)))
            if last and m.mtp_layers and par.tp > 1:
                # the MTP layer is priced as the model's last layer (mtp_fwd above): a MoE layer where the model has
                # any, whatever this chunk holds (a loss-only last stage holds none)
                mtp_layer = fields
                if m.moe is not None and m.layers > m.moe.dense_layers:
                    mtp_layer = moe_tp_fields(tp_cost[rank] / 2.0, m.moe.shared_experts, tr.recompute, modules,
                                              main_moe=True, attention=mla_tp_units(m))
                fields.update(mtp_tp_fields(chunks[-1], edge_tps[rank], m.mtp_layers,
                                            mtp_layer.get("tp_fwd_layer", chunks[-1].tp_fwd_layer),
                                            mtp_layer.get("tp_bwd_layer", chunks[-1].tp_bwd_layer)))
            chunks[-1] = replace(chunks[-1], **fields)

    shards = scenario.dp_cp if par.zero >= 1 else 1
    # routed experts' optimizer state is sharded over their own (expert data-parallel) group, as the ledger has it
    expert_local = tuple(expert_params_local(scenario, r) for r in range(par.pp)) if m.moe is not None else ()
    expert_shards = placement.edp if par.zero >= 1 else 1

    def local_optimizer_params(r: int) -> float:
        experts_here = expert_local[r] if expert_local else 0.0
        return (mems[r].params_local - experts_here) / shards + experts_here / expert_shards

    # Megatron-LM zeroes its whole contiguous gradient buffer each step (train_step's zero_grad_buffer), sharded
    # optimizer state or not: over the unsharded local parameters
    zero_buffer = tr.optimizer_kernel == "megatron" and tr.grad_accumulation != "autograd"
    opt = tuple(costs.optimizer_time(local_optimizer_params(r), tr.optimizer, eager_dev,
                                     max(0.0, state.grads - state.weights), kernel=tr.optimizer_kernel,
                                     grad_bytes=4.0 if fsdp.impl == "fsdp1" else state.grads,   # FSDP1 upcasts
                                     loss_scaling=tr.precision == "fp16", zero_buffer=zero_buffer and shards == 1)
                + (eager_dev.memory_time(mems[r].params_local * state.grads, kernels=1)
                   if zero_buffer and shards > 1 else 0.0)
                for r in range(par.pp))
    host = ()
    if par.offload_optimizer:   # gradients down, CPU Adam, fp32 shard up, one after another (plan.offload_optimizer)
        host = tuple(host_step(local_optimizer_params(r), hw.inter_node.pcie_bandwidth, cpu_adam_bandwidth(hw),
                               scenario.gpus_per_node) for r in range(par.pp))
        opt = tuple(h.total for h in host)
    model_flops = model_flops_per_step(scenario)
    # context parallelism's attention beyond the local shape's: 3x (forward, backward) + a recomputed forward
    cp_flops = cpf[0].flops * (3.0 + (1.0 if attention_recomputed else 0.0))
    hw_flops_fwd_layer = (lc.hardware_flops + cp_flops) * par.tp
    replicas = mb * par.dp * cp      # micro-batches of every DP replica, each over cp GPUs
    hardware_flops = (hw_flops_fwd_layer * m.layers + 3.0 * edge.head_model_flops * par.tp) * replicas
    if partial:   # only recompute_layers of each virtual stage re-run their forward
        plain_layers = m.layers - tr.recompute_layers * vstages
        hardware_flops -= plain_layers * (lc.hardware_flops - 3.0 * lc.model_flops + cpf[0].flops) * par.tp * replicas
    if varied:
        # each layer once (DualPipe holds every layer on two ranks; a micro-batch runs through one copy)
        per_layer = [next(f[i] for f in figures if f[i] is not None) for i in range(m.layers)]
        layer_hw = sum(f.hardware_flops for f in per_layer)
        mtp_hw = m.mtp_layers * (3.0 * edge.head_model_flops + 3 * 2.0 * tokens * m.hidden / par.tp * 2 * m.hidden
                                 + per_layer[-1].hardware_flops) if m.mtp_layers else 0.0
        layer_hw += cp_flops * m.layers
        hardware_flops = (layer_hw * par.tp + 3.0 * edge.head_model_flops * par.tp + mtp_hw * par.tp) * replicas
    if tr.fp8_amax_reduction != "none":
        chunks = [replace(c, **dict(zip(("amax_fwd", "amax_bwd"), chunk_amax(scenario, placement, c))))
                  for c in chunks]
    schedule = rank_schedules(par.schedule, par.pp, mb, par.vpp, par.ep_overlap)
    if tr.activation_offload_layers:
        chunks = [with_offload(c, tr.activation_offload_layers, mems[c.rank].offload_layer_bytes,
                               scenario.hardware.inter_node.pcie_bandwidth) for c in chunks]
    experts = m.moe is not None
    ends = tied_ends(scenario, layout)   # the embedding's gradient sum between its two holders (grad_finalize)
    return Plan(scenario=scenario, placement=placement, chunks=tuple(chunks), schedule=schedule, layout=layout,
                microbatches=mb,
                stage_memory=mems, optimizer_time=opt, optimizer_host=host, model_flops_per_step=model_flops,
                hardware_flops_per_step=hardware_flops, dtype_bytes=dev.element_bytes,
                param_bytes=4.0 if tr.autocast_weights else float(dev.element_bytes),
                framework_overhead_layer=unit_overhead, has_experts=experts, has_cp=cp > 1,
                has_offload=tr.activation_offload_layers > 0, has_amax=tr.fp8_amax_reduction != "none",
                expert_grad_bytes=tuple(n * state.grads for n in expert_local), expert_params_local=expert_local,
                tied_grad_bytes=tied_embedding_grad_bytes(scenario, ends, state.grads), tied_ends=ends,
                replicated_grad_tp=replicated_grad_sums(scenario, placement, chunks, state.grads))

