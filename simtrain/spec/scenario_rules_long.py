"""The rules of long sequences and tight memory: context parallelism against the sequence, the heads and the
attention kernel; recompute granularity against the model and its stages; offloading against the hardware.
Each rule names the key it blames (``fail`` is the caller's, which locates the key in the file).
"""

from __future__ import annotations

#: Megatron-Core's --recompute-modules that belong to a part of the model (transformer_config.py, the
#: recompute_modules docstring): the module, the condition on the model, and what the model must have
_MODULE_NEEDS = {
    "moe_act": (lambda m: m.moe is not None, "mixture-of-experts layers (model.moe)"),
    "moe": (lambda m: m.moe is not None, "mixture-of-experts layers (model.moe)"),
    "shared_experts": (lambda m: m.moe is not None and m.moe.shared_experts > 0, "shared experts (model.moe)"),
    "mla_up_proj": (lambda m: m.attention.kind == "mla", "multi-head latent attention (model.attention.kind: mla)"),
    "mlp": (lambda m: m.dense_layer_count > 0, "dense MLP layers"),
}


def model_has_module(model, module: str) -> bool:
    """Whether ``model`` has the part a recompute module re-runs (core_attn and layernorm: every model)."""
    need = _MODULE_NEEDS.get(module)
    return need is None or need[0](model)


def check_long_sequence_rules(s, raw: dict, fail) -> None:   # s: a simtrain.spec.scenario.Scenario
    """Context parallelism, recompute granularity and offloading (issue 21)."""
    _check_cp(s, fail)
    _check_recompute(s, raw, fail)
    _check_offload(s, fail)


def _check_cp(s, fail) -> None:
    par, tr, m = s.parallel, s.training, s.model
    cp = par.cp
    if cp == 1:
        return
    if m.attention.sliding_window is not None:
        fail("parallel.cp", f"{cp} with sliding-window attention is not simulated yet (the context-parallel attention "
             "is costed over the full causal sequence); use cp: 1")
    seq = tr.seq_len
    if par.cp_comm in ("p2p", "allgather") and seq % (2 * cp):
        fail("training.seq_len", f"{seq} is not divisible by 2 x cp = {2 * cp}: cp_comm {par.cp_comm} splits each "
             f"sequence into 2 x cp chunks and gives CP rank i chunks i and 2cp-1-i, which balances causal work "
             "(Megatron-Core / Transformer Engine load balancing)")
    if par.cp_comm == "a2a":
        if seq % cp:
            fail("training.seq_len", f"{seq} is not divisible by cp={cp}: context parallelism splits each sequence "
                 "over the CP ranks")
        for name, count in (("heads", m.heads), ("kv_heads", m.num_kv_heads)):
            if (count // par.tp) % cp:
                fail("parallel.cp", f"{cp} does not divide the {count // par.tp} {name} of a TP rank ({name}="
                     f"{count} / tp={par.tp}): cp_comm a2a (Ulysses) splits the heads over the CP ranks "
                     "(Transformer Engine AttnFuncWithCPAndQKVOA2A; use cp_comm p2p or allgather)")
    if par.sequence_parallel and par.tp > 1 and (seq // cp) % par.tp:
        fail("training.seq_len", f"{seq} / cp={cp} = {seq // cp} tokens per CP rank is not divisible by tp={par.tp}: "
             "sequence parallelism splits each CP rank's tokens over the TP ranks")
    if tr.attention_kernel == "none":
        fail("parallel.cp", f"{cp}: context parallelism runs inside Transformer Engine's fused attention "
             "(FlashAttention or cuDNN kernels); set training.flash_attention (allowed with cp > 1: true, "
             "flash2, flash3, cudnn)")
    if par.cp_comm == "p2p" and m.attention.sliding_window is not None:
        fail("parallel.cp_comm", "'p2p' does not run sliding-window attention (Transformer Engine: sliding windows "
             "need cp_comm a2a or allgather) (allowed here: a2a, allgather)")


def _check_recompute(s, raw: dict, fail) -> None:
    tr, m = s.training, s.model
    if tr.recompute_layers is not None:
        if tr.recompute != "full":
            fail("training.recompute_layers", f"{tr.recompute_layers} applies to recompute: full (Megatron's block "
                 f"method recomputes whole layers), but recompute is '{tr.recompute}'")
        if s.parallel.layers_per_stage == "auto":
            fail("training.recompute_layers", f"{tr.recompute_layers} with layers_per_stage: auto is not simulated "
                 "yet (the balanced split does not know which layers recompute); give the split explicitly")
        fewest = min((n for n in s.layers_per_stage if n), default=0)
        if tr.recompute_layers > fewest:
            fail("training.recompute_layers", f"{tr.recompute_layers} is more than the {fewest} layers of a "
                 f"(virtual) stage (allowed: 1 to {fewest})")
        if _varied(m):
            fail("training.recompute_layers", f"{tr.recompute_layers}: recomputing some layers only is not simulated "
                 "yet for models whose layers differ (experts, latent attention, sliding windows); leave it out "
                 "to recompute every layer")
    if tr.recompute_modules is not None:
        if tr.recompute != "selective":
            fail("training.recompute_modules", f"{tr.recompute_modules} applies to recompute: selective "
                 f"(Megatron's --recompute-modules), but recompute is '{tr.recompute}'")
        if not tr.recompute_modules:
            fail("training.recompute_modules", "is empty: name at least one module, or set recompute: none")
        for i, module in enumerate(tr.recompute_modules):
            need = _MODULE_NEEDS.get(module)
            if need is not None and not need[0](m):
                fail(f"training.recompute_modules.{i}", f"'{module}' is not a module of {m.name}: it needs "
                     f"{need[1]} (allowed here: {', '.join(_modules_of(m))})")
        if len(set(tr.recompute_modules)) != len(tr.recompute_modules):
            fail("training.recompute_modules", f"{tr.recompute_modules} names a module twice")
        if "layernorm" in tr.recompute_modules and tr.precision == "fp8":
            fail("training.recompute_modules", "'layernorm' is not simulated yet with fp8 training (its linears "
                 "keep FP8 copies of their inputs) (allowed here: "
                 f"{', '.join(x for x in _modules_of(m) if x != 'layernorm')})")
        if "moe" in tr.recompute_modules and s.parallel.ep_overlap:
            fail("training.recompute_modules", "'moe' with parallel.ep_overlap is refused by Megatron-Core (disable "
                 "moe in recompute_modules when enabling overlap_moe_expert_parallel_comm); use moe_act or "
                 "shared_experts")


def _varied(m) -> bool:
    return m.moe is not None or m.attention.kind == "mla" or m.attention.sliding_window is not None


def _modules_of(m) -> list[str]:
    allowed = ["core_attn", "layernorm"]
    for name, (has, _what) in _MODULE_NEEDS.items():
        if has(m):
            allowed.append(name)
    order = ["core_attn", "mlp", "moe_act", "moe", "layernorm", "mla_up_proj", "shared_experts"]
    return [x for x in order if x in allowed]


def _check_offload(s, fail) -> None:
    tr, par = s.training, s.parallel
    n = tr.activation_offload_layers
    if n:
        key = "training.activation_offload_layers"
        inter = s.hardware.inter_node
        if inter is None or inter.pcie_bandwidth is None:
            fail(key, f"{n} needs the GPUs' host link, but hardware '{s.hardware.name}' gives none "
                 "(inter_node.pcie_bandwidth: the GPU's PCIe link per direction); add it with its source, or use 0")
        # Megatron-Core TransformerConfig.__post_init__ (NVIDIA/Megatron-LM at d98e8a6): cpu_offloading_num_layers
        # below num_layers, no pipeline parallelism, no activation recomputation
        if n >= s.model.layers:
            fail(key, f"{n} is not fewer than the model's {s.model.layers} layers (Megatron-Core offloads at most "
                 f"num_layers - 1; allowed: 0 to {s.model.layers - 1})")
        if par.pp > 1:
            fail(key, f"{n} with pp={par.pp}: Megatron-Core has \"no support for Pipeline parallelism with CPU "
                 "offloading\" (allowed with pp 1)")
        if tr.recompute != "none":
            fail(key, f"{n} with recompute '{tr.recompute}': Megatron-Core's CPU offloading \"does not work when "
                 "activation recomputation is enabled\" (allowed with recompute: none)")
        if par.zero >= 3 or par.ep_overlap:
            what = f"zero {par.zero}" if par.zero >= 3 else "parallel.ep_overlap"
            fail(key, f"{n} with {what} is not simulated yet (allowed with zero 0-2, without ep_overlap)")
    if par.offload_optimizer:
        _check_offload_optimizer(s, fail)


def _check_offload_optimizer(s, fail) -> None:
    """Megatron-Core's --optimizer-cpu-offload as simtrain plays it (plan.offload_optimizer): Adam over the
    distributed optimizer's shard, on hardware whose file gives the host link and the host's DRAM bandwidth."""
    par, tr, hw = s.parallel, s.training, s.hardware
    key = "parallel.offload_optimizer"
    inter = hw.inter_node
    if inter is None or inter.pcie_bandwidth is None:
        fail(key, f"true needs the GPUs' host link, but hardware '{hw.name}' gives none (inter_node.pcie_bandwidth: "
             "the GPU's PCIe link per direction); add it with its source, or use false")
    if hw.host_memory_bandwidth is None:
        fail(key, f"true needs the host's memory bandwidth, but hardware '{hw.name}' gives none "
             "(host_memory_bandwidth: the node's peak DRAM bandwidth, which the CPU Adam step streams at); add it "
             "with its source, or use false")
    if tr.optimizer != "adam":
        fail(key, f"true with optimizer '{tr.optimizer}' is not simulated (the host step is Megatron-Core's CPU "
             "AdamW; allowed with optimizer: adam)")
    if par.zero == 0 or par.zero >= 3:
        fail(key, f"true with zero {par.zero} is not simulated: the host step is modelled over the distributed "
             "optimizer's shard (allowed with zero 1 or 2)")
