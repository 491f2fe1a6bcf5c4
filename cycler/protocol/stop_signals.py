"""The job's stop signals, and the handler that makes a stray one do nothing.

``cycle run`` passes the signals it treats as stop requests to every process of the job in
``$CYCLER_STOP_SIGNALS``; a process that must not die of one that reaches it directly (torchrun
under the supervisor, a worker that reads the control file) gives it :func:`ignore_stray`'s
handler, which only says so once. No torch here: the launcher imports this on its start-up path.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from types import FrameType

from cycler.protocol.environment import ENV_STOP_SIGNALS

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
