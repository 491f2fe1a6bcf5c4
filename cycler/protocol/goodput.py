"""What preemption cost a job: its events log read as a timeline (``cycle status``).

The supervisor logs every start, its workers' first step, checkpoints, stop requests, hangs,
worker exits and its own exit. Over the job's whole life (every run, requeues included):

- ``wall``: the time ``cycle run`` ran, summed over runs (time in the scheduler's queue is
  not seen);
- ``starting``: from each run's start to its workers' first step (imports, rendezvous, loading);
- ``restarts``: from the workers' failure (or a hang's kill) to the restarted workers' first step;
- ``stops``: from the stop request to the exit;
- ``hangs``: from the last progress before a hang to its detection;
- ``redone``: the training lost by failures: from the last checkpoint (or first step) before
  each failure or hang to it, trained again after the restart;
- ``training``: the rest; ``useful`` = training - redone; ``goodput`` = useful / wall.

Runs whose first step was not logged (before cycler recorded it) count their start as training.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass
class Goodput:
    """Seconds per cause over the job's life; see the module's docstring."""

    wall: float = 0.0
    starting: float = 0.0
    restarts: float = 0.0
    stops: float = 0.0
    hangs: float = 0.0
    redone: float = 0.0
    runs: int = 0
    running: bool = False
    """Whether the last run has not exited yet (its figures run to the last event)."""

    @property
    def training(self) -> float:
        return max(self.wall - self.starting - self.restarts - self.stops - self.hangs, 0.0)

    @property
    def useful(self) -> float:
        return max(self.training - self.redone, 0.0)

    @property
    def goodput(self) -> float | None:
        return self.useful / self.wall if self.wall > 0 else None

    def as_dict(self) -> dict[str, Any]:
        return {**{k: round(v, 3) if isinstance(v, float) else v
                   for k, v in asdict(self).items()},
                "training": round(self.training, 3), "useful": round(self.useful, 3),
                "goodput": None if self.goodput is None else round(self.goodput, 4)}


@dataclass
class _Run:
    started: float
    waiting_since: float | None
    """When the workers were (re)started and have not made their first step yet."""
    waiting_restart: bool = False
    progress_since: float | None = None
    """The last checkpoint or first step: what a failure now would lose since."""
    stop_at: float | None = None
    lost_at: float | None = None
    """A hang's time, until the workers' exit after it."""
    last: float = 0.0
    """The time of the run's latest event."""


def goodput(events: list[dict[str, Any]]) -> Goodput:
    """The figures of one node's events (oldest first)."""
    figures, run = Goodput(), None
    for event in events:
        name, when = event.get("event"), float(event.get("time", 0.0))
        if name == "start":
            if run is not None:  # a run that never logged its exit (killed): ends here
                _end(figures, run, run.last)
            run = _Run(started=when, waiting_since=when, last=when)
            figures.runs += 1
        if run is None:
            continue
        run.last = when
        _take(figures, run, name, when, event)
        if name == "exit":
            _end(figures, run, when)
            run = None
    if run is not None:
        figures.running = True
        _end(figures, run, run.last)
    return figures


def _take(figures: Goodput, run: _Run, name: Any, when: float, event: dict[str, Any]) -> None:
    if name == "first_step" and run.waiting_since is not None:
        at = float(event.get("at", when))
        cost = max(at - run.waiting_since, 0.0)
        if run.waiting_restart:
            figures.restarts += cost
        else:
            figures.starting += cost
        run.waiting_since, run.waiting_restart, run.progress_since = None, False, at
    elif name == "checkpoint_committed":
        run.progress_since = when
    elif name == "stop_requested" or (name == "signal" and event.get("effect")
                                     == "checkpoint_and_exit" and run.stop_at is None):
        run.stop_at = when if run.stop_at is None else run.stop_at
    elif name == "hang":
        silent = float(event.get("silent_for", 0.0))
        stalled_at = when - silent
        figures.hangs += silent
        _lose(figures, run, stalled_at)
        run.lost_at = when
    elif name == "workers_exited" and event.get("code") not in (0, None) \
            and run.stop_at is None:
        if run.lost_at is None:  # a crash (a hang was counted when found)
            _lose(figures, run, when)
        run.lost_at = None
        run.waiting_since, run.waiting_restart = when, True


def _lose(figures: Goodput, run: _Run, at: float) -> None:
    if run.progress_since is not None and run.waiting_since is None:
        figures.redone += max(at - run.progress_since, 0.0)
    run.progress_since = None


def _end(figures: Goodput, run: _Run, when: float) -> None:
    figures.wall += max(when - run.started, 0.0)
    if run.stop_at is not None:
        figures.stops += max(when - run.stop_at, 0.0)
    elif run.waiting_since is not None:  # ended before its first step (no first_step logged)
        if run.waiting_restart:
            figures.restarts += max(when - run.waiting_since, 0.0)
