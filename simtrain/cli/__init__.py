"""The command line: a thin shell over the Python API (style rule 10).

Bad input exits with status 2 and one located sentence (docs/errors.md); a real
bug exits 1 with a one-line message, and ``--debug`` shows its traceback.
The command group lives in :mod:`simtrain.cli.app`; the commands are imported here, on first use.
"""

from __future__ import annotations

import os
import signal
import sys
import threading

# click and the commands are imported inside main(): a Ctrl-C (or SIGTERM) while they load is then an interrupt
# main() reports in one line, not a traceback from the import


def _register() -> None:
    """Attach the commands to the group (each module adds its own with ``@cli.command``)."""
    from simtrain.cli import commands_core, commands_decide, commands_validate  # noqa: F401


def _terminated(signum, frame) -> None:
    """SIGTERM (a batch scheduler, `timeout`, `kill`) ends simtrain as Ctrl-C does: worker processes are
    stopped, files are left whole and a sweep stays resumable. A second SIGTERM during that cleanup is ignored."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> None:
    """Entry point: exit 0 on success, 2 with one ``error: file:line: field: message`` line for bad
    input (and refused oversize runs), 1 with one line for a bug (``--debug`` shows its traceback), 130 with
    one line for Ctrl-C or SIGTERM."""
    args = sys.argv[1:] if argv is None else argv
    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _terminated) if in_main_thread else None
    try:
        _main(args)
    except KeyboardInterrupt as err:
        hint = f"; {err.args[0]}" if err.args and isinstance(err.args[0], str) else ""
        # on a terminal, '\r' writes over the '^C' it echoed: one line either way
        _say(("\r" if _tty(sys.stderr) else "") + f"interrupted{hint}")
        sys.exit(130)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def console_main() -> None:
    """The ``simtrain`` command (pyproject's console script): :func:`main`, then a Ctrl-C arriving after the work is
    over (files written or left whole) is ignored. Between main's return and the interpreter's exit it would
    otherwise end the process by the signal (status -2) instead of main's status. In-process callers of
    :func:`main` (notebooks, tests) keep their own SIGINT handler."""
    try:
        main()
    finally:
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, signal.SIG_IGN)


def _tty(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def _say(line: str) -> None:
    try:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):    # stderr closed: the exit status says it
        pass


def _main(args: list[str]) -> None:
    import click

    from simtrain.cli.app import cli
    from simtrain.spec.errors import InputError, display_path, one_line

    debug = "--debug" in args
    try:
        _register()
        # click's main() would turn Ctrl-C into Abort after a blank line; run the group directly instead
        with cli.make_context("simtrain", list(args)) as ctx:
            cli.invoke(ctx)
    except InputError as err:
        if debug:
            import traceback

            traceback.print_exc()
        from simtrain.spec.yamlio import CLI_OVERRIDE_WORDS

        # Python's errors name arguments; on the command line an override is --set
        click.echo(f"error: {err}".replace(*CLI_OVERRIDE_WORDS), err=True)
        sys.exit(2)
    except click.exceptions.Abort:
        raise KeyboardInterrupt from None
    except click.ClickException as err:
        if type(err).__name__ == "NoArgsIsHelpError":   # bare `simtrain` (click >= 8.2): show the help as it is
            click.echo(err.format_message(), err=True)
            sys.exit(2)
        click.echo(f"error: {one_line(err.format_message())}", err=True)
        sys.exit(2 if isinstance(err, click.UsageError) or err.exit_code == 2 else err.exit_code)
    except click.exceptions.Exit as err:
        sys.exit(err.exit_code)
    except BrokenPipeError:
        # the reader went away (`simtrain run x | head -1`): not an error, and nothing more to say
        try:      # later writes (the interpreter's flush at exit) go nowhere instead of failing again
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):   # stdout is not a file (captured, replaced)
            pass
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
        if _interrupted(err):
            raise KeyboardInterrupt from None
        if debug:
            raise
        click.echo(one_line(f"internal error: {type(err).__name__}: {err} (this is a simtrain bug; rerun with "
                            "--debug for the traceback)"), err=True)
        sys.exit(1)
    sys.exit(0)


def _interrupted(err: BaseException) -> bool:
    """Whether ``err`` wraps a Ctrl-C: Python re-raises a KeyboardInterrupt that lands in a class body's
    ``__set_name__`` (pydantic building its models while simtrain imports) as a RuntimeError caused by it."""
    seen = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, KeyboardInterrupt):
            return True
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return False
