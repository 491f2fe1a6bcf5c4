"""What interruptions cost a job: its events log read as runs and interruptions (``cycle status``).

A run lasts from the first moment of its ``cycle run`` process (``process_started`` in its
``start`` event) to its last event (``ended``, logged as the supervisor returns); a run killed
with SIGKILL lasts to its workers' newest progress, which the next run finds in their beacons
and logs (``last_progress``). The wait in the scheduler's queue between a run that Slurm
requeued and the next is counted too; any other gap between runs is not seen and not counted.

Every interruption (a stop asked for, a failure of the workers, a hang, a kill of the whole
job) costs its **downtime**: from the moment it began (the signal; the workers' newest progress
before a failure; the last progress before a hang; the kill) to the first step after the
restart, split into parts that follow each other without gap or overlap (:data:`PARTS`), plus
the **work redone**: the steps from the checkpoint it resumed from to the newest step before
it, at the rate the workers trained at. The first start costs ``starting`` alike.

- ``wall``: the runs' time and the known queue waits;
- ``training``: ``wall`` less every part but ``redone``; ``useful`` = training - redone;
- ``goodput`` = useful / wall.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

PARTS = ("hang", "detection", "decision", "stop", "kill", "backoff", "exit", "queue",
         "cycle_start", "spawn", "imports", "process_group", "load", "compile", "first_step",
         "redone")
"""What an interruption's downtime is spent on, in the order it happens:

``hang`` no progress until the hang was found; ``detection`` a failed worker's newest progress
until torchrun exited; ``decision`` the signal or failure until the supervisor decided (a
stop's request, a restart's schedule); ``stop`` the workers' checkpoint and exit; ``kill`` a
hung worker's kill; ``backoff`` the delay before a restart; ``exit`` cycle's own exit; ``queue``
the scheduler's requeue wait; ``cycle_start`` the next ``cycle run`` until it started torchrun;
``spawn`` torchrun until the workers' processes started; ``imports`` until every worker imported
cycler (and torch); ``process_group`` until every worker's process group was ready; ``load``
until the resumed state was loaded; ``compile`` the time in phases named ``compile``;
``first_step`` until the first step was done; ``redone`` the work trained again."""
_MARK_PARTS = (("spawned", "spawn"), ("imported", "imports"), ("ready", "process_group"),
               ("loaded", "load"))
"""The workers' start-up marks, each with the part it ends."""
_KINDS = ("stop", "failure", "hang", "kill")


@dataclass
class Interruption:
    """One interruption's parts (seconds, :data:`PARTS`); ``kind``: stop, failure, hang, kill
    (or ``start``: the job's first start)."""

    kind: str
    at: float
    parts: dict[str, float] = field(default_factory=dict)
    complete: bool = False
    """Whether the first step after it was seen."""
    cursor: float = 0.0
    next_part: str = ""
    last: dict[str, Any] | None = None
    """The newest progress before it, as the restart's ``last_progress`` event said."""

    def advance(self, when: float, next_part: str) -> None:
        """Count the time up to ``when`` as the current part; the next part starts there."""
        if when > self.cursor:
            self.parts[self.next_part] = self.parts.get(self.next_part, 0.0) + when - self.cursor
            self.cursor = when
        self.next_part = next_part

    @property
    def lost(self) -> float:
        return sum(self.parts.values())

    @property
    def biggest(self) -> tuple[str, float] | None:
        return max(self.parts.items(), key=lambda item: item[1], default=None)

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "at": round(self.at, 3), "lost": round(self.lost, 3),
                "complete": self.complete,
                "parts": {name: round(self.parts[name], 3) for name in PARTS
                          if name in self.parts}}


@dataclass
class Goodput:
    """Seconds per cause over the job's life; see the module's docstring."""

    wall: float = 0.0
    starting: float = 0.0
    """The job's first start, to its first step."""
    queue: float = 0.0
    redone: float = 0.0
    runs: int = 0
    running: bool = False
    """Whether the last run has not exited yet (its figures run to the last event)."""
    interruptions: list[Interruption] = field(default_factory=list)

    def lost_in(self, kind: str) -> float:
        """Downtime of the interruptions of ``kind``, the work redone left out."""
        return sum((i.lost - i.parts.get("redone", 0.0) for i in self.interruptions
                    if i.kind == kind), 0.0)

    @property
    def stops(self) -> float:
        return self.lost_in("stop")

    @property
    def restarts(self) -> float:
        """The failures' downtime."""
        return self.lost_in("failure")

    @property
    def hangs(self) -> float:
        return self.lost_in("hang")

    @property
    def kills(self) -> float:
        return self.lost_in("kill")

    @property
    def training(self) -> float:
        return max(self.wall - self.starting - sum(self.lost_in(k) for k in _KINDS), 0.0)

    @property
    def useful(self) -> float:
        return max(self.training - self.redone, 0.0)

    @property
    def goodput(self) -> float | None:
        return self.useful / self.wall if self.wall > 0 else None

    def count(self, kind: str) -> int:
        return sum(1 for i in self.interruptions if i.kind == kind)

    def parts(self) -> dict[str, float]:
        """Every part's total over the interruptions."""
        totals = {name: sum((i.parts.get(name, 0.0) for i in self.interruptions), 0.0)
                  for name in PARTS}
        return {name: seconds for name, seconds in totals.items() if seconds > 0}

    def as_dict(self) -> dict[str, Any]:
        figures = {"wall": self.wall, "starting": self.starting, "queue": self.queue,
                   "redone": self.redone, "stops": self.stops, "restarts": self.restarts,
                   "hangs": self.hangs, "kills": self.kills, "training": self.training,
                   "useful": self.useful}
        return {**{name: round(value, 3) for name, value in figures.items()},
                "runs": self.runs, "running": self.running,
                "goodput": None if self.goodput is None else round(self.goodput, 4),
                "preemptions": self.count("stop"), "failures": self.count("failure"),
                "hang_count": self.count("hang"), "kill_count": self.count("kill"),
                "parts": {name: round(value, 3) for name, value in self.parts().items()},
                "interruptions": [i.as_dict() for i in self.interruptions]}


@dataclass
class _Run:
    events: list[dict[str, Any]]
    begin: float
    end: float
    ended: bool
    requeued: bool


def goodput(events: list[dict[str, Any]]) -> Goodput:
    """The figures of one node's events (oldest first)."""
    figures, walk = Goodput(), _Walk()
    runs = _runs(events)
    for index, run in enumerate(runs):
        figures.runs += 1
        figures.wall += max(run.end - run.begin, 0.0)
        walk.enter(figures, runs[index - 1] if index else None, run)
        for event in run.events[1:]:
            walk.take(figures, event, _time(event))
        walk.leave(run)
    figures.running = bool(runs) and not runs[-1].ended
    walk.close(figures)
    return figures


def _time(event: dict[str, Any]) -> float:
    return float(event.get("time", 0.0))


def _number(value: Any, default: float) -> float:
    """A field's number (an event a broken disk or another tool wrote must not crash status)."""
    if isinstance(value, int | float) and not isinstance(value, bool) and value == value:
        return float(value)
    return default


PROCESS_START_LIMIT = 600.0
"""The most seconds a ``start`` event may come after its process's start (``cycle run``
checks and takes its lock before it, which fail at once); beyond, the field is not believed."""


def _runs(events: list[dict[str, Any]]) -> list[_Run]:
    """The events cut at each ``start``; a killed run's end moved to its workers' newest
    progress, which the next run logged before starting its own workers."""
    runs: list[_Run] = []
    for event in events:
        if event.get("event") == "start":
            begin = _time(event)
            started = _number(event.get("process_started"), begin)
            if 0.0 <= begin - started <= PROCESS_START_LIMIT:
                begin = started
            runs.append(_Run([event], begin, begin, False, False))
        elif runs:
            run = runs[-1]
            run.events.append(event)
            run.end = max(run.end, _time(event))
            run.ended = run.ended or event.get("event") in ("ended", "exit")
            run.requeued = run.requeued or (event.get("event") == "requeue"
                                            and event.get("accepted", True) is not False)
    for run, following in zip(runs, runs[1:], strict=False):
        last = _last_progress_before_start(following)
        if not run.ended and last is not None:
            run.end = max(run.end, min(_number(last["at"], run.end), following.begin))
    return runs


def _last_progress_before_start(run: _Run) -> dict[str, Any] | None:
    for event in run.events:
        if event.get("event") == "workers_started":
            return None
        if event.get("event") == "last_progress" and _number(event.get("at"), -1.0) >= 0:
            return event
    return None


@dataclass
class _Walk:
    """The interruption that waits for its first step, and what the redone work needs."""

    pending: Interruption | None = None
    first: tuple[float, int] | None = None
    """This start's first step: (wall time, step)."""
    progress_since: float | None = None
    """The newest checkpoint or first step: a fallback for the redone work."""

    def enter(self, figures: Goodput, previous: _Run | None, run: _Run) -> None:
        pending = self.pending
        if previous is None:
            pending = Interruption("start", run.begin)
        elif pending is None:
            failed = not previous.ended or _exit_code(previous) not in (0, None)
            pending = Interruption("kill" if not previous.ended else
                                   "failure" if failed else "start", previous.end)
            pending.cursor, pending.next_part = previous.end, "queue"
            self._open(figures, pending)
        if previous is not None and previous.requeued:
            queued = max(run.begin - pending.cursor, 0.0)
            figures.wall += queued
            figures.queue += queued
            pending.advance(run.begin, "cycle_start")
        pending.cursor, pending.next_part = max(pending.cursor, run.begin), "cycle_start"
        self.pending = pending

    def leave(self, run: _Run) -> None:
        if self.pending is not None:
            self.pending.advance(run.end, "queue")

    def close(self, figures: Goodput) -> None:
        if self.pending is not None and self.pending.kind == "start":
            figures.starting += self.pending.lost

    def take(self, figures: Goodput, event: dict[str, Any], when: float) -> None:
        name, pending = event.get("event"), self.pending
        if name == "stop_after_training" and pending is not None and pending.kind == "stop":
            figures.interruptions.remove(pending)  # it found the training done: no downtime
            self.pending = None
        elif name == "checkpoint_committed":
            self.progress_since = when
        elif name == "first_step" and pending is not None:
            self._first_step(figures, pending, event, when)
        elif name == "last_progress" and pending is not None:
            self._last_progress(pending, event)
        elif name in ("restart_scheduled", "restart_together") and pending is not None:
            pending.advance(when, "backoff")
        elif name == "workers_started" and pending is not None:
            pending.advance(when, "spawn")
        elif _stop_begins(name, event) and (pending is None or pending.kind != "stop"):
            self._begin(figures, Interruption("stop", when, cursor=when, next_part="decision"))
        elif name == "stop_requested" and pending is not None and pending.kind == "stop":
            pending.advance(when, "stop")
        elif name == "hang" and (pending is None or pending.complete):
            silent = max(_number(event.get("silent_for"), 0.0), 0.0)
            self._begin(figures, Interruption("hang", when - silent, cursor=when - silent,
                                              next_part="hang"))
            self.pending.advance(when, "kill")  # type: ignore[union-attr]
        elif name == "workers_exited":
            self._workers_exited(figures, event, when)

    def _workers_exited(self, figures: Goodput, event: dict[str, Any], when: float) -> None:
        pending = self.pending
        if pending is not None and pending.kind in ("stop", "hang") and not pending.complete:
            pending.advance(when, "exit" if pending.kind == "stop" else "decision")
        elif event.get("code") not in (0, None) and pending is None:
            self._begin(figures, Interruption("failure", when, cursor=when,
                                              next_part="decision"))

    def _begin(self, figures: Goodput, interruption: Interruption) -> None:
        pending = self.pending
        if pending is not None and pending.kind == "start":
            pending.advance(interruption.at, pending.next_part)
            figures.starting += pending.lost  # a first start cut short: what it cost so far
        elif pending is not None and not pending.complete:
            return  # one interruption at a time: a failure during a stop is part of the stop
        self.pending = interruption
        self._open(figures, interruption)

    def _open(self, figures: Goodput, interruption: Interruption) -> None:
        if interruption.kind != "start":
            figures.interruptions.append(interruption)

    def _last_progress(self, pending: Interruption, event: dict[str, Any]) -> None:
        pending.last = event
        at = _number(event.get("at"), float("nan"))
        if pending.kind == "failure" and at < pending.at:  # (NaN: not logged)
            # The failure happened after the workers' newest progress: from there to torchrun's
            # exit it was being found, not training.
            if self.progress_since is None or at >= self.progress_since:
                pending.parts["detection"] = pending.at - at
                pending.at = at

    def _first_step(self, figures: Goodput, pending: Interruption, event: dict[str, Any],
                    when: float) -> None:
        at = _number(event.get("at"), when)
        found = event.get("marks")
        marks: dict[str, Any] = found if isinstance(found, dict) else {}
        if pending.next_part == "spawn":  # the workers were started: their marks split it
            for mark, part in _MARK_PARTS:
                value = marks.get(mark)
                value = _number(value, float("nan"))
                if pending.cursor <= value <= at:
                    pending.next_part = part
                    pending.advance(value, part)
            pending.next_part = "first_step"
        pending.advance(at, "first_step")
        compiling = min(max(_number(event.get("compile"), 0.0), 0.0),
                        pending.parts.get("first_step", 0.0))
        if compiling > 0:
            pending.parts["first_step"] -= compiling
            pending.parts["compile"] = compiling
        step, resumed = event.get("step"), event.get("resumed")
        if not isinstance(resumed, int) or resumed < 0:  # not logged: the step before the first
            resumed = step - 1 if isinstance(step, int) and step > 0 else None
        redone = self._redone(pending, resumed)
        if redone > 0:
            pending.parts["redone"] = redone
            figures.redone += redone
        pending.complete = True
        if pending.kind == "start":
            figures.starting += pending.lost
        self.pending = None
        self.first = (at, step) if isinstance(step, int) else None
        self.progress_since = at

    def _redone(self, pending: Interruption, resumed: int | None) -> float:
        """The work redone after ``pending``: the steps between the resumed checkpoint and the
        newest step before it, at this start's rate; where steps are unknown (a script without
        StepControl), the time since the newest checkpoint before a failure or a hang."""
        last, first = pending.last, self.first
        if last is not None and first is not None and resumed is not None:
            newest, newest_at = last.get("step"), _number(last.get("at"), float("nan"))
            if isinstance(newest, int) and newest > first[1] and newest_at == newest_at:
                rate = (newest_at - first[0]) / (newest - first[1])
                return max(newest - resumed, 0) * max(rate, 0.0)
        if pending.kind in ("failure", "hang") and self.progress_since is not None:
            return max(pending.at - self.progress_since, 0.0)
        return 0.0


def _stop_begins(name: Any, event: dict[str, Any]) -> bool:
    return name in ("stop_requested", "stopped_by_another_node") or (
        name == "signal" and event.get("effect") == "checkpoint_and_exit")


def _exit_code(run: _Run) -> Any:
    return next((e.get("code") for e in reversed(run.events) if e.get("event") == "exit"), None)
