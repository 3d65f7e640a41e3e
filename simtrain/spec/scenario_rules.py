"""The rules that tie a scenario's keys together (divisibility, schedule and vpp, memory-free checks) and the
warnings about settings that hold but may surprise; each rule names the key it blames, at its line.
"""

from __future__ import annotations

from simtrain.spec.errors import (
    InputError,
    SimulationLimitError,
    display_path,
    suggest,
)
from simtrain.spec.scenario_rules_kernels import (
    check_attention_kernel_rules,
    check_layer_kernel_rules,
    unfused_softmax_warning,
)
from simtrain.spec.scenario_rules_long import check_long_sequence_rules
from simtrain.spec.scenario_rules_moe import check_ep_overlap_rules, check_hybridep_scope
from simtrain.spec.yamlio import OVERRIDE_LINE, line_of, locate


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _divisors(n: int) -> str:
    """'1, 2, 4, 5, 8, 10, ...': the small divisors of n, which are the tensor-parallel sizes that fit."""
    divs = [d for d in range(1, min(n, 4096) + 1) if n % d == 0]
    shown = ", ".join(str(d) for d in divs[:6])
    return shown + (", ..." if len(divs) > 6 or (n > 4096 and n % 4096) else "")


# s: the simtrain.spec.scenario.Scenario being built (it imports this module)
def layer_event_estimate(layers: int, microbatches: int, dp: int, zero: int, replicas: int, overlap_dp: bool) -> int:
    """A lower bound of the simulated events that grow with the layer count: with DP gradients launched during the
    backward, every layer's backward is its own event pair on each lane (measured: 8,321 events for 4,000 layers on
    pp=2, dp=2; 16,526 in full fidelity); ZeRO-3 gathers each layer's weights in every micro-batch's forward and
    backward and reduce-scatters its gradients, at least 3 events each on every lane (its process's start and end
    and its done event: engine.event_counts.LaneEvents.collective without the re-timings, which
    backward_prefetch none skips; the review found 12 each refusing a run of 92,080 events at 99,328). Layers x
    micro-batches x lanes, counted before any per-layer structure is built."""
    if dp <= 1:
        return 0
    per_layer = 2 if overlap_dp else 0
    if zero >= 3:
        per_layer += 3 * 3 * microbatches
    return per_layer * layers * replicas


def check_rules(s, raw: dict) -> list[str]:
    """Rules that tie the sections together; returns warnings, raises on errors."""
    par, tr, m = s.parallel, s.training, s.model

    def fail(field_: str, message: str, error: type[InputError] = InputError) -> None:
        line, note = locate(raw, field_)
        raise error(message + note, file=s.file, line=line, field=field_)

    gpus = s.cluster.gpus if s.hardware.explicit else s.nodes * s.gpus_per_node
    cluster = (f"the {gpus:,} devices of {display_path(s.hardware_file)}" if s.hardware.explicit else
               f"the {gpus:,} GPUs of the cluster ({_count(s.nodes, 'node')} x {_count(s.gpus_per_node, 'GPU')})")
    if s.gpus != gpus and par.cp > 1:
        fail("parallel", f"dp x tp x pp x cp = {par.dp} x {par.tp} x {par.pp} x {par.cp} = {s.gpus:,} "
             f"does not equal {cluster}")
    if s.gpus != gpus:
        fail("parallel", f"dp x tp x pp = {par.dp} x {par.tp} x {par.pp} = {par.dp * par.tp * par.pp} "
             f"does not equal {cluster}")
    if gpus > s.simulation.max_gpus:
        fail("nodes" if "nodes" in raw else "parallel", f"{gpus:,} GPUs is more than simulation.max_gpus="
             f"{s.simulation.max_gpus:,}: building the network graph and plan takes time and memory in "
             "proportion to the GPU count; raise simulation.max_gpus if you mean it", SimulationLimitError)
    _check_domain(s, raw, fail, gpus)
    check_long_sequence_rules(s, raw, fail)
    check_moe_rules(s, raw, fail)
    if m.heads % par.tp:
        fail("parallel.tp", f"{par.tp} does not divide heads={m.heads} (allowed: {_divisors(m.heads)})")
    if m.num_kv_heads % par.tp:
        fail("parallel.tp",
             f"{par.tp} does not divide kv_heads={m.num_kv_heads} (allowed: {_divisors(m.num_kv_heads)})")
    if m.ffn_hidden % par.tp:
        fail("parallel.tp", f"{par.tp} does not divide ffn_hidden={m.ffn_hidden} (allowed: {_divisors(m.ffn_hidden)})")
    vstages = par.pp * par.vpp
    # a rule between schedule and vpp blames the one an override set, when only one was
    by_override = {key for key in ("parallel.schedule", "parallel.vpp") if line_of(raw, key) == OVERRIDE_LINE}
    if par.schedule == "interleaved-1f1b" and par.vpp < 2:
        if by_override == {"parallel.schedule"}:
            fail("parallel.schedule", f"'{par.schedule}' needs vpp >= 2 model chunks per rank, but vpp={par.vpp}")
        fail("parallel.vpp", f"{par.vpp}: the interleaved-1f1b schedule needs vpp >= 2 model chunks per rank")
    if par.schedule in ("zb-v", "dualpipev") and par.vpp != 2:
        if by_override == {"parallel.schedule"}:
            fail("parallel.schedule", f"'{par.schedule}' places two chunks per rank in a V and needs vpp: 2, "
                 f"but vpp={par.vpp}")
        fail("parallel.vpp", f"{par.vpp}: the {par.schedule} schedule places two chunks per rank in a V "
             "(chunk 0 = stage r, chunk 1 = stage 2 pp - 1 - r) and needs vpp: 2")
    if par.vpp > 1 and par.schedule not in ("interleaved-1f1b", "zb-v", "dualpipev"):
        if by_override == {"parallel.vpp"}:
            fail("parallel.vpp", f"{par.vpp} model chunks per rank need schedule: interleaved-1f1b, but the schedule "
                 f"is '{par.schedule}', which runs one; set both, or vpp: 1")
        fail("parallel.schedule", f"'{par.schedule}' runs one chunk per rank but vpp={par.vpp}; "
             "use schedule: interleaved-1f1b or vpp: 1")
    varied_model = m.layers_differ
    if par.layers_per_stage == "auto" and (varied_model or par.cp > 1):
        fail("parallel.layers_per_stage", "auto is not simulated yet for models whose layers differ (experts, latent "
             "or sliding-window attention, MTP modules) or with context parallelism: the balance is costed on a "
             "uniform dense layer; give the split explicitly")
    if par.layers_per_stage == "auto":
        if par.pp > m.layers:
            fail("parallel.layers_per_stage", f"auto cannot give each of pp={par.pp} pipeline ranks a layer: the model "
                 f"has {m.layers} layers (use pp <= {m.layers})")
        if vstages > m.layers + 2:
            fail("parallel.layers_per_stage", f"auto cannot split {m.layers} layers over pp x vpp = {vstages} stages: "
                 "every stage but an embedding-only first and a loss-only last needs a layer")
        if par.schedule == "dualpipe":
            fail("parallel.layers_per_stage", "auto is not available with dualpipe, whose ranks hold two model stages "
                 "each (r and pp - 1 - r); give the split, one entry per stage")
    elif par.layers_per_stage is not None:
        lps = par.layers_per_stage
        if len(lps) != vstages:
            fail("parallel.layers_per_stage", f"has {len(lps)} entries but pp x vpp = {vstages} stages need one each")
        if any(n < 0 for n in lps):
            fail("parallel.layers_per_stage", f"{lps}: a stage cannot hold a negative number of layers")
        empty = [i for i, n in enumerate(lps) if n == 0 and i not in (0, len(lps) - 1)]
        if empty or len(lps) == 1 and lps[0] == 0:
            fail("parallel.layers_per_stage", f"{lps}: stage {empty[0] if empty else 0} holds no layer; only the first "
                 "stage (then the embedding alone) or the last (the output layer and loss alone) may be empty")
        if sum(lps) != m.layers:
            fail("parallel.layers_per_stage", f"{lps} sums to {sum(lps)} but the model has {m.layers} layers")
    elif m.layers % vstages:
        fail("parallel.pp", f"layers={m.layers} is not divisible by pp x vpp = {vstages} "
             "(give parallel.layers_per_stage for an uneven split)")
    check_attention_kernel_rules(s, m, tr, fail)
    if tr.optimizer_kernel == "megatron" and (tr.optimizer != "adam" or tr.precision == "fp32"):
        what = f"optimizer '{tr.optimizer}'" if tr.optimizer != "adam" else "precision 'fp32'"
        fail("training.optimizer_kernel", f"'megatron' is Megatron-LM's mixed-precision Adam (fp32 main copies of "
             f"16-bit weights), not {what} (allowed with it: optimizer adam and precision fp16, bf16 or fp8; "
             "otherwise fused or unfused)")
    if tr.optimizer_kernel == "megatron" and (par.zero >= 2 or par.zero_impl != "generic"):
        fail("training.optimizer_kernel", f"'megatron' is Megatron-LM's optimizer, which shards only its state "
             f"(the distributed optimizer, zero 1), not zero {par.zero} with zero_impl {par.zero_impl} (allowed with "
             "it: zero 0 or 1, zero_impl generic)")
    gpu = s.hardware.gpu
    if tr.precision == "fp8" and "fp8" not in gpu.peak_flops and "mxfp8" not in gpu.peak_flops:
        fail("training.precision", f"'fp8' needs an FP8 tensor-core peak, and {display_path(s.hardware_file)} lists "
             f"none for {gpu.name} (gpu.peak_flops has {', '.join(sorted(gpu.peak_flops))}; allowed here: "
             "bf16, fp16, fp32)")
    if tr.precision == "fp8" and tr.fp8_recipe == "mxfp8" and "mxfp8" not in gpu.peak_flops:
        fail("training.fp8_recipe", f"'mxfp8' needs hardware microscaling (Blackwell), and "
             f"{display_path(s.hardware_file)} lists no gpu.peak_flops.mxfp8 for {gpu.name} (allowed here: "
             "tensorwise, blockwise)")
    if tr.precision == "fp8" and tr.fp8_recipe != "mxfp8" and "fp8" not in gpu.peak_flops:
        fail("training.fp8_recipe", f"'{tr.fp8_recipe}' needs gpu.peak_flops.fp8, which "
             f"{display_path(s.hardware_file)} does not list for {gpu.name} (allowed here: mxfp8)")
    if tr.autocast_weights and (tr.precision not in ("bf16", "fp16") or par.zero >= 2 or par.zero_impl != "generic"
                                or tr.optimizer_kernel == "megatron" or tr.grad_dtype in ("bf16", "fp16")):
        what = (f"precision '{tr.precision}'" if tr.precision not in ("bf16", "fp16") else
                "optimizer_kernel 'megatron' (16-bit parameters)" if tr.optimizer_kernel == "megatron" else
                f"grad_dtype '{tr.grad_dtype}' (.grad takes the fp32 parameter's dtype)"
                if tr.grad_dtype in ("bf16", "fp16") else
                f"zero {par.zero} with zero_impl {par.zero_impl} (sharded parameters cast by their wrapper)")
        fail("training.autocast_weights", f"true casts fp32 parameters to the 16-bit precision under torch.autocast, "
             f"and this scenario runs {what} (allowed with it: precision bf16 or fp16, grad_dtype auto or fp32, "
             "zero 0 or 1, zero_impl generic, optimizer_kernel fused or unfused)")
    if tr.fp8_amax_reduction != "none" and (tr.precision != "fp8" or tr.fp8_recipe != "tensorwise"):
        what = f"precision '{tr.precision}'" if tr.precision != "fp8" else f"fp8_recipe '{tr.fp8_recipe}'"
        fail("training.fp8_amax_reduction", f"'{tr.fp8_amax_reduction}' reduces tensorwise FP8 scales, and this "
             f"scenario runs {what} (allowed with it: none; per_chunk and per_linear need precision fp8 with "
             "fp8_recipe tensorwise)")
    if tr.micro_batch > tr.global_batch:
        fail("training.micro_batch", f"{tr.micro_batch} is larger than global_batch={tr.global_batch}")
    if tr.global_batch % (tr.micro_batch * par.dp):
        fail("training.global_batch", f"{tr.global_batch} is not divisible by micro_batch x dp = "
             f"{tr.micro_batch} x {par.dp} = {tr.micro_batch * par.dp}")
    mb = s.microbatches
    # every micro-batch runs forward and backward on every (virtual) stage, in full fidelity once per replica
    replicas = par.dp if s.simulation.fidelity == "full" else 1
    schedule_ops = 2 * mb * vstages * replicas
    if schedule_ops > s.simulation.max_events:
        copies = f" x {replicas:,} replicas (fidelity: full)" if replicas > 1 else ""
        fail("training.global_batch", f"{mb:,} micro-batches x {vstages} stages{copies} need at least "
             f"{schedule_ops:,} simulated forward/backward operations, more than simulation.max_events="
             f"{s.simulation.max_events:,}; use a larger micro_batch" + (", fidelity: folded" if copies else "")
             + " or raise simulation.max_events", SimulationLimitError)
    if par.schedule == "dualpipe" and par.pp % 2:
        fail("parallel.pp", f"{par.pp}: the dualpipe schedule feeds micro-batches from both ends of the pipeline and "
             "needs an even pp (deepseek-ai/DualPipe; use dualpipev for any pp)")
    if par.schedule in ("dualpipe", "dualpipev") and (mb < 2 * par.pp or (par.schedule == "dualpipe" and mb % 2)):
        even = ", an even number" if par.schedule == "dualpipe" else ""
        fail("training.global_batch", f"{tr.global_batch} gives {mb} micro-batches per pipeline, but "
             f"{par.schedule} needs at least 2 x pp = {2 * par.pp}{even} (deepseek-ai/DualPipe asserts "
             "num_chunks >= 2 x num_ranks)")
    if par.schedule in ("zb-h1", "zb-v", "dualpipe", "dualpipev") and par.zero >= 2 and par.dp > 1:
        fail("parallel.zero", f"{par.zero}: {par.schedule} splits each backward into B and W; simtrain runs it with "
             "zero 0 or 1 (the optimizer state sharded, as Megatron's distributed optimizer), not with gradients "
             "or weights sharded")
    layer_events = layer_event_estimate(s.model.layers, mb, par.dp, par.zero, replicas, s.simulation.overlap_dp)
    if layer_events > s.simulation.max_events:
        copies = f" x {replicas:,} replicas (fidelity: full)" if replicas > 1 else ""
        per = f" x {mb:,} micro-batches (ZeRO-3 gathers)" if par.zero >= 3 else ""
        fail("model", f"{s.model.layers:,} layers{per}{copies} need at least {layer_events:,} "
             f"simulated events, more than simulation.max_events={s.simulation.max_events:,}; use fewer layers"
             + (", fidelity: folded" if copies else "") + " or raise simulation.max_events", SimulationLimitError)
    if par.schedule == "interleaved-1f1b" and mb % par.pp:
        fail("parallel.schedule",
             f"interleaved-1f1b needs the micro-batch count ({mb}) to be a multiple of pp={par.pp}")
    if par.sequence_parallel and par.tp > 1 and tr.seq_len % par.tp:
        fail("training.seq_len", f"{tr.seq_len} is not divisible by tp={par.tp}: sequence parallelism splits each "
             f"sequence over the TP ranks (Korthikanti et al. 2022, §4.2.2)")
    seen: dict[int, int] = {}
    for i, st in enumerate(s.simulation.stragglers):
        if (st.rank is None) == (st.fraction is None):
            fail(f"simulation.stragglers.{i}", "give exactly one of 'rank' or 'fraction'")
        if st.rank is not None and st.rank >= gpus:
            fail(f"simulation.stragglers.{i}.rank",
                 f"{st.rank} is not a rank of this {gpus}-GPU layout (0..{gpus - 1})")
        if st.rank is not None and st.rank in seen:
            fail(f"simulation.stragglers.{i}.rank", f"rank {st.rank} is already a straggler (entry {seen[st.rank]}): "
                 "give one entry per rank, with its whole slowdown")
        if st.rank is not None:
            seen[st.rank] = i
        if st.slowdown < 1:
            fail(f"simulation.stragglers.{i}.slowdown", f"{st.slowdown:g} would make the device faster: a straggler's "
                 "compute time is multiplied by slowdown >= 1 (1.3 = 30% slower)")
    for i, link in enumerate(s.simulation.degraded_links):
        if s.cluster.has_link(link.a, link.b):     # read from the names on templates: no graph to build
            continue
        for end in ("a", "b"):
            name = getattr(link, end)
            if name not in s.cluster.graph:
                fail(f"simulation.degraded_links.{i}.{end}", f"'{name}' is not a node of the cluster graph "
                     f"(GPUs are gpu0..gpu{gpus - 1}; docs/model.md section 4.1 describes the cluster graph)"
                     f"{suggest(name, list(s.cluster.graph)[:2000])}")
        if not s.cluster.graph.has_edge(link.a, link.b):
            fail(f"simulation.degraded_links.{i}", f"there is no link {link.a} -> {link.b} in the cluster graph")

    warnings = []
    if mb < par.pp:
        warnings.append(f"{mb} micro-batches for {par.pp} pipeline stages: the pipeline never fills "
                        "(reference article rule 13: at least pp, better 2 x pp)")
    if tr.precision == "fp8" and s.hardware.compute.fp8_gemm_curve is None:
        warnings.append(f"{display_path(s.hardware_file)} has no compute.fp8_gemm_curve: FP8 GEMMs are timed at the "
                        "BF16 curve's fraction of the FP8 peak (on H100 the measured FP8 fraction is lower)")
    if tr.precision != "fp8" and isinstance(raw.get("training"), dict) and "fp8_recipe" in raw["training"]:
        warnings.append(f"training.fp8_recipe has no effect with precision {tr.precision} (it applies to fp8)")
    if par.tp_comm_overlap and (par.tp == 1 or not par.sequence_parallel):
        warnings.append("parallel.tp_comm_overlap has no effect without tp > 1 and sequence_parallel: true "
                        "(Transformer Engine's userbuffers overlap the all-gathers and reduce-scatters of "
                        "sequence parallelism)")
    for key in ("tp_comm_overlap", "tp_async_linears"):
        if getattr(par, key) and m.attention.kind == "mla" and par.tp > 1 and par.sequence_parallel:
            fail(f"parallel.{key}", "true with multi-head latent attention is not simulated yet (the overlap is "
                 "costed under the four GEMMs of a multi-head attention layer); use false")
    if par.tp_async_linears and par.tp_comm_overlap:
        fail("parallel.tp_async_linears", "true together with parallel.tp_comm_overlap: true: they are two stacks' "
             "ways to overlap the same collectives (nanotron's asynchronous linears, Transformer Engine's "
             "userbuffers); set one of them to false")
    if par.tp_async_linears and (par.tp == 1 or not par.sequence_parallel):
        warnings.append("parallel.tp_async_linears has no effect without tp > 1 and sequence_parallel: true "
                        "(nanotron's REDUCE_SCATTER mode; without it the backward all-reduce's overlap is "
                        "parallel.tp_async_allreduce)")
    if tr.fp8_amax_reduction != "per_chunk" and isinstance(raw.get("training"), dict) \
            and "fp8_amax_group" in raw["training"]:
        warnings.append(f"training.fp8_amax_group has no effect with fp8_amax_reduction {tr.fp8_amax_reduction} (it "
                        "sets the ranks of per_chunk's all-reduces)")
    raw_par = raw.get("parallel") if isinstance(raw.get("parallel"), dict) else {}
    if raw_par.get("tp_async_allreduce") is not None and (par.tp == 1 or par.sequence_parallel):
        warnings.append("parallel.tp_async_allreduce has no effect with tp 1 or sequence_parallel: true (it overlaps "
                        "the input-gradient all-reduces of tensor parallelism without sequence parallelism)")
    # a file whose scale-up domain spans nodes pins TP inside the domain (_check_domain)
    spans_nodes = not s.hardware.explicit and s.hardware.intra_node.domain_gpus is not None
    if par.tp > 1 and not spans_nodes and not s.hardware.explicit and \
            (par.tp > s.gpus_per_node or s.gpus_per_node % par.tp):
        warnings.append(f"TP group of {par.tp} spans nodes ({s.gpus_per_node} GPUs per node): "
                        "every layer's all-reduce crosses the network (reference article rule 9)")
    if par.sequence_parallel and par.tp == 1:
        warnings.append("parallel.sequence_parallel has no effect with tp 1 (it splits the TP group's "
                        "layer norms and dropouts over the sequence)")
    if tr.grad_accumulation != "fused" and par.zero >= 2:
        fail("training.grad_accumulation", f"'{tr.grad_accumulation}' is not simulated with zero {par.zero}: ZeRO-2/3 "
             "reduce-scatter each micro-batch's gradients and accumulate only their shard (allowed with zero 2 or 3: "
             "fused; or use zero 0 or 1)")
    if tr.grad_accumulation == "autograd" and tr.grad_dtype not in ("auto", tr.precision):
        warnings.append(f"training.grad_accumulation: autograd accumulates in the weights' dtype (.grad), so "
                        f"training.grad_dtype: {tr.grad_dtype} does not change its bytes")
    if par.zero_impl == "fsdp2" and par.zero == 2:
        fail("parallel.zero_impl", "'fsdp2' with zero 2 is not simulated: FSDP2 without resharding after the forward "
             "by default still reshards after each backward and gathers again before every micro-batch's forward "
             "(PyTorch FSDPParamGroup.post_backward), which ZeRO-2 here does not play (allowed with zero 2: generic, "
             "fsdp1; or use zero 3)")
    if tr.layer_kernels != "fused":
        check_layer_kernel_rules(m, tr, par, fail)
    if par.zero_impl != "generic" and (par.zero < 2 or s.dp_cp == 1):
        warnings.append(f"parallel.zero_impl: {par.zero_impl} has no effect with zero {par.zero} over dp x cp = "
                        f"{s.dp_cp} rank(s) (it describes how ZeRO-2/3 copy around their gathers and reduce-scatters)")
    if tr.recompute == "selective" and tr.attention_kernel != "none":
        warnings.append(f"training.recompute: selective recomputes the attention scores, softmax and dropout "
                        f"(Korthikanti et al. 2022, Sec. 4.2), which {tr.attention_kernel} attention never stores: it "
                        "saves no memory here and costs the attention forward again; use none, selective_op or full")
    softmax_note = unfused_softmax_warning(m, tr, par, isinstance(raw.get("training"), dict)
                                           and "unfused_softmax" in raw["training"])
    if softmax_note:
        warnings.append(softmax_note)
    warnings += setup_warnings(s)
    if par.offload_optimizer:
        warnings.append(HOST_ADAM_NOTE)
    if par.backward_prefetch != "pre" and (par.zero < 3 or par.dp == 1):
        warnings.append(f"parallel.backward_prefetch: {par.backward_prefetch} has no effect with zero {par.zero} and "
                        f"dp {par.dp} (it describes ZeRO-3's weight gathers)")
    return warnings


#: what a run with the optimizer on the host should know about its CPU step's time (plan.offload_optimizer)
HOST_ADAM_NOTE = ("parallel.offload_optimizer: the CPU Adam step is timed at the fraction of peak DRAM bandwidth a "
                  "measured CPU-Adam reached on another host (the hardware file's host_adam_efficiency: ZeRO-Offload, "
                  "10 B parameters in 2.57 s on a DGX-2's two Xeon 8168, 0.43 of peak), or at peak where the file "
                  "gives none (a lower bound); fewer CPU threads per rank make it longer (docs/model.md)")


def check_moe_rules(s, raw: dict, fail) -> None:
    """Expert parallelism against the model and the layout (Megatron-Core's folding: etp x ep x edp = tp x dp within
    a pipeline stage, parallel_state.initialize_model_parallel), and what MoE runs simtrain cannot simulate yet."""
    par, tr, m = s.parallel, s.training, s.model
    if m.moe is None:
        if par.ep_overlap:
            fail("parallel.ep_overlap", "true needs a mixture-of-experts model: it hides the experts' all-to-alls, "
                 "and this model has no experts (model.moe is not set); use false")
        if par.ep > 1:
            fail("parallel.ep", f"{par.ep}: the model has no experts to split (model.moe is not set); use ep: 1")
        if par.etp is not None and par.etp != par.tp:
            fail("parallel.etp", f"{par.etp}: the model has no experts to split (model.moe is not set); leave it out")
        return
    for key in ("tp_comm_overlap", "tp_async_linears"):
        if getattr(par, key):
            fail(f"parallel.{key}", "true with a mixture of experts is not simulated yet (the overlap is costed "
                 "under a dense layer's GEMMs); use false")
    if par.tp > 1 and not par.sequence_parallel:
        fail("parallel.sequence_parallel", f"false with tp {par.tp} and a mixture of experts: Megatron-Core refuses "
             "to train a MoE layer with tensor parallelism but no sequence parallelism (megatron/core/transformer/"
             "moe/moe_layer.py @d98e8a6, MoELayer.forward); use sequence_parallel: true or tp 1")
    experts = m.moe.experts
    if experts % par.ep:
        fail("parallel.ep", f"{par.ep} does not divide experts={experts} (allowed: {_divisors(experts)})")
    etp = par.etp or par.tp
    if (par.tp * s.dp_cp) % (etp * par.ep):
        key = "parallel.etp" if par.etp is not None else "parallel.ep"
        fold = f"tp x dp = {par.tp} x {par.dp}" if par.cp == 1 else f"tp x cp x dp = {par.tp} x {par.cp} x {par.dp}"
        fail(key, f"etp x ep = {etp} x {par.ep} = {etp * par.ep} does not divide {fold} = "
             f"{par.tp * s.dp_cp}: the expert groups fold onto the GPUs of a pipeline stage (Megatron-Core: "
             "etp x ep x edp = tp x cp x dp)")
    if m.moe.expert_ffn_hidden % etp:
        fail("parallel.etp" if par.etp is not None else "parallel.tp",
             f"{etp} does not divide moe.expert_ffn_hidden={m.moe.expert_ffn_hidden} "
             f"(allowed: {_divisors(m.moe.expert_ffn_hidden)})")
    if par.moe_dispatcher in ("deepep", "hybridep"):
        fabric = s.hardware.intra_node.fabric if s.hardware.intra_node is not None else "explicit"
        if fabric != "nvswitch":
            fail("parallel.moe_dispatcher", f"'{par.moe_dispatcher}' cannot run on {s.hardware.gpu.name} "
                 f"({display_path(s.hardware_file)}: intra_node.fabric {fabric}): DeepEP's kernels move tokens over "
                 "NVLink inside a node (deepseek-ai/DeepEP README) (allowed here: alltoall, allgather)")
        if m.moe.capacity_factor is not None and par.moe_dispatcher == "deepep":
            fail("parallel.moe_dispatcher", f"'deepep' with moe.capacity_factor {m.moe.capacity_factor} is refused by "
                 "Megatron-Core (the deepep backend does not support moe_pad_expert_input_to_capacity); use "
                 "capacity_factor null (dropless) or the alltoall dispatcher")
        if m.moe.capacity_factor is not None:
            fail("parallel.moe_dispatcher", f"'hybridep' with moe.capacity_factor {m.moe.capacity_factor} is not "
                 "simulated (HybridEP's published figures are dropless); use capacity_factor null (dropless) or the "
                 "alltoall dispatcher")
        if etp > 1:
            fail("parallel.moe_dispatcher", f"'{par.moe_dispatcher}' with expert tensor parallelism (etp {etp}) is not "
                 "simulated (simtrain times the kernels over an EP group of whole experts); use etp 1 or the alltoall "
                 "dispatcher")
        if par.moe_dispatcher == "hybridep" and par.ep > 1:
            check_hybridep_scope(s, fail)
    if par.ep_overlap:
        check_ep_overlap_rules(s, fail)
    if par.zero >= 3:
        fail("parallel.zero", f"{par.zero}: ZeRO-3 of a mixture-of-experts model is not simulated yet (allowed: 0, 1, "
             "2; expert state is sharded over the expert data-parallel group)")
    if tr.recompute == "selective_op":
        fail("training.recompute", "'selective_op' (torchtitan's op-level policy) is not simulated for "
             "mixture-of-experts layers (allowed: none, selective, full)")
    if tr.grad_accumulation != "fused":
        fail("training.grad_accumulation", f"'{tr.grad_accumulation}' is not simulated for mixture-of-experts models "
             "(allowed: fused)")
    if par.zero_impl != "generic":
        fail("parallel.zero_impl", f"'{par.zero_impl}' (PyTorch FSDP) is not simulated for mixture-of-experts models "
             "(allowed: generic)")


def setup_warnings(s) -> list[str]:   # s: a simtrain.spec.scenario.Scenario
    """The warnings that do not depend on the parallel layout: the model against the sequence, the hardware
    file's missing sections (`simtrain search` prints these once for all its layouts)."""
    out: list[str] = []
    m, seq = s.model, s.training.seq_len
    if m.position_embeddings and seq > m.position_embeddings:
        out.append(f"training.seq_len {seq} is longer than the model's learned position table "
                   f"({m.position_embeddings} rows): the model as described cannot take it")
    elif m.max_positions and seq > m.max_positions:
        out.append(f"training.seq_len {seq} is longer than the model was built for (max_position_embeddings "
                   f"{m.max_positions}); simtrain costs it as given")
    if m.attention_window and seq > m.attention_window:
        out.append(f"the model attends within a sliding window of {m.attention_window} tokens; simtrain costs "
                   f"full causal attention over {seq}, so attention time and memory are overestimated")
    out += [f"model {m.name}: {note}" for note in m.unmodelled]
    effects = {"compute": "kernels run at the datasheet peaks, so step time is optimistic",
               "memory_overheads": "memory has no framework overhead or fragmentation, so peak memory is optimistic"}
    missing = [key for key in effects if key not in s.hardware.model_fields_set]
    if missing:
        out.append(f"hardware {s.hardware.name} has no {' or '.join(missing)} section: "
                   f"{'; '.join(effects[key] for key in missing)} (the bundled hardware/*.yaml give measured values)")
    return out



def _check_domain(s, raw: dict, fail, gpus: int) -> None:
    """A hardware file whose scale-up domain spans several nodes (``intra_node.domain_gpus``: an NVL72 rack of
    trays) describes racks: a cluster larger than one domain fills whole domains, and TP groups stay on NVLink
    inside one (the placement puts TP innermost, so a TP size that divides the domain never leaves it)."""
    if s.hardware.explicit:
        return
    where = display_path(s.hardware_file)
    domain = s.hardware.intra_node.domain_gpus
    if s.nodes > 1 and s.hardware.inter_node is None and (domain is None or gpus > domain):
        said = "nodes" in raw
        fail("nodes" if said else "hardware", f"{s.nodes if said else f'{s.nodes} nodes (its default)'} need a "
             f"network between the nodes, but {where} has no inter_node section (allowed: 1 node, or add inter_node "
             "to the hardware file with its source)")
    if domain is None:
        return
    if domain % s.gpus_per_node:
        fail("gpus_per_node", f"{s.gpus_per_node} GPUs per node do not tile the {domain}-GPU NVLink domain of "
             f"{where} (allowed: a divisor of {domain}, e.g. {s.hardware.gpus_per_node})")
    trays = domain // s.gpus_per_node
    if gpus > domain and s.nodes % trays:
        racks = s.nodes / trays
        fail("nodes", f"{s.nodes} nodes of {s.gpus_per_node} GPUs fill {racks:.2f} NVLink domains of {domain} GPUs "
             f"({where}): a cluster larger than one domain is whole domains (allowed: a multiple of {trays} "
             f"nodes, or at most {trays})")
    tp = s.parallel.tp
    if tp > 1 and (tp > min(domain, gpus) or min(domain, gpus) % tp):
        span = min(domain, gpus)
        fail("parallel.tp", f"{tp} does not fit the NVLink domain: {where} pins TP groups inside its "
             f"{span}-GPU scale-up domain{' (this cluster)' if gpus < domain else ''} (allowed: "
             f"{_divisors(span)})")
