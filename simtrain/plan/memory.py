"""The memory ledger of one training step, per pipeline stage (reference article, rules 1-6).

Static state follows the ZeRO paper (Rajbhandari et al. 2020, Sec. 3.1 and 5):
mixed-precision Adam keeps 2 bytes of weights, 2 of gradients and K=12 of
optimizer state (fp32 master, first and second moment) per parameter; ZeRO-1
shards the K bytes over the DP group, ZeRO-2 also the gradients, ZeRO-3 also
the weights. Activations follow Korthikanti et al. 2022, "Reducing Activation
Recomputation in Large Transformer Models", Sec. 4 and Table 2, generalised to
GQA and SwiGLU term by term (for GPT dimensions it reduces to their 34 sbh).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from simtrain.plan.activations import (
    activation_bytes_per_layer,
    fp8_activation_saving,
    loss_transient_bytes_per_logit,
)
from simtrain.plan.context import cp_buffer_bytes
from simtrain.plan.device import DTYPE_BYTES, FP8_COPY_BYTES
from simtrain.plan.layer_memory import attention_widths, dense_layer_activation
from simtrain.plan.memory_chunks import (  # noqa: F401 - inflight_microbatches, rank_layers: read from here
    MicroBatchBytes,
    held_activations,
    inflight_microbatches,
    rank_layers,
)
from simtrain.plan.memory_moe import (
    dispatch_buffer_bytes,
    expert_params_local,
    experts_per_rank,
    holds_last_stage,
    layer_indices,
    moe_activation_bytes,
    moe_dense_part_per_rank,
    moe_shape,
    mtp_dense_params_local,
)
from simtrain.plan.offload import resident_layers
from simtrain.plan.offload_optimizer import host_state_bytes
from simtrain.plan.recompute import mla_qkv_width, modules_of, selective_saving
from simtrain.plan.schedules import stage_layout
from simtrain.plan.shared_costs import by_value, shared
from simtrain.spec.scenario import Scenario

#: above this fraction of the GPU's memory a run is "at the edge of memory": `run` warns and `search` skips it
#: by default (a threshold for advice, not a model constant)
EDGE_OF_MEMORY = 0.95


@dataclass(frozen=True)
class StateBytes:
    """Bytes per parameter of weights, gradients and optimizer state, unsharded."""

    weights: float
    grads: float
    optimizer: float


#: training.autocast_weights: the 16-bit copy of each weight that torch.autocast makes in the forward and the linear
#: saves for its backward (docs/model.md section 2.12e)
AUTOCAST_COPY_BYTES = 2.0


def state_bytes_per_param(precision: str, optimizer: str, grad_dtype: str = "auto") -> StateBytes:
    """Bytes per parameter before ZeRO sharding.

    - Adam, mixed precision: 2 + 2 + 12 = 16 (ZeRO paper Sec. 3.1, K = 12: fp32 master, momentum, variance).
    - Adam, fp32: 4 + 4 + 8 (no separate master copy).
    - SGD with momentum: one fp32 momentum buffer (4), plus the fp32 master (4) in mixed precision.
    - Adafactor (Shazeer & Stern 2018, Sec. 3-4): no first moment by default and a factored second
      moment of O(rows + cols) per matrix, counted as 0 bytes per parameter here (it is < 0.1% for
      d >= 1024), plus the fp32 master (4) in mixed precision. Reference article rule 3.
    Gradients take the bytes of ``grad_dtype`` (``auto``: the weights'): bf16 weights with fp32 gradients
    make Adam 2 + 4 + 12 = 18 bytes (Megatron-LM README, distributed optimizer table: "bf16 param, fp32 grads: 18").
    """
    mixed = precision in ("bf16", "fp16", "fp8")   # fp8 training keeps BF16 weights and an fp32 master
    w = 2.0 if mixed else 4.0
    master = 4.0 if mixed else 0.0
    moments = {"adam": 8.0, "sgd": 4.0, "adafactor": 0.0}[optimizer]
    g = w if grad_dtype == "auto" else float(DTYPE_BYTES[grad_dtype])
    return StateBytes(weights=w, grads=g, optimizer=master + moments)


def fsdp1_sharded_state(state: StateBytes) -> StateBytes:
    """What PyTorch FSDP (FULL_SHARD, mixed precision) keeps per parameter shard: the sharded flat parameter in
    full precision, which is also the optimizer's master copy (4), the reduced gradient shard upcast to it (4),
    and the optimizer's moments. PyTorch ``MixedPrecision`` docs: "Outside forward and backward, the sharded
    parameters are kept in full precision (e.g. for the optimizer step)"; ``keep_low_precision_grads=False``
    (default) "upcasts gradients to full precision after the backward pass in preparation for the optimizer
    step". The 16-bit weights exist only while a unit is gathered (the ZeRO-3 buffers). Adam: 4 + 4 + 8 = 16."""
    return StateBytes(weights=4.0, grads=4.0, optimizer=state.optimizer - 4.0)


def fp8_weight_copies(recipe: str, columnwise_native: bool) -> float:
    """Bytes per linear-layer weight of the FP8 copies a recipe keeps for the step (TE quantizes the weights once
    per optimizer step, on the first micro-batch, and keeps them: ``is_first_microbatch``). The forward GEMM reads
    the weight rowwise, the data-gradient GEMM columnwise (TE performance_considerations.rst, Table 2):

    - tensorwise: one copy where the GPU reads FP8 columnwise (Blackwell: "no transpose is needed"), else a copy
      and its transpose (Hopper: "columnwise tensors need to be physically transposed"): 1 or 2 bytes;
    - blockwise: 128 x 128 weight blocks are transposable, but TE keeps the rowwise and columnwise copies it
      feeds the GEMMs: 2 x (1 + 4/128);
    - mxfp8: rowwise (1 x 32) and columnwise (32 x 1) blocks differ, "Both must be quantized independently"
      (TE mxfp8.rst): 2 x (1 + 1/32)."""
    copies = 1 if recipe == "tensorwise" and columnwise_native else 2
    return copies * FP8_COPY_BYTES[recipe]


@dataclass(frozen=True)
class StageMemory:
    """Peak memory of one device of a pipeline stage (all its DP/TP peers are alike)."""

    pp: int
    layers: int
    params_local: int
    params: float
    grads: float
    optimizer: float
    activations: float
    other: float
    inflight: float
    activation_per_microbatch: float
    kept_activations: float            # what the schedule keeps at its peak (activations less the transient peak)
    micro_batch_bytes: MicroBatchBytes  # activation_per_microbatch by part: layers, first and last edge
    other_detail: dict = field(default_factory=dict)
    fp8_weights: float = 0.0   # bytes of FP8 weight copies inside ``params`` (fp8 training)
    experts: dict = field(default_factory=dict)   # the routed experts' share of params/grads/optimizer (MoE only)
    offload_layer_bytes: float = 0.0   # activations one offloaded layer copies to host per micro-batch
    host_bytes: float = 0.0            # this GPU's activations in host memory at the peak
    host_optimizer: float = 0.0        # this GPU's optimizer shard in host memory (parallel.offload_optimizer)

    @property
    def total(self) -> float:
        return self.params + self.grads + self.optimizer + self.activations + self.other

    def breakdown(self) -> dict[str, float]:
        return {"params": self.params, "grads": self.grads, "optimizer": self.optimizer,
                "activations": self.activations, "other": self.other}


@dataclass(frozen=True)
class MemoryReport:
    stages: tuple[StageMemory, ...]
    capacity: float
    params_total: int

    @property
    def peak_max(self) -> float:
        return max(st.total for st in self.stages)

    @property
    def fits(self) -> bool:
        return self.peak_max <= self.capacity

    @property
    def headroom(self) -> float:
        return self.capacity - self.peak_max

    def dominant(self) -> str:
        worst = max(self.stages, key=lambda st: st.total)
        parts = worst.breakdown()
        return max(parts, key=parts.get)


def stage_layers(scenario: Scenario, pp_rank: int) -> list[int]:
    """Indices of the virtual stages (chunks) held by pipeline rank ``pp_rank``, by chunk."""
    par = scenario.parallel
    return stage_layout(par.schedule, par.pp, par.vpp).stages_of(pp_rank)


def rank_edges(scenario: Scenario, pp_rank: int) -> tuple[bool, bool]:
    """(does the rank hold the embedding, does it hold the output layer and loss): the first and last model
    stages, wherever the schedule places them (a V puts both on rank 0; DualPipe's two copies put both on the
    first and the last rank)."""
    par = scenario.parallel
    layout = stage_layout(par.schedule, par.pp, par.vpp)
    stages = {layout.model_stage[v] for v in layout.stages_of(pp_rank)}
    return 0 in stages, scenario.virtual_stages - 1 in stages


def layer_params_per_rank(model, tp: int) -> int:
    """Weights of one layer on one TP rank, without biases: its share of the matrices and both norms
    (replicated). What DP buckets carry and ZeRO-3 gathers per layer."""
    return model.matmul_params_per_layer // tp + 2 * model.norm_params


def edge_params(model, tp: int, pp: int, *, first: bool, last: bool) -> int:
    """Embedding / output-layer parameters one TP rank holds on the first and/or last (virtual) stage.

    First: the vocab-parallel embedding (Megatron splits it by t) and any learned position table.
    Last: the final norm and the output layer, split by t; with tied embeddings and pp > 1 Megatron
    keeps a copy of the embedding on the last stage, so only pp = 1 saves it. Untied, multi-token-prediction
    modules embed with a copy of the embedding on the last stage too (Megatron-Core language_module.py
    ``setup_embeddings_and_output_layer``: ``share_embeddings_and_output_weights or mtp_num_layers``)."""
    h = model.hidden
    count = 0
    if first:
        count += model.vocab * h // tp + model.position_embeddings * h
    if last:
        count += model.norm_params
        if not model.tied_embeddings or pp > 1:
            count += model.vocab * h // tp
        if model.mtp_layers and pp > 1 and not model.tied_embeddings:
            count += model.vocab * h // tp
    return count


def local_params(scenario: Scenario, pp_rank: int) -> tuple[int, int]:
    """(parameters held by one TP rank of this pipeline rank, its transformer layers)."""
    par = scenario.parallel
    # what the count reads: the model, its split over tp and the (virtual) stages, the experts' over ep and etp
    key = ("local_params", by_value(scenario.model), par.tp, par.pp, par.vpp, par.schedule, scenario.layers_per_stage,
           par.ep, par.etp, pp_rank)
    return shared(key, lambda: _local_params(scenario, pp_rank))


def _local_params(scenario: Scenario, pp_rank: int) -> tuple[int, int]:
    m, par = scenario.model, scenario.parallel
    t = par.tp
    layers = sum(rank_layers(scenario, pp_rank).values())
    h, f = m.hidden, m.ffn_hidden
    matrices = m.matmul_params_per_layer // t
    # column-parallel biases split by t (q, k, v; fc1), row-parallel ones (attention output, fc2) replicated
    mlp_out_bias = h if m.mlp_biased else 0
    biases = (m.qkv_bias_params + (f * (m.mlp_matrices - 1) if m.mlp_biased else 0)) // t + m.out_bias_params + \
        mlp_out_bias
    per_layer = matrices + biases + 2 * m.norm_params
    if m.moe is None:
        count = layers * per_layer
    else:
        moe_layers = sum(1 for i in layer_indices(scenario, pp_rank) if m.is_moe_layer(i))
        moe_layer = moe_dense_part_per_rank(m, t) + experts_per_rank(m, par.ep, par.etp or t)
        count = (layers - moe_layers) * per_layer + moe_layers * moe_layer
    first, last = rank_edges(scenario, pp_rank)
    count += edge_params(m, t, par.pp, first=first, last=last)
    if m.mtp_layers and holds_last_stage(scenario, pp_rank):
        count += mtp_dense_params_local(scenario, pp_rank)
        if m.moe is not None:   # a dense model's MTP layer is dense: mtp_dense_params_local holds all of it
            count += m.mtp_layers * experts_per_rank(m, par.ep, par.etp or t)
    return count, layers


def stage_memory(scenario: Scenario, pp_rank: int) -> StageMemory:
    par, tr, m = scenario.parallel, scenario.training, scenario.model
    hw = scenario.hardware
    state = state_bytes_per_param(tr.precision, tr.optimizer, tr.grad_dtype)
    fsdp1 = par.zero_impl == "fsdp1" and par.zero >= 3 and par.dp > 1 and tr.precision != "fp32"
    # fp32 parameters under torch.autocast are their own master copy, as FSDP1's flat parameter
    # (training.autocast_weights)
    stored = fsdp1_sharded_state(state) if fsdp1 or tr.autocast_weights else state
    n, layers = local_params(scenario, pp_rank)
    dp = scenario.dp_cp     # ZeRO shards over the ranks holding the same weights: dp x cp
    n_exp = expert_params_local(scenario, pp_rank)
    experts = {}
    if n_exp:   # expert state is sharded over the expert data-parallel group, the rest over dp
        edp = par.tp * dp // ((par.etp or par.tp) * par.ep)
        n -= n_exp
        experts = {"params": n_exp * stored.weights / (edp if par.zero >= 3 else 1),
                   "grads": n_exp * stored.grads / (edp if par.zero >= 2 else 1),
                   "optimizer": n_exp * stored.optimizer / (edp if par.zero >= 1 else 1)}
    weights = n * stored.weights / (dp if par.zero >= 3 else 1)
    if tr.autocast_weights:   # the 16-bit casts the linears save for their backward, alive through the micro-batch
        weights += n * AUTOCAST_COPY_BYTES
    fp8_copies = 0.0
    if tr.precision == "fp8":
        # the FP8 copies of the transformer layers' linear weights (embedding and output layer stay BF16);
        # GPUs with MXFP8 (Blackwell) read FP8 columnwise
        linear = layers * (m.matmul_params_per_layer // par.tp)
        if m.moe is not None:   # MoE layers: attention and shared experts split by tp, the local routed experts
            moe_layers = sum(1 for i in layer_indices(scenario, pp_rank) if m.is_moe_layer(i))
            moe_layer = (m.attention_matmul_params + m.shared_expert_params) // par.tp + \
                experts_per_rank(m, par.ep, par.etp or par.tp)
            linear += moe_layers * (moe_layer - m.matmul_params_per_layer // par.tp)
        fp8_copies = linear * fp8_weight_copies(tr.fp8_recipe, "mxfp8" in hw.gpu.peak_flops) / \
            (dp if par.zero >= 3 else 1)
        weights += fp8_copies
    grads = n * stored.grads / (dp if par.zero >= 2 else 1)
    optim = n * stored.optimizer / (dp if par.zero >= 1 else 1)
    host_optim = 0.0
    if par.offload_optimizer:   # the GPU's optimizer shard lives in host memory (plan.offload_optimizer)
        host_optim = host_state_bytes(n / (dp if par.zero >= 1 else 1) +
                                      (n_exp / (edp if par.zero >= 1 else 1) if n_exp else 0.0))
        optim = 0.0
        if n_exp:
            experts["optimizer"] = 0.0
    if n_exp:
        weights += experts["params"]
        grads += experts["grads"]
        optim += experts["optimizer"]
        n += n_exp

    # every kept activation is of the s / cp tokens a CP rank holds (Korthikanti's terms with s -> s / cp)
    s, b, h, a, t = tr.seq_len // par.cp, tr.micro_batch, m.hidden, m.heads, par.tp
    sp = par.sequence_parallel and t > 1
    scale = 2.0 if tr.precision == "fp32" else 1.0   # fp32 training: every term doubled (masks too, conservatively)
    per_layer = dense_layer_activation(m, tr, tp=t, sequence_parallel=par.sequence_parallel, cp=par.cp,
                                       micro_batch=b, precision=tr.precision, recompute=tr.recompute)
    fp8 = tr.precision == "fp8"
    modules = modules_of(tr)
    partial = tr.recompute == "full" and tr.recompute_layers is not None
    if partial:
        # Megatron's block method: the first recompute_layers of each (virtual) stage keep only their input
        kept_layer = activation_bytes_per_layer(
            s, b, h, a, ffn=m.ffn_hidden, mlp=m.mlp, t=t, sequence_parallel=sp, **attention_widths(m),
            attention_scores=not tr.flash_attention, recompute="none", dropout=tr.dropout) * scale
        if fp8:
            kept_layer -= fp8_activation_saving(s, b, h, m.ffn_hidden, t, sp, tr.fp8_recipe)
    msh = moe_shape(scenario)
    if msh is not None:
        attention_only = activation_bytes_per_layer(
            s, b, h, a, ffn=0, mlp=m.mlp, t=t, sequence_parallel=sp, **attention_widths(m),
            attention_scores=not tr.flash_attention, recompute=tr.recompute, dropout=tr.dropout) * scale
        attention_only -= selective_saving(s, b, h, 0, m.mlp, t, sp, modules, mla_qkv_width(m)) * scale
        moe_part = moe_activation_bytes(msh, 2, tr.recompute, modules) * scale
    # chunk by chunk (a virtual stage: its model stage's layers; DualPipe holds two copies' chunks), so that a rank
    # of several chunks keeps each one's own (plan/memory_chunks.py): its recomputed layers, its MoE layers, and the
    # MTP modules on the last model stage's chunk
    lay = stage_layout(par.schedule, par.pp, par.vpp)
    lps = scenario.layers_per_stage
    chunk_layers: dict[int, float] = {}
    for v in stage_layers(scenario, pp_rank):
        model_stage = lay.model_stage[v]
        n_chunk = lps[model_stage]
        recomputed = min(tr.recompute_layers, n_chunk) if partial else n_chunk
        part = per_layer * recomputed + (kept_layer * (n_chunk - recomputed) if partial else 0.0)
        if msh is not None:
            first_index = sum(lps[:model_stage])
            moe_n = sum(1 for i in range(first_index, first_index + n_chunk) if m.is_moe_layer(i))
            mtp = m.mtp_layers if model_stage == scenario.virtual_stages - 1 else 0
            part += (moe_n + mtp) * (attention_only + moe_part) - moe_n * per_layer
        chunk_layers[lay.chunk[v]] = part
    per_mb = sum(chunk_layers.values())
    n_off = tr.activation_offload_layers
    offload_layer = per_mb / layers if n_off and layers else 0.0   # one layer's (the mean), copied to host
    if offload_layer:
        off = offload_layer * (n_off - resident_layers(n_off))     # taken from the chunks by their layer counts
        chunk_layers = {c: v - off * lps[lay.model_stage[w]] / layers
                        for (c, v), w in zip(chunk_layers.items(), stage_layers(scenario, pp_rank), strict=True)}
        per_mb -= off
    first, last = rank_edges(scenario, pp_rank)
    # the embedding dropout mask (1 byte), Korthikanti Sec. 4.3; final norm input + output-layer input (16-bit) and
    # what the loss keeps for its backward: the fp32 log-softmax output with the eager loss (4sbv/t), the fp32
    # softmax with Megatron-LM's vocab-parallel one (4sbv/t), the 16-bit logits with the fused one (2sbv/t)
    logit_bytes = 2.0 if tr.cross_entropy == "fused" else 4.0
    # a split backward keeps of the last edge the output layer's input and the logits' 16-bit gradient until W
    # (memory_chunks.chunk_w_bytes)
    mb = MicroBatchBytes(
        chunk_layers=chunk_layers, first_edge=s * b * h / (t if sp else 1) if first and tr.dropout else 0.0,
        last_edge=(4.0 * s * b * h / (t if sp else 1) + logit_bytes * s * b * m.vocab / t) * scale if last else 0.0,
        last_edge_w=(2.0 * s * b * h / (t if sp else 1) + 2.0 * s * b * m.vocab / t) * scale if last else 0.0)
    per_mb = mb.total
    inflight, kept = held_activations(scenario, pp_rank, mb, layers)
    activations = kept
    # two short-lived peaks on top of what is kept, never held together: the layer being recomputed
    # materialises its full activations once (Korthikanti Table 2 note; under selective_op only what it did not
    # keep comes back), and on the last stage the loss's own peak (§3.5), which its backward frees before the
    # last layer is recomputed
    recompute_peak = 0.0
    if tr.recompute in ("full", "selective_op"):
        recompute_peak = (activation_bytes_per_layer(
            s, b, h, a, ffn=m.ffn_hidden, mlp=m.mlp, t=t, sequence_parallel=sp, **attention_widths(m),
            attention_scores=not tr.flash_attention, dropout=tr.dropout) * scale
            - (per_layer if tr.recompute == "selective_op" else 0.0))
    elif "moe" in modules and msh is not None:   # a recomputed MoE block holds its activations again once
        recompute_peak = moe_activation_bytes(msh, 2, "none") * scale
    loss_peak = 0.0
    if last:
        elem = 4.0 if tr.precision == "fp32" else 2.0
        loss_peak = loss_transient_bytes_per_logit(tr.cross_entropy, elem) * s * b * m.vocab / t
    activations += max(recompute_peak, loss_peak)

    detail = {}
    if par.zero >= 3 and dp > 1:
        # current + prefetched layer gathered in full (FSDP/ZeRO-3 prefetch of one layer)
        per_layer_params = layer_params_per_rank(m, par.tp)
        # two layers' full weights (current + prefetched) and one layer's unsharded gradient
        # awaiting its reduce-scatter; the engine tracks the same buffers over time
        # plus, on the first and last stage, the embedding / output-layer weights gathered for the whole op
        edge = edge_params(m, par.tp, par.pp, first=first, last=last)
        detail["zero3_gather_buffers"] = (per_layer_params * (2 * state.weights + state.grads) if layers else 0.0) \
            + edge * state.weights
    if par.cp > 1:   # the KV blocks in flight (p2p), gathered K and V (allgather) or head-split copies (a2a)
        detail["cp_buffers"] = cp_buffer_bytes(scenario, 4 if tr.precision == "fp32" else 2)
    if msh is not None:   # the dispatcher's send and receive buffers while a MoE block runs
        detail["dispatch_buffers"] = dispatch_buffer_bytes(msh, 2) * scale
    ov = hw.memory_overheads
    detail["cuda_context"] = ov.cuda_context
    detail["workspace"] = ov.workspace
    detail["comm_buffers"] = ov.comm_buffers
    tensors = weights + grads + optim + activations + detail.get("zero3_gather_buffers", 0.0)
    detail["fragmentation"] = ov.fragmentation * tensors
    return StageMemory(pp=pp_rank, layers=layers, params_local=n, params=weights, grads=grads,
                       optimizer=optim, activations=activations, other=sum(detail.values()),
                       inflight=inflight, activation_per_microbatch=per_mb, kept_activations=kept,
                       micro_batch_bytes=mb, other_detail=detail, experts=experts,
                       fp8_weights=fp8_copies, offload_layer_bytes=offload_layer,
                       host_bytes=offload_layer * n_off * inflight, host_optimizer=host_optim)


def memory_report(scenario: Scenario) -> MemoryReport:
    stages = tuple(stage_memory(scenario, p) for p in range(scenario.parallel.pp))
    return MemoryReport(stages=stages, capacity=scenario.hardware.gpu.memory,
                        params_total=scenario.model.params_total)
