"""The mixture-of-experts block of one layer on one GPU, one micro-batch: router, permutation, expert grouped GEMMs,
shared experts (the token all-to-alls are collectives: ``plan.collectives.all_to_all_shape``).

The steps follow Megatron-Core's ``MoELayer`` with the ``alltoall`` dispatcher (megatron/core/transformer/moe/,
core_v0.15.0; /work/research/moe.md section 3):

- **Router**: a [T, h] x [h, E] GEMM, then top-k over the scores (memory-bound over T x E fp32 values).
- **Permute**: each token copied once per chosen expert (``moe_permute``), T k rows of h read and written; after
  the all-to-all the rows are sorted by local expert (``sort_chunks_by_idxs``) when a rank holds more than one.
- **Experts**: TE's GroupedLinear issues one GEMM per local expert (transformer_engine/common/gemm/
  cublaslt_gemm.cu, v2.8), so each expert's fc1 [M, h] x [h, (mlp-1) f / etp] and fc2 [M, f / etp] x [f / etp, h]
  run at the hardware file's GEMM curve for that shape; M, the rows one local expert receives, is
  T k etp ep / E (times ``moe.imbalance`` on the most loaded rank), or the padded capacity with a capacity factor.
  Small M runs far below peak, as the curve says.
- **Unpermute**: the mirror of the permutation, with the routing weights applied.
- **Expert biases** (GPT-OSS): the fc2 bias, weighted by the routing probabilities, added per local expert by
  element-wise kernels (``expert_bias_time``).
- **Shared experts**: a dense MLP of shared_experts x shared width over all of the TP group's tokens, split over
  TP like the dense MLP.
- **FP8 quantization** (fp8 training): every expert GEMM quantizes its input and, in the backward, its output
  gradient, as the dense linears do (``expert_fp8_cast``, ``shared_fp8_cast``); each local expert's rows are padded
  to the FP8 alignment and the output unpadded (``expert_fp8_padding``).

T is the tokens one GPU routes: b s / tp (Megatron-Core runs MoE with sequence parallelism when tp > 1). The
backward runs each GEMM twice (data and weight gradient) and moves twice the permutation bytes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from simtrain.plan.device import Device

#: bytes of one fp32 router score (Megatron-Core moe_router_dtype fp32, the DeepSeek and Qwen recipes' setting)
ROUTER_SCORE_BYTES = 4


@dataclass(frozen=True)
class MoEShape:
    """The MoE block of one layer as one GPU sees it."""

    tokens: int            # b x s of the micro-batch (the TP group's tokens)
    hidden: int
    experts: int
    top_k: int
    expert_ffn: int
    shared_ffn: int        # shared_experts x shared width (0: none)
    mlp_matrices: int
    tp: int
    ep: int
    etp: int
    capacity_factor: float | None = None
    imbalance: float = 1.0
    expert_bias: bool = False   # the experts' linears carry biases (GPT-OSS)

    @property
    def routed_tokens(self) -> float:
        """Tokens this GPU routes: its share of the TP group's (sequence parallel)."""
        return self.tokens / self.tp

    @property
    def local_experts(self) -> int:
        return self.experts // self.ep

    @property
    def capacity(self) -> int | None:
        """Rows each expert takes from one source rank with a capacity factor (Megatron-Core get_capacity:
        ceil(T k / E x factor))."""
        if self.capacity_factor is None:
            return None
        return math.ceil(self.routed_tokens * self.top_k / self.experts * self.capacity_factor)

    @property
    def rows_sent(self) -> float:
        """Rows one GPU sends to the experts: T k dropless, capacity x E padded."""
        cap = self.capacity
        return self.routed_tokens * self.top_k if cap is None else cap * self.experts

    @property
    def rows_per_expert(self) -> float:
        """Rows one local expert computes on the most loaded rank (M of its GEMMs)."""
        cap = self.capacity
        if cap is not None:
            return cap * self.ep * self.etp
        return self.routed_tokens * self.top_k * self.etp * self.ep / self.experts * self.imbalance

    @property
    def rows_received(self) -> float:
        return self.rows_per_expert * self.local_experts


@dataclass(frozen=True)
class MoECost:
    """Seconds and FLOP of one MoE block (without its all-to-alls), one GPU, one micro-batch."""

    forward: float
    backward: float
    model_flops: float       # forward FLOP of the routed tokens' experts, router and shared experts on this GPU
    hardware_flops: float    # forward + backward FLOP executed, padding included
    backward_weight: float = 0.0   # s, within backward: the router's, experts' and shared experts' weight-gradient
                                   # GEMMs (a split backward's W; Megatron-Core's delayed expert wgrad)
    activation_forward: float = 0.0   # s, within forward: the experts' activation function (element-wise)
    shared_forward: float = 0.0       # s, within forward: the shared experts' MLP
    shared_flops: float = 0.0         # within model_flops: the shared experts' forward FLOP


def moe_cost(sh: MoEShape, dev: Device) -> MoECost:
    e = dev.element_bytes
    T, h, E = sh.routed_tokens, sh.hidden, sh.experts
    up = (sh.mlp_matrices - 1) * sh.expert_ffn / sh.etp
    down = sh.expert_ffn / sh.etp
    m = sh.rows_per_expert
    n_local = sh.local_experts
    # router: scores GEMM, then top-k / softmax or sigmoid over the fp32 scores (read, write)
    router_f = dev.gemm_time(T, E, h) + dev.memory_time(2 * T * E * ROUTER_SCORE_BYTES, kernels=2)
    router_b = dev.gemm_time(T, h, E) + dev.gemm_time(h, E, T) + \
        dev.memory_time(3 * T * E * ROUTER_SCORE_BYTES, kernels=2)
    # permute before the all-to-all (read and write the rows sent), sort by local expert after it (the rows
    # received, when a rank holds more than one expert); unpermute mirrors both
    one_way = dev.memory_time(2 * sh.rows_sent * h * e, kernels=1)
    if n_local > 1:
        one_way += dev.memory_time(2 * sh.rows_received * h * e, kernels=1)
    permute_f = permute_b = 2 * one_way
    # expert GEMMs, one per local expert (TE GroupedLinear on Hopper); TE's linears, GroupedLinear among them, run in
    # FP8 under fp8 training (linear_gemm_time; the router stays in BF16, Megatron-Core's TopKRouter is no TE linear)
    shapes = [(m, up, h), (m, h, down)]
    experts_f = n_local * sum(dev.linear_gemm_time(a, b, c) for a, b, c in shapes)
    experts_b = n_local * sum(dev.linear_gemm_time(a, c, b) + dev.linear_gemm_time(c, b, a) for a, b, c in shapes)
    wgrad = dev.gemm_time(h, E, T) + n_local * sum(dev.linear_gemm_time(c, b, a) for a, b, c in shapes)
    act_bytes = (3 if sh.mlp_matrices == 3 else 2) * m * n_local * down * e
    act_f = dev.memory_time(act_bytes, kernels=1)
    act_b = dev.memory_time(2 * act_bytes, kernels=1)
    expert_flops = n_local * sum(2.0 * a * b * c for a, b, c in shapes)
    # shared experts: a dense MLP over the TP group's tokens, split over tp
    shared_f = shared_b = shared_flops = 0.0
    if sh.shared_ffn:
        s_up = (sh.mlp_matrices - 1) * sh.shared_ffn / sh.tp
        s_shapes = [(sh.tokens, s_up, h), (sh.tokens, h, sh.shared_ffn / sh.tp)]
        shared_f = sum(dev.linear_gemm_time(a, b, c) for a, b, c in s_shapes) + \
            dev.memory_time((3 if sh.mlp_matrices == 3 else 2) * sh.tokens * sh.shared_ffn / sh.tp * e, kernels=1)
        shared_b = sum(dev.linear_gemm_time(a, c, b) + dev.linear_gemm_time(c, b, a) for a, b, c in s_shapes) + \
            dev.memory_time(2 * (3 if sh.mlp_matrices == 3 else 2) * sh.tokens * sh.shared_ffn / sh.tp * e, kernels=1)
        shared_flops = sum(2.0 * a * b * c for a, b, c in s_shapes)
        s_cast_f, s_cast_b = shared_fp8_cast(sh, dev)
        shared_f += s_cast_f
        shared_b += s_cast_b
        wgrad += sum(dev.linear_gemm_time(c, b, a) for a, b, c in s_shapes)
    router_flops = 2.0 * T * E * h
    cast_f, cast_b = expert_fp8_cast(sh, dev)
    pad_f, pad_b = expert_fp8_padding(sh, dev)
    bias_f, bias_b = expert_bias_time(sh, dev)
    forward = router_f + permute_f + experts_f + act_f + shared_f + cast_f + pad_f + bias_f
    backward = router_b + permute_b + experts_b + act_b + shared_b + cast_b + pad_b + bias_b
    flops = expert_flops + shared_flops + router_flops
    return MoECost(forward=forward, backward=backward, model_flops=flops, hardware_flops=3.0 * flops,
                   backward_weight=wgrad, activation_forward=act_f, shared_forward=shared_f,
                   shared_flops=shared_flops)


def expert_fp8_cast(sh: MoEShape, dev: Device) -> tuple[float, float]:
    """Seconds (forward, backward) of quantizing the routed experts' GEMM operands under fp8 training,
    by the rule the dense linears follow (``costs.layer_cost``, ``Device.fp8_cast_time``): each GEMM quantizes its
    input before the forward (M x K) and its output gradient before the backward (M x N). TE's GroupedLinear does
    this per expert, one quantizer per GEMM (transformer_engine/pytorch/module/grouped_linear.py @d0067d0:
    ``_split_quantize(inp_view, m_splits, input_quantizers, ...)`` in the forward, ``_split_quantize(grad_output,
    ...)`` in the backward), so each local expert's rows are their own FP8 tensors. The shared experts are TE
    linears (``shared_fp8_cast``). The router stays in BF16 (no TE linear). (0, 0) without fp8."""
    if not dev.fp8:
        return 0.0, 0.0
    h = sh.hidden
    up = (sh.mlp_matrices - 1) * sh.expert_ffn / sh.etp
    down = sh.expert_ffn / sh.etp
    rows = sh.rows_received                  # padded rows with a capacity factor, x imbalance on the busiest rank
    tensors = 2 * sh.local_experts           # fc1 and fc2 of every local expert
    fwd = dev.fp8_cast_time(rows * (h + down), tensors)      # fc1 input (M x h), fc2 input (M x f/etp)
    bwd = dev.fp8_cast_time(rows * (up + h), tensors)        # fc1 output gradient (M x up), fc2's (M x h)
    return fwd, bwd


#: rows of one expert's FP8 GEMM input are padded to a multiple of this (TE Fp8Padding, transformer_engine/pytorch/
#: module/fp8_padding.py @d0067d0: "32 for MXFP8, 128 for NVFP4, 16 for other built-in recipes")
FP8_ROW_ALIGN = {"mxfp8": 32, "tensorwise": 16, "blockwise": 16}


def expert_fp8_padding(sh: MoEShape, dev: Device) -> tuple[float, float]:
    """Seconds (forward, backward) of padding each local expert's rows to the FP8 GEMM alignment and unpadding its
    output, under fp8 training. Megatron-Core's TEGroupedMLP pads its input (and the routing probabilities) with TE's
    Fp8Padding before the grouped GEMMs and unpads fc2's output with Fp8Unpadding (megatron/core/transformer/moe/
    experts.py, NVIDIA/Megatron-LM a329dd6, 2025-09-22: for every dispatcher under fp8; unless the router pads the
    routing map, ``moe_router_padding_for_fp8``, default False and False in Megatron-Bridge's H100 Qwen3-MoE and
    DeepSeek-V3 recipes @067f987). Fp8Padding returns its input untouched when every expert's count is aligned and
    otherwise copies the whole tensor into a padded one (``fused_multi_row_padding``). Dropless routing, force-balanced
    with random scores as the benchmarks run it (``moe_router_force_load_balancing``), leaves counts that vary from
    expert to expert, so some local expert is unaligned and the copy happens; with a capacity factor every expert
    holds exactly ``rows_per_expert`` rows and the copy happens only when that is unaligned. Each copy reads and
    writes the rows x h activations: forward the input's padding and the output's unpadding, backward the two
    gradients' (4 e bytes per element each way), plus the probabilities' (4 bytes per row, fp32 at most; one more
    kernel each way)."""
    if not dev.fp8:
        return 0.0, 0.0
    if sh.capacity is not None and sh.rows_per_expert % FP8_ROW_ALIGN[dev.fp8_recipe] == 0:
        return 0.0, 0.0
    rows = sh.rows_received
    nbytes = 4.0 * dev.element_bytes * rows * sh.hidden + 2 * 4.0 * rows
    return dev.memory_time(nbytes, kernels=3), dev.memory_time(nbytes, kernels=3)


def shared_fp8_cast(sh: MoEShape, dev: Device) -> tuple[float, float]:
    """Seconds (forward, backward) of quantizing the shared experts' GEMM operands under fp8 training: TE linears
    over the TP group's tokens, split over tp, the dense rule (``expert_fp8_cast``). (0, 0) without fp8 or shared
    experts."""
    if not dev.fp8 or not sh.shared_ffn:
        return 0.0, 0.0
    s_up = (sh.mlp_matrices - 1) * sh.shared_ffn / sh.tp
    s_down = sh.shared_ffn / sh.tp
    return (dev.fp8_cast_time(sh.tokens * (sh.hidden + s_down), 2),
            dev.fp8_cast_time(sh.tokens * (s_up + sh.hidden), 2))


#: bytes per element of the expert fc2 output that Megatron-Core's eager bias path moves, forward and backward, in
#: the activation dtype (TEGroupedMLP._apply_bias, NVIDIA/Megatron-LM a329dd6 "Enable bias in expert mlp [gpt-oss
#: 5/5]", 2025-09-22, unchanged until the packed path of 883533e, 2026-08-14): per local expert ``t + b * p`` over
#: its rows, then ``torch.cat``. Forward: b * p writes (2), the add reads two and writes one (6), the cat reads and
#: writes (4) = 12 (``.to(dtype)`` is a no-op: the router runs in the activation dtype unless moe_router_dtype is
#: set, as Megatron-Bridge's GPT-OSS bridge leaves it). Backward: the add passes its gradient through; the product's
#: two gradients (bias: sum over rows of grad x p; probs: sum over h of grad x b) each a multiply (read, write: 4)
#: and a reduction (read: 2) = 12; the cat's backward is views.
EXPERT_BIAS_BYTES = (12.0, 12.0)
#: kernels per local expert of the same path: forward mul, add (the cat one for all); backward two multiplies and
#: two reductions
EXPERT_BIAS_KERNELS = (2, 4)


def expert_bias_time(sh: MoEShape, dev: Device) -> tuple[float, float]:
    """Seconds (forward, backward) of adding the routed experts' fc2 biases, weighted by the routing probabilities,
    the way Megatron-Core's TEGroupedMLP does it for biased experts (GPT-OSS): element-wise kernels per local expert
    over its rows of h (``EXPERT_BIAS_BYTES``, ``EXPERT_BIAS_KERNELS``). The fc1 bias rides in the fused activation
    (``weighted_bias_quick_geglu_impl``). (0, 0) when the experts carry no bias."""
    if not sh.expert_bias:
        return 0.0, 0.0
    elements = sh.rows_received * sh.hidden
    scale = dev.element_bytes / 2.0          # the byte counts above are for 2-byte activations
    fwd_k, bwd_k = EXPERT_BIAS_KERNELS
    return (dev.memory_time(EXPERT_BIAS_BYTES[0] * scale * elements, kernels=fwd_k * sh.local_experts + 1),
            dev.memory_time(EXPERT_BIAS_BYTES[1] * scale * elements, kernels=bwd_k * sh.local_experts))


def dispatch_bytes(sh: MoEShape, element_bytes: int) -> float:
    """Bytes one GPU sends in one dispatch (and one combine) all-to-all on the most loaded rank: its routed rows
    of h (T k h e dropless, capacity x E x h x e padded; MoEAlltoAllTokenDispatcher.token_dispatch), times the
    imbalance (the most loaded rank receives that much more than the mean)."""
    imbalance = sh.imbalance if sh.capacity is None else 1.0
    return sh.rows_sent * sh.hidden * element_bytes * imbalance


def allgather_bytes(sh: MoEShape, element_bytes: int) -> float:
    """Bytes of the all-gather dispatcher's gathered tensor per GPU: every GPU of the expert tp x ep group
    contributes its T tokens of h (MoEAllGatherTokenDispatcher: all-gather of hidden states over TP x EP);
    the combine is a reduce-scatter of the same size."""
    return sh.routed_tokens * sh.hidden * element_bytes * sh.etp * sh.ep


def etp_collective_bytes(sh: MoEShape, element_bytes: int) -> dict[str, tuple[tuple[str, float], ...]]:
    """Bytes of the alltoall dispatcher's expert-TP collectives in one MoE layer pass on the most loaded rank, per
    direction and kind (NCCL's convention: an all-gather's gathered output, a reduce-scatter's input), when etp > 1
    (NVIDIA/Megatron-LM megatron/core/transformer/moe/token_dispatcher.py @d98e8a6, MoEAlltoAllTokenDispatcher):
    after the EP all-to-all ``dispatch_postprocess`` all-gathers the received rows (BF16 hidden states) and their
    probabilities (fp32, ``moe_router_dtype``) over the expert-TP group, and ``combine_preprocess`` reduce-scatters
    the experts' output cast to the probabilities' dtype (``hidden_states.to(self.probs.dtype)``: fp32). The
    backward runs each as its mirror (tensor_parallel/mappings.py: a gather's backward is a reduce-scatter, a
    reduce-scatter's an all-gather) in the same dtypes. The gathered rows are the experts' input rows
    (``rows_received``, which counts the etp ranks' rows)."""
    rows = sh.rows_received
    tokens, probs, output = rows * sh.hidden * element_bytes, rows * ROUTER_SCORE_BYTES, \
        rows * sh.hidden * ROUTER_SCORE_BYTES
    return {"forward": (("all_gather", tokens), ("all_gather", probs), ("reduce_scatter", output)),
            "backward": (("reduce_scatter", tokens), ("reduce_scatter", probs), ("all_gather", output))}
