"""The job's stop signals, and the shield that makes a stray one do nothing.

Some clusters signal every process of a job (Slurm's proctrack/pgid or linuxproc, some time
limits), not just the batch script: torchrun, each worker and each DataLoader worker get the
SIGTERM that ``cycle run`` also gets. The supervisor decides the stop. ``cycle run`` passes the
signals it treats as stop requests to every process of the job in ``$CYCLER_STOP_SIGNALS``; a
process that must not die of one that reaches it directly gives it :func:`ignore_stray`'s
handler, which only says so once: torchrun under the supervisor, and a worker that stops on its
own at the agreed step (``StepControl``) or after its next commit (cycler's savers), together
with the DataLoader workers it forks (:func:`shield_from_stray_signals`; torch gives those a
C-level SIGTERM handler that kills them, and the next batch would then fail). It is a Python
handler, not ``SIG_IGN``, so a program the worker executes starts with the default again.
Scripts that use neither are never shielded: they get their signal as under torchrun.

The shield is for stray signals, not for cycle's own: once a stop checkpoint is committed, the
supervisor lowers every shield of its node (:func:`lower_shields`, a file beside the control
file) before it sends its TERM, so the worker's DataLoader workers end with it instead of
waiting for the SIGKILL. And a worker whose script set its own SIGTERM handler, before or after
building a saver, says so (:data:`~cycler.protocol.features.USES_OWN_HANDLER`): the supervisor
then forwards the signal at once, as torchrun would, instead of waiting for a commit.

torch is imported only inside the DataLoader shield: the launcher imports this on its start-up
path.
"""

from __future__ import annotations

import functools
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

from cycler.protocol.environment import ENV_CONTROL_FILE, ENV_STOP_SIGNALS
from cycler.protocol.features import USES_OWN_HANDLER, announce, withdraw

_said: set[int] = set()
_lowered = threading.Event()
_shielded_worker = False
"""Whether this process is a shielded worker or was forked from one (a DataLoader worker):
cycle's own TERM after a stop checkpoint is for it (never for torchrun's launcher)."""
LOWERED_SUFFIX = ".shields-lowered"
HANDLER_LOOK_SECONDS = 0.2
"""How often a shielded worker looks whether its script set a SIGTERM handler of its own."""


def lowered_path(control_path: Path) -> Path:
    """The file whose presence lowers the shields of the workers reading ``control_path``."""
    return control_path.with_name(control_path.stem + LOWERED_SUFFIX)


def lower_shields(control_path: Path) -> None:
    """Supervisor: the stop checkpoint is committed; the TERM that follows is cycle's own and
    ends every shielded process of this node (best effort: without it they get SIGKILL)."""
    try:
        lowered_path(control_path).touch(mode=0o600)
    except OSError:
        pass


def raise_shields(control_path: Path) -> None:
    """Supervisor, before every start of the workers: stray signals are ignored again."""
    lowered_path(control_path).unlink(missing_ok=True)


def _lowered_by_cycle() -> bool:
    control = os.environ.get(ENV_CONTROL_FILE)
    return _shielded_worker and control is not None and lowered_path(Path(control)).exists()


def lower_shield() -> None:
    """From now on a stop signal does what it would without the shield (any thread may call
    it: the handler itself, on the main thread, restores the default and re-raises)."""
    _lowered.set()


def on_stray_signal(number: int, frame: FrameType | None) -> None:
    """The shield's handler: says once that the signal came and was ignored (after
    :func:`lower_shield`, does what the signal would have done)."""
    if _lowered.is_set() or _lowered_by_cycle():
        signal.signal(number, signal.SIG_DFL)
        os.kill(os.getpid(), number)
        return
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
            signal.signal(number, on_stray_signal)


def shield_from_stray_signals() -> None:
    """Under ``cycle run``: stray stop signals do nothing here or in DataLoader workers forked
    from here. A no-op outside ``cycle run``."""
    global _shielded_worker
    numbers = stop_signals()
    if not numbers:
        return
    _shielded_worker = True
    ignore_stray(numbers)
    _shield_dataloader_workers(numbers)
    _end_shielded_children_at_exit()
    _watch_for_an_own_handler()


def has_own_handler(number: int = signal.SIGTERM) -> bool:
    """Whether the script gave ``number`` a handler of its own (neither a default, nor
    ``SIG_IGN``, nor the shield's)."""
    handler = signal.getsignal(number)
    return callable(handler) and handler not in (on_stray_signal, signal.default_int_handler)


@functools.cache  # one watcher per process
def _watch_for_an_own_handler() -> None:
    """Announce an own SIGTERM handler as soon as the script sets one, whenever that is (a
    save-only script may set it after its saver, and tell cycle nothing more until its next
    commit), and withdraw it when the script gives the default back."""

    def look(said: bool) -> None:
        while True:
            time.sleep(HANDLER_LOOK_SECONDS)
            if has_own_handler() != said:
                said = not said
                (announce if said else withdraw)(USES_OWN_HANDLER)

    said = has_own_handler()
    if said:
        announce(USES_OWN_HANDLER)
    threading.Thread(target=look, args=(said,), name="cycler-handler-watch", daemon=True).start()


@functools.cache  # once per process
def _end_shielded_children_at_exit() -> None:
    """At exit, multiprocessing ends this process's daemonic children (DataLoader workers of an
    iterator still alive) with SIGTERM and joins them, and their shield ignores the TERM: the
    process would never end. An exit hook of ours, run before multiprocessing's, kills them
    first, as the TERM would have without the shield."""
    import atexit
    import multiprocessing.util  # noqa: F401  its exit hook first: ours then runs before it

    atexit.register(_end_daemonic_children)


def _end_daemonic_children() -> None:
    import multiprocessing

    children = [child for child in multiprocessing.active_children() if child.daemon]
    if not children:
        return
    # torch's SIGCHLD handler would take these deaths for a DataLoader failure and raise.
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for child in children:
        child.kill()
    for child in children:
        child.join(5)


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
