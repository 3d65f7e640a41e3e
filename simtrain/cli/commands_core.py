"""`simtrain run`, `simtrain memory` and `simtrain plot`."""

from __future__ import annotations

import click

from simtrain.cli import cli
from simtrain.io import write_json
from simtrain.scenario import load_scenario, parse_set


def _load(scenario: str, sets: tuple[str, ...], full: bool = False):
    overrides = parse_set(list(sets))
    if full:
        overrides["simulation.fidelity"] = "full"
    return load_scenario(scenario, overrides)


@cli.command()
@click.argument("scenario", type=click.Path(dir_okay=False))
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", help="override a scenario key, e.g. parallel.pp=8")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), help="write the JSON report here")
def memory(scenario: str, sets: tuple[str, ...], json_path: str | None) -> None:
    """Does SCENARIO fit in GPU memory, and what eats the memory?"""
    from simtrain.simulation import memory as memory_of
    from simtrain.textreport import memory_text

    result = memory_of(_load(scenario, sets))
    if json_path:
        write_json(json_path, result.to_dict())
    click.echo(memory_text(result), nl=False)


@cli.command()
@click.argument("scenario", type=click.Path(dir_okay=False))
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", help="override a scenario key, e.g. parallel.pp=8")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), help="write the JSON report here")
@click.option("--gantt", "gantt_path", type=click.Path(dir_okay=False), help="write the Gantt chart (HTML) here")
@click.option("--memory-plot", "memory_path", type=click.Path(dir_okay=False), help="write the memory timeline (HTML)")
@click.option("--trace", "trace_path", type=click.Path(dir_okay=False), help="write a Perfetto/Chrome trace (JSON)")
@click.option("--full", is_flag=True, help="simulate every rank (simulation.fidelity: full)")
@click.option("--samples", type=click.IntRange(min=1), default=1, show_default=True,
              help="with jitter: run this many seeds and report mean, P50, P95 step time")
def run(scenario: str, sets: tuple[str, ...], json_path: str | None, gantt_path: str | None,
        memory_path: str | None, trace_path: str | None, full: bool, samples: int) -> None:
    """Simulate one optimizer step of SCENARIO and report it."""
    from simtrain.simulation import simulate
    from simtrain.textreport import run_text

    sc = _load(scenario, sets, full)
    result = simulate(sc)
    report = result.to_dict()
    extra = ""
    if samples > 1:
        from simtrain.variation import sample_step_times

        stats = sample_step_times(sc, samples)
        report["step_time_samples"] = stats
        extra = (f"step time over {samples} seeds: mean {stats['mean_s'] * 1e3:.2f} ms, "
                 f"P50 {stats['p50_s'] * 1e3:.2f} ms, P95 {stats['p95_s'] * 1e3:.2f} ms\n")
    if json_path:
        write_json(json_path, report)
    if gantt_path or memory_path or trace_path:
        from simtrain import charts

        charts.write_outputs(result, gantt=gantt_path, memory=memory_path, trace=trace_path)
    click.echo(run_text(result) + extra, nl=False)


@cli.command()
@click.argument("report", type=click.Path(dir_okay=False))
@click.option("--gantt", "gantt_path", type=click.Path(dir_okay=False), help="write the Gantt chart (HTML) here")
@click.option("--memory-plot", "memory_path", type=click.Path(dir_okay=False), help="write the memory timeline (HTML)")
def plot(report: str, gantt_path: str | None, memory_path: str | None) -> None:
    """Draw charts from a saved `simtrain run --json` REPORT (it must include the timeline)."""
    from simtrain import charts

    charts.plot_saved(report, gantt=gantt_path, memory=memory_path)
