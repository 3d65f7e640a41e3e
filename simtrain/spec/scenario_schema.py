"""The closed schema of a scenario file: the keys of training, parallel and simulation, their types,
ranges and defaults (what a scenario may say; simtrain.spec.scenario_rules checks how the keys fit together).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, NonNegativeInt, PositiveInt, model_serializer

from simtrain.spec.quantity import Bytes, Number
from simtrain.spec.schema import Closed

SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b")
ATTENTION_KERNELS = ("flash1", "flash1_triton", "flash2", "flash3", "cudnn")


def _attention_kernel(value: object) -> object:
    """training.flash_attention: a bool, or the name of a flash-attention kernel."""
    if isinstance(value, bool) or value in ATTENTION_KERNELS:
        return value
    raise ValueError(f"{value!r} is not one of true, false, {', '.join(ATTENTION_KERNELS)}")


FlashAttention = Annotated[bool | Literal["flash1", "flash1_triton", "flash2", "flash3", "cudnn"],
                           BeforeValidator(_attention_kernel)]


class Training(Closed):
    """What one optimizer step processes and how."""

    seq_len: PositiveInt = Field(description="tokens per sequence")
    global_batch: PositiveInt = Field(description="sequences per optimizer step")
    micro_batch: PositiveInt = Field(1, description="sequences per micro-batch")
    precision: Literal["bf16", "fp16", "fp32", "fp8"] = Field(
        "bf16", description="bf16 | fp16 | fp32, or fp8: BF16 mixed precision whose linear layers run their three "
                            "GEMMs (forward, data and weight gradient) in FP8 (Transformer Engine fp8_autocast)")
    fp8_recipe: Literal["tensorwise", "blockwise", "mxfp8"] = Field(
        "tensorwise", description="fp8 only: tensorwise = one scale per tensor (TE delayed or current scaling, "
                                  "FP8-DS/FP8-CS); blockwise = 1x128 activation and 128x128 weight blocks "
                                  "(DeepSeek-V3); mxfp8 = OCP microscaling, 32-element blocks with E8M0 scales "
                                  "(Blackwell only)")
    fp8_amax_reduction: Literal["none", "per_chunk", "per_linear"] = Field(
        "none", description="fp8 tensorwise only: the amax all-reduces the next FP8 GEMM waits for. none = none on "
                            "the critical path (MXFP8 and blockwise scales are local; an asynchronous TP-only "
                            "reduction hides); per_chunk = delayed scaling's one blocking all-reduce per model chunk "
                            "and micro-batch in the forward and one in the backward over the stage's TP x DP x CP "
                            "ranks (TE 0.8 to 1.x with Megatron's amax group); per_linear = one over the TP group per "
                            "sequence-parallel FP8 input (current scaling) (docs/model.md section 2.13b)")
    fp8_amax_group: Literal["tp_dp_cp", "tp_cp", "tp"] = Field(
        "tp_dp_cp", description="per_chunk only: the ranks its all-reduces span. tp_dp_cp = the stage's TP x DP x CP "
                                "ranks (Megatron's amax group; TE 0.8 with apex, Megatron-Core 0.11+ by default); "
                                "tp_cp = TP x CP (Megatron-Core 0.8 to 0.10, or tp_only_amax_red); tp = the TP group "
                                "(Megatron-Core 0.7)")
    cuda_graphs: Literal["none", "partial", "full"] = Field(
        "none", description="CUDA graph capture: none = eager launches; partial = per-layer graphs (TE "
                            "make_graphed_callables: attention and MLP blocks); full = the whole forward and "
                            "backward (Megatron-Core full_iteration)")
    optimizer: Literal["adam", "adafactor", "sgd"] = "adam"
    optimizer_kernel: Literal["fused", "unfused", "megatron"] = Field(
        "fused", description="how the Adam step runs: fused = one pass over the state reading the 16-bit gradients "
                             "(torch fused=True); unfused = PyTorch's element-wise kernels, one pass per operation "
                             "(torch AdamW single-tensor or foreach, Composer's DecoupledAdamW); megatron = "
                             "Megatron-LM's mixed-precision optimizer: fp32 main gradients, loss-scale unscaling "
                             "(fp16), the gradient norm, apex FusedAdam on fp32, the copy back to 16-bit weights "
                             "(docs/model.md section 2.10)")
    autocast_weights: bool = Field(
        False, description="fp32 parameters under torch.autocast (PyTorch Lightning's precision bf16 or 16, torch.amp "
                            "without FSDP mixed precision): every micro-batch's forward casts each linear's weight to "
                            "16 bits and its backward casts the weight gradient back to fp32 for .grad (6 bytes per "
                            "parameter each way; docs/model.md section 2.12e)")
    grad_accumulation: Literal["fused", "unfused", "autograd"] = Field(
        "fused", description="how each micro-batch's gradients join the gradient buffer: fused = the weight-gradient "
                             "GEMM accumulates into it (Megatron-LM's gradient_accumulation_fusion); unfused = after "
                             "each micro-batch's backward a separate add per parameter reads its gradient and "
                             "reads and writes the buffer in grad_dtype (nanotron's FP32GradientAccumulator); "
                             "autograd = PyTorch's accumulation into .grad, an in-place add per parameter from the "
                             "second micro-batch on (docs/model.md section 2.12c)")
    layer_kernels: Literal["fused", "nanotron", "torchtitan"] = Field(
        "fused", description="the decoder layer's element-wise and layout kernels outside its GEMMs and attention: "
                             "fused = Megatron-Core / Transformer Engine style (fused norms and activation, no layout "
                             "copies); nanotron = nanotron's Llama layer (eager SwiGLU, the QKV permute and "
                             "key/value cat copies, flash-attn's in-place rotary); torchtitan = torchtitan's Llama 3 "
                             "block without torch.compile (eager fp32 RMSNorm and rotary, repeat_kv copies, eager "
                             "SwiGLU); each read from its code (docs/model.md section 2.12d)")
    unfused_softmax: Literal["megatron", "full_row"] = Field(
        "megatron", description="the softmax of attention without a fused (flash) kernel: megatron = Megatron-LM's "
                                "fused causal kernel (scaled_upper_triang_masked_softmax), which loads only the lower "
                                "triangle of the scores and stores whole rows; full_row = a softmax over whole rows "
                                "(XLA, Megatron's ScaledSoftmax without a causal mask); docs/model.md section 2.4")
    recompute: Literal["none", "selective", "selective_op", "full"] = Field(
        "none", description="activation recompute: selective = Megatron-LM's (the attention core), "
                            "selective_op = torchtitan's op-level policy (matmul and attention outputs kept, "
                            "every second matmul and all other ops recomputed), full = the whole layer")
    recompute_layers: PositiveInt | None = Field(
        None, description="recompute: full only: recompute only the first N layers of every (virtual) stage, one "
                          "layer at a time; the others keep all their activations (Megatron-Core's "
                          "--recompute-method block --recompute-num-layers N); default: every layer")
    recompute_modules: list[Literal["core_attn", "mlp", "moe_act", "moe", "layernorm", "mla_up_proj",
                                     "shared_experts"]] | None = Field(
        None, description="recompute: selective only: the modules whose activations are dropped and recomputed "
                          "before their backward (Megatron-Core's --recompute-modules); default [core_attn]")
    activation_offload_layers: NonNegativeInt = Field(
        0, description="activations of this many layers per stage move to host memory after their forward and "
                       "back before their backward, over the GPU's host (PCIe) link, overlapping compute "
                       "(Megatron-Core --cpu-offloading --cpu-offloading-num-layers N)")
    flash_attention: FlashAttention = Field(
        True, description="fused attention kernel: true = flash2 (FlashAttention-2, the kernel the hardware file's "
                          "attention figures describe), flash1 (FlashAttention-1 class: flash-attn 0.2-1.0's CUDA "
                          "kernel), flash1_triton (the FlashAttention-1 algorithm in Triton: flash-attn's "
                          "flash_attn_triton.py, MPT's attn_impl: triton), flash3 (FlashAttention-3, Hopper), cudnn "
                          "(cuDNN fused attention: Transformer Engine's FusedAttention, which TE prefers on Hopper and "
                          "newer), false = attention as GEMMs plus a memory-bound softmax")
    dropout: bool = Field(
        True, description="dropout layers run (Megatron-LM's GPT default); false = p = 0, as in Llama and MPT: "
                          "no dropout kernels and no masks kept")
    train_metrics: NonNegativeInt = Field(
        0, description="metrics computed over the logits after every micro-batch's backward, each an eager fp32 "
                       "cross entropy without a backward (Composer evaluates its train metrics on every micro-batch; "
                       "llm-foundry's MPT has two, LanguageCrossEntropy and LanguagePerplexity)")
    grad_dtype: Literal["auto", "fp32", "bf16", "fp16"] = Field(
        "auto", description="dtype gradients are kept and reduced in: auto = the training precision; "
                            "fp32 = Megatron-LM's bf16 default (fp32 main grads) and FSDP's reduce_dtype=float32 "
                            "(Composer DEFAULT, torchtitan)")
    cross_entropy: Literal["eager", "fused", "vocab_parallel"] = Field(
        "eager", description="loss kernel: eager = PyTorch's fp32 log_softmax + nll_loss (torchtitan, Hugging Face), "
                             "fused = one kernel over the 16-bit logits (flash-attn's cross entropy, llm-foundry, "
                             "Megatron-Core's cross_entropy_loss_fusion), vocab_parallel = Megatron-LM's "
                             "_VocabParallelCrossEntropy on fp32 logits (max, subtract, exp, sum, divide; also "
                             "nanotron's sharded_cross_entropy)")

    @property
    def attention_kernel(self) -> str:
        """'none', 'flash1', 'flash1_triton', 'flash2', 'flash3' or 'cudnn'."""
        if self.flash_attention is True:
            return "flash2"
        return self.flash_attention or "none"


class Parallel(Closed):
    """The parallel layout: data, tensor, pipeline (with virtual stages), ZeRO."""

    dp: PositiveInt = 1
    tp: PositiveInt = 1
    pp: PositiveInt = 1
    vpp: PositiveInt = Field(1, description="model chunks per pipeline rank (interleaved schedule)")
    schedule: Literal["gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-v", "dualpipe", "dualpipev"] = Field(
        "1f1b", description="pipeline schedule: gpipe, 1f1b, interleaved-1f1b (vpp >= 2), zb-h1 (zero bubble, "
                            "handcrafted, 1F1B's memory), zb-v (zero bubble in a V, vpp 2), dualpipe (DeepSeek-V3: "
                            "two directions, two model copies per rank, even pp), dualpipev (DualPipe in a V, vpp 2)")
    zero: Literal[0, 1, 2, 3] = 0
    backward_prefetch: Literal["pre", "post", "none"] = Field(
        "pre", description="ZeRO-3 only: when, on the GPU, the backward gathers the next layer's weights: "
                           "pre = as this layer's gradient computation starts (overlaps it; PyTorch FSDP with "
                           "BACKWARD_PRE, or BACKWARD_POST with limit_all_gathers, when the CPU runs ahead), "
                           "post = once this layer's "
                           "gradients are computed (FSDP BACKWARD_POST with a CPU that does not run ahead), none = "
                           "when the next layer starts")
    zero_impl: Literal["generic", "fsdp1", "fsdp2"] = Field(
        "generic", description="ZeRO-2/3 only: how gradients reach the reduce-scatter and gathered weights the layers. "
                               "generic = in place (Megatron-LM's contiguous buffers); fsdp1 = PyTorch "
                               "FullyShardedDataParallel's flat parameters: each unit's gradient is concatenated "
                               "into the flat gradient, cast to the reduce dtype and pre-divided before its "
                               "reduce-scatter, and each unit costs FSDP1's fixed 1.875 ms per micro-batch; "
                               "fsdp2 = PyTorch fully_shard's per-parameter sharding: each all-gather copies the "
                               "shard in and the gathered weights out to the parameters, each reduce-scatter copies "
                               "the gradients in; zero 3 only (docs/model.md sections 2.12, 2.12b)")
    sequence_parallel: bool = False
    tp_comm_overlap: bool = Field(
        False, description="Transformer Engine userbuffers (Megatron-Core tp_comm_overlap): with sequence "
                           "parallelism the TP all-gathers and reduce-scatters run in chunks under the neighbouring "
                           "GEMMs; what stays exposed: docs/model.md")
    tp_async_linears: bool = Field(
        False, description="nanotron's tp_linear_async_communication (its REDUCE_SCATTER mode, sequence parallelism): "
                           "each column-parallel linear all-gathers its input while it multiplies its own shard; "
                           "each row-parallel linear reduce-scatters its output exposed and gathers its output "
                           "gradient under its own shard's data-gradient GEMM (docs/model.md section 2.14)")
    tp_async_allreduce: bool = Field(
        True, description="without sequence parallelism: each column-parallel linear all-reduces its input "
                          "gradient while it computes its weight gradient (Megatron-LM's default since 2021-09, "
                          "Megatron-Core, Transformer Engine); false = both backward all-reduces exposed, as "
                          "Megatron-LM before 2021-09 (docs/model.md section 6.1)")
    ep: PositiveInt = Field(1, description="expert parallelism: each MoE layer's routed experts split over ep ranks, "
                                           "folded onto the tp x dp GPUs of a stage as Megatron-Core does "
                                           "(etp x ep x edp = tp x dp)")
    etp: PositiveInt | None = Field(None, description="expert tensor parallelism: each expert's matrices split over "
                                                      "etp ranks; default tp")
    moe_dispatcher: Literal["alltoall", "allgather", "deepep", "hybridep"] = Field(
        "alltoall", description="how tokens reach their experts: alltoall = Megatron-Core's all-to-all over the EP "
                                "group; allgather = all-gather of every token over the expert tp x ep group, "
                                "reduce-scatter back; deepep, hybridep = DeepEP's fused kernels")
    ep_overlap: bool = Field(
        False, description="Megatron-Core's EP all-to-all overlap (--overlap-moe-expert-parallel-comm with "
                           "--delay-wgrad-compute): in the 1F1B steady state one micro-batch's forward and another's "
                           "backward run merged, each one's dispatch and combine under the other's compute; 1f1b "
                           "with pp 1 or interleaved-1f1b, ep > 1, alltoall dispatcher")
    layers_per_stage: list[int] | Literal["auto"] | None = Field(
        None, description="uneven split, one entry per (virtual) stage in model order; 0 for a first stage with only "
                          "the embedding or a last with only the loss; auto = the split whose slowest pipeline rank is "
                          "fastest with every rank's memory fitting (the run reports it)")
    cp: PositiveInt = Field(1, description="context parallelism: each sequence split over cp GPUs (GPUs = dp x tp "
                                           "x pp x cp; Megatron-Core rank order tp-cp-dp-pp)")
    cp_comm: Literal["p2p", "a2a", "allgather"] = Field(
        "p2p", description="how context-parallel attention exchanges keys and values (Megatron --cp-comm-type): "
                           "p2p = ring attention, KV blocks passed to the ring neighbour under each block's "
                           "attention; a2a = Ulysses all-to-alls of Q, K, V and the output (heads split over cp); "
                           "allgather = K and V all-gathered before attention")
    offload_optimizer: bool = Field(
        False, description="optimizer state and step on the host CPU (Megatron-Core --optimizer-cpu-offload, "
                           "ZeRO-Offload's idea): each GPU's shard of fp32 master and moments lives in host memory; "
                           "per step its gradients go down over PCIe, the CPU steps Adam, the weights come back "
                           "(zero 1 or 2, adam)")

    @model_serializer(mode="wrap")
    def _without_unset_ep_overlap(self, handler) -> dict:
        """ep_overlap is listed only when true, so that the reports of runs without it read as before it existed."""
        out = handler(self)
        if not self.ep_overlap:
            out.pop("ep_overlap", None)
        return out


class Straggler(Closed):
    """A slower device: a named rank, or a seeded random fraction of all devices."""

    rank: int | None = Field(None, ge=0)
    fraction: float | None = Field(None, gt=0, le=1)
    slowdown: float = Field(gt=0, description="compute time multiplier, e.g. 1.3 = 30% slower")


class DegradedLink(Closed):
    """A link at a fraction of its bandwidth (0 would be a failure; use a tiny factor)."""

    a: str
    b: str
    factor: float = Field(gt=0, le=1)


class Simulation(Closed):
    """How the engine plays the step out."""

    fidelity: Literal["folded", "full"] = "folded"
    dp_bucket_size: Bytes = Field(25e6, description="DDP gradient bucket (reference article rule 14: ~25 MB)")
    overlap_dp: bool = Field(True, description="launch DP/ZeRO gradient collectives during the backward")
    # Measured on the folded engine: ~250 bytes and ~5 us of CPU per event (a 721,319-event run took
    # 3.0 s and 178 MB), so the default bounds a run at about 250 MB and 5 s; full fidelity costs more
    # per event (link sharing among the flows in flight). Raise it knowingly.
    max_events: PositiveInt = Field(1_000_000, description="refuse scenarios that need more simulated events, and "
                                                            "stop a run that schedules more")
    # Measured: the network graph of 100,000 GPUs (DGX H100 template) takes 3.7 s and 0.5 GB to build.
    max_gpus: PositiveInt = Field(200_000, description="refuse clusters with more GPUs (graph and plan are O(GPUs))")
    seed: int = 0
    jitter: Number = Field(0.0, description="coefficient of variation of kernel times (lognormal), 0 = none")
    stragglers: list[Straggler] = Field(default_factory=list)
    degraded_links: list[DegradedLink] = Field(default_factory=list)


class ScenarioCost(Closed):
    """What the scenario's GPUs cost, when it is not the hardware file's list price (a reserved or market rate)."""

    price_per_gpu_hour: float | None = Field(None, gt=0, description="USD per GPU-hour; replaces the hardware "
                                                                     "file's cost.price_per_gpu_hour")


class ScenarioFile(Closed):
    """The top-level keys of a scenario YAML (the public interface)."""

    name: str | None = None
    description: str = ""
    hardware: str
    nodes: PositiveInt | None = None
    gpus_per_node: PositiveInt | None = None
    model: Any
    training: Training
    parallel: Parallel = Parallel()
    simulation: Simulation = Simulation()
    cost: ScenarioCost = ScenarioCost()
