"""The ``simtrain`` command group and what its commands share: output paths, the JSON/text emitter.

The commands (commands_core, commands_decide, commands_validate) attach themselves to :data:`cli`;
the package (simtrain.cli) imports them and runs the group in :func:`simtrain.cli.main`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import click


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, help="show tracebacks for internal errors")
@click.version_option(package_name="simtrain")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """simtrain: simulate distributed training steps before you book or buy GPUs."""
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug


#: --json help: the option writes a file, or stdout for '-' (then the text goes to stderr, so a pipe gets JSON only)
JSON_HELP = "write the JSON report to this file, or to stdout for '-' (the text report then goes to stderr)"


class OutPath(click.Path):
    """A file to write (a chart, a trace, a table): '-' (standard output) is only for --json. With ``kind``
    ('HTML', 'JSON'), a name whose suffix says another format gets a warning: the file is written as asked."""

    SUFFIXES = {"HTML": (".html", ".htm"), "JSON": (".json",)}
    OTHERS = (".html", ".htm", ".json", ".csv", ".jsonl", ".parquet", ".yaml", ".yml", ".png", ".svg", ".pdf")

    def __init__(self, kind: str | None = None) -> None:
        super().__init__(dir_okay=False)
        self.kind = kind

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if value == "":
            self.fail("the file name is empty; give a file name", param, ctx)
        if value == "-":
            self.fail("'-' (standard output) is only for --json; give a file name", param, ctx)
        suffix = os.path.splitext(str(value))[1].lower()
        if self.kind and suffix in self.OTHERS and suffix not in self.SUFFIXES[self.kind]:
            flag = param.opts[0] if param is not None and param.opts else "the output"
            click.echo(f"warning: {flag} {value} gets {self.kind}, not {suffix[1:]}: name it "
                       f"{self.SUFFIXES[self.kind][0]} to open it as such", err=True)
        return super().convert(value, param, ctx)


def distinct_outputs(**paths: str | None) -> None:
    """Refuse an empty file name, two output options naming one file (the second would overwrite the first; a
    symlink names the file it points to), a file in a folder that does not exist (or under a file), or a socket,
    block device or folder (never written into or replaced): exit 2."""
    from simtrain.report.outputs import folder_problem, special_target, write_target

    seen: dict[str, str] = {}
    for option, path in paths.items():
        if path is None or path == "-":
            continue
        flag = "the sweep's record" if option == "record" else "--" + option.replace("_", "-")
        if path == "":      # every command's output options pass here, --json's plain click.Path too
            raise click.UsageError(f"{flag} was given an empty file name; give a file name")
        target = str(write_target(path))
        key = os.path.normcase(os.path.realpath(target))     # a symlinked folder reaches the same file too
        if key in seen:
            raise click.UsageError(f"{seen[key]} and {flag} both write {path}; give each its own file")
        seen[key] = flag
        special = special_target(path)      # a socket, disk or folder refused; a device or FIFO written in place
        problem = folder_problem(os.path.dirname(target) or ".", creates=not special)
        if problem:   # before the simulation, not after it
            shown = path if target == path else f"{path} (a symlink to {target})"
            raise click.UsageError(f"{flag} {shown}: {problem}")


def scenario_inputs(scenario: Any) -> list[str]:
    """The files a loaded scenario was read from: the scenario, its hardware file and its model file (the
    bundled ones too: writing over them would change every later run)."""
    found = [scenario.file, scenario.hardware_file]
    ref = scenario.raw.get("model")
    if isinstance(ref, str):
        try:
            found.append(str(Path(scenario.base_dir) / Path(ref).expanduser()))   # as spec.yamlio resolves it
        except (OSError, ValueError, RuntimeError):
            pass
    return [f for f in found if f]


def outputs_apart_from_inputs(inputs: list[str | None], **paths: str | None) -> None:
    """Refuse an output option naming one of the run's own input files (``--json config.json`` where config.json
    is the model): the run would destroy what it read. Compared as files (a symlink or a hard link to an input
    is that input), before any work; so is an output option naming a file simtrain did not write
    (``report.outputs.check_replaceable``)."""
    from simtrain.report.outputs import check_replaceable

    for option, path in paths.items():
        if not path or path == "-" or not os.path.exists(path):
            continue
        flag = "the sweep's record" if option == "record" else "--" + option.replace("_", "-")
        for source in inputs:
            try:
                same = bool(source) and os.path.samefile(path, source)
            except OSError:
                same = False
            if same and not _is_special(path):      # /dev/null as an input and an output is no loss
                raise click.UsageError(f"{flag} {path} is one of this run's input files ({source}); "
                                       "writing it would replace what was read: give another file")
        if option != "record" and not (option == "out" and "record" in paths):
            check_replaceable(path)   # another program's file: refused before any work (a sweep's table: by the sweep)


def _is_special(path: str) -> bool:
    import stat

    try:
        return not stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


def emit(text: str, json_path: str | None, report: Any) -> None:
    """The command's text, then its JSON report: to ``json_path`` (atomically) with the text on stdout,
    or for ``--json -`` the JSON on stdout and the text on stderr."""
    from simtrain.report.outputs import dumps_json, write_json

    if json_path == "-":
        click.echo(text, nl=False, err=True)
        click.echo(dumps_json(report), nl=False)
        return
    if json_path:
        write_json(json_path, report)
    click.echo(text, nl=False)
