"""The worker's side of the stop protocol: one call per step answers "checkpoint?" and "stop?".

>>> control = StepControl(every_steps=1000)
>>> for batch in loader:
...     train_step(batch)
...     decision = control.step()
...     if decision.checkpoint:
...         save_checkpoint()  # every rank, at the same step
...     if decision.stop:
...         break  # then return normally: the process exits 0

Every rank gets the same decision at the same step, even when only one node's supervisor got the
signal. The answer comes from three sources:

- the control file ``$CYCLER_CONTROL_FILE`` that ``cycle run`` writes: ``checkpoint`` asks for one
  checkpoint, ``checkpoint_and_exit`` for a checkpoint and a stop;
- ``every_steps``: a checkpoint whenever the global step count is a multiple of it (the same on
  every rank without communication); ``"auto"`` (or an :class:`AutoInterval` with limits) lets
  rank 0 choose the interval from the measured save stall and the job's failure rate
  (:mod:`cycler.training.auto_interval`) and tell the other ranks in the exchange;
- ``every_seconds``: a checkpoint when that long has passed since the last one (for platforms that
  stop jobs with no warning). Clocks differ per rank, so any rank's expired timer counts.

Latency: with several ranks, the local answers are combined by a non-blocking ``all_reduce``
started at one exchange step and read at the next, so it overlaps with training. A request
present when step ``s`` is called is seen at the first exchange step at or after ``s`` and decided
at the one after that. With ``sync_every=k`` exchange steps are the multiples of ``k``: the
decision comes at most ``2 * k`` steps after the request. By default (``sync_every=None``) the
period follows the slowest rank's measured step time, about ``DEFAULT_SYNC_SECONDS`` and at least
one step: a decision within about 0.4 s, or two steps when steps are longer. With one rank the
step that sees the request decides. The control file costs one ``os.stat`` at most every
``poll_interval`` seconds.

No decision is taken in a signal handler. Under ``cycle run`` the supervisor writes the control
file and sends no signal until the grace period runs out, so workers keep running until the
agreed checkpoint is saved; a stop signal that reaches a worker directly (clusters that signal
every process of a job) is ignored there and in its DataLoader workers
(:mod:`cycler.protocol.stop_signals`). A script started without ``cycle run`` dies on SIGTERM as
usual.
"""

from __future__ import annotations

import contextlib
import enum
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch.distributed as dist

from cycler._distributed import in_process_group, settle_gloo_threads_at_exit
from cycler._fs import full_disk_said_in_one_line
from cycler.checkpoint.in_flight import stop_decided, wait_for_saves
from cycler.errors import ConfigError, CyclerError, StateMismatch
from cycler.protocol.control import Action, ControlFileWatcher, ControlRequest
from cycler.protocol.environment import ENV_CONTROL_FILE, under_verify, verify_wants_checkpoint
from cycler.protocol.node_local import refused_node_dir
from cycler.protocol.progress import AFTER_A_STOP, AFTER_THE_LOOP, PAUSED, beacon
from cycler.protocol.stop_signals import shield_from_stray_signals
from cycler.training.auto_interval import (
    EverySteps,
    IntervalChooser,
    as_auto_interval,
    events_beside,
)
from cycler.training.exchange import Exchange, record_close, starter, wait_or_name_the_missing
from cycler.training.fingerprints import fingerprint_log

STEP_CONTROL_STATE_VERSION = 1

DEFAULT_SYNC_SECONDS = 0.2
"""Target time between two exchanges with several ranks (``sync_every=None``). An exchange costs
the training thread from tens of microseconds to a millisecond on a busy machine
(``benchmarks/bench_control_call.py``): under 0.5% every 0.2 s, while a decision still comes
within about 0.4 s (or two steps) of a request, far inside any grace period."""

MAX_SYNC_EVERY = 1024
"""Most steps between two exchanges, whatever the step time."""

DEFAULT_EXCHANGE_TIMEOUT = 600.0
"""Seconds a rank waits for the others at an exchange before naming the missing ones: NCCL's
default collective timeout, and a third of gloo's."""

DEFAULT_POLL_INTERVAL = 0.01
"""Seconds between two looks at the control file: well under any grace period, and it keeps the
``stat`` (a few microseconds locally, far more on network filesystems) off most steps."""



class _Default(enum.Enum):
    FROM_ENVIRONMENT = "from $CYCLER_CONTROL_FILE"


FROM_ENVIRONMENT = _Default.FROM_ENVIRONMENT
"""Default ``control_file``: the path in ``$CYCLER_CONTROL_FILE``, or none when it is unset."""


@dataclass(frozen=True, kw_only=True)
class StepDecision:
    """What every rank should do after a step. Identical on all ranks at the same step."""

    checkpoint: bool
    """Save a checkpoint now (all ranks)."""
    stop: bool
    """Leave the training loop after the checkpoint and return normally (exit 0)."""
    reason: str
    """Why, in words (``"stop requested"``, ``"every 100 steps"``...); empty when nothing to do."""
    step: int
    """The global step count, this step included."""


@dataclass(frozen=True)
class _Signals:
    """What one rank knows, or what the ranks agreed: one slot each, combined by MAX."""

    stop: bool = False
    checkpoint: bool = False
    timer: bool = False

    @property
    def any(self) -> bool:
        return self.stop or self.checkpoint or self.timer

    def to_list(self) -> list[int]:
        return [int(self.stop), int(self.checkpoint), int(self.timer)]

    @classmethod
    def from_list(cls, values: list[int]) -> _Signals:
        return cls(stop=bool(values[0]), checkpoint=bool(values[1]), timer=bool(values[2]))


_NOTHING = _Signals()

_MICROSECONDS_LIMIT = 2**31 - 1

def adaptive_sync_every(step_seconds: float) -> int:
    """Steps between exchanges for steps of ``step_seconds``: about ``DEFAULT_SYNC_SECONDS``."""
    if step_seconds <= 0:
        return MAX_SYNC_EVERY
    return max(1, min(MAX_SYNC_EVERY, int(DEFAULT_SYNC_SECONDS / step_seconds)))


def _distributed_group(process_group: Any) -> Any | None:
    """The group to agree over, or ``None`` when this process is alone."""
    if process_group is None:
        if not in_process_group():
            return None
        process_group = dist.group.WORLD
    if dist.get_world_size(process_group) <= 1:
        return None
    settle_gloo_threads_at_exit()
    return process_group


def _resolve_control_file(
    control_file: Path | str | None | _Default, environ: Mapping[str, str] | None
) -> Path | None:
    if control_file is FROM_ENVIRONMENT:
        path = (os.environ if environ is None else environ).get(ENV_CONTROL_FILE)
        # A runtime directory that is not the user's own holds no request of cycle run's.
        return Path(path) if path and not refused_node_dir(environ) else None
    return None if control_file is None else Path(control_file)


class StepControl:
    """Answers, once per training step and identically on every rank, "checkpoint?" and "stop?".

    Call :meth:`step` exactly once per step on every rank of ``process_group`` (default: the
    default group when ``torch.distributed`` is initialized, else no communication at all), and
    :meth:`close` it (or use ``with``) on every rank after the loop. On a pure NCCL group the
    exchange runs on the GPU without blocking the host on queued work; a gloo or mixed group
    (``"cpu:gloo,cuda:nccl"``) keeps it on the CPU.
    """

    def __init__(
        self,
        *,
        every_steps: EverySteps = None,
        every_seconds: float | None = None,
        control_file: Path | str | None | _Default = FROM_ENVIRONMENT,
        process_group: Any = None,
        sync_every: int | None = None,
        poll_interval: float = DEFAULT_POLL_INTERVAL,
        start_step: int = 0,
        clock: Callable[[], float] = time.monotonic,
        ignore_requests_before: float | None = None,
        environ: Mapping[str, str] | None = None,
        exchange_timeout: float = DEFAULT_EXCHANGE_TIMEOUT,
    ) -> None:
        """Set up the sources of decisions.

        ``sync_every`` fixes the steps between exchanges with other ranks; ``None`` adapts them
        to the step time (see the module's docstring for the latency either way).
        ``every_steps`` counts global steps: resuming at ``start_step=1000`` with
        ``every_steps=100`` checkpoints at 1100, 1200...; ``every_steps="auto"`` counts the
        chosen interval from the last checkpoint (:mod:`cycler.training.auto_interval`).
        ``every_seconds`` is measured with
        ``clock`` from this call or the last checkpoint. ``control_file=None`` ignores the control
        file. Requests written (``requested_at``, wall clock) before ``ignore_requests_before``
        are never acted on. By default every request is: ``cycle run`` resets the control file
        to ``run`` before it starts workers, so what the file holds is meant for these workers,
        including a stop that arrived before this process even imported cycler (a time-based
        cut-off would drop exactly that one and let the grace period run out).
        ``environ`` replaces ``os.environ`` for finding the control file.
        ``exchange_timeout`` bounds the wait for the other ranks at an exchange: past it,
        :class:`~cycler.errors.CoordinationTimeout` names the ranks that stopped calling
        :meth:`step` (make it longer than any work one rank does alone between two steps, such
        as an evaluation on rank 0 only).
        """
        _validate(every_steps, every_seconds, sync_every, poll_interval, start_step)
        if not exchange_timeout > 0:
            raise ConfigError(f"exchange_timeout must be a number of seconds > 0, got "
                              f"{exchange_timeout!r}")
        self.every_steps = every_steps
        self.every_seconds = every_seconds
        self.sync_every = sync_every
        self.poll_interval = poll_interval
        self.control_file = _resolve_control_file(control_file, environ)
        self.ignore_requests_before = (
            float("-inf") if ignore_requests_before is None else ignore_requests_before
        )
        self._group = _distributed_group(process_group)
        self._auto = as_auto_interval(every_steps)
        self._for_verify = (every_steps is None or self._auto is not None) and \
            every_seconds is None and under_verify(environ)
        """``cycle verify`` runs this script and it has no fixed schedule of its own (none, or
        ``"auto"``, whose steps follow the clock and so differ between runs): checkpoint at
        verify's steps (:func:`~cycler.protocol.environment.verify_wants_checkpoint`), the same
        in every run."""
        self._interval: int | None = None
        """The auto interval every rank uses now (steps), once rank 0 chose one."""
        self._chooser = None if self._auto is None or (
            self._group is not None and dist.get_rank(self._group) != 0) else IntervalChooser(
            self._auto, events_beside(self.control_file, environ), clock(), environ)
        self._start = None if self._group is None else starter(self._group)
        self.exchange_timeout = exchange_timeout
        self._exchanges = 0
        self._clock = clock
        self._watcher = ControlFileWatcher(self.control_file)
        if self.control_file is not None:  # under cycle run
            shield_from_stray_signals()
            full_disk_said_in_one_line()
        self._step = start_step
        self._steps_taken = 0
        self._last_checkpoint_step = start_step
        self._timer_start = clock()
        self._next_poll = self._timer_start
        self._last_exchange = (start_step, self._timer_start)
        self._next_exchange_step = self._first_exchange_step()
        self._requested = _NOTHING
        self._pending: Exchange | None = None
        self._last_decision = StepDecision(checkpoint=False, stop=False, reason="", step=start_step)
        self.last_request: ControlRequest | None = None
        """The latest live request this rank read itself (other ranks may have seen none)."""
        self._fingerprints = fingerprint_log()
        self._beacon = beacon()
        self._beacon.loop_begins()
        self._beacon.note("ready")  # the process group (if any) is joined: start-up is over

    @property
    def global_step(self) -> int:
        """Steps done so far, counting those before ``start_step`` / the loaded state."""
        return self._step

    @property
    def is_distributed(self) -> bool:
        """Whether decisions are agreed with other ranks (a group of more than one rank)."""
        return self._group is not None

    def step(self, *, loss: Any = None, fingerprint: Any = None) -> StepDecision:
        """Count one finished step and return what every rank should do now.

        Cheap: a clock read and now and then one ``stat``; with several ranks, an ``all_reduce``
        started at each exchange step and read at the next. After a stop, every later call
        answers ``stop`` again, without a checkpoint.

        ``loss`` (a float or a one-element tensor, on any device) or ``fingerprint`` (a number
        the script chooses, such as a checksum; it wins over ``loss``) is this rank's record of
        the step: under ``cycle run`` a restart's replayed steps are compared with it, bit for
        bit (docs/cycle-run.md, "Replayed steps"). A GPU tensor is read later, without a sync.
        """
        self._step += 1
        self._steps_taken += 1
        self._beacon.progress(self._step)
        value = loss if fingerprint is None else fingerprint
        if value is not None:
            self._fingerprints.record(self._step, self._step - self._steps_taken, value)
        if self._chooser is not None:
            self._chooser.tick(self._clock(), self._last_decision.checkpoint)
            if self._group is None:  # alone: no one to tell, the proposal holds at once
                self._adopt(self._chooser.proposal)
        if self._last_decision.stop:
            return self._remember(checkpoint=False, stop=True, reason=self._last_decision.reason)
        if self._group is None:
            decision = self._decide(self._take_local_signals())
        else:
            decision = self._decide_together()
        if decision.stop:
            stop_decided()
        if decision.checkpoint:
            self._fingerprints.write()
        return decision

    def paused(self, name: str = "paused") -> contextlib.AbstractContextManager[None]:
        """``with control.paused("eval"):`` marks work between steps that may take much longer
        than a step (an evaluation): ``cycle run``'s hang detection gives it the pause
        allowance (``--hang-pause-timeout``) instead of the step timeout."""
        return self._beacon.phase(PAUSED, name)

    def should_checkpoint(self) -> bool:
        """Whether the decision of the latest :meth:`step` asks for a checkpoint."""
        return self._last_decision.checkpoint

    def should_stop(self) -> bool:
        """Whether a stop was decided: leave the loop after the checkpoint and exit 0."""
        return self._last_decision.stop

    def close(self) -> None:
        """Wait for the exchange and the asynchronous saves in flight, if any. Call it on every
        rank, or on none. Under ``cycle run`` it tells whether the loop ran to its end: a stop
        requested after that finds the training done (exit 0, no requeue) once the workers
        exit 0."""
        self._beacon.mark(PAUSED, AFTER_A_STOP if self._last_decision.stop else AFTER_THE_LOOP)
        self._fingerprints.flush()
        wait_for_saves()
        if self._pending is not None:
            self._wait(self._pending)
            self._pending = None
        if self._group is not None:
            record_close(self._step, self._group)

    def __enter__(self) -> StepControl:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def state_dict(self) -> dict[str, int]:
        """The global step count, so that ``every_steps`` keeps its cadence after a resume."""
        return {"version": STEP_CONTROL_STATE_VERSION, "global_step": self._step}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`'s step count; call it before the first :meth:`step`."""
        if self._steps_taken:
            raise CyclerError(
                f"load_state_dict was called after {self._steps_taken} step() calls: "
                "load the state before the training loop starts"
            )
        version = state.get("version")
        step = state.get("global_step")
        if version != STEP_CONTROL_STATE_VERSION or not isinstance(step, int) or step < 0:
            raise StateMismatch(
                f"not a version {STEP_CONTROL_STATE_VERSION} StepControl state with a global "
                f"step count >= 0: {dict(state)!r}; pass the dict that state_dict() returned"
            )
        self._step = step
        self._beacon.note("loaded", step)
        self._last_checkpoint_step = step
        self._last_exchange = (step, self._last_exchange[1])
        self._next_exchange_step = self._first_exchange_step()

    def _first_exchange_step(self) -> int:
        if self.sync_every is None:
            return self._step + 1
        return (self._step // self.sync_every + 1) * self.sync_every

    def _decide_together(self) -> StepDecision:
        if self._step < self._next_exchange_step:
            return self._decide(_NOTHING)
        agreed, step_seconds = self._finish_exchange()
        decision = self._decide(agreed)
        if not decision.stop:
            self._start_exchange()
            self._next_exchange_step = self._step + self._steps_to_next_exchange(step_seconds)
        return decision

    def _finish_exchange(self) -> tuple[_Signals, float | None]:
        """The signals the ranks agreed, and the slowest step time they measured."""
        if self._pending is None:
            return _NOTHING, None
        pending, self._pending = self._pending, None
        values = self._wait(pending)
        agreed, step_seconds = _Signals.from_list(values), values[3] / 1e6
        self._adopt(values[4] or None)  # rank 0's proposal; the others sent 0
        # A checkpoint saved after the signals were gathered already answers a checkpoint request
        # or an expired timer: a second one at once would only cost time.
        if self._last_checkpoint_step >= pending.started_at:
            agreed = _Signals(stop=agreed.stop)
        return agreed, step_seconds

    def _start_exchange(self) -> None:
        assert self._start is not None
        now = self._clock()
        last_step, last_time = self._last_exchange
        self._last_exchange = (self._step, now)
        step_micros = round((now - last_time) * 1e6 / max(1, self._step - last_step))
        values = self._take_local_signals().to_list() + [
            min(_MICROSECONDS_LIMIT, max(0, step_micros)),
            min(_MICROSECONDS_LIMIT, self._chooser.proposal or 0) if self._chooser else 0,
        ]
        self._pending = Exchange(self._exchanges, self._step, self._start(values, self._group))
        self._exchanges += 1

    def _wait(self, exchange: Exchange) -> list[int]:
        return wait_or_name_the_missing(exchange, self._step, self.exchange_timeout, self._group)

    def _steps_to_next_exchange(self, agreed_step_seconds: float | None) -> int:
        if self.sync_every is not None:
            return self.sync_every
        if agreed_step_seconds is None:
            return 1  # measure the step time first
        return adaptive_sync_every(agreed_step_seconds)

    def _take_local_signals(self) -> _Signals:
        """This rank's requests and timer; requests are handed out once."""
        now = self._clock()
        if now >= self._next_poll:
            self._next_poll = now + self.poll_interval
            self._read_control_file()
        timer = self.every_seconds is not None and now - self._timer_start >= self.every_seconds
        if not (timer or self._requested.any):
            return _NOTHING
        signals = _Signals(self._requested.stop, self._requested.checkpoint, timer)
        self._requested = _NOTHING
        return signals

    def _read_control_file(self) -> None:
        request = self._watcher.poll()
        if request is None or request.requested_at < self.ignore_requests_before:
            return
        if request.action is Action.CHECKPOINT_AND_EXIT:
            self.last_request = request
            self._requested = _Signals(stop=True, checkpoint=self._requested.checkpoint)
        elif request.action is Action.CHECKPOINT:
            self.last_request = request
            self._requested = _Signals(stop=self._requested.stop, checkpoint=True)

    def _adopt(self, interval: int | None) -> None:
        """Checkpoint every ``interval`` steps from now on (the same step on every rank)."""
        if interval is not None and interval != self._interval:
            self._interval = interval
            if self._chooser is not None:
                self._chooser.adopt(interval, self._clock())

    def _scheduled(self) -> bool:
        if self._for_verify:
            return verify_wants_checkpoint(self._step)
        if self._auto is not None:
            return (self._interval is not None
                    and self._step - self._last_checkpoint_step >= self._interval)
        return isinstance(self.every_steps, int) and self._step % self.every_steps == 0

    def _decide(self, signals: _Signals) -> StepDecision:
        scheduled = self._scheduled()
        if not (scheduled or signals.any):
            return self._remember(checkpoint=False, stop=False, reason="")
        self._last_checkpoint_step = self._step
        self._timer_start = self._clock()
        return self._remember(
            checkpoint=True, stop=signals.stop, reason=self._reason(signals, scheduled)
        )

    def _reason(self, signals: _Signals, scheduled: bool) -> str:
        reasons = []
        if signals.stop:
            reasons.append("stop requested")
        if signals.checkpoint:
            reasons.append("checkpoint requested")
        if scheduled and self._for_verify:
            reasons.append("cycle verify's schedule")
        elif scheduled:
            reasons.append(f"every {self._interval if self._auto else self.every_steps} steps"
                           + (" (auto)" if self._auto else ""))
        if signals.timer:
            reasons.append(f"every {self.every_seconds:g} seconds")
        return ", ".join(reasons)

    def _remember(self, *, checkpoint: bool, stop: bool, reason: str) -> StepDecision:
        self._last_decision = StepDecision(
            checkpoint=checkpoint, stop=stop, reason=reason, step=self._step
        )
        return self._last_decision


def _validate(
    every_steps: EverySteps,
    every_seconds: float | None,
    sync_every: int | None,
    poll_interval: float,
    start_step: int,
) -> None:
    if every_steps is not None and as_auto_interval(every_steps) is None and (
            not isinstance(every_steps, int) or every_steps < 1):
        raise ConfigError(f"every_steps must be an int >= 1, \"auto\", an AutoInterval or "
                          f"None, got {every_steps!r}")
    if every_seconds is not None and not every_seconds > 0:
        raise ConfigError(f"every_seconds must be a number > 0 or None, got {every_seconds!r}")
    if sync_every is not None and (not isinstance(sync_every, int) or sync_every < 1):
        raise ConfigError(
            f"sync_every must be an int >= 1 (steps between exchanges) or None, got {sync_every!r}"
        )
    if not poll_interval >= 0:
        raise ConfigError(f"poll_interval must be a number of seconds >= 0, got {poll_interval!r}")
    if not isinstance(start_step, int) or start_step < 0:
        raise ConfigError(
            f"start_step must be an int >= 0 (steps already done), got {start_step!r}"
        )
