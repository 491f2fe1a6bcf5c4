"""The supervisor's decision core, path by path, with no process, file or clock."""

from __future__ import annotations

import signal
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cycler.protocol.control import Action
from cycler.protocol.exit_codes import (
    EXIT_FAILURE,
    EXIT_NOT_PERSISTED,
    EXIT_REQUEUE,
    EXIT_SUCCESS,
)
from cycler.protocol.features import USES_CONTROL
from cycler.supervisor.decisions.core import (
    STOP_ELSEWHERE,
    CheckpointCommitted,
    CoreConfig,
    Event,
    Exit,
    HangDetected,
    LandingReport,
    LandNewest,
    Log,
    Phase,
    Requeue,
    SignalReceived,
    SignalTree,
    SignalWorkers,
    StartWorkers,
    SupervisorAction,
    SupervisorCore,
    Tick,
    WorkersExited,
    WriteControl,
)
from cycler.supervisor.decisions.failure_kinds import FailureKind, WorkerFailure

NO_CUDA = WorkerFailure(FailureKind.OTHER, "RuntimeError: no CUDA", "E: no CUDA")
ANOTHER = WorkerFailure(FailureKind.OTHER, "RuntimeError: another", "E: another")
CONFIG = CoreConfig(grace=30.0, max_restarts=5, restart_delay=1.0, max_restart_delay=8.0,
                    kill_after=2.0)


def started(config: CoreConfig = CONFIG, now: float = 100.0) -> SupervisorCore:
    core = SupervisorCore(config)
    core.start(now)
    return core


def of_type(actions: list[SupervisorAction], kind: type) -> list:
    return [action for action in actions if isinstance(action, kind)]


def exit_of(actions: list[SupervisorAction]) -> Exit:
    (found,) = of_type(actions, Exit)
    return found


def logged(actions: list[SupervisorAction]) -> list[str]:
    return [action.event for action in of_type(actions, Log)]


# --- starting ---------------------------------------------------------------------------------


def test_start_resets_the_control_file_to_run_and_starts_the_first_workers():
    core = SupervisorCore(replace(CONFIG, first_sequence=7, resume_from="AtomicDirectory_3"))
    actions = core.start(100.0)
    (write,) = of_type(actions, WriteControl)
    assert write.request.action is Action.RUN and write.request.sequence == 7
    assert of_type(actions, StartWorkers) == [StartWorkers(0, "AtomicDirectory_3")]
    assert core.phase is Phase.RUNNING and core.wake_at is None


def test_workers_that_exit_zero_without_a_request_finish_the_job():
    actions = started().handle(WorkersExited(0, 200.0))
    assert exit_of(actions).code == EXIT_SUCCESS


# --- stopping on request ----------------------------------------------------------------------


def test_a_stop_signal_writes_checkpoint_and_exit_with_the_grace_deadline():
    core = started(replace(CONFIG, first_sequence=4))
    actions = core.handle(SignalReceived("SIGTERM", 150.0))
    (write,) = of_type(actions, WriteControl)
    request = write.request
    assert request.action is Action.CHECKPOINT_AND_EXIT
    assert request.reason == "SIGTERM" and request.sequence == 5
    assert request.requested_at == 150.0 and request.deadline == 180.0
    assert core.phase is Phase.STOPPING and core.wake_at == 180.0
    assert not of_type(actions, SignalTree), "the supervisor never signals torchrun on a request"


def test_a_clean_stop_after_a_new_checkpoint_exits_75_without_warning():
    core = started(replace(CONFIG, initial_checkpoint=2))
    core.handle(SignalReceived("SIGTERM", 150.0))
    core.handle(CheckpointCommitted(3))
    actions = core.handle(WorkersExited(0, 152.0))
    assert exit_of(actions).code == EXIT_REQUEUE
    assert "stop_without_new_checkpoint" not in logged(actions)


def test_a_clean_stop_without_a_new_checkpoint_still_exits_75_with_a_warning():
    core = started(replace(CONFIG, initial_checkpoint=2))
    core.handle(SignalReceived("SIGTERM", 150.0))
    actions = core.handle(WorkersExited(0, 152.0))
    assert exit_of(actions).code == EXIT_REQUEUE
    warning = of_type(actions, Log)[1]
    assert warning.event == "stop_without_new_checkpoint" and warning.warning


def test_a_stop_that_leaves_no_checkpoint_at_all_exits_1():
    core = started()
    core.handle(SignalReceived("SIGTERM", 150.0))
    actions = core.handle(WorkersExited(0, 152.0))
    assert exit_of(actions).code == EXIT_FAILURE
    assert not exit_of(actions).workers_failed


def test_workers_crashing_while_stopping_exit_75_when_an_older_checkpoint_exists():
    core = started(replace(CONFIG, initial_checkpoint=0))
    core.handle(SignalReceived("SIGHUP", 150.0))
    actions = core.handle(WorkersExited(1, 151.0))
    assert exit_of(actions).code == EXIT_REQUEUE
    assert "stop_without_new_checkpoint" in logged(actions)
    assert not of_type(actions, StartWorkers), "a stop is never followed by a restart"


def test_slurm_cont_and_term_sent_twice_make_exactly_one_request():
    core = started()
    actions: list[SupervisorAction] = []
    for name, now in [("SIGCONT", 150.0), ("SIGTERM", 150.1), ("SIGCONT", 160.0),
                      ("SIGTERM", 160.1)]:
        actions += core.handle(SignalReceived(name, now))
    assert len(of_type(actions, WriteControl)) == 1
    assert core.wake_at == 180.1, "the first TERM's deadline stands"


def test_sigcont_is_logged_and_changes_nothing():
    core = started()
    actions = core.handle(SignalReceived("SIGCONT", 150.0))
    assert actions == [Log("signal", {"signal": "SIGCONT", "effect": "ignored"})]
    assert core.phase is Phase.RUNNING and not core.stop_requested
    assert exit_of(core.handle(WorkersExited(0, 160.0))).code == EXIT_SUCCESS


def test_only_the_configured_signals_request_a_stop():
    core = started(replace(CONFIG, stop_signals=frozenset({"SIGUSR1"})))
    assert not of_type(core.handle(SignalReceived("SIGTERM", 150.0)), WriteControl)
    assert of_type(core.handle(SignalReceived("SIGUSR1", 151.0)), WriteControl)


def test_another_node_s_stop_relayed_here_asks_the_workers_and_ends_as_this_node_s_stop():
    core = started(replace(CONFIG, initial_checkpoint=1))
    actions = core.handle(SignalReceived(STOP_ELSEWHERE, 150.0, frozenset({USES_CONTROL})))
    (write,) = of_type(actions, WriteControl)
    assert write.request.action is Action.CHECKPOINT_AND_EXIT
    assert write.request.reason == STOP_ELSEWHERE, "the shell does not announce it again"
    assert core.phase is Phase.STOPPING and core.wake_at == 180.0
    core.handle(CheckpointCommitted(2, 151.0))
    assert core.stop_checkpoint_made, "the shell may cut torchrun's teardown short"
    actions = core.handle(WorkersExited(0, 151.5))
    assert exit_of(actions).code == EXIT_REQUEUE and "stopped_by_another_node" not in \
        logged(actions)


def test_a_relayed_stop_to_a_script_that_reads_no_control_file_sends_it_sigterm():
    core = started(replace(CONFIG, initial_checkpoint=1))
    actions = core.handle(SignalReceived(STOP_ELSEWHERE, 150.0, frozenset()))
    assert of_type(actions, SignalWorkers) == [SignalWorkers(signal.SIGTERM)]


# --- grace and force --------------------------------------------------------------------------


def test_grace_expiry_sends_sigterm_to_the_tree_then_sigkill_after_kill_after():
    core = started(replace(CONFIG, initial_checkpoint=1))
    core.handle(SignalReceived("SIGTERM", 150.0))
    assert core.handle(Tick(179.9)) == []
    actions = core.handle(Tick(180.0))
    assert of_type(actions, SignalTree) == [SignalTree(signal.SIGTERM)]
    assert core.phase is Phase.TERMINATING and core.wake_at == 182.0
    assert core.handle(Tick(181.0)) == []
    assert of_type(core.handle(Tick(182.0)), SignalTree) == [SignalTree(signal.SIGKILL)]
    assert core.phase is Phase.KILLED and core.wake_at is None
    assert exit_of(core.handle(WorkersExited(-9, 182.1))).code == EXIT_REQUEUE


def test_workers_gone_during_terminating_end_the_job_without_sigkill():
    core = started(replace(CONFIG, initial_checkpoint=1))
    core.handle(SignalReceived("SIGTERM", 150.0))
    core.handle(Tick(180.0))
    actions = core.handle(WorkersExited(-15, 180.5))
    assert exit_of(actions).code == EXIT_REQUEUE
    assert core.handle(Tick(182.0)) == []


def test_a_second_sigint_stops_at_once_and_a_third_kills():
    core = started(replace(CONFIG, initial_checkpoint=1))
    core.handle(SignalReceived("SIGINT", 150.0))
    second = core.handle(SignalReceived("SIGINT", 151.0))
    assert of_type(second, SignalTree) == [SignalTree(signal.SIGTERM)]
    assert core.wake_at == 153.0
    third = core.handle(SignalReceived("SIGINT", 151.5))
    assert of_type(third, SignalTree) == [SignalTree(signal.SIGKILL)]


def test_a_sigint_after_a_sigterm_is_not_a_second_sigint():
    core = started()
    core.handle(SignalReceived("SIGTERM", 150.0))
    assert not of_type(core.handle(SignalReceived("SIGINT", 151.0)), SignalTree)


def test_a_second_sigint_after_the_grace_expired_kills_at_once():
    core = started()
    core.handle(SignalReceived("SIGINT", 150.0))
    core.handle(Tick(180.0))
    actions = core.handle(SignalReceived("SIGINT", 180.5))
    assert of_type(actions, SignalTree) == [SignalTree(signal.SIGKILL)]


# --- failures ---------------------------------------------------------------------------------


def test_a_failure_schedules_a_restart_after_the_delay():
    core = started()
    actions = core.handle(WorkersExited(1, 200.0))
    assert not of_type(actions, StartWorkers) and core.phase is Phase.BACKOFF
    assert core.wake_at == 201.0
    assert core.handle(Tick(200.5)) == []
    assert core.handle(Tick(201.0)) == [StartWorkers(1, None)]
    assert core.phase is Phase.RUNNING


def test_restart_delays_double_without_progress_and_reset_after_a_checkpoint():
    core = started(replace(CONFIG, crash_loop_limit=10, max_restarts=10))
    delays = []
    for attempt in range(5):
        if attempt == 3:
            core.handle(CheckpointCommitted(attempt))
        now = 1000.0 * (attempt + 1)
        core.handle(WorkersExited(1, now))
        delays.append(core.wake_at - now)
        core.handle(Tick(core.wake_at))
    assert delays == [1.0, 2.0, 4.0, 1.0, 2.0]


def test_restart_delay_is_capped():
    core = started(replace(CONFIG, crash_loop_limit=10, max_restarts=10, max_restart_delay=3.0))
    for attempt in range(4):
        core.handle(WorkersExited(1, 1000.0 * attempt))
        core.handle(Tick(core.wake_at))
    core.handle(WorkersExited(1, 9000.0))
    assert core.wake_at == 9003.0


def test_failures_without_checkpoint_progress_end_as_a_crash_loop():
    core = started(replace(CONFIG, max_restarts=100, crash_loop_limit=3))
    for now in (200.0, 300.0):
        core.handle(WorkersExited(1, now))
        core.handle(Tick(core.wake_at))
    actions = core.handle(WorkersExited(1, 400.0))
    assert exit_of(actions).code == EXIT_FAILURE and exit_of(actions).workers_failed
    assert "crash loop" in exit_of(actions).reason


@pytest.mark.parametrize("max_restarts", [0, 1, 3, 5])
def test_max_restarts_n_allows_exactly_n_restarts_in_a_row_without_a_checkpoint(
        max_restarts: int):
    core = started(replace(CONFIG, max_restarts=max_restarts))
    for failure in range(max_restarts):
        assert not of_type(core.handle(WorkersExited(1, 100.0 * (failure + 1))), Exit)
        assert core.handle(Tick(core.wake_at)) == [StartWorkers(failure + 1, None)]
    actions = core.handle(WorkersExited(1, 10_000.0))
    reason = exit_of(actions).reason
    assert exit_of(actions).code == EXIT_FAILURE
    if max_restarts == 0:  # one failure is no loop
        assert reason == "the workers failed, and --max-restarts 0 allows no restart"
    else:
        assert "crash loop" in reason and f"all {max_restarts} restarts" in reason


def test_checkpoint_progress_between_failures_is_not_a_crash_loop():
    core = started(replace(CONFIG, max_restarts=100, crash_loop_limit=2))
    for index in range(5):
        core.handle(CheckpointCommitted(index))
        assert not of_type(core.handle(WorkersExited(1, 100.0 * index)), Exit)
        core.handle(Tick(core.wake_at))


def test_failures_beyond_max_restarts_without_progress_end_the_job_with_the_worker_error():
    core = started(replace(CONFIG, max_restarts=1))
    core.handle(WorkersExited(1, 200.0))
    core.handle(Tick(core.wake_at))
    actions = core.handle(WorkersExited(1, 300.0))
    assert exit_of(actions).workers_failed and "--max-restarts" in exit_of(actions).reason


def test_a_committed_checkpoint_gives_the_restart_budget_back():
    core = started(replace(CONFIG, max_restarts=1))
    for index in range(10):  # a rare fault, again and again, with training in between
        core.handle(CheckpointCommitted(index))
        actions = core.handle(WorkersExited(1, 200.0 + 100 * index))
        assert not of_type(actions, Exit), f"fault {index + 1} ended the job"
        assert logged(actions) == ["workers_exited", "restart_scheduled"]
        core.handle(Tick(core.wake_at))


def test_no_restarts_allowed_means_the_first_failure_ends_the_job():
    actions = started(replace(CONFIG, max_restarts=0)).handle(WorkersExited(3, 200.0))
    assert exit_of(actions).code == EXIT_FAILURE


def test_a_stop_signal_during_backoff_ends_the_job_without_restarting():
    core = started(replace(CONFIG, initial_checkpoint=4))
    core.handle(WorkersExited(1, 200.0))
    actions = core.handle(SignalReceived("SIGTERM", 200.5))
    assert exit_of(actions).code == EXIT_REQUEUE
    assert core.handle(Tick(300.0)) == []


def test_resume_from_applies_to_restarts_until_the_run_commits_its_own_checkpoint():
    core = SupervisorCore(replace(CONFIG, initial_checkpoint=5, resume_from="2"))
    assert of_type(core.start(100.0), StartWorkers) == [StartWorkers(0, "2")]
    core.handle(WorkersExited(1, 200.0))
    assert core.handle(Tick(core.wake_at)) == [StartWorkers(1, "2")]
    core.handle(CheckpointCommitted(6))
    core.handle(WorkersExited(1, 300.0))
    assert core.handle(Tick(core.wake_at)) == [StartWorkers(2, None)]


def test_an_older_or_repeated_checkpoint_index_is_not_progress():
    core = started(replace(CONFIG, initial_checkpoint=5))
    assert core.handle(CheckpointCommitted(5)) == []
    assert core.handle(CheckpointCommitted(3)) == []
    assert core.latest_checkpoint == 5


# --- requeue ----------------------------------------------------------------------------------


def stop_cleanly(core: SupervisorCore) -> list[SupervisorAction]:
    core.handle(SignalReceived("SIGTERM", 150.0))
    core.handle(CheckpointCommitted(9))
    return core.handle(WorkersExited(0, 151.0))


def test_a_clean_stop_under_slurm_requeues_before_exiting_75():
    actions = stop_cleanly(started(replace(CONFIG, requeue=True, requeue_count=2)))
    kinds = [type(action) for action in actions if not isinstance(action, Log)]
    assert kinds == [Requeue, Exit]


def test_cont_and_term_twice_requeue_exactly_once():
    core = started(replace(CONFIG, requeue=True))
    actions: list[SupervisorAction] = []
    for name in ("SIGCONT", "SIGTERM", "SIGCONT", "SIGTERM"):
        actions += core.handle(SignalReceived(name, 150.0))
    actions += core.handle(CheckpointCommitted(1))
    actions += core.handle(WorkersExited(0, 151.0))
    actions += core.handle(SignalReceived("SIGTERM", 152.0))
    assert len(of_type(actions, Requeue)) == 1


def test_requeues_are_capped_by_max_requeues():
    config = replace(CONFIG, requeue=True, requeue_count=3, max_requeues=3)
    actions = stop_cleanly(started(config))
    assert not of_type(actions, Requeue) and "requeue_skipped" in logged(actions)
    assert exit_of(actions).code == EXIT_REQUEUE


def test_no_requeue_when_requeue_is_off():
    assert not of_type(stop_cleanly(started()), Requeue)


def test_a_stop_without_any_checkpoint_is_never_requeued():
    core = started(replace(CONFIG, requeue=True))
    core.handle(SignalReceived("SIGTERM", 150.0))
    assert not of_type(core.handle(WorkersExited(0, 151.0)), Requeue)


def test_nothing_happens_after_the_core_decided_to_exit():
    core = started()
    core.handle(WorkersExited(0, 200.0))
    for event in (SignalReceived("SIGTERM", 201.0), WorkersExited(1, 202.0), Tick(300.0),
                  CheckpointCommitted(4)):
        assert core.handle(event) == []


# --- every sequence ---------------------------------------------------------------------------

_events = st.one_of(
    st.builds(SignalReceived, st.sampled_from(["SIGTERM", "SIGINT", "SIGCONT", "SIGHUP"]),
              st.floats(0, 50)),
    st.builds(WorkersExited, st.sampled_from([0, 1, -9, -15]), st.floats(0, 50)),
    st.builds(CheckpointCommitted, st.integers(0, 5)),
    st.builds(Tick, st.floats(0, 50)),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_events, max_size=25), st.booleans(), st.one_of(st.none(), st.integers(0, 3)))
def test_any_event_sequence_keeps_the_supervisor_invariants(events: list[Event], requeue: bool,
                                                            initial: int | None):
    config = replace(CONFIG, grace=10.0, requeue=requeue, initial_checkpoint=initial,
                     max_restarts=2)
    core = SupervisorCore(config)
    trace: list[SupervisorAction] = list(core.start(0.0))
    now = 0.0
    for event in events:
        now += getattr(event, "now", 0.0)  # events move forward in time, as in the shell
        event = replace(event, now=now) if hasattr(event, "now") else event
        trace += core.handle(event)
    requests = [a.request for a in of_type(trace, WriteControl)]
    assert sum(r.action is Action.CHECKPOINT_AND_EXIT for r in requests) <= 1
    assert [r.sequence for r in requests] == sorted({r.sequence for r in requests})
    exits = of_type(trace, Exit)
    assert len(exits) <= 1 and all(e.code in (0, 1, 75) for e in exits)
    if exits:
        assert trace[-1] == exits[0], "nothing is done after the exit"
    if of_type(trace, Requeue):
        assert len(of_type(trace, Requeue)) == 1 and exits and exits[0].code == EXIT_REQUEUE
    stop_at = next((i for i, a in enumerate(trace) if isinstance(a, WriteControl)
                    and a.request.action is Action.CHECKPOINT_AND_EXIT), len(trace))
    assert not of_type(trace[stop_at:], StartWorkers), "no restart after a stop request"


def test_workers_that_stop_because_another_node_asked_end_as_a_stop():
    core = started(replace(CONFIG, initial_checkpoint=1, requeue=True))
    core.handle(CheckpointCommitted(2))
    actions = core.handle(WorkersExited(0, 200.0, stopped_elsewhere=True))
    assert exit_of(actions).code == EXIT_REQUEUE
    assert "stopped_by_another_node" in logged(actions)
    assert "stop_without_new_checkpoint" not in logged(actions)
    assert of_type(actions, Requeue)


def test_a_failure_after_another_node_asked_to_stop_is_not_restarted():
    core = started(replace(CONFIG, initial_checkpoint=1))
    actions = core.handle(WorkersExited(1, 200.0, stopped_elsewhere=True))
    assert exit_of(actions).code == EXIT_REQUEUE and not of_type(actions, StartWorkers)


def test_the_stop_checkpoint_counts_as_made_only_once_a_newer_one_is_committed():
    core = started(replace(CONFIG, initial_checkpoint=4))
    assert not core.stop_checkpoint_made
    core.handle(SignalReceived("SIGTERM", 150.0))
    assert not core.stop_checkpoint_made
    core.handle(CheckpointCommitted(4))
    assert not core.stop_checkpoint_made
    core.handle(CheckpointCommitted(5))
    assert core.stop_checkpoint_made


def test_a_start_that_fails_twice_with_the_same_error_ends_without_a_third_start():
    core = started(replace(CONFIG, max_restarts=5))
    actions = core.handle(WorkersExited(1, 200.0, before_first_step=True, failure=NO_CUDA))
    assert logged(actions)[-1] == "restart_scheduled" and core.wake_at == 201.0
    assert core.handle(Tick(core.wake_at)) == [StartWorkers(1, None)]
    actions = core.handle(WorkersExited(1, 300.0, before_first_step=True, failure=NO_CUDA))
    reason = exit_of(actions).reason
    assert "failed twice before their first step with the same error" in reason, reason
    assert exit_of(actions).workers_failed


@pytest.mark.parametrize("second", [
    WorkersExited(1, 300.0, before_first_step=True, failure=ANOTHER),
    WorkersExited(1, 300.0, before_first_step=False, failure=NO_CUDA),
    WorkersExited(-9, 300.0, before_first_step=True, failure=None),
])
def test_a_start_failure_unlike_the_one_before_is_restarted(second: WorkersExited):
    core = started(replace(CONFIG, max_restarts=5))
    core.handle(WorkersExited(1, 200.0, before_first_step=True, failure=NO_CUDA))
    core.handle(Tick(core.wake_at))
    assert not of_type(core.handle(second), Exit)


def test_the_same_start_failure_after_a_new_checkpoint_is_restarted():
    core = started(replace(CONFIG, max_restarts=5))
    core.handle(WorkersExited(1, 200.0, before_first_step=True, failure=NO_CUDA))
    core.handle(Tick(core.wake_at))
    core.handle(CheckpointCommitted(3, 250.0))
    assert not of_type(core.handle(WorkersExited(1, 300.0, before_first_step=True,
                                                 failure=NO_CUDA)), Exit)


def test_a_crash_loop_of_the_same_hang_says_how_to_get_past_it():
    core = started(replace(CONFIG, max_restarts=1))
    core.handle(HangDetected("no progress", 150.0))
    core.handle(WorkersExited(-9, 151.0, before_first_step=False))
    core.handle(Tick(core.wake_at))
    core.handle(HangDetected("no progress", 250.0, repeated="the same hang at step 17 twice"))
    reason = exit_of(core.handle(WorkersExited(-9, 251.0, before_first_step=False))).reason
    assert reason.endswith("; the same hang at step 17 twice: mark it with control.paused() "
                           "or raise --hang-timeout-min"), reason


def test_a_start_that_fails_before_its_first_step_is_told_apart_from_a_training_crash():
    core = started(replace(CONFIG, max_restarts=1))
    actions = core.handle(WorkersExited(1, 200.0, before_first_step=True))
    assert logged(actions) == ["workers_exited", "start_failed", "restart_scheduled"]
    core.handle(Tick(core.wake_at))
    actions = core.handle(WorkersExited(1, 300.0, before_first_step=False))
    assert "start_failed" not in logged(actions)
    reason = exit_of(actions).reason
    assert "1 of the 2 failures came before the first step" in reason, reason


# --- the memory tier's landing ----------------------------------------------------------------


TIER = replace(CONFIG, lands_newest=True, requeue=True)
LANDED = LandingReport(failure=None, newest=None, now=160.0)
ONLY_IN_MEMORY = LandingReport(failure="No space left on device", newest="/dev/shm/c/ck_9",
                               now=160.0)


def test_with_the_memory_tier_a_stop_asks_for_the_landing_and_holds_its_exit_and_requeue():
    core = started(TIER)
    actions = stop_cleanly(core)
    assert of_type(actions, LandNewest) == [LandNewest(EXIT_REQUEUE, True, 180.0)]
    assert not of_type(actions, Requeue) and not of_type(actions, Exit)
    assert "exit" not in logged(actions) and core.phase is Phase.LANDING
    assert core.handle(Tick(10_000.0)) == [] and core.handle(WorkersExited(1, 170.0)) == []


def test_a_stop_whose_checkpoint_landed_is_requeued_then_exits_75_as_planned():
    core = started(TIER)
    stop_cleanly(core)
    actions = core.handle(LANDED)
    assert [type(action) for action in actions] == [Requeue, Log, Exit]
    assert logged(actions) == ["exit"] and exit_of(actions).code == EXIT_REQUEUE
    assert core.phase is Phase.DONE and core.handle(LANDED) == []


def test_a_stop_whose_checkpoint_is_only_in_memory_exits_74_without_a_requeue():
    core = started(TIER)
    stop_cleanly(core)
    actions = core.handle(ONLY_IN_MEMORY)
    assert not of_type(actions, Requeue)
    assert logged(actions) == ["persist_failed", "requeue_withheld", "exit"]
    end = exit_of(actions)
    assert end.code == EXIT_NOT_PERSISTED
    assert "only in this node's memory" in end.reason and "/dev/shm/c/ck_9" in end.reason
    assert "not requeued" in end.reason


@pytest.mark.parametrize(("planned", "code"), [(EXIT_SUCCESS, EXIT_NOT_PERSISTED),
                                               (EXIT_FAILURE, EXIT_FAILURE)])
def test_a_finished_run_not_landed_exits_74_and_a_failed_one_keeps_its_code(planned, code):
    core = started(replace(TIER, max_restarts=0))
    (ask,) = of_type(core.handle(WorkersExited(planned, 200.0, failure=NO_CUDA)), LandNewest)
    assert ask == LandNewest(planned, stopped=False, deadline=None)
    actions = core.handle(ONLY_IN_MEMORY)
    assert exit_of(actions).code == code and "requeue_withheld" not in logged(actions)
    assert exit_of(actions).workers_failed is (planned == EXIT_FAILURE)


def test_a_landing_report_nobody_asked_for_changes_nothing():
    core = started(TIER)
    assert core.handle(ONLY_IN_MEMORY) == [] and core.phase is Phase.RUNNING
    assert of_type(core.handle(WorkersExited(0, 200.0)), LandNewest)
    assert exit_of(core.handle(LANDED)).code == EXIT_SUCCESS
