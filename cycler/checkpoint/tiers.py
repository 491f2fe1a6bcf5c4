"""The memory tier (docs/design.md, "Tiers"): checkpoints committed first in node memory, some of
them persisted to the checkpoint root.

Under ``cycle run --memory-tier`` a saver commits every checkpoint in this job's memory root on
this node (a tmpfs: the same layout, commit protocol and checksums as the checkpoint root), and
copies every K-th one, every pinned one and every one taken for a stop to the checkpoint root
(the durable tier) in the background (:mod:`cycler.checkpoint.persisting`). A copy is committed
there only once its files read back with the memory manifest's checksums
(:mod:`cycler.checkpoint.durable_copy`). This module holds the tier itself: where its root is,
whether a checkpoint fits, and whether it was found too small for the job.

Indices are shared by the tiers: checkpoint 7 in memory is checkpoint 7 on disk, so "the newest
checkpoint" means the same in both, and a resume takes the newest valid one of either (memory
first on a tie: it reads faster).

On several nodes each node's memory holds only its own ranks' files: the node manifests, the
partner copy, persisting by contribution and the resume that assembles a checkpoint from the
nodes are in :mod:`cycler.checkpoint.nodes`.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cycler import _fs
from cycler.checkpoint.layout import CheckpointLayout, CheckpointName
from cycler.checkpoint.memory_roots import is_private, prepare_memory_root
from cycler.checkpoint.retainer import discard
from cycler.errors import CheckpointDirectoryError, DiskFull
from cycler.protocol.environment import (
    ENV_CHECKPOINT_DIR,
    ENV_CONTROL_FILE,
    ENV_MEMORY_TIER,
    ENV_PERSIST_EVERY,
)
from cycler.protocol.record import RunRecord

log = logging.getLogger(__name__)

DEFAULT_PERSIST_EVERY = 5
"""Persist every 5th checkpoint (and every stop's and pinned one) by default."""

TMPFS_SHARE = 0.5
"""The most of its filesystem a memory root may fill; past it, saves go to the durable root."""


@dataclass(frozen=True)
class MemoryTier:
    """This process's memory tier: its root and how often checkpoints are persisted."""

    root: Path
    persist_every: int = DEFAULT_PERSIST_EVERY

    def wants_persisted(self, name: CheckpointName) -> bool:
        """Whether the checkpoint is one of the every-K-th (pinned ones always are)."""
        return name.pinned or name.index % self.persist_every == 0

    def has_room(self, needed: int) -> bool:
        """Whether ``needed`` more bytes fit in the free space and within the tier's share."""
        try:
            stats = os.statvfs(self.root)
        except OSError:
            return False
        total, free = stats.f_blocks * stats.f_frsize, stats.f_bavail * stats.f_frsize
        return needed < free and _fs.tree_size(self.root) + needed <= TMPFS_SHARE * total


def memory_tier(durable_root: str | os.PathLike[str],
                environ: Mapping[str, str] | None = None) -> MemoryTier | None:
    """The memory tier ``cycle run`` set for this worker's savers of ``durable_root``, ``None``
    when there is none (or the job's checkpoint root is another: that saver saves there
    directly). Raises :class:`CheckpointDirectoryError` when the memory root is not this user's
    private directory of this job: nothing in it is read then."""
    env = os.environ if environ is None else environ
    root = env.get(ENV_MEMORY_TIER)
    if not root:
        return None
    job_root = env.get(ENV_CHECKPOINT_DIR)
    if job_root and os.path.realpath(job_root) != os.path.realpath(durable_root):
        log.info("the memory tier is %s's; checkpoints of %s go there directly", job_root,
                 durable_root)
        return None
    try:
        every = max(1, int(env.get(ENV_PERSIST_EVERY) or DEFAULT_PERSIST_EVERY))
    except ValueError:
        every = DEFAULT_PERSIST_EVERY
    if not env.get(ENV_CONTROL_FILE):
        _refuse_a_hand_set_root(Path(root))
    removed = prepare_memory_root(Path(root), RunRecord(durable_root))
    if removed is not None:
        log.warning("%s", removed)
    return MemoryTier(Path(root), every)


def _refuse_a_hand_set_root(root: Path) -> None:
    """Outside ``cycle run``: refuse a ``CYCLER_MEMORY_TIER`` that cannot be a memory root (its
    base is there and is not the user's private directory: ``/dev/shm`` set by hand, as an
    older cycler's documentation had it), saying what to do instead."""
    base = root.parent
    if os.path.lexists(base) and not is_private(base):
        raise CheckpointDirectoryError(
            f"{ENV_MEMORY_TIER} is {root}, in {base}, which is not a private directory of "
            "yours: the variable names one job's memory root, which cycle run makes; unset "
            f"{ENV_MEMORY_TIER} and pass --memory-tier to cycle run (--memory-dir {root} to "
            "keep the checkpoints in that tmpfs)")


def remember_overflow(durable: RunRecord, why: str) -> None:
    """Record in the checkpoint root that a checkpoint did not fit in the memory tier: from
    the next start on, the job's savers commit in the checkpoint root (memory is still read).
    A failure is logged, never raised."""
    record = json.dumps({"why": why, "time": time.time()}).encode()
    try:
        _fs.atomic_write_bytes(durable.memory_overflow_path, record)
    except OSError as error:
        log.warning("could not record that the memory tier overflowed (%s)", error)


def overflowed(durable: RunRecord) -> str | None:
    """Why the memory tier was found too small for this checkpoint root's job, if it was."""
    path = durable.memory_overflow_path
    if not os.path.lexists(path):
        return None
    return str(_fs.read_json_object(path).get("why") or "a checkpoint did not fit")


def first_tier(memory: CheckpointLayout | None, durable: CheckpointLayout) -> CheckpointLayout:
    """Where a new saver commits first: the memory root, unless the memory tier was found too
    small for this job before (then the checkpoint root; memory is still read)."""
    why = None if memory is None else overflowed(durable.record)
    if memory is None or why is not None:
        if why is not None:
            log.warning("checkpoints go to %s, not to the memory tier: it was too small for "
                        "this job (%s)", durable.root, why)
        return durable
    return memory


_SAVES_IN_MEMORY: list[tuple[CheckpointLayout, Callable[[], Callable[[], bool] | None]]] = []
"""Per saver of the memory tier: its checkpoint root, and (weakly) whether it has a memory
checkpoint prepared and not committed."""


def remember_overflow_on_crash(durable: CheckpointLayout, saving: Callable[[], bool]) -> None:
    """When the process dies of a full disk while ``saving()`` (a bound method of the saver)
    says a memory checkpoint is being written, whatever wrote its files (the script's own
    ``torch.save``, DCP, cycler), remember the overflow (:func:`remember_overflow`)."""
    if not _SAVES_IN_MEMORY:
        previous = sys.excepthook

        def on_uncaught(kind: type[BaseException], error: BaseException, trace: Any) -> None:
            _overflow_if_full(error)
            previous(kind, error, trace)

        sys.excepthook = on_uncaught
    _SAVES_IN_MEMORY.append((durable, weakref.WeakMethod(saving)))


def _overflow_if_full(error: BaseException) -> None:
    if not (isinstance(error, DiskFull) or _fs.caused_by_full_disk(error)):
        return
    for durable, saving in _SAVES_IN_MEMORY:
        check = saving()
        if check is not None and check():
            remember_overflow(durable.record, f"a checkpoint did not fit in it ({error})")


def newest_of(layout: CheckpointLayout, found: list[Path | None]) -> Path | None:
    """The checkpoint of the highest index among ``found`` (one per tier, memory first;
    ``None`` where a tier has none); the earlier tier's on a tie."""
    ranked = [(name.index, -order, path) for order, path in enumerate(found)
              if path is not None and (name := layout.parse(path.name)) is not None]
    return max(ranked)[2] if ranked else None


def remove_memory_root(root: Path) -> None:
    """Remove a job's memory root (the job ended for good); logged, never raised."""
    _fs.remove_logged(discard, root, "memory tier")


_MOVED = {
    "MEMORY_KEEP": "retention",
    "PersistAbandoned": "durable_copy",
    "never_abandon": "durable_copy",
    "persist": "durable_copy",
    "persist_newest": "durable_copy",
    "newer_than_persisted": "durable_copy",
    "COPY_CHUNK": "durable_copy",
    "copy_durably": "durable_copy",
    "retain_durable": "retainer",
    "retain_memory": "retainer",
}
"""Names this module had, now in the module named (their old import paths still work)."""


def __getattr__(name: str) -> object:
    if name in _MOVED:
        import importlib

        return getattr(importlib.import_module(f"cycler.checkpoint.{_MOVED[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
