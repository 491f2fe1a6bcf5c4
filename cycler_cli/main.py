"""The ``cycle`` command: parse, call one library function, render, map errors to exit codes."""

from __future__ import annotations

import logging
import os
import sys

from cycler_cli._guard import ensure_torch_cycler

ensure_torch_cycler()

import typer  # noqa: E402

from cycler_cli import inspect_commands, run_command, verify_command  # noqa: E402
from cycler_cli.help_format import Group  # noqa: E402

app = typer.Typer(
    name="cycle",
    help="Run PyTorch training that survives preemption, and inspect its checkpoints.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # laid out by cycler_cli.help_format, never cut
    cls=Group,
)


def _print_version(value: bool) -> None:
    if value:
        from cycler._version import VERSION

        print(f"cycle (torch-cycler) {VERSION}")
        raise typer.Exit()


@app.callback()
def _configure(
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Log debug messages."),
    version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                 help="Print the version and exit."),
) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="cycle: %(message)s",
    )


inspect_commands.register(app)
run_command.register(app)
verify_command.register(app)


def main() -> None:
    """Console-script entry point."""
    try:
        app()
    except SystemExit as done:
        if "torch" in sys.modules:
            _exit_at_once(done.code)
        raise


def _exit_at_once(code: object) -> None:
    """End the process without the interpreter's teardown, once the command is done and its
    output flushed: with torch imported the teardown takes seconds (2 s on a loaded machine),
    which every stop of ``cycle run`` would add to its restart."""
    if isinstance(code, str):
        sys.stderr.write(code + "\n")
    logging.shutdown()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        pass  # a closed pipe: nothing more can be said
    os._exit(code if isinstance(code, int) else 0 if code is None else 1)
