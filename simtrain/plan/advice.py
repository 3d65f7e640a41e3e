"""What would relieve memory when a run does not fit: ``simtrain memory``'s "try:" lines, in the reference article's
order (rules 17-19), each naming the key to set."""

from __future__ import annotations

from dataclasses import replace

from simtrain.plan.memory import MemoryReport, StageMemory, stage_memory
from simtrain.plan.offload_optimizer import HOST_STATE_BYTES, cpu_adam_bandwidth, host_step
from simtrain.spec.scenario import Scenario


def advice(scenario: Scenario, report: MemoryReport) -> list[str]:
    """What would relieve memory, in the reference article's order (rule 18, 17)."""
    tips = []
    tr, par = scenario.training, scenario.parallel
    dom = report.dominant()
    m = scenario.microbatches
    if par.pp > 1 and par.schedule == "gpipe" and m > par.pp:
        tips.append(f"switch to 1F1B (parallel.schedule: 1f1b): GPipe keeps the activations of all {m} micro-batches "
                    f"until the backward, 1F1B at most {par.pp} on the first stage (Narayanan et al. 2021, §2.2.1)")
    if dom == "activations" or tr.recompute == "none":
        tips += _offload_tip(scenario, report)
        tips += _partial_recompute_tip(scenario, report)
        if tr.recompute == "none":
            tips.append("turn on activation recompute (training.recompute: selective_op, selective or full)")
        elif tr.recompute != "full":
            tips.append("recompute whole layers (training.recompute: full): only each layer's input is kept")
        modules = _modules_tip(scenario, report)
        tips += modules
        if not modules and tr.recompute == "selective" and "mlp" not in (tr.recompute_modules or ()) \
                and scenario.model.dense_layer_count:
            tips.append("recompute the MLP too (training.recompute_modules: [core_attn, mlp]): its internals "
                        "are the largest share of a layer's activations")
        if tr.recompute == "full" and tr.recompute_layers is not None and not _partial_recompute_tip(scenario, report):
            tips.append(f"recompute more layers per stage (training.recompute_layers > {tr.recompute_layers})")
        if not tr.flash_attention:
            tips.append("use flash attention (training.flash_attention: true): no s x s score matrix")
        if tr.seq_len % 4 == 0 and tr.flash_attention:
            worst = max(report.stages, key=lambda st: st.total)
            cp = par.cp * 2
            tips.append(f"split each sequence over more GPUs (parallel.cp: {cp}): activations per GPU fall by "
                        f"{worst.activations * (1 - par.cp / cp) / 1e9:.1f} GB on the fullest stage (s / cp tokens "
                        "per GPU; GPUs = dp x tp x pp x cp)")
        if tr.micro_batch > 1:
            tips.append("use a smaller micro_batch")
    if tr.precision == "fp32":
        tips.append("train in bf16 mixed precision (training.precision: bf16)")
    if tr.precision == "fp8" and tr.fp8_recipe != "tensorwise" and dom == "params":
        tips.append("tensorwise FP8 (training.fp8_recipe: tensorwise) keeps fewer FP8 weight copies")
    tips += _offload_optimizer_tip(scenario, report)
    if tr.optimizer == "adam" and dom in ("optimizer", "params", "grads"):
        tips.append("a leaner optimizer (training.optimizer: adafactor) drops Adam's 8 bytes/parameter of moments")
    if par.zero < 3 and scenario.dp_cp > 1:
        tips.append(f"shard states over the {scenario.dp_cp} DP{' x CP' if par.cp > 1 else ''} ranks "
                    f"(parallel.zero: {par.zero + 1})")
    tips.append("split the model further: raise parallel.pp (layers) or parallel.tp (within a node)")
    return tips


def _partial_recompute_tip(scenario: Scenario, report: MemoryReport) -> list[str]:
    """Full recompute of the fewest layers per (virtual) stage that make every stage fit (Megatron's
    ``--recompute-method block --recompute-num-layers N``), found with the ledger itself: each recomputed layer costs
    one more layer forward per micro-batch, so the fewest is the cheapest full recompute that fits."""
    found = fewest_recompute_layers(scenario, report)
    if found is None:
        return []
    n, peak = found
    return [f"recompute {n} layer{'s' if n > 1 else ''} per stage in full (training.recompute: full, "
            f"training.recompute_layers: {n}): peak {peak / 1e9:.1f} GB per GPU; each costs one more layer forward "
            "per micro-batch (Megatron --recompute-method block)"]


def fewest_recompute_layers(scenario: Scenario, report: MemoryReport,
                            limit: float | None = None) -> tuple[int, float] | None:
    """The fewest layers per (virtual) stage whose full recompute brings every stage within ``limit`` bytes (default:
    the GPU's memory), and the peak then; None where it is within already, where even every layer recomputed is
    not, where the scenario offloads activations (the two are not weighed together here), or where the model's layers
    differ (the scenario rules refuse partial recompute there)."""
    tr = scenario.training
    within, limit = _within(report, limit)
    if within or tr.activation_offload_layers or not scenario.layers_per_stage or scenario.model.layers_differ:
        return None
    most = min(scenario.layers_per_stage)     # recompute_layers may not pass a stage's layers (scenario rules)
    low = (tr.recompute_layers or 0) + 1 if tr.recompute == "full" else 1
    if most < 1 or low > most:
        return None

    def peak(n: int) -> float:
        t = tr.model_copy(update={"recompute": "full", "recompute_layers": n, "recompute_modules": None})
        return _peak(replace(scenario, training=t))

    if peak(most) > limit:
        return None
    lo, hi = low, most
    while lo < hi:   # the ledger falls as more layers recompute: the fewest that fit
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if peak(mid) <= limit else (mid + 1, hi)
    return lo, peak(lo)


def _within(report: MemoryReport, limit: float | None) -> tuple[bool, float]:
    """Whether the ledger is within ``limit`` bytes already (default: the GPU's memory, where it also fits the host),
    and the limit in bytes."""
    if limit is None:
        return report.fits, report.capacity
    return report.peak_max <= limit, limit


def _peak(scenario: Scenario) -> float:
    """The ledger's peak over the stages of ``scenario``."""
    return max(stage_memory(scenario, r).total for r in range(scenario.parallel.pp))


def cheapest_recompute_modules(scenario: Scenario, report: MemoryReport,
                               limit: float | None = None) -> tuple[list[str], float] | None:
    """The cheapest module list for selective recompute (``plan.recompute.module_sets``: the scenario's modules, or
    the default, plus modules of the model) that brings every stage within ``limit`` bytes (default: the GPU's
    memory), and the peak then; None where the run is within already, recomputes in full or by operator, or no
    list brings it there. Each list is checked by the scenario rules (a module the model lacks is skipped)."""
    from simtrain.plan.balance import resolve_split
    from simtrain.plan.recompute import DEFAULT_MODULES, MODULE_ORDER, module_sets
    from simtrain.spec.errors import InputError
    from simtrain.spec.scenario_rules_long import model_has_module

    tr = scenario.training
    within, limit = _within(report, limit)
    if within or tr.recompute not in ("none", "selective") or tr.activation_offload_layers:
        return None
    base = list(tr.recompute_modules or DEFAULT_MODULES)
    extra = [x for x in MODULE_ORDER if model_has_module(scenario.model, x)]
    lists = ([base] if tr.recompute == "none" else []) + module_sets(base, extra)
    for modules in lists:
        try:
            moved = resolve_split(scenario.with_overrides({"training.recompute": "selective",
                                                           "training.recompute_modules": modules}))
        except InputError:      # a module this model lacks
            continue
        peak = _peak(moved)
        if peak <= limit:
            return modules, peak
    return None


def _modules_tip(scenario: Scenario, report: MemoryReport) -> list[str]:
    """Selective recompute of the cheapest modules that make every stage fit (Megatron's --recompute-modules)."""
    found = cheapest_recompute_modules(scenario, report)
    if found is None:
        return []
    modules, peak = found
    return [f"recompute these modules (training.recompute: selective, training.recompute_modules: "
            f"[{', '.join(modules)}]): peak {peak / 1e9:.1f} GB per GPU; the cheapest list that fits, each module "
            "re-running its forward before the backward (Megatron --recompute-modules)"]


def _offload_tip(scenario: Scenario, report: MemoryReport) -> list[str]:
    """Activation offloading where Megatron-Core allows it (pp 1, no recompute, a host link): the fewest layers
    whose copies to host make the run fit, found with the ledger itself. It re-runs no forward work, so it comes
    first; its price is the PCIe copy time each layer's compute must hide."""
    found = fewest_offload_layers(scenario, report)
    if found is None:
        return []
    lo, st = found
    link = scenario.hardware.inter_node.pcie_bandwidth
    return [f"offload the activations of {lo} layers to host memory (training.activation_offload_layers: {lo}): "
            f"peak {st.total / 1e9:.1f} GB per GPU with no recomputed work; each layer's "
            f"{st.offload_layer_bytes / 1e9:.2f} GB crosses PCIe in {st.offload_layer_bytes / link * 1e3:.0f} ms each "
            "way, exposed where the layers' compute is shorter (Megatron-Core --cpu-offloading)"]


def offload_applies(scenario: Scenario) -> bool:
    """Megatron-Core's limits on activation offloading (pp 1, no recompute) and what simtrain does not simulate with
    it (ZeRO-3, ep_overlap), and a host link to copy over."""
    tr, par, hw = scenario.training, scenario.parallel, scenario.hardware
    link = hw.inter_node.pcie_bandwidth if hw.inter_node is not None else None
    return par.pp == 1 and tr.recompute == "none" and link is not None and par.zero < 3 and not par.ep_overlap


def fewest_offload_layers(scenario: Scenario, report: MemoryReport,
                          limit: float | None = None) -> tuple[int, StageMemory] | None:
    """The fewest layers whose activations, offloaded, bring the run's peak to ``limit`` bytes (default: the GPU's
    memory), and the ledger's stage then; None where offloading does not apply (:func:`offload_applies`), the run
    is within the limit already with what it offloads, no number of layers brings it there, or the offloaded layers
    would not fit in the node's host memory."""
    tr, hw = scenario.training, scenario.hardware
    layers = report.stages[0].layers
    if not offload_applies(scenario) or layers < 3:
        return None

    def peak(n: int) -> StageMemory:
        return stage_memory(replace(scenario, training=tr.model_copy(update={"activation_offload_layers": n})), 0)

    limit = report.capacity if limit is None else limit
    lo, hi = tr.activation_offload_layers + 1, layers - 1
    if lo > hi or peak(hi).total > limit:
        return None
    while lo < hi:   # the ledger falls as layers leave: the fewest that fit
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if peak(mid).total <= limit else (mid + 1, hi)
    st = peak(lo)
    cap = hw.host_memory
    if cap is not None and (st.host_bytes + st.host_optimizer) * scenario.cluster.gpus_per_node > cap:
        return None    # the offloaded layers would not fit in the node's host memory either
    return lo, st


def _offload_optimizer_tip(scenario: Scenario, report: MemoryReport) -> list[str]:
    """The optimizer state in host memory (Megatron-Core --optimizer-cpu-offload) where simtrain simulates it
    (Adam, ZeRO-1/2, a host link and the host's memory bandwidth in the hardware file) and where it alone makes
    every stage fit, its host state fitting the node's host memory too; its price is the step's copies over PCIe
    and the CPU Adam step, each GPU waiting for them."""
    tr, par, hw = scenario.training, scenario.parallel, scenario.hardware
    link = hw.inter_node.pcie_bandwidth if hw.inter_node is not None else None
    if par.offload_optimizer or tr.optimizer != "adam" or par.zero not in (1, 2) or link is None \
            or hw.host_memory_bandwidth is None:
        return []
    moved = replace(scenario, parallel=par.model_copy(update={"offload_optimizer": True}))
    stages = [stage_memory(moved, p) for p in range(par.pp)]
    if max(st.total for st in stages) > report.capacity:
        return []
    worst = max(stages, key=lambda st: st.host_bytes + st.host_optimizer)
    gpus = scenario.gpus_per_node
    if hw.host_memory is not None and (worst.host_bytes + worst.host_optimizer) * gpus > hw.host_memory:
        return []
    shard = max(st.host_optimizer for st in stages) / HOST_STATE_BYTES
    step = host_step(shard, link, cpu_adam_bandwidth(hw), gpus)
    peak = max(st.total for st in stages)
    rate = ", at best: peak DRAM bandwidth" if hw.host_adam_efficiency is None else ""   # plan.offload_optimizer
    return [f"keep the optimizer state in host memory (parallel.offload_optimizer: true): peak {peak / 1e9:.1f} GB "
            f"per GPU; each step the GPU waits {step.total:.2f} s for its {shard / 1e9:.2f} B-parameter shard: "
            f"gradients down and weights up over PCIe ({step.d2h + step.h2d:.2f} s) and Adam on the CPU "
            f"({step.cpu:.2f} s{rate}; Megatron-Core --optimizer-cpu-offload)"]
