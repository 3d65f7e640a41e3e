"""What one micro-batch leaves on each chunk of a pipeline rank, and the peak the rank's schedule makes of it.

A rank that holds one chunk (GPipe, 1F1B) keeps its whole micro-batch until the backward, so its peak is the
micro-batch's activations times the in-flight count of :func:`inflight_microbatches`. A rank
of several chunks (interleaved 1F1B, ZB-V, DualPipe) does not hold them alike:

- its chunks can hold different numbers of layers (``layers_per_stage`` uneven, or an empty first or last virtual
  stage), and a chunk's activations are its own layers', not the rank's mean;
- the embedding's dropout mask belongs to the chunk of the first model stage, and the output layer's input and
  what the loss keeps (§3.5) to the chunk of the last: the last virtual stage runs each forward just before its
  backward (Megatron-Core ``schedules.py``, interleaved: the backward order starts at the last chunk), so it holds
  one micro-batch's logits, not the rank's mean count.

So the peak is played from the rank's own list of passes (:func:`simtrain.plan.schedules.inflight_peak`) with each
chunk's bytes. The engine allocates the same per-chunk bytes at each forward (plan/build.py), so ``simtrain
memory`` and ``simtrain run`` agree.
"""

from __future__ import annotations

from dataclasses import dataclass

from simtrain.plan.activations import weight_grad_fraction
from simtrain.plan.schedules import (
    SPLIT_BACKWARD,
    V_SHAPED,
    inflight_peak,
    interleaved_rank,
    rank_schedules,
    stage_layout,
)
from simtrain.plan.shared_costs import shared
from simtrain.spec.scenario import Scenario


@dataclass(frozen=True)
class MicroBatchBytes:
    """Activations one micro-batch leaves on a pipeline rank, by part (bytes)."""

    chunk_layers: dict[int, float]   # its transformer layers', by chunk (each chunk's own; MTP on the last stage's)
    first_edge: float      # the embedding's dropout mask, on the chunk of the first model stage
    last_edge: float       # the output layer's input and the loss's kept tensors, on the chunk of the last
    last_edge_w: float = 0.0   # what of the last edge a split backward keeps from B to W (chunk_w_bytes)

    @property
    def layers(self) -> float:
        return sum(self.chunk_layers.values())

    @property
    def total(self) -> float:
        return self.layers + self.first_edge + self.last_edge


def chunk_bytes(mb: MicroBatchBytes, chunk: int, *, first: bool, last: bool) -> float:
    """One chunk's bytes per micro-batch: its own layers' and the edge terms of the model stage it holds."""
    return mb.chunk_layers[chunk] + (mb.first_edge if first else 0.0) + (mb.last_edge if last else 0.0)


def chunk_w_bytes(mb: MicroBatchBytes, chunk: int, w_fraction: float, *, last: bool) -> float:
    """What one micro-batch of a chunk keeps from its input-gradient pass (B) to its weight-gradient pass (W) under a
    split backward: ``w_fraction`` of its layers' activations, and on the last model stage's chunk the output
    layer's input and the logits' 16-bit gradient (``last_edge_w``). The zero-bubble fork defers the output layer's
    weight gradient like every linear's: ``LinearWithGradAccumulationAndAsyncCommunication.backward`` hands
    ``WeightGradStore.put`` the layer's input and its output gradient (sail-sg/zero-bubble-pipeline-parallelism
    megatron/core/tensor_parallel/layers.py @39f2c186); the loss's fp32 tensors are freed when B ends. The
    embedding's mask is not needed by W."""
    return mb.chunk_layers[chunk] * w_fraction + (mb.last_edge_w if last else 0.0)


def rank_chunk_w_fractions(scenario: Scenario, pp_rank: int, mb: MicroBatchBytes,
                           w_fraction: float) -> dict[int, float]:
    """Per chunk of ``pp_rank``: the share of its bytes it keeps from B to W (:func:`chunk_w_bytes`)."""
    par = scenario.parallel
    layout = stage_layout(par.schedule, par.pp, par.vpp)
    last_stage = scenario.virtual_stages - 1
    whole = rank_chunk_bytes(scenario, pp_rank, mb)
    out = {}
    for v in layout.stages_of(pp_rank):
        c = layout.chunk[v]
        kept = chunk_w_bytes(mb, c, w_fraction, last=layout.model_stage[v] == last_stage)
        out[c] = kept / whole[c] if whole[c] > 0 else w_fraction
    return out


def rank_chunk_bytes(scenario: Scenario, pp_rank: int, mb: MicroBatchBytes) -> dict[int, float]:
    """Bytes per micro-batch of each chunk of ``pp_rank``, by chunk index."""
    par = scenario.parallel
    layout = stage_layout(par.schedule, par.pp, par.vpp)
    last_stage = scenario.virtual_stages - 1
    return {layout.chunk[v]: chunk_bytes(mb, layout.chunk[v], first=layout.model_stage[v] == 0,
                                         last=layout.model_stage[v] == last_stage)
            for v in layout.stages_of(pp_rank)}


def inflight_microbatches(schedule: str, m: int, pp: int, stage: int, vpp: int = 1) -> float:
    """How many micro-batches' activations a pipeline rank holds at its peak, in units of the
    whole rank's layers.

    - GPipe: all m forwards run before any backward.
    - 1F1B (PipeDream-Flush, Narayanan et al. 2021 Sec. 2.2.1): min(m, pp - stage).
    - Interleaved 1F1B (Megatron-LM schedules.py warm-up count): rank r runs
      (pp - r - 1) * 2 + (vpp - 1) * pp warm-up chunk forwards, plus one in flight, each holding
      1/vpp of the rank's layers; capped at all m * vpp chunk forwards. For r = 0 this is the
      1 + (pp-1)/(pp*vpp) factor of Korthikanti et al. 2022, Sec. 4.2.3.
    """
    if schedule == "gpipe":
        return float(m)
    if schedule == "1f1b":
        return float(min(m, pp - stage))
    chunks = min((pp - stage - 1) * 2 + (vpp - 1) * pp + 1, m * vpp)
    return chunks / vpp


def rank_layers(scenario: Scenario, pp_rank: int) -> dict[int, int]:
    """Transformer layers per chunk of a pipeline rank."""
    par = scenario.parallel
    layout = stage_layout(par.schedule, par.pp, par.vpp)
    return {layout.chunk[v]: scenario.layers_per_stage[layout.model_stage[v]] for v in layout.stages_of(pp_rank)}


def held_activations(scenario: Scenario, pp_rank: int, mb: MicroBatchBytes, layers: int) -> tuple[float, float]:
    """(in-flight micro-batches in units of the rank's layers, bytes kept at the rank's peak). Played from the
    rank's own passes where a backward is split, the stages form a V, pairs merge (ep_overlap), or the rank holds
    several chunks (the latter two in bytes, each chunk with its own layers, edge terms and share kept from B to
    W); else the closed forms of :func:`inflight_microbatches`."""
    par = scenario.parallel
    per_chunk = rank_layers(scenario, pp_rank)
    share = {c: (n / layers if layers else 1.0 / len(per_chunk)) for c, n in per_chunk.items()}
    w_fraction = weight_grad_fraction(scenario)
    pair_layers = per_chunk if par.ep_overlap else None     # ep_overlap's merged pairs, layer by layer

    def walk(weights: dict[int, float], kept: float | dict[int, float] = w_fraction) -> float:
        key = ("inflight_peak", par.schedule, par.pp, scenario.microbatches, par.vpp, par.ep_overlap, pp_rank,
               tuple(weights.items()), tuple(kept.items()) if isinstance(kept, dict) else kept,
               tuple(pair_layers.items()) if pair_layers else None)
        return shared(key, lambda: inflight_peak(
            rank_schedules(par.schedule, par.pp, scenario.microbatches, par.vpp, par.ep_overlap)[pp_rank], weights,
            kept, pair_layers))

    if par.schedule in SPLIT_BACKWARD or par.schedule in V_SHAPED or par.ep_overlap:
        inflight = walk(share)
    else:
        inflight = inflight_microbatches(par.schedule, scenario.microbatches, par.pp, pp_rank, par.vpp)
    if par.schedule in SPLIT_BACKWARD or par.schedule in V_SHAPED or par.ep_overlap:
        return inflight, walk(rank_chunk_bytes(scenario, pp_rank, mb),
                              rank_chunk_w_fractions(scenario, pp_rank, mb, w_fraction))
    chunk_bytes_ = rank_chunk_bytes(scenario, pp_rank, mb)
    if len(set(chunk_bytes_.values())) <= 1:    # one chunk, or equal chunks: the closed form is the walk's peak
        return inflight, mb.total * inflight
    # interleaved 1F1B with chunks that differ: this rank's own list only (a search screens thousands of layouts)
    key = ("interleaved_peak", par.pp, scenario.microbatches, par.vpp, pp_rank, tuple(chunk_bytes_.items()))
    return inflight, shared(key, lambda: inflight_peak(
        interleaved_rank(par.pp, scenario.microbatches, par.vpp, pp_rank), chunk_bytes_, 1.0))
