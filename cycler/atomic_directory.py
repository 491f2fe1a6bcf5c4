"""``AtomicDirectory``: cycling_utils' directory saver, with a commit that cannot be torn.

Every rank calls ``prepare_checkpoint_directory()`` and then ``symlink_latest(path)`` (or its
other names ``atomic_symlink`` and ``commit``); in between, any rank writes its own files into
the directory. Rank 0 creates and commits; every rank gets the same path and returns from the
commit only once it is durable. The commit protocol is DESIGN.md's: fsync the files, write the
manifest last, point a unique temporary link at the directory and rename it over the latest link,
fsync the root; only then apply retention.
"""

from __future__ import annotations

import datetime
import logging
import os
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from cycler import _fs
from cycler._coordination import Coordinator, global_rank
from cycler.checkpoints import latest_checkpoint, list_checkpoints
from cycler.control import USES_SAVER, announce
from cycler.errors import CheckpointDirectoryError
from cycler.layout import DEFAULT_PREFIX, CheckpointLayout, CheckpointName
from cycler.lock import SupervisorLock
from cycler.manifest import seal
from cycler.retention import retention_decisions

log = logging.getLogger(__name__)

_RECORDER = ThreadPoolExecutor(1, thread_name_prefix="cycler-index-record")
"""Makes prepared indices durable in the background; one thread, started on first use."""

STRATEGIES = ("sync_any", "sync_all", "async", "offline", "mono")
_COORDINATED = ("sync_any", "sync_all")
DEFAULT_TIMEOUT = datetime.timedelta(minutes=30)


class AtomicDirectory:
    """Saves each checkpoint to a new directory and commits it by swapping one link.

    Args:
        output_directory: the checkpoint root (``$CHECKPOINT_ARTIFACT_PATH`` on ISC).
        is_master: kept for cycling_utils compatibility; with a process group rank 0 creates
            and commits, without one (or with ``strategy="async"``/``"offline"``) every
            instance acts alone.
        name: the prefix of this saver's names; savers sharing a root need distinct names.
        keep_last: committed checkpoints to keep, counting the latest (``-1``: all). Pinned
            (``force_save``) checkpoints are never removed.
        strategy: cycling_utils' ``force_save`` agreement: ``"sync_any"`` pins if any rank
            asked, ``"sync_all"`` if all did; ``"async"`` gives every rank its own saver
            (``<name>_rank_<rank>``); ``"offline"`` ignores any process group; ``"mono"``
            is one saver used by one process of a job (typically ``if rank == 0``), which
            waits for no other rank.
        device: cycling_utils' device for its agreement tensors. Accepted and unused: the
            ranks agree through the process group's store, which needs no device.
        timeout: the longest any rank waits for another.
    """

    def __init__(self, output_directory: str | os.PathLike[str], is_master: bool = False,
                 name: str = DEFAULT_PREFIX, keep_last: int = -1, strategy: str = "sync_any",
                 device: Any = None,
                 timeout: datetime.timedelta = DEFAULT_TIMEOUT) -> None:
        if strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {', '.join(STRATEGIES)}, not {strategy!r}")
        self.strategy = strategy
        self.keep_last = keep_last
        self.is_master = is_master
        self.device = device
        self._coordinator = Coordinator(name, timeout, strategy in _COORDINATED)
        self.name = name if strategy != "async" else f"{name}_rank_{global_rank() or 0}"
        self.layout = CheckpointLayout(output_directory, self.name)
        self.output_directory = str(self.layout.root)
        self.symlink_name = self.layout.link_name
        self._writer_lock: SupervisorLock | None = None
        self._recording: Future[None] | None = None
        announce(USES_SAVER)
        if self._coordinator.is_creator:
            _ensure_root(self.layout.root)

    def prepare_checkpoint_directory(self, force_save: bool = False) -> str:
        """Create the next checkpoint directory (rank 0) and return its path on every rank.

        ``force_save`` pins the checkpoint (``_force`` suffix): retention and ``cycle prune``
        never remove it. Indices only grow, even past directories that were removed.
        """
        coordinator = self._coordinator
        round_key = coordinator.new_round("prepare")
        coordinator.arrive(round_key, "1" if force_save else "0")
        if not coordinator.is_creator:
            return coordinator.outcome(round_key)
        try:
            votes = coordinator.gather(round_key, "1" if force_save else "0")
            path = str(self._create(self._pinned(votes)))
        except BaseException as error:
            coordinator.announce_error(round_key, error)
            raise
        coordinator.announce(round_key, path)
        return path

    def _pinned(self, votes: list[str]) -> bool:
        if self.strategy == "sync_all":
            return all(vote == "1" for vote in votes)
        return any(vote == "1" for vote in votes)

    def _create(self, pinned: bool) -> Path:
        layout = self.layout
        if self._writer_lock is None:
            self._writer_lock = SupervisorLock(layout.writer_lock_path)
            self._writer_lock.acquire(role="writer", name=self.name)
        _RECORDER.submit(_nothing).result()  # this process's earlier records have landed
        index = layout.next_index()
        path = layout.path_of(CheckpointName(self.name, index, pinned))
        path.mkdir()
        # Recording the index takes two fsyncs (5-15 ms on a busy disk): they overlap the
        # ranks' writes, and the commit waits for them before it can link the directory.
        self._recording = _RECORDER.submit(layout.record_index, index)
        return path

    def symlink_latest(self, checkpoint_directory: str | os.PathLike[str],
                       metadata: Mapping[str, Any] | None = None) -> None:
        """Commit ``checkpoint_directory``; returns on every rank once it is durable.

        Call it on every rank after every rank has written its files. ``metadata`` (JSON:
        ``{"step": ..., "epoch": ...}`` and anything else) goes into the manifest and can be
        read back with :func:`cycler.read_manifest` without loading any tensor.
        """
        coordinator = self._coordinator
        round_key = coordinator.new_round("commit")
        coordinator.arrive(round_key, "done")
        if not coordinator.is_creator:
            coordinator.outcome(round_key)
            return
        try:
            coordinator.gather(round_key, "done")
            self._commit(Path(checkpoint_directory), dict(metadata or {}))
        except BaseException as error:
            coordinator.announce_error(round_key, error)
            raise
        coordinator.announce(round_key, "committed")
        # The writer lock is held through retention: released before it, another writer could
        # prepare a directory that this retention then removes as torn.
        try:
            self._apply_retention()
        finally:
            self._release_writer_lock()

    atomic_symlink = symlink_latest
    commit = symlink_latest

    def _commit(self, directory: Path, metadata: dict[str, Any]) -> None:
        name = self.layout.parse(directory.name)
        if name is None or Path(os.path.abspath(directory)).parent != self.layout.root:
            raise ValueError(
                f"{directory} is not a directory made by prepare_checkpoint_directory() "
                f"for {self.name} in {self.layout.root}"
            )
        if self.layout.link_path.is_dir() and not self.layout.link_path.is_symlink():
            raise CheckpointDirectoryError(
                f"{self.layout.link_path} is a directory, not the latest link (a copy that "
                "followed symlinks?); move it out of the checkpoint root"
            )
        from cycler import __version__

        seal(self.layout.path_of(name), index=name.index, metadata=metadata,
             world_size=self._coordinator.world_size, version=__version__)
        if self._recording is not None:
            self._recording.result()
            self._recording = None
        _fs.atomic_symlink(self.layout.path_of(name), self.layout.link_path)

    def __del__(self) -> None:
        # A saver dropped between prepare and commit (a failed save, a re-run notebook cell)
        # must not keep the root locked against the next saver of this very process.
        if getattr(self, "_writer_lock", None) is not None:  # __init__ may have failed
            self._release_writer_lock()

    def _release_writer_lock(self) -> None:
        if self._writer_lock is not None:
            self._writer_lock.release()
            self._writer_lock = None

    def _apply_retention(self) -> None:
        checkpoints = list_checkpoints(self.layout.root, self.name)
        decisions = retention_decisions(checkpoints, keep_last=self.keep_last,
                                        remove_torn=True, writer_active=False)
        for decision in decisions:
            if not decision.keep:
                log.debug("removing %s: %s", decision.checkpoint.path.name, decision.reason)
                _fs.discard_directory(decision.checkpoint.path)
        # A writer killed during a removal leaves a renamed, half-deleted checkpoint that no
        # reader lists: without this, every such kill would leak up to a checkpoint of disk.
        for temporary in self.layout.own_temporaries():
            log.debug("removing %s: left by a writer that died", temporary.name)
            _fs.remove_leftover(temporary)

    def is_checkpoint_directory(self, path: str | os.PathLike[str]) -> str | None:
        """cycling_utils' test: the suffix (``"3"`` or ``"3_force"``) if ``path`` is an existing
        checkpoint directory of this saver, else ``None``. Says nothing of validity."""
        name = self.layout.parse(Path(path).name)
        if name is None or not Path(path).is_dir():
            return None
        return f"{name.index}_force" if name.pinned else str(name.index)

    def latest_checkpoint(self, verify: bool = False) -> str | None:
        """The newest valid checkpoint of this saver (see :func:`cycler.latest_checkpoint`)."""
        path = latest_checkpoint(self.layout.root, self.name, verify=verify)
        return None if path is None else str(path)


def _ensure_root(root: Path) -> None:
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise CheckpointDirectoryError(
            f"cannot create the checkpoint directory {root} ({error.strerror}); "
            "choose a writable location"
        ) from None
    if not os.access(root, os.W_OK | os.X_OK):
        raise CheckpointDirectoryError(f"{root} is not writable; choose a writable location")


def _nothing() -> None:
    """Queued behind the pending index records, to wait for them."""
