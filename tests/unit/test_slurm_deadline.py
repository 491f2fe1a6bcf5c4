"""Slurm's hard deadline bounds a stop: scontrol's answers, the arithmetic, and the core."""

from __future__ import annotations

import datetime
import signal
from pathlib import Path

from cycler.protocol.events import describe
from cycler.protocol.features import USES_CONTROL
from cycler.supervisor.decisions.core import (
    CoreConfig,
    HardDeadline,
    Log,
    Phase,
    SignalReceived,
    SignalTree,
    SupervisorCore,
    Tick,
    WorkersExited,
)
from cycler.supervisor.schedulers.slurm import SlurmJob, hard_deadline, read_job

END = datetime.datetime(2026, 11, 23, 8, 0, 0)


def fake_scontrol(tmp_path: Path, job: str, config: str) -> str:
    script = tmp_path / "scontrol"
    script.write_text("#!/bin/sh\n"
                      f'if [ "$2" = job ]; then echo "{job}"; else printf "%s\\n" "{config}"; fi\n')
    script.chmod(0o755)
    return str(script)


def test_state_end_time_and_kill_wait_are_read_from_scontrol(tmp_path: Path) -> None:
    scontrol = fake_scontrol(
        tmp_path, "JobId=7 JobName=train JobState=RUNNING Reason=None EndTime=2026-11-23T08:00:00"
                  " Partition=debug",
        "Configuration data as of 2026-11-23T07:00:00\nInactiveLimit           = 0 sec\n"
        "KillWait                = 30 sec\nKillOnBadExit           = 0")
    assert read_job("7", scontrol) == SlurmJob("RUNNING", END.timestamp(), 30.0)


def test_an_unlimited_job_and_unreadable_answers_give_nothing(tmp_path: Path) -> None:
    scontrol = fake_scontrol(tmp_path, "JobId=7 JobState=RUNNING EndTime=Unknown", "junk")
    assert read_job("7", scontrol) == SlurmJob("RUNNING", None, None)
    assert read_job("7", str(tmp_path / "missing")) == SlurmJob(None, None, None)


def test_a_job_slurm_is_ending_must_stop_within_killwait() -> None:
    job = SlurmJob("COMPLETING", END.timestamp(), 30.0)
    at, why = hard_deadline(job, signalled_at=1000.0, kill_after=2.0) or (0.0, "")
    assert at == 1000.0 + 30 - 2 - 3
    assert "KillWait 30 s" in why


def test_a_time_limit_notice_must_stop_and_requeue_before_the_limit() -> None:
    job = SlurmJob("RUNNING", END.timestamp(), 30.0)
    at, why = hard_deadline(job, signalled_at=END.timestamp() - 60, kill_after=2.0) or (0, "")
    assert at == END.timestamp() - 5
    assert "2026-11-23T08:00:00" in why and "not requeued" in why


def test_no_limit_known_leaves_the_grace_alone() -> None:
    assert hard_deadline(SlurmJob("RUNNING", None, 30.0), 1000.0, 2.0) is None
    assert hard_deadline(SlurmJob(None, None, None), 1000.0, 2.0) is None


def test_an_earlier_hard_deadline_cuts_the_grace_and_says_why() -> None:
    core = SupervisorCore(CoreConfig(grace=90.0, initial_checkpoint=1))
    core.start(100.0)
    core.handle(SignalReceived("SIGTERM", 150.0, frozenset({USES_CONTROL})))
    assert core.wake_at == 240.0
    actions = core.handle(HardDeadline(175.0, "KillWait 30 s", 150.1))
    (log,) = [a for a in actions if isinstance(a, Log)]
    assert log.event == "deadline" and log.warning and log.fields["seconds_left"] == 24.9
    assert core.wake_at == 175.0
    expired = core.handle(Tick(175.0))
    assert expired[1:] == [SignalTree(signal.SIGTERM)]
    assert core.phase is Phase.TERMINATING
    (said,) = [a for a in expired if isinstance(a, Log)]
    assert describe(said.event, said.fields).startswith("the stop's 25 s are over"), \
        "the deadline that ran out, not the 90 s grace"


def test_a_later_deadline_or_one_outside_a_stop_changes_nothing() -> None:
    core = SupervisorCore(CoreConfig(grace=10.0))
    core.start(100.0)
    assert core.handle(HardDeadline(120.0, "x", 101.0)) == []
    core.handle(SignalReceived("SIGTERM", 150.0, frozenset({USES_CONTROL})))
    assert core.handle(HardDeadline(170.0, "x", 150.1)) == [] and core.wake_at == 160.0


def test_the_stop_deadline_is_the_grace_from_the_first_signal_or_an_earlier_hard_one() -> None:
    core = SupervisorCore(CoreConfig(grace=90.0, initial_checkpoint=1))
    core.start(100.0)
    assert core.stop_deadline is None, "no stop, no deadline"
    core.handle(SignalReceived("SIGTERM", 150.0, frozenset({USES_CONTROL})))
    core.handle(SignalReceived("SIGTERM", 160.0, frozenset({USES_CONTROL})))
    assert core.stop_deadline == 240.0, "a repeated signal does not move it"
    core.handle(HardDeadline(175.0, "KillWait 30 s", 150.1))
    core.handle(WorkersExited(0, 160.0))
    assert core.stopped and core.stop_deadline == 175.0


def test_a_stop_while_no_workers_run_has_the_grace_as_its_deadline() -> None:
    core = SupervisorCore(CoreConfig(grace=20.0, initial_checkpoint=1))
    core.start(100.0)
    core.handle(SignalReceived("SIGTERM", 150.0, workers_started=False))
    core.handle(WorkersExited(-9, 150.5))
    assert core.stopped and core.stop_deadline == 170.0


def test_a_stop_asked_by_another_node_has_that_node_s_deadline_or_none() -> None:
    for deadline, expected in [(130.0, 130.0), (None, None)]:
        core = SupervisorCore(CoreConfig(grace=20.0, initial_checkpoint=1))
        core.start(100.0)
        core.handle(WorkersExited(0, 120.0, stopped_elsewhere=True, deadline_elsewhere=deadline))
        assert core.stopped and core.stop_deadline == expected


def test_a_second_sigint_ends_the_stop_s_deadline_at_once() -> None:
    core = SupervisorCore(CoreConfig(grace=90.0, initial_checkpoint=1))
    core.start(100.0)
    core.handle(SignalReceived("SIGINT", 150.0, frozenset({USES_CONTROL})))
    core.handle(SignalReceived("SIGINT", 151.0, frozenset({USES_CONTROL})))
    core.handle(WorkersExited(-15, 151.5))
    assert core.stopped and core.stop_deadline == 151.0, "nothing is copied after it"
