"""The ``cycle`` command: parse, call one library function, render, map errors to exit codes."""

from __future__ import annotations

import logging

from cycler_cli._guard import ensure_torch_cycler

ensure_torch_cycler()

import typer  # noqa: E402

from cycler_cli import inspect_commands, run_command, verify_command  # noqa: E402

app = typer.Typer(
    name="cycle",
    help="Run PyTorch training that survives preemption, and inspect its checkpoints.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
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
    app()
