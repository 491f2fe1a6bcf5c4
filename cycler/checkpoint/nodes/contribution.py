"""Persisting by contribution: every node copies what it holds of a checkpoint (its own files
and its partner copy) into the checkpoint root, each file verified before it is renamed into
place; the contribution that completes the set commits it there."""

from __future__ import annotations

import os
from pathlib import Path

from cycler import _fs
from cycler.checkpoint.checksum import file_checksum
from cycler.checkpoint.durable_copy import (
    Abandon,
    copy_durably,
    never_abandon,
    newer_than_persisted,
)
from cycler.checkpoint.layout import CheckpointLayout, CheckpointName
from cycler.checkpoint.linking import finalize, link_forward
from cycler.checkpoint.listing import inspect_checkpoint
from cycler.checkpoint.manifest import FileRecord
from cycler.checkpoint.nodes.node_commit import (
    JOB_MANIFEST_NAME,
    check_names,
    job_manifest,
    node_files,
)
from cycler.checkpoint.nodes.partner_copy import replica_path
from cycler.errors import CorruptCheckpoint


def held_files(memory: CheckpointLayout, name: CheckpointName) -> dict[str, Path]:
    """The files of checkpoint ``name`` this node holds, own and partner copy, by name."""
    held = {}
    for directory in (replica_path(memory, name), memory.path_of(name)):
        held.update({file: directory / file for file in node_files(directory)})
    return held


def contribute(memory: CheckpointLayout, durable: CheckpointLayout, name: CheckpointName,
               abandon: Abandon = never_abandon) -> bool:
    """Copy what this node holds of checkpoint ``name`` into the checkpoint root's directory of
    it, each file verified before it is renamed into place; whichever node completes the set
    writes the job manifest and moves the link forward. Returns whether the checkpoint is
    committed in the checkpoint root. :class:`PersistAbandoned` once ``abandon()`` says so (a
    stop's checkpoint must go first)."""
    job = job_manifest(memory.path_of(name))
    check_names(memory.path_of(name), job)
    target = durable.path_of(name)
    if os.path.lexists(target) and inspect_checkpoint(durable, name).valid:
        link_forward(durable)  # a contributor killed between the manifest and the link
        return True
    durable.record_index(name.index)
    target.mkdir(exist_ok=True)
    for file, path in sorted(held_files(memory, name).items()):
        record = job.files.get(file)
        if record is None or _complete(target / file, record):
            continue
        _copy_verified(path, target / file, record, job.checksum, abandon)
    if not all(_complete(target / file, record) for file, record in job.files.items()):
        return False
    for parent in sorted({(target / file).parent for file in job.files}, reverse=True):
        _fs.fsync_directory(parent)
    finalize(durable, name, job, forward=True)  # nodes seal concurrently
    return True


def whole(checkpoint: Path) -> bool:
    """Whether a node's memory checkpoint was committed by every node (it has the job's
    manifest), not only by some (a rank died in between)."""
    return (checkpoint / JOB_MANIFEST_NAME).is_file()


def contributed(memory: CheckpointLayout, durable: CheckpointLayout, name: CheckpointName,
                ) -> bool:
    """Whether every file this node holds of checkpoint ``name`` (that the job's manifest
    names) is complete in the checkpoint root's directory of it."""
    job = job_manifest(memory.path_of(name))
    target = durable.path_of(name)
    return all(_complete(target / file, job.files[file])
               for file in held_files(memory, name) if file in job.files)


def _complete(path: Path, record: FileRecord) -> bool:
    try:
        return path.lstat().st_size == record.size and not path.is_symlink()
    except OSError:
        return False


def _copy_verified(source: Path, target: Path, record: FileRecord, algorithm: str,
                   abandon: Abandon) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    temporary = _fs.temporary_sibling(target)
    try:
        copy_durably(source, temporary, abandon)
        if file_checksum(temporary, algorithm) != record.checksum:
            raise CorruptCheckpoint(f"{source} does not match its checksum; not persisted")
        os.replace(temporary, target)
    finally:
        if os.path.lexists(temporary):
            _fs.remove_logged(_fs.remove_leftover, temporary, "unfinished copy")
    _fs.fsync_directory(target.parent)


def contribute_newest(memory: CheckpointLayout, durable: CheckpointLayout,
                      ) -> CheckpointName | None:
    """At a node's end (its workers gone): contribute what this node holds of its memory
    checkpoints newer than the durable link's, newest first, until one is committed there;
    return that one (``None``: none was, or none needed to be). The newest may be one that
    only some nodes committed (a rank died in between): then an older one is the newest
    whole one."""
    for checkpoint in newer_than_persisted(memory, durable):
        if whole(checkpoint.path) and contribute(memory, durable, checkpoint.name):
            return checkpoint.name
    return None
