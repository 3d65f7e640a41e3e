"""`simtrain validate`: measured vs predicted on published training runs."""

from __future__ import annotations

import sys

import click

from simtrain.cli.app import JSON_HELP, cli, distinct_outputs, emit, outputs_apart_from_inputs


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


@cli.command()
@click.argument("cases", required=False, type=click.Path(dir_okay=False))
@click.option("--json", "json_path", type=click.Path(dir_okay=False),
              help="per-case results and summaries: " + JSON_HELP)
@click.option("--only", help="run only cases whose id contains this text (case-sensitive; matching none is an error)")
@click.option("--check", is_flag=True, help="exit 1 if the gated cases miss the targets (mean 5%, worst 10%)")
def validate(cases: str | None, json_path: str | None, only: str | None, check: bool) -> None:
    """Compare predicted and measured step times on published runs.

    CASES is a cases file, or the name of a bundled one: cases (the default, the dev set the targets apply
    to), llm_foundry_a100 (the A100 companion of its MosaicML H100 runs) or llm_foundry_sweeps (MosaicML's A100
    micro-batch sweep and software-image runs)."""
    from simtrain.decide import validate as v

    distinct_outputs(json=json_path)
    outputs_apart_from_inputs([str(v.resolve_cases(cases))], json=json_path)
    bar = None
    if sys.stderr.isatty():
        from tqdm import tqdm

        bar = tqdm(desc="cases", unit="case", file=sys.stderr, leave=False)
    results = v.validate(cases, only=only, progress=(bar.update if bar else None))
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
    sources = sorted({r.source.split(' @')[0].split(',')[0] for r in results})
    lines.append("sources: " + "; ".join(sources))
    gated = [r for r in results if r.gate]
    summaries = {"gated": v.summarize(gated), "all": v.summarize(results)}
    for name, s in summaries.items():
        if s is None:
            continue
        mean_digits, worst_digits = _digits(s.mean_abs_error, v.TARGET_MEAN), _digits(s.worst_abs_error, v.TARGET_WORST)
        lines.append(f"{name:>5}: {s.cases} case{'s' if s.cases != 1 else ''}, "
                     f"mean |error| {100 * s.mean_abs_error:.{mean_digits}f}%, worst "
                     f"{100 * s.worst_abs_error:.{worst_digits}f}% ({s.worst_case}), bias {100 * s.bias:+.1f}% "
                     f"({'predicts too fast' if s.bias < 0 else 'predicts too slow'}), "
                     f"{s.within_10pct}/{s.cases} within 10%")
    g = summaries["gated"]
    met = g is not None and g.mean_abs_error <= v.TARGET_MEAN and g.worst_abs_error <= v.TARGET_WORST
    dev_set = v.resolve_cases(cases).resolve() == v.bundled_cases_path().resolve()
    lines.append(f"targets (gated): mean <= {100 * v.TARGET_MEAN:.0f}%, worst <= {100 * v.TARGET_WORST:.0f}%: "
                 f"{'met' if met else 'NOT met'}"
                 + ("" if dev_set else " (informational here: the targets are the bundled dev set's, "
                                       "`simtrain validate` without CASES)"))
    emit("\n".join(lines) + "\n", json_path,
         {"cases": [r.to_dict() for r in results],
          "summary": {k: (s.to_dict() if s else None) for k, s in summaries.items()},
          "targets": {"mean": v.TARGET_MEAN, "worst": v.TARGET_WORST, "met": met}})
    failed = [r for r in results if r.failure]
    if failed:   # a case simtrain refuses is bad input in the cases file: the report above, then exit 2
        from simtrain.spec.errors import InputError

        raise InputError(f"{len(failed)} of {len(results)} cases could not be simulated (listed above); the first, "
                         f"{failed[0].id}: {failed[0].failure}")
    if check and not met:
        sys.exit(1)
