"""Durable file primitives: every write becomes visible whole or not at all.

The pattern is always the same: write a uniquely named temporary in the destination's directory,
fsync it, rename it over the destination, fsync the directory. A crash at any point leaves either
the old destination or the new one, never a torn mixture, and never no destination when there was
one before. Temporaries carry ``TEMP_MARKER`` in their name so readers and prune recognise them.
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import logging
import os
import socket
import stat
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from cycler.errors import DiskFull

log = logging.getLogger("cycler.checkpoint")

TEMP_MARKER = ".cycler-tmp-"
"""Part of every temporary's name: ``.<final>.cycler-tmp-<host>-<pid>-<start>-<random>``; the
writer's host, pid and start time let a later writer tell a dead writer's leftover from a live
writer's temporary."""
_HOST = socket.gethostname().replace("/", "_")


def temporary_sibling(path: Path) -> Path:
    """A unique, hidden name in ``path``'s directory that no other writer will pick."""
    writer = f"{_HOST}-{os.getpid()}-{process_start(os.getpid())}"
    return path.with_name(f".{path.name}{TEMP_MARKER}{writer}-{uuid.uuid4().hex[:12]}")


def process_start(pid: int) -> str:
    """When ``pid`` started, in clock ticks since boot (``/proc/PID/stat`` field 22), or ``""``
    where that cannot be read."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[19].decode()
    except (OSError, IndexError):
        return ""


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists (one not ours to signal counts as existing)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def left_by_dead_writer(name: str) -> bool:
    """Whether the temporary ``name`` was made on this host by a process that is gone (pid
    absent, or reused by a process that started at another time). Temporaries of other hosts
    and of the older, unidentified format are never judged dead."""
    writer = name.split(TEMP_MARKER, 1)[-1].rsplit("-", 3)
    if len(writer) != 4 or writer[0] != _HOST or not writer[1].isdigit() or not writer[2]:
        return False
    return process_start(int(writer[1])) != writer[2]


def remove_dead_writers_temporaries(path: Path) -> list[Path]:
    """Remove the temporaries for ``path`` that writers on this host left when they died (a
    kill between create and rename); the removed paths."""
    prefix = f".{path.name}{TEMP_MARKER}"
    removed = []
    with contextlib.suppress(OSError):
        for entry in os.scandir(path.parent):
            if entry.name.startswith(prefix) and left_by_dead_writer(entry.name):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)
                    removed.append(Path(entry.path))
    return removed


def is_temporary(name: str) -> bool:
    """Whether ``name`` is a temporary left by one of the writers in this module."""
    return TEMP_MARKER in name


def fsync_path(path: Path, flags: int = 0) -> None:
    """Flush a file's data and metadata to stable storage."""
    fd = os.open(path, os.O_RDONLY | flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_directory(path: Path) -> None:
    """Make the entries of a directory (renames, creations) durable."""
    fsync_path(path, os.O_DIRECTORY)


@contextlib.contextmanager
def _removed_on_failure(path: Path) -> Iterator[None]:
    try:
        yield
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        raise


def atomic_write(path: Path, write: Callable[[IO[bytes]], object], durable: bool = True) -> None:
    """Call ``write(file)`` on a temporary, then durably replace ``path`` with it.

    Until the rename, the previous content of ``path`` is untouched; the temporary is removed if
    ``write`` (or anything before the rename) fails, including on KeyboardInterrupt.
    ``durable=False`` skips the fsyncs: still all-or-nothing for readers, but not guaranteed
    to survive a power cut (for messages between live processes, not for data).
    """
    path = Path(path)
    temporary = temporary_sibling(path)
    with _removed_on_failure(temporary), _disk_full_said_plainly(path, temporary):
        with open(temporary, "xb") as handle:
            write(handle)
            handle.flush()
            if durable:
                os.fsync(handle.fileno())
        os.replace(temporary, path)
    if durable:
        fsync_directory(path.parent)


_FULL = (errno.ENOSPC, errno.EDQUOT)


@contextlib.contextmanager
def _disk_full_said_plainly(path: Path, temporary: Path) -> Iterator[None]:
    """Turn the many faces of a full disk (ENOSPC, EDQUOT, torch.save's 'unexpected pos')
    into one :class:`DiskFull` line: where, how much was written, how much is free."""
    try:
        yield
    except (OSError, RuntimeError) as error:
        if not (caused_by_full_disk(error) or _no_space_left(path.parent)):
            raise
        written = temporary.stat().st_size if temporary.exists() else None
        full = DiskFull(disk_full_message(path, written))
        full.errno = errno.ENOSPC  # one line when printed, and still ENOSPC for `except`
        raise full from error


def caused_by_full_disk(error: BaseException | None) -> bool:
    """Whether ``error`` or what caused it is ENOSPC or EDQUOT."""
    # torch.save reports ENOSPC as a RuntimeError whose context is the OSError.
    while error is not None:
        if isinstance(error, OSError) and error.errno in _FULL:
            return True
        error = error.__cause__ or error.__context__
    return False


def full_disk_said_in_one_line() -> None:
    """From now on, a process that dies of a full disk (:class:`DiskFull`, or what a full disk
    caused) prints one line to stderr (``cycler: rank R: <where, what was written, what is
    free>``) instead of its traceback, and still exits 1; any other error prints as before.

    For workers under ``cycle run``: a stop's checkpoint on a full root fails in the script's
    own save, and the supervisor already says what the next start resumes from. Installed
    once per process, chaining whatever ``sys.excepthook`` was there."""
    import sys

    previous = sys.excepthook
    if getattr(previous, "_cycler_full_disk", False):
        return

    def one_line(kind: type[BaseException], error: BaseException, trace: Any) -> None:
        if isinstance(error, DiskFull) or caused_by_full_disk(error):
            said = str(error) if isinstance(error, DiskFull) else \
                f"{kind.__name__}: {error}: the disk is full (ENOSPC or a quota)"
            sys.stderr.write(f"cycler: rank {os.environ.get('RANK', '?')}: {said}\n")
            # The hooks it chains still act (the memory tier's overflow record: the next start
            # saves to the root); only what they print is dropped.
            shown, sys.stderr = sys.stderr, io.StringIO()
            try:
                previous(kind, error, trace)
            finally:
                sys.stderr = shown
            return
        previous(kind, error, trace)

    one_line._cycler_full_disk = True  # type: ignore[attr-defined]
    sys.excepthook = one_line


def _no_space_left(directory: Path) -> bool:
    try:
        stats = os.statvfs(directory)
    except OSError:
        return False
    return stats.f_bavail * stats.f_frsize < (1 << 20)


def disk_full_message(path: Path, written: int | None) -> str:
    """One line: the filesystem, what was written when it ran out, what is free."""
    mount = Path(os.path.abspath(path)).parent
    while not os.path.ismount(mount) and mount != mount.parent:
        mount = mount.parent
    try:
        stats = os.statvfs(path.parent)
        free = f"{stats.f_bavail * stats.f_frsize / 2**20:.1f} MB free"
    except OSError:
        free = "free space unknown"
    wrote = "" if written is None else f" after {written / 2**20:.1f} MB"
    return (f"no space left on {mount} ({free}) writing {path.name}{wrote}: the checkpoints "
            "committed before are intact; free space or choose another checkpoint directory")


RECORD_MAX_BYTES = 1 << 20
"""The most of a record that is read: records are small, a larger file is not one."""


def read_json_object(path: Path) -> dict[str, Any]:
    """The JSON object in ``path``, or ``{}`` when it is missing, unreadable, malformed, not
    an object, not a regular file or larger than :data:`RECORD_MAX_BYTES`: for the small
    records whose absence only means "nothing recorded". Never blocks (a FIFO another user
    put in a group-writable ``.cycler/``), never reads a planted huge file whole."""
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return {}
    try:
        status = os.fstat(descriptor)
        if not stat.S_ISREG(status.st_mode) or status.st_size > RECORD_MAX_BYTES:
            return {}
        record = json.loads(os.read(descriptor, RECORD_MAX_BYTES) or b"{}")
    except (OSError, ValueError):
        return {}
    finally:
        os.close(descriptor)
    return record if isinstance(record, dict) else {}


def remove_logged(remove: Callable[[Path], object], path: Path, what: str) -> bool:
    """``remove(path)``; whether it worked. A failure is logged, never raised: what follows a
    commit must not fail the commit, and the next one retries."""
    try:
        remove(path)
    except FileNotFoundError:
        return True  # gone already (cycle prune, another writer's retention)
    except OSError as error:  # an undeletable file, NFS's .nfs* of a file still open...
        log.warning("could not remove %s %s (%s); retention retries at the next commit",
                    what, path.name, error.strerror or error)
        return False
    return True


def atomic_write_bytes(path: Path, data: bytes, durable: bool = True) -> None:
    """Replace ``path`` with ``data`` in one step (see :func:`atomic_write`)."""
    atomic_write(path, lambda handle: handle.write(data), durable)


def atomic_symlink(target: str | os.PathLike[str], link: Path) -> None:
    """Point ``link`` at ``target`` in one rename: the link is never missing, never half-made.

    A uniquely named temporary link is created beside ``link`` and renamed over it, then the
    directory is fsynced. Lightning and Composer instead delete and recreate the link, which
    leaves a window with no link at all.
    """
    link = Path(link)
    temporary = temporary_sibling(link)
    with _removed_on_failure(temporary):
        os.symlink(os.fspath(target), temporary)
        os.replace(temporary, link)
    fsync_directory(link.parent)


def discard_directory(path: Path) -> None:
    """Remove a directory tree so that it never looks half-removed under its own name.

    It is first renamed to a temporary name (one atomic step: from then on no reader takes it
    for a checkpoint), then deleted. ``shutil.rmtree`` removes symlinks inside it without
    following them, so nothing outside the tree is touched.
    """
    import shutil

    shutil.rmtree(set_aside(path))


def set_aside(path: Path) -> Path:
    """Rename ``path`` to a temporary name beside it (one atomic step: from then on no reader
    takes it for what it was) and return that name; its files are this process's leftover,
    reclaimed once it is gone (:func:`left_by_dead_writer`)."""
    path = Path(path)
    doomed = temporary_sibling(path)
    os.rename(path, doomed)
    fsync_directory(path.parent)
    return doomed


def remove_leftover(path: Path) -> None:
    """Remove a temporary left by a writer that died, without following it.

    Links and files are unlinked (never their targets); directories are deleted by
    ``shutil.rmtree``, which removes symlinks inside without following them.
    """
    import shutil
    import stat

    try:
        if stat.S_ISDIR(os.lstat(path).st_mode):
            shutil.rmtree(path)
        else:
            os.unlink(path)
    except FileNotFoundError:
        pass


def tree_size(path: Path) -> int:
    """Bytes of the files under ``path`` (0 for a symlink or a non-directory); a file that
    vanishes or cannot be read counts 0."""
    if path.is_symlink() or not path.is_dir():
        return 0
    total = 0
    for parent, _, names in os.walk(path):
        for name in names:
            try:
                total += os.lstat(os.path.join(parent, name)).st_size
            except OSError:
                continue
    return total
