"""Activation memory of one transformer layer for one micro-batch: the bytes its forward keeps for the backward.

Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models", Sec. 4 and Table 2,
generalised to GQA and SwiGLU term by term (for GPT dimensions it reduces to their 34 sbh); what FP8 inputs,
torchtitan's op-level checkpointing, the loss and a split backward's weight-gradient pass change in it. The
per-stage ledger that multiplies these by layers and micro-batches in flight is :mod:`simtrain.plan.memory`.
"""

from __future__ import annotations

from simtrain.plan.device import FP8_COPY_BYTES
from simtrain.spec.scenario import Scenario


def activation_bytes_per_layer(s: int, b: int, h: int, a: int, *, ffn: int | None = None, kv: int | None = None,
                               mlp: str = "gelu", t: int = 1, sequence_parallel: bool = False,
                               attention_scores: bool = True, recompute: str = "none",
                               dropout: bool = True, q: int | None = None) -> float:
    """Activation bytes one transformer layer keeps for the backward, for one micro-batch.

    Korthikanti et al. 2022, Sec. 4.1-4.2 (s: sequence, b: micro-batch, h: hidden, a: heads, t: TP):
      no parallelism     s*b*h*(34 + 5*a*s/h)
      TP only            s*b*h*(10 + 24/t + 5*a*s/(h*t))
      TP + sequence par. s*b*h*(34 + 5*a*s/h) / t
    The 5as/h term (attention scores, softmax, dropout) is dropped by flash attention or
    selective recompute (``attention_scores=False``); full recompute keeps only the layer input,
    2sbh (Table 2), split by t with sequence parallelism.
    Term by term (bytes, 16-bit tensors, 1-byte dropout masks):
      replicated: 2sbh QKV input + 2sbh MLP input + 4sbh two norm inputs + 2sbh two dropout masks = 10sbh
      split by t: 2sbh Q + 4sb*kv K,V + 2sbh attention-output input + MLP (gelu 4sbf, swiglu 6sbf)
                  + 5as^2b scores (when kept)
    Without dropout (``dropout=False``: p = 0, PyTorch then launches no dropout kernel) the two 1-byte masks
    (2sbh) go, and kept scores are 2as^2b (the softmax output alone). With heads of their own width (``q`` =
    heads x head_dim != h) the query and the attention output's input are 2sbq each. A MoE layer passes ffn = 0
    and adds its experts' activations (``moe_activation_bytes``).
    """
    ffn = 4 * h if ffn is None else ffn
    qw = h if q is None else q
    kv = h if kv is None else kv
    if recompute == "full":
        return 2.0 * s * b * h / (t if sequence_parallel else 1)
    if recompute == "selective_op":
        return op_sac_bytes_per_layer(s, b, h, a, ffn=ffn, kv=kv, mlp=mlp, t=t, sequence_parallel=sequence_parallel,
                                      fused_attention=not attention_scores)
    replicated = (10.0 if dropout else 8.0) * s * b * h
    mlp_terms = (6.0 if mlp == "swiglu" else 4.0) * s * b * ffn
    split = 2.0 * s * b * qw + 4.0 * s * b * kv + 2.0 * s * b * qw + mlp_terms
    if attention_scores and recompute == "none":
        split += (5.0 if dropout else 2.0) * a * s * s * b
    if sequence_parallel:
        return (replicated + split) / t
    return replicated + split / t


def fp8_activation_saving(s: int, b: int, h: int, ffn: int, t: int, sequence_parallel: bool, recipe: str) -> float:
    """Bytes one layer's activations shrink by when the four linears save their inputs in FP8 for the weight
    gradient (TE: "By default, TE saves the columnwise quantized input for the backward pass";
    performance_considerations.rst), instead of the 16-bit tensors ``activation_bytes_per_layer`` counts: the QKV
    and MLP inputs (sbh each; the norms' outputs, split by t with sequence parallelism), the attention output
    projection's input (sbh/t) and FC2's input (sbf/t). Attention (Q, K, V, its output for the backward), norms
    and the activation function keep their 16-bit inputs."""
    per = 2.0 - FP8_COPY_BYTES[recipe]
    split = t if sequence_parallel else 1
    return per * (2.0 * s * b * h / split + s * b * h / t + s * b * ffn / t)


def op_sac_bytes_per_layer(s: int, b: int, h: int, a: int, *, ffn: int, kv: int, mlp: str, t: int = 1,
                           sequence_parallel: bool = False, fused_attention: bool = True) -> float:
    """Activation bytes one layer keeps under torchtitan's op-level selective checkpointing
    (``training.recompute: selective_op``), 16-bit tensors: the checkpoint's input, the outputs of the matmuls it
    keeps (``costs.op_sac_matmuls``: q, v and w1, plus w2 with SwiGLU) and the fused attention kernel's output and
    its fp32 log-sum-exp (torchtitan ``_save_list``: aten.mm, the flash and efficient SDPA ops,
    reduce_scatter_tensor). Everything else, the norms, RoPE, activation function and the other matmuls, is
    recomputed in the backward. A row-parallel matmul's output (w2) is its full sbh partial sum on every TP rank."""
    split = t if sequence_parallel else 1
    kept = 2.0 * s * b * h / split                     # checkpoint input (the layer's input)
    kept += 2.0 * s * b * (h + kv + ffn) / t           # q, v, w1 / fc1 outputs (column-parallel)
    if mlp == "swiglu":
        kept += 2.0 * s * b * h                        # w2 output, the 7th matmul
    if fused_attention:
        kept += 2.0 * s * b * h / t + 4.0 * s * b * a / t   # attention output + log-sum-exp per head and token
    if sequence_parallel:
        kept += 2 * 2.0 * s * b * h / t   # the two reduce-scatter outputs (reduce_scatter_tensor is in the save list)
    return kept


def loss_transient_bytes_per_logit(cross_entropy: str, elem: float) -> float:
    """Bytes per logit the loss holds at its peak beyond what it keeps for the backward (``stage_memory``).

    ``eager``, PyTorch's composite cross entropy on fp32 logits (torchtitan, Hugging Face): its backward holds
    the kept log-softmax output, the fp32 gradient of the log-probabilities that ``nll_loss_backward`` writes and
    the fp32 gradient of the logits that ``_log_softmax_backward_data`` writes, 12 bytes, 4 of them kept; the
    forward's peak, 16-bit logits + their fp32 copy + the log-softmax output, is e + 8 <= 12. So 8 bytes.
    ``fused`` (flash-attn's kernel): the backward writes the logits' gradient in the logits' dtype, e bytes.
    ``vocab_parallel`` (Megatron-LM's and nanotron's, costs.CROSS_ENTROPY_BYTES): it keeps the fp32 softmax (4
    bytes) and writes its gradient into it. e + 4 beyond what it keeps: exact when the 16-bit logits stay alive and
    the max is subtracted out of place (the zero-bubble fork; Megatron-Core core_v0.7.0.beta: forward peak e + 8); at
    most 4 too high for an in-place subtraction (Megatron-LM 2021-22, Megatron-Core @fd5cfec0) and e too high for
    nanotron, which frees the 16-bit logits first."""
    if cross_entropy == "vocab_parallel":
        return elem + 4.0
    return 8.0 if cross_entropy == "eager" else elem


def weight_grad_bytes_per_layer(s: int, b: int, h: int, *, ffn: int, kv: int, mlp: str, t: int = 1) -> float:
    """Activation bytes a layer's weight-gradient pass (W) still needs after its input-gradient pass (B): the
    input and the output gradient of each of its four matrix multiplies, 16-bit. Qi et al. 2024, Table 1: for GPT
    (FFN 4h, t = 1) this is 32 sbh (QKV 1 + 3, output projection 1 + 1, fc1 1 + 4, fc2 4 + 1, times h x 2 bytes).
    Column-parallel matmuls keep their full input and 1/t of the output gradient, row-parallel ones 1/t of the
    input and the full output gradient."""
    up = ffn * (2 if mlp == "swiglu" else 1)
    per_token = (h + (h + 2 * kv) / t) + (h / t + h) + (h + up / t) + (ffn / t + h)
    return 2.0 * s * b * per_token


def weight_grad_fraction(scenario: Scenario) -> float:
    """The share of a layer's kept activations that a split backward holds from its B until its W (at most all
    of them: under full recompute W needs tensors that B rebuilt, counted here as the kept input)."""
    tr, par = scenario.training, scenario.parallel
    return w_fraction_of(scenario.model, tr, tp=par.tp, sequence_parallel=par.sequence_parallel,
                         micro_batch=tr.micro_batch, recompute=tr.recompute)


def w_fraction_of(m, tr, *, tp: int, sequence_parallel: bool, micro_batch: int, recompute: str) -> float:
    """:func:`weight_grad_fraction` for a model and training settings at the given layout keys."""
    kept = activation_bytes_per_layer(
        tr.seq_len, micro_batch, m.hidden, m.heads, ffn=m.ffn_hidden, kv=m.kv_width, mlp=m.mlp, t=tp,
        sequence_parallel=sequence_parallel and tp > 1, attention_scores=not tr.flash_attention,
        recompute=recompute, dropout=tr.dropout)
    w = weight_grad_bytes_per_layer(tr.seq_len, micro_batch, m.hidden, ffn=m.ffn_hidden, kv=m.kv_width,
                                    mlp=m.mlp, t=tp)
    return min(1.0, w / kept) if kept > 0 else 0.0
