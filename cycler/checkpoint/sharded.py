"""Sharded and asynchronous saves with torch.distributed.checkpoint, through cycler's commit.

:meth:`cycler.AtomicDirectory.save` writes a state dict with DCP (every rank its shards, the
coordinator rank DCP's ``.metadata``) into the directory ``prepare_checkpoint_directory`` made,
then commits it like any checkpoint: every rank fsyncs and checksums its own shards, rank 0
writes the manifest from their records and swaps the latest link. Nothing here replaces DCP:
the format, the planners, the resharding on load and the staging are torch's.

Asynchronous saves (``asynchronous=True``) block training only while DCP's ``DefaultStager``
copies the state into staging memory that is reused from one save to the next; preparing the
directory, DCP's write (``dcp.save`` of the staged copy, as ``dcp.async_save`` runs it), the
fsyncs and checksums and the commit run in a background thread. At most one save is in
flight per saver (the next save, commit or load waits for it), a stop decided by
``StepControl`` and the interpreter's exit wait for every save in flight, and a process killed
during the background write leaves the previous latest checkpoint as it was.
"""

from __future__ import annotations

import contextlib
import errno
import os
import sys
import threading
import warnings
import weakref
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol

from cycler._distributed import in_process_group
from cycler._fs import discard_directory, remove_logged
from cycler.checkpoint.coordination import COORDINATED, Coordinator
from cycler.checkpoint.layout import CheckpointLayout
from cycler.checkpoint.manifest import read_manifest
from cycler.errors import DiskFull, StateMismatch
from cycler.protocol.progress import SAVING, beacon

_IN_FLIGHT: weakref.WeakSet[_Waitable] = weakref.WeakSet()
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


def remember_in_flight(saver: _Waitable) -> None:
    """Remember that ``saver`` has a save in flight, for :func:`wait_for_saves`."""
    with _IN_FLIGHT_LOCK:
        _IN_FLIGHT.add(saver)


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
    with _IN_FLIGHT_LOCK:
        savers = list(_IN_FLIGHT)
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


def in_background(worker: ThreadPoolExecutor,
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


def disk_full_or(error: BaseException, directory: str) -> BaseException:
    """:class:`DiskFull` if ``error`` (DCP's ``CheckpointException`` of any rank included) comes
    from a full disk, else ``error`` itself."""
    from cycler._fs import caused_by_full_disk, disk_full_message

    failures = getattr(error, "failures", None)
    causes = [pair[0] for pair in failures.values()] if isinstance(failures, dict) else [error]
    if not any(caused_by_full_disk(cause) for cause in causes):
        return error
    full = DiskFull(disk_full_message(Path(directory) / ".", None))
    full.errno = errno.ENOSPC
    return full


def stage(stager: Any, state_dict: dict[str, Any]) -> Any:
    """The snapshot an asynchronous save writes: ``Stateful`` entries turned into their state
    dicts now (as ``dcp.async_save`` does), then every tensor copied into ``stager``'s
    staging memory (:func:`default_stager` stages synchronously, so this is the staged state
    dict itself). The only part of an asynchronous save that training waits for."""
    from torch.distributed.checkpoint.stateful import Stateful

    return stager.stage({key: value.state_dict() if isinstance(value, Stateful) else value
                         for key, value in state_dict.items()})


def default_stager() -> Any:
    """DCP's stager with reused staging buffers in plain memory. Shared memory buys nothing
    here (the write runs on a thread of this process, not in another process) and a process
    killed during its first save leaked full-size ``/dev/shm/torch_<pid>_*`` segments that
    nothing removes (issue 16). Measured on this machine, staging 100 MB / 1 GB from the
    second save on: 7.1 / 55-57 ms in plain memory against 6.9-7.4 / 54-72 ms shared."""
    try:
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
    except ImportError as error:
        import torch

        from cycler.errors import UnsupportedTorch

        raise UnsupportedTorch(
            f"asynchronous saves need torch 2.9 or newer (DCP's DefaultStager); this is torch "
            f"{torch.__version__}: upgrade torch, or save with asynchronous=False") from error
    return DefaultStager(StagingOptions(use_pinned_memory=False, use_shared_memory=False,
                                        use_async_staging=False, use_non_blocking_copy=False))


@contextlib.contextmanager
def quiet_if_alone() -> Iterator[None]:
    """Without a process group, DCP warns on every call that it assumes one process: that is
    the intended use here, not news."""
    with warnings.catch_warnings():
        if alone():
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def alone() -> bool:
    """Whether this process saves without a process group (DCP's ``no_dist``)."""

    return not in_process_group()


def async_group() -> Any:
    """A gloo group of every rank for DCP's background write, or ``None`` alone: collectives of
    a background thread must not share the group the training's collectives use."""
    import torch.distributed as dist

    if not in_process_group() or dist.get_world_size() == 1:
        return None
    return dist.new_group(backend="gloo")


class ShardedSaves:
    """``save()``, ``load()`` and ``wait()`` of :class:`cycler.AtomicDirectory`: its saves
    written by torch.distributed.checkpoint, synchronously or in the saver's own background
    thread, then committed by the saver like any checkpoint."""

    layout: CheckpointLayout
    strategy: str
    _coordinator: Coordinator
    _in_flight: InFlight | None
    _stager: Any = None
    _worker: ThreadPoolExecutor | None = None
    """The thread of this saver's asynchronous saves, from its first one on."""
    _async_group: Any = None

    def _prepare(self, force_save: bool) -> str:
        raise NotImplementedError

    def _ensure_node_group(self) -> None:
        raise NotImplementedError

    def _agreed(self, requested: str | None, strict: bool) -> Path | None:
        raise NotImplementedError

    def _tiers(self) -> list[CheckpointLayout]:
        raise NotImplementedError

    def _in_memory_tier(self) -> bool:
        raise NotImplementedError

    def _leave_memory_tier(self, why: str) -> None:
        raise NotImplementedError

    def _commit(self, checkpoint_directory: str | os.PathLike[str],
                metadata: Mapping[str, Any] | None,
                committed: Callable[[], None] = lambda: None) -> None:
        raise NotImplementedError

    def save(self, state_dict: dict[str, Any], metadata: Mapping[str, Any] | None = None, *,
             asynchronous: bool = False) -> SaveHandle:
        """Every rank: write ``state_dict`` with torch.distributed.checkpoint into a new
        checkpoint and commit it (see :mod:`cycler.checkpoint.sharded`).

        ``asynchronous=False`` returns once the checkpoint is committed. ``asynchronous=True``
        returns as soon as the state is copied into staging memory: ``state_dict`` may change
        then, and the returned handle's ``wait()`` (or :meth:`wait`) returns once committed.
        With ``strategy`` ``"mono"``, ``"async"`` or ``"offline"`` each process writes its
        ``state_dict`` whole, alone (DCP's ``no_dist``); sharded (FSDP) state needs
        ``"sync_any"`` or ``"sync_all"``.
        """
        import torch.distributed.checkpoint as dcp

        self.wait()  # one save in flight at a time: its staging memory is reused next
        self._ensure_node_group()  # collective: on the script's thread, before any other group
        # Decided now, not in the background: the script may destroy its group right after.
        no_dist = self._saves_alone()
        if not asynchronous:
            with beacon().phase(SAVING):
                directory = self._prepare_and_write(
                    lambda into: dcp.save(state_dict, checkpoint_id=into, no_dist=no_dist))
                self._commit(directory, metadata)
            return SaveHandle(directory)
        if self._worker is None:
            wait_before_destroying_process_groups()
            self._stager = default_stager()
            self._async_group = None if no_dist else async_group()
            self._worker = ThreadPoolExecutor(1, thread_name_prefix="cycler-async-save")
        staged, group = stage(self._stager, state_dict), self._async_group

        # Everything after the snapshot runs in the background, preparing the directory too
        # (a store round, a mkdir: 3-16 ms measured, which DCP's own async_save does not pay).
        def prepare_write_commit(prepared: Callable[[str], None],
                                 committed: Callable[[], None]) -> None:
            directory = self._prepare_and_write(
                lambda into: dcp.save(staged, checkpoint_id=into, no_dist=no_dist,
                                      process_group=group), prepared)
            self._commit(directory, metadata, committed)

        remember_in_flight(self)
        handle, self._in_flight = in_background(self._worker, prepare_write_commit)
        if stopping():
            self.wait()  # the stop's own save: the process ends next
        return handle

    def _saves_alone(self) -> bool:
        """Whether this saver's DCP calls run without the process group (``no_dist``): without
        one, or with a strategy where each process saves for itself. Binds the coordinator
        to the group of this moment."""
        self._coordinator.rank  # noqa: B018 (resolves the binding now)
        return alone() or self.strategy not in COORDINATED

    def _prepare_and_write(self, write: Callable[[str], object],
                           prepared: Callable[[str], None] | None = None) -> str:
        """A new checkpoint directory with DCP's ``write`` into it done; its name goes to
        ``prepared`` once final. A memory tier too full for it (DCP's write found no room:
        the first checkpoint's size is not known before it is written) sends this save and
        every later one to the checkpoint root, with one warning, instead of failing."""
        directory = self._prepare(force_save=False)
        in_memory = self._in_memory_tier()
        if prepared is not None and not in_memory:
            prepared(directory)
        try:
            self._write(lambda: write(directory), directory)
        except DiskFull:
            if not in_memory:
                raise
            self._leave_memory_tier("a save did not fit")
            directory = self._prepare(force_save=False)
            self._write(lambda: write(directory), directory)
        if prepared is not None and in_memory:
            prepared(directory)
        return directory

    def _write(self, write: Callable[[], object], directory: str) -> None:
        """DCP's write into ``directory``; a failure removes what it wrote at once (a partial
        shard on a full disk would make every later save fail too) and a full disk is
        :class:`DiskFull`, whichever way torch reports it."""
        try:
            with quiet_if_alone():
                write()
        except BaseException as error:
            if self._coordinator.is_creator:
                remove_logged(discard_directory, Path(directory), "failed save")
            raise disk_full_or(error, directory) from error

    def wait(self, reported_too: bool = True) -> None:
        """Wait until this saver's asynchronous save in flight, if any, is committed and its
        retention done; raises what made it fail (once; ``reported_too=False``: only if the
        handle's ``wait()`` did not raise it already)."""
        in_flight, self._in_flight = self._in_flight, None
        if in_flight is not None:
            in_flight.wait(reported_too)

    def load(self, state_dict: dict[str, Any], checkpoint: str | int | None = None,
             strict: bool = False) -> dict[str, Any] | None:
        """Every rank: load a checkpoint saved by :meth:`save` into ``state_dict``, in place
        and resharded to this world size; return its metadata (``None``: no checkpoint).

        ``checkpoint`` (a name or an index) picks one; default the newest valid one. All
        ranks agree on it through the store, each verifying the checksums of its own share
        (:mod:`cycler.checkpoint.resume`). ``strict``: raise when checkpoints exist and none
        is valid, instead of warning and returning ``None``.
        """
        import torch.distributed.checkpoint as dcp

        self.wait()
        self._saves_alone()  # binds the coordinator to the group of this moment
        requested = None if checkpoint is None else str(checkpoint)
        path = self._agreed(requested, strict)
        if path is None:
            return None
        if not (Path(path) / ".metadata").is_file():
            raise StateMismatch(
                f"{Path(path).name} was not written by save() (it has no torch.distributed."
                "checkpoint .metadata): load its files with torch.load(os.path.join("
                "saver.latest_checkpoint(), NAME)) as they were written")
        with quiet_if_alone():
            dcp.load(state_dict, checkpoint_id=str(path), no_dist=self._saves_alone())
        return read_manifest(Path(path)).metadata
