"""Sharded and asynchronous saves with torch.distributed.checkpoint, through cycler's commit.

:meth:`cycler.AtomicDirectory.save` (through :class:`DcpSaves`) writes a state dict with DCP
(every rank its shards, the coordinator rank DCP's ``.metadata``) into the directory
``prepare_checkpoint_directory`` made, then commits it like any checkpoint: every rank fsyncs
and checksums its own shards, rank 0 writes the manifest from their records and swaps the latest
link. Nothing here replaces DCP: the format, the planners, the resharding on load and the
staging are torch's.

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
import warnings
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol

from cycler._distributed import in_process_group
from cycler._fs import remove_logged
from cycler.checkpoint.coordination import COORDINATED, Coordinator
from cycler.checkpoint.in_flight import (
    InFlight,
    SaveHandle,
    remember_in_flight,
    start_save,
    stopping,
    wait_before_destroying_process_groups,
)
from cycler.checkpoint.manifest import read_manifest
from cycler.checkpoint.retainer import discard
from cycler.errors import DiskFull, StateMismatch
from cycler.protocol.progress import SAVING, beacon


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


class Saver(Protocol):
    """What :class:`DcpSaves` asks of the saver it writes for (:class:`cycler.AtomicDirectory`):
    its own private steps, named here so that this module never imports the saver."""

    def _prepare(self, force_save: bool) -> str: ...

    def _commit(self, checkpoint_directory: str | os.PathLike[str],
                metadata: Mapping[str, Any] | None,
                committed: Callable[[], None] = ...) -> None: ...

    def _agreed(self, requested: str | None, strict: bool) -> Path | None: ...

    def _ensure_node_group(self) -> None: ...

    def _in_memory_tier(self) -> bool: ...

    def _leave_memory_tier(self, why: str) -> None: ...


class DcpSaves:
    """``save()``, ``load()`` and ``wait()`` of a saver: its saves written by
    torch.distributed.checkpoint, synchronously or in the saver's own background thread, then
    committed by the saver like any checkpoint. The saver passes itself to each call: nothing
    here holds it (a dropped saver lets go of its writer lock at once)."""

    def __init__(self, coordinator: Coordinator, strategy: str) -> None:
        self._coordinator = coordinator
        self._strategy = strategy
        self._in_flight: InFlight | None = None
        """The asynchronous save in flight, until its retention is done."""
        self.stager: Any = None
        self._worker: ThreadPoolExecutor | None = None
        """The thread of this saver's asynchronous saves, from its first one on."""
        self._async_group: Any = None

    def save(self, saver: Saver, state_dict: dict[str, Any],
             metadata: Mapping[str, Any] | None = None, *, asynchronous: bool = False,
             ) -> SaveHandle:
        """See :meth:`cycler.AtomicDirectory.save`."""
        import torch.distributed.checkpoint as dcp

        self.settle()  # one save in flight at a time: its staging memory is reused next
        saver._ensure_node_group()  # collective: on the script's thread, before others
        # Decided now, not in the background: the script may destroy its group right after.
        no_dist = self._saves_alone()
        if not asynchronous:
            with beacon().phase(SAVING):
                directory = self._prepare_and_write(
                    saver, lambda into: dcp.save(state_dict, checkpoint_id=into, no_dist=no_dist))
                saver._commit(directory, metadata)
            return SaveHandle(directory)
        if self._worker is None:
            wait_before_destroying_process_groups()
            self.stager = default_stager()
            self._async_group = None if no_dist else async_group()
            self._worker = ThreadPoolExecutor(1, thread_name_prefix="cycler-async-save")
        staged, group = stage(self.stager, state_dict), self._async_group

        # Everything after the snapshot runs in the background, preparing the directory too
        # (a store round, a mkdir: 3-16 ms measured, which DCP's own async_save does not pay).
        def prepare_write_commit(prepared: Callable[[str], None],
                                 committed: Callable[[], None]) -> None:
            directory = self._prepare_and_write(
                saver, lambda into: dcp.save(staged, checkpoint_id=into, no_dist=no_dist,
                                             process_group=group), prepared)
            saver._commit(directory, metadata, committed)

        remember_in_flight(self)
        handle, self._in_flight = start_save(self._worker, prepare_write_commit)
        if stopping():
            self.wait()  # the stop's own save: the process ends next
        return handle

    def _saves_alone(self) -> bool:
        """Whether this saver's DCP calls run without the process group (``no_dist``): without
        one, or with a strategy where each process saves for itself. Binds the coordinator
        to the group of this moment."""
        self._coordinator.rank  # noqa: B018 (resolves the binding now)
        return alone() or self._strategy not in COORDINATED

    def _prepare_and_write(self, saver: Saver, write: Callable[[str], object],
                           prepared: Callable[[str], None] | None = None) -> str:
        """A new checkpoint directory with DCP's ``write`` into it done; its name goes to
        ``prepared`` once final. A memory tier too full for it (DCP's write found no room:
        the first checkpoint's size is not known before it is written) sends this save and
        every later one to the checkpoint root, with one warning, instead of failing."""
        directory = saver._prepare(force_save=False)
        in_memory = saver._in_memory_tier()
        if prepared is not None and not in_memory:
            prepared(directory)
        try:
            self._write(lambda: write(directory), directory)
        except DiskFull:
            if not in_memory:
                raise
            saver._leave_memory_tier("a save did not fit")
            directory = saver._prepare(force_save=False)
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
                remove_logged(discard, Path(directory), "failed save")
            raise disk_full_or(error, directory) from error

    def settle(self) -> None:
        """Before the saver's next save, commit or load: wait for the save in flight, and raise
        its failure only if the script was not told of it. One the handle's ``wait()`` raised,
        the script has handled: it must not fail the next save too (that save may be the
        stop's)."""
        self.wait(reported_too=False)

    def wait(self, reported_too: bool = True) -> None:
        """See :meth:`cycler.AtomicDirectory.wait`."""
        in_flight, self._in_flight = self._in_flight, None
        if in_flight is not None:
            in_flight.wait(reported_too)

    def load(self, saver: Saver, state_dict: dict[str, Any], checkpoint: str | int | None = None,
             strict: bool = False) -> dict[str, Any] | None:
        """See :meth:`cycler.AtomicDirectory.load`."""
        import torch.distributed.checkpoint as dcp

        self.settle()
        self._saves_alone()  # binds the coordinator to the group of this moment
        requested = None if checkpoint is None else str(checkpoint)
        path = saver._agreed(requested, strict)
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
