"""The terminal report: what a person reads after `simtrain run` or `simtrain memory`."""

from __future__ import annotations

from typing import Any

from simtrain.spec.units import format_bytes, format_count, format_time

#: exposed-communication kinds whose name is not their group's (the others print upper-cased: TP, PP, DP, ...)
EXPOSED_LABELS = {"amax": "FP8 amax"}


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def memory_table(result: Any) -> list[str]:
    lines = [f"{'stage':>5} {'layers':>6} {'params':>10} {'grads':>10} {'optim':>10} {'activ':>10} {'other':>10}"
             f" {'peak':>10} {'of cap':>7}"]
    for st in result.stages:
        m = st.memory
        lines.append(f"{st.pp:>5} {st.layers:>6} {format_bytes(m['params']):>10} {format_bytes(m['grads']):>10} "
                     f"{format_bytes(m['optimizer']):>10} {format_bytes(m['activations']):>10} "
                     f"{format_bytes(m['other']):>10} {format_bytes(st.peak_memory_bytes):>10} "
                     f"{_pct(st.peak_memory_bytes / result.capacity_bytes):>7}")
    return lines


def verdict(result: Any) -> list[str]:
    head = result.capacity_bytes - result.peak_memory_bytes_max
    if result.fits_in_memory:
        return [f"fits: peak {format_bytes(result.peak_memory_bytes_max)} of {format_bytes(result.capacity_bytes)}"
                f" per GPU, headroom {format_bytes(head)} ({_pct(head / result.capacity_bytes)})"]
    worst = max(result.stages, key=lambda s: s.peak_memory_bytes)
    dominant = max(worst.memory, key=worst.memory.get)
    out = [f"DOES NOT FIT: peak {format_bytes(result.peak_memory_bytes_max)} > {format_bytes(result.capacity_bytes)}"
           f" per GPU (stage {worst.pp}; largest part: {dominant} {format_bytes(worst.memory[dominant])})"]
    out += [f"  try: {tip}" for tip in result.advice]
    return out


def memory_text(result: Any) -> str:
    c = result.config
    lines = [f"{result.scenario}: {result.gpus} x {c.get('gpu')} ({c.get('hardware')}), model {c.get('model')} "
             f"({result.params_total / 1e9:.2f} B parameters), "
             f"{format_count(result.microbatches, 'micro-batch', 'micro-batches')} per step", ""]
    lines += memory_table(result) + _other_parts(result) + _expert_share(result) + _host_memory(result) + [""]
    lines += verdict(result) + _assumed(result)
    lines += [f"warning: {w}" for w in result.warnings]
    return "\n".join(lines) + "\n"


def band_text(result: Any) -> str:
    """The step-time band and what it rests on, or why there is none (report.bands)."""
    info = result.step_time_band or {}
    if result.step_time_band_s is None:
        return info.get("none", "none")
    lo, hi = result.step_time_band_s
    n = len(info.get("cases", ()))
    spread = "10th-90th percentile" if info.get("percentiles") != "min-max" else "the range"
    step = result.step_time_s
    # the band is where such runs measured, the prediction corrected by its errors: it can miss the prediction
    side = ("; all above the prediction: runs like it measured slower than predicted" if step is not None and step < lo
            else "; all below the prediction: runs like it measured faster than predicted"
            if step is not None and step > hi else "")
    return (f"{format_time(lo)} - {format_time(hi)}  ({spread} of the errors of {n} validated runs: "
            f"{info.get('basis', '')}{side})")


def _extra_dims(config: dict) -> str:
    """The layout's other dimensions where the scenario uses them (context and expert parallelism, FP8): ' cp=16
    ep=64 etp=1 fp8'; nothing for a dense BF16 layout (its header stays as it was)."""
    par, tr = config.get("parallel", {}), config.get("training", {})
    out = ""
    if par.get("cp", 1) > 1:
        out += f" cp={par['cp']}"
    if "ep" in par:
        out += f" ep={par['ep']} etp={par.get('etp')}"
    if tr.get("precision") == "fp8":
        out += f" fp8 ({tr.get('fp8_recipe', 'tensorwise')})"
    return out


def run_text(result: Any) -> str:
    c = result.config
    par = c.get("parallel", {})
    lines = [
        f"{result.scenario}: {result.gpus} x {c.get('gpu')} ({c.get('hardware')}), model {c.get('model')} "
        f"({result.params_total / 1e9:.2f} B), dp={par.get('dp')} tp={par.get('tp')} pp={par.get('pp')}"
        f" vpp={par.get('vpp')}{_extra_dims(c)} {par.get('schedule')} zero={par.get('zero')}",
        "",
        f"step time        {format_time(result.step_time_s)}",
        f"  band           {band_text(result)}",
        f"tokens/s         {result.tokens_per_s:,.0f}  ({result.tokens_per_s / result.gpus:,.0f} per GPU)",
        f"MFU / HFU        {_pct(result.mfu)} / {_pct(result.hfu)}" + (
            f"  (model FLOP over the dense BF16 peak, as for BF16 runs; {_pct(result.mfu_fp8)} of the FP8 peak)"
            if result.mfu_fp8 is not None else ""),
        f"pipeline bubble  {_pct(result.bubble_fraction)}  "
        f"({format_count(result.microbatches, 'micro-batch', 'micro-batches')}, "
        f"{format_count(par.get('pp'), 'stage')})",
        *([f"bubble parts     fill {format_time(result.bubble_breakdown_s['fill'])}, drain "
           f"{format_time(result.bubble_breakdown_s['drain'])}, imbalance "
           f"{format_time(result.bubble_breakdown_s['imbalance'])}, waiting for sends "
           f"{format_time(result.bubble_breakdown_s['communication'])} (mean per stage)"]
          if result.bubble_breakdown_s else []),
        *([f"layer split      auto: {', '.join(map(str, par.get('layers_per_stage') or []))} (first to last stage; "
           "slowest rank fastest with every rank fitting)"] if c.get("layers_per_stage_auto") else []),
        "exposed comm     " + ", ".join(f"{EXPOSED_LABELS.get(k, k.upper())} {format_time(v)}"
                                        for k, v in result.exposed_comm_s.items()),
        *([f"framework        FSDP1 hooks {format_time(result.framework_overhead_s)} per step, inside compute "
           "(a fixed cost per layer and micro-batch; docs/model.md section 2.12)"]
          if result.framework_overhead_s else []),
        "",
        f"{'stage':>5} {'layers':>6} {'compute':>10} {'exp. comm':>10} {'bubble':>10} {'peak mem':>10} {'of cap':>7}",
    ]
    for st in result.stages:
        exposed = format_time(sum(st.exposed_comm_s.values())) if st.exposed_comm_s is not None else "-"
        lines.append(f"{st.pp:>5} {st.layers:>6} {format_time(st.compute_s):>10} {exposed:>10} "
                     f"{format_time(st.bubble_s):>10} "
                     f"{format_bytes(st.peak_memory_bytes):>10} "
                     f"{_pct(st.peak_memory_bytes / result.capacity_bytes):>7}")
    lines += _expert_share(result) + _host_memory(result)
    place = c.get("placement", {})
    if place:
        lines += ["", "placement        " + _placement_line(place)]
    lines += [""] + verdict(result) + _assumed(result)
    # the verdict above already says when it does not fit (the JSON keeps that warning too)
    lines += [f"warning: {w}" for w in result.warnings if not w.startswith("does not fit")]
    lines.append(f"({result.fidelity} simulation, {result.events:,} events)")
    return "\n".join(lines) + "\n"


def _placement_line(place: dict) -> str:
    """Where each kind of group runs: within a node, across nodes, and, on files whose scale-up domain spans
    several nodes (NVL72 trays), whether it stays on NVLink inside the domain."""
    parts = []
    for kind in ("tp", "dp", "pp"):
        nodes = place.get(f"{kind}_group_crosses_nodes")
        if nodes is None:
            continue
        domains = place.get(f"{kind}_group_crosses_domains")
        if domains is None:
            where = "cross nodes" if nodes else "within a node"
        elif domains:
            where = "cross NVLink domains (scale-out network)"
        else:
            where = "span trays inside one NVLink domain" if nodes else "within a tray"
        parts.append(f"{kind.upper()} groups {where}")
    line = ", ".join(parts)
    if any(k.endswith("_domains") for k in place):
        line += " (ranks fill a domain before the next: TP, then DP, then PP)"
    return line


def _assumed(result: Any) -> list[str]:
    """The settings the run took from the model family rather than from the scenario."""
    return [f"assumed: {a}" for a in result.config.get("assumed", ())]


_OTHER_NAMES = {"fragmentation": "allocator fragmentation", "cuda_context": "CUDA context", "workspace": "workspaces",
                "comm_buffers": "NCCL buffers", "zero3_gather_buffers": "ZeRO-3 gathered layers",
                "dispatch_buffers": "MoE dispatch buffers"}


def _expert_share(result: Any) -> list[str]:
    """The routed experts' share of the static state on the stage with the peak (mixture-of-experts models)."""
    worst = max(result.stages, key=lambda s: s.peak_memory_bytes)
    if not worst.experts:
        return []
    static = sum(worst.memory[k] for k in ("params", "grads", "optimizer"))
    share = sum(worst.experts.values())
    return [f"experts (stage {worst.pp}): params {format_bytes(worst.experts['params'])}, grads "
            f"{format_bytes(worst.experts['grads'])}, optimizer {format_bytes(worst.experts['optimizer'])} "
            f"({_pct(share / static if static else 0.0)} of params + grads + optimizer)"]


def _host_memory(result: Any) -> list[str]:
    """What a GPU keeps in host memory (offloaded activations and optimizer state), on the stage with the most, and
    its node's total (GPUs per node of the config)."""
    worst = max(result.stages, key=lambda s: s.host_memory_bytes or 0.0)
    if not worst.host_memory_bytes:
        return []
    node = worst.host_memory_bytes * result.config.get("gpus_per_node", 1)
    return [f"host memory (stage {worst.pp}): {format_bytes(worst.host_memory_bytes)} per GPU, "
            f"{format_bytes(node)} per node (offloaded activations and optimizer state)"]


def _other_parts(result: Any) -> list[str]:
    """What 'other' holds on the stage with the peak, largest first (when the ledger's parts are known)."""
    worst = max(result.stages, key=lambda s: s.peak_memory_bytes)
    if not worst.other_detail:
        return []
    parts = sorted(((v, k) for k, v in worst.other_detail.items() if v > 0), reverse=True)
    return [f"other (stage {worst.pp}): " + ", ".join(f"{_OTHER_NAMES.get(k, k)} {format_bytes(v)}" for v, k in parts)]
