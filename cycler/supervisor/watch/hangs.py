"""Finding a hung rank from outside it: the workers' progress beacons, read by the supervisor.

A rank stuck in a collective, a data loader or a deadlock never returns to Python, so nothing
inside it can notice; the other ranks soon wait for it in their next collective. The supervisor
reads every worker's beacon (:mod:`cycler.protocol.progress`) a few times a second and declares
a hang when no worker of its node has made progress for longer than the allowance:

- training: ``max(floor, factor x the longest interval between two steps seen)``, as the
  workers timed them (a save or a marked phase left out); the longest interval is kept under
  ``.cycler/`` so that a restart does not start blind;
- the first step after a start (loading, compilation): ``first_step``, as long as no worker has
  made its first step (and never less than the training allowance);
- while any worker saves or is in a phase the script marked (``StepControl.paused``): ``pause``.

Only workers that step are watched from the start: those that made a step or built a
``StepControl`` (which announces a step cadence). A script that only commits (cycling_utils'
idiom) may save once an epoch: it is judged by the longest interval between its own commits once
one is learned (this job, any start), and not at all before; never by ``first_step`` alone.

The same hang at the same step twice is a slow phase more than a fault (a recompile, a slow
shard): each further hang there doubles the allowance at that step.

:class:`HangWatch` is pure (readings and the time in, a verdict out); :func:`dump_stacks` asks
each worker for its Python stacks and gathers them under ``.cycler/hang-<time>/``.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sysconfig
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from cycler._fs import atomic_write_bytes, pid_alive, read_json_object
from cycler.protocol.features import USES_CONTROL, announced
from cycler.protocol.node_local import NodeFiles
from cycler.protocol.progress import (
    AFTER_A_STOP,
    AFTER_THE_LOOP,
    DUMP_SIGNAL,
    PAUSED,
    PHASE_NAMES,
    SAVING,
    Reading,
    last_progress,
    read_beacons,
    stack_path,
    start_up,
)
from cycler.protocol.record import RunRecord
from cycler.supervisor.decisions.vocabulary import HangDetected
from cycler.supervisor.launch.processes import descendants
from cycler.supervisor.nodes.root_io import RootIO

log = logging.getLogger("cycler.supervisor")

CHECK_SECONDS = 0.5
"""How often the workers' progress beacons are read."""


@dataclass(frozen=True, kw_only=True)
class HangPolicy:
    """How long no progress may last before it is a hang (seconds)."""

    floor: float = 30.0
    """The least a training step may take: a hang is never declared sooner."""
    factor: float = 5.0
    """Multiple of the longest interval between two steps seen that still counts as slow."""
    first_step: float = 600.0
    """Allowed before every worker's first step after a start (loading, compilation)."""
    pause: float = 1800.0
    """Allowed while a worker saves or is in a phase the script marked (an evaluation)."""


@dataclass(frozen=True)
class Hang:
    """The verdict: ``stalled`` ranks (those behind the others, or all) with what they did."""

    silent_for: float
    allowance: float
    why: str
    stalled: list[Reading] = field(default_factory=list)
    step: int | None = None
    """The step the job had reached (``None``: the workers count no steps)."""
    times: int = 1
    """How many hangs at ``step`` this one makes (this supervisor's starts)."""


class HangWatch:
    """Takes in the step intervals the workers timed and says when progress stopped too long."""

    def __init__(self, policy: HangPolicy, longest: float | None = None) -> None:
        self.policy = policy
        self.longest = longest
        """The longest interval between two training steps (or, for a script that only
        commits, two commits) seen: this job, all starts."""
        self._started = 0.0
        self._hangs_at: dict[int, int] = {}
        """Step -> hangs found there (this supervisor)."""

    def restarted(self, now: float) -> None:
        """Workers were (re)started at ``now`` (system-wide monotonic)."""
        self._started = now

    def observe(self, readings: list[Reading], now: float, cadence: bool = False) -> Hang | None:
        """Take in the beacons read at ``now``; a :class:`Hang` if progress stopped too long.
        ``cadence``: the workers announced that they step (a ``StepControl`` exists)."""
        if not readings:
            return None  # workers that never imported cycler: nothing to go by
        # Each worker times its own steps (a save or a marked phase left out): steps come
        # faster than the beacons are read, and a pair of readings may never fall in training.
        timed = max(reading.longest for reading in readings)
        if timed > 0:
            self.longest = max(timed, self.longest or 0.0)
        stepping = cadence or any(r.step >= 0 for r in readings)
        if not stepping and self.longest is None:
            return None  # commits only, no interval learned yet: nothing to judge it by
        last = max([self._started, *(r.time for r in readings if r.counter > 0)])
        step = max(r.step for r in readings) if stepping else -1
        allowance, why = self._allowance(readings, step)
        if now - last <= allowance:
            return None
        # The rank that hangs and those waiting for it in a collective look alike here: the
        # ones behind are named first, all when none is; their stacks tell them apart.
        top = max((r.counter for r in readings), default=0)
        stalled = [r for r in readings if r.counter < top] or list(readings)
        if step < 0:
            return Hang(now - last, allowance, why, stalled)
        self._hangs_at[step] = times = self._hangs_at.get(step, 0) + 1
        return Hang(now - last, allowance, why, stalled, step, times)

    def widened(self, step: int) -> float:
        """How many times the allowance at ``step`` is widened: doubled by each hang there
        after the first."""
        return 2.0 ** max(self._hangs_at.get(step, 0) - 1, 0)

    def step_timeout(self) -> float:
        if self.longest is None:
            return self.policy.first_step
        return max(self.policy.floor, self.policy.factor * self.longest)

    def _allowance(self, readings: list[Reading], at: int) -> tuple[float, str]:
        step = self.step_timeout() * self.widened(at)
        busy = [r for r in readings if r.phase in (SAVING, PAUSED)]
        if busy:
            what = busy[0].name or PHASE_NAMES[busy[0].phase]
            return max(self.policy.pause, step), f"{what} allowance"
        if not readings or any(r.counter == 0 for r in readings):
            return max(self.policy.first_step, step), "first-step allowance"
        return step, "step timeout"


SAVE_LONGEST_SECONDS = 300.0
"""While workers train, how often a changed longest step interval is saved at most (a restart's
head start, saved at once when the workers are gone)."""


def load_longest(path: Path) -> float | None:
    """The longest step interval an earlier start of this job learned (``None``: none)."""
    value = read_json_object(path).get("longest_step_interval")
    return float(value) if isinstance(value, int | float) and value > 0 else None


def save_longest(path: Path, longest: float) -> None:
    try:
        atomic_write_bytes(path, json.dumps({"longest_step_interval": longest}).encode(),
                           durable=False)
    except OSError:
        pass  # only a restart's head start is lost


def dump_stacks(readings: list[Reading], progress_dir: Path, into: Path,
                wait: float = 1.0) -> dict[int, str]:
    """Ask every worker for its Python stacks, copy them to ``into/rank-<R>.txt``; return each
    rank's top frame of its main thread (``"?"`` where no dump came). The processes a worker
    started (its DataLoader workers) are dumped by py-spy where it is installed, into
    ``rank-<R>.child-<pid>.txt``; where it is not, the worker's file lists them."""
    into.mkdir(parents=True, exist_ok=True)
    for reading in readings:
        try:
            os.kill(reading.pid, DUMP_SIGNAL)
        except OSError:
            continue
    deadline = time.monotonic() + wait
    tops: dict[int, str] = {}
    while time.monotonic() < deadline and len(tops) < len(readings):
        time.sleep(0.05)
        for reading in readings:
            text = _read(stack_path(progress_dir, reading.rank))
            if text and reading.rank not in tops and "File" in text:
                tops[reading.rank] = top_frame(text)
    for reading in readings:
        source = stack_path(progress_dir, reading.rank)
        try:
            shutil.copyfile(source, into / f"rank-{reading.rank}.txt")
        except OSError:
            pass
    _dump_children(readings, into)
    return {r.rank: tops.get(r.rank, "?") for r in readings}


PY_SPY_SECONDS = 10.0
"""The longest the py-spy dumps of the workers' own processes may take, all together."""


def _dump_children(readings: list[Reading], into: Path) -> None:
    children = {reading.rank: _children(reading.pid) for reading in readings}
    py_spy = shutil.which("py-spy")
    if py_spy is None:
        for rank, processes in children.items():
            if processes:
                listed = "".join(f"#   pid {pid}: {command}\n" for pid, command in processes)
                with open(into / f"rank-{rank}.txt", "a") as handle:
                    handle.write(f"\n# processes rank {rank} started, not dumped (install "
                                 f"py-spy to see their stacks):\n{listed}")
        return
    dumps = []
    for rank, processes in children.items():
        for pid, _ in processes:
            target = open(into / f"rank-{rank}.child-{pid}.txt", "w")
            dumps.append((subprocess.Popen([py_spy, "dump", "--pid", str(pid)], stdout=target,
                                           stderr=subprocess.STDOUT), target))
    deadline = time.monotonic() + PY_SPY_SECONDS
    for process, target in dumps:
        try:
            process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        target.close()


def _children(pid: int) -> list[tuple[int, str]]:
    found = []
    for process in descendants(pid):
        try:
            found.append((process.pid, " ".join(process.cmdline())[:200]))
        except psutil.Error:
            continue
    return found


def top_frame(dump: str) -> str:
    """Where the dumped main thread is (faulthandler's format): its innermost frame as
    ``file:line in function``, followed by ``<- file:line in function`` of the innermost frame
    of the script's own code where that is another (a rank waiting inside torch or a data
    loader is named with the line of the script that waits)."""
    lines = dump.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("Current thread")), 0)
    frames = []
    for line in lines[start + 1:]:
        stripped = line.strip()
        if not stripped.startswith("File "):
            break
        name, _, rest = stripped[len("File "):].partition(", line ")
        number, _, function = rest.partition(" in ")
        frames.append((name.strip(chr(34)), number, function))
    if not frames:
        return "?"
    innermost = _frame(*frames[0])
    script = next((_frame(*frame) for frame in frames if not _library(frame[0])), None)
    return innermost if script in (None, innermost) else f"{innermost} <- {script}"


def _frame(path: str, line: str, function: str) -> str:
    return f"{Path(path).name}:{line} in {function}"


_LIBRARY_ROOTS = tuple(sorted({str(Path(sysconfig.get_paths()[key]))
                               for key in ("stdlib", "platstdlib")}
                              | {str(Path(__file__).resolve().parents[1])}))


def _library(path: str) -> bool:
    """Whether a frame's file is Python's, an installed package's or cycler's own."""
    return ("/site-packages/" in path or "/dist-packages/" in path or path.startswith("<")
            or path.startswith(_LIBRARY_ROOTS))


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def _at(reading: Reading) -> str:
    return f"step {reading.step}" if reading.step >= 0 else f"{reading.counter} commits"


def describe_hang(hang: Hang, tops: dict[int, str]) -> tuple[str, dict[str, Any]]:
    """One line for stderr and the fields for the events log."""
    ranks = ", ".join(f"rank {r.rank} ({_at(r)}, {tops.get(r.rank, '?')})"
                      for r in hang.stalled)
    summary = (f"no progress for {hang.silent_for:.0f} s (over the {hang.why} of "
               f"{hang.allowance:.0f} s): {ranks}")
    if repeated(hang):
        summary += f"; {repeated(hang)}: the allowance there doubles"
    fields = {"silent_for": round(hang.silent_for, 1), "allowance": round(hang.allowance, 1),
              "why": hang.why, "ranks": [r.rank for r in hang.stalled],
              "steps": [r.step for r in hang.stalled],
              "frames": [tops.get(r.rank, "?") for r in hang.stalled],
              "at_step": hang.step, "times": hang.times}
    return summary, fields


def repeated(hang: Hang) -> str:
    """``the same hang at step 17 twice`` (``3 times``...); empty for a first hang."""
    if hang.times < 2:
        return ""
    return (f"the same hang at step {hang.step} "
            f"{'twice' if hang.times == 2 else f'{hang.times} times'}")


class WorkerProgress:
    """This node's workers' beacons as the supervisor reads them: each start's first step (an
    event: what a start cost) and, with a ``policy``, hangs (their stacks dumped first)."""

    def __init__(self, run_record: RunRecord, node_rank: int, node: NodeFiles,
                 policy: HangPolicy | None, record: Callable[..., None],
                 root_io: RootIO | None = None) -> None:
        self._run_record, self._node_rank, self._root_io = run_record, node_rank, root_io
        self._directory, self._control = node.progress_dir, node.control_path
        self._record = record
        self._saved_longest = load_longest(run_record.hang_record_path(node_rank))
        self._saved_at = time.monotonic()
        self._hangs = None if policy is None else HangWatch(policy, self._saved_longest)
        self._next_check = 0.0
        self.first_step_seen = False

    def save_longest(self, now: float | None = None) -> None:
        """Record the longest step interval learned, if it changed: at once without ``now``
        (the workers are gone), else at most every :data:`SAVE_LONGEST_SECONDS` (it is in the
        checkpoint root, where a restart on another host finds it), in ``root_io``'s thread
        where there is one."""
        longest = None if self._hangs is None else self._hangs.longest
        if longest is None or longest == self._saved_longest:
            return
        if now is not None and now - self._saved_at < SAVE_LONGEST_SECONDS:
            return
        self._saved_longest, self._saved_at = longest, now or 0.0
        path = self._run_record.hang_record_path(self._node_rank)
        if now is not None and self._root_io is not None:
            self._root_io.submit("longest", lambda: save_longest(path, longest))
        else:
            save_longest(path, longest)

    def new_start(self) -> None:
        """The workers are (re)started: the last ones' beacons and stacks must not count (how
        far they got is logged first: what a failure or a kill of the job lost)."""
        self.save_longest()
        last = last_progress(read_beacons(self._directory))
        if last is not None:
            self._record("last_progress", **last)
        shutil.rmtree(self._directory, ignore_errors=True)
        try:
            self._directory.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            log.warning("hang detection is off for this start: cannot create %s (%s)",
                        self._directory, error.strerror)
        self.first_step_seen = False
        if self._hangs is not None:
            self._hangs.restarted(time.monotonic())

    def check(self, now: float, wall: float) -> HangDetected | None:
        """Read the live workers' beacons (every :data:`CHECK_SECONDS`); ``now`` is the
        beacons' monotonic clock, ``wall`` the events log's."""
        if now < self._next_check:
            return None
        self._next_check = now + CHECK_SECONDS
        # A finished or killed worker's beacon stays until the next start: only live ones count.
        readings = [r for r in read_beacons(self._directory) if pid_alive(r.pid)]
        moved = [r.time for r in readings if r.counter > 0]
        if moved and not self.first_step_seen:
            self.first_step_seen = True
            self._record("first_step", **{"at": round(wall - (now - min(moved)), 3),
                                          **start_up(readings)})
        return None if self._hangs is None else self._hang(self._hangs, readings, now, wall)

    def _hang(self, watch: HangWatch, readings: list[Reading], now: float,
              wall: float) -> HangDetected | None:
        cadence = bool(readings) and USES_CONTROL in announced(self._control)
        hang = watch.observe(readings, now, cadence)
        self.save_longest(now)
        if hang is None:
            return None
        dump = self._run_record.hang_dump_dir(time.strftime("%Y%m%d-%H%M%S"))
        tops = dump_stacks(hang.stalled or readings, self._directory, dump)
        summary, fields = describe_hang(hang, tops)
        watch.restarted(time.monotonic())
        return HangDetected(f"{summary}; stacks in {dump}", wall, {**fields, "dump": str(dump)},
                            repeated=repeated(hang))

    def training_ended(self) -> bool:
        """Whether every worker ended its training loop without a stop (``StepControl.close()``
        after its loop ran to its end): the training is done, whatever was requested since."""
        readings = read_beacons(self._directory)
        return bool(readings) and all(r.name == AFTER_THE_LOOP for r in readings)

    def left_at_a_stop(self) -> bool:
        """Whether every worker left its training loop at an agreed stop (``StepControl.close()``
        after a stop decision, its saves for it waited for): all this node owes that stop's
        checkpoint is written, whenever the request reached this node's supervisor."""
        readings = read_beacons(self._directory)
        return bool(readings) and all(r.name == AFTER_A_STOP for r in readings)

    def before_first_step(self) -> bool | None:
        """Whether no worker made a step (or commit) in this start; ``None``: the workers
        publish no progress (they never imported cycler), so nobody knows."""
        readings = read_beacons(self._directory)
        if not readings:
            return None
        return all(reading.counter == 0 for reading in readings)
