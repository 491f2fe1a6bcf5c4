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
import importlib.abc
import importlib.machinery
import sys
from types import ModuleType
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


MOVED = {
    "budget": "decisions.budget", "core": "decisions.core", "vocabulary": "decisions.vocabulary",
    "failure": "decisions.failure", "failure_kinds": "decisions.failure_kinds",
    "options": "configuration.options", "flags": "configuration.flags",
    "config_file": "configuration.config_file", "slurm": "schedulers.slurm",
    "scheduler_env": "schedulers.environment", "notices": "schedulers.notices",
    "peers": "nodes.peers", "store_link": "nodes.store_link", "root_io": "nodes.root_io",
    "carried_cache": "compile_cache.archive",
    "cache_carrier": "compile_cache.carrier", "launcher": "launch.launcher",
    "forked": "launch.forked", "fresh_worker": "launch.fresh_worker",
    "torchrun": "launch.torchrun", "startable": "launch.startable",
    "script_source": "launch.script_source", "processes": "launch.processes",
    "hangs": "watch.hangs", "replay_watch": "watch.replay_watch", "foreign": "run_end.foreign",
}
"""The modules' paths before the wings (issue 37): ``import cycler.supervisor.options`` still
works for code written against them, and gives the module at its new path (the same object).
Not ``compile_cache``: that name is the wing's own package now (its ``place`` module was it).
Not ``tier_end``: it became ``run_end.landing`` with another interface (issue 37)."""


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``cycler.supervisor.<old name>`` as the module it became."""

    def find_spec(self, fullname: str, path: Any, target: Any = None,
                  ) -> importlib.machinery.ModuleSpec | None:
        package, _, name = fullname.rpartition(".")
        if package != __name__ or name not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def __init__(self) -> None:
        self._specs: dict[str, Any] = {}

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = importlib.import_module(f"{__name__}.{MOVED[spec.name.rpartition('.')[2]]}")
        self._specs[module.__name__] = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        """The module ran at its new path already: only its own spec is given back (the
        import machinery set the old name's on it)."""
        module.__spec__ = self._specs[module.__name__]


if not any(isinstance(finder, _MovedModules) for finder in sys.meta_path):
    sys.meta_path.append(_MovedModules())

__all__ = [
    "LaunchPlan",
    "RunOptions",
    "RunOutcome",
    "load_config_file",
    "plan_run",
    "resolve_run_options",
    "run_supervisor",
]
