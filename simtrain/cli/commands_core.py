"""`simtrain run`, `simtrain memory` and `simtrain plot`."""

from __future__ import annotations

import click

from simtrain.cli.app import (
    JSON_HELP,
    OutPath,
    cli,
    distinct_outputs,
    emit,
    outputs_apart_from_inputs,
    scenario_inputs,
)
from simtrain.report.outputs import staged_outputs, write_json
from simtrain.spec.scenario import load_scenario, parse_set


class _SampleCount(click.IntRange):
    """1 to 1,000 seeds (simtrain.engine.variation.MAX_SAMPLES, written out here so that loading the command line
    does not import the engine; tests/test_cli_exit.py checks they agree). Above it, one sentence with the reason
    in place of click's range message."""

    def __init__(self) -> None:
        super().__init__(min=1, max=1_000)

    def convert(self, value, param, ctx):
        samples = click.INT.convert(value, param, ctx)
        if samples > self.max:
            raise click.UsageError(f"--samples {samples:,} is more than {self.max:,} (each sample is a whole "
                                   "simulation; 1,000 seeds give the P95 within about 1%)", ctx)
        return super().convert(samples, param, ctx)


def _load(scenario: str, sets: tuple[str, ...], full: bool = False):
    overrides = parse_set(list(sets))
    if full:
        overrides["simulation.fidelity"] = "full"
    return load_scenario(scenario, overrides)


@cli.command()
@click.argument("scenario", type=click.Path(dir_okay=False))
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", help="override a scenario key, e.g. parallel.pp=8")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), help=JSON_HELP)
def memory(scenario: str, sets: tuple[str, ...], json_path: str | None) -> None:
    """Does SCENARIO fit in GPU memory, and what eats the memory?"""
    from simtrain.engine.simulation import memory as memory_of
    from simtrain.report.text import memory_text

    distinct_outputs(json=json_path)
    sc = _load(scenario, sets)
    outputs_apart_from_inputs(scenario_inputs(sc), json=json_path)
    result = memory_of(sc)
    emit(memory_text(result), json_path, result.to_dict())


@cli.command()
@click.argument("scenario", type=click.Path(dir_okay=False))
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", help="override a scenario key, e.g. parallel.pp=8")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), help=JSON_HELP)
@click.option("--gantt", "gantt_path", type=OutPath("HTML"), help="write the Gantt chart (HTML) here")
@click.option("--memory-plot", "memory_path", type=OutPath("HTML"), help="write the memory timeline (HTML)")
@click.option("--trace", "trace_path", type=OutPath("JSON"), help="write a Perfetto/Chrome trace (JSON)")
@click.option("--full", is_flag=True, help="simulate every rank (simulation.fidelity: full)")
@click.option("--samples", type=_SampleCount(), default=1, show_default=True,
              help="run this many seeds and report mean, P50, P95 step time; needs simulation.jitter > 0 "
                   "(e.g. --set simulation.jitter=0.05): without variation every seed gives the same step")
def run(scenario: str, sets: tuple[str, ...], json_path: str | None, gantt_path: str | None,
        memory_path: str | None, trace_path: str | None, full: bool, samples: int) -> None:
    """Simulate one optimizer step of SCENARIO and report it."""
    from simtrain.engine.simulation import simulate
    from simtrain.report.text import run_text

    distinct_outputs(json=json_path, gantt=gantt_path, memory_plot=memory_path, trace=trace_path)
    sc = _load(scenario, sets, full)
    outputs_apart_from_inputs(scenario_inputs(sc), json=json_path, gantt=gantt_path, memory_plot=memory_path,
                              trace=trace_path)
    if samples > 1 and not sc.simulation.jitter > 0:
        # only jitter draws from the seed (straggler ranks use simulation.seed), so the samples would be copies
        click.echo(f"warning: --samples {samples} without simulation.jitter: every seed simulates the same step; "
                   "add variation with e.g. --set simulation.jitter=0.05", err=True)
    result = simulate(sc)
    report = result.to_dict()
    extra = ""
    if samples > 1:
        from simtrain.engine.variation import sample_step_times

        stats = sample_step_times(sc, samples)
        report["step_time_samples"] = stats
        extra = (f"step time over {samples} seeds: mean {stats['mean_s'] * 1e3:.2f} ms, "
                 f"P50 {stats['p50_s'] * 1e3:.2f} ms, P95 {stats['p95_s'] * 1e3:.2f} ms\n")
    with staged_outputs():      # the report and its charts land together, or not at all
        if gantt_path or memory_path or trace_path:
            from simtrain.report import charts

            charts.write_outputs(result, gantt=gantt_path, memory=memory_path, trace=trace_path)
        if json_path and json_path != "-":
            write_json(json_path, report)
    # printed once the files are in place: a closed pipe on stdout must not take them back
    emit(run_text(result) + extra, json_path if json_path == "-" else None, report)


@cli.command()
@click.argument("report", type=click.Path(dir_okay=False))
@click.option("--gantt", "gantt_path", type=OutPath("HTML"), help="write the Gantt chart (HTML) here")
@click.option("--memory-plot", "memory_path", type=OutPath("HTML"), help="write the memory timeline (HTML)")
@click.option("--trace", "trace_path", type=OutPath("JSON"), help="write a Perfetto/Chrome trace (JSON)")
def plot(report: str, gantt_path: str | None, memory_path: str | None, trace_path: str | None) -> None:
    """Draw charts from a saved `simtrain run --json` REPORT (it must include the timeline)."""
    from pathlib import Path

    from simtrain.report import charts
    from simtrain.report.report_check import ReportError

    distinct_outputs(gantt=gantt_path, memory_plot=memory_path, trace=trace_path)
    outputs_apart_from_inputs([report], gantt=gantt_path, memory_plot=memory_path, trace=trace_path)
    try:
        with staged_outputs():
            charts.plot_saved(report, gantt=gantt_path, memory=memory_path, trace=trace_path)
    except ReportError as err:      # a damaged field found while drawing: name the report it is in
        raise err.located(file=str(Path(report))) from None
    click.echo("wrote " + " and ".join(path for path in (gantt_path, memory_path, trace_path) if path))


@cli.command(name="list")
def list_bundled() -> None:
    """What ships with simtrain: scenarios (run one by name: `simtrain run pp4_dp4`), hardware and models."""
    from simtrain.spec.bundled import hardware_names, model_names, scenario_names

    for title, names in (("scenarios", scenario_names()), ("hardware", hardware_names()), ("models", model_names())):
        click.echo(f"{title}: {', '.join(names)}")
