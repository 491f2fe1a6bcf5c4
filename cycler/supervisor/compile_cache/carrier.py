"""Carrying the compile cache while the run goes on, not only when it ends.

A job whose node dies, or whose ``cycle run`` is killed (Slurm's SIGKILL after the grace, a
``kill -9``), never reaches the carry at the end of the run, and its requeue on a fresh node
would compile from scratch: the very case the carried cache is for. So node 0's supervisor also
carries when a checkpoint is committed (by then the step that compiled has run), in a thread of
its own at the lowest CPU priority (and so I/O priority, which Linux derives from it where the
disk's scheduler has priorities: BFQ, CFQ), never in the loop that beats, reads the beacons
and watches for hangs.

A carry that wrote (or tried to) is followed by none for :data:`CARRY_INTERVAL_SECONDS`; one
that found nothing new costs a directory scan and the tar's headers. A stop calls the carry in
flight off at its next chunk, since the grace is for the checkpoint; when the run ends, the
carry in flight is called off and waited for (at most :data:`JOIN_SECONDS`), and the end's
carry is made once, as it always was.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from cycler.supervisor.compile_cache.archive import CACHE, CARRIED, HEADERS, cache_files, pack
from cycler.supervisor.compile_cache.place import (
    cache_key,
    carried_path,
    node_cache_dir,
    own_headers_dir,
    uses_own_cache,
)
from cycler.supervisor.configuration.options import RunOptions

log = logging.getLogger("cycler.supervisor")

CARRY_INTERVAL_SECONDS = 300.0
"""Between two carries during a run. A carry rewrites the whole file, torch's precompiled
header (156 MB) included, so a job that recompiles often (new shapes, an evaluation) would
otherwise write hundreds of MB at every checkpoint; once in 5 minutes keeps that under 1 MB/s
on average while the first carry, the one a requeue needs most, still follows the first
checkpoint after the compile."""
SETTLE_SECONDS = 5.0
"""A file changed more recently may still be being written: the compiler writes its kernels
and the precompiled header in place, not through a rename. A carry waits until the newest file
is this old."""
SETTLE_WAITS = 12
"""Waits for the cache to settle before a carry gives up until the next checkpoint."""
JOIN_SECONDS = 5.0
"""How long the end of a run waits for a carry in flight to stop (it stops at its next 16 KiB;
more means the file system hangs, and the end's carry would hang too)."""

Recorder = Callable[..., Any]


class CompileCacheCarrier:
    """Node 0's carries of its compile cache into the checkpoint root during and at the end of
    one ``cycle run`` (nothing on other nodes, or when the user chose their own cache)."""

    def __init__(self, options: RunOptions, record: Recorder, *,
                 interval: float = CARRY_INTERVAL_SECONDS, settle: float = SETTLE_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._record = record
        self._interval, self._settle, self._clock = interval, settle, clock
        self._active = options.node_rank == 0 and not uses_own_cache(os.environ)
        self._cancel = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_try: float | None = None
        if self._active:
            self._key = cache_key(options.script)  # the key the workers' cache was named by
            self._sources = {CACHE: node_cache_dir(options, self._key)}
            headers, _ = own_headers_dir()  # not the user's: warned of at start
            if headers is not None:
                self._sources[HEADERS] = headers
            self._carried = carried_path(options)

    def checkpoint_committed(self) -> None:
        """A checkpoint was committed: carry in the background unless a carry is in flight, a
        stop began, or the last one was less than the interval ago. Returns at once."""
        if not self._active or self._cancel.is_set() or self.busy():
            return
        if self._last_try is not None and self._clock() - self._last_try < self._interval:
            return
        self._thread = threading.Thread(target=self._carry, name="cycle-compile-carry",
                                        daemon=True)
        self._thread.start()

    def busy(self) -> bool:
        """Whether a carry is in flight."""
        return self._thread is not None and self._thread.is_alive()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the carry in flight to end; whether none is in flight now."""
        if self._thread is not None:
            self._thread.join(timeout)
        return not self.busy()

    def call_off(self) -> None:
        """A stop began: no new carry, and the one in flight stops at its next chunk, leaving
        the carried file as it was."""
        self._cancel.set()

    def finish(self) -> None:
        """The run ends and its workers are gone: call off the carry in flight, wait for it
        (at most :data:`JOIN_SECONDS`), then carry what is new, once. Never raises."""
        if not self._active:
            return
        self._cancel.set()
        if not self.wait(JOIN_SECONDS):
            self._say(f"the compile cache is not carried when this run ends: a carry in "
                      f"flight did not stop within {JOIN_SECONDS:g} s")
            return
        self._say(pack(self._sources, self._carried, self._key))

    def _carry(self) -> None:
        with contextlib.suppress(OSError):  # this thread only (Linux): CPU and I/O
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        started = self._clock()
        try:
            said = pack(self._sources, self._carried, self._key, cancel=self._cancel) \
                if self._settled() else None
        except Exception as error:  # noqa: BLE001 - a carry never ends the supervisor
            said = f"the compile cache could not be carried in {self._carried}: {error!r}"
        if said is not None:
            self._last_try = started
            self._say(said)

    def _settled(self) -> bool:
        """Wait until no file of the cache changed for :data:`SETTLE_SECONDS`; ``False`` when
        it kept changing or the carry was called off."""
        for _ in range(SETTLE_WAITS):
            try:
                newest = max((os.lstat(path).st_mtime for _, _, path in
                              cache_files(self._sources)), default=0.0)
            except FileNotFoundError:
                newest = time.time()  # a file just went: something is writing
            age = time.time() - newest
            if age >= self._settle:
                return True
            if self._cancel.wait(min(self._settle - age, self._settle)):
                return False
        return False

    def _say(self, said: str | None) -> None:
        """An event for a carry, a warning one for a carry that failed; a log line only when
        the root takes no event either (full, read-only)."""
        if said is None:
            return
        failed = not said.startswith(CARRIED)
        event = "compile_cache_not_carried" if failed else "compile_cache_carried"
        try:
            self._record(event, warning=failed, said=said)
        except OSError:
            log.warning("%s", said)
