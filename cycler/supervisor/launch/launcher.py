"""torchrun as ``cycle run`` starts it: torch's own launcher, under the supervisor's orders.

``python -m cycler.supervisor.launch.launcher ARGS`` is ``torchrun ARGS`` (it calls torchrun's
``main`` with the same arguments) with two differences:

- The stop signals (``$CYCLER_STOP_SIGNALS``) that reach torchrun directly, as on clusters that
  signal every process of a job, do nothing: torchrun is told to handle only SIGQUIT
  (``--signals-to-handle``, before the user's own, which wins) and the others get a handler that
  only says so. Tearing the workers down is the supervisor's decision, and it ends torchrun
  itself with SIGKILL when it must.
- When workers end during a stop that a supervisor of the job asked for (a
  ``checkpoint_and_exit`` in any node's control file since this launcher started), torchrun's
  teardown warnings and its ``ChildFailedError`` / ``SignalException`` traceback are replaced by
  one line: a worker ended by the forwarded SIGTERM is the stop working, not a crash. Any other
  failure is reported by torchrun exactly as usual.
- Multi-node jobs (``--cycle-restarts=N`` and the other ``--cycle-*`` options first): torchrun's
  agent restarts failed workers with every node's, and cycle's :class:`RestartBudget` decides
  at each failure whether it may, counting only failures without a new checkpoint in between.
  torchrun offers no hook for a restart policy, so the agent's ``_monitor_workers`` is wrapped
  in this process: after a failure it either leaves torchrun's restart alone or sets the
  agent's remaining restarts to 0. Each decision goes to this node's events log (the
  supervisor's, on the same host: appends from one host never interleave).
- ``--cycle-fork=MODULES`` (a script with a number of processes per node, unless
  ``--no-fork-workers``): the workers are forked from this process once it has imported torch
  and what workers import (:mod:`.forked`), instead of starting as fresh Pythons that import
  it again.
- In a job of a fixed number of nodes, node ``--node-rank R`` gets group rank R, as under
  torchrun's static rendezvous (c10d would order nodes by host name and pid), so which node
  holds global rank 0 stays what the command line says. Workers reach each other through the
  rendezvous store, which does not depend on this order.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cycler.checkpoint.layout import CheckpointLayout
from cycler.protocol.control import stop_requested_of_this_job
from cycler.protocol.environment import ENV_PROGRESS_DIR
from cycler.protocol.events import EventLog, describe
from cycler.protocol.progress import AFTER_THE_LOOP, read_beacons
from cycler.protocol.stop_signals import ignore_stray, on_stray_signal, stop_signals
from cycler.supervisor.decisions.budget import RestartBudget
from cycler.supervisor.launch import forked
from cycler.supervisor.launch.script_source import environment_set_before_torch, read_source


class StopSeen:
    """Whether a supervisor of this job asked for a stop since ``since`` (wall-clock time): in
    this node's control file first (a stop reaches the workers there even when its copy in a
    full checkpoint root cannot be written), the ones beside it and every node's copy in the
    root (:func:`~cycler.protocol.control.stop_requested_of_this_job`)."""

    def __init__(self, since: float) -> None:
        self._since = since

    def __call__(self) -> bool:
        return stop_requested_of_this_job(self._since)


class _QuietDuringStop(logging.Filter):
    def __init__(self, stopping: StopSeen) -> None:
        super().__init__()
        self._stopping = stopping

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.name.startswith("torch.distributed.elastic") and self._stopping())


class BudgetedRestarts:
    """Decides, at each failure torchrun's agent sees, whether it may restart the workers."""

    def __init__(self, budget: RestartBudget, layout: CheckpointLayout, node_rank: int,
                 restart_delay: float = 0.0, sleep: Callable[[float], None] = time.sleep,
                 stopping: Callable[[], bool] = lambda: False) -> None:
        self._budget = budget
        self._stopping = stopping
        self._layout = layout
        self._node_rank = node_rank
        self._events = EventLog(layout.record.events_path(node_rank))
        self._linked = layout.link_target_name()
        self._restart_delay = restart_delay
        self._sleep = sleep
        # An earlier run's record: gone before this node's workers can meet the others' (the
        # rendezvous needs this launcher), so any record found after a failure is this run's.
        layout.record.workers_finished_path(node_rank).unlink(missing_ok=True)

    def finished(self) -> None:
        """This node's workers all ended with success: say so to the other nodes."""
        with contextlib.suppress(OSError):
            self._layout.record.workers_finished_path(self._node_rank).touch()

    def finished_elsewhere(self, failed_pids: set[int], code: int | None) -> bool:
        """Whether the failed workers had ended their training loop (``StepControl.close()``)
        and another node's workers then finished (within :data:`FINISHED_PEER_WAIT`): the
        training is done, and a restart would wait in a rendezvous the finished nodes never
        join (their agents wait in torchrun's exit barrier)."""
        progress = (os.environ.get(ENV_PROGRESS_DIR)
                    or self._layout.record.progress_dir(self._node_rank))
        readings = [r for r in read_beacons(Path(progress))
                    if r.pid in failed_pids]
        if not readings or any(r.name != AFTER_THE_LOOP for r in readings):
            return False
        for look in range(round(FINISHED_PEER_WAIT / FINISHED_PEER_LOOK) + 1):
            if look:
                self._sleep(FINISHED_PEER_LOOK)
            finished = self._other_nodes_finished()
            if finished:
                fields = {"code": code, "node": finished[0]}
                self._events.append("failed_after_training", **fields)
                sys.stderr.write(f"cycle: {describe('failed_after_training', fields)}\n")
                return True
        return False

    def _other_nodes_finished(self) -> list[int]:
        return [node for node in self._layout.record.workers_finished_nodes()
                if node != self._node_rank]

    def allows_restart(self, exit_code: int | None) -> bool:
        """Count a failure of this node's workers; whether torchrun may restart them. During a
        stop a supervisor of the job asked for (a preemption), never, and nothing is counted:
        the failure is the stop's (a worker that lost its peers as they stopped), and a stop
        must never use up the failure budget (``--max-restarts``)."""
        if self._stopping():
            self._events.append("no_restart_during_stop", code=exit_code)
            return False
        linked = self._layout.link_target_name()
        if linked != self._linked:
            self._linked = linked
            self._budget.progress()
        given_up = self._budget.failure()
        if given_up is not None:
            sys.stderr.write(f"cycle: {given_up}\n")
            return False
        delay = self._budget.backoff(self._restart_delay)
        self._events.append("restart_together", code=exit_code,
                            restart=self._budget.failures_without_progress,
                            of=self._budget.max_restarts, delay=delay)
        self._sleep(delay)  # the other nodes wait for this one in the next rendezvous
        return True

    def install(self) -> None:
        """Wrap the agent's check of its workers so each failure goes through the budget."""
        from torch.distributed.elastic.agent.server.api import RunResult, WorkerState
        from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

        monitor = LocalElasticAgent._monitor_workers
        decide = self.allows_restart

        def monitor_within_budget(agent: Any, worker_group: Any) -> Any:
            result = monitor(agent, worker_group)
            if result.state is WorkerState.SUCCEEDED:
                self.finished()
            elif result.state in (WorkerState.FAILED, WorkerState.UNHEALTHY):
                codes = [failure.exitcode for failure in result.failures.values()]
                code = codes[0] if codes else None
                pids = {failure.pid for failure in result.failures.values()}
                if self.finished_elsewhere(pids, code):
                    # Into torchrun's exit barrier with the finished nodes, as a success.
                    returned = {worker.global_rank: None for worker in worker_group.workers}
                    return RunResult(state=WorkerState.SUCCEEDED,
                                     return_values={**returned, **result.return_values})
                if not decide(code):
                    agent._remaining_restarts = 0
            return result

        LocalElasticAgent._monitor_workers = monitor_within_budget  # type: ignore[method-assign]


FINISHED_PEER_WAIT = 10.0
"""After a failure of workers past their training loop, how long another node's workers get
to show they finished (they end at about the same time: past the last collective)."""
FINISHED_PEER_LOOK = 0.2
"""How often the other nodes' records are read meanwhile."""

RESTART_STOP_SECONDS = 2
"""How long the surviving workers of a failed group get after SIGTERM before SIGKILL."""


def stop_failed_workers_quickly() -> None:
    """When a worker group failed (a crash, a hang's kill), give its survivors
    :data:`RESTART_STOP_SECONDS` after SIGTERM instead of torchrun's 30 s: their state is
    thrown away (the restart resumes from the checkpoint), and a worker that reads the control
    file ignores a SIGTERM that does not come from ``cycle run``'s decision."""
    import inspect
    import signal

    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

    parameters = inspect.signature(LocalElasticAgent._shutdown).parameters

    def stop_workers(agent: Any, worker_group: Any, is_restart: bool = False) -> None:
        if "timeout" in parameters:
            agent._shutdown(signal.SIGTERM, timeout=RESTART_STOP_SECONDS)
            return
        # An older torch (2.7-2.9) closes the workers inside _shutdown with the 30 s default
        # (2.7 also shuts its rendezvous down unless it restarts): close them first.
        if agent._pcontext is not None:
            agent._pcontext.close(signal.SIGTERM, timeout=RESTART_STOP_SECONDS)
        restart = {"is_restart": is_restart} if "is_restart" in parameters else {}
        agent._shutdown(signal.SIGTERM, **restart)

    LocalElasticAgent._stop_workers = stop_workers  # type: ignore[method-assign]
    _stop_survivors_quickly()


def _stop_survivors_quickly() -> None:
    """The survivors of a worker's failure, as torch's worker contexts find it (before the
    agent's ``_stop_workers``): :data:`RESTART_STOP_SECONDS` in all, not 30 s and more. A
    forked group's ``ProcessContext.join`` waits 30 s, SIGTERMs, waits 30 s more; a fresh
    group's ``_poll`` closes it with the 30 s default. A survivor in a checkpoint's save shields
    itself from SIGTERM, so each such restart took 30 s. Where the end is a stop's
    (:func:`_a_stop_is_under_way`), torch's own times stay: a rank may be writing what the
    stop saves, and the stop's grace bounds it."""
    import inspect

    from torch.distributed.elastic.multiprocessing.api import SubprocessContext
    from torch.multiprocessing.spawn import ProcessContext

    if "grace_period" in inspect.signature(ProcessContext.join).parameters:
        join = ProcessContext.join

        def join_quickly(self: Any, timeout: float | None = None,
                         grace_period: float | None = None) -> bool:
            # grace_period acts only once a process failed: that long to exit by itself,
            # then SIGTERM and that long again, then SIGKILL.
            codes = [process.exitcode for process in self.processes]
            if grace_period is None and any(code not in (None, 0) for code in codes) \
                    and not _a_stop_is_under_way(codes):
                grace_period = RESTART_STOP_SECONDS / 2
            return join(self, timeout, grace_period)

        ProcessContext.join = join_quickly  # type: ignore[method-assign]
    poll = SubprocessContext._poll

    def poll_quickly(self: Any) -> Any:
        close = self.close

        def close_a_failed_group(death_sig: Any = None, timeout: float | None = None) -> None:
            if timeout is None:
                codes = [handler.proc.poll() for handler in self.subprocess_handlers.values()]
                if not _a_stop_is_under_way(codes):
                    timeout = RESTART_STOP_SECONDS
            if timeout is None:
                close(death_sig)
            else:
                close(death_sig, timeout)

        self.close = close_a_failed_group
        try:
            return poll(self)
        finally:
            del self.close

    SubprocessContext._poll = poll_quickly  # type: ignore[method-assign]


def _a_stop_is_under_way(codes: list[int | None]) -> bool:
    """Whether the workers end for a stop, not a failure: ``cycle run`` asked for one (its
    control file), or a worker died of a stop signal (Slurm signals every process at once, and
    a script without a handler dies of it)."""
    from cycler.protocol.control import Action, read_control
    from cycler.protocol.environment import ENV_CONTROL_FILE
    from cycler.protocol.stop_signals import stop_signals

    numbers = set(stop_signals())
    if any(code is not None and code < 0 and -code in numbers for code in codes):
        return True
    control = os.environ.get(ENV_CONTROL_FILE)
    request = None if control is None else read_control(Path(control))
    return request is not None and request.action is Action.CHECKPOINT_AND_EXIT


def fresh_worker_store_each_round() -> None:
    """Give every rendezvous round's workers a new store server (on node 0's agent).

    torch's agent shares one TCPStore server with the workers of every round, and the workers
    use it with no per-attempt prefix ("we create a new TCPStore for every retry", but the
    server and its keys stay): a restarted worker could read the previous round's keys, a dead
    worker's address among them, and fail in ``init_process_group`` with "Gloo
    connectFullMesh failed ... Connection refused". Forgetting the server before each round
    makes node 0's agent start a new one on a new port, published through the round's own
    (prefixed) rendezvous keys; the agent still hosts it, so it outlives the workers (which
    ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` does not: rank 0's worker then hosts the store,
    and a rank still tearing down when rank 0 exits aborts).
    """
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import DynamicRendezvousHandler

    next_rendezvous = DynamicRendezvousHandler.next_rendezvous

    def with_a_fresh_store(handler: DynamicRendezvousHandler) -> Any:
        handler._bootstrap_store_info = None
        handler._shared_tcp_store_server = None
        return next_rendezvous(handler)

    DynamicRendezvousHandler.next_rendezvous = with_a_fresh_store  # type: ignore[method-assign,assignment]


def keep_node_ranks(node_rank: int, nnodes: int) -> None:
    """Make every completed rendezvous of ``nnodes`` nodes give this node group rank
    ``node_rank`` (each node does the same with its own, so the ranks stay a permutation)."""
    from torch.distributed.elastic.rendezvous.api import RendezvousInfo
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import DynamicRendezvousHandler

    next_rendezvous = DynamicRendezvousHandler.next_rendezvous

    def with_node_rank(handler: DynamicRendezvousHandler) -> RendezvousInfo:
        info = next_rendezvous(handler)
        if info.world_size != nnodes or info.bootstrap_store_info is None:
            return info
        return RendezvousInfo(info.store, node_rank, info.world_size, info.bootstrap_store_info)

    DynamicRendezvousHandler.next_rendezvous = with_node_rank  # type: ignore[method-assign,assignment]


def _own_options(arguments: list[str]) -> tuple[dict[str, str], list[str]]:
    """The leading ``--cycle-NAME=VALUE`` options, and torchrun's arguments after them."""
    own: dict[str, str] = {}
    while arguments and arguments[0].startswith("--cycle-"):
        name, _, value = arguments[0][len("--cycle-"):].partition("=")
        own[name] = value
        arguments = arguments[1:]
    return own, arguments


def _budgeted_restarts(own: dict[str, str], stopping: StopSeen) -> BudgetedRestarts | None:
    if "restarts" not in own:
        return None
    layout = CheckpointLayout(own["checkpoints"], own["checkpoint-name"])
    budget = RestartBudget(max_restarts=int(own["restarts"]))
    return BudgetedRestarts(budget, layout, int(own["node-rank"]),
                            restart_delay=float(own.get("restart-delay", "0")),
                            stopping=stopping)


def main(argv: list[str] | None = None) -> None:
    """Run torchrun with ``argv`` (default: this process's arguments)."""
    own, arguments = _own_options(sys.argv[1:] if argv is None else argv)
    stopping = StopSeen(time.time())
    threads_set = "fork" in own and threads_as_torchrun_sets(arguments)
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    quiet = _QuietDuringStop(stopping)
    for name in ("", "torch", "torch.distributed"):
        for handler in logging.getLogger(name).handlers:
            handler.addFilter(quiet)
    ignore_stray(stop_signals())
    stop_failed_workers_quickly()
    restarts = _budgeted_restarts(own, stopping)
    if restarts is not None:
        fresh_worker_store_each_round()
        restarts.install()
    if "fixed-nodes" in own:
        keep_node_ranks(int(own["node-rank"]), int(own["fixed-nodes"]))
    if "fork" in own:
        script = torchrun.get_args_parser().parse_args(arguments).training_script
        if reads_environment_fresh(script) \
                and can_fork_workers([n for n in own["fork"].split(",") if n != "1"]):
            arguments = ["--run-path", "--start-method", "fork", *arguments]
            torchrun.run_script_path = forked.named_worker(script)
            forked.count_clean_exits_as_returns()
            forked.watch_exits_by_pid()
    if threads_set:
        del os.environ[THREADS_VARIABLE]  # torchrun sets it again for the workers, saying so
    try:
        torchrun.main(_handling_only_sigquit(arguments))
    except (ChildFailedError, SignalException) as error:
        if not stopping():
            raise
        sys.stderr.write(f"torchrun: {_summary(error)} during the stop cycle run asked for\n")
        sys.exit(1)


THREADS_VARIABLE = "OMP_NUM_THREADS"


def threads_as_torchrun_sets(arguments: list[str]) -> bool:
    """Set ``$OMP_NUM_THREADS`` to 1 before this process imports torch where torchrun will set
    it for the workers (more than one process per node, not set by the user); whether it did.

    The thread pools of the libraries that ``import torch`` loads (OpenMP's, numpy's OpenBLAS)
    take their size from it once, when they are loaded: in this process, for every forked
    worker. A fresh worker loads them after torchrun set it."""
    if THREADS_VARIABLE in os.environ or _processes_per_node(arguments) <= 1:
        return False
    os.environ[THREADS_VARIABLE] = "1"
    return True


def _processes_per_node(arguments: list[str]) -> int:
    """``--nproc-per-node`` among torchrun's arguments, as ``cycle run`` passes it for forked
    workers (a number); 1 where there is none."""
    names = ("--nproc-per-node", "--nproc_per_node")
    for index, argument in enumerate(arguments):
        name, equals, value = argument.partition("=")
        if name in names:
            value = value if equals else (arguments[index + 1:index + 2] or [""])[0]
            return int(value) if value.isdigit() else 1
    return 1


def reads_environment_fresh(script: str) -> bool:
    """Whether a forked worker sees the environment ``script`` sets as a fresh one does: not
    where the script writes a variable before it imports torch, which torch (and what it loads)
    read at import, in the agent for a forked worker. Such a script's workers start fresh, with
    one line on stderr saying why."""
    source = read_source(script)
    write = None if source is None else environment_set_before_torch(source)
    if write is None:
        return True
    sys.stderr.write(f"cycle: {script} sets {write.name} (line {write.line}) before it imports "
                     "torch, which a forked worker has imported already: the workers start as "
                     "fresh processes, so that torch reads it\n")
    return False


FORK_SINCE = (2, 10)
"""The oldest torch whose workers are forked. On torch 2.7.1 a forked worker hung in one start
of ten at its end (gloo's thread waiting for the GIL to drop a tensor while the main thread,
holding the GIL, joins it in ``~ProcessGroupGloo``; never seen with fresh workers there, nor
in 20 starts on torch 2.13); versions between were not tried."""


def _release(version: str) -> tuple[int, ...]:
    """``(2, 13)`` for ``2.13.0+cpu`` or ``2.13.0a0+git...``."""
    return tuple(int(part) for part in version.split("+")[0].split(".")[:2] if part.isdigit())


def can_fork_workers(more: list[str]) -> bool:
    """Load what workers import (:func:`.forked.preload`, and the modules ``more``); whether
    the workers may be forked from this process: not on a torch older than
    :data:`FORK_SINCE`, nor where CUDA is initialised or a forked child could not initialise it
    (:func:`.forked.fork_is_bad`)."""
    import torch

    if _release(torch.__version__) < FORK_SINCE:
        return False
    forked.preload(more)
    forked.freeze_for_fork()
    if torch.cuda.is_initialized() or forked.fork_is_bad():
        sys.stderr.write("cycle: CUDA was set up in torchrun's agent, so a forked worker could "
                         "not use it: the workers start as fresh processes\n")
        return False
    return True


def _handling_only_sigquit(arguments: list[str]) -> list[str]:
    """torchrun's arguments, told to handle SIGQUIT only: ``--signals-to-handle`` where torchrun
    has it (torch 2.10 and newer). An older torchrun gives SIGTERM, SIGINT, SIGHUP and SIGQUIT
    its own handler when it starts the workers, looked up by name then: the stop signals get
    the shield's instead."""
    from torch.distributed import run as torchrun

    parser = torchrun.get_args_parser()
    if any("--signals-to-handle" in action.option_strings for action in parser._actions):
        return ["--signals-to-handle", "SIGQUIT", *arguments]
    from torch.distributed.elastic.multiprocessing import api

    stops, terminate = set(stop_signals()), api._terminate_process_handler

    def handler(number: int, frame: Any) -> None:
        (on_stray_signal if number in stops else terminate)(number, frame)

    api._terminate_process_handler = handler  # type: ignore[assignment]
    return arguments


def _summary(error: Exception) -> str:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    if isinstance(error, ChildFailedError):
        codes = sorted({failure.exitcode for failure in error.failures.values()})
        return f"workers ended with exit code {', '.join(map(str, codes))}"
    return f"torchrun got {error}"


if __name__ == "__main__":
    main()
