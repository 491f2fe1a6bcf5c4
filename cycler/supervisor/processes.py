"""The processes of one job: torchrun's tree, its stderr, and the watchdog that outlives us.

No process of the job may outlive the supervisor, even when the supervisor is killed with
SIGKILL and runs no cleanup at all. torchrun is started in its own session, so its process group
holds torchrun and every worker; a tiny watchdog process (plain Python, no imports beyond ``os``,
``signal`` and ``sys``) holds the read end of a pipe whose write end only the supervisor has. When
the supervisor dies for any reason the kernel closes that end, the watchdog reads end-of-file and
SIGKILLs every process group it was told about.

``PR_SET_PDEATHSIG`` is not used: it needs a ``preexec_fn``, which is unsafe once the supervisor
runs threads (the stderr pump), and it would only reach torchrun, not torchrun's workers.
"""

from __future__ import annotations

import collections
import contextlib
import os
import signal
import subprocess
import sys
import threading
from typing import IO

import psutil

STDERR_TAIL_BYTES = 64 * 1024
"""How much of torchrun's stderr is kept for the failure report."""

_WATCHDOG_SOURCE = """
import os, signal, sys
for number in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
    signal.signal(number, signal.SIG_IGN)
groups = set()
for line in sys.stdin:
    if line[:1] == "+":
        groups.add(int(line[1:]))
    elif line[:1] == "-":
        groups.discard(int(line[1:]))
for group in groups:
    try:
        os.killpg(group, signal.SIGKILL)
    except OSError:
        pass
"""


class Watchdog:
    """Kills the registered process groups as soon as this process is gone, however it died."""

    def __init__(self, python: str = sys.executable) -> None:
        # -I -S: no site, no user paths; it starts in milliseconds and imports nothing of ours.
        self._process = subprocess.Popen(
            [python, "-I", "-S", "-c", _WATCHDOG_SOURCE], stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL, start_new_session=True, text=True,
        )

    @property
    def pid(self) -> int:
        return self._process.pid

    def watch(self, process_group: int) -> None:
        self._send(f"+{process_group}\n")

    def forget(self, process_group: int) -> None:
        self._send(f"-{process_group}\n")

    def _send(self, line: str) -> None:
        stdin = self._process.stdin
        if stdin is None:
            return
        with contextlib.suppress(OSError, ValueError):
            stdin.write(line)
            stdin.flush()

    def close(self) -> None:
        """End the watchdog; it kills whatever is still registered on its way out."""
        if self._process.stdin is not None:
            with contextlib.suppress(OSError):
                self._process.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._process.wait(timeout=5)


class StderrTail:
    """Copies a child's stderr to ours as it comes and keeps the last bytes for reports."""

    def __init__(self, source: IO[bytes], echo_fd: int = 2) -> None:
        self._source = source
        self._echo_fd = echo_fd
        self._chunks: collections.deque[bytes] = collections.deque()
        self._size = 0
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._pump, name="cycle-stderr", daemon=True)
        self._thread.start()

    def _pump(self) -> None:
        fd = self._source.fileno()
        while chunk := os.read(fd, 65536):
            with contextlib.suppress(OSError):
                os.write(self._echo_fd, chunk)
            self._keep(chunk)
        self._source.close()

    def _keep(self, chunk: bytes) -> None:
        with self._lock:
            self._chunks.append(chunk)
            self._size += len(chunk)
            while self._size - len(self._chunks[0]) >= STDERR_TAIL_BYTES:
                self._size -= len(self._chunks.popleft())

    def wait(self, timeout: float) -> None:
        """Wait until every writer closed the pipe (or ``timeout``: a daemon may keep it open)."""
        self._thread.join(timeout)

    def text(self) -> str:
        with self._lock:
            return b"".join(self._chunks).decode(errors="replace")


class WorkerTree:
    """One start of torchrun in its own session, with the stderr pump and a watchdog entry."""

    def __init__(self, process: subprocess.Popen[bytes], watchdog: Watchdog,
                 echo_fd: int = 2) -> None:
        self.process = process
        self.process_group = process.pid  # start_new_session: torchrun leads its own group
        self._watchdog = watchdog
        watchdog.watch(self.process_group)
        assert process.stderr is not None, "torchrun must be started with stderr=PIPE"
        self.stderr = StderrTail(process.stderr, echo_fd)

    def signal(self, number: signal.Signals) -> None:
        """Send ``number`` to torchrun, its process group and any descendant that left it."""
        descendants = _descendants(self.process.pid)
        with contextlib.suppress(OSError):
            os.killpg(self.process_group, number)
        for child in descendants:
            with contextlib.suppress(psutil.Error):
                child.send_signal(number)

    def reap(self) -> None:
        """After torchrun exited: SIGKILL anything left in its group, then stop watching it."""
        self.signal(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=5)
        self._watchdog.forget(self.process_group)


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return list(psutil.Process(pid).children(recursive=True))
    except psutil.Error:
        return []


def start_torchrun(command: list[str], environment: dict[str, str], watchdog: Watchdog,
                   echo_fd: int = 2) -> WorkerTree:
    """Start ``command`` in a new session with stderr piped through us; stdin is closed."""
    process = subprocess.Popen(command, env=environment, stdin=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, start_new_session=True)
    return WorkerTree(process, watchdog, echo_fd)
