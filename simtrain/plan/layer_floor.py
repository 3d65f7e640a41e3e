"""What one dense layer costs on one GPU, from the few keys it depends on, and the floor a search bounds layouts with.

:func:`step_device`, :func:`layer_shapes` and :func:`dense_layer_cost` are the plan's own definitions
(``build_plan`` calls them): the kernel model for the step's precision, the layer's shape on one TP and CP rank, and
its forward, backward and recompute compute. They read the hardware, the model, the training settings and, of the
layout, only (tp, sequence parallelism, cp, micro-batch, precision, recompute).

:func:`layer_floor` keeps from them what every chunk of such a layout spends per layer at least: the compute, and
the TP collectives where they are on the critical path (not when ``tp_comm_overlap`` hides them, nor where TP groups
differ: an explicit topology, a degraded link). It leaves out what
only some layouts pay or what depends on the rest of the layout (CP exchanges and their extra attention, FSDP's
per-unit work, pipeline sends, DP buckets, the embedding): each of those only adds to a chunk's time, so the floor
stays below the plan's per-layer figures, and ``simtrain.decide.bulk`` builds a step-time floor from it that stays
below the analytic lower bound (a test checks it on every layout of several searches).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from simtrain.plan import costs, device
from simtrain.plan.activations import w_fraction_of
from simtrain.plan.context import local_shape
from simtrain.plan.layer_memory import dense_layer_activation
from simtrain.plan.memory import layer_params_per_rank
from simtrain.plan.recompute import modules_for, selective_extra, selective_tp_factor
from simtrain.plan.tp_comm import TP_RECOMPUTE, tp_time
from simtrain.plan.tp_overlap import async_allreduce_wgrads, exposed_async_allreduce
from simtrain.spec.attention_kernels import ATTENTION_FORWARD_RATIO, TILE_WIDTHS
from simtrain.spec.placement import placement_of
from simtrain.spec.scenario import Scenario
from simtrain.spec.scenario_rules_kernels import megatron_softmax_fused


def attention_kernel_width(kernel: str, model) -> float:
    """The head width ``kernel`` computes for ``model``: latent attention's query-key width (nope + rope), else the
    head width rounded up to the kernel's own widths (:func:`attention_kernel_pad`; no table is claimed for cuDNN)."""
    if model.attention.kind == "mla":
        return model.attention.qk_nope_head_dim + model.attention.qk_rope_head_dim
    head = model.q_width / model.heads
    return head * attention_kernel_pad(kernel, head)


def step_device(hw, tr, precision: str, model) -> device.Device:
    """The kernel model of a step of ``model`` in ``precision``: its flash kernel at the speed of the head width the
    kernel computes (``compute.attention_head_width``), CUDA-graph launch gaps where the training captures graphs."""
    kernel = tr.attention_kernel
    width = attention_kernel_width(kernel, model)
    return device.Device(gpu=hw.gpu, compute=hw.compute, dtype=precision,
                         attention_speed=hw.compute.attention_speed(kernel, width),
                         attention_forward_ratio=ATTENTION_FORWARD_RATIO.get(kernel, 1.0),
                         fp8_recipe=tr.fp8_recipe,
                         graph_gap=device.graph_gap(hw.compute) if tr.cuda_graphs != "none" else None)





def attention_kernel_pad(kernel: str, head_dim: float) -> float:
    """The attention kernel's head width over the model's (>= 1): the wider kernel's tiles span the whole of it."""
    if head_dim <= 0:
        return 1.0
    if kernel in TILE_WIDTHS:
        width = next((w for w in TILE_WIDTHS[kernel] if head_dim <= w), head_dim)
    elif kernel == "flash2":
        width = 32 * math.ceil(head_dim / 32)
    else:
        return 1.0
    return width / head_dim


def unfused_softmax_of(tr, attn_batches: int) -> str:
    """The softmax unfused attention runs: ``training.unfused_softmax``, except that Megatron's falls back to PyTorch's
    (``"torch"``, unfused_attention.torch_softmax_bytes) for the shapes its fused kernel does not take."""
    if tr.unfused_softmax == "megatron" and not megatron_softmax_fused(tr.seq_len, attn_batches, tr.precision):
        return "torch"
    return tr.unfused_softmax


def layer_shapes(model, tr, *, tp: int, sequence_parallel: bool, cp: int,
                 micro_batch: int) -> tuple[costs.LayerShape, costs.LayerShape]:
    """(the whole micro-batch's layer, the layer as one CP rank runs it: s / cp of its tokens)."""
    at = model.attention
    mla = (at.q_lora_rank or 0, at.kv_lora_rank, at.qk_nope_head_dim, at.qk_rope_head_dim, at.v_head_dim) \
        if at.kind == "mla" else None
    tokens = micro_batch * tr.seq_len // cp
    full = costs.LayerShape(tokens=tokens * cp, seq=tr.seq_len, batch=micro_batch, hidden=model.hidden,
                            ffn=model.ffn_hidden, heads=model.heads, kv_width=model.kv_width,
                            mlp_matrices=model.mlp_matrices, tp=tp, sequence_parallel=sequence_parallel and tp > 1,
                            flash=tr.attention_kernel != "none", dropout=tr.dropout,
                            q_width=model.q_width if model.q_width != model.hidden else 0, mla=mla,
                            layer_kernels=tr.layer_kernels,
                            unfused_softmax=unfused_softmax_of(tr, model.heads * micro_batch // tp),
                            attn_pad=attention_kernel_pad(tr.attention_kernel, model.q_width / model.heads)
                            if mla is None else 1.0)
    return full, local_shape(full, cp)


def dense_layer_cost(shape: costs.LayerShape, dev: device.Device, tr, recompute: str) -> costs.LayerCost:
    """One dense layer's compute under ``recompute``, with Megatron's ``--recompute-modules`` beyond the default
    (``training.recompute_modules``) where selective recompute names them."""
    modules = modules_for(recompute, tr.recompute_modules)
    if modules and modules != ("core_attn",):
        extra, extra_flops = selective_extra(shape, dev, modules)
        lc = replace(costs.layer_cost(shape, dev, "none"), recompute=extra)
        return replace(lc, hardware_flops=lc.hardware_flops + extra_flops)
    return costs.layer_cost(shape, dev, recompute)


@dataclass(frozen=True)
class LayerFloor:
    """Seconds one layer and the output layer take on one GPU at least, for one micro-batch."""

    forward: float     # compute (+ TP collectives on the critical path)
    backward: float    # compute, the recomputed forward where every layer recomputes (+ TP collectives)
    compute: float     # forward + backward compute alone (what an overlapped pair of micro-batches cannot hide)
    head: float        # the output layer's forward and backward (its loss included)


def layer_floor(scenario: Scenario, *, micro_batch: int, precision: str, recompute: str) -> LayerFloor:
    """The floor of one dense layer of ``scenario``'s model run with its tp, sequence parallelism and cp, at
    ``micro_batch``, ``precision`` and ``recompute`` (module docstring). ``scenario`` is any layout with those tp,
    sequence parallelism and cp: of its placement, only its first pipeline rank's TP groups are timed, which on a
    uniform cluster (no explicit topology, no degraded link) every TP group of every layout matches; elsewhere the
    TP collectives are left out."""
    par, tr, hw = scenario.parallel, scenario.training, scenario.hardware
    dev = step_device(hw, tr, precision, scenario.model)
    full, shape = layer_shapes(scenario.model, tr, tp=par.tp, sequence_parallel=par.sequence_parallel, cp=par.cp,
                               micro_batch=micro_batch)
    lc = dense_layer_cost(shape, dev, tr, recompute)
    partial = recompute == "full" and tr.recompute_layers is not None
    rec = 0.0 if partial else lc.recompute
    tp_fwd = tp_bwd = 0.0
    # TP groups alike: every group of a uniform cluster lies in one node's scale-up domain the same way; a degraded
    # link or an explicit topology makes groups differ, and one group's time would bound no other: left out there
    alike = not scenario.hardware.explicit and not scenario.simulation.degraded_links
    if par.tp > 1 and alike and not ((par.tp_comm_overlap or par.tp_async_linears) and par.sequence_parallel):
        tp_fwd = tp_time(scenario, placement_of(scenario), shape.tokens * scenario.model.hidden * dev.element_bytes, 0)
        modules = modules_for(recompute, tr.recompute_modules)
        factor = selective_tp_factor(modules) if modules else TP_RECOMPUTE.get(recompute, 1.0)
        tp_bwd = tp_fwd * (1.0 if partial else factor)
        wgrads = async_allreduce_wgrads(scenario, shape, dev)
        if wgrads is not None:   # the plan's own exposure (plan.build)
            own, _ = exposed_async_allreduce(tp_fwd / 2.0, wgrads, hw.overlap_slowdown(False))
            tp_bwd = own + tp_fwd * ((1.0 if partial else factor) - 1.0)
    edge_dev = dev if tr.cuda_graphs == "full" else replace(dev, graph_gap=None)
    edge = costs.edge_cost(shape.tokens, scenario.model.hidden, scenario.model.vocab, par.tp, edge_dev,
                           tr.cross_entropy)
    return LayerFloor(forward=lc.forward + tp_fwd, backward=lc.backward + rec + tp_bwd,
                      compute=lc.forward + lc.backward + rec, head=edge.head_forward + edge.head_backward)


def memory_floor(scenario: Scenario, *, micro_batch: int, precision: str,
                 recompute: str) -> tuple[float, float, float, float]:
    """(parameters of one layer on one GPU, bytes one layer keeps per micro-batch, the short-lived peak of a
    recomputed layer on top of them, the share a split backward keeps from B to W) of ``scenario``'s model at its
    tp, sequence parallelism and cp: the ledger's own figures (``simtrain.plan.memory``), from which a search
    bounds a layout's peak memory from below (``simtrain.decide.bulk.memory_floors``)."""
    par, tr, m = scenario.parallel, scenario.training, scenario.model
    kept = dense_layer_activation(m, tr, tp=par.tp, sequence_parallel=par.sequence_parallel, cp=par.cp,
                                  micro_batch=micro_batch, precision=precision, recompute=recompute)
    transient = 0.0
    if recompute in ("full", "selective_op"):   # the ledger's recompute_peak
        whole = dense_layer_activation(m, tr, tp=par.tp, sequence_parallel=par.sequence_parallel, cp=par.cp,
                                       micro_batch=micro_batch, precision=precision, recompute="none")
        transient = max(0.0, whole - (kept if recompute == "selective_op" else 0.0))
    w = w_fraction_of(m, tr, tp=par.tp, sequence_parallel=par.sequence_parallel, micro_batch=micro_batch,
                      recompute=recompute)
    return float(layer_params_per_rank(m, par.tp)), kept, transient, w
