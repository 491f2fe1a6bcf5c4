"""Progress beacons: how a worker shows the supervisor that it moves, without a syscall a step.

Under ``cycle run`` every worker that imports cycler maps a small file of its own,
``$CYCLER_PROGRESS_DIR/rank-<RANK>.beacon``, and writes into that memory at every
``StepControl.step()`` and every commit: its pid, a counter, the (system-wide monotonic) time of
its last progress, what it is doing (training, saving, or a phase the script marked, such as an
evaluation) and the longest stretch of training it has timed between two marks. The supervisor
reads its node's beacons a few times a second to find a rank that hangs
(:mod:`cycler.supervisor.watch.hangs`). Writing one costs a clock read and a ``pack_into``.

Each beacon also carries the worker's start-up marks (:data:`MARKS`), each written once, and the
seconds it spent in phases named ``"compile"``: ``cycle status`` splits what a restart cost with
them. Its clock's offset to the wall clock lets another host's supervisor read the times.

The worker times its own steps: steps often come faster than the supervisor reads, and a job
that hangs soon after a start may be read only once between its first step and the hang.

A worker also registers :data:`DUMP_SIGNAL` with ``faulthandler`` at import, writing every
thread's Python stack into ``rank-<RANK>.stack`` beside its beacon: what the supervisor asks for
before it kills a hung worker. No torch here: the supervisor reads these on its own path.
"""

from __future__ import annotations

import contextlib
import faulthandler
import mmap
import os
import signal
import struct
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from cycler._fs import pid_alive
from cycler.protocol.clocks import process_age
from cycler.protocol.environment import ENV_PROGRESS_DIR
from cycler.protocol.node_local import refused_node_dir

TRAINING, SAVING, PAUSED = 0, 1, 2
"""What a worker is doing, as its beacon says."""
PHASE_NAMES = {TRAINING: "training", SAVING: "saving", PAUSED: "paused"}
AFTER_THE_LOOP = "after the loop"
"""The name of the phase a worker is in for good once ``StepControl.close()`` ended a loop that
ran to its end (no stop decided): its training is done."""
AFTER_A_STOP = "after a stop"
"""The same phase once ``StepControl.close()`` ended a loop that a stop decision ended."""
MARKS = ("spawned", "imported", "ready", "loaded")
"""A worker's start-up, in order: its process started; its imports were done (cycler's, with
torch: the first of cycler's names a script used that needed torch was imported); the
process group was ready (:func:`~cycler.torch_distributed_readiness` returned or the
``StepControl`` was built); the resumed state was loaded (``StepControl.load_state_dict``)."""
COMPILE = "compile"
"""The name of a marked phase (``control.paused("compile")``) whose time is counted apart."""
_FORMAT = struct.Struct("<qqqdi20sdd4dddqq")
"""pid, counter, step, monotonic time of the last progress, phase, the marked phase's name, the
longest training stretch timed (seconds; 0: none yet), the wall clock minus the monotonic one,
the :data:`MARKS` (monotonic; 0: not yet), the seconds spent in :data:`COMPILE` phases, the
monotonic time and step of the first progress (0, -1: none yet), the step the worker resumed
at (-1: none)."""
DUMP_SIGNAL = signal.SIGRTMIN + 4
"""Asks a worker for its Python stacks (not SIGUSR1, which NCCL may use; not a stop signal)."""
BEACON_SUFFIX = ".beacon"
STACK_SUFFIX = ".stack"


class Beacon:
    """This worker's beacon: a mapped file it updates in place."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._pid = os.getpid()
        self._counter = 0
        self._step = -1
        self._phase = TRAINING
        self._name = b""
        self._longest = 0.0
        self._training_since: float | None = None
        """When the stretch of training now timed began (the last progress or the end of a
        phase); ``None`` before the first progress (loading is not a step) and inside a phase."""
        now = time.monotonic()
        self._offset = time.time() - now
        age = process_age()
        # Imported: now if torch came first (``import torch`` before cycler), else once cycler's
        # API brought it in (``cycler.__getattr__``).
        self._marks = [now - age if age is not None else 0.0,
                       now if "torch" in sys.modules else 0.0, 0.0, 0.0]
        self._compiling = 0.0
        self._first: tuple[float, int] = (0.0, -1)
        self._resumed = -1
        with open(path, "w+b") as handle:
            # Blocks reserved now: a sparse file on a full disk would SIGBUS at the first store
            # into the mapping; this is an OSError (no space) that says so instead.
            os.posix_fallocate(handle.fileno(), 0, _FORMAT.size)
            self._memory = mmap.mmap(handle.fileno(), _FORMAT.size)
        self._write(now)

    def note(self, mark: str, step: int | None = None) -> None:
        """Record start-up mark ``mark`` (one of :data:`MARKS`) now, unless it was already;
        ``step``: the step the state loaded resumes at (with ``"loaded"``)."""
        index = MARKS.index(mark)
        if step is not None:
            self._resumed = step
        if not self._marks[index]:
            self._marks[index] = time.monotonic()
            self._write(self._marks[index])

    def progress(self, step: int | None = None) -> None:
        """Progress: a step done (``step``: its number), or a commit. The supervisor sees the
        counter move."""
        now = time.monotonic()
        self._counter += 1
        if step is not None:
            self._step = step
        if self._phase == TRAINING:
            since = self._training_since
            if since is None:  # the first progress (or the first after the loop's end)
                self._first = self._first if self._first[0] else (now, self._step)
            elif now - since > self._longest:
                self._longest = now - since  # inline: this runs at every step
            self._training_since = now
        self._write(now)

    @contextlib.contextmanager
    def phase(self, phase: int, name: str = "") -> Iterator[None]:
        """Mark a phase that has its own allowance (a save, an evaluation) while inside."""
        before, before_name = self._phase, self._name
        self.mark(phase, name)
        entered = time.monotonic()
        try:
            yield
        finally:
            now = time.monotonic()
            if name == COMPILE:
                self._compiling += now - entered
            self._phase, self._name = before, before_name
            if before == TRAINING and self._counter > 0:
                self._training_since = now
            self._write(now)

    def mark(self, phase: int, name: str = "") -> None:
        """Enter ``phase``; called alone, for good (the end of the training loop: whatever
        comes after it, a final evaluation or the teardown, has the pause allowance). The
        stretch of training it ends is timed."""
        now = time.monotonic()
        self._time_training(now)
        self._training_since = None
        self._phase, self._name = phase, name.encode()[:20]
        self._write(now)

    def loop_begins(self) -> None:
        """A training loop begins (a ``StepControl`` is built): a worker that had ended an
        earlier loop trains again, so the supervisor must not take it for finished."""
        if self._phase == PAUSED and self._name in (AFTER_THE_LOOP.encode(),
                                                    AFTER_A_STOP.encode()):
            self.mark(TRAINING)

    def _time_training(self, now: float) -> None:
        if self._training_since is not None:
            self._longest = max(self._longest, now - self._training_since)

    def _write(self, now: float) -> None:
        _FORMAT.pack_into(self._memory, 0, self._pid, self._counter, self._step, now,
                          self._phase, self._name, self._longest, self._offset, *self._marks,
                          self._compiling, *self._first, self._resumed)


class _NoBeacon(Beacon):
    """Outside ``cycle run``: every call does nothing."""

    def __init__(self) -> None:
        pass

    def progress(self, step: int | None = None) -> None:
        pass  # the per-step call of a script outside cycle run: not even a clock read

    @contextlib.contextmanager
    def phase(self, phase: int, name: str = "") -> Iterator[None]:
        yield

    def mark(self, phase: int, name: str = "") -> None:
        pass

    def note(self, mark: str, step: int | None = None) -> None:
        pass

    def loop_begins(self) -> None:
        pass


_beacon: Beacon | None = None


def beacon() -> Beacon:
    """This process's beacon (one per process), or one that does nothing outside ``cycle run``
    or where the file cannot be made."""
    global _beacon
    if _beacon is None:
        directory, rank = os.environ.get(ENV_PROGRESS_DIR), os.environ.get("RANK")
        try:
            path = Path(directory or "") / f"rank-{int(rank or '')}{BEACON_SUFFIX}"
            owned = (directory and not refused_node_dir()
                     and not _owned_by_another_live_process(path))
            _beacon = Beacon(path) if owned else _NoBeacon()
        except (OSError, ValueError):
            _beacon = _NoBeacon()
    return _beacon


def _owned_by_another_live_process(path: Path) -> bool:
    """Whether ``path`` is the beacon of another live process: the worker's own, seen from a
    process it spawned (a DataLoader worker under ``spawn`` imports cycler again with the
    worker's environment) that must not take it over."""
    try:
        with open(path, "rb") as handle:
            pid = _FORMAT.unpack(handle.read(_FORMAT.size))[0]
    except (OSError, struct.error):
        return False
    return pid != os.getpid() and pid_alive(pid)


_stack_file: IO[str] | None = None


def register_stack_dump() -> None:
    """Under ``cycle run``: on :data:`DUMP_SIGNAL` write every thread's stack to this rank's
    stack file (faulthandler: it works while the main thread is stuck in C code)."""
    global _stack_file
    directory, rank = os.environ.get(ENV_PROGRESS_DIR), os.environ.get("RANK")
    if _stack_file is not None or not directory or rank is None:
        return
    if isinstance(beacon(), _NoBeacon):
        return  # not the worker itself (a process it spawned): its stacks are not asked for
    try:
        _stack_file = open(Path(directory) / f"rank-{int(rank)}{STACK_SUFFIX}", "w")
        faulthandler.register(DUMP_SIGNAL, file=_stack_file, all_threads=True, chain=False)
    except (OSError, ValueError, RuntimeError):
        _stack_file = None


@dataclass(frozen=True)
class Reading:
    """One worker's beacon as the supervisor read it."""

    rank: int
    pid: int
    counter: int
    step: int
    """The last step ``StepControl`` counted (-1: the script does not use it)."""
    time: float
    phase: int
    name: str
    longest: float = 0.0
    """The longest stretch of training between two marks the worker timed (0: none yet)."""
    offset: float = 0.0
    """The worker's wall clock minus its monotonic one: ``time + offset`` is a wall time."""
    marks: tuple[float | None, ...] = ()
    """The :data:`MARKS` as wall times, in order (``None``: not reached)."""
    compiling: float = 0.0
    """Seconds spent in phases named :data:`COMPILE`."""
    first: tuple[float, int] | None = None
    """The wall time and step of the worker's first progress (``None``: none yet)."""
    resumed: int = -1
    """The step the state the worker loaded resumes at (-1: none loaded)."""

    @property
    def wall(self) -> float:
        """The wall time of the last progress."""
        return self.time + self.offset


def read_beacons(directory: Path) -> list[Reading]:
    """Every beacon in ``directory`` (a torn or foreign file is skipped; none while the
    directory is missing, or removed and made again by a new start as it is read)."""
    readings = []
    try:
        paths = sorted(directory.glob(f"rank-*{BEACON_SUFFIX}"))
    except OSError:  # FileNotFoundError from the scan of a directory removed since its check
        return []
    for path in paths:
        try:
            rank = int(path.name[len("rank-"):-len(BEACON_SUFFIX)])
            with open(path, "rb") as handle:
                data = handle.read(_FORMAT.size)
            (pid, counter, step, when, phase, name, longest, offset, *marks, compiling,
             first_at, first_step, resumed) = _FORMAT.unpack(data)
        except (OSError, ValueError, struct.error):
            continue
        readings.append(Reading(rank, pid, counter, step, when, phase,
                                name.rstrip(b"\0").decode(errors="replace"), longest, offset,
                                tuple(m + offset if m else None for m in marks), compiling,
                                (first_at + offset, first_step) if first_at else None, resumed))
    return readings


def stack_path(directory: Path, rank: int) -> Path:
    return directory / f"rank-{rank}{STACK_SUFFIX}"


def start_up(readings: list[Reading]) -> dict[str, object]:
    """What the first step's event carries (for ``cycle status``'s restart breakdown): when
    the last rank made its first step (``at``: every collective waits for it) and that step,
    the step the workers resumed at, each of :data:`MARKS` as the wall time of the last rank
    to reach it and the most seconds a rank spent compiling."""
    marks = {}
    for index, name in enumerate(MARKS):
        times = [r.marks[index] for r in readings if len(r.marks) > index]
        if times and None not in times:
            marks[name] = round(max(t for t in times if t is not None), 3)
    firsts = [r.first for r in readings if r.first is not None]
    fields: dict[str, object] = {
        "marks": marks, "resumed": max((r.resumed for r in readings), default=-1),
        "compile": round(max((r.compiling for r in readings), default=0.0), 3)}
    if firsts and len(firsts) == len(readings):
        at, step = max(firsts)
        fields.update(at=round(at, 3), step=step)
    return fields


def last_progress(readings: list[Reading]) -> dict[str, object] | None:
    """The newest progress of workers now gone (their beacons stay until the next start): the
    wall time and step (``None``: none made progress). After a kill of the whole job, it says
    how far the workers got, and when they stopped."""
    moved = [r for r in readings if r.counter > 0]
    if not moved:
        return None
    return {"at": round(max(r.wall for r in moved), 3), "step": max(r.step for r in moved)}
