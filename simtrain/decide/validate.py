"""Predictions checked against published, measured training runs (`simtrain validate`).

A cases file is a list of published runs, each a scenario in simtrain's own
schema plus what the source measured, the source's FLOP convention and the
step time that measurement implies (``target_step_time_s``). Cases marked
``gate: false`` have settings the source does not state (listed under
``assumed``); they are reported but do not count towards the targets.

The dev set is every bundled cases file but the companions (:data:`cases.COMPANIONS`: the same source's runs on
other GPUs and software images, informational). Its figures are reported per source and per GPU family, and the
targets hold per source (issue "Fidelity that holds beyond one source"): mean |step-time error| <= 5% and at least
90% of the gated cases within 10% (the worst case is reported as well: a source's own run-to-run spread can defeat
a worst-case target), on at least :data:`TARGET_SOURCES` sources, none holding more than 40% of the gated cases.
One hardware file per GPU type is shared by all cases.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from simtrain.decide.cases import dev_case_files, load_cases, resolve_cases
from simtrain.report.bands import gpu_family, scenario_stack
from simtrain.spec.errors import InputError, display_path
from simtrain.spec.scenario import scenario_from_dict

TARGET_MEAN = 0.05          # mean |error| per source
TARGET_WORST = 0.10         # the error a case should stay within
TARGET_WITHIN = 0.90        # fraction of a source's gated cases within TARGET_WORST
TARGET_SOURCES = 6          # independent sources with gated cases
TARGET_SHARE = 0.40         # the most gated cases one source may hold


@dataclass(frozen=True)
class CaseResult:
    id: str
    source: str
    gate: bool
    config: str
    target_step_time_s: float
    predicted_step_time_s: float | None
    error: float | None                    # predicted / measured - 1
    measured: dict = field(default_factory=dict)
    predicted: dict = field(default_factory=dict)
    assumed: tuple[str, ...] = ()
    notes: str = ""
    failure: str | None = None
    compare_to: str | None = None          # the id of a case this one's speed-up is measured against
    gpu: str = ""                          # GPU family of the case's hardware (H100, A100, B200...)
    stack: str = ""                        # the stack its layout stands for (simtrain.report.bands.stack_of)
    file: str = ""                         # the cases file it came from (bundled: its name, e.g. cases)

    @property
    def source_name(self) -> str:
        return source_name(self.source)

    def to_dict(self) -> dict[str, Any]:
        r = lambda x: None if x is None else float(f"{x:.6g}")  # noqa: E731
        return {"id": self.id, "source": self.source, "gate": self.gate, "config": self.config,
                "target_step_time_s": r(self.target_step_time_s),
                "predicted_step_time_s": r(self.predicted_step_time_s), "error": r(self.error),
                "measured": self.measured, "predicted": {k: r(v) for k, v in self.predicted.items()},
                "assumed": list(self.assumed), "notes": self.notes, "failure": self.failure,
                "source_name": self.source_name, "gpu": self.gpu, "stack": self.stack, "file": self.file,
                **({"compare_to": self.compare_to} if self.compare_to else {})}


@dataclass(frozen=True)
class Summary:
    cases: int
    mean_abs_error: float
    worst_abs_error: float
    worst_case: str
    bias: float                            # mean signed error: < 0 means simtrain predicts too fast
    within_10pct: int

    @property
    def within_fraction(self) -> float:
        return self.within_10pct / self.cases

    @property
    def meets_targets(self) -> bool:
        """Mean |error| <= 5% and >= 90% of the cases within 10% (the per-source targets)."""
        return self.mean_abs_error <= TARGET_MEAN and self.within_fraction >= TARGET_WITHIN

    def to_dict(self) -> dict[str, Any]:
        return {"cases": self.cases, "mean_abs_error": round(self.mean_abs_error, 6),
                "worst_abs_error": round(self.worst_abs_error, 6), "worst_case": self.worst_case,
                "bias": round(self.bias, 6), "within_10pct": self.within_10pct,
                "meets_targets": self.meets_targets}


def summarize(results: list[CaseResult]) -> Summary | None:
    ok = [c for c in results if c.error is not None]
    if not ok:
        return None
    errs = np.array([c.error for c in ok])
    worst = max(ok, key=lambda c: abs(c.error))
    return Summary(cases=len(ok), mean_abs_error=float(np.mean(np.abs(errs))),
                   worst_abs_error=float(abs(worst.error)), worst_case=worst.id, bias=float(np.mean(errs)),
                   within_10pct=int(np.sum(np.abs(errs) <= 0.10)))


def source_name(source: str) -> str:
    """The source a case cites, without its commit, table or section: 'Narayanan et al. 2021 (SC21)' for both of
    that paper's tables; 'mosaicml/llm-foundry scripts/train/benchmarking/README.md' for the MosaicML runs."""
    return source.split(" @")[0].split(",")[0].strip()


def by_group(results: list[CaseResult], key) -> dict[str, Summary]:
    """Summaries of ``results`` grouped by ``key(result)`` (a source, a GPU family), in name order."""
    groups: dict[str, list[CaseResult]] = {}
    for r in results:
        groups.setdefault(key(r), []).append(r)
    out = {}
    for name in sorted(groups):
        s = summarize(groups[name])
        if s is not None:
            out[name] = s
    return out


@dataclass(frozen=True)
class TargetCheck:
    """The per-source targets over the gated cases: each source's mean and share within 10%, enough sources, and
    no source dominating."""

    sources: dict[str, Summary]            # gated summaries per source
    largest_share: float                   # the largest source's fraction of the gated cases
    largest_source: str

    @property
    def sources_met(self) -> list[str]:
        return [name for name, s in self.sources.items() if s.meets_targets]

    @property
    def met(self) -> bool:
        return (len(self.sources) >= TARGET_SOURCES and len(self.sources_met) == len(self.sources)
                and self.largest_share <= TARGET_SHARE)

    @property
    def misses(self) -> list[str]:
        """What keeps the targets from being met, one clause per missed part (none when they are met)."""
        out = []
        n = len(self.sources)
        if n < TARGET_SOURCES:
            out.append(f"the gated cases come from {n} source{'' if n == 1 else 's'}, where the targets need "
                       f"{TARGET_SOURCES}")
        if len(self.sources_met) < n:
            out.append(f"mean <= {100 * TARGET_MEAN:.0f}% and >= {100 * TARGET_WITHIN:.0f}% within "
                       f"{100 * TARGET_WORST:.0f}% hold on {len(self.sources_met)} of the {n} source"
                       f"{'' if n == 1 else 's'}")
        if self.largest_share > TARGET_SHARE:
            out.append(f"{self.largest_source} holds {100 * self.largest_share:.0f}% of the gated cases, where at "
                       f"most {100 * TARGET_SHARE:.0f}% is allowed")
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"mean": TARGET_MEAN, "within_10pct_fraction": TARGET_WITHIN, "worst": TARGET_WORST,
                "sources_needed": TARGET_SOURCES, "largest_share_allowed": TARGET_SHARE,
                "sources": len(self.sources), "sources_met": self.sources_met,
                "largest_source": self.largest_source, "largest_share": round(self.largest_share, 6),
                "met": self.met}


def check_targets(results: list[CaseResult]) -> TargetCheck:
    """The per-source targets over the gated cases of ``results`` (none gated: no source, not met)."""
    gated = [r for r in results if r.gate and r.error is not None]
    if not gated:
        return TargetCheck(sources={}, largest_share=0.0, largest_source="")
    per_source = by_group(gated, lambda r: r.source_name)
    largest = max(per_source, key=lambda name: (per_source[name].cases, name))
    return TargetCheck(sources=per_source, largest_share=per_source[largest].cases / len(gated),
                       largest_source=largest)


def error_table(results: list[CaseResult]) -> dict[str, Any]:
    """The gated cases' errors as simtrain/validation/errors.json keeps them for the bands of `simtrain run`
    (every bundled file's: the dev set's and the companions')."""
    rows = [{"id": r.id, "file": r.file, "source": r.source_name, "gpu": r.gpu, "stack": r.stack,
             "error": round(r.error, 6)}
            for r in results if r.gate and r.error is not None]
    return {"note": "gated cases' errors (predicted / measured - 1) written by "
                    "tests/data/regenerate_validation_errors.py; read by simtrain.report.bands",
            "cases": sorted(rows, key=lambda row: row["id"])}


def _config(sc: dict) -> str:
    p, t = sc.get("parallel", {}), sc.get("training", {})
    m = sc.get("model")
    model = m if isinstance(m, str) else f"L{m.get('layers')} h{m.get('hidden')}"
    return (f"{sc.get('hardware')} x{sc.get('nodes', 1)} {model} s{t.get('seq_len')} gb{t.get('global_batch')} "
            f"mb{t.get('micro_batch', 1)} dp{p.get('dp', 1)} tp{p.get('tp', 1)} pp{p.get('pp', 1)}"
            f"{' cp' + str(p['cp']) if p.get('cp', 1) > 1 else ''}"
            f"{'v' + str(p.get('vpp')) if p.get('vpp', 1) > 1 else ''} z{p.get('zero', 0)}"
            f"{'/' + p['backward_prefetch'] if p.get('backward_prefetch', 'pre') != 'pre' else ''}"
            f"{'/' + p['zero_impl'] if p.get('zero_impl', 'generic') != 'generic' else ''}"
            f" rc={t.get('recompute', 'none')}"
            + _attention(t.get("flash_attention", True))
            + (f" ce={t['cross_entropy']}" if t.get("cross_entropy", "eager") != "eager" else "")
            + (f" kernels={t['layer_kernels']}" if t.get("layer_kernels", "fused") != "fused" else "")
            + (" nodrop" if t.get("dropout", True) is False else "")
            + (f" grad={t['grad_dtype']}" if t.get("grad_dtype", "auto") != "auto" else "")
            + (f" acc={t['grad_accumulation']}" if t.get("grad_accumulation", "fused") != "fused" else "")
            + (f" metrics={t['train_metrics']}" if t.get("train_metrics", 0) else ""))


def _attention(flash: object) -> str:
    """' attn=flash1' etc. when a case does not run the default kernel (FlashAttention-2)."""
    if flash is True or flash == "flash2":
        return ""
    return " attn=none" if flash is False else f" attn={flash}"


def run_case(case: dict, base_dir: Path, file: str | None = None, file_name: str = "") -> CaseResult:
    """One case simulated; a scenario simtrain refuses becomes the result's ``failure``, located in ``file``."""
    from simtrain.engine.simulation import simulate
    from simtrain.spec.yamlio import LineDict

    sc = case["scenario"]
    if isinstance(sc, LineDict):     # keep the lines of its keys, so that a refusal names them
        named = LineDict(sc)
        named.key_lines, named.line = dict(sc.key_lines), sc.line
        sc = named
    else:
        sc = dict(sc)
    sc.setdefault("name", case["id"])
    measured = dict(case.get("measured") or {})
    target = float(case["target_step_time_s"])
    common = dict(id=case["id"], source=str(case.get("source", "")), gate=bool(case.get("gate", True)),
                  config=_config(sc), target_step_time_s=target, measured=measured,
                  assumed=tuple(case.get("assumed") or ()), notes=str(case.get("notes", "") or ""),
                  file=file_name,
                  compare_to=str(case["compare_to"]) if case.get("compare_to") else None)
    try:
        scenario = scenario_from_dict(sc, file=file, base_dir=base_dir)
        result = simulate(scenario)
    except InputError as err:
        return CaseResult(predicted_step_time_s=None, error=None, failure=str(err), **common)
    common["gpu"] = gpu_family(scenario.hardware.gpu.name)
    common["stack"] = scenario_stack(scenario)
    step = result.step_time_s
    predicted: dict[str, float] = {"mfu_simtrain": result.mfu, "peak_memory_GB": result.peak_memory_bytes_max / 1e9,
                                   "memory_capacity_GB": scenario.hardware.gpu.memory / 1e9}
    gpus = scenario.gpus
    if "tokens_per_s_per_gpu" in measured:
        predicted["tokens_per_s_per_gpu"] = scenario.tokens_per_step / (gpus * step)
    if "mfu" in measured:   # the source's own convention, scaled by the step-time ratio
        predicted["mfu"] = measured["mfu"] * target / step
    if "tflops_per_gpu" in measured:
        predicted["tflops_per_gpu"] = measured["tflops_per_gpu"] * target / step
    if "memory_GiB" in measured:
        predicted["memory_GiB"] = result.peak_memory_bytes_max / 2**30
    return CaseResult(predicted_step_time_s=step, error=step / target - 1.0, predicted=predicted, **common)


@dataclass(frozen=True)
class Ratio:
    """A case's speed-up over the case it names in ``compare_to`` (the same run under another schedule, say):
    measured and predicted, and the error of the prediction (predicted / measured - 1)."""

    case: str
    baseline: str
    measured: float
    predicted: float

    @property
    def error(self) -> float:
        return self.predicted / self.measured - 1.0

    def to_dict(self) -> dict[str, Any]:
        r = lambda x: float(f"{x:.6g}")  # noqa: E731
        return {"case": self.case, "baseline": self.baseline, "measured_speedup": r(self.measured),
                "predicted_speedup": r(self.predicted), "error": r(self.error)}


def speedups(results: list[CaseResult]) -> list[Ratio]:
    """Each case's speed-up over its ``compare_to`` case (baseline step / case step), when both ran."""
    by_id = {r.id: r for r in results}
    out = []
    for r in results:
        base = by_id.get(r.compare_to) if r.compare_to else None
        if base is None or r.predicted_step_time_s is None or base.predicted_step_time_s is None:
            continue
        out.append(Ratio(case=r.id, baseline=base.id, measured=base.target_step_time_s / r.target_step_time_s,
                         predicted=base.predicted_step_time_s / r.predicted_step_time_s))
    return out


def _no_case_matches(only: str, cases: list[dict]) -> str:
    """Why ``only`` picked nothing: the rule, the ids there are (grouped by their first two words), a sample."""
    ids = [str(c["id"]) for c in cases]
    groups: dict[str, int] = {}
    for case_id in ids:
        words = case_id.split("_")
        head = "_".join(words[:2]) + ("_" if len(words) > 2 else "")
        groups[head] = groups.get(head, 0) + 1
    other_case = sum(only.casefold() in case_id.casefold() for case_id in ids)
    hint = f"; {other_case} ids contain it in another letter case" if other_case else ""
    return (f"only={only!r} matches no case (it keeps the cases whose id contains that text, case-sensitive{hint}); "
            f"the {len(ids)} ids begin " + ", ".join(f"{head} ({n})" for head, n in sorted(groups.items()))
            + (f", e.g. {ids[0]}" if ids else ""))


def validate(path: str | Path | None = None, *, only: str | None = None, progress=None) -> list[CaseResult]:
    """Run the cases of ``path`` (default: every file of the bundled dev set, :func:`dev_case_files`) whose id
    contains ``only``; an ``only`` that no id contains is an InputError listing the ids there are."""
    _check_arguments(path, only)
    paths = list(dev_case_files().values()) if path is None else [resolve_cases(path)]
    loaded = [(p, *load_cases(p)) for p in paths]
    everything = [case for _, cases, _ in loaded for case in cases]
    first_file: dict[str, Path] = {}
    for p, cases, _ in loaded:
        for case in cases:
            other = first_file.setdefault(str(case["id"]), p)
            if other != p:
                raise InputError(f"case id {case['id']!r} is given in {display_path(other)} and again here; ids name "
                                 "the rows of the dev set's report", file=display_path(p), field="id")
    if only and not any(only in str(case["id"]) for case in everything):
        where = display_path(paths[0]) if len(paths) == 1 else f"the bundled dev set ({len(paths)} files)"
        raise InputError(_no_case_matches(only, everything), file=where)
    out = []
    for p, cases, base in loaded:
        file = display_path(p)
        for case in cases:
            if only and only not in str(case["id"]):
                continue
            out.append(run_case(case, base, file, file_name=p.stem))
            if progress:
                progress()
    return out


def _check_arguments(path: Any, only: Any) -> None:
    """A Python caller's arguments, named when of the wrong kind (validate(5) raised TypeError from os.fspath)."""
    if path is not None and not isinstance(path, (str, Path)):
        raise InputError(f"path={path!r}: give a cases file's path (or a bundled set's name), or leave it out for "
                         "the whole dev set", field="path")
    if only is not None and not isinstance(only, str):
        raise InputError(f"only={only!r}: give the text the case ids to run contain, e.g. 'llama2'", field="only")


def validate_frame(path: str | Path | None = None, *, only: str | None = None, progress: bool | None = None):
    """:func:`validate` as a DataFrame with fixed dtypes (:mod:`simtrain.decide.tables`), one row per case:
    id, source, gate, config, the measured and predicted step times, ``step_time_error`` (predicted / measured
    - 1), simtrain's peak memory, the measured one where the source gives it, and why a case failed. A progress
    bar (tqdm.auto) counts the cases."""
    from simtrain.decide.tables import frame_of
    from simtrain.decide.workers import progress_bar

    _check_arguments(path, only)
    paths = list(dev_case_files().values()) if path is None else [resolve_cases(path)]
    total = sum(1 for p in paths for c in load_cases(p)[0] if not only or only in str(c["id"]))
    with progress_bar(total, progress, "validate", unit="case") as bar:
        results = validate(path, only=only, progress=lambda: bar.update(1))
    rows = []
    for r in results:
        peak = r.predicted.get("peak_memory_GB")
        measured = r.measured.get("memory_GiB")
        rows.append({"id": r.id, "source": r.source, "source_name": r.source_name, "gpu": r.gpu, "file": r.file,
                     "gate": r.gate, "config": r.config,
                     "target_step_time_s": r.target_step_time_s, "predicted_step_time_s": r.predicted_step_time_s,
                     "step_time_error": r.error, "predicted_peak_memory_bytes": None if peak is None else peak * 1e9,
                     "measured_memory_bytes": None if measured is None else measured * 2**30, "failure": r.failure})
    frame = frame_of(rows, ["id", "source", "source_name", "gpu", "file", "gate", "config", "target_step_time_s",
                            "predicted_step_time_s",
                            "step_time_error", "predicted_peak_memory_bytes", "measured_memory_bytes", "failure"])
    gated = [r for r in results if r.gate]
    frame.attrs["summary"] = {k: (s.to_dict() if s else None)
                              for k, s in (("gated", summarize(gated)), ("all", summarize(results)))}
    frame.attrs["by_source"] = {k: s.to_dict() for k, s in by_group(gated, lambda r: r.source_name).items()}
    frame.attrs["by_gpu"] = {k: s.to_dict() for k, s in by_group(gated, lambda r: r.gpu or "?").items()}
    frame.attrs["targets"] = check_targets(results).to_dict()
    return frame
