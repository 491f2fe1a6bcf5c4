"""Persisting: a committed memory checkpoint copied to the checkpoint root and committed there
once its copy reads back with the memory manifest's checksums (docs/design.md, "Tiers").

A kill during the copy leaves a directory without a manifest (torn: the next writer removes
it) and the durable link where it was; the link only moves forward. The background thread that
decides what to persist is :mod:`cycler.checkpoint.persisting`; the job's end and stop persist
through :mod:`cycler.checkpoint.job_end`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path

from cycler import _fs
from cycler.checkpoint.layout import MANIFEST_NAME, CheckpointLayout, CheckpointName
from cycler.checkpoint.linking import finalize, link_forward
from cycler.checkpoint.listing import Checkpoint, inspect_checkpoint, list_checkpoints
from cycler.checkpoint.manifest import check_files, read_manifest
from cycler.checkpoint.retainer import discard
from cycler.errors import CorruptCheckpoint, CyclerError

log = logging.getLogger(__name__)


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
