"""`simtrain sweep`, `simtrain search` and `simtrain compare`: thin shells over
:mod:`simtrain.decide.sweep`, :mod:`simtrain.decide.search` and :mod:`simtrain.decide.compare`."""

from __future__ import annotations

from typing import Any

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
from simtrain.spec.errors import InputError, short_repr
from simtrain.spec.option_values import parse_value, split_values
from simtrain.spec.scenario import load_scenario, parse_set
from simtrain.spec.units import format_count

_SET = click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
                    help="override a scenario key first, e.g. training.seq_len=8192")
_WORKERS = click.option("--workers", type=click.IntRange(min=1), default=None,
                        help="processes to use (default: all cores; 1 runs in this process)")
_PROGRESS = click.option("--progress/--no-progress", default=None,
                         help="progress bar on stderr (default: only when stderr is a terminal)")


def parse_grid(items: tuple[str, ...], option: str = "--grid") -> dict[str, list[Any]]:
    """``('parallel.pp=2,4,8', 'training.recompute_modules=[mlp],[mlp,layernorm]')`` ->
    {'parallel.pp': [2, 4, 8], 'training.recompute_modules': [['mlp'], ['mlp', 'layernorm']]}."""
    grid: dict[str, list[Any]] = {}
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key or not text.strip():
            raise InputError(f"{option} '{item}' is not KEY=V1,V2,..., e.g. parallel.pp=2,4,8")
        if key in grid:
            raise InputError(f"{option} gives '{key}' twice; list all its values once: {key}=V1,V2,...")
        # split at top-level commas only (a value may be a list: [core_attn,mlp]); each value read as --set reads it
        grid[key] = [parse_value(part, f"{option} '{key}={short_repr(part)[1:-1]}'")
                     for part in split_values(text, f"{option} '{item}'")]
    return grid


#: a worker process killed from outside (the kernel's OOM killer, a job scheduler): exit 1, as for out of memory
_WORKER_DIED = "a worker process ended before reporting (killed from outside, or out of memory?)"


#: the rules a sweep point or a searched layout sets anew: a base scenario that breaks only these still has points
_LAYOUT_FIELDS = ("parallel", "training.global_batch", "training.micro_batch")


def _load_base(path: str, overrides: dict[str, Any], starts) -> Any:
    """The scenario a sweep or a search starts from. Every point (grid point, searched layout) sets its own
    layout, so a base whose layout breaks a rule is read again with the first of ``starts()`` that passes;
    any other error, or none passing, is the base's own error."""
    try:
        return load_scenario(path, overrides)
    except InputError as first:
        if not (first.field or "").startswith(_LAYOUT_FIELDS):
            raise
        for start in starts():
            try:
                return load_scenario(path, {**overrides, **start})
            except InputError:
                continue
        raise first


def _search_starts(path: str, overrides: dict[str, Any]):
    """Plain layouts of the base's own cluster, for a base whose layout breaks a rule: TP over t GPUs of a node,
    DP over the rest, one micro-batch of one sequence."""
    from simtrain.spec.bundled import scenario_path
    from simtrain.spec.hardware import load_hardware
    from simtrain.spec.scenario import apply_overrides
    from simtrain.spec.yamlio import load_yaml

    file = scenario_path(path)       # a bundled scenario's name, as load_scenario resolves it
    raw = apply_overrides(load_yaml(file), overrides, file=str(file))
    spec = load_hardware(raw.get("hardware"), base_dir=file.resolve().parent, file=None)[0]
    gpn = raw.get("gpus_per_node") or spec.gpus_per_node
    gpus = len(spec.devices) if spec.explicit else (raw.get("nodes") or spec.nodes) * gpn
    if spec.explicit:    # any node size: an explicit topology's TP may span nodes (decide.search_space)
        gpn = gpus
    for tp in (t for t in (1, 2, 4, 8, 16) if t <= gpn and gpn % t == 0):
        yield {"parallel": {"tp": tp, "dp": gpus // tp, "pp": 1}, "training.micro_batch": 1}


def _write_figures(path: str, title: str, figures: list) -> None:
    from simtrain.report.charts import write_figure

    write_figure(path, title, figures)


def _valid_rows(df):
    return df[df["error"].isna() | (df["error"].astype(str) == "")]


def _sweep_summary(df, keys: list[str], resume: bool) -> str:
    """What this run did (points simulated now, invalid, already done), then the grid's best point,
    over every row of the grid (those kept by --resume too)."""
    grid = df.iloc[:df.attrs["grid_points"]]      # the grid's points come first, in grid order
    ok = _valid_rows(grid)
    lines = [f"{format_count(len(grid), 'point')}: {df.attrs['simulated_points']} simulated, "
             f"{df.attrs['failed_points']} invalid or failed"
             + (f", {df.attrs['resumed_points']} already done" if resume else "")]
    if len(ok) < len(grid):
        lines.append(f"first error: {grid.loc[~grid.index.isin(ok.index), 'error'].iloc[0]}")
    fits = ok[ok["fits_in_memory"].fillna(False).astype(bool)]
    if len(ok) > len(fits):
        unfit = len(ok) - len(fits)
        lines[0] += f"; {unfit} of the valid points {'does' if unfit == 1 else 'do'} not fit in memory"
    if len(fits):
        best = fits.loc[fits["tokens_per_s"].idxmax()]
        from simtrain.decide.tables import column_name

        where = ", ".join(f"{k}={best[column_name(k)]}" for k in keys)
        lines.append(f"best (fits in memory): {where}: {best['step_time_s']:.3f} s per step, "
                     f"{best['tokens_per_s']:,.0f} tokens/s, MFU {best['mfu']:.1%}, "
                     f"bubble {best['bubble_fraction']:.1%}")
    return "\n".join(lines) + "\n"


@cli.command()
@click.argument("scenario", type=click.Path(dir_okay=False))
@click.option("--grid", "grids", multiple=True, required=True, metavar="KEY=V1,V2,...",
              help="a swept key and its values; repeat for a cartesian product")
@click.option("--out", "out", required=True, type=OutPath(),
              help="results table: .csv, .jsonl or .parquet (needs pyarrow: simtrain[parquet]); rows are added as "
                   "points finish")
@click.option("--resume", is_flag=True, help="keep the rows already in --out and run only the missing points")
@click.option("--max-points", "max_points", type=click.IntRange(min=1, max=10**12), default=None,
              help="refuse a grid of more points than this (default 100,000)")
@_WORKERS
@click.option("--plot", "plot_path", type=OutPath("HTML"), help="write the sweep plot (HTML) here")
@_SET
@_PROGRESS
def sweep(scenario: str, grids: tuple[str, ...], out: str, resume: bool, max_points: int | None, workers: int | None,
          plot_path: str | None, sets: tuple[str, ...], progress: bool | None) -> None:
    """Simulate SCENARIO at every point of a grid and write one row per point.

    Exits with status 2 when no point of the grid is valid (the table of their errors is still written)."""
    from simtrain.decide.sweep import MAX_POINTS, grid_points
    from simtrain.decide.sweep_files import output_format, sweep_to_file, table_format
    from simtrain.decide.workers import WorkersFailed
    from simtrain.report.outputs import write_target

    grid = parse_grid(grids)
    limit = MAX_POINTS if max_points is None else max_points
    grid_points(grid, max_points=limit)          # a grid too large is refused before the scenario is read
    output_format(out)
    table = str(write_target(out)) if out else out     # a symlinked table's record and side files are its target's
    distinct_outputs(out=out, plot=plot_path, record=f"{table}.sweep.json")
    overrides = parse_set(list(sets))
    sc = _load_base(scenario, overrides, lambda: grid_points(grid)[:64])
    outputs_apart_from_inputs(scenario_inputs(sc), out=out, plot=plot_path, record=f"{table}.sweep.json")
    kept = f"{table}.partial.jsonl" if table_format(out) == "parquet" else out     # where rows are appended
    resume_hint = f"{kept} keeps the points finished so far; the same command with --resume runs only the rest"
    try:
        df = sweep_to_file(sc, grid, out, resume=resume, workers=workers, progress=progress, max_points=limit)
    except KeyboardInterrupt:
        raise KeyboardInterrupt(resume_hint) from None     # main prints it on the one 'interrupted' line
    except WorkersFailed:
        raise click.ClickException(f"{_WORKER_DIED}; {resume_hint}") from None
    except InputError as err:     # a grid key the schema lacks (sweeps.check_grid_keys), named as the option gave it
        if err.field in grid and err.message.startswith(f"grid key '{err.field}': "):
            raise InputError(f"--grid {err.field}: {err.message.split(': ', 1)[1]}") from None
        # the Python API's words for the table and resuming, as the options say them
        err.message = err.message.replace("use another path or resume=False", "use another --out file or drop "
                                          "--resume").replace("or use another path", "or use another --out file")
        raise
    keys = list(grid)
    grid_rows = df.iloc[:df.attrs["grid_points"]]
    if _valid_rows(grid_rows).empty:
        raise InputError(f"no point of the sweep is valid: all {len(grid_rows)} failed, the first with "
                         f"\"{grid_rows['error'].iloc[0]}\" ({out} holds every point's error)")
    if plot_path:
        from simtrain.report.charts import heatmap_figure, sweep_figure

        figures = [sweep_figure(df, keys[0], metrics=("step_time_s", "tokens_per_s", "mfu", "bubble_fraction"))]
        if len(keys) == 2:
            figures.insert(0, heatmap_figure(df, keys[0], keys[1], "tokens_per_s"))
        _write_figures(plot_path, f"{sc.name}: sweep", figures)
    kept = df.attrs["resumed_points"]
    resumed = f"resumed: {kept} point(s) were already in {out}\n" if resume else ""
    click.echo(resumed + _sweep_summary(df, keys, resume) + f"wrote {out}" + (f" and {plot_path}" if plot_path else ""))


@cli.command()
@click.argument("scenario", type=click.Path(dir_okay=False))
@click.option("--gpus", type=int, default=None,
              help="GPU count to plan for: part of one node, or a whole number of nodes (nodes = GPUs / GPUs per node)")
@click.option("--top", type=click.IntRange(min=1, max=1_000_000), default=5, show_default=True,
              help="layouts to show")
@click.option("--max-layouts", "max_layouts", type=click.IntRange(min=1, max=10**9), default=None,
              help="refuse a search of more candidate layouts than this (default 200,000: about 15 min of screening); "
                   "on more than 16,384 GPUs a layout counts (GPUs / 16,384) ** 1.42 times")
@click.option("--out", "out", type=OutPath(),
              help="every candidate with its status, estimate and metrics: .csv, .jsonl or .parquet (needs pyarrow: "
                   "simtrain[parquet])")
@click.option("--max-memory", "max_memory", type=click.FloatRange(min=0.0, max=1.0, min_open=True), default=None,
              help="rank only layouts whose peak memory stays within this fraction of the GPU's (default 0.92: the "
                   "memory ledger's measured error, 7.8%, kept free)")
@click.option("--fix", "fixes", multiple=True, metavar="KEY=V1,V2,...",
              help="search only these values of a layout key, e.g. parallel.zero=1 or parallel.tp=4,8; repeatable")
@_WORKERS
@_SET
@_PROGRESS
def search(scenario: str, gpus: int | None, top: int, max_layouts: int | None, out: str | None,
           max_memory: float | None, fixes: tuple[str, ...], workers: int | None, sets: tuple[str, ...],
           progress: bool | None) -> None:
    """Find the fastest parallel layouts of SCENARIO's model, hardware and global batch."""
    from simtrain.decide.search import DEFAULT_MAX_MEMORY, check_fix, search_text
    from simtrain.decide.search import search as run_search
    from simtrain.decide.search_result import failed_text, nothing_valid
    from simtrain.decide.sweep_files import output_format, write_table
    from simtrain.decide.workers import WorkersFailed
    from simtrain.spec.scenario import setup_warnings

    distinct_outputs(out=out)
    if out:
        output_format(out)     # before the search: a missing Parquet engine must not cost a whole search
    fix = {k: (v if len(v) > 1 else v[0]) for k, v in parse_grid(fixes, "--fix").items()}
    try:
        check_fix(fix)
    except InputError as err:
        raise InputError("--fix " + err.message) from None
    overrides = parse_set(list(sets))
    sc = _load_base(scenario, overrides, lambda: _search_starts(scenario, overrides))
    outputs_apart_from_inputs(scenario_inputs(sc), out=out)
    try:
        limit = {} if max_layouts is None else {"max_layouts": max_layouts}
        result = run_search(sc, gpus=gpus, top=top, workers=workers, progress=progress, fix=fix or None,
                            max_memory=DEFAULT_MAX_MEMORY if max_memory is None else max_memory, **limit)
    except WorkersFailed:
        raise click.ClickException(f"{_WORKER_DIED}; run the search again (--workers 1 uses none)") from None
    except InputError as err:
        # the Python API's message names fix= by its field ("fix: ..."); the others name their argument themselves
        text = f"fix: {err.message}" if err.field == "fix" else err.message
        raise InputError(_cli_words(text), file=err.file, line=err.line) from None
    if out:
        write_table(result.table, out)
    held = f" ({out} holds every layout's error)" if out else ""
    failed, invalid = failed_text(result), nothing_valid(result)
    if failed:      # layouts failed with a simtrain bug and none made the top: the internal-error path
        raise RuntimeError(_cli_words(failed) + held)
    if invalid:     # nothing in the space is valid for this scenario: its input is at fault
        raise InputError(_cli_words(invalid) + held)
    warned = "".join(f"warning: {w}\n" for w in setup_warnings(sc))
    click.echo(_cli_words(search_text(result)) + warned + (f"wrote {out}\n" if out else ""), nl=False)


def _cli_words(text: str) -> str:
    """The Python API's words for its arguments, as the command line's options (whole words only: a scenario key
    such as simulation.max_gpus keeps its name)."""
    import re

    for python, flag in (("gpus=", "--gpus "), ("max_memory=", "--max-memory "), ("top=", "--top "),
                         ("(max_memory)", "(--max-memory)"), ("(gpus)", "(--gpus)"),
                         ("higher max_memory", "higher --max-memory"), ("(fix=)", "(--fix)"), ("fix=", "--fix "),
                         ("fix: ", "--fix "),
                         ("goodput=", "--goodput "), ("price_per_gpu_hour", "--price ")):
        text = re.sub(r"(?<![\w.])" + re.escape(python), flag, text)
    text = re.sub(r"--price \['([^']*)'\]=", r"--price \1=", text)     # a price by name: as --price NAME=USD gave it
    return text.replace("--price =", "--price ").replace("--price : ", "--price: ")


@cli.command()
@click.argument("scenarios", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("--tokens", default="1T", show_default=True, help="token budget for time, cost and energy")
@click.option("--plot", "plot_path", type=OutPath("HTML"), help="write the comparison chart (HTML)")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), help=JSON_HELP)
@click.option("--price", "prices", multiple=True, metavar="USD or NAME=USD",
              help="price per GPU-hour: one number for every scenario, or NAME=USD for one scenario or hardware "
                   "(repeatable); replaces the scenario's and the hardware file's price")
@click.option("--goodput", type=float, default=None,
              help="fraction of wall time spent training, in (0, 1]; without it the days are steady-state")
@_SET
def compare(scenarios: tuple[str, ...], tokens: str, plot_path: str | None, json_path: str | None,
            prices: tuple[str, ...], goodput: float | None, sets: tuple[str, ...]) -> None:
    """SCENARIOS side by side: speed, memory, time, cost and energy to train a token budget."""
    from simtrain.decide.compare import TOKEN_RANGE, compare_figure, compare_report, compare_text, short_g
    from simtrain.decide.compare import compare as run_compare
    from simtrain.spec.units import parse_count

    distinct_outputs(json=json_path, plot=plot_path)

    try:
        budget = parse_count(tokens)
    except InputError as err:
        raise InputError(f"--tokens {tokens}: {err.message}") from None
    if not TOKEN_RANGE[0] <= budget <= TOKEN_RANGE[1]:   # the Python API's bound
        raise InputError(f"--tokens {tokens}: give a token count from {short_g(TOKEN_RANGE[0])} to "
                         f"{short_g(TOKEN_RANGE[1])}, "
                         "e.g. 1T or 300B")
    overrides = parse_set(list(sets))
    price = _parse_prices(prices)
    loaded = [load_scenario(path, overrides) for path in scenarios]
    outputs_apart_from_inputs([f for sc in loaded for f in scenario_inputs(sc)], json=json_path, plot=plot_path)
    try:
        rows = run_compare(loaded, budget, price_per_gpu_hour=price, goodput=goodput)
    except InputError as err:
        if err.field in ("price_per_gpu_hour", "goodput") and err.file is None:
            raise InputError(_cli_words(err.message)) from None
        raise
    report = compare_report(rows)
    with staged_outputs():
        if plot_path:
            _write_figures(plot_path, "simtrain compare", [compare_figure(rows)])
        if json_path and json_path != "-":
            write_json(json_path, report)
    emit(compare_text(rows) + (f"wrote {plot_path}\n" if plot_path else ""), json_path if json_path == "-" else None,
         report)


def _parse_prices(items: tuple[str, ...]) -> float | dict[str, float] | None:
    """``('2.5',)`` -> 2.5; ``('dgx-h100=2.5', 'dgx-a100=1.3')`` -> {'dgx-h100': 2.5, 'dgx-a100': 1.3}."""
    from simtrain.decide.compare import PRICE_RANGE, short_g

    if not items:
        return None
    out: dict[str, float] = {}
    for item in items:
        name, sep, text = item.rpartition("=")
        try:
            value = float(text)
        except ValueError:
            raise InputError(f"--price {item}: give USD per GPU-hour, e.g. --price 2.5 or --price dgx-h100=2.5") \
                from None
        low, high = PRICE_RANGE
        if not low <= value <= high:       # as typed: 1e13, not 10000000000000.0
            raise InputError(f"--price {item}: give USD per GPU-hour, a number from {short_g(low)} to "
                             f"{short_g(high)} (the range of a scenario's cost.price_per_gpu_hour)")
        if not sep:
            if len(items) > 1:
                raise InputError(f"--price {item}: with several --price options, name each: NAME=USD")
            return value
        out[name.strip()] = value
    return out
