"""Scenario files: hardware + model + training settings + parallel layout.

``load_scenario`` reads a YAML file (or a mapping), applies ``--set`` style
overrides, resolves the hardware and model references, checks every rule that
ties them together and returns a frozen :class:`Scenario`. Problems raise an
:class:`~simtrain.spec.errors.InputError` naming file, line and field.
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from simtrain.spec.errors import InputError, display_path, short_repr
from simtrain.spec.frozen_raw import freeze
from simtrain.spec.hardware import HardwareSpec, load_hardware
from simtrain.spec.model import ModelSpec
from simtrain.spec.model_load import load_model
from simtrain.spec.option_values import parse_value
from simtrain.spec.scenario_rules import check_rules, setup_warnings
from simtrain.spec.scenario_schema import (
    SCHEDULES,
    Parallel,
    ScenarioCost,
    ScenarioFile,
    Simulation,
    Training,
)
from simtrain.spec.schema import validate
from simtrain.spec.topology import Cluster, build_cluster
from simtrain.spec.yamlio import OVERRIDE_LINE, LineDict, line_of, load_yaml, locate


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
    cost: ScenarioCost = field(default_factory=ScenarioCost)
    assumed: tuple[str, ...] = ()   # settings taken from the model family, not from the scenario (reports state them)

    def __setstate__(self, state: dict) -> None:
        """A pickled or deep-copied scenario keeps its raw mapping read-only (the copy thawed it: frozen_raw)."""
        self.__dict__.update(state, raw=freeze(state["raw"]))

    @property
    def price_per_gpu_hour(self) -> float | None:
        """USD per GPU-hour: the scenario's ``cost.price_per_gpu_hour``, else the hardware file's (None: unknown)."""
        if self.cost.price_per_gpu_hour is not None:
            return self.cost.price_per_gpu_hour
        return self.hardware.cost.price_per_gpu_hour

    @cached_property
    def cluster(self) -> Cluster:
        return build_cluster(self.hardware, nodes=self.nodes, gpus_per_node=self.gpus_per_node)

    @property
    def gpus(self) -> int:
        return self.parallel.dp * self.parallel.tp * self.parallel.pp * self.parallel.cp

    @property
    def dp_cp(self) -> int:
        """Ranks of a stage that hold the same weights: gradients are reduced and ZeRO shards over dp x cp
        (Megatron-Core distributed_data_parallel.py, the dp_cp group)."""
        return self.parallel.dp * self.parallel.cp

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
        if self.parallel.layers_per_stage == "auto":   # an internal invariant, not user input
            raise ValueError("layers_per_stage: auto is resolved by simtrain.plan.balance.resolve_split first")
        if self.parallel.layers_per_stage:
            return tuple(self.parallel.layers_per_stage)
        per = self.model.layers // self.virtual_stages
        return (per,) * self.virtual_stages

    @property
    def tokens_per_step(self) -> int:
        return self.training.global_batch * self.training.seq_len

    def with_overrides(self, overrides: dict[str, Any]) -> Scenario:
        """This scenario with dotted keys set (sweeps, search, notebooks). A quantity may be an SI number here,
        as everywhere in Python; the file's own values had their units checked when it was loaded."""
        _overrides_mapping(overrides, "Scenario.with_overrides")
        return scenario_from_dict(apply_overrides(self.raw, overrides or {}, file=self.file),
                                  file=self.file, base_dir=self.base_dir, units=False)


# --- overrides -------------------------------------------------------------

def _overrides_mapping(overrides: Any, where: str) -> None:
    """A Python caller's overrides must be a mapping of dotted keys: anything else is named, not an AttributeError."""
    if overrides is not None and not isinstance(overrides, dict):
        raise TypeError(f"simtrain: {where}: overrides must be a mapping of dotted keys to values, e.g. "
                        f"{{'training.micro_batch': 2}}, not {type(overrides).__name__}")


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
        out[key] = parse_value(text, f"--set '{short_repr(item)[1:-1]}'")
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
    """Read, resolve and validate a scenario file, given by its path or by a bundled scenario's name
    (``load_scenario("pp4_dp4")``; :func:`simtrain.spec.bundled.scenario_names` lists them)."""
    from simtrain.spec.bundled import scenario_path

    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"simtrain.load_scenario: path must be a file path (str or pathlib.Path) or a bundled "
                        f"scenario's name, not {type(path).__name__}")
    _overrides_mapping(overrides, "load_scenario")
    path = scenario_path(path)
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
    section = raw.get("parallel")
    auto_dp = isinstance(section, dict) and section.get("dp") == "auto"
    # dp: auto is resolved once the cluster's size is known; the raw mapping keeps "auto", so that an override of
    # nodes (a sweep over them) gets its own dp
    top = validate(ScenarioFile, apply_overrides(raw, {"parallel.dp": 1}) if auto_dp else raw, file=file,
                   units=units)
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
    training, assumed = _family_defaults(top.training, model, raw)
    parallel = top.parallel
    if auto_dp:
        gpus = len(hardware.devices) if hardware.explicit else nodes * gpn
        parallel = parallel.model_copy(update={"dp": _auto_dp(parallel, gpus, raw, file)})
    parallel, stack = _stack_defaults(parallel, training, raw)
    training, megatron = _megatron_grad_dtype(training, raw)
    assumed += stack + megatron
    scenario = Scenario(
        name=str(top.name or (Path(file).stem if file else "scenario")), file=file, raw=freeze(raw), base_dir=base_dir,
        hardware=hardware, hardware_file=hw_file, model=model, training=training, parallel=parallel,
        simulation=top.simulation, nodes=nodes, gpus_per_node=gpn, cost=top.cost, assumed=assumed)
    warnings = check_rules(scenario, raw)
    object.__setattr__(scenario, "warnings", tuple(warnings))
    return scenario


def _family_defaults(training: Training, model: ModelSpec, raw: dict) -> tuple[Training, tuple[str, ...]]:
    """The training settings the model family brings (``dropout`` for now) where the scenario sets none; an explicit
    scenario value wins. Returns the training settings and what was assumed, in words."""
    given = raw.get("training") if isinstance(raw.get("training"), dict) else {}
    if model.dropout is None or "dropout" in given or model.dropout == training.dropout:
        return training, ()
    word = "true" if model.dropout else "false"
    return (training.model_copy(update={"dropout": model.dropout}),
            (f"training.dropout: {word}, the default of model {model.name}'s family (set training.dropout to "
             "change it)",))


def _stack_defaults(parallel: Parallel, training: Training, raw: dict) -> tuple[Parallel, tuple[str, ...]]:
    """The parallel settings a framework's own layers bring where the scenario sets none: nanotron's column-parallel
    linears all-reduce their input gradient after the whole backward unless ``tp_linear_async_communication`` is set
    (huggingface/nanotron ``parallel/tensor_parallel/functional.py`` @67c5ebb6, ``column_linear``:
    ``differentiable_identity``; ``config/parallelism_config.py``: the default None becomes False), so with tp > 1
    and no sequence parallelism ``training.layer_kernels: nanotron`` turns
    ``parallel.tp_async_allreduce`` off. An explicit scenario value wins."""
    given = raw.get("parallel") if isinstance(raw.get("parallel"), dict) else {}
    if training.layer_kernels != "nanotron" or "tp_async_allreduce" in given or not parallel.tp_async_allreduce \
            or parallel.tp == 1 or parallel.sequence_parallel:
        return parallel, ()
    return (parallel.model_copy(update={"tp_async_allreduce": False}),
            ("parallel.tp_async_allreduce: false, nanotron's default (tp_linear_async_communication off; set "
             "parallel.tp_async_allreduce to change it)",))


def _megatron_grad_dtype(training: Training, raw: dict) -> tuple[Training, tuple[str, ...]]:
    """Megatron-LM accumulates and all-reduces bf16 gradients in fp32 (``arguments.py`` forces
    ``accumulate_allreduce_grads_in_fp32`` for bf16 at @de7dc40f, @2755bcb8 and the zero-bubble fork @f68d3879), so
    ``optimizer_kernel: megatron`` with bf16 or fp8 (bf16 weights) turns ``grad_dtype: auto`` into fp32. An explicit
    scenario value wins."""
    given = raw.get("training") if isinstance(raw.get("training"), dict) else {}
    if training.optimizer_kernel != "megatron" or training.precision not in ("bf16", "fp8") \
            or "grad_dtype" in given or training.grad_dtype != "auto":
        return training, ()
    return (training.model_copy(update={"grad_dtype": "fp32"}),
            ("training.grad_dtype: fp32, Megatron-LM's for bf16 weights (accumulate_allreduce_grads_in_fp32; set "
             "training.grad_dtype to change it)",))


def _auto_dp(parallel: Parallel, gpus: int, raw: dict, file: str | None) -> int:
    """``parallel.dp: auto``: the GPUs the cluster has over tp x pp x cp (each replica is tp x pp x cp GPUs)."""
    per_replica = parallel.tp * parallel.pp * parallel.cp
    if gpus % per_replica:
        raise InputError(f"auto: the cluster's {gpus} GPUs are not a whole number of replicas of tp x pp x cp = "
                         f"{parallel.tp} x {parallel.pp} x {parallel.cp} = {per_replica} GPUs", file=file,
                         line=line_of(raw, "parallel.dp"), field="parallel.dp")
    return gpus // per_replica


def _to_linedict(obj: Any) -> Any:
    if isinstance(obj, dict):
        out = LineDict()
        for k, v in obj.items():
            out[k] = _to_linedict(v)
        return out
    if isinstance(obj, list):
        return [_to_linedict(v) for v in obj]
    return obj


__all__ = ["Scenario", "load_scenario", "scenario_from_dict", "parse_set", "apply_overrides", "SCHEDULES",
           "setup_warnings"]
