"""The supervisor's lock on a checkpoint root: proof that a live ``cycle run`` is writing there.

``cycle run`` holds an exclusive ``flock`` on ``<root>/.cycler/supervisor.lock`` for its whole
life; the kernel drops it when the process dies, even by SIGKILL, so a stale lock file never
blocks anybody. ``cycle prune`` and ``cycle status`` probe the lock without taking it for long.

Where the filesystem has no ``flock`` (Lustre mounted ``noflock`` answers ENOSYS; some NFS
setups ENOLCK or EOPNOTSUPP) the lock is an exclusively created ``<lock>.held`` file holding the
owner's host, pid and process start time instead, said once in the log. A holder on this host
that is gone is taken over; one on another host cannot be checked and is reported.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cycler._fs import process_start, read_json_object
from cycler.errors import CheckpointDirectoryError, DirectoryInUse

log = logging.getLogger(__name__)

NO_FLOCK = (errno.ENOSYS, errno.ENOLCK, errno.EOPNOTSUPP)
"""What ``flock`` answers on filesystems that do not support it."""
_said_no_flock: set[str] = set()


def _held_path(path: Path) -> Path:
    return path.with_name(path.name + ".held")


class SupervisorLock:
    """Exclusive lock held by one supervisor; a second one on the same root is refused."""

    def __init__(self, path: Path, flock: Callable[[int, int], None] = fcntl.flock) -> None:
        self.path = Path(path)
        self._flock = flock
        self._fd: int | None = None
        self._held: Path | None = None

    def acquire(self, **owner: Any) -> None:
        """Take the lock and record the owner; raises :class:`DirectoryInUse` if held."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        record = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.time(),
                  "started": process_start(os.getpid()),
                  "command": " ".join(sys.argv)[:200], **owner}
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            self._flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            self._refuse(lock_holder(self.path, self._flock) or {})
        except OSError as error:
            os.close(fd)
            if error.errno not in NO_FLOCK:
                raise
            self._acquire_held_file(record, error)
            return
        # Write, then cut to length: truncating to zero first costs a metadata flush each time.
        data = json.dumps(record).encode()
        try:
            os.pwrite(fd, data, 0)
            os.ftruncate(fd, len(data))
        except OSError as error:  # a full or failing disk: one line at the start, exit 2
            os.close(fd)
            raise CheckpointDirectoryError(
                f"cannot write {self.path} ({error.strerror}): free space on that filesystem "
                "or choose another checkpoint directory") from None
        self._fd = fd

    def _acquire_held_file(self, record: dict[str, Any], error: OSError) -> None:
        held = _held_path(self.path)
        if str(held.parent) not in _said_no_flock:
            _said_no_flock.add(str(held.parent))
            log.warning("flock is not supported in %s (%s); locking with %s files holding the "
                        "owner's host and pid instead", held.parent, os.strerror(error.errno or 0),
                        held.name)
        for _ in range(2):  # a second try after taking over a dead holder's file
            try:
                fd = os.open(held, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                holder = read_json_object(held)
                if _alive(holder):
                    self._refuse(holder)
                held.unlink(missing_ok=True)  # its owner died without releasing it
                continue
            with os.fdopen(fd, "w") as handle:
                json.dump(record, handle)
            self._held = held
            return
        self._refuse(read_json_object(held))

    def _refuse(self, holder: dict[str, Any]) -> None:
        who = f"pid {holder.get('pid', '?')} on {holder.get('host', '?')}"
        if holder.get("command"):
            who += f": {holder['command']}"
        root = self.path.parent.parent
        if holder.get("role") == "writer":
            raise DirectoryInUse(
                f"another process writes {holder.get('name', 'its')} checkpoints in {root} "
                f"({who}); stop it, or give this job another checkpoint directory or name"
            ) from None
        raise DirectoryInUse(f"{root} is in use by a live cycle run ({who}); stop it first"
                             ) from None

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self._held is not None:
            self._held.unlink(missing_ok=True)
            self._held = None

    def __enter__(self) -> SupervisorLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


_SHARED: dict[Path, tuple[SupervisorLock, int]] = {}
_SHARED_GUARD = threading.Lock()


def hold_shared(path: Path, **owner: Any) -> None:
    """Hold the lock at ``path`` for one more user in this process: the first takes it (or
    raises :class:`DirectoryInUse`), the others share it. Savers of one process share their
    writer lock: a saver dropped by an exception a caller still holds must not lock out the
    next saver of the very same process, while every other process stays refused."""
    with _SHARED_GUARD:
        lock, users = _SHARED.get(path, (None, 0))
        if lock is None:
            lock = SupervisorLock(path)
            lock.acquire(**owner)
        _SHARED[path] = (lock, users + 1)


def drop_shared(path: Path) -> None:
    """One user of :func:`hold_shared` less; the last one releases the lock."""
    with _SHARED_GUARD:
        lock, users = _SHARED.pop(path, (None, 0))
        if lock is None:
            return
        if users > 1:
            _SHARED[path] = (lock, users - 1)
        else:
            lock.release()


def lock_holder(path: Path,
                flock: Callable[[int, int], None] = fcntl.flock) -> dict[str, Any] | None:
    """The owner record of a held lock, or ``None`` when no live process holds it."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return _held_holder(path)
    try:
        try:
            flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _read_owner(fd)
        except OSError as error:
            if error.errno not in NO_FLOCK:
                raise
            return _held_holder(path)
        flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def _held_holder(path: Path) -> dict[str, Any] | None:
    holder = read_json_object(_held_path(path))
    return holder if holder and _alive(holder) else None




def _alive(holder: dict[str, Any]) -> bool:
    """Whether a lock file's owner still runs; one on another host is taken to."""
    if holder.get("host") != socket.gethostname():
        return bool(holder)
    pid = holder.get("pid")
    return isinstance(pid, int) and process_start(pid) == holder.get("started")


def _read_owner(fd: int) -> dict[str, Any]:
    try:
        record = json.loads(os.pread(fd, 4096, 0) or b"{}")
    except ValueError:
        return {}
    return record if isinstance(record, dict) else {}
