"""One virtual stage of a plan (:class:`ChunkPlan`): the per-layer costs, bytes and communication the engine and
the analytic estimate read, computed by :func:`simtrain.plan.build.build_plan`."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ChunkPlan:
    """One virtual stage: a run of consecutive layers on one pipeline rank."""

    vstage: int
    rank: int
    chunk: int
    layer_lo: int
    layers: int
    has_embedding: bool
    has_head: bool
    fwd_layer: float          # s, compute of one layer forward
    bwd_layer: float          # s, compute of one layer backward (without recompute)
    recompute_layer: float    # s, recomputed forward work before a layer's backward
    tp_fwd_layer: float       # s, TP collectives of one layer forward (on the critical path)
    tp_bwd_layer: float       # s, TP collectives of one layer backward (+ recomputed forward's)
    embed_fwd: float
    embed_bwd: float
    head_fwd: float
    head_bwd: float
    act_bytes: float          # activation bytes one micro-batch leaves on this rank until its backward
    grad_bytes_layer: float   # gradient bytes of one layer (per TP rank) for DP buckets
    grad_bytes_edge: float    # embedding / output-layer gradient bytes held by this chunk
    zero3_layer_bytes: float  # full (unsharded) 16-bit weights of one layer, per TP rank
    zero3_edge_bytes: float = 0.0  # full embedding / output-layer weights held by this chunk (ZeRO-3 gathers)
    metrics_bwd: float = 0.0  # s, training metrics over the logits after the chunk's backward (output-layer chunk)
    grad_prep_per_byte: float = 0.0  # s per gradient byte spent before its reduce-scatter (zero_impl fsdp1)
    gather_prep_per_byte: float = 0.0  # s per gathered weight byte spent before its all-gather (zero_impl fsdp2)
    # mixture of experts: the per-layer fields above describe the chunk's MoE layers; its first ``lead_layers``
    # layers are dense ones (DeepSeek-V3's first three), described by the lead_* fields
    ep_fwd_layer: float = 0.0     # s, EP dispatch + combine all-to-alls of one MoE layer forward (critical path)
    ep_bwd_layer: float = 0.0     # s, EP all-to-alls of one MoE layer backward (+ recomputed forward's)
    expert_grad_bytes_layer: float = 0.0   # routed-expert gradient bytes of one MoE layer, one GPU (over edp)
    lead_layers: int = 0
    lead_fwd: float = 0.0
    lead_bwd: float = 0.0
    lead_recompute: float = 0.0
    lead_grad_bytes: float = 0.0
    lead_tp_fwd: float = 0.0      # s, TP collectives of one leading dense layer forward (a MoE layer runs fewer)
    lead_tp_bwd: float = 0.0      # s, of its backward (+ a recomputed forward's)
    lead_tp_bwd_plain: float = 0.0  # s, of its backward without recompute
    # context parallelism: the CP communication of one layer (its attention's compute is in fwd/bwd_layer)
    cp_fwd_layer: float = 0.0     # s, exposed: where KV transfers outlast the blocks' attention, or a2a/all-gathers
    cp_bwd_layer: float = 0.0     # s, exposed, backward (+ a recomputed attention's)
    cp_fwd_hidden: float = 0.0    # s, CP transfers under the blocks' attention (busy, not on the critical path)
    cp_bwd_hidden: float = 0.0
    # recompute: full of the first ``recompute_count`` layers only (Megatron's block method; -1: every layer); the
    # others run their backward without recompute and its communication (the *_plain figures)
    recompute_count: int = -1
    tp_bwd_plain: float = 0.0
    tp_wgrad_hidden: float = 0.0  # s, of the layer's TP backward, what the weight gradients hide (a split B waits)
    # the asynchronous all-reduce's inputs (all-reduce alone, QKV and MLP-up weight gradients, slowdown), so that a
    # lane whose TP ring runs slower (degraded links) times its own overlap: () when it does not apply
    tp_async: tuple = ()
    cp_bwd_plain: float = 0.0
    cp_bwd_hidden_plain: float = 0.0
    # activation offloading (plan.offload): the copies are played by the engine (engine.host_copies)
    offload_groups: int = 0       # the chunk's first layers whose activations go to host memory
    offload_copy_s: float = 0.0   # s, one offloaded layer's copy alone on the host link (each way)
    offload_bytes: float = 0.0    # bytes one offloaded layer copies per micro-batch (each way)

    def recomputes(self, i: int) -> bool:
        return self.recompute_count < 0 or i < self.recompute_count

    def bwd_comm(self, i: int) -> tuple[float, float, float]:
        """(TP, exposed CP, hidden CP) seconds of the backward of the chunk's i-th layer."""
        lead = i < self.lead_layers
        if self.recomputes(i):
            return self.lead_tp_bwd if lead else self.tp_bwd_layer, self.cp_bwd_layer, self.cp_bwd_hidden
        return self.lead_tp_bwd_plain if lead else self.tp_bwd_plain, self.cp_bwd_plain, self.cp_bwd_hidden_plain

    def tp_fwd(self, i: int) -> float:
        """Seconds of the TP collectives of the chunk's i-th layer forward (a leading dense layer's or the others')."""
        return self.lead_tp_fwd if i < self.lead_layers else self.tp_fwd_layer

    @property
    def tp_totals(self) -> tuple[float, float]:
        """(forward, backward with recompute) seconds of the TP collectives of all the chunk's layers, one
        micro-batch: the leading dense layers' and the others'."""
        main = self.layers - self.lead_layers
        return self.lead_layers * self.lead_tp_fwd + main * self.tp_fwd_layer, \
            self.lead_layers * self.lead_tp_bwd + main * self.tp_bwd_layer

    @property
    def grad_bytes_layers(self) -> float:
        """Gradient bytes of all the chunk's layers (dense leading layers and MoE layers differ)."""
        return sum(self.layer_costs(i)[5] for i in range(self.layers))

    def layer_costs(self, i: int) -> tuple[float, float, float, float, float, float]:
        """(forward, backward, recompute, EP forward, EP backward, gradient bytes) of the chunk's i-th layer
        (counted from the chunk's first); its TP figures are ``tp_fwd(i)`` and ``bwd_comm(i)`` (leading dense layers
        differ)."""
        rec = self.recomputes(i)
        if i < self.lead_layers:
            return self.lead_fwd, self.lead_bwd, self.lead_recompute if rec else 0.0, 0.0, 0.0, self.lead_grad_bytes
        return self.fwd_layer, self.bwd_layer, self.recompute_layer if rec else 0.0, self.ep_fwd_layer, \
            self.ep_bwd_layer, self.grad_bytes_layer
    wgrad_layer: float = 0.0  # s, the weight-gradient part of bwd_layer (a split backward's W per layer)
    lead_wgrad: float = 0.0   # s, the weight-gradient part of lead_bwd
    moe_fwd_layer: float = 0.0    # s, of fwd_layer: the MoE block (router, permutation, experts, shared experts)
    moe_bwd_layer: float = 0.0    # s, of bwd_layer: the MoE block
    moe_wgrad_layer: float = 0.0  # s, of wgrad_layer: the MoE block's weight-gradient GEMMs

    def layer_wgrad(self, i: int) -> float:
        """Seconds of the weight-gradient GEMMs of the chunk's i-th layer (a split backward's W)."""
        return self.lead_wgrad if i < self.lead_layers else self.wgrad_layer
    embed_wgrad: float = 0.0  # s, the weight-gradient part of embed_bwd
    head_wgrad: float = 0.0   # s, the weight-gradient part of head_bwd
    act_w_bytes: float = 0.0  # of act_bytes, what a split backward keeps from its B until its W
    # FP8 amax all-reduces the compute waits for (plan.fp8_amax): per micro-batch, after the chunk's layers in the
    # forward and after its first layer's backward (B) in the backward
    amax_fwd: float = 0.0
    amax_bwd: float = 0.0
    # the embedding's, the output layer's and the loss's TP collectives on the critical path (plan.edge_tp), one
    # micro-batch; head_tp_bwd_alone: the output layer's backward collectives without its weight-gradient GEMM (B)
    embed_tp_fwd: float = 0.0
    embed_tp_bwd: float = 0.0
    head_tp_fwd: float = 0.0
    head_tp_bwd: float = 0.0
    head_tp_bwd_alone: float = 0.0
    head_tp_async: tuple = ()   # (all-reduce alone, weight-gradient GEMM, slowdown) where head_tp_bwd overlaps

    @property
    def edge_tp(self) -> float:
        """Seconds of the edge TP collectives of one micro-batch's forward and (whole) backward."""
        return self.embed_tp_fwd + self.embed_tp_bwd + self.head_tp_fwd + self.head_tp_bwd

    @property
    def forward_time(self) -> float:
        cp = self.layers * self.cp_fwd_layer + self.amax_fwd + self.embed_tp_fwd + self.head_tp_fwd
        if self.lead_layers or self.ep_fwd_layer:
            main = self.layers - self.lead_layers
            return self.embed_fwd + self.lead_layers * (self.lead_fwd + self.lead_tp_fwd) + \
                main * (self.fwd_layer + self.tp_fwd_layer + self.ep_fwd_layer) + self.head_fwd + cp
        return self.embed_fwd + self.layers * (self.fwd_layer + self.tp_fwd_layer) + self.head_fwd + cp

    @property
    def backward_time(self) -> float:
        return self._backward_time + self.embed_tp_bwd + self.head_tp_bwd

    @property
    def _backward_time(self) -> float:
        if self.lead_layers or self.ep_fwd_layer:
            main = self.layers - self.lead_layers
            lead = self.lead_layers * (self.lead_recompute + self.lead_bwd + self.lead_tp_bwd)
            per = self.recompute_layer + self.bwd_layer + self.tp_bwd_layer + self.ep_bwd_layer
            return self.head_bwd + lead + main * per + self.embed_bwd + self.metrics_bwd + \
                self.layers * self.cp_bwd_layer + self.amax_bwd
        per = self.recompute_layer + self.bwd_layer + self.tp_bwd_layer + self.cp_bwd_layer
        if 0 <= self.recompute_count < self.layers:
            plain = self.bwd_layer + self.tp_bwd_plain + self.cp_bwd_plain
            return self.head_bwd + self.recompute_count * per + (self.layers - self.recompute_count) * plain + \
                self.embed_bwd + self.metrics_bwd + self.amax_bwd
        return self.head_bwd + self.layers * per + self.embed_bwd + self.metrics_bwd + self.amax_bwd
