"""Per-operation cost functions: the one cost model that both the analytic
estimate and the event engine call (style rule 5).

A kernel takes ``max(FLOPs / (peak x efficiency), bytes / (HBM x efficiency))``
plus a launch overhead. GEMM efficiency falls smoothly for small GEMMs:
``eff = best x g^3 / (g^3 + g_half^3)`` with ``g`` the geometric mean of M, N,
K: half of the best at ``g = g_half``, saturating within a factor of two of it
(the shape of public GEMM-vs-size curves: on H100 BF16 1024^3 reaches 30% of
the best, 2048^3 80%, 4096^3 99%; docs/sources.md). Flash attention follows
the same kind of curve in the sequence length, ``best x s / (s + s_half)``
(FlashAttention-2 benchmarks rise from ~50% of their best at 512 tokens to
the best at 16k). A hardware file may instead give the measured GEMM curve
itself (``gemm_curve``: [size, fraction of peak] points), interpolated in
log(size). All constants come from the hardware file with sources. All quantities are per TP rank,
per micro-batch, in seconds, FLOP and bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

from simtrain.plan import layer_kernels
from simtrain.plan.device import Device
from simtrain.plan.embedding_costs import embedding_backward_time
from simtrain.plan.layer_shape import LayerShape
from simtrain.plan.unfused_attention import unfused_attention_time


@dataclass(frozen=True)
class LayerCost:
    """Seconds and FLOP for one layer on one TP rank, one micro-batch."""

    forward: float
    backward: float
    recompute: float          # extra forward work done before the backward
    model_flops: float        # forward FLOP counted by MFU (all ranks' share / tp)
    hardware_flops: float     # forward+backward+recompute FLOP actually executed
    backward_weight: float = 0.0   # s, the weight-gradient GEMMs within ``backward`` (a split backward's W)


def gemm_shapes(sh: LayerShape) -> list[tuple[float, float, float]]:
    """Forward GEMMs (M, N, K) of one layer on one TP rank (Megatron column/row split)."""
    t, T, h = sh.tp, sh.tokens, sh.hidden
    up = sh.ffn * (sh.mlp_matrices - 1)   # gate and up fused for swiglu
    if sh.mla is not None:
        shapes = mla_gemm_shapes(sh)
    else:
        shapes = [
            (T, (sh.q + 2 * sh.kv_width) / t, h),   # QKV, column parallel
            (T, h, sh.q / t),                       # attention output, row parallel
        ]
    if sh.ffn:                            # a MoE layer's experts are costed apart (plan.costs_moe)
        shapes += [
            (T, up / t, h),                      # MLP up (+gate), column parallel
            (T, h, sh.ffn / t),                  # MLP down, row parallel
        ]
    return shapes


def mla_gemm_shapes(sh: LayerShape) -> list[tuple[float, float, float]]:
    """Forward GEMMs of DeepSeek's multi-head latent attention on one TP rank, in the non-absorbed form Megatron
    trains (moe.md section 2.2): the down projections to the query and key/value latents are replicated on every TP
    rank (Megatron-Core MLA's linear_q_down_proj / linear_kv_down_proj), the up projections are column-parallel over
    the heads, the output row-parallel."""
    t, T, h, a = sh.tp, sh.tokens, sh.hidden, sh.heads
    q_lora, kv_lora, nope, rope, v = sh.mla
    shapes = []
    if q_lora:
        shapes += [(T, q_lora, h), (T, a * (nope + rope) / t, q_lora)]   # q down, q up
    else:
        shapes += [(T, a * (nope + rope) / t, h)]
    shapes += [(T, kv_lora + rope, h),                                   # kv down (+ the shared rope key)
               (T, a * (nope + v) / t, kv_lora),                          # k (nope) and v up
               (T, h, a * v / t)]                                         # output, row parallel
    return shapes


def op_sac_matmuls(sh: LayerShape) -> tuple[list[tuple[float, float, float]], list[tuple[float, float, float]]]:
    """The forward matmuls of one layer in execution order, split as torchtitan's op-level selective activation
    checkpointing splits them: (kept, recomputed). Its policy saves the output of every matmul except every
    second one, counting from the layer's first (torchtitan ``parallelize_llama.py``,
    ``_apply_ac_to_transformer_block``: ``meta[mm_count_key] % 2 == 0`` recomputes). The order is Llama's: wq,
    wk, wv, wo, then w1, w3, w2 (SwiGLU) or fc1, fc2 (GELU); so q, v, w1, w2 are kept and k, o, w3 recomputed
    (GELU: q, v, fc1 kept; k, o recomputed).
    The layer's last matmul never runs again: PyTorch's non-reentrant checkpoint stops recomputing once every
    tensor the backward needs is back (torch/utils/checkpoint.py, ``set_checkpoint_early_stop``: "By default,
    non-reentrant checkpoint stops recomputation as soon as it has computed all needed Tensors"), and nothing in
    the backward needs the output of the last one (GELU's fc2); it is listed with neither."""
    t, T, h, kv, f = sh.tp, sh.tokens, sh.hidden, sh.kv_width, sh.ffn
    order = [(T, h / t, h), (T, kv / t, h), (T, kv / t, h), (T, h, h / t)]
    if sh.mlp_matrices == 3:
        order += [(T, f / t, h), (T, f / t, h), (T, h, f / t)]
    else:
        order += [(T, f / t, h), (T, h, f / t)]
    return order[0::2], order[1:-1:2]


def attention_flops(sh: LayerShape) -> float:
    """Forward FLOP of QK^T and AV on one TP rank: 4 b s^2 h / t (the attention terms behind Narayanan et al.
    2021, Eq. 3)."""
    if sh.mla is not None:   # QK^T over nope + rope widths, AV over v: 2 b s^2 a (qk + v) / t
        _q, _kv, nope, rope, v = sh.mla
        return 2.0 * sh.batch * sh.seq * sh.seq * sh.heads * (nope + rope + v) / sh.tp
    return 4.0 * sh.batch * sh.seq * sh.seq * sh.q / sh.tp


def causal_fraction(sh: LayerShape) -> float:
    """The fraction of the s x s score matrix a causal kernel computes: 1/2 with full attention; with a sliding
    window W < s, each query attends to at most W keys: (s W - W^2/2) / s^2."""
    if not sh.causal:
        return 1.0
    w = sh.window
    if w and w < sh.seq:
        return (sh.seq * w - w * w / 2.0) / (sh.seq * sh.seq)
    return 0.5


def layer_cost(sh: LayerShape, dev: Device, recompute: str) -> LayerCost:
    """Forward, backward and recompute time of one layer (costs module docstring for the rule)."""
    gemms = gemm_shapes(sh)
    fwd_gemm = sum(dev.linear_gemm_time(m, n, k) for m, n, k in gemms)
    # backward: data gradient (M x K result) and weight gradient (K x N result), same FLOP each
    bwd_gemm = sum(dev.linear_gemm_time(m, k, n) + dev.linear_gemm_time(k, n, m) for m, n, k in gemms)
    wgrad_gemm = sum(dev.linear_gemm_time(k, n, m) for m, n, k in gemms)   # Qi et al. 2024 Sec. 2: W = these alone
    gemm_flops = sum(2.0 * m * n * k for m, n, k in gemms)
    if dev.fp8:
        # each linear quantizes its input before the forward GEMM and its output gradient before the backward
        # GEMMs (M x K inputs, M x N output gradients), on this rank's share of the tokens
        fwd_gemm += dev.fp8_cast_time(sum(m * k for m, _, k in gemms), len(gemms))
        bwd_gemm += dev.fp8_cast_time(sum(m * n for m, n, _ in gemms), len(gemms))

    attn = attention_flops(sh)
    h, t = sh.hidden, sh.tp
    if sh.flash:
        # FlashAttention skips fully masked blocks of a causal mask: about half the work executed;
        # its backward recomputes the scores: 2.5x the forward FLOP (Dao 2023, Sec. 3 / benchmarks); a head width
        # between two of its kernels' runs at the wider one's cost
        executed = attn * causal_fraction(sh) * sh.attn_pad
        fwd_attn = dev.attention_time(executed, sh.seq)
        bwd_attn = dev.attention_time(2.5 * executed, sh.seq, backward=True)
    else:
        fwd_attn, bwd_attn = unfused_attention_time(sh, dev)
    # element-wise work per layer forward, bytes through HBM (16-bit): two residual adds (2 reads + 1 write
    # of sbh), two dropouts (read, write, mask), the activation function over the MLP width; the backward
    # moves twice as much. The two norms are timed on their own: forward reads and writes sbh, backward
    # reads the input and the output gradient and writes the input gradient (3 sbh), each at the norm
    # kernel's measured fraction of the bandwidth.
    split = t if sh.sequence_parallel else 1
    elem = dev.element_bytes
    sbh = sh.tokens * h * elem / split
    drop = 2 * 2.5 if sh.dropout else 0.0
    ew_bytes = (2 * 3 + drop) * sbh + (2 if sh.mlp_matrices == 2 else 3) * sh.tokens * sh.ffn / t * elem
    ew_kernels = 6 if sh.dropout else 4
    fwd_ew = dev.memory_time(ew_bytes, kernels=ew_kernels) + dev.norm_time(2 * 2 * sbh, backward=False, kernels=2)
    bwd_ew = dev.memory_time(2 * ew_bytes, kernels=ew_kernels + 2) + \
        dev.norm_time(2 * 3 * sbh, backward=True, kernels=4)
    if sh.layer_kernels != "fused":
        # a framework's eager element-wise kernels and layout copies beyond this count (layer_kernels.py)
        more = layer_kernels.extra_work(sh.layer_kernels, tokens=sh.tokens, batch=sh.batch, h=h, q=sh.q / t,
                                        k=sh.kv_width / t, f=sh.ffn / t, elem=elem)
        fwd_ew += dev.memory_time(more.forward_bytes, kernels=more.forward_kernels)
        bwd_ew += dev.memory_time(more.backward_bytes, kernels=more.backward_kernels)

    forward = fwd_gemm + fwd_attn + fwd_ew
    backward = bwd_gemm + bwd_attn + bwd_ew
    model_flops = gemm_flops + attn
    # hardware FLOP in the same (non-causal) convention as MFU, plus what recompute repeats
    if recompute == "full":
        extra, extra_flops = forward, model_flops
    elif recompute == "selective":
        extra, extra_flops = fwd_attn, attn
    elif recompute == "selective_op":
        # every second matmul and all element-wise work and norms run again; a fused attention kernel's output is
        # kept (torchtitan saves _scaled_dot_product_flash/efficient_attention), unfused attention is not
        redo = op_sac_matmuls(sh)[1]
        extra = sum(dev.gemm_time(m, n, k) for m, n, k in redo) + fwd_ew
        extra_flops = sum(2.0 * m * n * k for m, n, k in redo)
        if not sh.flash:
            extra, extra_flops = extra + fwd_attn, extra_flops + attn
    else:
        extra, extra_flops = 0.0, 0.0
    hw_flops = 3.0 * model_flops + extra_flops
    return LayerCost(forward=forward, backward=backward, recompute=extra,
                     model_flops=model_flops, hardware_flops=hw_flops, backward_weight=wgrad_gemm)


@dataclass(frozen=True)
class EdgeCost:
    """Embedding (first stage) and output layer + loss (last stage), one micro-batch, one TP rank."""

    embed_forward: float
    embed_backward: float
    head_forward: float
    head_backward: float
    head_model_flops: float
    embed_backward_weight: float = 0.0   # s, within embed_backward: the table gradient (all of it is W)
    head_backward_weight: float = 0.0    # s, within head_backward: the output layer's weight-gradient GEMM


#: bytes through HBM per logit of the cross-entropy loss, forward and backward, by implementation
#: (``e`` = 16-bit element size). ``eager``: PyTorch's composite path in fp32 (autocast runs log_softmax
#: and nll_loss in float32; Megatron-LM and torchtitan upcast the logits with ``.float()``): forward casts
#: the logits (read e, write 4) and runs log_softmax (read 4, write 4); the loss itself gathers one value
#: per row. Backward: the nll gradient (write 4), log_softmax backward (read 4 + 4, write 4), the cast back
#: (read 4, write e). ``fused``: one kernel reads the 16-bit logits in the forward; the backward reads them
#: again and writes their gradient (flash-attn's ``losses.cross_entropy``, llm-foundry's default
#: ``loss_fn: fused_crossentropy``). ``vocab_parallel``: Megatron-LM's ``_VocabParallelCrossEntropy``
#: (megatron/mpu/cross_entropy.py @de7dc40f and @2755bcb8, megatron/core/tensor_parallel/cross_entropy.py of the
#: zero-bubble fork @f68d3879, on ``output.float()``) and nanotron's copy of it (``_ShardedCrossEntropy``,
#: @67c5ebb6): forward casts the logits (read e, write 4), takes the row max (read 4), subtracts it (read 4,
#: write 4), exponentiates in place (read 4, write 4), sums (read 4) and divides in place (read 4, write 4);
#: backward multiplies the kept softmax by the loss gradient in place (read 4, write 4) and casts back (read 4,
#: write e); the target's one-per-row update is negligible.
CROSS_ENTROPY_BYTES = {
    "eager": (lambda e: e + 4 + 4 + 4, lambda e: 4 + 12 + 4 + e, 3, 3),
    "fused": (lambda e: e, lambda e: 2 * e, 1, 1),
    "vocab_parallel": (lambda e: e + 4 + 4 + 8 + 8 + 4 + 8, lambda e: 8 + 4 + e, 6, 2),
}


def edge_cost(tokens: int, hidden: int, vocab: int, tp: int, dev: Device,
              cross_entropy: str = "eager") -> EdgeCost:
    elem = dev.element_bytes
    embed_f = dev.memory_time(2 * tokens * hidden * elem, kernels=2)
    v = vocab / tp
    embed_b = embedding_backward_time(tokens, hidden, v, dev)
    logits = dev.gemm_time(tokens, v, hidden)
    fwd_bytes, bwd_bytes, fwd_kernels, bwd_kernels = CROSS_ENTROPY_BYTES[cross_entropy]
    loss = dev.memory_time(tokens * v * fwd_bytes(elem), kernels=fwd_kernels)
    head_w = dev.gemm_time(hidden, v, tokens)
    head_b = dev.gemm_time(tokens, hidden, v) + head_w + \
        dev.memory_time(tokens * v * bwd_bytes(elem), kernels=bwd_kernels)
    return EdgeCost(embed_forward=embed_f, embed_backward=embed_b, head_forward=logits + loss,
                    head_backward=head_b, head_model_flops=2.0 * tokens * v * hidden,
                    embed_backward_weight=embed_b, head_backward_weight=head_w)


def train_metrics_time(tokens: int, vocab: int, tp: int, dev: Device, metrics: int) -> float:
    """Training metrics over one micro-batch's logits, each an eager cross entropy without a backward: the
    eager loss's forward bytes and kernels (``CROSS_ENTROPY_BYTES``: autocast runs cross_entropy in fp32, so the
    16-bit logits are cast, then log_softmax and nll_loss run). Composer's trainer evaluates its train metrics
    after every micro-batch's backward (``Trainer._train_microbatch`` -> ``_eval_train_metrics``, under no_grad
    and the autocast context); Composer's LanguageCrossEntropy (and LanguagePerplexity, its subclass) call
    ``torch.nn.CrossEntropyLoss(reduction='sum')`` on the logits."""
    if metrics <= 0:
        return 0.0
    fwd_bytes, _, fwd_kernels, _ = CROSS_ENTROPY_BYTES["eager"]
    return metrics * dev.memory_time(tokens * (vocab / tp) * fwd_bytes(dev.element_bytes), kernels=fwd_kernels)


def grad_accumulation_bytes(mode: str, weight_bytes: float, grad_bytes: float, microbatches: int) -> float:
    """Bytes per parameter and micro-batch (on average over the step's ``microbatches``) that accumulating the
    micro-batches' gradients moves outside the weight-gradient GEMMs (``training.grad_accumulation``):

    - ``fused``: none (Megatron-LM's gradient_accumulation_fusion: the GEMM accumulates into the buffer).
    - ``unfused``: every micro-batch's gradient, in the weights' dtype, is added into a separate buffer of the
      gradient dtype: read w, read g, write g. nanotron's FP32GradientAccumulator does this after every
      micro-batch's backward, ``fp32_grad.add_(half_param.grad)`` per parameter
      (huggingface/nanotron src/nanotron/optim/gradient_accumulator.py @069c21c, ``backward`` and
      ``_accumulate_grad``; on the step that synchronises, its DDP hook ``fp32_accum_hook`` does the same add).
    - ``autograd``: PyTorch's own accumulation into ``.grad`` (in the weights' dtype): the first micro-batch's
      gradient is stolen, each later one added in place, ``variable_grad += new_grad``: read w twice, write w, on
      m - 1 of m micro-batches (pytorch/pytorch torch/csrc/autograd/functions/accumulate_grad.h, AccumulateGrad).
      Averaged over the step, since a plan's backward costs the same for every micro-batch.
    """
    if mode == "unfused":
        return weight_bytes + 2.0 * grad_bytes
    if mode == "autograd":
        return 3.0 * weight_bytes * (microbatches - 1) / microbatches
    return 0.0


#: ``training.autocast_weights``: bytes per fp32 parameter and micro-batch of torch.autocast's casts, each way. The
#: forward casts every linear's fp32 weight to 16 bits at its first use (read 4, write 2); the cache is dropped when
#: the outermost autocast context exits (pytorch torch/amp/autocast_mode.py ``autocast.__exit__``), i.e. after every
#: micro-batch's forward under Lightning (``NativeMixedPrecisionPlugin.forward_context``). The backward casts the
#: 16-bit weight gradient back to fp32 for the parameter's ``.grad`` (the cast's own backward: read 2, write 4).
AUTOCAST_CAST_BYTES = 6.0


def fsdp1_grad_bytes(weight_bytes: float, grad_bytes: float) -> tuple[float, float]:
    """Bytes per parameter PyTorch FSDP (flat parameters) moves through HBM to hand a unit's gradient to its
    reduce-scatter: (on the compute stream, on the post-backward stream ahead of the collective).

    - Compute stream: the unit's parameters are split views of its flat parameter, so autograd's
      SplitWithSizesBackward concatenates their gradients into the flat gradient: read w, write w.
    - Post-backward stream (``_post_backward_hook``, ``_reduce_grad``; torch/distributed/fsdp/_runtime_utils.py):
      the cast to the reduce dtype when it differs (read w, write g), then ``_div_if_needed`` pre-divides the
      unsharded gradient in place by the gradient predivide factor (> 1 on 2 or more ranks): read g, write g.
    """
    cast = weight_bytes + grad_bytes if grad_bytes != weight_bytes else 0.0
    return 2.0 * weight_bytes, cast + 2.0 * grad_bytes


#: PyTorch FSDP1's fixed cost per FSDP unit (one transformer layer) and micro-batch, in seconds: the time its
#: hooks spend per unit beyond the kernels and collectives (the caching allocator's allocations and frees of the
#: unsharded parameters and gradients, the flat-parameter views, the per-unit division of the gradient), which
#: a leaner implementation of the same sharded data parallelism does not spend. Source: yandex/YaFSDP README.md
#: (2024), "Benchmarks": iteration times of FSDP1 and YaFSDP on A100 80GB hosts, one sequence per GPU (one
#: micro-batch per iteration), no activation checkpointing. Per layer, (FSDP - YaFSDP) / layers: Llama 2 7B on 64
#: GPUs 1.56 (4096 tokens) and 1.88 ms (8192); on 128 GPUs 0.94 and 1.88 ms; Llama 2 13B on 128 GPUs 2.00 ms
#: (4096); Llama 3 8B on 64 GPUs 3.75 ms (4096). The median, 1.875 ms, is taken. The 2048-token rows (2.8-5.3 ms
#: per layer) are left out: there a layer's compute is shortest and its collectives least hidden, so their gap
#: mixes in communication, which simtrain times itself (the 34B rows, 18-21 ms, also memory pressure). The form
#: (fixed per layer and micro-batch) follows the validation residual; the size is this source's, with the
#: readings and their effect in docs/model.md section 2.12. Charged on the compute stream, a third with each layer's
#: forward and two thirds with its backward (assumed: the backward hook does about twice the forward's work), and
#: to ZeRO-2 (SHARD_GRAD_OP) as to ZeRO-3, which YaFSDP measured (an extrapolation).
FSDP1_UNIT_OVERHEAD = 1.875e-3


#: Adam's element-wise passes when unfused, bytes per parameter = UNFUSED_ADAM_BASE + 3 x gradient bytes. Reading
#: PyTorch's single-tensor AdamW (torch/optim/adamw.py) and Composer's DecoupledAdamW (composer 0.15-0.16,
#: optim/decoupled_weight_decay.py, adamw): decoupled decay p *= 1 - lr wd (8; Composer skips it at wd = 0 and
#: runs exp_avg.mul_ then add_ instead of lerp_, +8: the same total); m = lerp(m, g) (8 + g); v *= beta2 (8);
#: v += (1 - beta2) g g (8 + 2g: addcmul reads g twice); sqrt(v) (8), / sqrt(bias correction) (8), + eps (8);
#: p += -step m / denom (16). 72 + 3g bytes, 8 kernels; the multi-tensor (foreach) variant moves the same.
UNFUSED_ADAM_BASE = 72.0
UNFUSED_ADAM_KERNELS = 8


#: Megatron-LM's mixed-precision optimizer step (NVIDIA/Megatron-LM megatron/optimizer/optimizer.py:
#: Float16OptimizerWithFloat16Params.step @de7dc40f, MixedPrecisionOptimizer.step @2755bcb8 and in the zero-bubble
#: fork @f68d3879, the same passes), bytes per parameter of the passes every step runs whatever the
#: gradients' width: the gradient norm (clip_grad_norm_fp32: multi_tensor_l2norm reads the fp32 main gradients, 4),
#: apex FusedAdam on fp32 main parameters and gradients (read parameter, gradient, m, v: 16; write parameter, m,
#: v: 12) and _copy_main_params_to_model_params (multi_tensor_scale: read 4, write the 16-bit weight 2)
MEGATRON_ADAM_BASE = 4.0 + 28.0 + 6.0
#: _copy_model_grads_to_main_grads: ``main_grad.float()`` of a 16-bit gradient buffer (read 2, write 4); an fp32
#: buffer is returned as it is
MEGATRON_GRAD_CAST = 6.0
#: _unscale_main_grads_and_check_for_nan (fp16 only, with its loss scaler): torch._amp_foreach_non_finite_check_
#: and_unscale_ reads and writes the fp32 main gradients in place
MEGATRON_UNSCALE = 8.0


def megatron_optimizer_bytes(grad_bytes: float, loss_scaling: bool, zero_buffer: bool) -> float:
    """Bytes per parameter of Megatron-LM's mixed-precision optimizer step (``training.optimizer_kernel:
    megatron``): ``MEGATRON_ADAM_BASE``, the cast of a 16-bit gradient buffer to fp32 main gradients, the fp16
    loss-scale unscaling, and the zeroing of a contiguous gradient buffer before the next step (``zero_grad_buffer``
    in train_step: one write of ``grad_bytes``; PyTorch's ``.grad``, set to None, needs none)."""
    return MEGATRON_ADAM_BASE + (MEGATRON_GRAD_CAST if grad_bytes < 4.0 else 0.0) + \
        (MEGATRON_UNSCALE if loss_scaling else 0.0) + (grad_bytes if zero_buffer else 0.0)


def optimizer_time(params_local_sharded: float, optimizer: str, dev: Device, extra_grad_bytes: float = 0.0,
                   kernel: str = "fused", grad_bytes: float = 2.0, loss_scaling: bool = False,
                   zero_buffer: bool = False) -> float:
    """Optimizer step: memory-bound over the local (sharded) state.

    Adam, mixed precision, fused: read fp32 master, m, v (12 B) and the 16-bit gradient (2 B); write master,
    m, v (12 B) and the 16-bit weights (2 B): 28 bytes per parameter. Gradients kept wider than the weights
    (``training.grad_dtype: fp32`` with 16-bit weights) are read at ``extra_grad_bytes`` = 2 more.
    Adam unfused (``training.optimizer_kernel: unfused``): 72 + 3 x ``grad_bytes`` per parameter in 8 kernels
    (``UNFUSED_ADAM_BASE``). Megatron-LM's optimizer (``megatron``): ``megatron_optimizer_bytes``. SGD and
    Adafactor have one figure.
    """
    if optimizer == "adam" and kernel == "megatron":   # five passes: norm, Adam, copy, cast, unscale (+ zeroing)
        return dev.memory_time(params_local_sharded * megatron_optimizer_bytes(grad_bytes, loss_scaling, zero_buffer),
                               kernels=6)
    if optimizer == "adam" and kernel == "unfused":
        return dev.memory_time(params_local_sharded * (UNFUSED_ADAM_BASE + 3.0 * grad_bytes),
                               kernels=UNFUSED_ADAM_KERNELS)
    per_param = {"adam": 28.0, "sgd": 20.0, "adafactor": 14.0}[optimizer] + extra_grad_bytes
    return dev.memory_time(params_local_sharded * per_param, kernels=4)
