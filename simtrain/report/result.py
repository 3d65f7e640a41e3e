"""Results: plain, picklable values that the JSON report, the charts and sweeps read.

``simulate(scenario)`` returns a :class:`Result`; ``Result.to_dict()`` is the
JSON report whose keys are simtrain's public interface. Device entries are one
per GPU, or one per distinct rank class (with its ranks listed) past
``DEVICE_LIST_LIMIT`` GPUs.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from simtrain.report.accuracy import LEDGER_ERROR  # noqa: F401 - where results are read, beside them
from simtrain.spec.units import report_float

DEVICE_LIST_LIMIT = 512
#: the parts of a stage's pipeline bubble: idle before its first backward (fill), after its last forward (drain),
#: in between (imbalance), and the wait for pipeline sends in flight (communication, = exposed_comm_s.pp)
BUBBLE_PARTS = ("fill", "drain", "imbalance", "communication")



@dataclass(frozen=True)
class DeviceResult:
    rank: int
    node: int
    dp: int
    tp: int
    pp: int
    peak_memory_bytes: float
    memory: dict[str, float]
    busy_s: dict[str, float] | None = None
    compute_utilization: float | None = None
    bubble_s: float | None = None
    ranks: tuple[int, ...] | None = None     # set when the entry stands for a class of ranks
    exposed_comm_s: dict[str, float] | None = None   # time the compute stream waited on each kind of collective

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"rank": self.rank, "node": self.node, "dp": self.dp, "tp": self.tp, "pp": self.pp,
                               "peak_memory_bytes": round(self.peak_memory_bytes),
                               "memory": {k: round(v) for k, v in self.memory.items()}}
        if self.busy_s is not None:
            out["busy_s"] = {k: report_float(v) for k, v in self.busy_s.items()}
            out["compute_utilization"] = report_float(self.compute_utilization)
            out["bubble_s"] = report_float(self.bubble_s)
            if self.exposed_comm_s is not None:
                out["exposed_comm_s"] = {k: report_float(v) for k, v in self.exposed_comm_s.items()}
        if self.ranks is not None:
            out["ranks"] = _compress(self.ranks)
            out["count"] = len(self.ranks)
        return out


@dataclass(frozen=True)
class StageSummary:
    """One pipeline stage. Its times are one replica's (the stage's slowest), so that compute, exposed
    communication and bubble add up to the step; its memory is the stage's largest."""

    pp: int
    layers: int
    compute_s: float | None      # None: the memory ledger alone (``simtrain memory``), nothing timed
    bubble_s: float | None
    peak_memory_bytes: float
    memory: dict[str, float]
    exposed_comm_s: dict[str, float] | None = None
    other_detail: dict[str, float] | None = None   # what "other" memory holds (the ledger's parts), when known
    experts: dict[str, float] | None = None   # the routed experts' share of params/grads/optimizer (MoE models)
    bubble_breakdown_s: dict[str, float] | None = None   # BUBBLE_PARTS; fill + drain + imbalance = bubble_s
    host_memory_bytes: float | None = None   # one GPU's offloaded activations and optimizer state in host memory


@dataclass(frozen=True)
class Result:
    """Everything one simulated (or memory-only) step says, in SI units."""

    scenario: str
    gpus: int
    microbatches: int
    params_total: int
    capacity_bytes: float
    fits_in_memory: bool
    peak_memory_bytes_max: float
    devices: tuple[DeviceResult, ...]
    stages: tuple[StageSummary, ...]
    warnings: tuple[str, ...] = ()
    advice: tuple[str, ...] = ()
    # set by the engine (absent for `simtrain memory`)
    step_time_s: float | None = None
    tokens_per_s: float | None = None
    mfu: float | None = None
    hfu: float | None = None
    mfu_fp8: float | None = None   # fp8 training: model FLOP over the FP8 (or MXFP8) peak; MFU stays over BF16
    bubble_fraction: float | None = None
    exposed_comm_s: dict[str, float] | None = None
    bubble_breakdown_s: dict[str, float] | None = None   # BUBBLE_PARTS, mean over the stages
    framework_overhead_s: float = 0.0   # inside compute: FSDP1's fixed cost per layer and micro-batch, critical GPU
    step_time_band_s: tuple[float, float] | None = None   # from validated runs like this one (report.bands)
    step_time_band: dict | None = None  # what the band rests on: basis, cases, error range; or why there is none
    events: int | None = None
    fidelity: str | None = None
    config: dict = field(default_factory=dict)
    timeline: Any = field(default=None, compare=False, repr=False)   # records for charts; not in JSON

    # --- in a notebook (simtrain.report.notebook) ---------------------------------------------------------
    def __repr__(self) -> str:
        """One line (the devices and the timeline run to megabytes)."""
        from simtrain.report.notebook import result_repr

        return result_repr(self)

    def _repr_html_(self) -> str:
        from simtrain.report.notebook import result_html

        return result_html(self)

    def summary(self) -> str:
        """The text report of `simtrain run` (of `simtrain memory` for a memory-only result)."""
        from simtrain.report.text import memory_text, run_text

        return memory_text(self) if self.step_time_s is None else run_text(self)

    def stages_frame(self):
        """One row per pipeline stage (a pandas DataFrame; SI units)."""
        from simtrain.report.notebook import stages_frame

        return stages_frame(self)

    def devices_frame(self):
        """One row per GPU, or per class of GPUs at scale (a pandas DataFrame; SI units)."""
        from simtrain.report.notebook import devices_frame

        return devices_frame(self)

    def gantt(self):
        """The Gantt chart of the step (a plotly Figure; `simtrain run --gantt` writes it)."""
        if self.timeline is None:
            raise ValueError("a memory-only result has no timeline to draw: simtrain.simulate(...) gives one")
        from simtrain.report.charts import gantt_figure

        return gantt_figure(self)

    def memory_figure(self):
        """Allocated memory over the step, per stage (a plotly Figure; `simtrain run --memory-plot`)."""
        if self.timeline is None:
            raise ValueError("a memory-only result has no timeline to draw: simtrain.simulate(...) gives one")
        from simtrain.report.charts import memory_figure

        return memory_figure(self)

    @property
    def memory_capacity_bytes(self) -> float:
        """The GPU's memory, under the name the JSON report gives it (``capacity_bytes``)."""
        return self.capacity_bytes

    def to_dict(self, *, timeline: bool = True) -> dict[str, Any]:
        """The JSON report. ``timeline=True`` embeds the simulated records (for `simtrain plot`)."""
        out: dict[str, Any] = {"scenario": self.scenario, "gpus": self.gpus, "microbatches": self.microbatches,
                               "params_total": self.params_total}
        if self.step_time_s is not None:
            out.update({
                "step_time_s": report_float(self.step_time_s), "tokens_per_s": report_float(self.tokens_per_s),
                "mfu": report_float(self.mfu),
                "hfu": report_float(self.hfu),
                **({"mfu_fp8": report_float(self.mfu_fp8)} if self.mfu_fp8 is not None else {}),
                "bubble_fraction": report_float(self.bubble_fraction),
                "exposed_comm_s": {k: report_float(v) for k, v in self.exposed_comm_s.items()},
                "bubble_breakdown_s": {k: report_float(v) for k, v in (self.bubble_breakdown_s or {}).items()},
                "framework_overhead_s": report_float(self.framework_overhead_s),
                "step_time_band_s": (None if self.step_time_band_s is None
                                     else [report_float(x) for x in self.step_time_band_s]),
                "step_time_band": copy.deepcopy(self.step_time_band),
                "fidelity": self.fidelity, "events": self.events})
        out.update({
            "fits_in_memory": self.fits_in_memory, "peak_memory_bytes_max": round(self.peak_memory_bytes_max),
            "memory_capacity_bytes": round(self.capacity_bytes),
            "config": copy.deepcopy(self.config),     # the caller's to change, not this result's
            "stages": [_stage_dict(s) for s in self.stages],
            "devices": [d.to_dict() for d in self.devices],
            "warnings": list(self.warnings), "advice": list(self.advice)})
        if timeline and self.timeline is not None:
            from simtrain.report.timeline import timeline_dict

            out["timeline"] = timeline_dict(self)
        return out


def _stage_dict(s: StageSummary) -> dict[str, Any]:
    out: dict[str, Any] = {"pp": s.pp, "layers": s.layers}
    if s.compute_s is not None:
        out.update(compute_s=report_float(s.compute_s), bubble_s=report_float(s.bubble_s))
    if s.exposed_comm_s is not None:
        out["exposed_comm_s"] = {k: report_float(v) for k, v in s.exposed_comm_s.items()}
    if s.bubble_breakdown_s is not None:
        out["bubble_breakdown_s"] = {k: report_float(v) for k, v in s.bubble_breakdown_s.items()}
    out.update({"peak_memory_bytes": round(s.peak_memory_bytes), "memory": {k: round(v) for k, v in s.memory.items()}})
    if s.other_detail is not None:
        out["other_detail"] = {k: round(v) for k, v in s.other_detail.items()}
    if s.experts:
        out["experts"] = {k: round(v) for k, v in s.experts.items()}
    if s.host_memory_bytes:
        out["host_memory_bytes"] = round(s.host_memory_bytes)
    return out


def _compress(ranks: tuple[int, ...]) -> list:
    """[0,1,2,3,8,9] -> ['0-3', '8-9'] style ranges, to keep reports small at scale."""
    out: list = []
    start = prev = None
    for r in ranks:
        if start is None:
            start = prev = r
        elif r == prev + 1:
            prev = r
        else:
            out.append(f"{start}-{prev}" if prev != start else start)
            start = prev = r
    if start is not None:
        out.append(f"{start}-{prev}" if prev != start else start)
    return out
