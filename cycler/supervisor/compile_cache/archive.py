"""The compile cache carried in the checkpoint root: one tar file, its key first.

``<root>/.cycler/compile-cache.tar`` holds a member ``key.json`` (the format and the
:class:`CacheKey` it was made under), then the node cache's
regular files under ``cache/``. It is replaced atomically (temporary, fsync, rename), 0600, at
most :data:`MAX_CARRIED_BYTES`; lock files, torch's temporaries, links and anything else are
left out. It is rewritten only when the node cache holds a file it lacks or has changed (name,
size, time), so an unchanged precompiled header is never written twice. A write may be called
off (``cancel``) between two chunks: the previous file then stays. It is not a checkpoint: no
name of the layout matches it, so listings, ``cycle prune`` and retention never see it.

Unpacking never trusts it more than a checkpoint: a key that differs, a file that is not such a
tar or not the user's, is cut short, or names a path outside the cache, a link or a device is
not loaded (one line says why) and nothing of it is left in the node cache, which is filled
in one rename.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import json
import os
import shutil
import stat
import tarfile
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO

from cycler import _fs
from cycler._private import PRIVATE_FILE_MODE, create_private, restrict_tree

FORMAT = 1
KEY_MEMBER = "key.json"
CACHE, HEADERS = "cache", "headers"
"""The member folders: the node cache's files; torch's precompiled C++ headers, which it keeps
in its default directory whatever ``TORCHINDUCTOR_CACHE_DIR`` says (without them a fresh node
spends seconds building them again)."""
MAX_CARRIED_BYTES = 2 << 30
"""A node cache larger than this (2 GiB) is not carried: the root is not a cache store."""
_LEFT_OUT_SUFFIXES = (".lock",)
_TORCH_TEMPORARY_FOLDER = "tmp.pid_"
CARRIED = "carried the compile cache"
"""How :func:`pack` begins the sentence of a write that succeeded."""
_VANISHED_RETRIES = 3
"""Scans before giving up when files vanish under a carry (a compile that removes its own
temporaries while the workers run)."""


@dataclass(frozen=True)
class CacheKey:
    """What a compile cache is only valid for: a cache made under another key is never used."""

    torch: str
    """torch's version with its build (``2.13.0+cpu``)."""
    python: str
    device: str
    """The machine, CPU model and GPU models (kernels are built for them)."""
    script: str
    """sha256 of the training script (of its name, for a module)."""

    def digest(self) -> str:
        """A short name for this key (the node directory's)."""
        text = json.dumps(dataclasses.asdict(self), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def difference(self, other: Mapping[str, object]) -> str | None:
        """How ``other`` (a key as a mapping) differs from this one, ``None`` if it does not."""
        for name, mine in dataclasses.asdict(self).items():
            theirs = other.get(name)
            if theirs != mine:
                return f"it was made for {name} {_short(theirs)}, this run has {_short(mine)}"
        return None


def _short(value: object) -> str:
    text = str(value)
    return text if len(text) <= 60 else text[:12] + "..."


class Cancelled(Exception):
    """A carry was called off: the carried file was left as it was."""


def pack(sources: Mapping[str, Path], carried: Path, key: CacheKey,
         limit: int = MAX_CARRIED_BYTES, cancel: threading.Event | None = None) -> str | None:
    """Write the files of ``sources`` (member folder -> directory) to ``carried`` under
    ``key`` unless the carried file already holds them (same key, same names, sizes and times)
    or they hold more than ``limit`` bytes; what was done (a sentence starting with
    :data:`CARRIED`) or why not, ``None`` when there was nothing to do. A ``cancel`` set while
    it writes stops it and leaves ``carried`` as it was (``None``). Never raises ``OSError``."""
    for attempt in range(_VANISHED_RETRIES):
        try:
            return _pack_once(sources, carried, key, limit, cancel)
        except FileNotFoundError as error:
            if attempt + 1 == _VANISHED_RETRIES or _is_beside(error, carried):
                return f"the compile cache could not be carried in {carried}: {error}"
        except Cancelled:
            return None
        except OSError as error:
            return f"the compile cache could not be carried in {carried}: {error.strerror or error}"
    return None


def _is_beside(error: OSError, carried: Path) -> bool:
    """Whether ``error`` is about ``carried`` or its temporary, not a file of the cache."""
    return error.filename is not None and Path(error.filename).parent == carried.parent


def _pack_once(sources: Mapping[str, Path], carried: Path, key: CacheKey, limit: int,
               cancel: threading.Event | None) -> str | None:
    files = cache_files(sources)
    if not any(folder == CACHE for folder, _, _ in files) or _up_to_date(carried, files, key):
        return None
    size = sum(os.lstat(path).st_size for _, _, path in files)
    if size > limit:
        return (f"the compile cache ({size >> 20} MiB) is larger than {limit >> 20} MiB: "
                f"not carried in {carried}")
    _remove_dead_writers_leftovers(carried)  # a cycle run killed while it carried
    _fs.atomic_write(carried, lambda handle: _write_tar(handle, files, key, cancel))
    os.chmod(carried, PRIVATE_FILE_MODE)
    return f"{CARRIED} ({len(files)} files, {size >> 10} KiB) in {carried}"


def cache_files(sources: Mapping[str, Path]) -> list[tuple[str, Path, Path]]:
    """(member folder, its directory, file) for every file of ``sources`` worth carrying:
    torch's precompiled headers are the top level of theirs."""
    return [(folder, directory, path) for folder, directory in sources.items()
            for path in _cache_files(directory)
            if folder != HEADERS or path.parent == directory]


def _remove_dead_writers_leftovers(path: Path) -> None:
    """Remove the temporaries (files or trees) for ``path`` of writers on this host that died."""
    prefix = f".{path.name}{_fs.TEMP_MARKER}"
    with contextlib.suppress(OSError):
        for entry in os.scandir(path.parent):
            if entry.name.startswith(prefix) and _fs.left_by_dead_writer(entry.name):
                _fs.remove_leftover(Path(entry.path))


def _cache_files(directory: Path) -> Iterator[Path]:
    """The regular files of the node cache worth carrying (not torch's temporaries: inductor
    writes ``.<pid>.<thread>.tmp`` then renames it, triton fills ``tmp.pid_*`` folders)."""
    if not directory.is_dir():
        return
    for parent, folders, names in os.walk(directory):
        folders[:] = sorted(f for f in folders if not f.startswith(_TORCH_TEMPORARY_FOLDER))
        for name in sorted(names):
            path = Path(parent) / name
            if not name.endswith(_LEFT_OUT_SUFFIXES) and not _fs.is_temporary(name) \
                    and not (name.startswith(".") and name.endswith(".tmp")) \
                    and path.is_file() and not path.is_symlink():
                yield path


def _member_name(folder: str, directory: Path, path: Path) -> str:
    return f"{folder}/{path.relative_to(directory).as_posix()}"


def _up_to_date(carried: Path, files: list[tuple[str, Path, Path]], key: CacheKey) -> bool:
    """Whether ``carried`` is the user's, made under ``key``, and holds exactly ``files``
    (names and sizes, times within a millisecond: an unpacked file's time is set from the
    member's)."""
    try:
        found, members = _read_key(carried, listing=True)
        if key.difference(found) is not None or len(members) != len(files):
            return False
        for folder, directory, path in files:
            status = os.lstat(path)
            size, mtime = members.get(_member_name(folder, directory, path), (-1, 0.0))
            if size != status.st_size or abs(mtime - status.st_mtime) > 1e-3:
                return False
    except (OSError, ValueError, tarfile.TarError, UnicodeError):
        return False
    return True


def _write_tar(handle: IO[bytes], files: list[tuple[str, Path, Path]], key: CacheKey,
               cancel: threading.Event | None) -> None:
    with tarfile.open(fileobj=handle, mode="w", format=tarfile.PAX_FORMAT) as archive:
        record = json.dumps({"format": FORMAT, "files": len(files),
                             **dataclasses.asdict(key)}).encode()
        info = tarfile.TarInfo(KEY_MEMBER)
        info.size, info.mode = len(record), PRIVATE_FILE_MODE
        archive.addfile(info, io.BytesIO(record))
        for folder, directory, path in files:
            # The size is the open file's: a file that torch replaces meanwhile (a rename)
            # is carried whole, as it was when opened.
            with open(path, "rb") as source:
                info = archive.gettarinfo(arcname=_member_name(folder, directory, path),
                                          fileobj=source)
                info.mode, info.uid, info.gid, info.uname, info.gname = (
                    PRIVATE_FILE_MODE, 0, 0, "", "")
                archive.addfile(info, _Cancellable(source, cancel))


class _Cancellable:
    """A file read in chunks that raises :class:`Cancelled` once ``cancel`` is set."""

    def __init__(self, source: IO[bytes], cancel: threading.Event | None) -> None:
        self._source, self._cancel = source, cancel

    def read(self, size: int = -1) -> bytes:
        if self._cancel is not None and self._cancel.is_set():
            raise Cancelled
        return self._source.read(size)


def _read_key(carried: Path, listing: bool = False,
              ) -> tuple[dict[str, object], dict[str, tuple[int, float]]]:
    """The key member of ``carried``, a file of the user's, and with ``listing`` its other
    members' sizes and times by name (raises ``OSError``, ``ValueError``, ``TarError``)."""
    # No blocking on a planted FIFO, no following a planted link.
    descriptor = os.open(carried, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    with open(descriptor, "rb") as handle:
        _check_owned(os.fstat(descriptor))
        with tarfile.open(fileobj=handle, mode="r:") as archive:
            member = archive.next()
            if member is None or member.name != KEY_MEMBER or not member.isfile():
                raise ValueError("it does not start with its key")
            data = archive.extractfile(member)
            assert data is not None
            found = json.loads(data.read(1 << 16))
            members = {m.name: (m.size, m.mtime) for m in archive
                       if m.name != KEY_MEMBER} if listing else {}
    if not isinstance(found, dict) or found.get("format") != FORMAT:
        raise ValueError("its format is not one this cycler reads")
    return found, members


class _NotTheUsers(ValueError):
    """The carried file is not a plain file of the user's."""


def _check_owned(status: os.stat_result) -> None:
    """A carried file is loaded into the workers' compiler: only a plain file of the user's."""
    if not stat.S_ISREG(status.st_mode):
        raise _NotTheUsers("it is not a regular file")
    if status.st_uid != os.geteuid():
        raise _NotTheUsers(f"it belongs to uid {status.st_uid}, not to you "
                           f"(uid {os.geteuid()})")


def unpack(carried: Path, directory: Path, headers: Path | None, key: CacheKey) -> str | None:
    """Fill the empty private ``directory`` from ``carried`` when it was made under ``key``,
    and add the carried precompiled headers that ``headers`` lacks (``None``: torch's headers
    directory is not the user's, none are added); what was done or why not
    (a sentence), ``None`` when nothing is carried."""
    if not os.path.lexists(carried):
        return None
    try:
        found, _ = _read_key(carried)
    except _NotTheUsers as error:
        return f"the carried compile cache {carried} is not loaded: {error}"
    except (OSError, ValueError, tarfile.TarError, UnicodeError) as error:
        return f"the carried compile cache {carried} is not loaded: it is unreadable ({error})"
    different = key.difference(found)
    if different is not None:
        return f"the carried compile cache {carried} is not loaded: {different}"
    _remove_dead_writers_leftovers(directory)
    staging = _fs.temporary_sibling(directory)
    try:
        count = _extract(carried, staging)
        if count != found.get("files"):  # a tar cut at a member's end reads as a whole one
            raise ValueError(f"it is cut short ({count} of {found.get('files')} files)")
        if os.path.lexists(staging / CACHE):
            os.rmdir(directory)  # empty: checked by the caller, private, the user's
            os.rename(staging / CACHE, directory)
        if headers is not None:
            _add_headers(staging / HEADERS, headers)
    except (OSError, ValueError, tarfile.TarError) as error:
        with contextlib.suppress(OSError):
            create_private(directory)
        return f"the carried compile cache {carried} is not loaded: {error}"
    finally:
        _fs.remove_leftover(staging)
    return f"loaded the carried compile cache ({count} files) from {carried} into {directory}"


def _extract(carried: Path, staging: Path) -> int:
    """Write the carried files into a new private ``staging``; how many. Raises
    ``ValueError`` for a member that is not a plain file inside one of the folders."""
    create_private(staging)
    count = 0
    with tarfile.open(carried, mode="r:") as archive:
        for member in archive:
            if member.name == KEY_MEMBER:
                continue
            target = staging / _checked_name(member)
            target.parent.mkdir(parents=True, exist_ok=True)
            source = archive.extractfile(member)
            assert source is not None
            with source, open(target, "xb") as sink:
                shutil.copyfileobj(source, sink)
            os.utime(target, (member.mtime, member.mtime))
            count += 1
    restrict_tree(staging)
    return count


def _checked_name(member: tarfile.TarInfo) -> str:
    name = PurePosixPath(member.name)
    parts = name.parts
    if not member.isfile() or name.is_absolute() or ".." in parts or len(parts) < 2 \
            or parts[0] not in (CACHE, HEADERS) or (parts[0] == HEADERS and len(parts) != 2):
        raise ValueError(f"it holds {member.name!r}, which is not a file of the cache")
    return str(name)


def _add_headers(staged: Path, headers: Path) -> None:
    """Link each staged header into ``headers`` (made private if missing; checked by the
    caller if not) unless a file of that name is there: headers are named by the hash of what
    they were built from."""
    if not staged.is_dir():
        return
    create_private(headers)
    for entry in sorted(staged.iterdir()):
        with contextlib.suppress(FileExistsError):
            os.link(entry, headers / entry.name)
