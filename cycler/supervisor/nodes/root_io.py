"""The supervisor's calls on the checkpoint root while the workers train, off its loop.

A shared filesystem that stalls (seconds are routine on Lustre or NFS, a minute happens) would
stall a loop that waits for it: no beat published to the other nodes (which then take this node
for gone), no signal handled, no hang found. So what the loop does on the root at steady state
(its heartbeat file, the longest step interval, the look at the latest links) runs in one
thread of this module; the loop hands a call over and never waits for it. Each call has a name:
one handed over again before the thread took it replaces it (only the newest beat matters),
and :meth:`RootIO.busy` says whether one of that name is still under way (a frozen root: the
loop does not pile more on it).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)


class RootIO:
    """One daemon thread that runs the calls handed to it, the newest of each name."""

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._pending: dict[str, Callable[[], object]] = {}
        self._running: str | None = None
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="cycle-root-io", daemon=True)
        self._thread.start()

    def submit(self, name: str, call: Callable[[], object]) -> None:
        """Run ``call`` in the thread soon (replacing one of ``name`` not yet begun)."""
        with self._lock:
            self._pending[name] = call
            self._lock.notify()

    def busy(self, name: str) -> bool:
        """Whether a call of ``name`` is waiting or under way."""
        with self._lock:
            return name in self._pending or self._running == name

    def close(self) -> None:
        """Run no more calls (one under way finishes in its own time: the thread is a daemon,
        so a frozen root never holds up the process's exit)."""
        with self._lock:
            self._closed = True
            self._pending.clear()
            self._lock.notify()

    def _run(self) -> None:
        while True:
            with self._lock:
                self._lock.wait_for(lambda: self._pending or self._closed)
                if self._closed:
                    return
                name = next(iter(self._pending))
                call = self._pending.pop(name)
                self._running = name
            try:
                call()
            except Exception:  # noqa: BLE001 (a call's failure is its own to report)
                log.debug("root call %s failed", name, exc_info=True)
            finally:
                with self._lock:
                    self._running = None
