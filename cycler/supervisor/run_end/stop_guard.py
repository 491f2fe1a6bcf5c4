"""The last word on a stop's deadline: a thread that ends ``cycle run`` where its loop cannot.

The loop hands its calls on the checkpoint root to a thread of their own (:mod:`.root_io`),
but some must be made where they are (the end's copy and its set-aside, the lock, the records
of hangs and replays), and a shared filesystem can stall for minutes: every call on it then
waits in the kernel, where no signal reaches it. A stop must still end by its deadline (the
scheduler kills the job soon after), with the exit code that says where the newest state is.
So once a stop is under way, :class:`StopGuard` waits, in a thread, until the deadline plus the
time the kill of the workers takes plus a margin; if the process is still there then, it asks
its ``verdict`` (code and line, from what the loop last knew and this node's memory: nothing on
the root) and ends the process with it (the reaper then kills what is left of the workers).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

GUARD_MARGIN_SECONDS = 10.0
"""Past the deadline and the kill's own seconds: what a stop that ends on time may still take
on a root that is slow but answers (the end's copy gives up at the deadline, its set-aside, the
run's last records follow)."""


class StopGuard:
    """Ends the process with ``verdict()`` once an armed deadline has passed (monotonic)."""

    def __init__(self, verdict: Callable[[], tuple[int, str]],
                 clock: Callable[[], float] = time.monotonic,
                 end: Callable[[int], None] = os._exit) -> None:
        self._verdict, self._clock, self._end = verdict, clock, end
        self._lock = threading.Condition()
        self._at: float | None = None
        self._thread: threading.Thread | None = None
        self._done = False

    def arm(self, seconds_left: float) -> None:
        """Fire ``seconds_left`` from now (again: the deadline moved), unless disarmed first."""
        with self._lock:
            if self._done:
                return
            self._at = self._clock() + max(0.0, seconds_left)
            self._lock.notify_all()
            if self._thread is None:
                self._thread = threading.Thread(target=self._wait, name="cycle-stop-guard",
                                                daemon=True)
                self._thread.start()

    def disarm(self) -> None:
        """The run ended by itself: never fire."""
        with self._lock:
            self._done = True
            self._lock.notify_all()

    def _wait(self) -> None:
        with self._lock:
            while not self._done and (self._at is None or self._clock() < self._at):
                self._lock.wait(None if self._at is None else max(0.0, self._at - self._clock()))
            if self._done:
                return
        code, line = self._verdict()
        os.write(2, f"cycle: {line}\ncycle: cycle run ends (exit {code})\n".encode())
        self._end(code)
