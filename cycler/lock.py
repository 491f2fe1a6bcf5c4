"""The supervisor's lock on a checkpoint root: proof that a live ``cycle run`` is writing there.

``cycle run`` holds an exclusive ``flock`` on ``<root>/.cycler/supervisor.lock`` for its whole
life; the kernel drops it when the process dies, even by SIGKILL, so a stale lock file never
blocks anybody. ``cycle prune`` and ``cycle status`` probe the lock without taking it for long.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from pathlib import Path
from typing import Any

from cycler.errors import DirectoryInUse


class SupervisorLock:
    """Exclusive lock held by one supervisor; a second one on the same root is refused."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._fd: int | None = None

    def acquire(self, **owner: Any) -> None:
        """Take the lock and record the owner; raises :class:`DirectoryInUse` if held."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            holder = lock_holder(self.path) or {}
            raise DirectoryInUse(
                f"{self.path.parent.parent} is in use by a live cycle run "
                f"(pid {holder.get('pid', '?')} on {holder.get('host', '?')}); stop it first"
            ) from None
        record = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.time(), **owner}
        # Write, then cut to length: truncating to zero first costs a metadata flush each time.
        data = json.dumps(record).encode()
        os.pwrite(fd, data, 0)
        os.ftruncate(fd, len(data))
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> SupervisorLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def lock_holder(path: Path) -> dict[str, Any] | None:
    """The owner record of a held lock, or ``None`` when no live process holds it."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _read_owner(fd)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def _read_owner(fd: int) -> dict[str, Any]:
    try:
        record = json.loads(os.pread(fd, 4096, 0) or b"{}")
    except ValueError:
        return {}
    return record if isinstance(record, dict) else {}
