"""The command line: a thin shell over the Python API (style rule 10).

Bad input exits with status 2 and one located sentence (docs/errors.md); a real
bug exits 1 with a one-line message, and ``--debug`` shows its traceback.
The command group lives in :mod:`simtrain.cli.app`; the commands are imported here, on first use.
"""

from __future__ import annotations

import os
import sys
import traceback

import click

from simtrain.cli.app import cli
from simtrain.spec.errors import InputError, display_path, one_line


def _register() -> None:
    """Attach the commands to the group (each module adds its own with ``@cli.command``)."""
    from simtrain.cli import commands_core, commands_decide, commands_validate  # noqa: F401


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
