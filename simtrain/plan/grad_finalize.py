"""The gradient collectives a step runs after its data-parallel reduction and before the optimizer step.

Two of them, both in Megatron-LM's ``finalize_model_grads`` (megatron/core/distributed/finalize_model_grads.py
@d98e8a6; its 2021 form is ``train_step`` in megatron/training.py @de7dc40f) and in nanotron's
``sync_tied_weights_gradients`` (src/nanotron/trainer.py and parallel/tied_parameters.py @67c5ebb6):

- **The tied word embedding** (``model.tied_embeddings`` at ``pp`` > 1): the first stage holds the embedding, the last
  stage a copy of it as the output layer, and each computes a gradient of it. After the DP reduction the two
  all-reduce it over the embedding group, the first and the last pipeline rank of each (DP, TP) position
  (``_allreduce_word_embedding_grads``: ``main_grad``, else ``.grad``; nanotron: the fp32 accumulator's buffer,
  ``ReduceOp.SUM``). Megatron does the same for an untied model with multi-token-prediction modules, whose
  embedding is a copy on the last stage. Each TP rank sums its vocabulary shard, ``vocab / tp x hidden`` gradient
  elements. A ring all-reduce over two ranks moves the whole tensor each way once (2 (n - 1) / n = 1), which the
  engine plays as two flows, one each way, both ends done when both flows are. Under ZeRO-3 each rank holds a
  shard of the gradient, ``1 / dp`` of it (Megatron-FSDP all-reduces the local shard, ``_local_tensor``). A
  V-shaped layout (zb-v, dualpipev) holds both ends on rank 0, and DualPipe's mirror sum already adds the copies:
  nothing more there.
- **Weights replicated over the TP group** whose gradients each TP rank computes from part of the tokens: under
  sequence parallelism the layer norms (``fused_layer_norm.py`` and ``transformer_engine.py`` mark their weights
  ``sequence_parallel``), the biases of the row-parallel linears (``RowParallelLinear``), the MoE router
  (``moe/router.py``) and multi-head latent attention's down projections (``linear_q_down_proj``,
  ``linear_kv_down_proj``: ``TELinear`` with ``parallel_mode='duplicated'``, multi_latent_attention.py) with their
  latents' norms; and the query/key norms (``qk_layernorm``) whenever tp > 1. Megatron sums them over the TP
  group in one coalesced all-reduce (``_allreduce_non_tensor_model_parallel_grads``); nanotron ties every TP-unsharded
  weight across the TP group with ``ReduceOp.SUM`` in its ``REDUCE_SCATTER`` mode
  (``mark_unsharded_params_as_tied_across_tp``). The last stage adds its final norm.

Both run on the critical path of the lanes that take part: nothing overlaps them (nanotron's TODO: "Put this in
hooks so we can overlap communication"). Not counted: the MTP modules' own norms and a learned position table
shared with an encoder.
"""

from __future__ import annotations

from simtrain.plan.tp_comm import tp_collectives


def tied_ends(scenario, layout) -> tuple[int, int] | None:
    """The pipeline ranks that hold the embedding (the first virtual stage) and its copy (the last), or None where
    no sum runs: untied without MTP modules, one rank holding both (pp 1, or a V-shaped layout: zb-v, dualpipev),
    or DualPipe (its mirror sum adds the copies)."""
    par, m = scenario.parallel, scenario.model
    if not (m.tied_embeddings or m.mtp_layers) or par.schedule == "dualpipe":
        return None
    first, last = layout.rank[0], layout.rank[-1]
    return None if first == last else (first, last)


def tied_partner(ends: tuple[int, int], rank: int) -> int:
    return ends[1] if rank == ends[0] else ends[0]


def tied_embedding_grad_bytes(scenario, ends: tuple[int, int] | None, grad_bytes: float) -> tuple[float, ...]:
    """Per pipeline rank: the bytes of the embedding gradient that rank all-reduces with the other end (module
    docstring) between ``ends`` (:func:`tied_ends`); zero where nothing runs. Megatron keeps the copy on the last
    stage for a tied output layer and for the multi-token-prediction modules' embedding, tied or not
    (``_get_shared_word_embedding_weight``: ``share_embeddings_and_output_weights or mtp_num_layers``;
    language_module.py)."""
    par, m = scenario.parallel, scenario.model
    if ends is None:
        return (0.0,) * par.pp
    nbytes = m.vocab * m.hidden / par.tp * grad_bytes / (par.dp if par.zero == 3 else 1)
    return tuple(nbytes if r in ends else 0.0 for r in range(par.pp))


def replicated_grad_elements(model, layers: list[int], last: bool, sequence_parallel: bool) -> int:
    """Gradient elements of the weights one TP rank holds whole and sums over its TP group after the step's
    backward: ``layers`` are the transformer layers the rank holds (module docstring)."""
    n = 0
    at = model.attention
    for layer in layers:
        if sequence_parallel:
            n += 2 * model.norm_params
            n += model.out_bias_params   # the attention output's bias, and the MLP's second linear's
            if model.mlp_biased:
                n += model.hidden
            if model.is_moe_layer(layer):
                n += model.router_params
            if at.kind == "mla":   # the duplicated down projections and the latents' norms
                n += model.hidden * ((at.q_lora_rank or 0) + at.kv_lora_rank + at.qk_rope_head_dim)
                n += (at.q_lora_rank or 0) + at.kv_lora_rank
        if model.qk_norm:
            n += 2 * model.head_size
    if last and sequence_parallel:
        n += model.norm_params
    return n


def replicated_grad_sums(scenario, placement, chunks, grad_bytes: float) -> tuple[tuple[float, float], ...]:
    """Per pipeline rank: (seconds, bytes) of the one coalesced all-reduce of the replicated weights' gradients over
    the rank's TP groups, timed alone on the cluster graph (``tp_comm.tp_collectives``); zeros at tp 1."""
    par, m = scenario.parallel, scenario.model
    out = [(0.0, 0.0)] * par.pp
    if par.tp < 2:
        return tuple(out)
    for r in range(par.pp):
        own = [c for c in chunks if c.rank == r]
        layers = [i for c in own for i in range(c.layer_lo, c.layer_lo + c.layers)]
        n = replicated_grad_elements(m, layers, any(c.has_head for c in own), par.sequence_parallel)
        if n:
            nbytes = n * grad_bytes / (par.dp if par.zero == 3 else 1)
            out[r] = (tp_collectives(scenario, placement, nbytes, r, kinds=("all_reduce",))["all_reduce"], nbytes)
    return tuple(out)
