"""Model FLOP per token and per step, the numerator of MFU: the dense formula (Narayanan et al. 2021 Eq. 3) and,
for models whose layers differ, the weights a token passes through (docs/model.md section 8).
"""

from __future__ import annotations

from simtrain.plan.build_moe import varied_layers
from simtrain.spec.scenario import Scenario


def model_flops_per_token(scenario: Scenario) -> float:
    """Model FLOP per token for MFU: 6 N + 12 L h s (Narayanan et al. 2021 Eq. 3 without the
    recompute term; PaLM, Chowdhery et al. 2022, App. B), with N the weights of the matrix
    multiplies: every layer's QKV, output, MLP matrices and the output projection (vocab x h).
    Norm weights and biases do no matrix multiply and are left out. Models whose layers differ
    (experts, latent attention, sliding windows, heads of their own width) count the weights a token
    passes through (``active_flops_per_token``)."""
    m = scenario.model
    if varied_layers(scenario) or m.q_width != m.hidden or m.mtp_layers:
        return active_flops_per_token(scenario)
    n_matmul = m.layers * m.matmul_params_per_layer + m.vocab * m.hidden
    return 6.0 * n_matmul + 12.0 * m.layers * m.hidden * scenario.training.seq_len


def active_flops_per_token(scenario: Scenario) -> float:
    """6 x the matrix-multiply weights one token passes through, plus the attention scores, per token:

    - per layer, the attention projections (MLA: its down and up projections too) and either the dense MLP or,
      in a MoE layer, the router (E h), top_k routed experts and the shared experts;
    - the output projection (V h), once for the model and once per MTP module, and each MTP module's
      projection [2h -> h] and layer;
    - the scores in the same non-causal convention as the dense formula's 12 L h s: 12 s (heads x head_dim) per
      layer (MLA: 6 s heads (qk_nope + qk_rope + v_head_dim)); a sliding-window layer counts 2 x its causal
      fraction of that (costs.causal_fraction: W - W^2/(2s) keys per query against s/2).

    This is Megatron-Bridge's flop_utils.transformer_flops (v0.2.0-v0.4.2; /work/research/moe.md section 2.1) except
    for three conventions: it halves the attention scores (causal), leaves out the router GEMM, and counts the
    latent norms; docs/model.md section 8 gives the formula and the difference."""
    m, s = scenario.model, scenario.training.seq_len
    at = m.attention
    per_layer_attn = m.attention_matmul_params
    dense_mlp = m.mlp_matrices * m.hidden * m.ffn_hidden
    if m.moe is not None:
        moe = m.moe
        moe_mlp = moe.experts * m.hidden + moe.top_k * m.mlp_matrices * m.hidden * moe.expert_ffn_hidden + \
            moe.shared_experts * m.mlp_matrices * m.hidden * moe.shared_width
    else:
        moe_mlp = dense_mlp
    n = m.dense_layer_count * (per_layer_attn + dense_mlp) + m.moe_layer_count * (per_layer_attn + moe_mlp)
    n += m.vocab * m.hidden
    n += m.mtp_layers * (2 * m.hidden * m.hidden + per_layer_attn + moe_mlp + m.vocab * m.hidden)
    if at.kind == "mla":
        score = 6.0 * s * m.heads * (at.qk_nope_head_dim + at.qk_rope_head_dim + at.v_head_dim)
    else:
        score = 12.0 * s * m.q_width
    scores = 0.0
    for i in range(m.layers + m.mtp_layers):
        w = at.sliding_window if at.windowed(i) and i < m.layers else 0
        fraction = 2.0 * (s * w - w * w / 2.0) / (s * s) if w and w < s else 1.0
        scores += score * fraction
    return 6.0 * n + scores


def model_flops_per_step(scenario: Scenario) -> float:
    return model_flops_per_token(scenario) * scenario.tokens_per_step
