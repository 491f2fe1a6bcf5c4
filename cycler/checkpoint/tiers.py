"""The memory tier (docs/design.md, "Tiers"): checkpoints committed first in node memory, some of
them persisted to the checkpoint root.

Under ``cycle run --memory-tier`` a saver commits every checkpoint in this job's memory root on
this node (a tmpfs: the same layout, commit protocol and checksums as the checkpoint root), and
copies every K-th one, every pinned one and every one taken for a stop to the checkpoint root
(the durable tier) in the background. A copy is committed there only once its files read back
with the memory manifest's checksums; a kill during the copy leaves a directory without a
manifest (torn: the next writer removes it) and the durable link where it was.

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
from cycler.checkpoint.commit import finalize, link_forward
from cycler.checkpoint.layout import MANIFEST_NAME, CheckpointLayout, CheckpointName
from cycler.checkpoint.listing import Checkpoint, inspect_checkpoint, list_checkpoints
from cycler.checkpoint.manifest import check_files, read_manifest
from cycler.checkpoint.memory_roots import is_private, prepare_memory_root
from cycler.checkpoint.retainer import discard
from cycler.errors import CheckpointDirectoryError, CorruptCheckpoint, CyclerError, DiskFull
from cycler.protocol.environment import (
    ENV_CHECKPOINT_DIR,
    ENV_CONTROL_FILE,
    ENV_MEMORY_TIER,
    ENV_PERSIST_EVERY,
)
from cycler.protocol.names import MEMORY_OVERFLOW_FILENAME

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
    removed = prepare_memory_root(Path(root), CheckpointLayout(durable_root))
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


def remember_overflow(durable: CheckpointLayout, why: str) -> None:
    """Record in the checkpoint root that a checkpoint did not fit in the memory tier: from
    the next start on, the job's savers commit in the checkpoint root (memory is still read).
    A failure is logged, never raised."""
    record = json.dumps({"why": why, "time": time.time()}).encode()
    try:
        _fs.atomic_write_bytes(durable.supervisor_dir / MEMORY_OVERFLOW_FILENAME, record)
    except OSError as error:
        log.warning("could not record that the memory tier overflowed (%s)", error)


def overflowed(durable: CheckpointLayout) -> str | None:
    """Why the memory tier was found too small for this checkpoint root's job, if it was."""
    path = durable.supervisor_dir / MEMORY_OVERFLOW_FILENAME
    if not os.path.lexists(path):
        return None
    return str(_fs.read_json_object(path).get("why") or "a checkpoint did not fit")


def first_tier(memory: CheckpointLayout | None, durable: CheckpointLayout) -> CheckpointLayout:
    """Where a new saver commits first: the memory root, unless the memory tier was found too
    small for this job before (then the checkpoint root; memory is still read)."""
    why = None if memory is None else overflowed(durable)
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
            remember_overflow(durable, f"a checkpoint did not fit in it ({error})")


def newest_of(layout: CheckpointLayout, found: list[Path | None]) -> Path | None:
    """The checkpoint of the highest index among ``found`` (one per tier, memory first;
    ``None`` where a tier has none); the earlier tier's on a tie."""
    ranked = [(name.index, -order, path) for order, path in enumerate(found)
              if path is not None and (name := layout.parse(path.name)) is not None]
    return max(ranked)[2] if ranked else None


class PersistAbandoned(CyclerError):
    """A persist given up for a newer one that must start at once (a stop's); its unfinished
    copy is removed."""


Abandon = Callable[[], bool]
"""Asked between chunks of a copy: whether to give the persist up (:class:`PersistAbandoned`)."""


def never_abandon() -> bool:
    """The default :data:`Abandon`: a persist runs to its end."""
    return False


def persist(memory: CheckpointLayout, durable: CheckpointLayout, name: CheckpointName,
            abandon: Abandon = never_abandon,
            unfinished: Callable[[Path], object] = discard) -> Path:
    """Copy the committed memory checkpoint ``name`` into the durable root and commit it there
    once the copy verifies; return the durable directory.

    The durable link moves only forward. Raises :class:`CorruptCheckpoint` (the copy removed)
    when the memory copy does not match its own manifest, and :class:`PersistAbandoned` (the
    copy removed) when ``abandon()`` says so before the commit. ``unfinished`` removes a copy
    that did not commit (:func:`_fs.set_aside` where deleting its files takes time it has not).
    """
    source = memory.path_of(name)
    manifest = read_manifest(source)
    # Names outside the checkpoint, symlinks, missing files: refused before anything is copied.
    problem = check_files(source, manifest)
    if problem is not None:
        raise CorruptCheckpoint(f"{source} cannot be persisted: {problem}")
    target = durable.path_of(name)
    if os.path.lexists(target):
        if inspect_checkpoint(durable, name).valid:  # persisted before (a stop's, then the
            link_forward(durable)  # job's end), or killed between manifest and link
            return target
        discard(target)  # a copy cut short by a kill
    durable.record_index(name.index)
    target.mkdir()
    try:
        for file in sorted(manifest.files):
            (target / file).parent.mkdir(parents=True, exist_ok=True)
            copy_durably(source / file, target / file, abandon)
        problem = check_files(target, manifest, checksums=True)
        if problem is not None:
            raise CorruptCheckpoint(f"{source} cannot be persisted: its copy's {problem}")
        for parent in {(target / file).parent for file in manifest.files} - {target}:
            _fs.fsync_directory(parent)
        finalize(durable, name, manifest, forward=True)
    except BaseException:
        if not os.path.lexists(target / MANIFEST_NAME):  # committed, only the link may lag
            _fs.remove_logged(unfinished, target, "unfinished persisted copy")
        raise
    return target


def persist_newest(memory: CheckpointLayout, durable: CheckpointLayout,
                   ) -> CheckpointName | None:
    """At the job's end or stop, with no writer left: persist the newest memory checkpoint that
    is newer than the durable root's latest and copies intact (an older one where the newest
    does not); return its name, ``None`` when nothing needed persisting."""
    for checkpoint in newer_than_persisted(memory, durable):
        try:
            persist(memory, durable, checkpoint.name)
        except CorruptCheckpoint as error:
            log.warning("%s; trying an older memory checkpoint", error)
            continue
        return checkpoint.name
    return None


def newer_than_persisted(memory: CheckpointLayout, durable: CheckpointLayout,
                         ) -> list[Checkpoint]:
    """The valid memory checkpoints newer than the one the durable link names, newest first."""
    if not memory.root.is_dir():
        return []
    linked = durable.link_target_name()
    return [c for c in reversed(list_checkpoints(memory.root, memory.prefix))
            if c.valid and (linked is None or c.index > linked.index)]


COPY_CHUNK = 8 << 20


def copy_durably(source: Path, target: Path, abandon: Abandon = never_abandon) -> None:
    """Copy ``source`` to the new file ``target`` and fsync it; :class:`PersistAbandoned`
    between two chunks once ``abandon()`` says so (the caller removes what it made)."""
    with open(source, "rb") as reading, open(target, "xb") as writing:
        while chunk := reading.read(COPY_CHUNK):
            if abandon():
                raise PersistAbandoned(f"the copy of {source} was given up for a newer one")
            writing.write(chunk)
        writing.flush()
        os.fsync(writing.fileno())


def remove_memory_root(root: Path) -> None:
    """Remove a job's memory root (the job ended for good); logged, never raised."""
    _fs.remove_logged(discard, root, "memory tier")
