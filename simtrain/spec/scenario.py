"""Scenario files: hardware + model + training settings + parallel layout.

``load_scenario`` reads a YAML file (or a mapping), applies ``--set`` style
overrides, resolves the hardware and model references, checks every rule that
ties them together and returns a frozen :class:`Scenario`. Problems raise an
:class:`~simtrain.spec.errors.InputError` naming file, line and field.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BeforeValidator, Field, NonNegativeInt, PositiveInt

from simtrain.spec.errors import InputError, SimulationLimitError, allowed, display_path, suggest
from simtrain.spec.hardware import HardwareSpec, load_hardware
from simtrain.spec.model import ModelSpec, load_model
from simtrain.spec.quantity import Bytes, Number
from simtrain.spec.schema import Closed, validate
from simtrain.spec.topology import Cluster, build_cluster
from simtrain.spec.yamlio import OVERRIDE_LINE, LineDict, line_of, load_yaml, locate

SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b")
ATTENTION_KERNELS = ("flash1", "flash2", "flash3")


def _attention_kernel(value: object) -> object:
    """training.flash_attention: a bool, or the name of a flash-attention kernel."""
    if isinstance(value, bool) or value in ATTENTION_KERNELS:
        return value
    raise ValueError(f"{value!r} is not one of true, false, {', '.join(ATTENTION_KERNELS)}")


FlashAttention = Annotated[bool | Literal["flash1", "flash2", "flash3"], BeforeValidator(_attention_kernel)]


class Training(Closed):
    """What one optimizer step processes and how."""

    seq_len: PositiveInt = Field(description="tokens per sequence")
    global_batch: PositiveInt = Field(description="sequences per optimizer step")
    micro_batch: PositiveInt = Field(1, description="sequences per micro-batch")
    precision: Literal["bf16", "fp16", "fp32"] = "bf16"
    optimizer: Literal["adam", "adafactor", "sgd"] = "adam"
    optimizer_kernel: Literal["fused", "unfused"] = Field(
        "fused", description="how the Adam step runs: fused = one pass over the state (apex FusedAdam, Megatron-LM, "
                             "torch fused=True); unfused = PyTorch's element-wise kernels, one pass per operation "
                             "(torch AdamW single-tensor or foreach, Composer's DecoupledAdamW)")
    recompute: Literal["none", "selective", "selective_op", "full"] = Field(
        "none", description="activation recompute: selective = Megatron-LM's (the attention core), selective_op = torchtitan's op-level policy (matmul and attention outputs kept, every second matmul and all other ops recomputed), full = the whole layer")
    flash_attention: FlashAttention = Field(
        True, description="fused attention kernel: true = flash2 (FlashAttention-2, the kernel the hardware file's "
                          "attention figures describe), flash1 (FlashAttention-1 class), flash3 (FlashAttention-3, "
                          "Hopper), false = attention as GEMMs plus a memory-bound softmax")
    dropout: bool = Field(
        True, description="dropout layers run (Megatron-LM's GPT default); false = p = 0, as in Llama and MPT: no dropout "
                          "kernels and no masks kept")
    train_metrics: NonNegativeInt = Field(
        0, description="metrics computed over the logits after every micro-batch's backward, each an eager fp32 "
                       "cross entropy without a backward (Composer evaluates its train metrics on every micro-batch; "
                       "llm-foundry's MPT has two, LanguageCrossEntropy and LanguagePerplexity)")
    grad_dtype: Literal["auto", "fp32", "bf16", "fp16"] = Field(
        "auto", description="dtype gradients are kept and reduced in: auto = the training precision; fp32 = Megatron-LM's "
                            "bf16 default (fp32 main grads) and FSDP's reduce_dtype=float32 (Composer DEFAULT, torchtitan)")
    cross_entropy: Literal["eager", "fused"] = Field(
        "eager", description="loss kernel: eager = PyTorch's fp32 log_softmax + nll_loss (Megatron-LM, torchtitan), "
                             "fused = one kernel over the 16-bit logits (flash-attn's cross entropy, llm-foundry)")

    @property
    def attention_kernel(self) -> str:
        """'none', 'flash1', 'flash2' or 'flash3'."""
        if self.flash_attention is True:
            return "flash2"
        return self.flash_attention or "none"


class Parallel(Closed):
    """The parallel layout: data, tensor, pipeline (with virtual stages), ZeRO."""

    dp: PositiveInt = 1
    tp: PositiveInt = 1
    pp: PositiveInt = 1
    vpp: PositiveInt = Field(1, description="model chunks per pipeline rank (interleaved schedule)")
    schedule: Literal["gpipe", "1f1b", "interleaved-1f1b"] = "1f1b"
    zero: Literal[0, 1, 2, 3] = 0
    backward_prefetch: Literal["pre", "post", "none"] = Field(
        "pre", description="ZeRO-3 only: when, on the GPU, the backward gathers the next layer's weights: pre = as this "
                           "layer's gradient computation starts (overlaps it; PyTorch FSDP with BACKWARD_PRE, or "
                           "BACKWARD_POST with limit_all_gathers, when the CPU runs ahead), post = once this layer's "
                           "gradients are computed (FSDP BACKWARD_POST with a CPU that does not run ahead), none = "
                           "when the next layer starts")
    zero_impl: Literal["generic", "fsdp1"] = Field(
        "generic", description="ZeRO-2/3 only: how gradients reach the reduce-scatter. generic = the layers' gradients "
                               "are its input (Megatron-LM's contiguous gradient buffer); fsdp1 = PyTorch "
                               "FullyShardedDataParallel's flat parameters: each unit's gradient is concatenated "
                               "into the flat gradient, cast to the reduce dtype and pre-divided before its "
                               "reduce-scatter, and each unit costs FSDP1's fixed 1.875 ms per micro-batch "
                               "(docs/model.md section 2.12)")
    sequence_parallel: bool = False
    layers_per_stage: list[int] | None = Field(None, description="uneven split, one entry per (virtual) stage")


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


@dataclass(frozen=True, eq=False)
class Scenario:
    """A fully resolved, validated scenario: the input of memory, simulation and reports."""

    name: str
    file: str | None
    raw: dict = field(repr=False)
    base_dir: Path = field(repr=False)
    hardware: HardwareSpec
    hardware_file: str
    model: ModelSpec
    training: Training
    parallel: Parallel
    simulation: Simulation
    nodes: int
    gpus_per_node: int
    warnings: tuple[str, ...] = ()

    @cached_property
    def cluster(self) -> Cluster:
        return build_cluster(self.hardware, nodes=self.nodes, gpus_per_node=self.gpus_per_node)

    @property
    def gpus(self) -> int:
        return self.parallel.dp * self.parallel.tp * self.parallel.pp

    @property
    def microbatches(self) -> int:
        """Micro-batches per step per pipeline: global = micro x accumulation x DP (reference article, rule 12)."""
        return self.training.global_batch // (self.training.micro_batch * self.parallel.dp)

    @property
    def virtual_stages(self) -> int:
        return self.parallel.pp * self.parallel.vpp

    @cached_property
    def layers_per_stage(self) -> tuple[int, ...]:
        """Transformer layers per virtual stage, in model order."""
        if self.parallel.layers_per_stage:
            return tuple(self.parallel.layers_per_stage)
        per = self.model.layers // self.virtual_stages
        return (per,) * self.virtual_stages

    @property
    def tokens_per_step(self) -> int:
        return self.training.global_batch * self.training.seq_len

    def with_overrides(self, overrides: dict[str, Any]) -> "Scenario":
        """This scenario with dotted keys set (sweeps, search, notebooks). A quantity may be an SI number here,
        as everywhere in Python; the file's own values had their units checked when it was loaded."""
        return scenario_from_dict(apply_overrides(self.raw, overrides, file=self.file),
                                  file=self.file, base_dir=self.base_dir, units=False)


# --- overrides -------------------------------------------------------------

def parse_set(items: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """``['parallel.pp=8', 'training.recompute=full']`` -> {'parallel.pp': 8, ...}."""
    out: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise InputError(f"--set '{item}' is not key=value, e.g. parallel.pp=8")
        key, text = item.split("=", 1)
        key = key.strip()
        if not key or any(not part for part in key.split(".")):
            raise InputError(f"--set '{item}': '{key}' is not a dotted key such as parallel.pp")
        try:
            out[key] = yaml.safe_load(text) if text.strip() else ""
        except yaml.YAMLError:
            out[key] = text
    return out


def apply_overrides(raw: dict, overrides: dict[str, Any], *, file: str | None = None) -> dict:
    """A deep copy of ``raw`` with dotted keys set (``simulation.stragglers.0.rank`` indexes a list).

    Line numbers are kept where keys existed; an overridden key gets
    :data:`~simtrain.spec.yamlio.OVERRIDE_LINE`, so an error in its value says it came from the override.
    """
    data = copy.deepcopy(raw)
    for dotted, value in overrides.items():
        parts = str(dotted).split(".")
        if not all(parts):
            raise InputError(f"'{dotted}' is not a dotted key such as parallel.pp", file=file)
        node: Any = data
        for depth, part in enumerate(parts):
            last = depth == len(parts) - 1
            where = ".".join(parts[:depth]) or "the top level"
            if isinstance(node, list):
                if not part.isdigit() or int(part) >= len(node):
                    raise InputError(f"cannot set '{dotted}': '{where}' is a list of {len(node)} entries, "
                                     f"'{part}' is not an index of it", file=file, field=str(dotted))
                if last:
                    node[int(part)] = value
                else:
                    node = node[int(part)]
                continue
            if not isinstance(node, dict):
                raise InputError(f"cannot set '{dotted}': '{where}' is not a section", file=file, field=str(dotted))
            if last:
                node[part] = value
            elif not isinstance(node.get(part), (dict, list)):
                if node.get(part) is not None:
                    raise InputError(f"cannot set '{dotted}': '{part}' is not a section", file=file,
                                     field=str(dotted))
                if parts[depth + 1].isdigit():
                    raise InputError(f"cannot set '{dotted}': there is no list '{'.'.join(parts[:depth + 1])}' "
                                     f"to index; set the whole list, e.g. {'.'.join(parts[:depth + 1])}=[...]",
                                     file=file, field=str(dotted))
                section = LineDict()
                section.line = OVERRIDE_LINE
                node[part] = section
            if isinstance(node, LineDict) and (last or part not in node.key_lines):
                node.key_lines[part] = OVERRIDE_LINE
            node = node[part] if not last else node
    return data


# --- loading ---------------------------------------------------------------

def load_scenario(path: str | Path, overrides: dict[str, Any] | None = None) -> Scenario:
    """Read, resolve and validate a scenario file."""
    path = Path(path)
    raw = load_yaml(path)
    if not isinstance(raw, dict):
        raise InputError("a scenario file must hold a mapping (hardware, model, training, parallel)",
                         file=str(path), line=getattr(raw, "line", 1))
    if overrides:
        raw = apply_overrides(raw, overrides, file=str(path))
    raw.setdefault("name", path.stem)
    return scenario_from_dict(raw, file=str(path), base_dir=path.resolve().parent)


def _at_key(err: InputError, raw: dict, key: str, file: str | None) -> InputError:
    """Locate a reference error (missing file, unknown name) at the scenario's key; an error inside
    the referenced file keeps that file and its line."""
    if err.file is None:
        if err.line is None:
            line, note = locate(raw, key)
            if note not in err.message:      # the model's own check may have said it already
                err.message += note
            err.line = line
        err.located(file=file, field=key)
    return err


def scenario_from_dict(raw: dict, *, file: str | None = None, base_dir: Path | None = None,
                       units: bool = True) -> Scenario:
    """Validate a scenario mapping (as a notebook might build it); file references resolve against
    ``base_dir`` (the scenario's folder; default the working folder). With ``file`` and ``units``, a
    quantity must carry its unit, as in a file."""
    base_dir = base_dir or Path.cwd()
    if not isinstance(raw, LineDict):
        raw = _to_linedict(raw)
    top = validate(ScenarioFile, raw, file=file, units=units)
    try:
        hardware, hw_file = load_hardware(top.hardware, base_dir=base_dir, file=None)
    except InputError as err:
        raise _at_key(err, raw, "hardware", file) from None
    try:
        model = load_model(top.model, base_dir=base_dir, file=None, root=raw)
    except InputError as err:
        raise _at_key(err, raw, "model", file) from None
    if hardware.explicit and (top.nodes or top.gpus_per_node):
        key = "nodes" if top.nodes else "gpus_per_node"
        raise InputError(f"cannot override the size of an explicit topology ({display_path(hw_file)} lists "
                         "its devices)", file=file, line=line_of(raw, key), field=key)
    nodes = top.nodes or hardware.nodes
    gpn = top.gpus_per_node or hardware.gpus_per_node
    scenario = Scenario(
        name=str(top.name or (Path(file).stem if file else "scenario")), file=file, raw=raw, base_dir=base_dir,
        hardware=hardware, hardware_file=hw_file, model=model, training=top.training, parallel=top.parallel,
        simulation=top.simulation, nodes=nodes, gpus_per_node=gpn)
    warnings = _check_rules(scenario, raw)
    object.__setattr__(scenario, "warnings", tuple(warnings))
    return scenario


def _to_linedict(obj: Any) -> Any:
    if isinstance(obj, dict):
        out = LineDict()
        for k, v in obj.items():
            out[k] = _to_linedict(v)
        return out
    if isinstance(obj, list):
        return [_to_linedict(v) for v in obj]
    return obj


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _divisors(n: int) -> str:
    """'1, 2, 4, 5, 8, 10, ...': the small divisors of n, which are the tensor-parallel sizes that fit."""
    divs = [d for d in range(1, min(n, 4096) + 1) if n % d == 0]
    shown = ", ".join(str(d) for d in divs[:6])
    return shown + (", ..." if len(divs) > 6 or (n > 4096 and n % 4096) else "")


def _check_rules(s: Scenario, raw: dict) -> list[str]:
    """Rules that tie the sections together; returns warnings, raises on errors."""
    par, tr, m = s.parallel, s.training, s.model

    def fail(field_: str, message: str, error: type[InputError] = InputError) -> None:
        line, note = locate(raw, field_)
        raise error(message + note, file=s.file, line=line, field=field_)

    gpus = s.cluster.gpus if s.hardware.explicit else s.nodes * s.gpus_per_node
    if par.dp * par.tp * par.pp != gpus:
        fail("parallel", f"dp x tp x pp = {par.dp} x {par.tp} x {par.pp} = {par.dp * par.tp * par.pp} "
             f"does not equal the {gpus} GPUs of the cluster ({_count(s.nodes, 'node')} x "
             f"{_count(s.gpus_per_node, 'GPU')})")
    if gpus > s.simulation.max_gpus:
        fail("nodes" if "nodes" in raw else "parallel", f"{gpus:,} GPUs is more than simulation.max_gpus="
             f"{s.simulation.max_gpus:,}: building the network graph and plan takes time and memory in "
             "proportion to the GPU count; raise simulation.max_gpus if you mean it", SimulationLimitError)
    if m.heads % par.tp:
        fail("parallel.tp", f"{par.tp} does not divide heads={m.heads} (allowed: {_divisors(m.heads)})")
    if m.num_kv_heads % par.tp:
        fail("parallel.tp", f"{par.tp} does not divide kv_heads={m.num_kv_heads} (allowed: {_divisors(m.num_kv_heads)})")
    if m.ffn_hidden % par.tp:
        fail("parallel.tp", f"{par.tp} does not divide ffn_hidden={m.ffn_hidden} (allowed: {_divisors(m.ffn_hidden)})")
    vstages = par.pp * par.vpp
    # a rule between schedule and vpp blames the one an override set, when only one was
    by_override = {key for key in ("parallel.schedule", "parallel.vpp") if line_of(raw, key) == OVERRIDE_LINE}
    if par.schedule == "interleaved-1f1b" and par.vpp < 2:
        if by_override == {"parallel.schedule"}:
            fail("parallel.schedule", f"'{par.schedule}' needs vpp >= 2 model chunks per rank, but vpp={par.vpp}")
        fail("parallel.vpp", f"{par.vpp}: the interleaved-1f1b schedule needs vpp >= 2 model chunks per rank")
    if par.vpp > 1 and par.schedule != "interleaved-1f1b":
        if by_override == {"parallel.vpp"}:
            fail("parallel.vpp", f"{par.vpp} model chunks per rank need schedule: interleaved-1f1b, but the schedule "
                 f"is '{par.schedule}', which runs one; set both, or vpp: 1")
        fail("parallel.schedule", f"'{par.schedule}' runs one chunk per rank but vpp={par.vpp}; "
             "use schedule: interleaved-1f1b or vpp: 1")
    if par.layers_per_stage is not None:
        lps = par.layers_per_stage
        if len(lps) != vstages:
            fail("parallel.layers_per_stage", f"has {len(lps)} entries but pp x vpp = {vstages} stages need one each")
        if any(n < 1 for n in lps):
            fail("parallel.layers_per_stage", f"{lps}: every stage needs at least one layer")
        if sum(lps) != m.layers:
            fail("parallel.layers_per_stage", f"{lps} sums to {sum(lps)} but the model has {m.layers} layers")
    elif m.layers % vstages:
        fail("parallel.pp", f"layers={m.layers} is not divisible by pp x vpp = {vstages} "
             "(give parallel.layers_per_stage for an uneven split)")
    kernel = tr.attention_kernel
    if kernel in ("flash1", "flash3") and kernel not in s.hardware.compute.attention_kernels:
        runs = ["true", "false", "flash2"] + sorted(s.hardware.compute.attention_kernels)
        fail("training.flash_attention", f"'{kernel}' is not available on {s.hardware.gpu.name}: "
             f"{display_path(s.hardware_file)} lists no compute.attention_kernels.{kernel} (allowed here: "
             f"{', '.join(runs)})")
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
    if par.schedule == "interleaved-1f1b" and mb % par.pp:
        fail("parallel.schedule", f"interleaved-1f1b needs the micro-batch count ({mb}) to be a multiple of pp={par.pp}")
    if par.sequence_parallel and par.tp > 1 and tr.seq_len % par.tp:
        fail("training.seq_len", f"{tr.seq_len} is not divisible by tp={par.tp}: sequence parallelism splits each "
             f"sequence over the TP ranks (Korthikanti et al. 2022, §4.2.2)")
    seen: dict[int, int] = {}
    for i, st in enumerate(s.simulation.stragglers):
        if (st.rank is None) == (st.fraction is None):
            fail(f"simulation.stragglers.{i}", "give exactly one of 'rank' or 'fraction'")
        if st.rank is not None and st.rank >= gpus:
            fail(f"simulation.stragglers.{i}.rank", f"{st.rank} is not a rank of this {gpus}-GPU layout (0..{gpus - 1})")
        if st.rank is not None and st.rank in seen:
            fail(f"simulation.stragglers.{i}.rank", f"rank {st.rank} is already a straggler (entry {seen[st.rank]}): "
                 "give one entry per rank, with its whole slowdown")
        if st.rank is not None:
            seen[st.rank] = i
        if st.slowdown < 1:
            fail(f"simulation.stragglers.{i}.slowdown", f"{st.slowdown:g} would make the device faster: a straggler's "
                 "compute time is multiplied by slowdown >= 1 (1.3 = 30% slower)")
    for i, link in enumerate(s.simulation.degraded_links):
        for end in ("a", "b"):
            name = getattr(link, end)
            if name not in s.cluster.graph:
                fail(f"simulation.degraded_links.{i}.{end}", f"'{name}' is not a node of the cluster graph "
                     f"(GPUs are gpu0..gpu{gpus - 1}; docs/model.md section 4.1 describes the cluster graph){suggest(name, list(s.cluster.graph)[:2000])}")
        if not s.cluster.graph.has_edge(link.a, link.b):
            fail(f"simulation.degraded_links.{i}", f"there is no link {link.a} -> {link.b} in the cluster graph")

    warnings = []
    if mb < par.pp:
        warnings.append(f"{mb} micro-batches for {par.pp} pipeline stages: the pipeline never fills "
                        "(reference article rule 13: at least pp, better 2 x pp)")
    if par.tp > 1 and not s.hardware.explicit and (par.tp > s.gpus_per_node or s.gpus_per_node % par.tp):
        warnings.append(f"TP group of {par.tp} spans nodes ({s.gpus_per_node} GPUs per node): "
                        "every layer's all-reduce crosses the network (reference article rule 9)")
    if par.sequence_parallel and par.tp == 1:
        warnings.append("parallel.sequence_parallel has no effect with tp 1 (it splits the TP group's "
                        "layer norms and dropouts over the sequence)")
    if par.zero_impl != "generic" and (par.zero < 2 or par.dp == 1):
        warnings.append(f"parallel.zero_impl: {par.zero_impl} has no effect with zero {par.zero} and dp {par.dp} "
                        "(it describes how ZeRO-2/3 hand gradients to their reduce-scatter)")
    warnings += setup_warnings(s)
    if par.backward_prefetch != "pre" and (par.zero < 3 or par.dp == 1):
        warnings.append(f"parallel.backward_prefetch: {par.backward_prefetch} has no effect with zero {par.zero} and "
                        f"dp {par.dp} (it describes ZeRO-3's weight gathers)")
    return warnings


def setup_warnings(s: Scenario) -> list[str]:
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
    effects = {"compute": "kernels run at the datasheet peaks, so step time is optimistic",
               "memory_overheads": "memory has no framework overhead or fragmentation, so peak memory is optimistic"}
    missing = [key for key in effects if key not in s.hardware.model_fields_set]
    if missing:
        out.append(f"hardware {s.hardware.name} has no {' or '.join(missing)} section: "
                   f"{'; '.join(effects[key] for key in missing)} (the bundled hardware/*.yaml give measured values)")
    return out


__all__ = ["Scenario", "load_scenario", "scenario_from_dict", "parse_set", "apply_overrides", "SCHEDULES",
           "allowed", "setup_warnings"]
