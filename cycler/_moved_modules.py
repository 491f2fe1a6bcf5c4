"""Old module paths of cycler, kept importable for one release with a DeprecationWarning.

Until 0.2 the data half, the worker's half and the shared protocol were flat modules of
``cycler`` (``cycler.samplers``, ``cycler.step_control``, ``cycler.control``, ...). They now live
in ``cycler.data``, ``cycler.training`` and ``cycler.protocol``. ``import cycler.samplers`` still
works and gives the very module at its new path (same classes, same state), once warned.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
import warnings
from collections.abc import Sequence

MOVED = {
    "cycler.control": "cycler.protocol.control",
    "cycler.datasets": "cycler.data.datasets",
    "cycler.environment": "cycler.protocol.environment",
    "cycler.epoch_order": "cycler.data.epoch_order",
    "cycler.epochs": "cycler.training.epochs",
    "cycler.events": "cycler.protocol.events",
    "cycler.exit_codes": "cycler.protocol.exit_codes",
    "cycler.grouped_sampler": "cycler.data.grouped_sampler",
    "cycler.metrics": "cycler.training.metrics",
    "cycler.permutation": "cycler.data.permutation",
    "cycler.readiness": "cycler.training.readiness",
    "cycler.rng": "cycler.training.rng",
    "cycler.samplers": "cycler.data.samplers",
    "cycler.step_control": "cycler.training.step_control",
    "cycler.stray_signals": "cycler.protocol.stop_signals",
}
"""Old module path -> where it lives now."""


class MovedModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds the old paths in :data:`MOVED` and loads each as its new module."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None

    def exec_module(self, module: types.ModuleType) -> None:
        old = module.__name__
        warnings.warn(
            f"{old} moved to {MOVED[old]}; import it from there (or its names from cycler): "
            "the old path goes away in the next release",
            DeprecationWarning,
            stacklevel=2,
        )
        # The import system returns whatever sys.modules holds after exec_module: the new
        # module itself, so old and new paths share one set of classes and one state.
        sys.modules[old] = importlib.import_module(MOVED[old])


def install() -> None:
    """Put the finder on ``sys.meta_path`` once."""
    if not any(isinstance(finder, MovedModuleFinder) for finder in sys.meta_path):
        sys.meta_path.append(MovedModuleFinder())
