"""The command line: a thin shell over the Python API (style rule 10).

Bad input exits with status 2 and one located sentence (docs/errors.md); a real
bug exits 1 with a one-line message, and ``--debug`` shows its traceback.
"""

from __future__ import annotations

import os
import sys
import traceback
from typing import Any

import click

from simtrain.spec.errors import InputError, display_path, one_line


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
        if value == "-":
            self.fail("'-' (standard output) is only for --json; give a file name", param, ctx)
        suffix = os.path.splitext(str(value))[1].lower()
        if self.kind and suffix in self.OTHERS and suffix not in self.SUFFIXES[self.kind]:
            flag = param.opts[0] if param is not None and param.opts else "the output"
            click.echo(f"warning: {flag} {value} gets {self.kind}, not {suffix[1:]}: name it "
                       f"{self.SUFFIXES[self.kind][0]} to open it as such", err=True)
        return super().convert(value, param, ctx)


def distinct_outputs(**paths: str | None) -> None:
    """Refuse two output options naming one file (the second would overwrite the first), or a file in a
    folder that does not exist: exit 2."""
    import os

    seen: dict[str, str] = {}
    for option, path in paths.items():
        if not path or path == "-":
            continue
        key = os.path.normcase(os.path.abspath(path))
        flag = "the sweep's record" if option == "record" else "--" + option.replace("_", "-")
        if key in seen:
            raise click.UsageError(f"{seen[key]} and {flag} both write {path}; give each its own file")
        seen[key] = flag
        folder = os.path.dirname(path) or "."
        if not os.path.isdir(folder):   # before the simulation, not after it
            raise click.UsageError(f"{flag} {path}: folder '{folder}' does not exist")


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


def _register() -> None:
    from simtrain.cli import commands_core  # noqa: F401  (run, memory, plot)
    for name in ("commands_decide", "commands_validate"):
        try:
            __import__(f"simtrain.cli.{name}")
        except ModuleNotFoundError as err:
            if err.name != f"simtrain.cli.{name}":
                raise


def main(argv: list[str] | None = None) -> None:
    """Entry point: exit 0 on success, 2 with one ``error: file:line: field: message`` line for bad
    input (and refused oversize runs), 1 with one line for a bug (``--debug`` shows its traceback)."""
    args = sys.argv[1:] if argv is None else argv
    debug = "--debug" in args
    try:
        _register()
        cli.main(args=args, prog_name="simtrain", standalone_mode=False)
    except InputError as err:
        if debug:
            traceback.print_exc()
        click.echo(f"error: {err}", err=True)
        sys.exit(2)
    except click.exceptions.Abort:
        click.echo("interrupted", err=True)
        sys.exit(130)
    except click.ClickException as err:
        if type(err).__name__ == "NoArgsIsHelpError":   # bare `simtrain` (click >= 8.2): show the help as it is
            click.echo(err.format_message(), err=True)
            sys.exit(2)
        click.echo(f"error: {one_line(err.format_message())}", err=True)
        sys.exit(2 if isinstance(err, click.UsageError) or err.exit_code == 2 else err.exit_code)
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        sys.exit(130)
    except click.exceptions.Exit as err:
        sys.exit(err.exit_code)
    except BrokenPipeError:
        # the reader went away (`simtrain run x | head -1`): not an error, and nothing more to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(0)
    except OSError as err:
        if debug:
            raise
        # a file the user named cannot be written or read (permissions, full disk): their input, not a bug
        where = f"{display_path(err.filename)}: " if err.filename else ""
        click.echo(f"error: {where}{one_line(err.strerror or str(err))}", err=True)
        sys.exit(2)
    except MemoryError:
        click.echo("error: out of memory; lower simulation.max_events or use simulation.fidelity: folded", err=True)
        sys.exit(1)
    except Exception as err:  # noqa: BLE001 - the last line of defence for real bugs
        if debug:
            raise
        click.echo(one_line(f"internal error: {type(err).__name__}: {err} (this is a simtrain bug; rerun with "
                            "--debug for the traceback)"), err=True)
        sys.exit(1)
    sys.exit(0)
