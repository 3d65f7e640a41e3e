"""The tensor-parallel collectives of the embedding, the output layer and the loss: one micro-batch, one TP rank.

A layer's collectives are ``tp_comm``'s; the model's two ends run their own (NVIDIA/Megatron-LM @d98e8a6):

- The embedding (``VocabParallelEmbedding.forward``, tensor_parallel/layers.py) looks up its vocabulary shard and
  sums the shards across the TP group: an all-reduce of b x s x h (``reduce_from_tensor_model_parallel_region``), or
  with sequence parallelism a reduce-scatter to the sequence shards (``reduce_scatter_to_sequence_parallel_region``)
  where ``LanguageModelEmbedding`` sets ``reduce_scatter_embeddings``: sequence parallelism and no learned position
  table. With a learned table (GPT-3) it all-reduces, adds the positions and splits the sum to the sequence shards
  (``scatter_to_sequence_parallel_region``, no communication). The backward of an all-reduce is the identity; that
  of a reduce-scatter, or of the split, an all-gather of the output gradient.
- The output layer (``GPTModel.output_layer``, a ``ColumnParallelLinear`` with ``gather_output`` off for the
  vocabulary-parallel loss) takes the whole input: with sequence parallelism it all-gathers the sequence shards
  first (``LinearWithGradAccumulationAndAsyncCommunication.forward``). Its backward all-reduces the input gradient
  (``allreduce_dgrad``), or with sequence parallelism gathers the input again under the input-gradient GEMM and
  reduce-scatters the input gradient; both collectives are issued asynchronously and waited for after the GEMM that
  follows them (``backward``: the weight-gradient GEMM runs under the all-reduce or reduce-scatter). As for a
  layer's (docs/model.md section 6.1), the all-reduce is hidden under the weight gradient and, under sequence
  parallelism, the re-gather is not counted and the reduce-scatter stays on the critical path.
- The vocabulary-parallel loss all-reduces per-token figures in fp32 (4 bytes a token):
  ``tensor_parallel/cross_entropy.py`` the maximum logit, the target's logit and the sum of exponentials (three);
  ``fusions/fused_cross_entropy.py`` the maximum, then the other two concatenated (two, 4 + 8 bytes a token).
  nanotron's ``sharded_cross_entropy`` (src/nanotron/parallel/tensor_parallel/functional.py @67c5ebb6) runs the same
  three as Megatron-LM's. An eager loss on gathered logits is not counted here (its gather is not modelled).

Where the collectives lie under a GEMM, the exposed part is ``max(0, collective - GEMM)`` and the hidden part slows
the GEMM by the hardware's overlap slowdown (``tp_overlap.exposed_async_allreduce`` with one GEMM); a stack without
the asynchronous backward (``parallel.tp_async_allreduce: false``) exposes them whole.
"""

from __future__ import annotations

from dataclasses import dataclass

from simtrain.plan.tp_comm import tp_collectives
from simtrain.plan.tp_overlap import exposed_async_allreduce

#: ``training.cross_entropy`` -> bytes per token of each all-reduce the loss's forward runs across the TP group
LOSS_ALLREDUCE_BYTES = {"vocab_parallel": (4.0, 4.0, 4.0), "fused": (4.0, 8.0), "eager": ()}


@dataclass(frozen=True)
class EdgeTP:
    """Seconds on the critical path, one micro-batch: the embedding's forward and backward, the output layer's
    (with the loss) forward and backward; ``head_backward_alone`` is the output layer's backward collectives with the
    weight-gradient GEMM moved away (a split backward's B, whose W runs later): what ran under it is exposed."""

    embed_forward: float = 0.0
    embed_backward: float = 0.0
    head_forward: float = 0.0
    head_backward: float = 0.0
    head_backward_alone: float = 0.0
    head_async: tuple = ()   # (all-reduce alone, weight-gradient GEMM, slowdown) where head_backward overlaps
    mtp_proj_forward: float = 0.0          # one MTP module's eh_proj, forward
    mtp_proj_backward: float = 0.0         # and backward (its input-gradient all-reduce under its weight gradient)
    mtp_proj_backward_alone: float = 0.0   # the same with the weight gradient moved away (a split backward's B)


def edge_tp(scenario, placement, act_bytes: float, tokens: int, pp_rank: int, *, head_wgrad: float,
            slowdown: float, mtp_wgrad: float = 0.0) -> EdgeTP:
    """The edge collectives of stage ``pp_rank``'s TP groups (module docstring). ``act_bytes``: b x s x h of one
    micro-batch in the activations' dtype; ``tokens``: its tokens (b x s, the loss's per-token figures);
    ``head_wgrad``: the output layer's weight-gradient GEMM, which the backward's all-reduce runs under;
    ``mtp_wgrad``: an MTP module's ``eh_proj`` weight-gradient GEMM, likewise for its all-reduce."""
    par = scenario.parallel
    if placement.tp == 1:
        return EdgeTP()
    one = tp_collectives(scenario, placement, act_bytes, pp_rank)
    losses = sum(tp_collectives(scenario, placement, tokens * b, pp_rank, kinds=("all_reduce",))["all_reduce"]
                 for b in LOSS_ALLREDUCE_BYTES[scenario.training.cross_entropy])

    def under(coll: float, gemm: float) -> float:
        if not par.tp_async_allreduce:
            return coll
        return exposed_async_allreduce(coll, (gemm,), slowdown)[0]

    if par.sequence_parallel:
        ag, rs = one["all_gather"], one["reduce_scatter"]
        embed = rs
        if scenario.model.position_embeddings:   # all-reduced before the positions are added, then split
            embed = tp_collectives(scenario, placement, act_bytes, pp_rank, kinds=("all_reduce",))["all_reduce"]
        # the layers' convention under sequence parallelism (docs/model.md section 6.1): the backward's re-gather
        # is not counted and its reduce-scatter is not hidden
        # eh_proj's input is [embedding, hidden], 2h wide: all-gathered before the GEMM, its gradient
        # reduce-scattered; its output all-gathered over the hidden dimension and split to the sequence shards
        # (the split's backward all-gathers)
        two = tp_collectives(scenario, placement, 2.0 * act_bytes, pp_rank)
        proj_bwd = ag + two["reduce_scatter"]
        head_f = ag
        if par.tp_async_linears:
            # nanotron's LM head is an asynchronous column-parallel linear (tp_overlap.exposed_tp_async_linears): its
            # input's gather runs under its own shard's GEMM (the forward multiplies the weight-gradient GEMM's
            # sizes: one time); its backward keeps the layers' convention
            head_f = max(0.0, ag - head_wgrad / placement.tp) + (slowdown - 1.0) * min(ag, head_wgrad / placement.tp)
        return EdgeTP(embed_forward=embed, embed_backward=ag, head_forward=head_f + losses, head_backward=rs,
                      head_backward_alone=rs, mtp_proj_forward=two["all_gather"] + ag,
                      mtp_proj_backward=proj_bwd, mtp_proj_backward_alone=proj_bwd)
    ar = one["all_reduce"]
    # eh_proj: its output all-gathered over the hidden dimension; the backward all-reduces its 2h-wide input gradient
    ar2 = tp_collectives(scenario, placement, 2.0 * act_bytes, pp_rank, kinds=("all_reduce",))["all_reduce"]
    gather = tp_collectives(scenario, placement, act_bytes, pp_rank, kinds=("all_gather",))["all_gather"]
    return EdgeTP(embed_forward=ar, head_forward=losses, head_backward=under(ar, head_wgrad),
                  head_backward_alone=ar, head_async=(ar, head_wgrad, slowdown) if par.tp_async_allreduce else (),
                  mtp_proj_forward=gather, mtp_proj_backward=under(ar2, mtp_wgrad), mtp_proj_backward_alone=ar2)


def mtp_tp_fields(chunk, edges: EdgeTP, mtp_layers: int, layer_fwd: float, layer_bwd: float) -> dict:
    """ChunkPlan fields of the last chunk with its multi-token-prediction modules' TP collectives added to its output
    layer's: each module (Megatron-Core transformer/multi_token_prediction.py @d98e8a6) embeds its shifted tokens
    (the embedding's collectives), runs one transformer layer like the model's last (``layer_fwd`` / ``layer_bwd``:
    that layer's TP collectives, the backward's with its recompute's, as the module's compute is priced) and its own
    output layer and loss (the output layer's), and before its layer the ``eh_proj`` linear that projects the
    concatenated [embedding, hidden] (2h) to h (``MultiTokenPredictionLayer._concat_embeddings``): a
    ``ColumnParallelLinear`` without gathered output, then ``gather_from_tensor_model_parallel_region`` and, under
    sequence parallelism, ``scatter_to_sequence_parallel_region``. On a degraded lane its all-reduce scales with the
    lane's TP time (its overlap is not timed again as the output layer's is)."""
    return {
        "head_tp_fwd": chunk.head_tp_fwd + mtp_layers * (edges.embed_forward + edges.mtp_proj_forward + layer_fwd
                                                         + edges.head_forward),
        "head_tp_bwd": chunk.head_tp_bwd + mtp_layers * (edges.embed_backward + edges.mtp_proj_backward + layer_bwd
                                                         + edges.head_backward),
        "head_tp_bwd_alone": chunk.head_tp_bwd_alone
        + mtp_layers * (edges.embed_backward + edges.mtp_proj_backward_alone + layer_bwd + edges.head_backward_alone),
    }
