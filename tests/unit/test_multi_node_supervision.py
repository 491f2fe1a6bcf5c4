"""What one node's supervisor decides about the others: the shared restart budget, the
heartbeats through the checkpoint root, and the end of a job whose other node is gone."""

from __future__ import annotations

import json
import signal
from dataclasses import replace
from pathlib import Path

import pytest

from cycler.checkpoint.layout import CheckpointLayout
from cycler.protocol.events import read_events
from cycler.protocol.exit_codes import EXIT_FAILURE, EXIT_REQUEUE
from cycler.protocol.record import RunRecord
from cycler.supervisor.decisions.budget import RestartBudget
from cycler.supervisor.decisions.core import (
    CheckpointCommitted,
    CoreConfig,
    Exit,
    Log,
    PeerLost,
    Phase,
    Requeue,
    SignalReceived,
    SignalTree,
    StartWorkers,
    SupervisorAction,
    SupervisorCore,
    Tick,
    WorkersExited,
)
from cycler.supervisor.nodes.peers import Heartbeat, PeerWatch

MULTI_NODE = CoreConfig(grace=30.0, kill_after=2.0, restarts_by_torchrun=True, requeue=True,
                        initial_checkpoint=4)


def kinds(actions: list[SupervisorAction]) -> list[str]:
    return [type(action).__name__ for action in actions]


def exit_code(actions: list[SupervisorAction]) -> int:
    (found,) = [action for action in actions if isinstance(action, Exit)]
    return found.code


# --- the budget --------------------------------------------------------------------------------


def test_the_budget_counts_only_failures_since_the_last_checkpoint():
    budget = RestartBudget(max_restarts=2, crash_loop_limit=10)
    assert budget.failure() is None and budget.failure() is None
    budget.progress()
    assert budget.failure() is None and budget.failure() is None, "the whole budget came back"
    assert "restarts (--max-restarts)" in (budget.failure() or "")


def test_failures_in_a_row_without_a_checkpoint_are_a_crash_loop_whatever_the_budget():
    budget = RestartBudget(max_restarts=100, crash_loop_limit=3)
    assert budget.failure() is None and budget.failure() is None
    assert "crash loop" in (budget.failure() or "")


def test_no_restarts_allowed_means_the_first_failure_ends_the_job():
    assert RestartBudget(max_restarts=0).failure() is not None


# --- the core with several nodes ---------------------------------------------------------------


def test_a_failed_torchrun_on_a_multi_node_job_ends_it_since_torchrun_already_restarted():
    core = SupervisorCore(MULTI_NODE)
    core.start(100.0)
    actions = core.handle(WorkersExited(1, 130.0))
    assert exit_code(actions) == EXIT_FAILURE
    assert not any(isinstance(action, StartWorkers) for action in actions)


def test_a_lost_node_ends_the_workers_and_the_job_resumes_from_the_checkpoint_by_requeue():
    core = SupervisorCore(MULTI_NODE)
    core.start(100.0)
    core.handle(CheckpointCommitted(5, 110.0))
    actions = core.handle(PeerLost(1, "is gone", 120.0))
    # SIGKILL at once: nothing can be saved without node 1, and a TERM only met the shield.
    assert [a.signal for a in actions if isinstance(a, SignalTree)] == [signal.SIGKILL]
    assert core.phase is Phase.KILLED and core.handle(Tick(130.0)) == []
    actions = core.handle(WorkersExited(-9, 120.1))
    assert exit_code(actions) == EXIT_REQUEUE
    assert any(isinstance(action, Requeue) for action in actions)
    (last,) = [action for action in actions if isinstance(action, Exit)]
    assert "node 1 is gone" in last.reason and "checkpoint 5" in last.reason


def test_a_node_that_failed_fails_the_job_and_nothing_is_requeued():
    core = SupervisorCore(MULTI_NODE)
    core.start(100.0)
    core.handle(PeerLost(2, "failed (its supervisor exited 1)", 120.0, failed=True))
    actions = core.handle(WorkersExited(-15, 121.0))
    assert exit_code(actions) == EXIT_FAILURE
    assert not any(isinstance(action, Requeue) for action in actions)


def test_a_node_found_failed_before_the_start_ends_the_job_without_starting_workers():
    core = SupervisorCore(MULTI_NODE)
    actions = core.lost_before_start(PeerLost(1, "failed (its supervisor exited 1)", 100.0,
                                              failed=True))
    assert "StartWorkers" not in kinds(actions) and "SignalTree" not in kinds(actions)
    assert exit_code(actions) == EXIT_FAILURE
    assert core.handle(PeerLost(1, "is gone", 101.0)) == []


def test_a_node_that_requeued_before_the_start_requeues_this_one_from_the_checkpoint():
    core = SupervisorCore(MULTI_NODE)
    actions = core.lost_before_start(PeerLost(0, "ended the job with exit 75", 100.0))
    assert exit_code(actions) == EXIT_REQUEUE
    assert any(isinstance(action, Requeue) for action in actions)


def test_a_lost_node_without_any_checkpoint_ends_the_job_with_1():
    core = SupervisorCore(replace(MULTI_NODE, initial_checkpoint=None))
    core.start(100.0)
    core.handle(PeerLost(1, "is gone", 120.0))
    assert exit_code(core.handle(WorkersExited(-15, 121.0))) == EXIT_FAILURE


def test_a_node_lost_during_a_stop_ends_the_wait_for_the_agreed_checkpoint_at_once():
    core = SupervisorCore(MULTI_NODE)
    core.start(100.0)
    core.handle(SignalReceived("SIGTERM", 110.0))
    assert core.phase is Phase.STOPPING
    actions = core.handle(PeerLost(1, "is gone", 111.0))
    assert "peer_lost" in [a.event for a in actions if isinstance(a, Log)]
    assert core.phase is Phase.KILLED, "the agreed step can never come without node 1"
    assert core.handle(PeerLost(1, "is gone", 112.0)) == [], "reported once"


# --- heartbeats --------------------------------------------------------------------------------


@pytest.fixture
def run_record(tmp_path: Path) -> RunRecord:
    run_record = RunRecord(tmp_path)
    run_record.directory.mkdir()
    return run_record


def test_a_node_that_beat_and_then_went_silent_is_lost_after_the_timeout(
        run_record: RunRecord) -> None:
    other, watch = Heartbeat(run_record, 1), PeerWatch(run_record, 0, 2, timeout=5.0)
    other.beat(0.0)
    assert watch.lost(0.0) is None
    other.beat(1.0)
    assert watch.lost(1.0) is None, "seen alive"
    assert watch.lost(5.5) is None, "4.5 s of silence is within the timeout"
    loss = watch.lost(6.5)
    assert loss is not None and loss.node == 1 and not loss.failed
    assert "not been heard for 6 s" in loss.why


def test_a_record_left_by_an_earlier_run_is_never_taken_for_a_lost_node(
        run_record: RunRecord) -> None:
    Heartbeat(run_record, 1).beat(0.0)  # the earlier run's last beat; no one beats any more
    watch = PeerWatch(run_record, 0, 2, timeout=5.0)
    assert [watch.lost(now) for now in (100.0, 200.0, 500.0)] == [None, None, None]
    # Past the start timeout node 1 never came: said as such, never as "gone".
    loss = watch.lost(800.0)
    assert loss is not None and "never started" in loss.why


def test_a_node_whose_supervisor_exited_1_is_lost_at_once_and_one_that_stopped_is_not(
        run_record: RunRecord) -> None:
    failing, stopping = Heartbeat(run_record, 1), Heartbeat(run_record, 2)
    watch = PeerWatch(run_record, 0, 3, timeout=5.0)
    failing.beat(0.0)
    stopping.beat(0.0)
    watch.lost(0.0)
    stopping.finish(EXIT_REQUEUE)
    assert watch.lost(1.0) is None
    assert watch.lost(60.0) is None, "an ended node that said so is never silent"
    failing.finish(EXIT_FAILURE)
    loss = watch.lost(61.0)
    assert loss is not None and loss.node == 1 and loss.failed


def test_heartbeats_are_written_at_most_once_a_second_and_readable_as_json(
        run_record: RunRecord) -> None:
    beat = Heartbeat(run_record, 3)
    beat.beat(10.0)
    beat.beat(10.5)
    record = json.loads(run_record.heartbeat_path(3).read_text())
    assert record["beat"] == 1 and record["node"] == 3 and record["exit_code"] is None
    beat.beat(11.0)
    assert json.loads(run_record.heartbeat_path(3).read_text())["beat"] == 2


AWAITING = replace(MULTI_NODE, peer_verdict_wait=30.0)


def test_a_failed_torchrun_waits_for_the_peers_verdict_and_node_0_gone_is_a_requeue():
    core = SupervisorCore(AWAITING)
    core.start(100.0)
    actions = core.handle(WorkersExited(1, 120.0))  # the store on node 0 is gone
    assert core.phase is Phase.AWAITING_PEERS and core.wake_at == 150.0
    assert not [a for a in actions if isinstance(a, Exit)]
    actions = core.handle(PeerLost(0, "is gone", 131.0))
    assert exit_code(actions) == EXIT_REQUEUE
    assert any(isinstance(action, Requeue) for action in actions)


def test_a_failed_torchrun_with_every_peer_alive_fails_when_the_wait_is_over():
    core = SupervisorCore(AWAITING)
    core.start(100.0)
    core.handle(WorkersExited(1, 120.0))
    assert core.handle(Tick(149.0)) == []
    actions = core.handle(Tick(150.0))
    assert exit_code(actions) == EXIT_FAILURE


def test_a_stop_while_awaiting_the_peers_verdict_ends_as_a_stop():
    core = SupervisorCore(AWAITING)
    core.start(100.0)
    core.handle(WorkersExited(1, 120.0))
    actions = core.handle(SignalReceived("SIGTERM", 121.0))
    assert exit_code(actions) == EXIT_REQUEUE


def test_agent_restarts_follow_the_restart_delay_backoff(tmp_path: Path) -> None:
    from cycler.supervisor.launch.launcher import BudgetedRestarts

    slept: list[float] = []
    restarts = BudgetedRestarts(RestartBudget(max_restarts=5), CheckpointLayout(tmp_path), 1,
                                restart_delay=1.0, sleep=slept.append)
    assert all(restarts.allows_restart(1) for _ in range(4))
    assert slept == [1.0, 2.0, 4.0, 8.0]


def test_a_failure_during_a_stop_is_never_restarted_by_the_agent_nor_counted(
        tmp_path: Path) -> None:
    from cycler.supervisor.launch.launcher import BudgetedRestarts

    stopping = [False]
    budget = RestartBudget(max_restarts=1)
    restarts = BudgetedRestarts(budget, CheckpointLayout(tmp_path), 1, sleep=lambda _: None,
                                stopping=lambda: stopping[0])
    stopping[0] = True  # another node's supervisor asked for checkpoint_and_exit
    assert not any(restarts.allows_restart(1) for _ in range(3)), "no restart during a stop"
    assert budget.failures_without_progress == 0, "a preemption uses none of the budget"
    stopping[0] = False  # the next run (requeued): its first failure has the whole budget
    assert restarts.allows_restart(1)
    events = [e["event"] for e in read_events(RunRecord(tmp_path).events_path(1))]
    assert events == ["no_restart_during_stop"] * 3 + ["restart_together"]


def test_a_failure_after_the_training_loop_counts_as_finished_once_another_node_finished(
        tmp_path: Path) -> None:
    import os

    from cycler.protocol.progress import AFTER_THE_LOOP, PAUSED, Beacon
    from cycler.supervisor.launch.launcher import FINISHED_PEER_WAIT, BudgetedRestarts

    layout = CheckpointLayout(tmp_path)
    layout.record.directory.mkdir()
    layout.record.workers_finished_path(1).touch()  # node 1's record of an earlier run
    slept: list[float] = []
    node1 = BudgetedRestarts(RestartBudget(max_restarts=5), layout, 1, sleep=slept.append)
    assert not layout.record.workers_finished_path(1).exists(), "an earlier run's record goes first"
    layout.record.progress_dir(1).mkdir()
    beacon = Beacon(layout.record.progress_dir(1) / "rank-1.beacon")
    me = {os.getpid()}
    assert not node1.finished_elsewhere(me, 3), "still training: a crash like any other"
    beacon.mark(PAUSED, AFTER_THE_LOOP)
    assert not node1.finished_elsewhere(me, 3), "nobody finished: restart"
    assert sum(slept) == pytest.approx(FINISHED_PEER_WAIT), "after waiting for them"
    BudgetedRestarts(RestartBudget(max_restarts=5), layout, 0).finished()
    assert not node1.finished_elsewhere({me.pop() + 1}, 3), "another worker failed"
    assert node1.finished_elsewhere({os.getpid()}, 3)
    events = read_events(layout.record.events_path(1))
    assert [e["event"] for e in events] == ["failed_after_training"]


def test_a_stop_while_torchrun_waits_in_the_rendezvous_ends_at_once():
    core = SupervisorCore(MULTI_NODE)
    core.start(100.0)
    actions = core.handle(SignalReceived("SIGTERM", 101.0, workers_started=False))
    assert [a.signal for a in actions if isinstance(a, SignalTree)] == [signal.SIGKILL]
    assert core.wake_at is None, "no grace to wait out"
    actions = core.handle(WorkersExited(-9, 101.2))
    assert exit_code(actions) == EXIT_REQUEUE  # checkpoint 4 exists


def test_a_stop_before_any_worker_started_without_a_checkpoint_ends_with_1():
    core = SupervisorCore(replace(MULTI_NODE, initial_checkpoint=None))
    core.start(100.0)
    core.handle(SignalReceived("SIGTERM", 101.0, workers_started=False))
    assert exit_code(core.handle(WorkersExited(-9, 101.2))) == EXIT_FAILURE


def test_a_node_that_failed_in_this_run_before_this_one_looked_is_lost_at_once(
        run_record: RunRecord) -> None:
    failed = Heartbeat(run_record, 1, run="slurm-7-0")
    failed.beat(0.0)
    failed.finish(EXIT_FAILURE)  # before node 0's supervisor ever read the records
    loss = PeerWatch(run_record, 0, 2, timeout=5.0, run="slurm-7-0").lost(50.0)
    assert loss is not None and loss.node == 1 and loss.failed


def test_an_earlier_runs_failed_record_never_counts_for_this_run(
        run_record: RunRecord) -> None:
    earlier = Heartbeat(run_record, 1, run="slurm-7-0")
    earlier.beat(0.0)
    earlier.finish(EXIT_FAILURE)
    watch = PeerWatch(run_record, 0, 2, timeout=5.0, run="slurm-7-1")  # the requeued run
    assert watch.lost(50.0) is None
    Heartbeat(run_record, 1, run="slurm-7-1").beat(52.0)
    assert watch.lost(52.0) is None


def test_a_node_never_heard_is_said_after_the_timeout_and_lost_after_the_start_timeout(
        run_record: RunRecord) -> None:
    watch = PeerWatch(run_record, 0, 2, timeout=5.0, start_timeout=60.0)
    assert watch.lost(0.0) is None and watch.waiting(1.0) == []
    assert watch.lost(6.0) is None
    assert watch.waiting(6.0) == [1] and watch.waiting(7.0) == [], "said once"
    loss = watch.lost(61.0)
    assert loss is not None and loss.failed and "never started" in loss.why


def test_a_peer_unheard_while_the_workers_train_does_not_share_the_checkpoint_root(
        run_record: RunRecord) -> None:
    watch = PeerWatch(run_record, 0, 2, timeout=5.0)
    assert watch.lost(0.0) is None
    assert watch.lost(10.0, stepping=True) is None  # the rendezvous just completed
    loss = watch.lost(16.0, stepping=True)
    assert loss is not None and "do not share the checkpoint root" in loss.why


def test_a_node_seen_alive_that_ended_the_job_with_75_is_the_verdict_of_a_thawed_node(
        run_record: RunRecord) -> None:
    ender, stale = Heartbeat(run_record, 1), Heartbeat(run_record, 2)
    stale.finish(EXIT_REQUEUE)  # an earlier run's record: never seen alive in this one
    watch = PeerWatch(run_record, 0, 3, timeout=5.0)
    ender.beat(0.0)
    watch.lost(0.0)
    assert watch.requeued() is None
    ender.finish(EXIT_REQUEUE)  # it gave this node up while this one was frozen
    assert watch.lost(60.0) is None
    loss = watch.requeued()
    assert loss is not None and loss.node == 1 and not loss.failed


def test_held_tracebacks_are_logged_and_summed_up_or_shown_after_all(tmp_path: Path) -> None:
    import os

    from cycler.supervisor.launch.processes import StderrTail

    def tail(text: bytes, then: str) -> tuple[bytes, bytes]:
        source, sink = os.pipe(), os.pipe()
        stderr = StderrTail(os.fdopen(source[0], "rb"), echo_fd=sink[1])
        log = tmp_path / f"{then}.log"
        stderr.hold_tracebacks(log, seconds=600)
        os.write(source[1], text)
        os.close(source[1])
        stderr.wait(5)  # everything read, held or shown
        if then == "summarise":
            assert stderr.summarise() == (3, log)
        else:
            stderr.release()
        os.close(sink[1])
        with os.fdopen(sink[0], "rb") as shown:
            return shown.read(), log.read_bytes()

    before = b"epoch 1\n"
    traceback = (b"[rank1]: Traceback (most recent call last):\n[rank1]:   File train.py\n"
                 b"[rank1]: RuntimeError: Connection reset by peer\n")
    assert tail(before + traceback, "summarise") == (before, traceback)
    assert tail(before + traceback, "release") == (before + traceback, traceback)
    cpp = (b"[W1127 TCPStore.cpp:106] [c10d] sendBytes failed: Broken pipe\n"
           b"Exception raised from sendBytes at Utils.hpp:758 (most recent call first):\n"
           b"frame #0: c10::Error::Error\n")
    assert tail(before + cpp, "summarise")[0] == before
