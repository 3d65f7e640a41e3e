"""Attention without a fused (flash) kernel: its score GEMMs and the memory-bound kernels over the score matrix,
Megatron-LM's fused causal softmax, its PyTorch fallback and the dropout (docs/model.md section 2.4). Split from
``simtrain.plan.costs``, whose ``layer_cost`` calls :func:`unfused_attention_time`."""

from __future__ import annotations

from simtrain.plan.device import Device
from simtrain.plan.layer_shape import LayerShape

#: what the memory-bound kernels of unfused attention move per score element, in 16-bit elements (``e`` bytes each).
#: Megatron-LM's unfused path (CoreAttention, megatron/model/transformer.py): FusedScaleMaskSoftmax, then torch
#: dropout on the probabilities. A decoder's causal mask runs the softmax as ``scaled_upper_triang_masked_softmax``
#: (megatron/fused_kernels/scaled_upper_triang_masked_softmax.h @de7dc40f, the same @2755bcb8): row i loads only its
#: first i + 1 scores (``local_seq = blockIdx.x + 1``) and stores the whole row, zeros above the diagonal; the
#: backward loads the gradient and the probabilities of those i + 1 and stores the whole row of the score gradient.
#: So (reads, writes) per element, the reads over (s + 1) / 2s of the matrix: forward (1, 1), backward (2, 1); a
#: softmax over whole rows (``training.unfused_softmax: full_row``) reads all of it.
UNFUSED_SOFTMAX_ELEMENTS = ((1, 1), (2, 1))


def unfused_dropout_bytes(e: int) -> int:
    """Bytes per score element of the attention dropout, in either pass: the forward reads the probabilities and
    writes the dropped ones and a 1-byte mask; the backward reads the gradient and the mask and writes the input
    gradient (2e + 1)."""
    return 2 * e + 1


def unfused_softmax_read_share(sh: LayerShape) -> float:
    """The share of the score matrix the unfused softmax loads: Megatron's causal kernel (s + 1) / 2s; a softmax
    over whole rows, or attention that is not plain causal (a window, no mask), all of it."""
    if sh.unfused_softmax == "megatron" and sh.causal and not sh.window:
        return (sh.seq + 1) / (2 * sh.seq)
    return 1.0


def torch_softmax_bytes(e: int, backward: bool) -> tuple[int, int]:
    """(bytes per score element, kernels) of Megatron-LM's fallback softmax (``FusedScaleMaskSoftmax.
    forward_torch_softmax``, megatron/core/fusions/fused_softmax.py @d98e8a6), which runs where the fused kernel
    does not take the shape. With 16-bit scores and ``attention_softmax_in_fp32`` (Megatron-Core's default): the cast
    to fp32 (read e, write 4), the causal mask ``masked_fill_`` in place (read 4, write 4; transformer/utils.py
    ``attention_mask_func``), ``torch.nn.Softmax`` (read 4, write 4) and the cast back (read 4, write e). The backward
    runs each one's gradient: the cast (e, 4), the softmax's (read the gradient and the output, write: 12), the
    mask's ``masked_fill`` (4, 4) and the cast (4, e). No casts on fp32 scores. The scale is None (Megatron-Core
    folds 1/sqrt(d) into the score GEMM; only query-key layer scaling sets one: not counted); the mask itself,
    s^2 bytes broadcast over the batch and heads, is not counted. Assumed: softmax in fp32, TransformerConfig's
    default (and Megatron-LM's of 2021-22, whose default query-key layer scaling forced it); Megatron-LM's launcher
    of today defaults ``--attention-softmax-in-fp32`` off, which runs the mask and softmax in 16 bits (8 and 10 bytes
    an element, 2 kernels): not distinguished."""
    casts = 2 * (e + 4) if e < 4 else 0
    if backward:
        return casts + 12 + 8, 4 if casts else 2
    return casts + 8 + 8, 4 if casts else 2


def unfused_attention_time(sh: LayerShape, dev: Device) -> tuple[float, float]:
    """Forward and backward seconds of attention without a fused (flash) kernel on one TP rank: the score GEMMs,
    batched per head (QK^T writes the b a s^2 scores, AV reads the probabilities; the backward's four GEMMs, twice the
    forward's work, write dP and read P, dS, dS), plus the memory-bound kernels over the score elements
    (``UNFUSED_SOFTMAX_ELEMENTS``, ``unfused_dropout_bytes``). Each score GEMM is timed as one (b a s) x s x d GEMM,
    so its key (value) operand is counted once rather than once per sequence and head as a batched GEMM reads it (on
    the zero-bubble 1.5B shape 8.5% fewer bytes than the batched GEMM moves; not counted)."""
    heads_local = sh.heads / sh.tp
    score_elems = heads_local * sh.seq * sh.seq * sh.batch
    e = dev.element_bytes
    passes = []
    for backward, gemms in ((False, 2), (True, 4)):
        # the score GEMMs and the softmax at the GPU's measured unfused-attention rate, the dropout at the
        # streaming rate (device.unfused_attention_efficiency; hardware/dgx-a100.yaml cites the measurement)
        eff = dev.unfused_attention_efficiency(backward)
        score_gemm = dev.gemm_time(sh.batch * heads_local * sh.seq, sh.seq, sh.q / sh.heads, memory_efficiency=eff)
        if sh.unfused_softmax == "torch":
            # Megatron's PyTorch fallback: separate eager kernels at the streaming rate, beside the score GEMMs
            per_elem, kernels = torch_softmax_bytes(e, backward)
            t = gemms * score_gemm + dev.memory_time(per_elem * score_elems, kernels=kernels)
        else:
            reads, writes = UNFUSED_SOFTMAX_ELEMENTS[backward]
            softmax = e * score_elems * (reads * unfused_softmax_read_share(sh) + writes)
            t = gemms * score_gemm + softmax / (dev.gpu.memory_bandwidth * eff) + dev.kernel_overhead
        if sh.dropout:
            t += dev.memory_time(unfused_dropout_bytes(e) * score_elems)
        passes.append(t)
    return passes[0], passes[1]
