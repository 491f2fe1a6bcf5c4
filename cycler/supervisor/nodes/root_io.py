"""The supervisor's calls on the checkpoint root while the workers train, off its loop.

A shared filesystem that stalls (seconds are routine on Lustre or NFS, a minute happens) would
stall a loop that waits for it: no beat published to the other nodes (which then take this node
for gone), no signal handled, no hang found. So what the loop does on the root at steady state
(its heartbeat file, the longest step interval, the look at the latest links) runs in one
thread of this module; the loop hands a call over and never waits for it. Each call has a name:
one handed over again before the thread took it replaces it (only the newest beat matters),
and :meth:`RootIO.busy` says whether one of that name is still under way (a frozen root: the
loop does not pile more on it). The run's records (its events, the root's copy of the control
request) go through the same thread in the order they were made (:meth:`RootIO.in_order`), so
that a stop told during a freeze reaches the workers at once; :meth:`RootIO.run` waits a bounded
time for a call whose answer the loop needs (the look at the links), and :meth:`RootIO.close`
gives what is still pending a bounded time at the end.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)


class RootIO:
    """One daemon thread that runs the calls handed to it: those made in order, in their order,
    then the newest of each name."""

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._ordered: deque[Callable[[], object]] = deque()
        self._pending: dict[str, Callable[[], object]] = {}
        self._running: str | None = None
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="cycle-root-io", daemon=True)
        self._thread.start()

    def submit(self, name: str, call: Callable[[], object]) -> None:
        """Run ``call`` in the thread soon (replacing one of ``name`` not yet begun)."""
        with self._lock:
            self._pending[name] = call
            self._lock.notify_all()

    def in_order(self, call: Callable[[], object]) -> None:
        """Run ``call`` in the thread after every call handed over in order before it."""
        with self._lock:
            if not self._closed:
                self._ordered.append(call)
                self._lock.notify_all()

    def run(self, name: str, call: Callable[[], Any], timeout: float) -> tuple[bool, Any]:
        """Run ``call`` in the thread and wait at most ``timeout`` s for it: ``(True, its
        result)``, or ``(False, None)`` where the root did not answer in time (the call still
        runs there, its result dropped; one of ``name`` handed over again replaces it while
        it has not begun). A failure of the call is raised here."""
        done = threading.Event()
        answer: list[Any] = []

        def call_and_keep() -> None:
            try:
                answer.append((True, call()))
            except BaseException as error:  # noqa: BLE001 (raised again in the caller)
                answer.append((False, error))
            finally:
                done.set()

        self.submit(name, call_and_keep)
        if not done.wait(timeout) or not answer:
            return False, None
        succeeded, value = answer[0]
        if not succeeded:
            raise value
        return True, value

    def busy(self, name: str) -> bool:
        """Whether a call of ``name`` is waiting or under way."""
        with self._lock:
            return name in self._pending or self._running == name

    def close(self, wait: float = 0.0) -> int:
        """Give the calls made in order at most ``wait`` s to be done, then run no more calls;
        returns how many of them were left undone (a frozen root). One under way finishes in
        its own time: the thread is a daemon, so a frozen root never holds up the exit."""
        end = time.monotonic() + wait
        with self._lock:
            self._lock.wait_for(lambda: not self._ordered and self._running != _ORDERED,
                                max(0.0, end - time.monotonic()))
            left = len(self._ordered) + (self._running == _ORDERED)
            self._closed = True
            self._ordered.clear()
            self._pending.clear()
            self._lock.notify_all()
        return left

    def _run(self) -> None:
        while True:
            with self._lock:
                self._lock.wait_for(lambda: self._ordered or self._pending or self._closed)
                if self._closed:
                    return
                if self._ordered:
                    name, call = _ORDERED, self._ordered.popleft()
                else:
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
                    self._lock.notify_all()


_ORDERED = " in order"
"""The name a call made in order runs under (no named call has it)."""
