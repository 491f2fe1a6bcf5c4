"""The supervisor's decisions: events in, actions out, no I/O (STYLE.md 6).

:class:`SupervisorCore` is a state machine fed by the shell. It never reads a clock, a file or a
process: every event carries the time it happened, and every effect is an action the shell
executes. That is what lets the unit tests walk every path (stop, grace expiry, crash loop,
requeue cap, double SIGINT) without a process or a sleep.

Phases::

    RUNNING --stop signal--> STOPPING --grace over--> TERMINATING --kill_after--> KILLED
       |                        \\________________________\\_____________________\\
       |                                    workers exited --> DONE (75 or 1)
       +--workers exited 0--> DONE (0)
       +--workers failed--> BACKOFF --delay over--> RUNNING (restart)   or DONE (1)
       +--another node lost--> TERMINATING --workers exited--> DONE (75 or 1)

With several nodes, torchrun's agent restarts failed workers together with every node's
(``restarts_by_torchrun``, under the same :class:`RestartBudget`); a torchrun that gives up ends
the job. A node that goes silent or fails makes the others end their workers at once: no
collective can complete without it, and a rendezvous would wait for it for many minutes.

How a stop is carried out depends on what the workers announced they speak (:class:`StopPath`):
a script that reads the control file stops at the step its ranks agree on; a script that only
commits through cycler's savers is ended right after its first commit that completes after the
request (that TERM passes the stray-signal shield: its DataLoader workers end with it); a script
that uses neither, or has its own SIGTERM handler, gets the signal at once, as torchrun would
forward it, and has the grace to exit. A script that imported cycler but has built neither yet
is given a few seconds (``undecided_wait``) to do so before it is treated as plain.

Exit rule after a stop request: ``0`` when the workers exited 0 before the stop reached them
(their loops had run to their end, or a script that only commits exited before its next
commit): the training is done, and a requeue would train its last steps again. Otherwise
``75`` whenever a valid checkpoint exists, because a requeued job resumes from it, or when a
plain script handled the forwarded signal and exited 0 (its own checkpoint is out of cycle's
sight); a warning is logged when the stop made no new checkpoint. Otherwise the stop ends with
``1``: there is nothing to resume, and requeueing would silently start over.

With the memory tier (``lands_newest``) the newest state may be only in this node's memory when
the run ends: the core then says :class:`LandNewest` instead of its exit (LANDING) and decides
the exit and the requeue from the one :class:`LandingReport` that answers it. Landed, the end is
the one planned. Not landed, a code that says the state is safe in the checkpoint root (0, 75)
becomes ``74`` (:data:`EXIT_NOT_PERSISTED`), and a requeue is withheld: a requeued job starts on
another node, from the older checkpoint in the root, while the newest state is in this node's
memory. A failure's code stays what it was.
"""

from __future__ import annotations

import dataclasses
import enum
import signal
from dataclasses import dataclass

from cycler.protocol.control import Action, ControlRequest
from cycler.protocol.events import describe
from cycler.protocol.exit_codes import (
    EXIT_DIVERGED,
    EXIT_FAILURE,
    EXIT_REQUEUE,
    EXIT_SUCCESS,
    code_when_not_landed,
)
from cycler.protocol.features import USES_OWN_HANDLER
from cycler.supervisor.decisions.budget import RestartBudget
from cycler.supervisor.decisions.vocabulary import (
    NO_CHECKPOINT_TO_RESUME,
    STOP_ELSEWHERE,
    Announced,
    CheckpointCommitted,
    Event,
    Exit,
    HangDetected,
    HardDeadline,
    LandingReport,
    LandNewest,
    Log,
    PeerLost,
    ReplayDiverged,
    Requeue,
    SignalReceived,
    SignalTree,
    SignalWorkers,
    StartWorkers,
    StopPath,
    SupervisorAction,
    Tick,
    WorkersExited,
    WriteControl,
    stop_path,
)

__all__ = [  # the vocabulary too: callers and tests speak it through this module
    "Announced", "CheckpointCommitted", "CoreConfig", "Event", "Exit", "HangDetected",
    "HardDeadline", "LandNewest", "LandingReport", "Log", "STOP_ELSEWHERE",
    "PeerLost", "Phase", "ReplayDiverged", "Requeue",
    "SignalReceived", "SignalTree", "SignalWorkers", "StartWorkers", "StopPath",
    "SupervisorAction", "SupervisorCore", "Tick", "WorkersExited", "WriteControl", "stop_path",
]


class Phase(str, enum.Enum):
    RUNNING = "running"
    STOPPING = "stopping"
    TERMINATING = "terminating"
    KILLED = "killed"
    BACKOFF = "backoff"
    AWAITING_PEERS = "awaiting_peers"
    """torchrun failed on a node of a multi-node job: is another node gone (a lost store is how
    node 0's death looks from here)? Wait for the peers' verdict before calling it a failure."""
    LANDING = "landing"
    """The run is over; the exit and any requeue wait for the :class:`LandingReport` on where
    the newest state is (the memory tier)."""
    DONE = "done"


@dataclass(frozen=True, kw_only=True)
class CoreConfig:
    """What the core needs to decide; the shell builds it from the run options."""

    grace: float
    """Seconds workers get to checkpoint and exit after a stop request."""
    stop_signals: frozenset[str] = frozenset({"SIGTERM", "SIGINT", "SIGHUP", "SIGUSR2",
                                              STOP_ELSEWHERE})
    """Signal names that ask for ``checkpoint_and_exit`` (:data:`STOP_ELSEWHERE`: another
    node's request, relayed)."""
    max_restarts: int = 3
    """Restarts allowed after worker failures without a new checkpoint in between (0: none);
    a committed checkpoint gives the whole budget back."""
    crash_loop_limit: int | None = None
    """Consecutive failures without a new checkpoint in between that end the job whatever
    ``max_restarts`` allows (``None``: only ``max_restarts`` counts)."""
    restart_delay: float = 1.0
    """Delay before the first restart; it doubles with each failure without progress."""
    max_restart_delay: float = 60.0
    """The longest delay between a failure and its restart."""
    kill_after: float = 2.0
    """Seconds between SIGTERM to the tree and SIGKILL when stopping by force."""
    undecided_wait: float = 5.0
    """Seconds a stop waits for workers that imported cycler to say what they use."""
    requeue: bool = False
    """Whether a stop that leaves a checkpoint asks the scheduler to requeue the job."""
    requeue_count: int = 0
    """How often this job was requeued already (``SLURM_RESTART_COUNT``)."""
    max_requeues: int = 100
    """Requeues allowed in the job's life; beyond it the job just exits 75."""
    initial_checkpoint: int | None = None
    """Index of the newest valid checkpoint when the supervisor started."""
    resume_from: str | None = None
    """Checkpoint the first start resumes from instead of the latest (``None`` when this job
    already rolled back to it in an earlier run)."""
    first_sequence: int = 0
    """Sequence number of the first control request (above any already in the file)."""
    restarts_by_torchrun: bool = False
    """Whether torchrun's agent restarts failed workers (with every node's, multi-node jobs):
    a failed torchrun then ends the job instead of being restarted here."""
    peer_verdict_wait: float = 0.0
    """Seconds a failed torchrun of a multi-node job waits for the verdict on the other nodes
    (``--node-timeout``): a node that is gone makes it a stop (75 with a checkpoint), not a
    failure."""
    lands_newest: bool = False
    """Whether the newest state may be only in this node's memory at the end (the memory
    tier): the exit and any requeue then wait for a :class:`LandingReport`."""


class SupervisorCore:
    """Decides what the supervisor does next; one instance per ``cycle run``."""

    def __init__(self, config: CoreConfig) -> None:
        self.config = config
        self.phase = Phase.RUNNING
        self.wake_at: float | None = None
        """When the shell must send a :class:`Tick` at the latest (``None``: no deadline)."""
        self.latest_checkpoint = config.initial_checkpoint
        self._sequence = config.first_sequence
        self._starts = 0
        self._failures = 0
        self._start_failures = 0
        self._repeated_hang: str | None = None
        self._budget = RestartBudget(max_restarts=config.max_restarts,
                                     crash_loop_limit=config.crash_loop_limit)
        self._peer_lost: PeerLost | None = None
        self._diverged: ReplayDiverged | None = None
        self._checkpoint_at_stop: int | None = None
        self._stop_signals: list[str] = []
        self._stop_path: StopPath | None = None
        self._stop_deadline = 0.0
        self._planned: Exit | None = None
        """The end decided before the landing (LANDING), said once it is known to be safe."""
        self._requeue_held = False
        self._stop_began = 0.0
        self.stopped = False
        """Whether the run ended as a stop (exit 75, or 1 with nothing to resume)."""

    # -- entry points -----------------------------------------------------------------------

    def start(self, now: float) -> list[SupervisorAction]:
        """Reset the control file to ``run`` and start the workers for the first time."""
        reset = self._request(Action.RUN, "start", now, deadline=None)
        return [WriteControl(reset), *self._start_workers()]

    def lost_before_start(self, event: PeerLost) -> list[SupervisorAction]:
        """Another node of this run had ended (a failure, or a requeue) before this one started
        its workers: end at once, without starting them."""
        self._peer_lost = event
        return [Log("peer_lost", {"node": event.node, "why": event.why}, warning=True),
                *self._finish_peer_lost()]

    def handle(self, event: Event) -> list[SupervisorAction]:
        """The actions that follow ``event``; nothing once the core has decided to exit."""
        if self.phase is Phase.DONE:
            return []
        if self.phase is Phase.LANDING:
            return self._on_landing(event) if isinstance(event, LandingReport) else []
        if isinstance(event, SignalReceived):
            return self._on_signal(event)
        if isinstance(event, Announced):
            return self._on_announced(event)
        if isinstance(event, HardDeadline):
            return self._on_hard_deadline(event)
        if isinstance(event, PeerLost):
            return self._on_peer_lost(event)
        if isinstance(event, HangDetected):
            return self._on_hang(event)
        if isinstance(event, ReplayDiverged):
            return self._on_divergence(event)
        if isinstance(event, WorkersExited):
            return self._on_exit(event)
        if isinstance(event, CheckpointCommitted):
            return self._on_checkpoint(event)
        if isinstance(event, LandingReport):
            return []  # nothing was asked to land
        return self._on_tick(event)

    @property
    def stop_requested(self) -> bool:
        return bool(self._stop_signals)

    @property
    def awaiting_announcement(self) -> bool:
        """Whether a stop waits for the workers to say what they use (send :class:`Announced`)."""
        return self.phase is Phase.STOPPING and self._stop_path is StopPath.UNDECIDED

    @property
    def listening(self) -> bool:
        """Whether what the workers announce may still change the stop's path (send
        :class:`Announced`): they had not said what they use, or a script that only commits
        turned out to have its own handler for the stop signal."""
        return self.phase is Phase.STOPPING and self._stop_path in (StopPath.UNDECIDED,
                                                                      StopPath.NEXT_COMMIT)

    @property
    def stop_deadline(self) -> float | None:
        """When the stop must be over: the grace from its first signal here, or the
        scheduler's earlier hard deadline, or the one another node's request set (``None``:
        no stop, or one of another node with no deadline)."""
        stopped = self.stop_requested or self.stopped
        return (self._stop_deadline or None) if stopped else None

    @property
    def stop_checkpoint_made(self) -> bool:
        """Whether a checkpoint was committed since the stop was requested."""
        return (self.phase in (Phase.STOPPING, Phase.TERMINATING)
                and self.latest_checkpoint is not None
                and self.latest_checkpoint != self._checkpoint_at_stop)

    # -- signals ----------------------------------------------------------------------------

    def _on_signal(self, event: SignalReceived) -> list[SupervisorAction]:
        if event.name not in self.config.stop_signals:
            # SIGCONT comes with every Slurm TERM and with resumes: it must never stop a job.
            return [Log("signal", {"signal": event.name, "effect": "ignored"})]
        repeated = self.stop_requested
        self._stop_signals.append(event.name)
        if not repeated:  # every stop has a deadline, with workers to stop or none
            self._stop_began, self._stop_deadline = event.now, event.now + self.config.grace
        if self.phase in (Phase.BACKOFF, Phase.AWAITING_PEERS):
            return [Log("signal", {"signal": event.name, "effect": "stop while no workers run"}),
                    *self._finish_stop()]
        if event.name == "SIGINT" and self._stop_signals.count("SIGINT") >= 2:
            return self._force_stop(event)
        if repeated:
            # Slurm sends CONT+TERM again after a requeue: one request per stop, not per signal.
            return [Log("signal", {"signal": event.name, "effect": "already stopping"})]
        return self._request_stop(event)

    def _request_stop(self, event: SignalReceived) -> list[SupervisorAction]:
        if not event.workers_started:
            # torchrun still waits in the rendezvous: no worker can save, none has trained
            # since the newest checkpoint. End at once instead of waiting out the grace.
            self.phase, self.wake_at = Phase.KILLED, None
            self._checkpoint_at_stop = self.latest_checkpoint
            return [Log("signal", {"signal": event.name, "effect": "stop before any worker "
                                   "started"}), SignalTree(signal.SIGKILL)]
        deadline = event.now + self.config.grace
        request = self._request(Action.CHECKPOINT_AND_EXIT, event.name, event.now, deadline)
        self.phase = Phase.STOPPING
        self._stop_deadline = self.wake_at = deadline
        self._checkpoint_at_stop = self.latest_checkpoint
        return [Log("signal", {"signal": event.name, "effect": "checkpoint_and_exit"}),
                WriteControl(request), *self._take_path(event.features, event.now)]

    def _take_path(self, features: frozenset[str], now: float) -> list[SupervisorAction]:
        self._stop_path = path = stop_path(features)
        own = path is StopPath.SIGNAL and USES_OWN_HANDLER in features
        fields = {"path": path.value, "grace": self.config.grace,
                  "resume_from": self.latest_checkpoint, "own_handler": own}
        actions: list[SupervisorAction] = [Log("stop_requested", fields)]
        if path is StopPath.SIGNAL:
            # A cloud's preemption notice is no signal: a script that handles none gets TERM,
            # and so does one whose own handler is for TERM, whatever signal came.
            first = self._stop_signals[0]
            term = own or not first.startswith("SIG")
            actions.append(SignalWorkers(signal.SIGTERM if term else signal.Signals[first]))
        if path is StopPath.UNDECIDED:
            self.wake_at = min(self._stop_deadline, now + self.config.undecided_wait)
        return actions

    def _on_hard_deadline(self, event: HardDeadline) -> list[SupervisorAction]:
        if self.phase is not Phase.STOPPING or event.at >= self._stop_deadline:
            return []
        self._stop_deadline = event.at
        self.wake_at = event.at if self.wake_at is None else min(self.wake_at, event.at)
        fields = {"seconds_left": round(event.at - event.now, 1), "why": event.why,
                  "grace": self.config.grace}
        return [Log("deadline", fields, warning=event.at - event.now < self.config.grace)]

    def _on_announced(self, event: Announced) -> list[SupervisorAction]:
        path = stop_path(event.features)
        if not self.listening or path in (StopPath.UNDECIDED, self._stop_path):
            return []
        self.wake_at = self._stop_deadline
        return self._take_path(event.features, event.now)

    def _force_stop(self, event: SignalReceived) -> list[SupervisorAction]:
        self._stop_deadline = min(self._stop_deadline, event.now)  # nothing more is copied
        if self.phase is Phase.TERMINATING or self.phase is Phase.KILLED:
            self.phase, self.wake_at = Phase.KILLED, None
            return [Log("signal", {"signal": event.name, "effect": "kill now"}),
                    SignalTree(signal.SIGKILL)]
        self.phase, self.wake_at = Phase.TERMINATING, event.now + self.config.kill_after
        return [Log("signal", {"signal": event.name, "effect": "stop now"}),
                SignalTree(signal.SIGTERM)]

    def _on_peer_lost(self, event: PeerLost) -> list[SupervisorAction]:
        """Another node is gone: no collective can complete, so nothing can be saved any more.
        End the workers now instead of leaving them in a rendezvous or a collective."""
        if self._peer_lost is not None or self.phase in (Phase.TERMINATING, Phase.KILLED):
            return []
        self._peer_lost = event
        log = Log("peer_lost", {"node": event.node, "why": event.why}, warning=True)
        if self.phase in (Phase.BACKOFF, Phase.AWAITING_PEERS):
            return [log, *self._finish_peer_lost()]
        # SIGKILL at once: no collective can complete, so nothing can be saved any more, and a
        # TERM only met the workers' stray-signal shield and a 2 s wait.
        self.phase, self.wake_at = Phase.KILLED, None
        return [log, SignalTree(signal.SIGKILL)]

    def _finish_peer_lost(self) -> list[SupervisorAction]:
        lost = self._peer_lost
        assert lost is not None
        reason = f"node {lost.node} {lost.why}"
        if lost.failed or self.latest_checkpoint is None:
            return self._exit(EXIT_FAILURE, f"{reason}; the job cannot go on without it")
        return [*self._requeue(), *self._exit(
            EXIT_REQUEUE, f"{reason}; checkpoint {self.latest_checkpoint} is the one to resume")]

    def _on_hang(self, event: HangDetected) -> list[SupervisorAction]:
        """A worker hangs: kill the workers at once (a hung rank ignores SIGTERM, or holds
        every other rank in a collective); their exit is a failure like a crash, restarted
        from the newest checkpoint under the same budget. During a stop the grace's own
        escalation already bounds the wait."""
        if self.phase is not Phase.RUNNING:
            return []
        if event.repeated:
            self._repeated_hang = event.repeated
        log = Log("hang", {**event.fields, "summary": event.summary}, warning=True)
        if self.config.restarts_by_torchrun:
            # Several nodes: torchrun's agent sees its workers fail and restarts every node's
            # together through the rendezvous, under the job's restart budget.
            return [log, SignalWorkers(signal.SIGKILL)]
        self.phase, self.wake_at = Phase.TERMINATING, None
        return [log, SignalTree(signal.SIGKILL)]

    def _on_divergence(self, event: ReplayDiverged) -> list[SupervisorAction]:
        """``--on-divergence stop``: end the workers at once, without a checkpoint (their state
        is not the one saved: a new checkpoint would make it the one resumed), and exit
        :data:`EXIT_DIVERGED` when they are gone. During a stop the stop goes on as it is."""
        if self.phase is not Phase.RUNNING or self._diverged is not None:
            return []
        self._diverged = event
        self.phase, self.wake_at = Phase.KILLED, None
        return [SignalTree(signal.SIGKILL)]

    # -- time -------------------------------------------------------------------------------

    def _on_tick(self, event: Tick) -> list[SupervisorAction]:
        if self.wake_at is None or event.now < self.wake_at:
            return []
        if self.awaiting_announcement and event.now < self._stop_deadline:
            self.wake_at = self._stop_deadline  # said nothing more: a plain script after all
            return self._take_path(frozenset(), event.now)
        if self.phase is Phase.STOPPING:
            self.phase, self.wake_at = Phase.TERMINATING, event.now + self.config.kill_after
            # The deadline said is the one that ran out: a scheduler's or another node's
            # may have shortened the grace.
            allowed = round(self._stop_deadline - self._stop_began, 1)
            return [Log("grace_expired", {"grace": self.config.grace, "seconds": allowed},
                        warning=True), SignalTree(signal.SIGTERM)]
        if self.phase is Phase.TERMINATING:
            self.phase, self.wake_at = Phase.KILLED, None
            return [Log("kill", {"after": self.config.kill_after}, warning=True),
                    SignalTree(signal.SIGKILL)]
        if self.phase is Phase.BACKOFF:
            self.phase, self.wake_at = Phase.RUNNING, None
            return self._start_workers()
        if self.phase is Phase.AWAITING_PEERS:
            return self._torchrun_gave_up()
        return []

    # -- checkpoints ------------------------------------------------------------------------

    def _on_checkpoint(self, event: CheckpointCommitted) -> list[SupervisorAction]:
        if self.latest_checkpoint is not None and event.index <= self.latest_checkpoint:
            return []
        self.latest_checkpoint = event.index
        self._budget.progress()
        self._repeated_hang = None
        logged = Log("checkpoint_committed", {"index": event.index})
        if self.phase is Phase.STOPPING and self._stop_path is StopPath.NEXT_COMMIT:
            # The script does not read the control file: this commit is the stop's checkpoint.
            self.phase, self.wake_at = Phase.TERMINATING, event.now + self.config.kill_after
            return [logged, Log("stop_after_commit", {"index": event.index}),
                    SignalWorkers(signal.SIGTERM, through_shield=True)]
        return [logged]

    # -- worker exits -----------------------------------------------------------------------

    def _on_exit(self, event: WorkersExited) -> list[SupervisorAction]:
        log = Log("workers_exited", {"code": event.code, "phase": self.phase.value})
        if self._peer_lost is not None:
            return [log, *self._finish_peer_lost()]
        if self._diverged is not None:
            return [log, *self._exit(EXIT_DIVERGED, f"{self._diverged.summary} "
                                     "(--on-divergence stop)")]
        if event.stopped_elsewhere and not self.stop_requested:
            self._checkpoint_at_stop = self.config.initial_checkpoint
            self._stop_deadline = event.deadline_elsewhere or 0.0
            return [log, Log("stopped_by_another_node", {}), *self._finish_stop()]
        if self.stop_requested and self._stop_never_reached(event):
            return [log, Log("stop_after_training", {}),
                    *self._exit(EXIT_SUCCESS, "the training script finished")]
        if self.stop_requested:
            handled = (self._stop_path is StopPath.SIGNAL and self.phase is Phase.STOPPING
                       and event.code == 0)
            return [log, *self._finish_stop(handled)]
        if self.phase is Phase.TERMINATING:  # killed for a hang
            self.phase = Phase.RUNNING
            killed = dataclasses.replace(event, code=event.code or -9, failure=None)
            return [log, *self._on_failure(killed)]
        if event.code == 0:
            return [log, *self._exit(EXIT_SUCCESS, "the training script finished")]
        return [log, *self._on_failure(event)]

    def _stop_never_reached(self, event: WorkersExited) -> bool:
        """Whether the workers exited 0 of their own accord, the stop requested meanwhile
        never reaching them: no signal went to them (the grace is not over), and their loops
        ran to their end (their beacons say so) or, on the next-commit path, they exited
        before the commit that was to end them. The job finished: no 75, no requeue."""
        if event.code != 0 or self.phase is not Phase.STOPPING:
            return False
        return event.training_ended or self._stop_path is StopPath.NEXT_COMMIT

    def _on_failure(self, event: WorkersExited) -> list[SupervisorAction]:
        self._failures += 1
        said: list[SupervisorAction] = []
        if event.before_first_step:
            self._start_failures += 1
            said.append(Log("start_failed", {"code": event.code, "count": self._start_failures},
                            warning=True))
        if self.config.restarts_by_torchrun:
            # torchrun's agent restarted the workers with every node's as long as the budget
            # allowed (cycler.supervisor.launch.launcher applies it): its exit is the end, unless
            # another node is gone (node 0's death fails this torchrun on its lost store
            # before the heartbeats can tell).
            if self.config.peer_verdict_wait <= 0:
                return self._torchrun_gave_up()
            self.phase, self.wake_at = Phase.AWAITING_PEERS, (
                event.now + self.config.peer_verdict_wait)
            return [Log("awaiting_peers", {"seconds": self.config.peer_verdict_wait})]
        given_up = self._budget.failure(event.failure, event.before_first_step)
        if given_up is not None:
            return said + self._exit(EXIT_FAILURE, given_up + self._start_failures_said()
                                     + self._hangs_said(), workers_failed=True)
        delay = self._restart_delay()
        self.phase, self.wake_at = Phase.BACKOFF, event.now + delay
        fields = {"restart": self._budget.failures_without_progress,
                  "of": self.config.max_restarts, "delay": delay, "code": event.code,
                  "restarts_in_job": self._failures, "start_failures": self._start_failures}
        if event.failure is not None and event.failure.resource is not None:
            said.append(Log("resource_failed", {"resource": event.failure.resource},
                            warning=True))
        return [*said, Log("restart_scheduled", fields, warning=True)]

    def _hangs_said(self) -> str:
        if self._repeated_hang is None:
            return ""
        return (f"; {self._repeated_hang}: mark it with control.paused() or raise "
                "--hang-timeout-min")

    def _start_failures_said(self) -> str:
        if not self._start_failures:
            return ""
        which = ("the failure" if self._failures == 1 else f"all {self._failures} failures"
                 if self._start_failures == self._failures
                 else f"{self._start_failures} of the {self._failures} failures")
        return (f"; {which} came before the "
                "first step (the start failed: imports, init_process_group, loading), not in "
                "training")

    def _torchrun_gave_up(self) -> list[SupervisorAction]:
        return self._exit(EXIT_FAILURE, "the workers failed and torchrun stopped restarting "
                          "them with the other nodes' (its reason is above)",
                          workers_failed=True)

    def _restart_delay(self) -> float:
        return self._budget.backoff(self.config.restart_delay, self.config.max_restart_delay)

    def _finish_stop(self, handled_by_script: bool = False) -> list[SupervisorAction]:
        """End a stop. ``handled_by_script``: a plain script got the signal and exited 0."""
        self.stopped = True
        latest = self.latest_checkpoint
        made = latest is not None and latest != self._checkpoint_at_stop
        if latest is None and not handled_by_script:
            return self._exit(EXIT_FAILURE, NO_CHECKPOINT_TO_RESUME)
        actions: list[SupervisorAction] = []
        if handled_by_script and not made:
            actions.append(Log("stop_handled_by_script", {"resume_from": latest}))
        elif not made:
            actions.append(Log("stop_without_new_checkpoint", {"resume_from": latest},
                               warning=True))
        actions.extend(self._requeue())
        reason = (f"stopped on request; checkpoint {latest} is the one to resume"
                  if latest is not None else "stopped on request; the script handled "
                  f"{self._stop_signals[0]} and exited 0")
        return actions + self._exit(EXIT_REQUEUE, reason)

    def _requeue(self) -> list[SupervisorAction]:
        config = self.config
        if not config.requeue:
            return []
        if config.requeue_count >= config.max_requeues:
            fields = {"requeues": config.requeue_count, "max_requeues": config.max_requeues}
            return [Log("requeue_skipped", fields, warning=True)]
        if config.lands_newest:
            self._requeue_held = True  # asked for once the newest state is known to be safe
            return []
        return [Requeue()]

    # -- the landing (memory tier) ----------------------------------------------------------

    def _on_landing(self, report: LandingReport) -> list[SupervisorAction]:
        """The end held for the landing: as planned when the newest state is in the checkpoint
        root; else ``74`` for a 0 or a 75 (a failure keeps its code), and no requeue."""
        planned = self._planned
        assert planned is not None
        self.phase = Phase.DONE
        requeue: list[SupervisorAction] = [Requeue()] if self._requeue_held else []
        if report.failure is None:
            fields = {"code": planned.code, "reason": planned.reason}
            return [*requeue, Log("exit", fields, warning=planned.code == EXIT_FAILURE), planned]
        code = code_when_not_landed(planned.code)
        fields = {"newest": str(report.newest), "error": report.failure, "code": code,
                  "planned": planned.code}
        said: list[SupervisorAction] = [Log("persist_failed", fields, warning=True)]
        line = describe("persist_failed", fields)
        if requeue:
            withheld = {"newest": str(report.newest)}
            said.append(Log("requeue_withheld", withheld, warning=True))
            line += "; " + describe("requeue_withheld", withheld)
        reason = "the newest checkpoint is only in this node's memory"
        return [*said, Log("exit", {"code": code, "reason": reason}, warning=True),
                Exit(code, line, planned.workers_failed)]

    # -- helpers ----------------------------------------------------------------------------

    def _start_workers(self) -> list[SupervisorAction]:
        # --resume-from only applies until this run commits a checkpoint of its own (the shell
        # drops it for a rerun of a job that already rolled back to it).
        resume = self.config.resume_from
        if self.latest_checkpoint != self.config.initial_checkpoint:
            resume = None
        action = StartWorkers(self._starts, resume)
        self._starts += 1
        return [action]

    def _exit(self, code: int, reason: str,
              workers_failed: bool = False) -> list[SupervisorAction]:
        if self.config.lands_newest:
            self.phase, self.wake_at = Phase.LANDING, None
            self._planned = Exit(code, reason, workers_failed)
            return [LandNewest(code, self.stopped, self.stop_deadline)]
        self.phase, self.wake_at = Phase.DONE, None
        return [Log("exit", {"code": code, "reason": reason}, warning=code == EXIT_FAILURE),
                Exit(code, reason, workers_failed)]

    def _request(self, action: Action, reason: str, now: float,
                 deadline: float | None) -> ControlRequest:
        request = ControlRequest(sequence=self._sequence, action=action, reason=reason,
                                 requested_at=now, deadline=deadline)
        self._sequence += 1
        return request
