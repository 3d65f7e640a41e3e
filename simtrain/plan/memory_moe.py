"""What a mixture-of-experts model puts on one GPU: its layers' weights split into the dense part (attention, norms,
router, shared experts: split over TP, replicated over DP) and the routed experts (split over EP and expert TP,
replicated over the expert data-parallel group), and the activations its MoE blocks keep.

Megatron-Core keeps expert parameters in their own gradient buffers, reduced over the expert data-parallel group
(distributed_data_parallel.py, ``intra_expt_dp_group``), and its distributed optimizer shards expert state over that
group (moe.md section 3.5); so ZeRO divides dense state by dp and expert state by edp = tp x dp / (etp x ep).
"""

from __future__ import annotations

from simtrain.plan.costs_moe import ROUTER_SCORE_BYTES, MoEShape
from simtrain.plan.schedules import stage_layout
from simtrain.spec.scenario import Scenario


def moe_shape(scenario: Scenario) -> MoEShape | None:
    """The MoE block of one layer for one micro-batch, or None for a dense model."""
    m, tr, par = scenario.model, scenario.training, scenario.parallel
    if m.moe is None:
        return None
    moe = m.moe
    return MoEShape(tokens=tr.micro_batch * tr.seq_len // par.cp, hidden=m.hidden, experts=moe.experts, top_k=moe.top_k,
                    expert_ffn=moe.expert_ffn_hidden, shared_ffn=moe.shared_experts * moe.shared_width,
                    mlp_matrices=m.mlp_matrices, tp=par.tp, ep=par.ep, etp=par.etp or par.tp,
                    capacity_factor=moe.capacity_factor, imbalance=moe.imbalance, expert_bias=m.bias)


def _model_stages(scenario: Scenario, pp_rank: int) -> list[int]:
    """The model stages one pipeline rank holds, wherever the schedule places them (interleaved: v = chunk x pp + r;
    a V: r and 2 pp - 1 - r; DualPipe's two copies: r and pp - 1 - r)."""
    par = scenario.parallel
    layout = stage_layout(par.schedule, par.pp, par.vpp)
    return [layout.model_stage[v] for v in layout.stages_of(pp_rank)]


def layer_indices(scenario: Scenario, pp_rank: int) -> list[int]:
    """The model's layer indices held by one pipeline rank (all its chunks)."""
    lps = scenario.layers_per_stage
    starts = [sum(lps[:s]) for s in range(len(lps))]
    return sorted(i for s in _model_stages(scenario, pp_rank) for i in range(starts[s], starts[s] + lps[s]))


def holds_last_stage(scenario: Scenario, pp_rank: int) -> bool:
    """Whether the rank holds the last model stage (its output layer, loss and MTP modules)."""
    return scenario.virtual_stages - 1 in _model_stages(scenario, pp_rank)


def moe_dense_part_per_rank(model, tp: int) -> int:
    """One MoE layer's weights outside the routed experts on one TP rank: the attention matrices and the shared
    experts split by tp, with the q, k and v biases (column-parallel, as memory._local_params splits them); norms,
    router, the output's bias and sinks replicated."""
    matrices = model.attention_matmul_params + model.shared_expert_params + model.qkv_bias_params
    replicated = model.attention_other_params - model.qkv_bias_params
    return matrices // tp + replicated + 2 * model.norm_params + model.router_params


def experts_per_rank(model, ep: int, etp: int) -> int:
    """One MoE layer's routed-expert weights on one GPU: E / ep experts, each split over etp."""
    return model.moe.experts // ep * model.expert_params // etp


def expert_params_local(scenario: Scenario, pp_rank: int) -> int:
    """Routed-expert weights on one GPU of this pipeline rank (its MoE layers, and the MTP modules on the last)."""
    m, par = scenario.model, scenario.parallel
    if m.moe is None:
        return 0
    n = sum(1 for i in layer_indices(scenario, pp_rank) if m.is_moe_layer(i))
    if holds_last_stage(scenario, pp_rank):
        n += m.mtp_layers
    return n * experts_per_rank(m, par.ep, par.etp or par.tp)


def mtp_dense_params_local(scenario: Scenario, pp_rank: int) -> int:
    """MTP modules' weights outside the routed experts on one GPU of the last stage: the projection [2h -> h] split
    by tp, the norms, one layer's dense part."""
    m, par = scenario.model, scenario.parallel
    if not m.mtp_layers or not holds_last_stage(scenario, pp_rank):
        return 0
    layer = moe_dense_part_per_rank(m, par.tp) if m.moe is not None else m.params_per_layer // par.tp
    return m.mtp_layers * (2 * m.hidden * m.hidden // par.tp + 3 * m.norm_params + layer)


def moe_activation_bytes(sh: MoEShape, element_bytes: int, recompute: str, modules: tuple[str, ...] = ()) -> float:
    """Activation bytes one MoE block keeps for the backward on one GPU, one micro-batch (none beyond the layer
    input under full recompute or the ``moe`` module's recompute, which the dense formula already counts;
    ``moe_act`` and ``shared_experts`` drop their parts, ``plan.recompute``):

    - the routing probabilities, T x E fp32 (Megatron-Core's router returns dense [T, E] probs);
    - the permuted rows each local expert's fc1 reads (its weight gradient needs them): rows received x h;
    - fc1's output (the activation function's backward) and the activation's output (fc2's weight gradient):
      rows x (mlp - 1) f / etp and rows x f / etp;
    - the experts' outputs before the weighted unpermute (the routing weights' gradient): rows sent x h;
    - the shared experts like a dense MLP: (2 or 3) x T f_shared / tp, plus their activation output.
    """
    if recompute == "full" or "moe" in modules:
        return 0.0
    e = element_bytes
    rows = sh.rows_received
    width = sh.expert_ffn / sh.etp
    kept = sh.routed_tokens * sh.experts * ROUTER_SCORE_BYTES
    kept += rows * sh.hidden * e + rows * sh.mlp_matrices * width * e + sh.rows_sent * sh.hidden * e
    if "moe_act" in modules:
        kept -= rows * width * e             # the activation's output, fc2's input
    if sh.shared_ffn and "shared_experts" not in modules:
        kept += sh.mlp_matrices * sh.tokens * sh.shared_ffn / sh.tp * e
    return kept


def dispatch_buffer_bytes(sh: MoEShape, element_bytes: int) -> float:
    """The dispatcher's transient buffers at a MoE block's peak: the permuted send buffer and the all-to-all's
    receive buffer (rows x h each), freed after the combine."""
    return (sh.rows_sent + sh.rows_received) * sh.hidden * element_bytes
