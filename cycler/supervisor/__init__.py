"""``cycle run``'s supervisor: a pure decision core (:mod:`.core`) inside a thin process shell.

The CLI resolves :class:`RunOptions` (flags, ``--config`` file, Slurm/ISC environment), then
calls :func:`run_supervisor` (or :func:`plan_run` for ``--dry-run``). Nothing here imports typer.
Names resolve on first use (PEP 562): torchrun runs as ``python -m
cycler.supervisor.launcher``, and importing the whole supervisor there (psutil, the shell) cost
every start of the workers 0.15 s.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cycler.supervisor.options import RunOptions, load_config_file, resolve_run_options
    from cycler.supervisor.shell import RunOutcome, plan_run, run_supervisor
    from cycler.supervisor.torchrun import LaunchPlan

_PUBLIC = {
    "LaunchPlan": "cycler.supervisor.torchrun",
    "RunOptions": "cycler.supervisor.options",
    "RunOutcome": "cycler.supervisor.shell",
    "load_config_file": "cycler.supervisor.options",
    "plan_run": "cycler.supervisor.shell",
    "resolve_run_options": "cycler.supervisor.options",
    "run_supervisor": "cycler.supervisor.shell",
}


def __getattr__(name: str) -> Any:
    try:
        module = _PUBLIC[name]
    except KeyError:
        raise AttributeError(f"module 'cycler.supervisor' has no attribute {name!r}") from None
    return getattr(importlib.import_module(module), name)


__all__ = [
    "LaunchPlan",
    "RunOptions",
    "RunOutcome",
    "load_config_file",
    "plan_run",
    "resolve_run_options",
    "run_supervisor",
]
