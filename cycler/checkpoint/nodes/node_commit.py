"""A node's part of a checkpoint in its memory root: its own files and, beside them, the job's
manifest, both under the node manifest."""

from __future__ import annotations

from pathlib import Path

from cycler import _fs
from cycler.checkpoint.checksum import file_checksum
from cycler.checkpoint.manifest import (
    FileRecord,
    Manifest,
    check_files,
    name_outside,
    read_manifest,
    sealed,
)
from cycler.errors import CorruptCheckpoint, CyclerError

JOB_MANIFEST_NAME = "cycler-job-manifest.json"
"""The job's manifest beside a node's files in its memory checkpoint (covered by the node's)."""


def node_manifest(directory: Path, job: Manifest, files: list[str]) -> Manifest:
    """This node's part of a checkpoint in its memory root: the job manifest written beside
    the node's ``files`` (recorded and fsynced by its ranks), and the node manifest over both,
    which the commit writes next."""
    sidecar = directory / JOB_MANIFEST_NAME
    _fs.atomic_write_bytes(sidecar, job.to_json().encode())
    records = {name: job.files[name] for name in files}
    records[JOB_MANIFEST_NAME] = FileRecord(sidecar.stat().st_size,
                                            file_checksum(sidecar, job.checksum))
    return sealed(directory, index=job.index, metadata=job.metadata, world_size=job.world_size,
                  version=job.cycler_version, records=records)


def job_manifest(directory: Path) -> Manifest:
    """The job manifest kept beside a node's files (:class:`CorruptCheckpoint` if it is
    missing or malformed)."""
    try:
        return Manifest.from_json((directory / JOB_MANIFEST_NAME).read_text())
    except (OSError, ValueError, UnicodeDecodeError) as error:
        raise CorruptCheckpoint(f"{directory} has no readable job manifest ({error})") from None


def node_files(directory: Path) -> list[str]:
    """The checkpoint's files a committed node directory holds (its manifest's, the job
    manifest beside them left out); empty where it is not valid."""
    try:
        manifest = read_manifest(directory)
        if check_files(directory, manifest) is not None:
            return []
    except (OSError, CyclerError):
        return []
    return sorted(name for name in manifest.files if name != JOB_MANIFEST_NAME)


def check_names(directory: Path, manifest: Manifest) -> None:
    """Refuse (:class:`CorruptCheckpoint`) a manifest naming a file outside its checkpoint."""
    outside = name_outside(manifest)
    if outside is not None:
        raise CorruptCheckpoint(f"{directory}: {outside}")
