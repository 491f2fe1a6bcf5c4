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

import os
import signal
import sys
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

from cycler.environment import ENV_STOP_SIGNALS

_said: set[int] = set()


def _stray(number: int, frame: FrameType | None) -> None:
    if number not in _said:
        _said.add(number)
        name = signal.Signals(number).name
        sys.stderr.write(f"cycler: {name} reached process {os.getpid()} directly; ignored: "
                         "cycle run decides when the job stops\n")


def stop_signals(environ: dict[str, str] | os._Environ[str] | None = None) -> list[int]:
    """The signals ``cycle run`` treats as stop requests, from ``$CYCLER_STOP_SIGNALS``."""
    text = (os.environ if environ is None else environ).get(ENV_STOP_SIGNALS, "")
    names = [name.strip() for name in text.split(",") if name.strip()]
    return [signal.Signals[name] for name in names if name in signal.Signals.__members__]


def ignore_stray(numbers: list[int], *, over_any_handler: bool = False) -> None:
    """Give each of ``numbers`` the do-nothing handler where its handler is still the default,
    or whatever it is with ``over_any_handler`` (main thread only: elsewhere Python cannot set
    handlers, and nothing is changed)."""
    if threading.current_thread() is not threading.main_thread():
        return
    for number in numbers:
        current = signal.getsignal(number)
        if over_any_handler or current in (signal.SIG_DFL, signal.default_int_handler, None):
            signal.signal(number, _stray)


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

