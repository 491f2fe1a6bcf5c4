"""The supervisor's shell: checks, the lock, signals, processes and waits around the core.

Signal handlers only enqueue an event; the main loop takes one event at a time, first looks for a
newly committed checkpoint, then feeds the event to :class:`SupervisorCore` and executes the
actions it returns. Every decision lives in the core; this module only does what it is told.

Times are wall-clock (``time.time``): the control file's deadline is read by workers, possibly on
other nodes, so the core's clock and theirs must be the same kind.
"""

from __future__ import annotations

import dataclasses
import importlib.machinery
import json
import logging
import os
import queue
import shutil
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from cycler._fs import atomic_write_bytes
from cycler.checkpoints import find_checkpoint, inspect_checkpoint, list_checkpoints
from cycler.control import (
    announced,
    clear_announcements,
    read_control,
    stop_requested_since,
    write_control,
)
from cycler.environment import ENV_ISC_LOSSY_PATH
from cycler.errors import CheckpointDirectoryError, ConfigError, CyclerError
from cycler.events import EventLog, describe
from cycler.layout import CheckpointLayout, CheckpointName
from cycler.lock import SupervisorLock
from cycler.supervisor import core
from cycler.supervisor.failure import failure_report
from cycler.supervisor.options import RunOptions
from cycler.supervisor.processes import Watchdog, WorkerTree, become_subreaper, start_torchrun
from cycler.supervisor.requeue import RequeueResult, requeue_job
from cycler.supervisor.torchrun import (
    LaunchPlan,
    full_environment,
    isc_environment,
    launch_plan,
)

log = logging.getLogger("cycler.supervisor")

TICK_SECONDS = 0.1
"""How often the loop looks for a new checkpoint when nothing else happens."""
STDERR_DRAIN_SECONDS = 2.0



@dataclass(frozen=True)
class RunOutcome:
    """How ``cycle run`` ended: the exit code, why, and the failing worker's report if any."""

    exit_code: int
    reason: str
    failure: str | None = None


Starter = Callable[[list[str], dict[str, str], Watchdog], WorkerTree]
Requeuer = Callable[[str], RequeueResult]


def plan_run(options: RunOptions) -> LaunchPlan:
    """Check the script and ``--resume-from``, and return what the first start would run."""
    check_script(options)
    options = settle_resume_from(options)
    check_resume_from(options)
    return launch_plan(options)


def run_supervisor(options: RunOptions, *, clock: Callable[[], float] = time.time,
                   starter: Starter = start_torchrun,
                   requeuer: Requeuer = requeue_job) -> RunOutcome:
    """Supervise torchrun for ``options`` until the job finishes, fails or stops on request.

    Raises a :class:`CyclerError` with exit code 2 before anything starts when the script, the
    checkpoint directory, ``--resume-from`` or the lock is not usable.
    """
    check_script(options)
    prepare_checkpoint_root(options)
    options = settle_resume_from(options)
    check_resume_from(options)
    return Supervisor(options, clock=clock, starter=starter, requeuer=requeuer).run()


# --- checks before anything starts ------------------------------------------------------------


def check_script(options: RunOptions) -> None:
    """Refuse a script torchrun could not start, before any process is started."""
    script, mode = Path(options.script), options.launch_mode
    if mode == "module":
        top = str(script).split(".")[0]
        # Found without importing it: importing the user's package here could take seconds.
        if importlib.machinery.PathFinder.find_spec(top, [os.getcwd(), *sys.path]) is None:
            raise ConfigError(f"module {script} cannot be found: no package {top} in the "
                              "current directory or on sys.path")
    elif mode == "no_python":
        if not (script.is_file() and os.access(script, os.X_OK)) and not shutil.which(
                options.script):
            raise ConfigError(f"{script} is not an executable file (--no-python runs it "
                              "directly); give an executable or drop --no-python")
    elif not script.is_file():
        raise ConfigError(f"script {script} does not exist; give the path of your "
                          "training script")
    elif mode == "run_path" and not script.is_absolute():
        raise ConfigError(f"--run-path needs an absolute script path, not {script}")


def settle_resume_from(options: RunOptions) -> RunOptions:
    """``options`` without ``--resume-from`` if this job already rolled back to it.

    A rerun of the same command (Slurm's requeue: ``SLURM_RESTART_COUNT``; anywhere else: the
    record the first run left under ``.cycler/``) must continue from the newest checkpoint,
    not throw away everything since; a checkpoint rotated away meanwhile is then no error.
    """
    if options.resume_from is None:
        return options
    layout = CheckpointLayout(options.checkpoint_dir, options.checkpoint_name)
    record = layout.resume_record_path(options.node_rank)
    try:
        done = json.loads(record.read_text()).get("resume_from") == options.resume_from
    except (OSError, ValueError, AttributeError):
        done = False
    if not (done or options.requeue_count > 0):
        return options
    log.info("--resume-from %s was carried out by an earlier run of this job (%s): "
             "continuing from the newest checkpoint", options.resume_from,
             "a requeue" if options.requeue_count > 0 else record)
    return dataclasses.replace(options, resume_from=None)


def record_resume_from(layout: CheckpointLayout, node_rank: int, resume_from: str) -> None:
    """Note that this job rolled back to ``resume_from``, so that a rerun does not again."""
    payload = json.dumps({"resume_from": resume_from, "time": time.time()}).encode()
    layout.supervisor_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(layout.resume_record_path(node_rank), payload, durable=True)


def check_resume_from(options: RunOptions) -> None:
    if options.resume_from is None:
        return
    try:
        find_checkpoint(options.checkpoint_dir, options.resume_from, options.checkpoint_name)
    except CyclerError as error:
        raise ConfigError(f"--resume-from: {error}") from None


def prepare_checkpoint_root(options: RunOptions) -> None:
    """Create the root and its ``.cycler/``, and prove a file can be written there; create
    the lossy directory the workers are told about."""
    layout = CheckpointLayout(options.checkpoint_dir, options.checkpoint_name)
    probe_name = f".probe-{socket.gethostname()}-{os.getpid()}"
    try:
        layout.supervisor_dir.mkdir(parents=True, exist_ok=True)
        # Both places get written: the savers create checkpoints in the root, the supervisor
        # and the locks write in .cycler/, and either may be the one that is read-only.
        for probe in (layout.root / probe_name, layout.supervisor_dir / probe_name):
            probe.write_bytes(b"")
            probe.unlink()
    except OSError as error:
        raise CheckpointDirectoryError(
            f"cannot write to the checkpoint directory {layout.root} ({error.strerror}); "
            "choose a writable --checkpoint-dir"
        ) from None
    lossy = isc_environment(options, os.environ).get(ENV_ISC_LOSSY_PATH)
    if lossy is not None:
        try:
            os.makedirs(lossy, exist_ok=True)
        except OSError as error:
            raise CheckpointDirectoryError(
                f"cannot create {lossy} for LOSSY_ARTIFACT_PATH ({error.strerror}); set "
                "LOSSY_ARTIFACT_PATH to a writable directory"
            ) from None


def stop_requested_elsewhere(layout: CheckpointLayout, node_rank: int, since: float) -> bool:
    """Whether another node's supervisor asked for ``checkpoint_and_exit`` at or after ``since``.

    The workers decide a stop together, so a node whose supervisor got no signal sees its
    workers exit 0 as if training had finished; the other nodes' control files, on the shared
    checkpoint root, tell the two apart.
    """
    own = layout.control_path(node_rank)
    return stop_requested_since([path for path in layout.control_paths() if path != own], since)


def newest_valid_index(layout: CheckpointLayout) -> int | None:
    """Index of the checkpoint a resume would load (the latest valid one), if any."""
    found = list_checkpoints(layout.root, layout.prefix)
    return next((c.index for c in found if c.is_latest), None)


# --- the loop ---------------------------------------------------------------------------------


class Supervisor:
    """One ``cycle run``: owns the lock, the watchdog and at most one torchrun at a time."""

    def __init__(self, options: RunOptions, *, clock: Callable[[], float] = time.time,
                 starter: Starter = start_torchrun, requeuer: Requeuer = requeue_job) -> None:
        self.options = options
        self.layout = CheckpointLayout(options.checkpoint_dir, options.checkpoint_name)
        self.events = EventLog(self.layout.events_path(options.node_rank), clock=clock)
        self._clock = clock
        self._starter = starter
        self._requeuer = requeuer
        self._queue: queue.SimpleQueue[core.Event] = queue.SimpleQueue()
        self._tree: WorkerTree | None = None
        self._watchdog: Watchdog | None = None
        self._outcome: RunOutcome | None = None
        self._failure: str | None = None
        self._linked: CheckpointName | None = self.layout.link_target_name()
        self._started_at = clock()
        self._cut_short = False

    def handle_signal(self, number: int, frame: FrameType | None = None) -> None:
        """Signal handler: only records the signal; the loop decides what it means."""
        self._queue.put(core.SignalReceived(signal.Signals(number).name, self._clock()))

    def run(self) -> RunOutcome:
        """Start the workers and supervise them until the core decides to exit."""
        with ExitStack() as stack:
            stack.enter_context(self._locked())
            stack.enter_context(self._signals_trapped())
            if not become_subreaper():
                log.debug("not a subreaper: orphans of crashed workers may escape the tree")
            self._watchdog = Watchdog()
            stack.callback(self._watchdog.close)
            stack.callback(self._reap)
            outcome = self._loop(core.SupervisorCore(self._core_config()))
        return outcome

    def _loop(self, decisions: core.SupervisorCore) -> RunOutcome:
        self._record("start", pid=os.getpid(), script=str(self.options.script),
                     nproc_per_node=self.options.nproc_per_node, nnodes=self.options.nnodes,
                     node_rank=self.options.node_rank, grace=self.options.grace)
        self._execute(decisions.start(self._clock()))
        while self._outcome is None:
            event = self._next_event(decisions.wake_at)
            for committed in self._new_checkpoints():
                self._execute(decisions.handle(committed))
            self._cut_torchrun_short(decisions)
            if isinstance(event, core.SignalReceived):
                event = dataclasses.replace(event, features=self._announced())
            self._execute(decisions.handle(event))
            if decisions.awaiting_announcement:
                self._execute(decisions.handle(core.Announced(self._announced(), self._clock())))
        return self._outcome

    def _announced(self) -> frozenset[str]:
        return announced(self.layout.control_path(self.options.node_rank))

    def _cut_torchrun_short(self, decisions: core.SupervisorCore) -> None:
        """End torchrun once the stop checkpoint is committed and every worker has exited.

        torchrun takes about 0.4 s to tear itself down after its last worker is gone, which
        is most of what a stop costs beyond the save. Its result no longer matters then: the
        checkpoint is committed. With several nodes torchrun on node 0 hosts the rendezvous
        store the others still use to leave, so it is left alone there.
        """
        tree = self._tree
        if (self.options.nnodes > 1 or tree is None or self._cut_short
                or not decisions.stop_checkpoint_made or not tree.only_torchrun_left()):
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
        previous = read_control(self.layout.control_path(options.node_rank))
        return core.CoreConfig(
            grace=options.grace, stop_signals=frozenset(options.signals),
            max_restarts=options.max_restarts, restart_delay=options.restart_delay,
            requeue=requeue, requeue_count=options.requeue_count,
            max_requeues=options.max_requeues, resume_from=options.resume_from,
            initial_checkpoint=newest_valid_index(self.layout),
            first_sequence=0 if previous is None else previous.sequence + 1,
        )

    def _next_event(self, wake_at: float | None) -> core.Event:
        timeout = TICK_SECONDS
        if wake_at is not None:
            timeout = max(0.0, min(timeout, wake_at - self._clock()))
        try:
            return self._queue.get(timeout=timeout)
        except queue.Empty:
            return core.Tick(self._clock())

    def _new_checkpoints(self) -> Iterator[core.CheckpointCommitted]:
        linked = self.layout.link_target_name()
        if linked == self._linked:
            return
        self._linked = linked
        if linked is not None and inspect_checkpoint(self.layout, linked).valid:
            yield core.CheckpointCommitted(linked.index, self._clock())

    # -- actions ----------------------------------------------------------------------------

    def _execute(self, actions: list[core.SupervisorAction]) -> None:
        for action in actions:
            if isinstance(action, core.Log):
                self._record(action.event, warning=action.warning, **action.fields)
            elif isinstance(action, core.WriteControl):
                write_control(self.layout.control_path(self.options.node_rank), action.request)
            elif isinstance(action, core.StartWorkers):
                self._start(action)
            elif isinstance(action, core.SignalTree):
                self._signal_tree(action.signal)
            elif isinstance(action, core.SignalWorkers):
                self._signal_workers(action.signal)
            elif isinstance(action, core.Requeue):
                self._requeue()
            else:
                failure = self._failure if action.workers_failed else None
                self._outcome = RunOutcome(action.code, action.reason, failure)

    def _start(self, action: core.StartWorkers) -> None:
        if self._tree is not None:
            self._tree.reap()
        clear_announcements(self.layout.control_path(self.options.node_rank))
        if action.resume_from is not None:
            record_resume_from(self.layout, self.options.node_rank, action.resume_from)
        plan = launch_plan(self.options, start_number=action.start_number,
                           resume_from=action.resume_from)
        assert self._watchdog is not None
        self._tree = self._starter(plan.command, full_environment(plan), self._watchdog)
        self._record("workers_started", torchrun_pid=self._tree.process.pid,
                     start=action.start_number, resume_from=action.resume_from,
                     restart_count=plan.environment["CYCLER_RESTART_COUNT"])
        _Waiter(self._tree, self._queue, self._on_exit).start()

    def _on_exit(self, tree: WorkerTree, code: int) -> core.WorkersExited:
        """The exit event, with what the report and a multi-node stop need (waiter thread)."""
        if self._cut_short:
            code = 0  # every worker had exited after the stop checkpoint; torchrun was killed
        if code != 0:
            self._failure = failure_report(tree.stderr.text(), code)
        elsewhere = self.options.nnodes > 1 and stop_requested_elsewhere(
            self.layout, self.options.node_rank, self._started_at)
        return core.WorkersExited(code, self._clock(), elsewhere)

    def _signal_tree(self, number: signal.Signals) -> None:
        if self._tree is not None:
            self._record("signal_sent", signal=number.name, torchrun_pid=self._tree.process.pid)
            self._tree.signal(number)

    def _signal_workers(self, number: signal.Signals) -> None:
        if self._tree is not None:
            pids = self._tree.signal_workers(number)
            self._record("signal_forwarded", signal=number.name, workers=pids)

    def _requeue(self) -> None:
        job_id = self.options.slurm_job_id
        assert job_id is not None, "the core only requeues when a Slurm job id is known"
        result = self._requeuer(job_id)
        self._record("requeue", warning=not result.accepted, job_id=job_id,
                     accepted=result.accepted, detail=result.detail)

    def _reap(self) -> None:
        if self._tree is not None:
            self._tree.reap()

    def _record(self, event: str, warning: bool = False, **fields: Any) -> None:
        self.events.append(event, **fields)
        log.log(logging.WARNING if warning else logging.INFO, "%s", describe(event, fields))

    # -- context ----------------------------------------------------------------------------

    @contextmanager
    def _locked(self) -> Iterator[None]:
        lock = SupervisorLock(self.layout.lock_path(self.options.node_rank))
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
        try:
            yield
        finally:
            for number, handler in previous.items():
                signal.signal(number, handler)


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

