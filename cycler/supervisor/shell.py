"""The supervisor's shell: checks, the lock, signals, processes and waits around the core.

Signal handlers only enqueue an event; the main loop takes one event at a time, first looks for a
newly committed checkpoint, then feeds the event to :class:`SupervisorCore` and executes the
actions it returns. Every decision lives in the core; this module only does what it is told.

Times are wall-clock (``time.time``): the control file's deadline is read by workers, possibly on
other nodes, so the core's clock and theirs must be the same kind.
"""

from __future__ import annotations

import dataclasses
import errno
import logging
import os
import queue
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass
from types import FrameType
from typing import Any

from cycler.checkpoint.layout import CheckpointLayout, CheckpointName
from cycler.checkpoint.listing import inspect_checkpoint, list_checkpoints
from cycler.checkpoint.lock import SupervisorLock
from cycler.checkpoint.memory_roots import prepare_runtime_dir, release_reserve
from cycler.errors import CyclerError
from cycler.protocol.control import (
    Action,
    ControlRequest,
    earliest_deadline,
    read_control,
    stops_since,
    write_control,
)
from cycler.protocol.events import EventLog, describe, process_start
from cycler.protocol.exit_codes import EXIT_FAILURE, EXIT_NOT_PERSISTED, EXIT_REQUEUE
from cycler.protocol.features import announced, clear_announcements
from cycler.protocol.node_local import commit_note
from cycler.protocol.record import RunRecord
from cycler.protocol.stop_signals import lower_shields, raise_shields
from cycler.supervisor.checks import checked_options, record_resume_from
from cycler.supervisor.compile_cache.carrier import CompileCacheCarrier
from cycler.supervisor.configuration.options import RunOptions
from cycler.supervisor.decisions import core
from cycler.supervisor.decisions.failure import failure_report
from cycler.supervisor.decisions.failure_kinds import classify
from cycler.supervisor.launch.processes import (
    Watchdog,
    WorkerTree,
    become_subreaper,
    start_torchrun,
)
from cycler.supervisor.launch.torchrun import (
    LaunchPlan,
    full_environment,
    launch_plan,
    restarts_by_torchrun,
)
from cycler.supervisor.nodes.peers import Heartbeat, PeerWatch
from cycler.supervisor.nodes.root_io import RootIO
from cycler.supervisor.nodes.store_link import LINK_SECONDS, STALE_SECONDS, StoreLink
from cycler.supervisor.run_end.foreign import finder_for, requeue_on_foreign_checkpoint
from cycler.supervisor.run_end.landing import Landing, sigint_came
from cycler.supervisor.run_end.stop_guard import GUARD_MARGIN_SECONDS, StopGuard
from cycler.supervisor.schedulers import notices
from cycler.supervisor.schedulers.slurm import (
    DEADLINE_MARGIN_SECONDS,
    RequeueResult,
    SlurmJob,
    hard_deadline,
    read_job,
    requeue_job,
)
from cycler.supervisor.watch.hangs import HangPolicy, WorkerProgress
from cycler.supervisor.watch.replay_watch import ReplayWatch, fingerprint_dir

log = logging.getLogger("cycler.supervisor")

TICK_SECONDS = 0.1
"""How often the loop wakes when nothing else happens."""
LINK_LOOK_SECONDS = 5.0
"""While training with no commit noted on this node: how often the supervisor still reads the
checkpoint root's link (a commit the workers did not note, such as an older cycler's)."""
VERDICT_MARGIN = 5.0
"""Seconds a failed torchrun waits for the peers' verdict beyond ``--node-timeout``."""
STDERR_DRAIN_SECONDS = 2.0
LOOK_WAIT_SECONDS = 1.0
"""How long the loop waits for a look at the links when a signal comes: past it the root is
taken for stalled, and the stop goes out to the workers with the links it knew."""
RECORDS_WAIT_SECONDS = 5.0
"""How long the end waits for the run's last records to reach a stalled root."""
UNASKED_SIGNALS = (signal.SIGUSR1, signal.SIGUSR2)
"""Signals a scheduler may be told to send (Lightning's Slurm recipe: ``--signal=USR1@90``)
whose default ends a process: where they are not among ``--signals``, ignored with a line."""


@dataclass(frozen=True)
class RunOutcome:
    """How ``cycle run`` ended: the exit code, why, and the failing worker's report if any."""

    exit_code: int
    reason: str
    failure: str | None = None


Starter = Callable[[list[str], dict[str, str], Watchdog], WorkerTree]
Requeuer = Callable[[str], RequeueResult]
SlurmReader = Callable[[str], SlurmJob]


def plan_run(options: RunOptions) -> LaunchPlan:
    """Check the script and ``--resume-from``, and return what the first start would run."""
    return launch_plan(checked_options(options, prepare_root=False))


def run_supervisor(options: RunOptions, *, clock: Callable[[], float] = time.time,
                   starter: Starter = start_torchrun,
                   requeuer: Requeuer = requeue_job) -> RunOutcome:
    """Supervise torchrun for ``options`` until the job finishes, fails or stops on request.

    Raises a :class:`CyclerError` with exit code 2 before anything starts when the script, the
    checkpoint directory, ``--resume-from`` or the lock is not usable.
    """
    options = checked_options(options, prepare_root=True)
    return Supervisor(options, clock=clock, starter=starter, requeuer=requeuer).run()


def run_token(options: RunOptions) -> str | None:
    """What every node of this run shares and no other run does: Slurm's job id with its
    requeue count, else an explicit ``--rdzv-id`` (``None``: nothing to go by)."""
    if options.slurm_job_id is not None:
        return f"slurm-{options.slurm_job_id}-{options.requeue_count}"
    return None if options.rdzv_id is None else f"rdzv-{options.rdzv_id}"


def store_host(options: RunOptions) -> str:
    """Node 0's address as the other nodes reach it: the job's liveness store is there."""
    if options.master_addr:
        return options.master_addr
    if options.rdzv_endpoint:
        host = options.rdzv_endpoint.rsplit(":", 1)[0]
        return host.strip("[]") or "127.0.0.1"
    return "127.0.0.1"


def stop_requested_elsewhere(record: RunRecord, node_rank: int, since: float) -> bool:
    """Whether another node's supervisor asked for ``checkpoint_and_exit`` at or after ``since``.

    The workers decide a stop together, so a node whose supervisor got no signal sees its
    workers exit 0 as if training had finished; the other nodes' control files, on the shared
    checkpoint root, tell the two apart.
    """
    return bool(stops_elsewhere(record, node_rank, since))


def stops_elsewhere(record: RunRecord, node_rank: int, since: float,
                    link: StoreLink | None = None) -> list[ControlRequest]:
    """The other nodes' stop requests since ``since``: from the liveness store (read by a
    fresh beat of ``link``), or, where there is none or it does not answer, from the other
    nodes' control files in the root (read once)."""
    found = None if link is None else link.stops_now()
    if found is None:
        own = record.control_path(node_rank)
        return stops_since([path for path in record.control_paths() if path != own], since)
    return stops_of_other_nodes(found, node_rank, since)


def stops_of_other_nodes(entries: list[dict[str, Any]], node_rank: int,
                         since: float) -> list[ControlRequest]:
    """The ``checkpoint_and_exit`` requests since ``since`` among the store's stop entries
    (:meth:`StoreLink.stops`) that another node than ``node_rank`` appended."""
    requests = []
    for entry in entries:
        with suppress(ValueError, TypeError, KeyError):
            request = ControlRequest.from_json(str(entry["request"]))
            if entry.get("node") != node_rank and request.requested_at >= since and \
                    request.action is Action.CHECKPOINT_AND_EXIT:
                requests.append(request)
    return requests


def _import_torch_quietly() -> None:
    """Import torch before the first beat (in the liveness link's thread the import took the
    process's CPU from the beats for seconds on a loaded host, and a node was taken for gone),
    with c10's own log off for this process only (``TORCH_CPP_LOG_LEVEL``, read once, at the
    import; the workers get the user's): the liveness store's client prints a C++ trace at
    every try once node 0 is gone, where the verdict alone must be on the terminal. A level
    the user set is kept."""
    if "TORCH_CPP_LOG_LEVEL" in os.environ:
        import torch.distributed  # noqa: F401
        return
    os.environ["TORCH_CPP_LOG_LEVEL"] = "FATAL"
    try:
        import torch.distributed  # noqa: F401
    finally:
        del os.environ["TORCH_CPP_LOG_LEVEL"]


def newest_valid_index(layout: CheckpointLayout) -> int | None:
    """Index of the checkpoint a resume would load (the latest valid one), if any."""
    found = list_checkpoints(layout.root, layout.prefix)
    return next((c.index for c in found if c.is_latest), None)


# --- the loop ---------------------------------------------------------------------------------


class Supervisor:
    """One ``cycle run``: owns the lock, the watchdog and at most one torchrun at a time."""

    def __init__(self, options: RunOptions, *, clock: Callable[[], float] = time.time,
                 starter: Starter = start_torchrun, requeuer: Requeuer = requeue_job,
                 slurm_reader: SlurmReader = read_job) -> None:
        self.options = options
        self._slurm_reader = slurm_reader
        self.layout = options.layout
        self.record = options.record
        self._node = options.node_files
        self.events = EventLog(self.record.events_path(options.node_rank), clock=clock)
        self._clock = clock
        self._starter = starter
        self._requeuer = requeuer
        self._queue: queue.SimpleQueue[core.Event] = queue.SimpleQueue()
        self._ignored: set[int] = set()
        self._tree: WorkerTree | None = None
        self._watchdog: Watchdog | None = None
        self._outcome: RunOutcome | None = None
        self._landing = Landing(options, self._record, clock)
        self._land: core.LandNewest | None = None
        """What the core asked to land before it says its end (the memory tier)."""
        self._failure: str | None = None
        self._linked = self._links()
        self._commit_note = commit_note(self._node)
        self._next_link_look = 0.0
        self._root_io = RootIO()  # the root's calls while the workers train, off the loop
        self._guard = StopGuard(self._verdict_past_the_deadline)
        self._guarded: float | None = None
        """The stop deadline the guard is armed for."""
        self._looked: tuple[int, tuple[tuple[CheckpointName | None, ...], int | None]] | None \
            = None
        """The last look the root's thread took (its number), for the loop to take."""
        self._look_number = 0
        self._summed_up: WorkerTree | None = None
        """The workers whose echo of a lost node was summed up already."""
        self._started_at = clock()
        self._foreign = finder_for(os.getcwd(), options)  # the workers' cwd, while it exists
        self._cut_short = False
        self._stopping = False
        """Whether a stop was requested here, by a signal or relayed from another node."""
        self._peer_lost = False
        """Whether another node was found gone (the job ends with it, whatever was asked)."""
        run = run_token(options)
        begun = time.monotonic()  # the other nodes have --start-timeout from here
        self._lost_before_start = None if options.nnodes == 1 else PeerWatch(
            self.record, options.node_rank, options.nnodes, timeout=options.node_timeout,
            run=run, start_timeout=options.start_timeout).lost(begun)
        """A node of this run that ended before this one started, found by a first look at the
        records before torch's import (seconds on a loaded host): the job ends at once."""
        if options.nnodes > 1 and self._lost_before_start is None:
            _import_torch_quietly()
        self._link = None if options.nnodes == 1 or self._lost_before_start else StoreLink(
            self.record.liveness_store_path, options.node_rank,
            options.nnodes, store_host(options), period=LINK_SECONDS)
        self._heartbeat = Heartbeat(self.record, options.node_rank, run, self._link,
                                    file_every=options.node_timeout / 3,
                                    root_io=self._root_io)
        self._peers = PeerWatch(self.record, options.node_rank, options.nnodes,
                                timeout=options.node_timeout, run=run,
                                start_timeout=options.start_timeout, link=self._link)
        self._peers.begin(begun)
        policy = None if not options.hang_detection else HangPolicy(
            floor=options.hang_timeout_min, factor=options.hang_factor,
            first_step=options.hang_first_step, pause=options.hang_pause_timeout)
        self._progress = WorkerProgress(self.record, options.node_rank, self._node, policy,
                                        self._record, self._root_io)
        self._carrier = CompileCacheCarrier(options, self._record)
        nproc = options.nproc_per_node
        self._replays = ReplayWatch(
            self.record, options.node_rank, lambda: fingerprint_dir(self.record, options.node_rank),
            stop=options.on_divergence == "stop", record=self._record,
            local_ranks=nproc if isinstance(nproc, int) else None)

    def _ignore_signal(self, number: int, frame: FrameType | None = None) -> None:
        """A user signal not among ``--signals``: its default would end ``cycle run`` at
        once, silently, with the work since the last checkpoint lost; it is said once."""
        if number not in self._ignored:
            self._ignored.add(number)
            name = signal.Signals(number).name
            log.warning("%s ignored: it is not one of --signals (%s); add it there to stop "
                        "with a checkpoint on it", name, ",".join(self.options.signals))

    def handle_signal(self, number: int, frame: FrameType | None = None) -> None:
        """Signal handler: only records the signal; the loop decides what it means."""
        self._queue.put(core.SignalReceived(signal.Signals(number).name, self._clock()))

    def run(self) -> RunOutcome:
        """Start the workers and supervise them until the core decides to exit."""
        with ExitStack() as stack:
            stack.enter_context(self._locked())
            stack.enter_context(self._signals_trapped())
            stack.callback(self._carrier.finish)  # once the workers are gone
            if not become_subreaper():
                log.debug("not a subreaper: orphans of crashed workers may escape the tree")
            self._watchdog = Watchdog()
            stack.callback(self._watchdog.close)
            stack.callback(self._watch_for_preemption_notices())
            stack.callback(self._reap)
            decisions = core.SupervisorCore(self._core_config())
            planned = self._loop(decisions)
            self._reap()
            self._replays.finish(planned)
            self._progress.save_longest()
            outcome = self._landed(decisions)
        if self.options.nnodes > 1:
            self._heartbeat.finish(outcome.exit_code)
        if self._link is not None:
            if self._peer_lost and self.options.node_rank == 0 and self.options.nnodes > 2:
                self._link.hand_over_verdict()  # the others learn it before the store goes
            self._link.close()
        self._record("ended", code=outcome.exit_code)  # the run's last moment cycle can see
        left = self._root_io.close(wait=RECORDS_WAIT_SECONDS)
        if left:
            log.warning("the checkpoint root did not answer for %g s: the last %d records of this "
                        "run were not written to %s", RECORDS_WAIT_SECONDS, left,
                        self.events.path)
        self._guard.disarm()
        return outcome

    def _guard_the_deadline(self, decisions: core.SupervisorCore) -> None:
        """Arm the guard for the stop's deadline (again where it moved): past it, the kill's
        seconds and a margin, the process ends even where a call on the root holds the loop."""
        deadline = decisions.stop_deadline
        if deadline is None or deadline == self._guarded:
            return
        self._guarded = deadline
        self._guard.arm(deadline - self._clock() + decisions.config.kill_after
                        + GUARD_MARGIN_SECONDS)

    def _verdict_past_the_deadline(self) -> tuple[int, str]:
        """The exit code and line of a stop whose deadline passed while a call on the root held
        the loop (the guard's thread): from the links the loop last saw and this node's memory
        tier, nothing read on the root."""
        held = "a call on the checkpoint root did not return by the stop's deadline"
        memory = self.options.memory_layout
        in_memory = None if memory is None else newest_valid_index(memory)
        on_root = self._linked[-1].index if self._linked[-1] is not None else None
        if in_memory is not None and (on_root is None or in_memory > on_root):
            assert memory is not None
            return EXIT_NOT_PERSISTED, (
                f"exit {EXIT_NOT_PERSISTED}: {held} (a stalled filesystem); the newest state is "
                f"checkpoint {in_memory} in this node's memory tier, {memory.root}: run again on "
                "this node to resume from it; not requeued")
        if self._outcome is not None:
            return self._outcome.exit_code, (f"exit {self._outcome.exit_code}: "
                                             f"{self._outcome.reason}; {held}: its last records "
                                             "are not written")
        if on_root is not None:
            return EXIT_REQUEUE, (f"exit {EXIT_REQUEUE}: {held} (a stalled filesystem); "
                                  f"checkpoint {on_root} is the one to resume; not requeued")
        return EXIT_FAILURE, f"exit {EXIT_FAILURE}: {held}, and no checkpoint is known to resume"

    def _loop(self, decisions: core.SupervisorCore) -> int:
        """Supervise until the core decides the end; return its exit code (before the landing
        of the newest checkpoint, where the core asked for one)."""
        self._record("start", pid=os.getpid(), script=str(self.options.script),
                     nproc_per_node=self.options.nproc_per_node, nnodes=self.options.nnodes,
                     node_rank=self.options.node_rank, grace=self.options.grace, **process_start())
        self._landing.announce()
        self._config = decisions.config
        early = self._lost_before_start
        self._execute(decisions.start(self._clock()) if early is None else
                      decisions.lost_before_start(core.PeerLost(
                          early.node, early.why, self._clock(), failed=early.failed)))
        while self._outcome is None and self._land is None:
            event = self._next_event(decisions.wake_at)
            for committed in self._new_checkpoints(event, decisions.phase):
                self._carrier.checkpoint_committed()  # a thread, if due
                self._replays.flush()
                self._execute(decisions.handle(committed))
            self._cut_torchrun_short(decisions)
            self._watch_other_nodes(decisions)
            self._watch_progress(decisions)
            self._watch_replays(decisions)
            if isinstance(event, core.SignalReceived):
                event = dataclasses.replace(event, features=self._announced(),
                                            workers_started=self._workers_started())
            stopping = decisions.stop_requested
            self._execute(decisions.handle(event))
            self._guard_the_deadline(decisions)
            if decisions.stop_requested and not stopping:
                self._stopping = True
                self._carrier.call_off()  # the grace is for the checkpoint
                self._learn_hard_deadline(self._clock(), decisions.config.kill_after)
            if decisions.listening:
                self._execute(decisions.handle(core.Announced(self._announced(), self._clock())))
        return self._land.planned if self._land is not None else self._exit_code()

    def _exit_code(self) -> int:
        assert self._outcome is not None
        return self._outcome.exit_code

    def _watch_other_nodes(self, decisions: core.SupervisorCore) -> None:
        """Beat, and end this node's workers when another node is gone (multi-node jobs)."""
        if self.options.nnodes == 1:
            return
        now = time.monotonic()  # never compared with another host's clock (see .peers)
        self._heartbeat.beat(now)
        loss = self._peers.lost(now, stepping=self._progress.first_step_seen)
        for node in self._peers.waiting(now):
            self._record("waiting_for_node", warning=True, node=node)
        if loss is None and decisions.phase is core.Phase.AWAITING_PEERS:
            # This node's torchrun failed; the others' verdict is the job's (a node thawed
            # after --node-timeout finds the job ended 75 without it).
            loss = self._peers.requeued()
        if loss is not None:
            self._peer_lost = True
            self._sum_up_a_lost_nodes_echo(loss.node)
            self._execute(decisions.handle(
                core.PeerLost(loss.node, loss.why, self._clock(), failed=loss.failed)))
        self._relay_a_stop_elsewhere(decisions)

    def _relay_a_stop_elsewhere(self, decisions: core.SupervisorCore) -> None:
        """Another node's stop request, read from the job's store, is asked of this node's
        workers too (:data:`core.STOP_ELSEWHERE`): they stop at the step every rank agrees on
        as they would anyway, and this node's stop then ends as soon as its workers have
        exited after the stop's checkpoint (torchrun's own teardown takes seconds), not at the
        deadline. A deadline of that request earlier than this node's own is kept."""
        if (self._link is None or self._stopping or decisions.stop_requested
                or decisions.phase is not core.Phase.RUNNING):
            return
        requests = stops_of_other_nodes(self._link.stops() or [], self.options.node_rank,
                                        self._started_at)
        if not requests:
            return
        self._stopping, now = True, self._clock()
        self._queue.put(core.SignalReceived(core.STOP_ELSEWHERE, now))
        deadline = earliest_deadline(requests)
        if deadline is not None and deadline < now + self.options.grace - STALE_SECONDS:
            self._queue.put(core.HardDeadline(deadline, "the deadline of the stop another "
                                              "node asked for", now))

    def _watch_progress(self, decisions: core.SupervisorCore) -> None:
        """On a hang found in the workers' beacons (stacks dumped already), the core kills
        and restarts them."""
        if decisions.phase is not core.Phase.RUNNING:
            return
        hang = self._progress.check(time.monotonic(), self._clock())
        if hang is not None:
            self._execute(decisions.handle(hang))

    def _watch_replays(self, decisions: core.SupervisorCore) -> None:
        """Compare a restart's replayed steps; a divergence that must end the job goes to the
        core (``--on-divergence stop``)."""
        if decisions.phase is not core.Phase.RUNNING:
            return
        diverged = self._replays.check(time.monotonic())
        if diverged is not None:
            self._execute(decisions.handle(core.ReplayDiverged(diverged.sentence(),
                                                               self._clock())))

    def _watch_for_preemption_notices(self) -> Callable[[], None]:
        """Poll the cloud's metadata service in a thread (``--preemption-notices``); a notice
        arrives as a stop request and the deadline it sets. Returns what stops the polling."""
        stop = threading.Event()
        cloud = notices.cloud_to_watch(self.options.preemption_notices)
        if cloud is None:
            return stop.set
        self._record("preemption_notices", cloud=cloud,
                     endpoint=self.options.metadata_endpoint or notices.DEFAULT_ENDPOINTS[cloud])

        def on_notice(notice: notices.Notice) -> None:
            now = self._clock()
            keep = core.CoreConfig.kill_after + DEADLINE_MARGIN_SECONDS
            self._queue.put(core.SignalReceived(notices.NOTICE, now))
            self._queue.put(core.HardDeadline(notice.at - keep, f"{notice.why}; minus {keep:g} "
                                              "s to stop and requeue", now))

        notices.watch(cloud, self.options.metadata_endpoint, on_notice, stop)
        return stop.set

    def _learn_hard_deadline(self, signalled_at: float, kill_after: float) -> None:
        """Ask Slurm, in a thread, when it will end the job; the answer comes as an event."""
        job_id = self.options.slurm_job_id
        if job_id is None:
            return

        def ask() -> None:
            found = hard_deadline(self._slurm_reader(job_id), signalled_at, kill_after)
            if found is not None:
                self._queue.put(core.HardDeadline(found[0], found[1], self._clock()))

        threading.Thread(target=ask, name="cycle-slurm-deadline", daemon=True).start()

    def _workers_started(self) -> bool:
        return (self._tree is None or self._tree.has_workers()
                or self._progress.first_step_seen)

    def _announced(self) -> frozenset[str]:
        return announced(self._node.control_path)

    def _cut_torchrun_short(self, decisions: core.SupervisorCore) -> None:
        """End torchrun once the stop checkpoint is committed and every worker has exited.

        torchrun takes about 0.4 s to tear itself down after its last worker is gone, which
        is most of what a stop costs beyond the save. Its result no longer matters then: the
        checkpoint is committed. With several nodes torchrun's teardown takes seconds more
        (its rendezvous' close and exit barrier, its interpreter's end): every node that stops
        (asked, or relayed another node's request) cuts its own torchrun short, so none waits
        for the others' in its exit barrier.
        """
        tree = self._tree
        if (tree is None or self._cut_short or not decisions.stop_requested
                or not tree.only_torchrun_left()):
            return
        # A stop relayed from another node may reach this one after its checkpoint: the
        # workers' beacons then say they left at that stop.
        if not decisions.stop_checkpoint_made and not self._progress.left_at_a_stop():
            return
        self._cut_short = True
        self._record("torchrun_cut_short", torchrun_pid=tree.process.pid)
        tree.process.kill()

    def _core_config(self) -> core.CoreConfig:
        options = self.options
        # One requeue per job: node 0's supervisor asks, the others only exit 75.
        requeue = options.requeue and options.slurm_job_id is not None and options.node_rank == 0
        if options.requeue and options.slurm_job_id is None:
            log.warning("--requeue has no effect: SLURM_JOB_ID is not set")
        sequences = [request.sequence for path in (self.record.control_path(options.node_rank),
                                                   self._node.control_path)
                     if (request := read_control(path)) is not None]
        return core.CoreConfig(
            grace=options.grace, stop_signals=frozenset((*options.signals, notices.NOTICE,
                                                           core.STOP_ELSEWHERE)),
            max_restarts=options.max_restarts, restart_delay=options.restart_delay,
            requeue=requeue, requeue_count=options.requeue_count,
            max_requeues=options.max_requeues, resume_from=options.resume_from,
            initial_checkpoint=max((i for t in self._tiers()
                                    if (i := newest_valid_index(t)) is not None), default=None),
            first_sequence=max(sequences, default=-1) + 1,
            restarts_by_torchrun=restarts_by_torchrun(options),
            # The verdict needs node_timeout of silence after the lost node's last beat, read
            # once a second, while torchrun fails on the lost store at once: a margin.
            peer_verdict_wait=options.node_timeout + VERDICT_MARGIN if options.nnodes > 1
            else 0.0,
            lands_newest=options.memory_layout is not None,
        )

    def _next_event(self, wake_at: float | None) -> core.Event:
        timeout = TICK_SECONDS
        if wake_at is not None:
            timeout = max(0.0, min(timeout, wake_at - self._clock()))
        try:
            return self._queue.get(timeout=timeout)
        except queue.Empty:
            return core.Tick(self._clock())

    def _new_checkpoints(self, event: core.Event, phase: core.Phase,
                         ) -> Iterator[core.CheckpointCommitted]:
        """The newest checkpoint committed since the last look, in either tier: a readlink
        per tier when the workers noted a commit on this node, at any event but a tick, at
        every tick of a stop and otherwise every :data:`LINK_LOOK_SECONDS`; the manifest
        read only when a link moved. While the workers train (a tick), the look runs in the
        root's thread and its result is taken at a later tick: a frozen root never holds up
        the loop. Any other event looks at once (what it decides may hang on the answer), a
        signal for at most :data:`LOOK_WAIT_SECONDS` (the stop must reach the workers even while
        the root stalls; past its deadline :class:`StopGuard` ends the process)."""
        note, now = commit_note(self._node), time.monotonic()
        if isinstance(event, core.Tick) and phase is core.Phase.RUNNING:
            looked, self._looked = self._looked, None
            if looked is not None and looked[0] == self._look_number:
                yield from self._committed(looked[1])
            if note == self._commit_note and now < self._next_link_look:
                return
            self._commit_note, self._next_link_look = note, now + LINK_LOOK_SECONDS
            if not self._root_io.busy("links"):
                number = self._look_number
                self._root_io.submit("links", lambda: self._look_in_thread(number))
            return
        self._commit_note, self._next_link_look = note, now + LINK_LOOK_SECONDS
        self._look_number += 1  # a look under way in the thread is older than this one
        if not isinstance(event, core.SignalReceived):
            yield from self._committed(self._look())  # a stalled root: the guard ends a stop
            return
        answered, looked = self._root_io.run("look", self._look, LOOK_WAIT_SECONDS)
        if answered:  # else the root is stalled: the stop goes out with the links known
            yield from self._committed(looked)

    def _look_in_thread(self, number: int) -> None:
        self._looked = (number, self._look())

    def _look(self) -> tuple[tuple[CheckpointName | None, ...], int | None]:
        """The links, and the newest valid checkpoint they name if they moved since the last
        look the loop took (``None``: they did not, or none is valid)."""
        linked = self._links()
        if linked == self._linked:
            return linked, None
        valid = [name for tier, name in zip(self._tiers(), linked, strict=True)
                 if name is not None and inspect_checkpoint(tier, name).valid]
        return linked, max((n.index for n in valid), default=None)

    def _committed(self, looked: tuple[tuple[CheckpointName | None, ...], int | None],
                   ) -> Iterator[core.CheckpointCommitted]:
        linked, index = looked
        if linked == self._linked:
            return
        self._linked = linked
        if index is not None:
            yield core.CheckpointCommitted(index, self._clock())

    def _links(self) -> tuple[CheckpointName | None, ...]:
        return tuple(tier.link_target_name() for tier in self._tiers())

    def _tiers(self) -> list[CheckpointLayout]:
        memory = self.options.memory_layout
        return [self.layout] if memory is None else [memory, self.layout]

    def _landed(self, decisions: core.SupervisorCore) -> RunOutcome:
        """The workers are gone: the outcome, once the landing the core asked for (if any) is
        reported to it and it said its end."""
        if self._land is not None:
            report = self._landing.land(self._land, give_up=lambda: sigint_came(self._queue))
            self._execute(decisions.handle(report))
        assert self._outcome is not None
        return self._outcome

    # -- actions ----------------------------------------------------------------------------

    def _execute(self, actions: list[core.SupervisorAction]) -> None:
        actions = requeue_on_foreign_checkpoint(actions, self._config, self._foreign)
        for action in actions:
            if isinstance(action, core.Log):
                self._record(action.event, warning=action.warning, **action.fields)
            elif isinstance(action, core.WriteControl):
                self._write_control(action.request)
            elif isinstance(action, core.StartWorkers):
                self._start(action)
            elif isinstance(action, core.SignalTree):
                self._signal_tree(action.signal)
            elif isinstance(action, core.SignalWorkers):
                self._signal_workers(action)
            elif isinstance(action, core.Requeue):
                self._requeue()
            elif isinstance(action, core.LandNewest):
                self._land = action
            else:
                failure = self._failure if action.workers_failed else None
                self._outcome = RunOutcome(action.code, action.reason, failure)

    def _start(self, action: core.StartWorkers) -> None:
        if self._tree is not None:
            self._tree.reap()
        clear_announcements(self._node.control_path)
        raise_shields(self._node.control_path)
        self._progress.new_start()
        self._replays.new_start()
        if action.resume_from is not None:
            record_resume_from(self.record, self.options.node_rank, action.resume_from)
        plan = launch_plan(self.options, start_number=action.start_number,
                           resume_from=action.resume_from)
        assert self._watchdog is not None
        environment = {**full_environment(plan), **self._replays.environment()}
        self._tree = self._starter(plan.command, environment, self._watchdog)
        if self.options.nnodes > 1:  # a lost node's echo is held back, then summed up
            self._tree.stderr.hold_tracebacks(
                self.record.stderr_log_path(self.options.node_rank),
                2 * self.options.node_timeout + VERDICT_MARGIN)
        self._record("workers_started", torchrun_pid=self._tree.process.pid,
                     start=action.start_number, resume_from=action.resume_from,
                     restart_count=plan.environment["CYCLER_RESTART_COUNT"])
        _Waiter(self._tree, self._queue, self._on_exit).start()

    def _on_exit(self, tree: WorkerTree, code: int) -> core.WorkersExited:
        """The exit event, with what the report and a multi-node stop need (waiter thread)."""
        if self._cut_short:
            code = 0  # every worker had exited after the stop checkpoint; torchrun was killed
        failed = None if code == 0 else classify(tree.stderr.text())
        if code != 0:
            self._failure = failure_report(tree.stderr.text(), code)
        # A stop requested here (or relayed), or a lost node, decides the end whatever the
        # others asked: no need to ask the store, which node 0's end may have taken away (a
        # wait of seconds).
        elsewhere = self.options.nnodes > 1 and not (self._stopping or self._peer_lost)
        stops = stops_elsewhere(self.record, self.options.node_rank, self._started_at,
                                self._link) if elsewhere else []
        return core.WorkersExited(code, self._clock(), bool(stops),
                                  self._progress.before_first_step(), failed,
                                  training_ended=self._progress.training_ended(),
                                  deadline_elsewhere=earliest_deadline(stops))

    def _signal_tree(self, number: signal.Signals) -> None:
        if self._tree is not None:
            self._record("signal_sent", signal=number.name, torchrun_pid=self._tree.process.pid)
            self._tree.signal(number)

    def _signal_workers(self, action: core.SignalWorkers) -> None:
        if self._tree is not None:
            if action.through_shield:
                lower_shields(self._node.control_path)
            pids = self._tree.signal_workers(action.signal)
            self._record("signal_forwarded", signal=action.signal.name, workers=pids)

    def _requeue(self) -> None:
        job_id = self.options.slurm_job_id
        assert job_id is not None, "the core only requeues when a Slurm job id is known"
        result = self._requeuer(job_id)
        self._record("requeue", warning=not result.accepted, job_id=job_id,
                     accepted=result.accepted, detail=result.detail)

    def _sum_up_a_lost_nodes_echo(self, node: int) -> None:
        """Another node is lost: the tracebacks its loss causes here (workers' and torchrun's,
        held back since the first) are one line on the terminal, kept whole in the log; said
        once per start (the loss is found again at every look until the workers are gone)."""
        if self._tree is None or self._summed_up is self._tree:
            return
        self._summed_up = self._tree
        _, kept = self._tree.stderr.summarise()
        if kept is not None:
            log.warning("the tracebacks of this node's workers and torchrun, which fail for the "
                        "loss of node %d, are kept in %s", node, kept)

    def _reap(self) -> None:
        if self._tree is not None:
            self._tree.reap()

    def _record(self, event: str, warning: bool = False, **fields: Any) -> None:
        """Say it now; append it to the root's events in the root's thread, in order (a frozen
        root holds up the record, never the stop it records)."""
        when = self._clock()
        self._root_io.in_order(lambda: self.events.append_at(when, event, fields))
        log.log(logging.WARNING if warning else logging.INFO, "%s", describe(event, fields))

    def _write_control(self, request: Any) -> None:
        """Write the control file the workers poll, on the node, then its copy in the root
        (for the other nodes and ``cycle status``). When the workers' cannot be written (a
        full tmpfs), they can only be told by a signal: the stop goes on as for a plain
        script, and the end says where the newest state is, instead of the supervisor dying
        with the request unsent. When only the root's copy cannot be written (a full root),
        the workers were told all the same, and the record says so."""
        told = True
        try:
            self._write_node_control(request)
        except (OSError, CyclerError) as error:
            told = False
            self._record("control_unwritable", warning=True, error=str(error))
            if request.action is not Action.RUN:
                self._signal_tree(signal.SIGTERM)
        if self._link is not None and request.action is Action.CHECKPOINT_AND_EXIT \
                and request.reason != core.STOP_ELSEWHERE:
            self._link.say_stop(request.to_json())  # every node reads it from the store
        self._root_io.in_order(lambda: self._write_control_copy(request, told))

    def _write_control_copy(self, request: Any, told: bool) -> None:
        """The root's copy of the control request (root thread)."""
        path = self.record.control_path(self.options.node_rank)
        try:
            write_control(path, request)
        except OSError as error:
            if told:
                self._record("control_copy_unwritable", warning=True, error=str(error),
                             path=str(path))

    def _write_node_control(self, request: Any) -> None:
        """Write the node's control file; where its directory is gone (logind removes
        ``$XDG_RUNTIME_DIR``, ``RemoveIPC=yes`` clears ``/dev/shm``, when the user's last
        session ends), make the directory again, private, and write there: the workers poll
        the file by its path, so they read it all the same (a signal instead would find their
        shields up, and the stop would end at the grace, without its checkpoint). Where its
        tmpfs is full, the space kept there at the start (:func:`release_reserve`) is freed
        for it."""
        directory = self.options.runtime_dir
        try:
            write_control(self._node.control_path, request)
        except FileNotFoundError:
            prepare_runtime_dir(directory)
            self._record("runtime_dir_remade", warning=True, path=str(directory))
            write_control(self._node.control_path, request)
        except OSError as error:
            # A full tmpfs: the space kept for this frees a page or more for the request.
            if error.errno not in (errno.ENOSPC, errno.EDQUOT) or not release_reserve(directory):
                raise
            self._record("runtime_dir_full", warning=True, path=str(directory))
            write_control(self._node.control_path, request)

    # -- context ----------------------------------------------------------------------------

    @contextmanager
    def _locked(self) -> Iterator[None]:
        lock = SupervisorLock(self.record.lock_path(self.options.node_rank))
        lock.acquire(role="supervisor", script=str(self.options.script))
        try:
            yield
        finally:
            lock.release()

    @contextmanager
    def _signals_trapped(self) -> Iterator[None]:
        numbers = [signal.Signals[name] for name in self.options.signals]
        numbers.append(signal.SIGCONT)
        previous = {number: signal.signal(number, self.handle_signal) for number in numbers}
        previous.update({number: signal.signal(number, self._ignore_signal)
                         for number in UNASKED_SIGNALS if number not in previous})
        try:
            yield
        finally:
            for number, handler in previous.items():
                # A user signal stays ignored to the process's end: the lock's release and the
                # exit still come after the run's verdict (a USR1 there ended it with 138), and
                # Python's finalization puts back the default under any handler but SIG_IGN.
                # Nothing is started after this point that would inherit it.
                ignored = number in UNASKED_SIGNALS and number not in numbers
                signal.signal(number, signal.SIG_IGN if ignored else handler)


class _Waiter:
    """Waits for one torchrun in a thread and reports its exit as an event."""

    def __init__(self, tree: WorkerTree, events: queue.SimpleQueue[core.Event],
                 on_exit: Callable[[WorkerTree, int], core.WorkersExited]) -> None:
        self._tree = tree
        self._events = events
        self._on_exit = on_exit
        self._thread = threading.Thread(target=self._wait, name="cycle-waiter", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _wait(self) -> None:
        code = self._tree.process.wait()
        # The report needs every line the workers wrote before they died.
        self._tree.stderr.wait(STDERR_DRAIN_SECONDS)
        self._events.put(self._on_exit(self._tree, code))

