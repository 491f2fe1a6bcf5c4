"""The checkpoint manifest: written last, it is what makes a directory a complete checkpoint.

A manifest records every file of the checkpoint with its size and checksum (XXH3; CRC-32 in
version 1), plus step, epoch, world size, wall time, library version and the user's JSON
metadata. It is written with the durable write of ``cycler._fs`` after every file it lists has
been fsynced, so a manifest on disk implies the data it describes is on disk. Reading metadata
needs no tensor to be loaded.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from cycler._fs import atomic_write_bytes, fsync_directory, fsync_path, is_temporary
from cycler.checkpoint.checksum import ALGORITHMS, CRC32, XXH3, file_checksum
from cycler.checkpoint.layout import MANIFEST_NAME
from cycler.errors import CorruptCheckpoint, UnreadableCheckpoint, UnsupportedCheckpoint

MANIFEST_FORMAT = "cycler.checkpoint"
MANIFEST_VERSION = 2
"""Version 2 records XXH3 checksums and names the algorithm; version 1 (CRC-32) is still read."""
# fsync waits on the disk while XXH3 runs on the CPU (xxhash releases the GIL on large buffers),
# so running both at once keeps a commit close to the cost of the fsync alone.
_IO_THREADS = 4
CHECKSUM_MISMATCH = "does not match its checksum"
"""How :func:`check_files` says a file's content changed since the commit."""
_DCP_SHARD = re.compile(r"__(\d+)_(\d+)\.distcp")


@dataclass(frozen=True)
class FileRecord:
    size: int
    checksum: str


@dataclass(frozen=True, kw_only=True)
class Manifest:
    """What a committed checkpoint holds. ``files`` maps relative POSIX paths to records."""

    index: int
    files: dict[str, FileRecord]
    created_at: float
    world_size: int = 1
    step: int | None = None
    epoch: int | None = None
    cycler_version: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)
    checksum: str = XXH3
    """The algorithm of every file's ``checksum`` (one of ``checksum.ALGORITHMS``)."""

    @property
    def total_size(self) -> int:
        return sum(record.size for record in self.files.values())

    def to_json(self) -> str:
        fields = asdict(self)
        return json.dumps({"format": MANIFEST_FORMAT, "version": MANIFEST_VERSION, **fields},
                          indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Manifest:
        """Parse a manifest; raises :class:`UnsupportedCheckpoint` for a newer cycler's and
        ``ValueError`` for anything malformed (wrong types included)."""
        try:
            fields = json.loads(text)
        except RecursionError:
            raise ValueError("nested too deeply to be a manifest") from None
        if not isinstance(fields, dict) or fields.pop("format", None) != MANIFEST_FORMAT:
            raise ValueError("not a cycler manifest")
        version = fields.pop("version", None)
        if version not in (1, MANIFEST_VERSION):
            raise UnsupportedCheckpoint(
                f"manifest version {version} is not one this cycler reads (1 or "
                f"{MANIFEST_VERSION}): written by a newer cycler? upgrade to read it")
        if version == 1:  # CRC-32, each record's under "crc32"
            fields["checksum"] = CRC32
        if fields.get("checksum") not in ALGORITHMS:
            raise UnsupportedCheckpoint(f"checksum {fields.get('checksum')!r} is not one this "
                                        "cycler knows: written by a newer cycler?")
        key = "crc32" if version == 1 else "checksum"
        files = fields.pop("files", None)
        if not isinstance(files, dict):
            raise ValueError("its files are not a mapping of names to records")
        manifest = cls(files={str(name): _file_record(record, key)
                              for name, record in files.items()}, **fields)
        _check_types(manifest)
        return manifest


def _file_record(record: Any, key: str) -> FileRecord:
    if not isinstance(record, dict) or not isinstance(record.get("size"), int):
        raise ValueError(f"a file record is not {{'size': int, {key!r}: str}}: {record!r:.80}")
    return FileRecord(record["size"], str(record[key]))


_FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "index": (int,), "created_at": (int, float), "world_size": (int,), "step": (int, type(None)),
    "epoch": (int, type(None)), "cycler_version": (str,), "metadata": (dict,)}


def _check_types(manifest: Manifest) -> None:
    for name, types in _FIELD_TYPES.items():
        value = getattr(manifest, name)
        if not isinstance(value, types) or isinstance(value, bool):
            wanted = " or ".join(t.__name__ for t in types)
            raise ValueError(f"its {name} is {value!r:.40}, not {wanted}")


def checkpoint_files(directory: Path) -> list[str]:
    """Relative paths of the regular files a manifest must cover, refusing symlinks.

    Leftover temporaries of writers that died are not part of the checkpoint.
    """
    found = []
    pending = [Path(directory)]
    while pending:
        parent = pending.pop()
        # The directory's entries say what they are: no stat per file (every rank lists the
        # checkpoint at its commit, so a stat each would be ranks x files calls in all).
        with os.scandir(parent) as entries:
            for entry in entries:
                if entry.is_symlink():
                    raise CorruptCheckpoint(f"{entry.path} is a symlink; a checkpoint must "
                                            "hold plain files, copy the data in")
                if entry.is_dir():
                    pending.append(Path(entry.path))
                    continue
                relative = Path(entry.path).relative_to(directory).as_posix()
                if relative != MANIFEST_NAME and not is_temporary(entry.name):
                    found.append(relative)
    return sorted(found)


def record_files(directory: Path, names: list[str]) -> dict[str, FileRecord]:
    """Fsync each of ``names`` in ``directory`` and record its size and XXH3 checksum.

    A rank records the files it is responsible for (see :func:`files_of_rank`); the records
    travel to the rank that writes the manifest, which then reads no other rank's data.
    """
    directory = Path(directory)
    with ThreadPoolExecutor(_IO_THREADS) as pool:
        synced = [pool.submit(fsync_path, directory / name) for name in names]
        digests = pool.map(file_checksum, (directory / name for name in names))
        records = {name: FileRecord((directory / name).stat().st_size, digest)
                   for name, digest in zip(names, digests, strict=True)}
        for future in synced:
            future.result()
    return records


def files_of_rank(names: list[str], rank: int, world_size: int) -> list[str]:
    """The files ``rank`` fsyncs and checksums at a commit: the shards torch.distributed.checkpoint
    named after it (``__<rank>_<n>.distcp``, in its page cache already), and every
    ``world_size``-th of the others, so the work is spread and no file is done twice."""
    own = []
    others = [name for name in names if _writer_rank(name) is None]
    for name in names:
        writer = _writer_rank(name)
        if writer is not None and writer % world_size == rank:
            own.append(name)
    return own + others[rank::world_size]


def commit_plan(names: list[str], world_size: int) -> dict[str, Any]:
    """Who records which file at a commit, from one listing of the checkpoint (``names``, on
    rank 0), so that the other ranks list nothing: W ranks listing W files each read W^2
    entries in all (67 million at 8,192 ranks), the plan W. ``shards``: each directory where
    every rank r < ``world_size`` wrote exactly the DCP shards ``__<r>_0`` .. ``__<r>_<c-1>``
    (torch.distributed.checkpoint writes them so), with c: each rank records its own (in its
    page cache already) by name; ``others``: every other file, spread over the ranks."""
    found: dict[str, dict[int, set[int]]] = {}
    for name in names:
        parent, _, base = name.rpartition("/")
        shard = _shard_of(base)
        if shard is not None:
            found.setdefault(parent, {}).setdefault(shard[0], set()).add(shard[1])
    shards = {parent: len(by_writer[0]) for parent, by_writer in found.items()
              if _regular(by_writer, world_size)}
    others = [name for name in names if not _covered(name, shards)]
    return {"shards": shards, "others": others}


def _regular(by_writer: dict[int, set[int]], world_size: int) -> bool:
    """Whether ranks 0 .. W-1, and no other, each wrote shards 0 .. c-1 for one c."""
    count = len(by_writer.get(0, ()))
    return count > 0 and set(by_writer) == set(range(world_size)) and all(
        numbers == set(range(count)) for numbers in by_writer.values())


def _covered(name: str, shards: dict[str, int]) -> bool:
    parent, _, base = name.rpartition("/")
    return parent in shards and _shard_of(base) is not None


def _shard_of(base: str) -> tuple[int, int] | None:
    """(writer rank, number) of a DCP shard's name, as the ranks will spell it (``__01_0``
    is not rank 1's shard 0: a rank naming it ``__1_0`` would not find it)."""
    match = _DCP_SHARD.fullmatch(base)
    if match is None:
        return None
    writer, number = int(match.group(1)), int(match.group(2))
    return (writer, number) if base == f"__{writer}_{number}.distcp" else None


def share_of_plan(plan: dict[str, Any], rank: int, world_size: int) -> list[str]:
    """The files ``rank`` fsyncs and checksums at a commit under :func:`commit_plan`'s
    ``plan``: its own shards, and every ``world_size``-th of the others (none twice)."""
    own = [f"{parent}/__{rank}_{n}.distcp" if parent else f"__{rank}_{n}.distcp"
           for parent, count in plan["shards"].items() for n in range(count)]
    return own + plan["others"][rank::world_size]


def _writer_rank(name: str) -> int | None:
    match = _DCP_SHARD.fullmatch(Path(name).name)
    return int(match.group(1)) if match else None


def seal(directory: Path, *, index: int, metadata: Mapping[str, Any] | None = None,
         world_size: int = 1, version: str = "",
         records: dict[str, FileRecord] | None = None) -> Manifest:
    """Durably write the manifest of ``directory`` from ``records`` (default: fsync and record
    every file here, as one process does); return it. See :func:`sealed`."""
    manifest = sealed(directory, index=index, metadata=metadata, world_size=world_size,
                      version=version, records=records)
    atomic_write_bytes(Path(directory) / MANIFEST_NAME, manifest.to_json().encode())
    return manifest


def sealed(directory: Path, *, index: int, metadata: Mapping[str, Any] | None = None,
           world_size: int = 1, version: str = "",
           records: dict[str, FileRecord] | None = None) -> Manifest:
    """The manifest of ``directory`` from ``records`` (default: fsync and record every file
    here, as one process does), every subdirectory fsynced: what the commit writes next.

    ``records`` must cover every file of the directory, each already fsynced by whoever
    recorded it: a file the records miss means a rank wrote after the commit began, and the
    directory is refused rather than sealed without it.
    """
    directory = Path(directory)
    names = checkpoint_files(directory)
    if records is None:
        records = record_files(directory, names)
    missing = sorted(set(names) ^ set(records))
    if missing:
        raise CorruptCheckpoint(f"{directory}: {', '.join(missing[:3])} appeared or vanished "
                                "while the commit ran; write every file before symlink_latest()")
    # The checkpoint directory itself is fsynced once, after the manifest's rename: that one
    # fsync makes its files' entries and the manifest durable before any link can name it, and
    # a crash before it leaves a directory whose missing entries fail validation. One fsync
    # fewer per commit (5-7 ms on a busy disk, as much as checksumming 10 MB).
    for parent in {(directory / name).parent for name in names} - {directory}:
        fsync_directory(parent)
    return make_manifest(records, index=index, world_size=world_size,
                         metadata=dict(metadata or {}), version=version)


def make_manifest(records: dict[str, FileRecord], *, index: int, world_size: int,
                  metadata: dict[str, Any], version: str) -> Manifest:
    _check_json(metadata)
    files = dict(sorted(records.items()))
    return Manifest(index=index, files=files, created_at=time.time(), world_size=world_size,
                    step=_optional_int(metadata.get("step")),
                    epoch=_optional_int(metadata.get("epoch")),
                    cycler_version=version, metadata=metadata)


def _check_json(metadata: dict[str, Any]) -> None:
    try:
        json.dumps(metadata)
    except (TypeError, ValueError) as error:
        raise TypeError(f"checkpoint metadata must be JSON-serialisable: {error}") from None


def _optional_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def read_manifest(directory: Path) -> Manifest:
    """The manifest of ``directory``. Raises :class:`CorruptCheckpoint` if it is missing or
    malformed, :class:`UnsupportedCheckpoint` if a newer cycler wrote it, and
    :class:`UnreadableCheckpoint` if it exists but cannot be read: only ENOENT means absent."""
    path = Path(directory) / MANIFEST_NAME
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise CorruptCheckpoint(f"{directory} has no manifest: it was never committed") from None
    except IsADirectoryError:
        raise UnreadableCheckpoint(f"{path} is a directory, not a manifest") from None
    except UnicodeDecodeError as error:
        raise CorruptCheckpoint(f"{path} is malformed ({error})") from None
    except OSError as error:
        raise UnreadableCheckpoint(f"cannot read {path} ({error.strerror or error})") from None
    try:
        return Manifest.from_json(text)
    except UnsupportedCheckpoint:
        raise
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise CorruptCheckpoint(f"{path} is malformed ({error})") from None


def _linked_parent(directory: Path, name: Path, known_real: set[Path]) -> str | None:
    """The first directory on the way to ``name`` inside ``directory`` that is a symlink
    (which ``lstat`` of the file would silently follow), or ``None``."""
    for depth in range(1, len(name.parts)):
        parent = directory.joinpath(*name.parts[:depth])
        if parent in known_real:
            continue
        if parent.is_symlink():
            return name.parts[:depth][-1] if depth == 1 else "/".join(name.parts[:depth])
        known_real.add(parent)
    return None


def name_outside(manifest: Manifest) -> str | None:
    """The first way a name of ``manifest`` points outside its checkpoint, or ``None``."""
    for name in manifest.files:
        if Path(name).is_absolute() or ".." in Path(name).parts:
            return f"the manifest names {name!r}, outside the checkpoint"
    return None


def check_files(directory: Path, manifest: Manifest, *, checksums: bool = False) -> str | None:
    """The first way ``directory`` differs from ``manifest``, or ``None`` if it matches; raises
    :class:`UnreadableCheckpoint` where a file exists but cannot be read."""
    outside = name_outside(manifest)
    if outside is not None:
        return outside
    real_directories: set[Path] = set()
    for name, record in manifest.files.items():
        linked = _linked_parent(Path(directory), Path(name), real_directories)
        if linked is not None:
            return f"{linked} is a symlink: a checkpoint holds plain files and directories only"
        path = Path(directory) / name
        try:
            size = path.lstat().st_size
        except FileNotFoundError:
            return f"{name} is missing"
        except OSError as error:
            raise UnreadableCheckpoint(f"cannot read {name} ({error.strerror})") from None
        if path.is_symlink() or not path.is_file():
            return f"{name} is not a plain file"
        if size != record.size:
            return f"{name} has {size} bytes, the manifest says {record.size}"
        if checksums and _checksum(path, manifest.checksum) != record.checksum:
            return f"{name} {CHECKSUM_MISMATCH}"
    return None


def _checksum(path: Path, algorithm: str) -> str:
    try:
        return file_checksum(path, algorithm)
    except FileNotFoundError:
        return "missing"
    except OSError as error:
        raise UnreadableCheckpoint(f"cannot read {path.name} ({error.strerror})") from None
