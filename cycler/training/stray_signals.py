"""Signals that reach a worker directly must not kill it before the agreed checkpoint.

Some clusters signal every process of a job (Slurm's proctrack/pgid or linuxproc, some time
limits), not just the batch script: torchrun, each worker and each DataLoader worker get the
SIGTERM that ``cycle run`` also gets. The supervisor decides the stop; a worker that reads the
control file (``StepControl``) will checkpoint at the agreed step and exit, so the stray signal
must do nothing in it, nor in the DataLoader workers it forks (torch gives those a C-level
SIGTERM handler that kills them, and the next batch would then fail).

:func:`shield_from_stray_signals` installs a handler that does nothing but say so once, for
the stop signals ``cycle run`` passes in ``$CYCLER_STOP_SIGNALS``, where the script left the
default. It is a Python handler, not ``SIG_IGN``, so a program the worker executes starts with
the default again. Scripts that do not read the control file are never shielded: they get their
signal as under torchrun.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cycler.protocol.stop_signals import ignore_stray, stop_signals

__all__ = ["ignore_stray", "shield_from_stray_signals", "stop_signals"]


def shield_from_stray_signals() -> None:
    """Under ``cycle run``: stray stop signals do nothing here or in DataLoader workers forked
    from here. A no-op outside ``cycle run``."""
    numbers = stop_signals()
    if not numbers:
        return
    ignore_stray(numbers)
    _shield_dataloader_workers(numbers)


def _shield_dataloader_workers(numbers: list[int]) -> None:
    # torch's DataLoader worker loop calls signal_handling._set_worker_signal_handlers() first,
    # which gives SIGTERM a C handler that kills the worker; ours runs right after it.
    try:
        from torch.utils.data._utils import signal_handling
    except ImportError:
        return
    original: Callable[..., Any] = signal_handling._set_worker_signal_handlers
    if getattr(original, "_cycler_shield", False):
        return

    def set_worker_signal_handlers(*args: Any) -> None:
        original(*args)
        ignore_stray(numbers, over_any_handler=True)

    set_worker_signal_handlers._cycler_shield = True  # type: ignore[attr-defined]
    signal_handling._set_worker_signal_handlers = set_worker_signal_handlers
