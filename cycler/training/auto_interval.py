"""A checkpoint interval chosen from measured costs: ``StepControl(every_steps="auto")``.

A checkpoint every ``T`` seconds of training costs the save's stall ``C`` (the time the training
loop is blocked; with asynchronous saves only the blocking part) ``1/T`` times per second, and
each failure loses on average ``T/2`` of work. With ``M`` the mean time between failures, the
sum is smallest at Young's interval ``sqrt(2 C M)``; Daly's higher-order form
(:func:`daly_interval`) stays right where ``C`` is not small against ``M``, and is the one used.

- ``C`` is measured by :class:`StepControl` itself: the step after a checkpoint takes longer than
  the others by the stall. The median of the last :data:`STALL_WINDOW` stalls is used, so one
  slow save does not swing the interval; a run that a previous run's ``checkpoint_interval``
  event told a stall starts from it.
- ``M`` comes from the job's events log (``<root>/.cycler/``) across restarts and requeues:
  ``(W + M0) / (n + 1)`` for ``n`` failures in ``W`` seconds of wall time, with the prior ``M0``
  counted as one failure-free stretch (:func:`prior_mtbf`). Failures are what lose the work
  since the last checkpoint: a crash, a hang, a kill -9 of the job, and a stop that had to redo
  work (its grace ran out). A stop that checkpointed at the agreed step loses nothing whatever the
  interval, so it does not count.
- The interval in seconds is bounded by :class:`AutoInterval`'s limits and turned into steps at
  the measured step time; a new value is taken only when it differs by more than
  :data:`CHANGE_THRESHOLD` from the current one. Rank 0 decides and its choice reaches the other
  ranks in StepControl's exchange, so every rank checkpoints at the same step.
"""

from __future__ import annotations

import math
import os
import statistics
import sys
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeAlias

from cycler.errors import ConfigError
from cycler.protocol.environment import ENV_NODE_DIR, default_checkpoint_root
from cycler.protocol.events import EventLog, describe, read_events
from cycler.protocol.goodput import Goodput, goodput
from cycler.protocol.record import RunRecord, events_path_beside, node_of_control_file

DEFAULT_MTBF = 4 * 3600.0
"""The prior mean time between failures (seconds) before the job has seen any: 4 hours, in the
range large training runs report (Llama 3: 466 interruptions in 54 days, one per 2.8 hours)."""
STALL_WINDOW = 5
"""How many recent save stalls the median is taken over."""
CHANGE_THRESHOLD = 0.2
"""A new interval replaces the current one only when it differs by more than this fraction."""
STEP_TIME_WEIGHT = 0.1
"""Weight of the newest step in the moving average of the step time."""
EVENT = "checkpoint_interval"


def young_interval(cost: float, mtbf: float) -> float:
    """Young's optimal compute time between checkpoints: ``sqrt(2 C M)``."""
    return math.sqrt(2.0 * max(cost, 0.0) * max(mtbf, 0.0))


def daly_interval(cost: float, mtbf: float) -> float:
    """Daly's higher-order optimum (2006): ``sqrt(2CM) (1 + sqrt(C/2M)/3 + (C/2M)/9) - C`` for
    ``C < 2M``, else ``M``. Equal to Young's to first order when ``C`` is small against ``M``."""
    cost, mtbf = max(cost, 0.0), max(mtbf, 0.0)
    if cost >= 2.0 * mtbf:
        return mtbf
    ratio = cost / (2.0 * mtbf)
    return max(young_interval(cost, mtbf) * (1 + math.sqrt(ratio) / 3 + ratio / 9) - cost, 0.0)


def mean_time_between_failures(failures: int, wall: float, prior: float) -> float:
    """``(wall + prior) / (failures + 1)``: the prior when nothing is known yet, the observed
    ``wall / failures`` once the job has run long and failed often."""
    return (max(wall, 0.0) + prior) / (max(failures, 0) + 1)


def prior_mtbf(environ: Mapping[str, str] | None = None) -> float:
    """:data:`DEFAULT_MTBF`, or the scheduler's time limit when it is shorter and known
    (``SLURM_JOB_END_TIME - SLURM_JOB_START_TIME``): a job ended at its limit without a
    notice loses the work since its last checkpoint like any failure."""
    env = os.environ if environ is None else environ
    try:
        limit = float(env["SLURM_JOB_END_TIME"]) - float(env["SLURM_JOB_START_TIME"])
    except (KeyError, ValueError):
        return DEFAULT_MTBF
    return min(DEFAULT_MTBF, limit) if limit > 0 else DEFAULT_MTBF


@dataclass(frozen=True, kw_only=True)
class AutoInterval:
    """``StepControl(every_steps=AutoInterval(...))``: the limits of the chosen interval.
    ``every_steps="auto"`` is ``AutoInterval()``."""

    min_seconds: float = 30.0
    """Never checkpoint more often than this (seconds of wall time), however cheap the save."""
    max_seconds: float = 3600.0
    """Never go longer without a checkpoint: bounds what an error in the estimates costs."""
    min_steps: int = 1
    """Never fewer steps between two checkpoints."""
    max_steps: int | None = None
    """Never more steps between two checkpoints (``None``: no limit in steps)."""
    mtbf_prior: float | None = None
    """Seconds assumed between failures before any is seen (``None``: :func:`prior_mtbf`)."""

    def __post_init__(self) -> None:
        if not 0 <= self.min_seconds <= self.max_seconds:
            raise ConfigError(f"AutoInterval needs 0 <= min_seconds <= max_seconds, got "
                              f"{self.min_seconds!r} and {self.max_seconds!r}")
        if not isinstance(self.min_steps, int) or self.min_steps < 1:
            raise ConfigError(f"AutoInterval.min_steps must be an int >= 1, got "
                              f"{self.min_steps!r}")
        if self.max_steps is not None and (not isinstance(self.max_steps, int)
                                           or self.max_steps < self.min_steps):
            raise ConfigError(f"AutoInterval.max_steps must be an int >= min_steps or None, got "
                              f"{self.max_steps!r}")
        if self.mtbf_prior is not None and not self.mtbf_prior > 0:
            raise ConfigError(f"AutoInterval.mtbf_prior must be seconds > 0 or None, got "
                              f"{self.mtbf_prior!r}")

    def seconds(self, cost: float, mtbf: float) -> float:
        """Daly's interval plus the save itself (the time from one checkpoint to the next),
        within ``[min_seconds, max_seconds]``."""
        return min(max(daly_interval(cost, mtbf) + cost, self.min_seconds), self.max_seconds)

    def steps(self, seconds: float, step_seconds: float) -> int:
        """``seconds`` as a number of steps of ``step_seconds``, within the step limits."""
        steps = round(seconds / step_seconds) if step_seconds > 0 else self.min_steps
        high = self.max_steps if self.max_steps is not None else 2**31 - 1
        return int(min(max(steps, self.min_steps), high))


EverySteps: TypeAlias = "int | str | AutoInterval | None"
"""What ``every_steps=`` takes: a step count, ``"auto"``, an :class:`AutoInterval` or ``None``."""


def as_auto_interval(every_steps: Any) -> AutoInterval | None:
    """``every_steps`` as an :class:`AutoInterval` (``"auto"`` or one), else ``None``."""
    if every_steps == "auto":
        return AutoInterval()
    return every_steps if isinstance(every_steps, AutoInterval) else None


@dataclass(frozen=True)
class FailureHistory:
    """What the job's events say: failures, wall time (seconds), the last logged stall."""

    failures: int = 0
    wall: float = 0.0
    stall: float | None = None

    @classmethod
    def from_events(cls, events: list[dict[str, Any]]) -> FailureHistory:
        stalls = [e.get("stall") for e in events if e.get("event") == EVENT]
        known = [float(s) for s in stalls
                 if isinstance(s, int | float) and not isinstance(s, bool) and 0 <= s < 1e9]
        figures = goodput(events)
        return cls(failures_in(figures), figures.wall, known[-1] if known else None)


def failures_in(figures: Goodput) -> int:
    """The interruptions that lost work: every failure, hang and kill, and the stops that had to
    redo work (a stop checkpointed at the agreed step costs none, whatever the interval)."""
    return sum(1 for i in figures.interruptions
               if i.kind != "stop" or i.parts.get("redone", 0.0) > 0)


def _read_history(events: Path | None) -> FailureHistory:
    """The job's history, or none when its log cannot be read (then the prior alone counts)."""
    try:
        return FailureHistory.from_events(read_events(events)) if events else FailureHistory()
    except (OSError, UnicodeError):
        return FailureHistory()


def events_beside(control_file: Path | None,
                  environ: Mapping[str, str] | None = None) -> Path | None:
    """This node's events log, beside its control file; in the checkpoint root's ``.cycler/``
    where the control file is in the job's runtime directory on the node (``cycle run``'s
    ``$CYCLER_NODE_DIR``). ``None`` without ``cycle run``."""
    if control_file is None:
        return None
    node_rank = node_of_control_file(control_file)
    if node_rank is None:
        return None
    env = os.environ if environ is None else environ
    if env.get(ENV_NODE_DIR) and control_file.parent == Path(env[ENV_NODE_DIR]):
        return RunRecord(default_checkpoint_root(env)).events_path(node_rank)
    return events_path_beside(control_file, node_rank)


class IntervalChooser:
    """Rank 0's estimator: fed the time of every :meth:`StepControl.step` call, it proposes the
    interval in steps (:attr:`proposal`), and says each adopted change once (:meth:`adopt`)."""

    def __init__(self, limits: AutoInterval, events: Path | None, now: float,
                 environ: Mapping[str, str] | None = None) -> None:
        self.limits = limits
        self._events = events
        self._history = _read_history(events)
        self._prior = limits.mtbf_prior or prior_mtbf(environ)
        self._started = now
        self._stalls: deque[float] = deque(maxlen=STALL_WINDOW)
        self._step_seconds: float | None = None
        self._last_tick: float | None = None
        self.proposal: int | None = None
        self.adopted: int | None = None

    @property
    def stall(self) -> float | None:
        """The save stall in use (seconds): the median of the recent ones, or the history's."""
        return statistics.median(self._stalls) if self._stalls else self._history.stall

    def mtbf(self, now: float) -> float:
        history = self._history
        return mean_time_between_failures(history.failures, history.wall + now - self._started,
                                          self._prior)

    def tick(self, now: float, after_checkpoint: bool) -> None:
        """One step ended at ``now``; ``after_checkpoint``: a checkpoint was saved during it."""
        last, self._last_tick = self._last_tick, now
        if last is None:
            return
        took = now - last
        if not self._step_seconds:  # none measured yet, or a clock that stood still
            self._step_seconds = took
            return
        if after_checkpoint:
            self._stalls.append(max(took - self._step_seconds, 0.0))
        else:
            # Clipped at twice the average: one long pause between steps (an evaluation, a
            # collection) must not make the steps look long, which would shorten the interval.
            self._step_seconds += STEP_TIME_WEIGHT * (
                min(took, 2 * self._step_seconds) - self._step_seconds)
            if self.proposal is not None:
                return
        self._propose(now)

    def _propose(self, now: float) -> None:
        assert self._step_seconds is not None
        stall = self.stall
        # Before any save is measured, the first checkpoint comes after min_seconds: it measures
        # the stall early, at the least cost the user allowed.
        seconds = self.limits.min_seconds if stall is None else self.limits.seconds(
            stall, self.mtbf(now))
        steps = self.limits.steps(seconds, self._step_seconds)
        current = self.proposal
        if current is None or abs(steps - current) > CHANGE_THRESHOLD * current:
            self.proposal = steps

    def adopt(self, steps: int, now: float) -> None:
        """Every rank now checkpoints every ``steps``: said once per change (a line on stderr,
        an event in the job's log that ``cycle status`` shows)."""
        if steps == self.adopted:
            return
        self.adopted = steps
        fields = self._fields(steps, now)
        print(f"cycler: {describe(EVENT, fields)}", file=sys.stderr, flush=True)
        if self._events is not None and self._events.is_file():  # made by cycle run's start
            try:
                EventLog(self._events).append(EVENT, **fields)
            except OSError:
                pass  # a record for people: a full or read-only disk must not stop training

    def _fields(self, steps: int, now: float) -> dict[str, Any]:
        stall, step_seconds = self.stall, self._step_seconds or 0.0
        mtbf, wall = self.mtbf(now), self._history.wall + now - self._started
        fields = {"steps": steps, "seconds": round(steps * step_seconds, 3),
                  "step_seconds": round(step_seconds, 6), "failures": self._history.failures,
                  "mtbf_hours": round(mtbf / 3600, 3), "wall_hours": round(wall / 3600, 3)}
        return {**fields, "stall": round(stall, 4)} if stall is not None else {
            **fields, "path": "first"}
