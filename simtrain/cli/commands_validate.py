"""`simtrain validate`: measured vs predicted on published training runs."""

from __future__ import annotations

import sys

import click

from simtrain.cli.app import JSON_HELP, OutPath, cli, distinct_outputs, emit, outputs_apart_from_inputs
from simtrain.report.outputs import staged_outputs, write_json
from simtrain.spec.errors import InputError, one_line


def _digits(x: float, limit: float) -> int:
    """One decimal, or as many more as it takes for a value beside a target not to print as the target
    (10.03% is not '10.0%', 10.004% not '10.00%')."""
    digits = 1
    while digits < 6 and abs(x) != limit and round(100 * abs(x), digits) == round(100 * limit, digits):
        digits += 1
    return digits


def _pct(x: float | None) -> str:
    from simtrain.decide.validate import TARGET_WORST

    return "   -   " if x is None else f"{100 * x:+6.{_digits(x, TARGET_WORST)}f}%"


def _summary_text(s, v) -> str:
    mean_digits, worst_digits = _digits(s.mean_abs_error, v.TARGET_MEAN), _digits(s.worst_abs_error, v.TARGET_WORST)
    return (f"{s.cases} case{'s' if s.cases != 1 else ''}, mean |error| {100 * s.mean_abs_error:.{mean_digits}f}%, "
            f"worst {100 * s.worst_abs_error:.{worst_digits}f}% ({s.worst_case}), bias {100 * s.bias:+.1f}% "
            f"({'predicts too fast' if s.bias < 0 else 'predicts too slow'}), {s.within_10pct}/{s.cases} within 10%")


def _group_lines(title: str, groups: dict, v) -> list[str]:
    """A table of summaries: cases, mean, worst, bias, within 10%, and whether the per-source targets hold."""
    if not groups:
        return []
    width = max(len(name) for name in groups)
    out = [title + ":", f"  {'':<{width}} {'cases':>5} {'mean':>7} {'worst':>7} {'bias':>7} {'<=10%':>6}  targets"]
    for name, s in groups.items():
        verdict = "met" if s.meets_targets else "NOT met"
        out.append(f"  {name:<{width}} {s.cases:>5} {100 * s.mean_abs_error:>6.1f}% {100 * s.worst_abs_error:>6.1f}% "
                   f"{100 * s.bias:>+6.1f}% {100 * s.within_fraction:>5.0f}%  {verdict}")
    return out


@cli.command()
@click.argument("cases", required=False, type=click.Path(dir_okay=False))
@click.option("--json", "json_path", type=click.Path(dir_okay=False),
              help="per-case results and summaries: " + JSON_HELP)
@click.option("--plot", "plot_path", type=OutPath("HTML"),
              help="write predicted vs measured step times (log-log, one colour per source) as an HTML chart")
@click.option("--only", help="run only cases whose id contains this text (case-sensitive; matching none is an error)")
@click.option("--check", is_flag=True, help="exit 1 if the gated cases miss the per-source targets (mean 5%, 90% "
                                            "within 10%, six sources, none above 40% of the cases), with one line "
                                            "on stderr naming what fails")
def validate(cases: str | None, json_path: str | None, plot_path: str | None, only: str | None,
             check: bool) -> None:
    """Compare predicted and measured step times on published runs.

    CASES is a cases file, or the name of a bundled one; without it, every bundled file of the dev set runs (the
    set the targets apply to: all bundled files but the companions llm_foundry_a100, the A100 companion of
    MosaicML's H100 runs, and llm_foundry_sweeps, MosaicML's A100 micro-batch sweep and software-image runs).
    Figures are given per source and per GPU family; `simtrain validate NAME` runs one bundled file (the names
    are listed when a name is unknown)."""
    from simtrain.decide import validate as v
    from simtrain.decide.cases import dev_case_files, resolve_cases

    distinct_outputs(json=json_path, plot=plot_path)
    inputs = [str(p) for p in (dev_case_files().values() if cases is None else [resolve_cases(cases)])]
    outputs_apart_from_inputs(inputs, json=json_path, plot=plot_path)
    bar = None
    if sys.stderr.isatty():
        from tqdm import tqdm

        bar = tqdm(desc="cases", unit="case", file=sys.stderr, leave=False)
    try:
        results = v.validate(cases, only=only, progress=(bar.update if bar else None))
    except InputError as err:     # the Python API names its argument (only=); here it is the option
        if err.message.startswith("only="):
            err.message = "--only " + err.message.removeprefix("only=")
        raise
    if bar:
        bar.close()
    lines = [f"{'case':<40} {'gate':<4} {'measured':>10} {'predicted':>10} {'error':>8}  configuration"]
    for r in results:
        pred = "failed" if r.predicted_step_time_s is None else f"{r.predicted_step_time_s:.3f} s"
        lines.append(f"{r.id[:40]:<40} {'yes' if r.gate else 'no':<4} {r.target_step_time_s:>8.3f} s {pred:>10} "
                     f"{_pct(r.error):>8}  {r.config}")
        extras = []
        for key in ("tokens_per_s_per_gpu", "mfu", "tflops_per_gpu", "memory_GiB"):
            if key in r.measured and key in r.predicted:
                extras.append(f"{key} {r.measured[key]:.4g} vs {r.predicted[key]:.4g}")
        if extras:
            lines.append(f"{'':<46}measured vs predicted: " + "; ".join(extras))
        if r.assumed:
            lines.append(f"{'':<46}assumed by the case (not stated by the source): {', '.join(r.assumed)}")
        peak, cap = r.predicted.get("peak_memory_GB"), r.predicted.get("memory_capacity_GB")
        # a run whose memory was measured is compared above, on its own GPU, which may differ from the file's
        if peak is not None and cap and peak > cap and "memory_GiB" not in r.measured:
            lines.append(f"{'':<46}memory: simtrain's peak {peak:.1f} GB is {100 * peak / cap:.1f}% of the GPU's "
                         f"{cap:.1f} GB, yet the measured run fit: the memory ledger overestimates this case")
        if r.failure:
            lines.append(f"{'':<46}could not simulate: {r.failure}")
    lines.append("")
    gated = [r for r in results if r.gate]
    summaries = {"gated": v.summarize(gated), "all": v.summarize(results)}
    for name, s in summaries.items():
        if s is not None:
            lines.append(f"{name:>5}: {_summary_text(s, v)}")
    ratios = v.speedups(results)
    if ratios:
        lines += ["", f"{'speed-up':<40} {'over':<28} {'measured':>8} {'predicted':>9} {'error':>8}"]
        lines += [f"{q.case[:40]:<40} {q.baseline[:28]:<28} {q.measured:>8.3f} {q.predicted:>9.3f} {_pct(q.error):>8}"
                  for q in ratios]
        errors = [abs(q.error) for q in ratios]
        lines.append(f"speed-ups: {len(ratios)}, mean |error| {100 * sum(errors) / len(errors):.1f}%, worst "
                     f"{100 * max(errors):.1f}%")
    by_source = v.by_group(gated, lambda r: r.source_name)
    by_gpu = v.by_group(gated, lambda r: r.gpu or "?")
    all_by_source = v.by_group(results, lambda r: r.source_name)
    lines += _group_lines("per source (gated cases)", by_source, v)
    lines += _group_lines("per GPU family (gated cases)", by_gpu, v)
    lines += _group_lines("per source (all cases, gated or not; informational)", all_by_source, v)
    targets = v.check_targets(results)
    met = targets.met
    dev_set = cases is None
    if targets.sources and dev_set:
        lines.append(
            f"targets (gated, per source): mean <= {100 * v.TARGET_MEAN:.0f}% and >= {100 * v.TARGET_WITHIN:.0f}% "
            f"within {100 * v.TARGET_WORST:.0f}% on each of >= {v.TARGET_SOURCES} sources, none above "
            f"{100 * v.TARGET_SHARE:.0f}% of the cases: {'met' if met else 'NOT met'} ({len(targets.sources_met)} of "
            f"{len(targets.sources)} sources meet theirs; the largest, {targets.largest_source}, holds "
            f"{100 * targets.largest_share:.0f}%)")
    elif targets.sources:   # one file: only the per-source part of the targets means anything
        each = len(targets.sources_met) == len(targets.sources)
        lines.append(f"per-source targets (gated): mean <= {100 * v.TARGET_MEAN:.0f}% and >= "
                     f"{100 * v.TARGET_WITHIN:.0f}% within {100 * v.TARGET_WORST:.0f}%: {'met' if each else 'NOT met'} "
                     "(informational here: the targets are the bundled dev set's, `simtrain validate` without CASES)")
    case_rows = [r.to_dict() for r in results]
    report = {"cases": case_rows,
              "summary": {k: (s.to_dict() if s else None) for k, s in summaries.items()},
              "by_source": {k: s.to_dict() for k, s in by_source.items()},
              "by_gpu": {k: s.to_dict() for k, s in by_gpu.items()},
              "by_source_all": {k: s.to_dict() for k, s in all_by_source.items()},
              "targets": targets.to_dict(),
              **({"speedups": [q.to_dict() for q in ratios]} if ratios else {})}
    with staged_outputs():   # the chart and the JSON land together
        if plot_path:
            from simtrain.report.charts import write_figure
            from simtrain.report.charts_validation import validation_figure

            write_figure(plot_path, "simtrain validate", [validation_figure(case_rows)])
            lines.append(f"wrote {plot_path}")
        if json_path and json_path != "-":
            write_json(json_path, report)
    emit("\n".join(lines) + "\n", json_path if json_path == "-" else None, report)
    failed = [r for r in results if r.failure]
    if failed:   # a case simtrain refuses is bad input in the cases file: the report above, then exit 2
        raise InputError(f"{len(failed)} of {len(results)} cases could not be simulated (listed above); the first, "
                         f"{failed[0].id}: {failed[0].failure}")
    if check and not met:   # the report may call a single file's targets met: say here what fails
        click.echo(one_line(f"--check: targets not met, exit 1: {'; '.join(targets.misses)}"), err=True)
        sys.exit(1)
