"""``cycle run``'s supervisor: a pure decision core inside a thin process shell, in wings.

The CLI resolves :class:`RunOptions` (flags, ``--config`` file, Slurm/ISC environment), then
calls :func:`run_supervisor` (or :func:`plan_run` for ``--dry-run``). Nothing here imports typer.

- :mod:`.shell`: the loop: turns signals, exits, commits and time into the core's events and
  carries out its actions (the top: it imports the wings, none imports it).
- :mod:`.checks`: what is checked and prepared before the first start.
- :mod:`.decisions`: the pure core, its vocabulary, the restart budget, the failure kinds.
- :mod:`.configuration`: the run's options, their flags and the ``--config`` file.
- :mod:`.schedulers`: Slurm, the environment a scheduler sets, cloud preemption notices.
- :mod:`.nodes`: the other nodes of a job on several (heartbeats, the store's link).
- :mod:`.compile_cache`: the compile cache's place on the node, its archive, its carrier.
- :mod:`.launch`: torchrun's command, its launcher and forked workers, the process tree.
- :mod:`.watch`: the workers' progress and hangs, replayed steps.
- :mod:`.run_end`: the memory tier's landing at the end, a script's own checkpoint.

Each wing's ``__init__`` is a map of its modules; the wings import one another downward only
(decisions, schedulers, nodes; configuration; compile_cache; launch; watch, run_end; then
checks and shell), with no circle (tests/unit/test_package_layout.py).

Names resolve on first use (PEP 562): torchrun runs as ``python -m
cycler.supervisor.launch.launcher``, and importing the whole supervisor there (psutil, the
shell) cost every start of the workers 0.15 s.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cycler.supervisor.configuration.options import (
        RunOptions,
        load_config_file,
        resolve_run_options,
    )
    from cycler.supervisor.launch.torchrun import LaunchPlan
    from cycler.supervisor.shell import RunOutcome, plan_run, run_supervisor

_PUBLIC = {
    "LaunchPlan": "cycler.supervisor.launch.torchrun",
    "RunOptions": "cycler.supervisor.configuration.options",
    "RunOutcome": "cycler.supervisor.shell",
    "load_config_file": "cycler.supervisor.configuration.options",
    "plan_run": "cycler.supervisor.shell",
    "resolve_run_options": "cycler.supervisor.configuration.options",
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
