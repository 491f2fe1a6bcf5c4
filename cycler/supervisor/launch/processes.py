"""The processes of one job: torchrun's tree, its stderr, and the watchdog that outlives us.

No process of the job may outlive the supervisor, even when the supervisor is killed with
SIGKILL and runs no cleanup at all. torchrun starts every worker in a session of its own, so no
single process group holds the job. Two mechanisms cover it:

- While the supervisor lives, it is a child subreaper (``PR_SET_CHILD_SUBREAPER``): a worker's
  child orphaned by a crash is re-parented to the supervisor instead of init, so "every
  descendant of the supervisor" is always the whole job and can be signalled and reaped.
- A tiny watchdog process (plain Python, only ``os``, ``signal`` and ``sys``) holds the read end
  of a pipe whose write end only the supervisor has. When the supervisor dies for any reason the
  kernel closes that end; the watchdog reads end-of-file, walks ``/proc`` from each registered
  torchrun to all its descendants and everything in their sessions, and SIGKILLs them.

``PR_SET_PDEATHSIG`` is not used: it needs a ``preexec_fn``, which is unsafe once the supervisor
runs threads (the stderr pump), and it would only reach torchrun, not torchrun's workers.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO

import psutil

from cycler._fs import process_start

STDERR_TAIL_BYTES = 64 * 1024
"""How much of torchrun's stderr is kept for the failure report."""
_PR_SET_CHILD_SUBREAPER = 36

_WATCHDOG_SOURCE = """
import os, signal, sys
for number in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
    signal.signal(number, signal.SIG_IGN)
roots = {}
for line in sys.stdin:
    pid, _, started = line[1:].strip().partition(" ")
    if line[:1] == "+":
        roots[int(pid)] = started
    elif line[:1] == "-":
        roots.pop(int(pid), None)
parents, sessions, starts = {}, {}, {}
for name in os.listdir("/proc"):
    if name.isdigit():
        try:
            with open("/proc/" + name + "/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        pid = int(name)
        parents[pid], sessions[pid], starts[pid] = int(fields[1]), int(fields[3]), fields[19]
# Only a root that is still the process it was (same start time) leads anywhere: a pid the
# kernel reused for somebody else's process is never killed.
verified = {pid for pid, started in roots.items() if starts.get(pid, b"").decode() == started}
doomed, frontier = set(), verified
while frontier:
    doomed |= frontier
    frontier = {pid for pid, parent in parents.items() if parent in frontier} - doomed
own_sessions = {sessions[pid] for pid in doomed if pid in sessions} & doomed
doomed |= {pid for pid, session in sessions.items() if session in own_sessions}
doomed.discard(os.getpid())
for pid in doomed:
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass
"""


def become_subreaper() -> bool:
    """Make orphaned descendants re-parent to this process (Linux); whether it worked."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


class Watchdog:
    """Kills the registered torchrun trees as soon as this process is gone, however it died."""

    def __init__(self, python: str = sys.executable) -> None:
        # -I -S: no site, no user paths; it starts in milliseconds and imports nothing of ours.
        self._process = subprocess.Popen(
            [python, "-I", "-S", "-c", _WATCHDOG_SOURCE], stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL, start_new_session=True, text=True,
        )

    @property
    def pid(self) -> int:
        return self._process.pid

    def watch(self, pid: int) -> None:
        """Kill ``pid``'s tree and sessions if this process dies (only while ``pid`` is the
        process it is now: its start time is checked)."""
        self._send(f"+{pid} {process_start(pid)}\n")

    def forget(self, pid: int) -> None:
        self._send(f"-{pid}\n")

    def _send(self, line: str) -> None:
        stdin = self._process.stdin
        if stdin is None:
            return
        with contextlib.suppress(OSError, ValueError):
            stdin.write(line)
            stdin.flush()

    def close(self) -> None:
        """End the watchdog; it kills what is still registered on its way out."""
        if self._process.stdin is not None:
            with contextlib.suppress(OSError):
                self._process.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._process.wait(timeout=5)


class StderrTail:
    """Copies a child's stderr to ours as it comes and keeps the last bytes for reports.

    With :meth:`hold_tracebacks` (several nodes), what follows a traceback's first line (or
    a C++ exception's, :func:`_error_start`) is
    held back from the terminal and appended to a log file as it comes: it may be the echo of
    a lost node (every worker's and torchrun's tracebacks), which :meth:`summarise` then says
    in one line; :meth:`release` (a restart, or the hold's time is up) shows it after all.
    """

    def __init__(self, source: IO[bytes], echo_fd: int = 2) -> None:
        self._source = source
        self._echo_fd = echo_fd
        self._chunks: collections.deque[bytes] = collections.deque()
        self._size = 0
        self._lock = threading.Lock()
        self._log: Path | None = None
        self._hold_seconds = 0.0
        self._held: list[bytes] | None = None
        self._timer: threading.Timer | None = None
        self._summarised = False
        self._thread = threading.Thread(target=self._pump, name="cycle-stderr", daemon=True)
        self._thread.start()

    def hold_tracebacks(self, log: Path, seconds: float) -> None:
        """From now on hold back a traceback and what follows for up to ``seconds`` (the
        time a lost node's verdict takes), keeping it in ``log``."""
        with self._lock:
            self._log, self._hold_seconds = log, seconds

    def release(self) -> None:
        """Show what is held, and stop holding until the next traceback."""
        with self._lock:
            held, self._held = self._held, None
            self._stop_timer()
        if held:
            self._write(b"".join(held))

    def summarise(self) -> tuple[int, Path | None]:
        """Drop what is held (and whatever comes after) from the terminal; the lines dropped
        so far and the log file that has them (``None``: nothing is held back here)."""
        with self._lock:
            held, self._held, self._summarised = self._held, None, True
            self._stop_timer()
        return sum(chunk.count(b"\n") for chunk in held or []), self._log

    def _pump(self) -> None:
        fd = self._source.fileno()
        while chunk := os.read(fd, 65536):
            shown = self._route(chunk)
            if shown:
                self._write(shown)
            self._keep(chunk)
        self._source.close()

    def _route(self, chunk: bytes) -> bytes:
        """What of ``chunk`` goes to the terminal now; the rest is held and logged."""
        with self._lock:
            if self._log is None:
                return chunk
            if self._held is None and not self._summarised:
                start = _error_start(chunk)
                if start < 0:
                    return chunk
                shown, chunk = chunk[:start], chunk[start:]
                self._held = []
                self._timer = threading.Timer(self._hold_seconds, self.release)
                self._timer.daemon = True
                self._timer.start()
            else:
                shown = b""
            if self._held is not None:
                self._held.append(chunk)
            _append_private(self._log, chunk)
            return shown

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _write(self, data: bytes) -> None:
        with contextlib.suppress(OSError):
            os.write(self._echo_fd, data)

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


TRACEBACK, CPP_EXCEPTION = b"Traceback (most recent call last)", b"Exception raised from "
"""What starts the output held back: a Python traceback; a C++ exception's frames, which torch
prints after a line that says what failed (c10d's "Broken pipe")."""


def _error_start(chunk: bytes) -> int:
    """Where in ``chunk`` the held output starts (the line of a traceback's first line, or the
    line before a C++ exception's), ``-1`` where it holds none."""
    found = [(at, marker) for marker in (TRACEBACK, CPP_EXCEPTION)
             if (at := chunk.find(marker)) >= 0]
    if not found:
        return -1
    at, marker = min(found)
    start = chunk.rfind(b"\n", 0, at) + 1
    if marker == CPP_EXCEPTION and start > 0:
        start = chunk.rfind(b"\n", 0, start - 1) + 1
    return start
STDERR_LOG_BYTES = 16 << 20
"""Past this size the log of held tracebacks takes no more (a crash loop's would only grow)."""


def _append_private(path: Path, data: bytes) -> None:
    """Append ``data`` to the user's file ``path`` (made 0600; never through a symlink);
    failures are ignored: the terminal still gets the summary or the text."""
    with contextlib.suppress(OSError):
        descriptor = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW
                             | os.O_NONBLOCK, 0o600)
        try:
            if os.fstat(descriptor).st_size < STDERR_LOG_BYTES:
                os.write(descriptor, data)
        finally:
            os.close(descriptor)


class WorkerTree:
    """One start of torchrun in its own session, with the stderr pump and a watchdog entry."""

    def __init__(self, process: subprocess.Popen[bytes], watchdog: Watchdog,
                 echo_fd: int = 2) -> None:
        self.process = process
        self._watchdog = watchdog
        watchdog.watch(process.pid)
        assert process.stderr is not None, "torchrun must be started with stderr=PIPE"
        self.stderr = StderrTail(process.stderr, echo_fd)

    def members(self) -> list[psutil.Process]:
        """torchrun and every process below it, orphans re-parented to the supervisor included.

        As a subreaper the supervisor inherits orphans of the job, so its descendants (minus
        the watchdog) are the job, even after torchrun itself is gone.
        """
        job = descendants(os.getpid())
        return [member for member in job if member.pid != self._watchdog.pid]

    def only_torchrun_left(self) -> bool:
        """Whether torchrun is still running but every worker below it has exited."""
        if self.process.poll() is not None:
            return False
        try:
            workers = psutil.Process(self.process.pid).children()
        except psutil.Error:
            return False
        return not any(_running(worker) for worker in workers)

    def has_workers(self) -> bool:
        """Whether torchrun has started its workers (none while it waits in the rendezvous)."""
        try:
            workers = psutil.Process(self.process.pid).children()
        except psutil.Error:
            return False
        return any(_running(worker) for worker in workers)

    def signal_workers(self, number: signal.Signals) -> list[int]:
        """Send ``number`` to each worker's process group, as torchrun forwards a signal
        (torchrun starts every worker in a session of its own); the pids signalled."""
        try:
            workers = psutil.Process(self.process.pid).children()
        except psutil.Error:
            return []
        for worker in workers:
            try:
                os.killpg(worker.pid, number)
            except ProcessLookupError:  # not a group leader (another launcher): the worker
                with contextlib.suppress(OSError):
                    os.kill(worker.pid, number)
            except OSError:
                pass
        return [worker.pid for worker in workers]

    def signal(self, number: signal.Signals) -> None:
        """Send ``number`` to every member of the job."""
        for member in self.members():
            with contextlib.suppress(psutil.Error):
                member.send_signal(number)

    def reap(self) -> None:
        """SIGKILL whatever is left of the job, collect the exits, stop watching torchrun;
        show what stderr held back (unless it was summed up)."""
        self.stderr.release()
        members = self.members()
        for member in members:
            with contextlib.suppress(psutil.Error):
                member.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=5)
        deadline = time.monotonic() + 5
        while any(_running(member) for member in members) and time.monotonic() < deadline:
            self._reap_orphans()
            time.sleep(0.01)
        self._reap_orphans()
        self._watchdog.forget(self.process.pid)

    def _reap_orphans(self) -> None:
        """Collect exited orphans the subreaper inherited (torchrun is Popen's to collect)."""
        mine = {self.process.pid, self._watchdog.pid}
        for child in _children_of_this_process():
            if child.pid not in mine and not _running(child):
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(child.pid, os.WNOHANG)


def _children_of_this_process() -> list[psutil.Process]:
    try:
        return psutil.Process().children()
    except psutil.Error:
        return []


def _running(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def descendants(pid: int) -> list[psutil.Process]:
    """Every process below ``pid`` (none if it is gone)."""
    try:
        return list(psutil.Process(pid).children(recursive=True))
    except psutil.Error:
        return []


def start_torchrun(command: list[str], environment: dict[str, str], watchdog: Watchdog,
                   echo_fd: int = 2) -> WorkerTree:
    """Start ``command`` in a new session with stderr piped through us; stdin is ``cycle
    run``'s, as a plain torchrun's workers have their caller's (a script reading a pipe, a
    ``breakpoint()`` on rank 0). Where ``cycle run`` started without a descriptor 0 (Python's
    ``sys.__stdin__`` is ``None`` then), torchrun gets /dev/null there: a file opened since
    took that number (an epoll), and the workers forked from torchrun would read from theirs."""
    stdin = subprocess.DEVNULL if sys.__stdin__ is None else None
    process = subprocess.Popen(command, env=environment, stdin=stdin, stderr=subprocess.PIPE,
                               start_new_session=True)
    return WorkerTree(process, watchdog, echo_fd)
