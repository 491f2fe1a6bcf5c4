"""``cycle run``'s supervisor: a pure decision core (:mod:`.core`) inside a thin process shell.

The CLI resolves :class:`RunOptions` (flags, ``--config`` file, Slurm/ISC environment), then
calls :func:`run_supervisor` (or :func:`plan_run` for ``--dry-run``). Nothing here imports typer.
"""

from __future__ import annotations

from cycler.supervisor.options import RunOptions, load_config_file, resolve_run_options
from cycler.supervisor.shell import RunOutcome, plan_run, run_supervisor
from cycler.supervisor.torchrun import LaunchPlan

__all__ = [
    "LaunchPlan",
    "RunOptions",
    "RunOutcome",
    "load_config_file",
    "plan_run",
    "resolve_run_options",
    "run_supervisor",
]
