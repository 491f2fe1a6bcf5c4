"""The saves in flight in this process, and the hooks that wait for them (a stop, the exit,
``destroy_process_group``).

A saver's asynchronous save runs on its own thread; the memory tier's persisting on another. A
stop decided by ``StepControl``, the interpreter's exit and ``destroy_process_group()`` must not
end the process (or take away the group those threads use) before what is in flight is
committed: each waits here, for the saves first, then for the work their commits queued. This is
the one part of the saver that ``cycler.training`` reaches.
"""

from __future__ import annotations

import os
import sys
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol

_IN_FLIGHT: weakref.WeakSet[_Waitable] = weakref.WeakSet()
"""Savers with an asynchronous save in flight."""
_QUEUED: weakref.WeakSet[_Waitable] = weakref.WeakSet()
"""Work that commits queue (persisting, partner copies): waited for after the saves, whose
commits may queue more of it."""
_IN_FLIGHT_LOCK = threading.Lock()
_stopping = threading.Event()


class _Waitable(Protocol):
    def wait(self, reported_too: bool = True) -> None: ...


class SaveHandle:
    """One save: ``wait()`` returns once the checkpoint is committed on every rank, and raises
    what made it fail. ``directory`` is the checkpoint's path; for an asynchronous save it is
    chosen in the background, so reading it waits until the directory exists."""

    def __init__(self, directory: str | Future[str], committed: Future[None] | None = None,
                 reported: threading.Event | None = None) -> None:
        self._directory = directory
        self._committed = committed
        self._reported = reported

    @property
    def directory(self) -> str:
        return self._directory if isinstance(self._directory, str) else self._directory.result()

    def done(self) -> bool:
        return self._committed is None or self._committed.done()

    def wait(self, timeout: float | None = None) -> None:
        if self._committed is None:
            return
        try:
            self._committed.result(timeout)
        except TimeoutError:
            raise
        except BaseException:
            if self._reported is not None:
                self._reported.set()  # a stop, destroy_process_group or the exit need not
            raise


class InFlight:
    """A saver's asynchronous save in flight: the future of its whole work (retention
    included), and whether its failure was already raised to the script by the handle."""

    def __init__(self) -> None:
        self.finished: Future[None] = Future()
        self.reported = threading.Event()

    def wait(self, reported_too: bool = True) -> None:
        """Wait for the work; raise its failure (with ``reported_too=False`` only if the
        handle's ``wait()`` has not raised it to the script already)."""
        try:
            self.finished.result()
        except BaseException:
            if reported_too or not self.reported.is_set():
                raise


def remember_in_flight(saver: _Waitable, *, queued_by_commits: bool = False) -> None:
    """Remember that ``saver`` has a save in flight, for :func:`wait_for_saves`
    (``queued_by_commits``: work that commits queue, waited for after every save)."""
    with _IN_FLIGHT_LOCK:
        (_QUEUED if queued_by_commits else _IN_FLIGHT).add(saver)


def stop_decided() -> None:
    """A stop was decided (``StepControl``): wait for the saves in flight, and make the stop's
    own save, asynchronous or not, return only once it is committed, since the process is about
    to end (and may destroy its process group first)."""
    _stopping.set()
    wait_for_saves()


def stopping() -> bool:
    return _stopping.is_set()


def wait_for_saves() -> None:
    """Wait for every save in flight in this process (a stop or the exit calls it)."""
    for waiting in (_IN_FLIGHT, _QUEUED):
        with _IN_FLIGHT_LOCK:
            savers = list(waiting)
        for saver in savers:
            saver.wait(reported_too=False)  # what the script was told of, it has handled


def _wait_at_exit() -> None:
    """At the interpreter's exit, before ``concurrent.futures`` stops taking work (after which a
    commit could not start its checksum threads): commit every save in flight, or end the
    process non-zero saying so. An exit 0 must never hide a lost checkpoint."""
    try:
        wait_for_saves()
    except BaseException as error:  # any failure: the exit code must say it
        sys.stderr.write(f"cycler: the asynchronous save in flight when the script ended was "
                         f"not committed ({type(error).__name__}: {error}); the previous "
                         "checkpoint is still the latest\n")
        sys.stderr.flush()
        os._exit(1)


# threading's exit hooks run newest first, before atexit's and before non-daemon threads are
# joined: registered after concurrent.futures' own (imported above), this one runs first.
threading._register_atexit(_wait_at_exit)  # type: ignore[attr-defined]


def wait_before_destroying_process_groups() -> None:
    """Make ``torch.distributed.destroy_process_group`` wait for the saves in flight first: a
    script that ends with it right after an asynchronous save would otherwise take away the
    group that the save's write and commit run on."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d

    original = distributed_c10d.destroy_process_group
    if getattr(original, "_cycler_waits", False):
        return

    def destroy_process_group(*args: Any, **kwargs: Any) -> None:
        wait_for_saves()
        original(*args, **kwargs)

    destroy_process_group._cycler_waits = True  # type: ignore[attr-defined]
    destroy_process_group.__doc__ = original.__doc__
    distributed_c10d.destroy_process_group = destroy_process_group
    dist.destroy_process_group = destroy_process_group


def start_save(worker: ThreadPoolExecutor,
                  work: Callable[[Callable[[str], None], Callable[[], None]], None],
                  ) -> tuple[SaveHandle, InFlight]:
    """Run a save's ``work`` on ``worker``, the saver's own thread (kept from one save to the
    next: starting a thread makes the caller wait while the new one takes the GIL, up to the
    5 ms switch interval, which ``dcp.async_save`` pays at every call). ``work`` is given two
    functions to call: with the checkpoint's directory once it exists (the handle's
    ``directory`` waits for it), and once the checkpoint is committed (the handle's ``wait``
    returns then, before retention's removals). Returns the handle and a
    future of the whole work, retention included, which the saver's next call waits for."""
    directory: Future[str] = Future()
    committed: Future[None] = Future()
    in_flight = InFlight()
    finished = in_flight.finished

    def run() -> None:
        try:
            work(directory.set_result, lambda: committed.set_result(None))
        except BaseException as error:  # handed to whoever waits
            for future in (directory, committed):
                if not future.done():
                    future.set_exception(error)
            finished.set_exception(error)
        else:
            if not committed.done():
                committed.set_result(None)
            finished.set_result(None)

    worker.submit(run)  # not a daemon: the interpreter's exit runs what is queued first
    return SaveHandle(directory, committed, in_flight.reported), in_flight
