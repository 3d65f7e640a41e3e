"""The tensor-parallel collectives of one layer pass, each timed alone on the cluster graph: Megatron's
all-reduces, or with sequence parallelism its all-gathers and reduce-scatters, and how many of them a backward
runs again under each recompute mode.
"""

from __future__ import annotations

from simtrain.plan.collectives import collective_shape, phase_time_alone, stage_shape
from simtrain.spec.placement import Placement
from simtrain.spec.scenario import Scenario


def tp_time(scenario: Scenario, placement: Placement, nbytes: float, pp_rank: int,
            dp_index: int | None = None) -> float:
    """Seconds of the TP collectives of one layer pass (``tp_collectives``): each kind twice."""
    return 2.0 * sum(tp_collectives(scenario, placement, nbytes, pp_rank, dp_index).values())


def tp_collectives(scenario: Scenario, placement: Placement, nbytes: float, pp_rank: int,
                   dp_index: int | None = None, kinds: tuple[str, ...] | None = None) -> dict[str, float]:
    """Seconds of the TP collectives of one layer pass: 2 all-reduces of the activations
    (Megatron: one after attention, one after the MLP), or with sequence parallelism
    2 all-gathers + 2 reduce-scatters of the same size (Korthikanti et al. 2022, Sec. 4.2.2).
    ``dp_index`` None: all replicas' TP groups at once (folded); an index: that replica's group alone,
    its slowest flow setting the pace (full fidelity, degraded links). ``kinds``: other collectives of ``nbytes`` on
    the same groups (the loss's all-reduces, ``plan.edge_tp``)."""
    if placement.tp == 1:
        return {}
    cluster = scenario.cluster
    if kinds is None:
        kinds = ("all_gather", "reduce_scatter") if scenario.parallel.sequence_parallel else ("all_reduce",)
    scale = {(d.a, d.b): d.factor for d in scenario.simulation.degraded_links}
    times = {}
    for kind in kinds:
        if dp_index is None:
            # stage pp_rank's TP groups are stage 0's moved by pp_rank x tp x dp GPUs (rank order tp-dp-pp): stages a
            # translation period apart share one computation (as dp_phases does)
            shapes = stage_shape(cluster, ("tp", kind, placement.dp, placement.tp, placement.pp),
                                 pp_rank * placement.tp * placement.dp,
                                 lambda kind=kind: collective_shape(kind, [placement.tp_group(d, pp_rank)
                                                                           for d in range(placement.dp)], cluster))
        else:
            key = ("tp", kind, placement.dp, placement.tp, placement.pp, pp_rank, dp_index)
            shapes = cluster.shapes.get(key)
            if shapes is None:
                shapes = cluster.shapes[key] = collective_shape(kind, [placement.tp_group(dp_index, pp_rank)],
                                                                cluster, every=True)
        times[kind] = sum(phase_time_alone(shape.phase(nbytes), cluster, scale) for shape in shapes)
    return times


#: the backward's TP collectives, in forward-collective units, per recompute mode: full recompute runs the forward's
#: again; torchtitan's op-level policy (selective_op) re-runs the collective after the attention output (an
#: all-reduce, or with sequence parallelism the all-gathers before the attention and the MLP; reduce-scatter outputs
#: are kept), i.e. half of them
TP_RECOMPUTE = {"full": 2.0, "selective_op": 1.5}


def mla_tp_units(model) -> tuple[float, float]:
    """(the attention's TP pair, the part ``mla_up_proj`` recompute re-runs), in pair units, of a model's attention:
    (1, 0) for multi-head attention. Multi-head latent attention (NVIDIA/Megatron-LM @d98e8a6,
    transformer/multi_latent_attention.py with the TE spec of models/gpt/gpt_layer_specs.py) projects the GPU's
    sequence shard down with duplicated ``TELinear`` layers (no collective: the latents stay [s/TP, b, r]); the
    column-parallel up projections all-gather the query and key/value latents (q_lora_rank + kv_lora_rank wide) and
    the RoPE key part is gathered on its own (qk_rope_head_dim); the output projection reduce-scatters b x s x h as
    in any layer. With ring times in proportion to bytes, the pair is (1 + f) / 2 of a b x s x h pair, f =
    (q_lora_rank + kv_lora_rank + qk_rope_head_dim) / h (DeepSeek-V3: (1536 + 512 + 64) / 7168 = 0.295); the
    recompute of ``qkv_up_proj_and_rope_apply`` re-runs the two latent gathers, (q_lora_rank + kv_lora_rank) / (2 h).
    The two extra gathers' latencies are not counted."""
    a = model.attention
    if a.kind != "mla":
        return 1.0, 0.0
    latents = (a.q_lora_rank or model.hidden) + a.kv_lora_rank
    return (1.0 + (latents + a.qk_rope_head_dim) / model.hidden) / 2.0, latents / (2.0 * model.hidden)


def layer_tp_units(is_moe: bool, shared_experts: int, recompute: str, modules: tuple[str, ...],
                   attention: tuple[float, float] = (1.0, 0.0)) -> tuple[float, float]:
    """(forward, backward) TP collective pairs of one layer pass, a pair = one all-gather + one reduce-scatter of
    b x s x h (with sequence parallelism; one all-reduce without), i.e. ``tp_time / 2``; the backward's count
    includes a recomputed forward's pairs. For a model with experts (a dense model keeps ``TP_RECOMPUTE`` and
    ``recompute.selective_tp_factor``, whose recompute counts agree with these).

    A dense layer runs two pairs, its attention's and its MLP's. A MoE layer (NVIDIA/Megatron-LM @d98e8a6) runs the
    attention's pair and, with shared experts, theirs: ``SharedExpertMLP`` (moe/shared_experts.py) is an ``MLP`` on
    the attention's TP group (``tp_group=pg_collection.tp``), so its fc1 all-gathers and its fc2 reduce-scatters the
    sequence-parallel activations as a dense MLP does. The routed experts run no collective on that group: the router
    and the dispatcher take the GPU's own sequence shard (moe_layer.py ``forward``, which refuses tp > 1 without
    sequence parallelism in training), the token dispatcher's tensor-parallel group is the expert-TP one
    (token_dispatcher.py ``self.tp_group = pg_collection.expt_tp``: its all-gather and reduce-scatter are
    ``build_moe.etp_time``'s, on the EP lane) and the combine returns the same shard. The backward mirrors each pair;
    full recompute runs the forward's again, selective ``mlp`` a dense layer's MLP pair (Megatron-Core does not set
    ``recompute_mlp`` on MoE layers), ``moe`` and ``shared_experts`` the shared experts' pair (both re-run
    ``shared_experts_compute``), ``core_attn``, ``layernorm``, ``moe_act`` and ``mla_up_proj`` none (they lie
    between the collectives, except that under multi-head latent attention ``mla_up_proj`` re-runs the latent
    gathers). ``attention``: the attention's pair and what ``mla_up_proj`` re-runs, from :func:`mla_tp_units`."""
    attn, up_proj = attention
    own = attn + (1 if not is_moe or shared_experts else 0)
    if recompute == "full":
        return own, 2 * own
    again = 0.0
    if not is_moe and "mlp" in modules:
        again = 1
    if is_moe and shared_experts and ("moe" in modules or "shared_experts" in modules):
        again = 1
    if "mla_up_proj" in modules:
        again += up_proj
    return own, own + again


def moe_tp_fields(pair: float, shared_experts: int, recompute: str, modules: tuple[str, ...],
                  main_moe: bool, attention: tuple[float, float] = (1.0, 0.0)) -> dict:
    """ChunkPlan TP fields of a MoE model's chunk, ``pair`` the seconds of one all-gather + reduce-scatter pair
    (``tp_comm.layer_tp_units``): its leading dense layers' apart, the others' (MoE layers, or the dense layers of a
    chunk that has no MoE layer)."""
    def figures(is_moe: bool) -> tuple[float, float, float]:
        fwd, bwd = layer_tp_units(is_moe, shared_experts, recompute, modules, attention)
        plain, _ = layer_tp_units(is_moe, shared_experts, "none", (), attention)
        return fwd * pair, bwd * pair, plain * pair
    lead_f, lead_b, lead_p = figures(False)
    f, b, p = figures(main_moe)
    return {"tp_fwd_layer": f, "tp_bwd_layer": b, "tp_bwd_plain": p, "lead_tp_fwd": lead_f, "lead_tp_bwd": lead_b,
            "lead_tp_bwd_plain": lead_p}
