"""``cycle status`` and ``cycle prune``: one library call each, rendered."""

from __future__ import annotations

from pathlib import Path

import typer

from cycler.checkpoint.inspection import RootStatus, collect_status, prune, total_size
from cycler.protocol.environment import default_checkpoint_root
from cycler.protocol.exit_codes import EXIT_FAILURE
from cycler_cli import render
from cycler_cli.errors import exit_on_cycler_error
from cycler_cli.help_format import Command

_DIR_HELP = ("Checkpoint root (default: $CYCLER_CHECKPOINT_DIR, then $CHECKPOINT_ARTIFACT_PATH, "
             "then ./checkpoints).")
# Checksum verification of this many bytes or more gets a progress bar.
_PROGRESS_THRESHOLD = 256 << 20


def status(
    directory: Path | None = typer.Argument(None, help=_DIR_HELP, show_default=False),
    verify: bool = typer.Option(False, "--verify", help="Check every file's checksum (reads "
                                "all data)."),
    as_json: bool = typer.Option(False, "--json", help="Print the same facts as JSON."),
    events: int = typer.Option(10, "--events", min=0, help="How many recent events to show "
                               "(default: 10)."),
    watch: bool = typer.Option(False, "--watch", help="Show it again every --interval "
                               "seconds until Ctrl-C (while a job runs)."),
    interval: float = typer.Option(2.0, "--interval", min=0.1, help="Seconds between "
                                   "refreshes with --watch (default: 2)."),
    every: bool = typer.Option(False, "--all", help="List every checkpoint (default: the "
                               f"{render.STATUS_ROWS} newest and a count of the rest)."),
    memory_dir: Path | None = typer.Option(None, "--memory-dir", help="The --memory-dir the "
                                           "job's cycle run was given, to find a memory tier "
                                           "it left behind (default: cycle run's default).",
                                           show_default=False),
) -> None:
    """Show the checkpoints, their state, and what the job has been through."""
    root = directory or default_checkpoint_root()
    rows = None if every else render.STATUS_ROWS
    if watch:
        _watch(root, events, interval, rows)
        return
    with exit_on_cycler_error():
        result = _collect(root, verify, events, not as_json, memory_dir)
    if as_json:
        render.print_json(result.as_dict())
    else:
        render.render_status(result, rows)
    if not result.exists:
        raise typer.Exit(EXIT_FAILURE)  # a script can tell "no such root" from "no checkpoint"


def _watch(root: Path, events: int, interval: float, rows: int | None) -> None:
    """Redraw the status every ``interval`` seconds until Ctrl-C (exit 0)."""
    import time

    try:
        while True:
            with exit_on_cycler_error():
                result = collect_status(root, events=events)
            render.console.clear()
            render.render_status(result, rows)
            render.console.print(f"(every {interval:g} s; Ctrl-C to stop)", style="dim")
            time.sleep(interval)
    except KeyboardInterrupt:
        return


def _collect(root: Path, verify: bool, events: int, show_progress: bool,
             memory_dir: Path | None) -> RootStatus:
    size = total_size(root) if verify and show_progress else 0
    if size < _PROGRESS_THRESHOLD:
        return collect_status(root, verify=verify, events=events, memory_dir=memory_dir)
    # Imported here: every `cycle run` start would pay for it otherwise.
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn

    columns = (BarColumn(), DownloadColumn(), TimeRemainingColumn())
    with Progress(*columns, console=render.console, transient=True) as progress:
        task = progress.add_task("verifying", total=size)
        return collect_status(root, verify=True, events=events, memory_dir=memory_dir,
                              on_checked=lambda n: progress.advance(task, n))


def prune_command(
    directory: Path | None = typer.Argument(None, help=_DIR_HELP, show_default=False),
    keep_last: int = typer.Option(-1, "--keep-last", help="Valid checkpoints to keep per saver, "
                                  "counting the latest (-1: all; torn ones are removed anyway) "
                                  "(default: -1)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the decisions, delete nothing."),
    force: bool = typer.Option(False, "--force", help="Prune even while a cycle run is live."),
    as_json: bool = typer.Option(False, "--json", help="Print the decisions as JSON."),
) -> None:
    """Remove torn checkpoints and unpinned ones beyond --keep-last, safely."""
    root = directory or default_checkpoint_root()
    with exit_on_cycler_error():
        result = prune(root, keep_last=keep_last, dry_run=dry_run, force=force)
    if as_json:
        render.print_json(render.prune_as_dict(result))
    else:
        render.render_prune(result)


def register(app: typer.Typer) -> None:
    """Add ``status`` and ``prune`` to ``app``."""
    app.command("status", cls=Command, short_help="Show the checkpoints and the job's history.",
                epilog="Exit codes: 0 shown; 1 no checkpoint directory there; 2 it "
                "cannot be read or is not a directory.")(status)
    app.command("prune", cls=Command, short_help="Remove torn and surplus checkpoints, safely.",
                epilog="Exit codes: 0 pruned (or nothing to do); 2 refused: a live "
                "cycle run holds the root, or it cannot be written.")(prune_command)
