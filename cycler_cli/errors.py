"""Turn a :class:`CyclerError` into one red line and its documented exit code."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import typer
from rich.console import Console
from rich.markup import escape

from cycler.errors import CyclerError

_stderr = Console(stderr=True, highlight=False, soft_wrap=True)


@contextlib.contextmanager
def exit_on_cycler_error() -> Iterator[None]:
    """Print a user error as one line (no traceback) and exit with its code."""
    try:
        yield
    except CyclerError as error:
        _stderr.print(f"[red]cycle: error:[/red] {escape(str(error))}", markup=True)
        raise typer.Exit(error.exit_code) from None
