"""The layouts a search enumerates (simtrain.decide.search): every (tp, pp, dp, cp, vpp, micro-batch, ZeRO,
recompute, schedule, sequence parallelism, precision, ep, etp, EP overlap) the scenario rules take, narrowed by
``fix``, for a cluster of ``gpus``. Pure: a scenario in, a list of layout dicts out."""

from __future__ import annotations

from typing import Any

from simtrain.decide.search_result import LAYOUT_KEYS
from simtrain.plan.recompute import MODULE_ORDER
from simtrain.plan.schedules import SPLIT_BACKWARD
from simtrain.spec.errors import InputError, SimulationLimitError, display_path
from simtrain.spec.scenario import Scenario
from simtrain.spec.scenario_rules_long import model_has_module
from simtrain.spec.schema import validate
from simtrain.spec.units import as_whole

RECOMPUTE = ("none", "selective", "selective_op", "full")
#: a layout's keys that mark a variant resolved when it is screened (decide.search): not layout fields ``fix`` sees
VARIANTS = ("offload", "partial", "modules")
#: context parallelism is enumerated where every CP rank still holds at least this many tokens of a sequence (Llama 3's
#: long-context stage: 131,072 tokens over cp 16, Dubey et al. 2024 Table 4); shorter sequences search cp 1 only
CP_MIN_TOKENS = 8192


#: layouts a search screens at most unless its caller raises it: each costs a memory check and an estimate
#: (measured ~4.5 ms on pp4_dp4's 5,080 layouts), so 200,000 is about 15 minutes of one core before any simulation;
#: precision, context and expert parallelism and the split-backward schedules make 20,000-50,000 common at 1,024 GPUs
MAX_LAYOUTS = 200_000
#: GPUs up to which a whole search costs about what max_layouts assumes per enumerated layout (4.5 ms, most layouts
#: being set aside by their floors before any screening): measured on one core at 16,384 GPUs, pp4_dp4 47,710
#: layouts in 169 s (3.5 ms each) and tp8_llama3_70b 69,502 layouts in 298 s (4.3 ms each, 60,090 never screened).
#: Beyond it a screened layout's collectives span the cluster, and a layout counts
#: (GPUs / SCREEN_GPUS) ** SCREEN_EXPONENT times against ``max_layouts``
SCREEN_GPUS = 16_384
#: the growth of one layout's screening with the GPU count beyond SCREEN_GPUS, measured on 30 of pp4_dp4's first
#: layouts by floor (global batch = GPUs, one core): 51 ms a layout at 16,384 GPUs, 365 ms at 65,536, so
#: log(365 / 51) / log(4) = 1.42
SCREEN_EXPONENT = 1.42


def _screening_time(layouts: int) -> str:
    """Roughly how long screening ``layouts`` layouts takes on one core (4.5 ms each, :data:`MAX_LAYOUTS`)."""
    seconds = layouts * 4.5e-3
    if seconds < 1:
        return f"{seconds * 1e3:.0f} ms"
    return f"{seconds:,.0f} s" if seconds < 120 else f"{seconds / 60:,.0f} min"


def _divisors(n: int) -> list[int]:
    """The divisors of ``n`` in increasing order, in O(sqrt n) steps (a global batch of 2**30 is instant)."""
    small, large = [], []
    d = 1
    while d * d <= n:
        if n % d == 0:
            small.append(d)
            if d * d != n:
                large.append(n // d)
        d += 1
    return small + large[::-1]


def gpu_overrides(scenario: Scenario, gpus: int | None) -> dict[str, Any]:
    """Scenario keys that give the cluster ``gpus`` GPUs: nodes = gpus / gpus_per_node."""
    if gpus is None:
        return {}
    gpn = scenario.gpus_per_node
    whole = as_whole(gpus)
    if whole is None:
        raise InputError(f"gpus={gpus!r}: give a whole number of GPUs", field="gpus")
    gpus = whole
    if gpus < 1:
        raise InputError(f"gpus={gpus}: give a positive GPU count", field="gpus")
    if gpus > scenario.simulation.max_gpus:
        raise SimulationLimitError(f"gpus={gpus:,} is more than simulation.max_gpus={scenario.simulation.max_gpus:,}"
                                   ": building the network graph and plan takes time and memory in proportion; "
                                   "raise simulation.max_gpus (e.g. --set simulation.max_gpus=N) if you mean it",
                                   field="gpus")
    if scenario.hardware.explicit:
        devices = len(scenario.hardware.devices)
        if gpus == devices:
            return {}
        raise InputError(f"gpus={gpus:,} cannot resize the explicit topology of "
                         f"{display_path(scenario.hardware_file)}: it lists {devices:,} GPUs (allowed: {devices:,})",
                         field="gpus")
    if gpus < gpn:
        return {"nodes": 1, "gpus_per_node": gpus}
    if gpus % gpn:
        raise InputError(f"gpus={gpus} is not a whole number of {gpn}-GPU nodes", field="gpus")
    return {"nodes": gpus // gpn}


def searched_gpus(scenario: Scenario, sizes: dict[str, Any]) -> int:
    """GPUs of the cluster a search lays out: an explicit topology's devices, else nodes x GPUs per node, as
    ``sizes`` (:func:`gpu_overrides`) or the scenario give them."""
    if scenario.hardware.explicit:
        return len(scenario.hardware.devices)
    return sizes.get("gpus_per_node", scenario.gpus_per_node) * sizes.get("nodes", scenario.nodes)


def check_fix(fix: dict[str, Any] | None, scenario: Scenario | None = None) -> dict[str, list]:
    """``fix`` as {layout field: [allowed values]}; its keys are layout fields (``zero``) or their scenario keys
    (``parallel.zero``), a value one value or a list of them. With ``scenario``, every value is also read as the
    scenario schema reads its key (:func:`_fix_value`): one it refuses is an error naming the key, the value and what
    the key allows."""
    if fix is None:
        return {}
    if not isinstance(fix, dict):
        raise InputError(f"fix={fix!r}: give a mapping such as {{'parallel.zero': 1, 'parallel.tp': [4, 8]}}",
                         field="fix")
    by_key = {v: k for k, v in LAYOUT_KEYS.items()}
    out: dict[str, list] = {}
    for key, values in fix.items():
        name = by_key.get(key, key)
        if name not in LAYOUT_KEYS:
            raise InputError(f"{key!r} is not a searched layout key (allowed: "
                             f"{', '.join(LAYOUT_KEYS.values())})", field="fix")
        values = list(values) if isinstance(values, (list, tuple, set)) else [values]
        # numpy scalars (a DataFrame's cells) compare as the Python values they hold
        values = [v.item() if hasattr(v, "item") and not isinstance(v, (str, bytes)) else v for v in values]
        if not values:
            raise InputError(f"{key!r} lists no value", field="fix")
        out[name] = [_fix_value(scenario, key, name, v) for v in values] if scenario is not None else values
        twice = next((v for i, v in enumerate(out[name]) if v in out[name][:i]), None)
        if twice is not None:      # as a sweep's grid refuses it: a typo for another value, most likely
            raise InputError(f"{key}: lists {twice!r} twice; give each value once", field="fix")
    return out


def fix_text(fix: dict[str, Any]) -> str:
    """``{'parallel.zero': 1, 'parallel.tp': [4, 8]}`` -> 'parallel.zero=1 parallel.tp=4,8', as --fix writes it."""
    def shown(v: Any) -> str:
        return str(v).lower() if isinstance(v, bool) else str(v)

    return " ".join(f"{k}=" + ",".join(shown(v) for v in (vs if isinstance(vs, (list, tuple, set)) else [vs]))
                    for k, vs in fix.items())


def _fix_value(scenario: Scenario, key: str, name: str, value: Any) -> Any:
    """``value`` of the layout field ``name`` as the scenario schema reads it ('4' and 4.0 as 4), found by validating
    the scenario's own section with the value set in it: the closed lists and ranges are the schema's (and
    simtrain.spec.bounds'), not copied here. A value the schema refuses is an InputError naming ``key`` as given."""
    section, field = LAYOUT_KEYS[name].split(".")
    current = getattr(scenario, section)
    try:
        checked = validate(type(current), {**current.model_dump(), field: value}, file=None, prefix=section)
    except InputError as err:
        raise InputError(f"{key}: {err.message}", field="fix") from None
    return getattr(checked, field)


def enumerate_layouts(scenario: Scenario, gpus: int | None = None, fix: dict[str, Any] | None = None,
                      max_layouts: int | None = None) -> list[dict[str, Any]]:
    """Every layout worth validating for the scenario's model, cluster size (or ``gpus``) and global
    batch, in a fixed order, keeping only the values ``fix`` allows (:func:`check_fix`). Cheap arithmetic
    only; the scenario rules have the last word (:func:`screen`). Layouts that cannot differ are listed once:
    ZeRO needs dp > 1, sequence parallelism tp > 1, and with one stage the schedule is moot (1F1B)."""
    fixed = check_fix(fix, scenario)

    def ok(name: str, value: Any) -> bool:
        return name not in fixed or any(value == v and type(value) is type(v) or
                                        (isinstance(v, int) and not isinstance(v, bool) and value == v)
                                        for v in fixed[name])

    m, tr, par = scenario.model, scenario.training, scenario.parallel
    sizes = gpu_overrides(scenario, gpus)
    gpn = sizes.get("gpus_per_node", scenario.gpus_per_node)
    total = searched_gpus(scenario, sizes)
    hw = scenario.hardware
    # TP within the scale-up domain; an explicit topology has none (its links price every group), so TP may span
    # any of its devices the scenario rules take
    domain = total if hw.explicit else hw.intra_node.domain_gpus or gpn
    peaks = hw.gpu.peak_flops
    has_fp8 = "fp8" in peaks or ("mxfp8" in peaks and tr.fp8_recipe == "mxfp8")
    precisions = ("bf16", "fp8") if tr.precision in ("bf16", "fp8") and has_fp8 else (tr.precision,)
    # a mixture of experts: ZeRO-3 and selective_op recompute are refused by the scenario rules (not simulated yet
    # for MoE layers), so they are not listed
    zeros = (0, 1, 2) if m.moe is not None else (0, 1, 2, 3)
    recomputes = tuple(r for r in RECOMPUTE if m.moe is None or r != "selective_op")
    varied = m.layers_differ
    # activation offloading where it may make a layout fit (plan.advice.offload_applies): a host link to copy over
    # (models whose layers all alike only: others get no step-time floor yet, decide/bulk.py, so every variant would
    # be screened, doubling a mixture of experts' search)
    offload = not hw.explicit and hw.inter_node is not None and hw.inter_node.pcie_bandwidth is not None \
        and not tr.activation_offload_layers and not varied
    # the optimizer step on the host (parallel.offload_optimizer) where the hardware file gives what it needs
    host_adam = offload and hw.host_memory_bandwidth is not None and tr.optimizer == "adam" \
        and not par.offload_optimizer
    # recompute granularity (training.recompute_layers, training.recompute_modules) where the scenario leaves it open;
    # models whose layers are all alike only (the rules refuse partial recompute for the others, and they get no floor)
    # (a scenario's own recompute_modules hold only for selective layouts and its recompute_layers for full ones, the
    # rules refusing the others: no variant of a mode its own settings rule out)
    partial = not varied and tr.recompute_layers is None and tr.recompute_modules is None
    # (the modules selective recompute may add: the model's, cheapest first, plan.advice.cheapest_recompute_modules)
    extra_modules = () if varied or tr.recompute_layers is not None else \
        tuple(x for x in MODULE_ORDER if model_has_module(m, x) and x not in (tr.recompute_modules or ()))
    hybridep_ep = _hybridep_ep(hw.gpu.name, domain) if par.moe_dispatcher == "hybridep" else None
    cps = [c for c in _divisors(total) if tr.seq_len % (2 * c) == 0 and tr.seq_len // c >= CP_MIN_TOKENS]
    # None: the layouts carry no cp key (short sequences), unless the scenario sets cp > 1, which would otherwise
    # leak into every layout of tp x pp x dp = all GPUs (each then invalid): those layouts say cp 1
    cps = cps if len(cps) > 1 else [1 if par.cp > 1 else None]
    out = []
    weight = max(1.0, (total / SCREEN_GPUS) ** SCREEN_EXPONENT)   # a layout's cost, in layouts of SCREEN_GPUS
    grid = [(t, p, c) for t in _divisors(min(domain, total)) for p in _divisors(total // t) for c in cps]
    for tp, pp, cp in grid:
        if total % tp or m.heads % tp or m.num_kv_heads % tp or m.ffn_hidden % tp or not ok("tp", tp):
            continue
        if (total // (tp * pp)) % (cp or 1) or not ok("pp", pp) or (cp and not ok("cp", cp)) or pp > m.layers:
            continue
        # layers that do not split evenly over the ranks are balanced (layers_per_stage: auto; dense models only)
        split = None if m.layers % pp == 0 else "auto"
        if split and varied:
            continue
        dp = total // (tp * pp * (cp or 1))
        if tr.global_batch % dp or not ok("dp", dp):
            continue
        for mb in (d for d in _divisors(tr.global_batch // dp) if ok("micro_batch", d)):
            micro = tr.global_batch // (mb * dp)
            # GPipe with a balanced split is left out: it takes 1F1B's time with more memory (Narayanan 2021 2.2.1)
            shapes = [("1f1b", 1)] if pp == 1 or split else [("gpipe", 1), ("1f1b", 1)]
            if pp > 1 and micro % pp == 0 and split is None:
                shapes += [("interleaved-1f1b", v) for v in _divisors(m.layers // pp) if v >= 2]
            # the split-backward schedules; for models whose layers differ only with even splits (auto is refused)
            shapes += _split_shapes(pp, micro, m.layers, split, auto_ok=not varied)
            for schedule, vpp in ((sc, v) for sc, v in shapes if ok("schedule", sc) and ok("vpp", v)):
                # zero-bubble and DualPipe schedules run with ZeRO 0 or 1 (scenario rules)
                allowed_zero = zeros if schedule not in SPLIT_BACKWARD else (0, 1)
                lps = None if m.layers % (pp * vpp) == 0 else "auto"
                for zero in (z for z in (allowed_zero if dp * (cp or 1) > 1 else (0,)) if ok("zero", z)):
                    for recompute in (r for r in recomputes if ok("recompute", r)):
                        # a mixture of experts with tp > 1 needs sequence parallelism (Megatron-Core refuses it
                        # without, moe_layer.py; the scenario rules too)
                        sps = (True,) if tp > 1 and m.moe is not None else (False, True) if tp > 1 else (False,)
                        for sp in (b for b in sps if ok("sequence_parallel", b)):
                            out.extend({"tp": tp, "pp": pp, "dp": dp, "vpp": vpp, "micro_batch": mb,
                                        "zero": zero, "recompute": recompute, "schedule": schedule,
                                        "sequence_parallel": sp, "precision": precision,
                                        **({"cp": cp} if cp else {}), **experts,
                                        "layers_per_stage": lps}
                                       for precision in precisions if ok("precision", precision)
                                       for experts in _expert_layouts(m, tp, dp * (cp or 1), par.moe_dispatcher,
                                                                      hybridep_ep)
                                       for experts in _with_overlap(experts, tr, par, m, pp, schedule, zero, recompute)
                                       for experts in _with_offload(experts, offload, pp, zero, recompute)
                                       for experts in _with_host_adam(experts, host_adam, zero)
                                       for experts in _with_recompute(experts, recompute, partial and lps is None
                                                                      and m.layers // (pp * vpp) >= 2,
                                                                      bool(extra_modules))
                                       if all(ok(k, v) for k, v in experts.items() if k not in VARIANTS))
            if max_layouts is not None and len(out) * weight > max_layouts:
                raise _too_many(max_layouts, total, weight)
    why = {"cp": f"context parallelism is searched only where every CP rank keeps at least {CP_MIN_TOKENS:,} tokens "
                 f"of a sequence (seq_len {tr.seq_len:,})",
           "ep": "expert parallelism is searched only for a mixture of experts",
           "etp": "expert tensor parallelism is searched only for a mixture of experts"}
    why["ep_overlap"] = "the EP all-to-all overlap is searched only for a mixture of experts"
    why["offload_optimizer"] = ("the optimizer on the host is searched only with ZeRO-1/2, Adam, a model whose layers "
                                "are all alike, no offloading set in the scenario, and a hardware file (not an "
                                "explicit topology) giving inter_node.pcie_bandwidth and host_memory_bandwidth")
    for name in ("cp", "ep", "etp", "ep_overlap", "offload_optimizer"):   # a fixed key no layout carries is an error
        if name == "offload_optimizer" and all(v is False for v in fixed.get(name, [True])):
            continue     # every layout keeps its optimizer on the GPU where the key is not searched
        if name in fixed and not any(name in layout for layout in out):
            values = ",".join(str(v).lower() if isinstance(v, bool) else str(v) for v in fixed[name])
            raise InputError(f"{LAYOUT_KEYS[name]}={values}: no searched layout has it ({why[name]})", field="fix")
    return out


def _too_many(max_layouts: int, gpus: int, weight: float) -> SimulationLimitError:
    """The refusal of a search whose layouts would cost more screening than ``max_layouts`` layouts of
    :data:`SCREEN_GPUS` GPUs or fewer (``weight``: what one of its layouts costs in those)."""
    ways = ("narrow it (fix=), search fewer GPUs or a smaller global batch, or raise the limit (--max-layouts, "
            "search(max_layouts=...))")
    if weight == 1.0:
        return SimulationLimitError(
            f"this search would screen more than {max_layouts:,} layouts (about {_screening_time(max_layouts)} of "
            f"one core before any simulation), more than max_layouts={max_layouts:,}; {ways}", field="max_layouts")
    return SimulationLimitError(
        f"this search would screen more than {max_layouts / weight:,.0f} layouts of {gpus:,} GPUs, each costing "
        f"about {weight:,.1f} times a layout of {SCREEN_GPUS:,} GPUs or fewer (its collectives span the cluster): "
        f"the work of more than max_layouts={max_layouts:,} layouts (about {_screening_time(max_layouts)} of one "
        f"core before any simulation); {ways}", field="max_layouts")


def _split_shapes(pp: int, micro: int, layers: int, split: str | None, auto_ok: bool = True) -> list[tuple[str, int]]:
    """The zero-bubble and DualPipe schedules that apply (scenario rules): zb-h1 on any pipeline; zb-v and dualpipev
    with two chunks per rank (an even split of 2 pp chunks, else auto when 2 pp <= layers + 2 and ``auto_ok``);
    dualpipe with an even pp, at least 2 pp micro-batches, an even count, and an even split; dualpipe(v) with
    micro-batches >= 2 pp."""
    if pp == 1:
        return []
    out = [("zb-h1", 1)]
    v_ok = layers % (2 * pp) == 0 or (auto_ok and 2 * pp <= layers + 2)
    if v_ok:
        out.append(("zb-v", 2))
    if pp % 2 == 0 and micro >= 2 * pp and micro % 2 == 0 and split is None:
        out.append(("dualpipe", 1))
    if v_ok and micro >= 2 * pp:
        out.append(("dualpipev", 2))
    return out


def _with_overlap(experts: dict, tr, par, model, pp: int, schedule: str, zero: int, recompute: str) -> list[dict]:
    """A mixture of experts' layout without and, where the scenario rules take it, with Megatron-Core's EP
    all-to-all overlap (ep > 1, interleaved 1F1B or 1F1B at pp 1, ZeRO 0/1, no full recompute, at most one MTP
    module, the alltoall, deepep or hybridep dispatcher, no 'moe' recompute module); dense layouts carry no such key."""
    if not experts:
        return [experts]
    out = [{**experts, "ep_overlap": False}]
    if (experts["ep"] > 1 and (schedule == "interleaved-1f1b" or (schedule == "1f1b" and pp == 1)) and zero <= 1
            and recompute != "full" and model.mtp_layers <= 1
            and par.moe_dispatcher in ("alltoall", "deepep", "hybridep")
            and "moe" not in (tr.recompute_modules or ()) and not tr.activation_offload_layers):
        out.append({**experts, "ep_overlap": True})
    return out


def _expert_layouts(model, tp: int, dp: int, dispatcher: str = "alltoall", hybridep_ep=None) -> list[dict[str, int]]:
    """The (ep, etp) pairs of a mixture of experts on a stage of tp x dp GPUs: ep divides the experts, etp divides
    tp and the expert width, etp x ep divides tp x dp (Megatron-Core's folding); etp 1 only with the deepep and
    hybridep dispatchers (the scenario rules refuse expert TP with them), and with hybridep only the ep that
    ``hybridep_ep`` (:func:`_hybridep_ep`) does not rule out. [{}] for a dense model, whose layouts carry no expert
    keys."""
    moe = model.moe
    if moe is None:
        return [{}]
    etps = [1] if dispatcher in ("deepep", "hybridep") else _divisors(tp)
    return [{"ep": ep, "etp": etp} for etp in etps if moe.expert_ffn_hidden % etp == 0
            for ep in _divisors(moe.experts) if (tp * dp) % (etp * ep) == 0
            and (dispatcher != "hybridep" or hybridep_ep is None or hybridep_ep(ep))]


def _hybridep_ep(gpu: str, domain: int):
    """Whether an ep is worth screening under the hybridep dispatcher: False only where the scenario rules
    (spec.scenario_rules_moe.check_hybridep_scope) refuse every placement of ep consecutive GPUs. On B200 a group
    must stay in one NVLink domain (ep <= domain). On Hopper a group of 8 or fewer GPUs lies in one domain or in
    parts of fewer than 8 (both refused), and one of more than 64 spans more than 8 domains or parts other than 8;
    ep 1 moves nothing and is always kept."""
    from simtrain.spec.scenario_rules_moe import (
        HYBRIDEP_MAX_DOMAINS,
        HYBRIDEP_NVLINK_GPUS,
        HYBRIDEP_RANKS_PER_DOMAIN,
        HYBRIDEP_RDMA_GPUS,
    )

    if gpu.startswith(HYBRIDEP_NVLINK_GPUS):
        return lambda ep: ep == 1 or ep <= domain
    if gpu.startswith(HYBRIDEP_RDMA_GPUS):
        most = HYBRIDEP_RANKS_PER_DOMAIN * HYBRIDEP_MAX_DOMAINS
        return lambda ep: ep == 1 or HYBRIDEP_RANKS_PER_DOMAIN < ep <= most
    return None


def _with_offload(layout: dict, offload: bool, pp: int, zero: int, recompute: str) -> list[dict]:
    """The layout, and where Megatron-Core's activation offloading applies (pp 1, no recompute; simtrain: ZeRO 0-2,
    no EP overlap) the same with ``offload``: the fewest layers whose activations, copied to host memory, make it
    fit (found when it is screened, ``activation_offload_layers`` in its row)."""
    if offload and pp == 1 and recompute == "none" and zero <= 2 and not layout.get("ep_overlap"):
        return [layout, {**layout, "offload": True}]
    return [layout]


def _with_recompute(layout: dict, recompute: str, partial: bool, modules: bool) -> list[dict]:
    """The layout, and where recompute granularity can make it fit at less cost: under full recompute with an even
    split of at least two layers per (virtual) stage, the same recomputing only the fewest layers per stage that
    fit (``partial``; Megatron's --recompute-method block); under selective recompute, the same adding the cheapest
    modules that fit (``modules``; ``plan.recompute.MODULE_ORDER``). Both are found when the layout is screened
    (``recompute_layers`` or ``recompute_modules`` in its row)."""
    if recompute == "full" and partial:
        return [layout, {**layout, "partial": True}]
    if recompute == "selective" and modules:
        return [layout, {**layout, "modules": True}]
    return [layout]


def _with_host_adam(layout: dict, host_adam: bool, zero: int) -> list[dict]:
    """The layout, and with ZeRO-1/2 where the hardware file gives a host link and the host's memory bandwidth, the
    same with its optimizer state and step on the host (``parallel.offload_optimizer``, Megatron-Core's
    ``--optimizer-cpu-offload``)."""
    if not host_adam:
        return [layout]
    plain = {**layout, "offload_optimizer": False}
    return [plain, {**layout, "offload_optimizer": True}] if zero in (1, 2) else [plain]
