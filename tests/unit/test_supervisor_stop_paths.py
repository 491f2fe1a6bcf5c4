"""How a stop reaches scripts that speak the control file, only save, or know nothing of cycler.

Pure core tests: each path from the signal to the exit code, with no process, file or clock.
"""

from __future__ import annotations

import signal

import pytest

from cycler.protocol.exit_codes import EXIT_FAILURE, EXIT_REQUEUE, EXIT_SUCCESS
from cycler.protocol.features import USES_CONTROL, USES_CYCLER, USES_OWN_HANDLER, USES_SAVER
from cycler.supervisor.decisions.core import (
    Announced,
    CheckpointCommitted,
    CoreConfig,
    Exit,
    Log,
    Phase,
    Requeue,
    SignalReceived,
    SignalTree,
    SignalWorkers,
    StopPath,
    SupervisorAction,
    SupervisorCore,
    Tick,
    WorkersExited,
    stop_path,
)

CONFIG = CoreConfig(grace=30.0, kill_after=2.0, undecided_wait=5.0, initial_checkpoint=3)
PLAIN: frozenset[str] = frozenset()


def started(config: CoreConfig = CONFIG) -> SupervisorCore:
    core = SupervisorCore(config)
    core.start(100.0)
    return core


def of_type(actions: list[SupervisorAction], kind: type) -> list:
    return [action for action in actions if isinstance(action, kind)]


def logged(actions: list[SupervisorAction]) -> dict[str, dict]:
    return {action.event: action.fields for action in of_type(actions, Log)}


@pytest.mark.parametrize(("features", "path"), [
    ({USES_CYCLER, USES_CONTROL, USES_SAVER}, StopPath.AGREED_STEP),
    ({USES_CONTROL}, StopPath.AGREED_STEP),
    ({USES_CYCLER, USES_SAVER}, StopPath.NEXT_COMMIT),
    ({USES_CYCLER}, StopPath.UNDECIDED),
    (set(), StopPath.SIGNAL),
])
def test_the_stop_path_follows_what_the_workers_announced(features: set[str], path: StopPath):
    assert stop_path(frozenset(features)) is path


def test_a_control_file_reader_is_not_signalled_and_gets_the_whole_grace():
    core = started()
    actions = core.handle(SignalReceived("SIGTERM", 150.0, frozenset({USES_CONTROL})))
    assert of_type(actions, SignalWorkers) == [] and of_type(actions, SignalTree) == []
    assert logged(actions)["stop_requested"]["path"] == "agreed_step"
    assert core.wake_at == 180.0


def test_a_plain_script_gets_the_signal_at_once_and_a_clean_exit_is_a_requeue():
    core = started(CoreConfig(grace=30.0))
    actions = core.handle(SignalReceived("SIGHUP", 150.0, PLAIN))
    assert of_type(actions, SignalWorkers) == [SignalWorkers(signal.SIGHUP)]
    assert logged(actions)["stop_requested"]["path"] == "signal"
    end = core.handle(WorkersExited(0, 151.0))
    (done,) = of_type(end, Exit)
    assert done.code == EXIT_REQUEUE and "handled SIGHUP" in done.reason
    assert "stop_handled_by_script" in logged(end)


def test_a_plain_script_killed_by_the_signal_with_no_checkpoint_is_not_requeued():
    core = started(CoreConfig(grace=30.0))
    core.handle(SignalReceived("SIGTERM", 150.0, PLAIN))
    (done,) = of_type(core.handle(WorkersExited(1, 150.2)), Exit)
    assert done.code == EXIT_FAILURE


def test_a_plain_script_killed_by_the_signal_resumes_from_the_last_checkpoint():
    core = started()
    core.handle(SignalReceived("SIGTERM", 150.0, PLAIN))
    end = core.handle(WorkersExited(1, 150.2))
    assert of_type(end, Exit)[0].code == EXIT_REQUEUE
    assert logged(end)["stop_without_new_checkpoint"] == {"resume_from": 3}


def test_a_saver_only_script_is_ended_right_after_its_next_commit():
    core = started()
    actions = core.handle(SignalReceived("SIGTERM", 150.0, frozenset({USES_CYCLER, USES_SAVER})))
    assert logged(actions)["stop_requested"]["path"] == "next_commit"
    assert of_type(actions, SignalWorkers) == []
    actions = core.handle(CheckpointCommitted(4, 157.0))
    # cycle's own TERM after the stop checkpoint: the stray-signal shield lets it through.
    assert of_type(actions, SignalWorkers) == [SignalWorkers(signal.SIGTERM, through_shield=True)]
    assert "stop_after_commit" in logged(actions)
    assert core.phase is Phase.TERMINATING and core.wake_at == 159.0
    end = core.handle(WorkersExited(1, 157.1))
    assert of_type(end, Exit)[0].code == EXIT_REQUEUE
    assert "stop_without_new_checkpoint" not in logged(end)


def test_a_saver_only_script_that_commits_nothing_is_stopped_when_the_grace_ends():
    core = started()
    core.handle(SignalReceived("SIGTERM", 150.0, frozenset({USES_SAVER})))
    assert of_type(core.handle(Tick(180.0)), SignalTree) == [SignalTree(signal.SIGTERM)]


def test_a_script_still_starting_is_waited_for_and_takes_the_path_it_announces():
    core = started()
    actions = core.handle(SignalReceived("SIGTERM", 150.0, frozenset({USES_CYCLER})))
    assert logged(actions)["stop_requested"]["path"] == "undecided"
    assert core.awaiting_announcement and core.wake_at == 155.0
    assert core.handle(Announced(frozenset({USES_CYCLER}), 151.0)) == []
    actions = core.handle(Announced(frozenset({USES_CYCLER, USES_CONTROL}), 152.0))
    assert logged(actions)["stop_requested"]["path"] == "agreed_step"
    assert not core.awaiting_announcement and core.wake_at == 180.0


def test_a_script_that_says_nothing_more_is_treated_as_plain_after_the_wait():
    core = started()
    core.handle(SignalReceived("SIGTERM", 150.0, frozenset({USES_CYCLER})))
    actions = core.handle(Tick(155.0))
    assert of_type(actions, SignalWorkers) == [SignalWorkers(signal.SIGTERM)]
    assert core.phase is Phase.STOPPING and core.wake_at == 180.0


def test_the_wait_for_announcements_never_passes_the_grace():
    core = started(CoreConfig(grace=2.0, undecided_wait=5.0, initial_checkpoint=3))
    core.handle(SignalReceived("SIGTERM", 150.0, frozenset({USES_CYCLER})))
    assert core.wake_at == 152.0
    assert of_type(core.handle(Tick(152.0)), SignalTree) == [SignalTree(signal.SIGTERM)]


SAVER_WITH_HANDLER = frozenset({USES_CYCLER, USES_SAVER, USES_OWN_HANDLER})


@pytest.mark.parametrize("name", ["SIGTERM", "SIGINT", "NOTICE"])
def test_a_saver_script_with_its_own_handler_gets_sigterm_at_once(name: str):
    core = started(CoreConfig(grace=30.0, initial_checkpoint=3,
                              stop_signals=frozenset({"SIGTERM", "SIGINT", "NOTICE"})))
    actions = core.handle(SignalReceived(name, 150.0, SAVER_WITH_HANDLER))
    assert logged(actions)["stop_requested"]["path"] == "signal"
    assert of_type(actions, SignalWorkers) == [SignalWorkers(signal.SIGTERM)]


def test_a_step_control_script_with_its_own_handler_still_stops_at_the_agreed_step():
    assert stop_path(SAVER_WITH_HANDLER | {USES_CONTROL}) is StopPath.AGREED_STEP


def test_a_handler_announced_while_a_stop_waits_for_a_commit_gets_the_signal_then():
    core = started()
    core.handle(SignalReceived("SIGTERM", 150.0, frozenset({USES_CYCLER, USES_SAVER})))
    assert core.listening
    actions = core.handle(Announced(SAVER_WITH_HANDLER, 151.0))
    assert logged(actions)["stop_requested"]["path"] == "signal"
    assert of_type(actions, SignalWorkers) == [SignalWorkers(signal.SIGTERM)]
    assert not core.listening and core.wake_at == 180.0
    assert core.handle(Announced(SAVER_WITH_HANDLER, 152.0)) == []


# --- a stop that finds the training done --------------------------------------------------------


def test_a_stop_after_the_loops_ran_to_their_end_finishes_the_job_without_a_requeue():
    core = started()
    core.handle(SignalReceived("SIGTERM", 150.0, frozenset({USES_CYCLER, USES_CONTROL})))
    end = core.handle(WorkersExited(0, 151.0, training_ended=True))
    (done,) = of_type(end, Exit)
    assert done.code == EXIT_SUCCESS and done.reason == "the training script finished"
    assert "stop_after_training" in logged(end) and not of_type(end, Requeue)
    assert not core.stopped


def test_a_saver_only_script_that_exits_0_before_its_next_commit_had_finished():
    core = started()
    core.handle(SignalReceived("SIGTERM", 150.0, frozenset({USES_CYCLER, USES_SAVER})))
    (done,) = of_type(core.handle(WorkersExited(0, 151.0)), Exit)
    assert done.code == EXIT_SUCCESS


@pytest.mark.parametrize("features", [frozenset({USES_CYCLER, USES_CONTROL}), PLAIN])
def test_workers_the_stop_reached_still_exit_75(features: frozenset[str]):
    core = started(CoreConfig(grace=30.0, initial_checkpoint=3, requeue=True))
    core.handle(SignalReceived("SIGTERM", 150.0, features))
    end = core.handle(WorkersExited(0, 151.0))  # loops a stop ended, or a handler's exit 0
    assert of_type(end, Exit)[0].code == EXIT_REQUEUE and of_type(end, Requeue)


def test_workers_that_exit_0_after_the_grace_sent_them_sigterm_were_stopped():
    core = started()
    core.handle(SignalReceived("SIGTERM", 150.0, frozenset({USES_CYCLER, USES_CONTROL})))
    core.handle(Tick(180.0))  # the grace is over: SIGTERM to the tree
    end = core.handle(WorkersExited(0, 181.0, training_ended=True))
    assert of_type(end, Exit)[0].code == EXIT_REQUEUE
