"""Per-layer costs of models whose layers differ (mixture-of-experts, sliding-window layers, latent attention):
each layer priced on its own, the chunk's MoE layers averaged into the per-layer figures the engine plays, its
leading dense layers kept apart; and the EP all-to-all of one MoE layer on the cluster graph.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from simtrain.plan import costs, device
from simtrain.plan.collectives import all_to_all_shape, collective_shape, phase_time_alone, stage_shape
from simtrain.plan.costs_moe import MoEShape, allgather_bytes, dispatch_bytes, etp_collective_bytes, moe_cost
from simtrain.plan.deepep import deepep_time
from simtrain.plan.hybridep import hybridep_time
from simtrain.plan.memory import layer_params_per_rank
from simtrain.plan.memory_moe import experts_per_rank, layer_indices, moe_dense_part_per_rank, moe_shape
from simtrain.plan.recompute import modules_of, moe_selective_extra, selective_extra
from simtrain.spec.placement import Placement
from simtrain.spec.scenario import Scenario


@dataclass(frozen=True)
class LayerFigures:
    """One layer on one GPU, one micro-batch."""

    forward: float
    backward: float
    recompute: float
    ep_forward: float          # s, dispatch + combine all-to-alls
    ep_backward: float
    grad_bytes: float          # dense-part gradient bytes (reduced over DP)
    expert_grad_bytes: float   # routed-expert gradient bytes (reduced over the expert data-parallel group)
    hardware_flops: float      # per GPU, forward + backward + recompute
    wgrad: float = 0.0         # s, the weight-gradient GEMMs within backward (attention's, and the MoE block's)
    moe_forward: float = 0.0   # s, within forward: the MoE block (router, permutation, experts, shared experts)
    moe_backward: float = 0.0  # s, within backward: the MoE block
    moe_wgrad: float = 0.0     # s, within wgrad: the MoE block's weight-gradient GEMMs


def varied_layers(scenario: Scenario) -> bool:
    """True when the layers of the model are not all alike (or their attention is not Llama-style)."""
    m = scenario.model
    return m.moe is not None or m.attention.kind == "mla" or m.attention.sliding_window is not None


def ep_time(scenario: Scenario, placement: Placement, msh: MoEShape, pp_rank: int, element_bytes: int) -> float:
    """Seconds of one MoE layer's dispatch and combine on one stage, every EP group of the stage running at once
    (their flows share the links; other traffic of the step is not counted here, as for TP)."""
    par = scenario.parallel
    if par.ep == 1:
        return 0.0
    cluster = scenario.cluster
    offset = pp_rank * placement.tp * placement.dp   # the stage's first GPU: symmetric stages share one shape
    if par.moe_dispatcher == "deepep":
        return deepep_time(scenario, placement, msh, pp_rank)
    if par.moe_dispatcher == "hybridep":
        return hybridep_time(scenario, placement, msh, pp_rank)
    layout = (placement.dp, placement.tp, placement.pp, placement.ep, placement.expert_tp)
    if par.moe_dispatcher == "allgather":
        nbytes = allgather_bytes(msh, element_bytes)
        total = 0.0
        for kind in ("all_gather", "reduce_scatter"):
            shapes = stage_shape(cluster, ("ep", kind, *layout), offset, lambda kind=kind: collective_shape(
                kind, [placement.expert_block(d, pp_rank) for d in range(placement.edp)], cluster))
            total += sum(phase_time_alone(sh.phase(nbytes), cluster) for sh in shapes)
        return total
    shape = stage_shape(cluster, ("ep", "all_to_all", *layout), offset,
                        lambda: all_to_all_shape(placement.ep_groups(pp_rank), cluster))
    return 2.0 * phase_time_alone(shape.phase(dispatch_bytes(msh, element_bytes)), cluster)


def etp_time(scenario: Scenario, placement: Placement, msh: MoEShape, pp_rank: int,
             element_bytes: int) -> tuple[float, float]:
    """Seconds (forward, backward) of one MoE layer pass's expert-TP all-gathers and reduce-scatters with the
    alltoall dispatcher (``costs_moe.etp_collective_bytes``), every expert-TP group of the stage at once, as rings
    on the cluster graph; (0, 0) when etp is 1 or another dispatcher moves the tokens (allgather gathers over the
    whole expert tp x ep block; deepep and hybridep refuse etp > 1)."""
    if placement.expert_tp == 1 or scenario.parallel.moe_dispatcher != "alltoall":
        return 0.0, 0.0
    cluster = scenario.cluster
    offset = pp_rank * placement.tp * placement.dp
    layout = (placement.dp, placement.tp, placement.pp, placement.ep, placement.expert_tp)
    by_direction = etp_collective_bytes(msh, element_bytes)
    out = []
    for direction in ("forward", "backward"):
        total = 0.0
        for kind, nbytes in by_direction[direction]:
            shapes = stage_shape(cluster, ("etp", kind, *layout), offset, lambda kind=kind: collective_shape(
                kind, placement.etp_groups(pp_rank), cluster))
            total += sum(phase_time_alone(sh.phase(nbytes), cluster) for sh in shapes)
        out.append(total)
    return out[0], out[1]


def layer_figures(scenario: Scenario, dev: device.Device, placement: Placement, base: costs.LayerShape,
                  pp_rank: int) -> list[LayerFigures | None]:
    """Figures of every layer of the model (None for layers on other pipeline ranks)."""
    m, tr = scenario.model, scenario.training
    state_grads = dev.element_bytes if tr.grad_dtype == "auto" else device.DTYPE_BYTES[tr.grad_dtype]
    msh = moe_shape(scenario)
    moe = moe_cost(msh, dev) if msh is not None else None
    ep = ep_time(scenario, placement, msh, pp_rank, dev.element_bytes) if msh is not None else 0.0
    etp_f, etp_b = etp_time(scenario, placement, msh, pp_rank, dev.element_bytes) if msh is not None else (0.0, 0.0)
    cache: dict = {}
    out: list[LayerFigures | None] = []
    mine = set(layer_indices(scenario, pp_rank))
    for i in range(m.layers):
        if i not in mine:
            out.append(None)
            continue
        key = (m.is_moe_layer(i), m.attention.windowed(i))
        hit = cache.get(key)
        if hit is None:
            hit = cache[key] = _one_layer(scenario, dev, base, key[0], key[1], moe, (ep, etp_f, etp_b), state_grads)
        out.append(hit)
    return out


def _one_layer(scenario: Scenario, dev: device.Device, base: costs.LayerShape, is_moe: bool, windowed: bool,
               moe, ep: tuple[float, float, float], grad_bytes: float) -> LayerFigures:
    """One layer's figures; ``ep`` = (dispatch + combine all-to-alls, expert-TP collectives forward, backward) of a
    MoE layer pass, which the EP lane plays."""
    m, tr, par = scenario.model, scenario.training, scenario.parallel
    shape = replace(base, ffn=0 if is_moe else base.ffn, window=m.attention.sliding_window if windowed else 0)
    lc = costs.layer_cost(shape, dev, tr.recompute)
    modules = modules_of(tr)
    if modules and modules != ("core_attn",):   # Megatron's --recompute-modules beyond the default
        extra, extra_flops = selective_extra(shape, dev, modules)
        plain = costs.layer_cost(shape, dev, "none")
        lc = replace(plain, recompute=extra, hardware_flops=plain.hardware_flops + extra_flops)
    if not is_moe:
        return LayerFigures(forward=lc.forward, backward=lc.backward, recompute=lc.recompute, ep_forward=0.0,
                            ep_backward=0.0, grad_bytes=layer_params_per_rank(m, par.tp) * grad_bytes,
                            expert_grad_bytes=0.0, hardware_flops=lc.hardware_flops, wgrad=lc.backward_weight)
    a2a, etp_f, etp_b = ep
    if tr.recompute == "full":
        moe_redo, moe_redo_flops, dispatch_again = moe.forward, moe.model_flops, True
    else:
        moe_redo, moe_redo_flops, dispatch_again = moe_selective_extra(moe, modules)
    return LayerFigures(
        forward=lc.forward + moe.forward, backward=lc.backward + moe.backward, recompute=lc.recompute + moe_redo,
        ep_forward=a2a + etp_f, ep_backward=a2a + etp_b + (a2a + etp_f if dispatch_again else 0.0),
        grad_bytes=moe_dense_part_per_rank(m, par.tp) * grad_bytes,
        expert_grad_bytes=experts_per_rank(m, par.ep, par.etp or par.tp) * grad_bytes,
        hardware_flops=lc.hardware_flops + moe.hardware_flops + moe_redo_flops,
        wgrad=lc.backward_weight + moe.backward_weight, moe_forward=moe.forward, moe_backward=moe.backward,
        moe_wgrad=moe.backward_weight)


def chunk_fields(figures: list[LayerFigures | None], lo: int, n: int) -> dict:
    """ChunkPlan fields for layers lo..lo+n-1: the leading dense layers of a MoE model apart, the others averaged
    (their sum, which the engine plays, is exact)."""
    layers = figures[lo:lo + n]
    if not layers:      # a stage of the embedding, or of the loss and MTP modules, alone: no layer to play
        zero = ("fwd_layer", "bwd_layer", "recompute_layer", "ep_fwd_layer", "ep_bwd_layer", "grad_bytes_layer",
                "expert_grad_bytes_layer", "wgrad_layer", "moe_fwd_layer", "moe_bwd_layer", "moe_wgrad_layer")
        return {**dict.fromkeys(zero, 0.0), "lead_layers": 0}
    lead = 0
    while lead < n and layers[lead].ep_forward == 0.0 and layers[lead].expert_grad_bytes == 0.0 and \
            any(f.expert_grad_bytes for f in layers):
        lead += 1
    main = layers[lead:] or layers
    k = len(main)

    def avg(attr: str) -> float:
        return sum(getattr(f, attr) for f in main) / k

    out = {"fwd_layer": avg("forward"), "bwd_layer": avg("backward"), "recompute_layer": avg("recompute"),
           "ep_fwd_layer": avg("ep_forward"), "ep_bwd_layer": avg("ep_backward"),
           "grad_bytes_layer": avg("grad_bytes"), "expert_grad_bytes_layer": avg("expert_grad_bytes"),
           "wgrad_layer": avg("wgrad"), "moe_fwd_layer": avg("moe_forward"), "moe_bwd_layer": avg("moe_backward"),
           "moe_wgrad_layer": avg("moe_wgrad"), "lead_layers": lead}
    if lead:
        first = layers[0]
        out.update(lead_fwd=first.forward, lead_bwd=first.backward, lead_recompute=first.recompute,
                   lead_grad_bytes=first.grad_bytes, lead_wgrad=first.wgrad)
    return out
