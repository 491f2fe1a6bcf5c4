"""What the supervisor's core hears and says: stop paths, events and actions (no logic).

The shell turns signals, process exits, commits and time into the events below, feeds them to
:class:`cycler.supervisor.decisions.core.SupervisorCore`, and carries out the actions it returns.
"""

from __future__ import annotations

import enum
import signal
from dataclasses import dataclass, field
from typing import Any

from cycler.protocol.control import ControlRequest
from cycler.protocol.features import USES_CONTROL, USES_CYCLER, USES_OWN_HANDLER, USES_SAVER
from cycler.supervisor.decisions.failure_kinds import WorkerFailure


class StopPath(str, enum.Enum):
    """How a stop reaches the workers, chosen from what they announced."""

    AGREED_STEP = "agreed_step"
    """They read the control file: all ranks checkpoint at one step and exit."""
    NEXT_COMMIT = "next_commit"
    """They commit through cycler's savers only: ended after their next commit."""
    SIGNAL = "signal"
    """Neither, or they have their own SIGTERM handler: the signal is forwarded to them at
    once, as torchrun does."""
    UNDECIDED = "undecided"
    """They imported cycler but have built neither yet: wait a few seconds for them to."""


def stop_path(features: frozenset[str]) -> StopPath:
    """The stop path for workers that announced ``features``
    (:data:`cycler.protocol.control.FEATURES`)."""
    if USES_CONTROL in features:
        return StopPath.AGREED_STEP
    if USES_OWN_HANDLER in features:
        return StopPath.SIGNAL
    if USES_SAVER in features:
        return StopPath.NEXT_COMMIT
    if USES_CYCLER in features:
        return StopPath.UNDECIDED
    return StopPath.SIGNAL


# --- events -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class SignalReceived:
    """A signal reached the supervisor (``name`` like ``"SIGTERM"``) at ``now``, when the
    workers had announced ``features``."""

    name: str
    now: float
    features: frozenset[str] = frozenset({USES_CONTROL})
    workers_started: bool = True
    """Whether torchrun had started its workers (``False``: it still waits in the
    rendezvous, where nothing can be saved and nothing would be lost)."""


@dataclass(frozen=True)
class Announced:
    """The workers' announced features changed to ``features`` (sent while a stop waits)."""

    features: frozenset[str]
    now: float


@dataclass(frozen=True)
class HardDeadline:
    """The scheduler will end the job by ``at`` (wall-clock): the stop must be over first.
    ``why`` states the arithmetic for the log."""

    at: float
    why: str
    now: float


@dataclass(frozen=True)
class PeerLost:
    """Another node of the job is gone at ``now``: its supervisor went silent or exited with a
    failure (``failed``). ``why`` says which, for the log and the exit reason."""

    node: int
    why: str
    now: float
    failed: bool = False


@dataclass(frozen=True)
class HangDetected:
    """No worker of this node made progress for longer than allowed (``now``): ``summary``
    names the ranks that stopped, their last step and top frame, ``fields`` the same for the
    events log. The workers' stacks are dumped already."""

    summary: str
    now: float
    fields: dict[str, Any] = field(default_factory=dict)
    repeated: str = ""
    """``the same hang at step N twice`` when it is not the first hang at that step."""


@dataclass(frozen=True)
class ReplayDiverged:
    """A restart's replayed steps differ from the earlier run's (``summary``, said already in
    the events log) and ``cycle run --on-divergence stop`` makes that the end of the job."""

    summary: str
    now: float


@dataclass(frozen=True)
class WorkersExited:
    """torchrun (and with it every worker) exited with ``code`` (negative: killed by signal)."""

    code: int
    now: float
    stopped_elsewhere: bool = False
    """Another node's supervisor asked for ``checkpoint_and_exit`` during this run: the workers
    stopped together with that node's, which is a stop, not the end of training."""
    before_first_step: bool | None = None
    """Whether the workers failed before their first step (a start that failed: imports,
    ``init_process_group``, loading), not in training; ``None``: unknown (no beacons)."""
    failure: WorkerFailure | None = None
    """How the failing worker failed, as its output says (``None``: it says nothing, as when
    a worker was killed by SIGTERM)."""
    training_ended: bool = False
    """Every worker had ended its training loop without a stop (``StepControl.close()`` after
    its last step): a stop requested since found the training done."""
    deadline_elsewhere: float | None = None
    """With ``stopped_elsewhere``: the earliest deadline the other nodes' stop requests set
    (wall-clock), which bounds this node's copy of its share of the stop's checkpoint."""


@dataclass(frozen=True)
class CheckpointCommitted:
    """A new checkpoint with ``index`` became the newest valid one (seen at ``now``)."""

    index: int
    now: float = 0.0


@dataclass(frozen=True)
class LandingReport:
    """What the landing code found once the workers were gone (answer to :class:`LandNewest`):
    ``failure`` is ``None`` when the newest state is in the checkpoint root (it was there, or
    it was copied there in time); otherwise it says why not, and ``newest`` where the newest
    state is (this node's memory)."""

    failure: str | None
    newest: str | None
    now: float


@dataclass(frozen=True)
class Tick:
    """Time passed; the shell sends one at least at every :attr:`SupervisorCore.wake_at`."""

    now: float


Event = (SignalReceived | Announced | HardDeadline | PeerLost | HangDetected | WorkersExited
         | CheckpointCommitted | ReplayDiverged | LandingReport | Tick)

# --- actions ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class WriteControl:
    """Replace the control file with ``request``."""

    request: ControlRequest


@dataclass(frozen=True)
class StartWorkers:
    """Start torchrun. ``start_number`` counts earlier starts in this supervisor (0 first)."""

    start_number: int
    resume_from: str | None


@dataclass(frozen=True)
class SignalTree:
    """Send ``signal`` to torchrun and every process below it."""

    signal: signal.Signals


@dataclass(frozen=True)
class SignalWorkers:
    """Send ``signal`` to each worker's process group (the worker and its DataLoader
    workers), not to torchrun: what torchrun itself does with a signal it forwards."""

    signal: signal.Signals
    through_shield: bool = False
    """The stop checkpoint is committed: the stray-signal shield lets this one through."""


@dataclass(frozen=True)
class Requeue:
    """Ask the scheduler to requeue this job (``scontrol requeue``)."""


STOP_ELSEWHERE = "another node's stop"
"""The name a stop that another node's supervisor asked for takes among the stop signals, on the
nodes it is relayed to (events log, exit reasons): their workers are asked as by a signal."""

NO_CHECKPOINT_TO_RESUME = ("stopped on request, but no checkpoint exists to resume from, so the "
                           "job is not requeued")
"""The end of a stop that finds nothing to resume (exit 1): what the foreign search adds to."""


@dataclass(frozen=True)
class Exit:
    """End the supervisor with ``code``; ``reason`` says why in one sentence."""

    code: int
    reason: str
    workers_failed: bool = False
    """Whether the job ends because workers failed (the shell then reports their error)."""


@dataclass(frozen=True)
class LandNewest:
    """The run is over and the newest state may be only in this node's memory (the memory
    tier): once the workers are gone, make sure the newest checkpoint is in the checkpoint
    root and answer with :class:`LandingReport`. The exit and any requeue wait for it."""

    planned: int
    """The exit code the run ends with if the newest state is in the checkpoint root (the
    memory tier is kept for a rerun on this node when it is 75)."""
    stopped: bool
    """Whether the run ended as a stop: its checkpoint is copied only until ``deadline``."""
    deadline: float | None
    """When the stop must be over (wall-clock; ``None``: no stop, or none known)."""


@dataclass(frozen=True)
class Log:
    """Append ``event`` with ``fields`` to the events log (and tell the user)."""

    event: str
    fields: dict[str, Any] = field(default_factory=dict)
    warning: bool = False


SupervisorAction = (WriteControl | StartWorkers | SignalTree | SignalWorkers | Requeue | Exit
                    | LandNewest | Log)
