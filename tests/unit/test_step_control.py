"""StepControl on one rank: requests, step and time cadences, resume, stale requests."""

from __future__ import annotations

from pathlib import Path

import pytest

from cycler.errors import ConfigError, CyclerError, StateMismatch
from cycler.protocol.control import Action, ControlRequest, write_control
from cycler.protocol.environment import ENV_CONTROL_FILE
from cycler.training.step_control import (
    DEFAULT_SYNC_SECONDS,
    MAX_SYNC_EVERY,
    StepControl,
    StepDecision,
    adaptive_sync_every,
)

STARTED = 1_000_000.0
"""Wall-clock start of the fake worker: requests written before it are left-overs."""


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def request(
    path: Path, sequence: int, action: Action, *, requested_at: float = STARTED + 1
) -> None:
    write_control(
        path,
        ControlRequest(
            sequence=sequence, action=action, reason="SIGTERM", requested_at=requested_at
        ),
    )


def control_for(path: Path, clock: FakeClock | None = None, **options: object) -> StepControl:
    return StepControl(
        control_file=path,
        poll_interval=0.0,
        ignore_requests_before=STARTED,
        clock=clock or FakeClock(),
        **options,  # type: ignore[arg-type]
    )


def run_steps(control: StepControl, count: int) -> list[StepDecision]:
    return [control.step() for _ in range(count)]


def checkpoint_steps(decisions: list[StepDecision]) -> list[int]:
    return [decision.step for decision in decisions if decision.checkpoint]


def test_no_sources_means_no_checkpoint_and_no_stop(tmp_path: Path) -> None:
    decisions = run_steps(control_for(tmp_path / "control.json"), 50)

    assert [d.step for d in decisions] == list(range(1, 51))
    assert not any(d.checkpoint or d.stop or d.reason for d in decisions)


def test_checkpoint_request_between_steps_checkpoints_once_on_the_next_step(
    tmp_path: Path,
) -> None:
    path = tmp_path / "control.json"
    control = control_for(path)
    run_steps(control, 2)

    request(path, 1, Action.CHECKPOINT)
    third, fourth = run_steps(control, 2)

    assert third == StepDecision(checkpoint=True, stop=False, reason="checkpoint requested", step=3)
    assert control.should_checkpoint() is False
    assert not fourth.checkpoint and not fourth.stop
    assert control.last_request is not None and control.last_request.sequence == 1


def test_checkpoint_and_exit_request_checkpoints_and_stops_then_keeps_stopping(
    tmp_path: Path,
) -> None:
    path = tmp_path / "control.json"
    control = control_for(path)
    run_steps(control, 4)

    request(path, 1, Action.CHECKPOINT_AND_EXIT)
    decisions = run_steps(control, 3)

    assert decisions[0] == StepDecision(checkpoint=True, stop=True, reason="stop requested", step=5)
    assert [(d.checkpoint, d.stop) for d in decisions[1:]] == [(False, True), (False, True)]
    assert control.should_stop()


def test_each_request_is_acted_on_once_and_a_new_sequence_acts_again(tmp_path: Path) -> None:
    path = tmp_path / "control.json"
    control = control_for(path)
    request(path, 1, Action.CHECKPOINT)
    first = run_steps(control, 3)
    request(path, 1, Action.CHECKPOINT)  # rewritten, same sequence: the same request
    second = run_steps(control, 3)
    request(path, 2, Action.CHECKPOINT)
    third = run_steps(control, 3)

    assert checkpoint_steps(first + second + third) == [1, 7]


def test_run_action_asks_for_nothing(tmp_path: Path) -> None:
    path = tmp_path / "control.json"
    control = control_for(path)
    request(path, 1, Action.RUN)

    assert checkpoint_steps(run_steps(control, 5)) == []
    assert control.last_request is None


def test_request_written_before_the_worker_started_is_ignored(tmp_path: Path) -> None:
    path = tmp_path / "control.json"
    request(path, 7, Action.CHECKPOINT_AND_EXIT, requested_at=STARTED - 0.5)
    control = control_for(path)

    decisions = run_steps(control, 5)

    assert not any(d.checkpoint or d.stop for d in decisions)


def test_request_written_after_start_but_before_the_first_step_is_honoured(
    tmp_path: Path,
) -> None:
    path = tmp_path / "control.json"
    request(path, 1, Action.CHECKPOINT_AND_EXIT, requested_at=STARTED + 0.5)
    control = control_for(path)

    first = control.step()

    assert first.checkpoint and first.stop and first.step == 1


def test_by_default_a_stop_written_before_the_worker_started_is_honoured(tmp_path: Path) -> None:
    # cycle run resets the file to `run` before starting workers, so a stop in it is for them,
    # even one that arrived while they were still importing torch.
    path = tmp_path / "control.json"
    request(path, 1, Action.CHECKPOINT_AND_EXIT, requested_at=1.0)
    control = StepControl(control_file=path, poll_interval=0.0)

    first = run_steps(control, 1)[0]
    assert first.checkpoint and first.stop


def test_every_steps_checkpoints_on_multiples_of_the_global_step(tmp_path: Path) -> None:
    control = control_for(tmp_path / "control.json", every_steps=3)

    decisions = run_steps(control, 10)

    assert checkpoint_steps(decisions) == [3, 6, 9]
    assert {d.reason for d in decisions if d.checkpoint} == {"every 3 steps"}


def test_resume_with_start_step_keeps_the_every_steps_cadence(tmp_path: Path) -> None:
    control = control_for(tmp_path / "control.json", every_steps=100, start_step=1000)

    assert checkpoint_steps(run_steps(control, 250)) == [1100, 1200]


def test_resume_from_state_dict_keeps_the_every_steps_cadence(tmp_path: Path) -> None:
    before = control_for(tmp_path / "control.json", every_steps=100)
    run_steps(before, 1000)
    after = control_for(tmp_path / "control.json", every_steps=100)

    after.load_state_dict(before.state_dict())

    assert after.global_step == 1000
    assert checkpoint_steps(run_steps(after, 250)) == [1100, 1200]


def test_load_state_dict_after_the_loop_started_is_refused(tmp_path: Path) -> None:
    control = control_for(tmp_path / "control.json")
    control.step()

    with pytest.raises(CyclerError, match="before the training loop starts"):
        control.load_state_dict({"version": 1, "global_step": 5})


@pytest.mark.parametrize(
    "state", [{}, {"version": 2, "global_step": 5}, {"version": 1, "global_step": -1}]
)
def test_load_state_dict_refuses_what_state_dict_did_not_write(
    tmp_path: Path, state: dict[str, int]
) -> None:
    with pytest.raises(StateMismatch, match="pass the dict that state_dict"):
        control_for(tmp_path / "control.json").load_state_dict(state)


def test_every_seconds_checkpoints_when_the_time_since_the_last_checkpoint_has_passed(
    tmp_path: Path,
) -> None:
    clock = FakeClock()
    control = control_for(tmp_path / "control.json", clock, every_seconds=10.0)
    fired = []
    for step in range(1, 31):
        clock.now = step * 1.5  # 1.5 s per step
        if control.step().checkpoint:
            fired.append(step)

    # 10 s passes at step 7 (10.5 s); the timer then restarts from there: 17.5 s at step 14.
    assert fired == [7, 14, 21, 28]


def test_any_checkpoint_restarts_the_every_seconds_timer(tmp_path: Path) -> None:
    clock = FakeClock()
    control = control_for(tmp_path / "control.json", clock, every_seconds=10.0, every_steps=5)
    reasons = {}
    for step in range(1, 13):
        clock.now = float(step)
        decision = control.step()
        if decision.checkpoint:
            reasons[step] = decision.reason

    assert reasons == {5: "every 5 steps", 10: "every 5 steps"}


def test_request_and_cadence_on_the_same_step_make_one_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "control.json"
    control = control_for(path, every_steps=4)
    run_steps(control, 3)
    request(path, 1, Action.CHECKPOINT)

    decisions = run_steps(control, 4)

    assert checkpoint_steps(decisions) == [4]
    assert decisions[0].reason == "checkpoint requested, every 4 steps"


def test_the_control_file_is_looked_at_once_per_poll_interval(tmp_path: Path) -> None:
    path = tmp_path / "control.json"
    clock = FakeClock()
    control = StepControl(
        control_file=path, poll_interval=0.5, clock=clock, ignore_requests_before=STARTED
    )
    clock.now = 0.6
    control.step()  # looks: nothing there yet
    request(path, 1, Action.CHECKPOINT_AND_EXIT)
    clock.now = 0.8
    too_soon = control.step()
    clock.now = 1.1
    due = control.step()

    assert not too_soon.stop
    assert due.stop and due.checkpoint and due.step == 3


def test_missing_control_file_leaves_only_the_timers(tmp_path: Path) -> None:
    control = control_for(tmp_path / "never-written.json", every_steps=2)

    assert checkpoint_steps(run_steps(control, 6)) == [2, 4, 6]


def test_control_file_defaults_to_the_environment_variable(tmp_path: Path) -> None:
    path = tmp_path / "control.json"

    assert StepControl(environ={ENV_CONTROL_FILE: str(path)}).control_file == path
    assert StepControl(environ={}).control_file is None
    assert (
        StepControl(control_file=None, environ={ENV_CONTROL_FILE: str(path)}).control_file is None
    )


def test_without_a_process_group_decisions_are_local() -> None:
    assert not StepControl(control_file=None).is_distributed


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"every_steps": 0}, "every_steps"),
        ({"every_seconds": 0.0}, "every_seconds"),
        ({"every_seconds": float("nan")}, "every_seconds"),
        ({"sync_every": 0}, "sync_every"),
        ({"poll_interval": -1.0}, "poll_interval"),
        ({"start_step": -3}, "start_step"),
    ],
)
def test_bad_options_name_the_field(options: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        StepControl(control_file=None, **options)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("step_seconds", "sync_every"),
    [(10.0, 1), (0.2, 1), (0.04, 5), (0.001, 200), (1e-6, MAX_SYNC_EVERY), (0.0, MAX_SYNC_EVERY)],
)
def test_adaptive_exchange_period_is_about_two_tenths_of_a_second_of_steps(
    step_seconds: float, sync_every: int
) -> None:
    assert DEFAULT_SYNC_SECONDS == 0.2
    assert adaptive_sync_every(step_seconds) == sync_every


@pytest.mark.parametrize("every_steps", [None, "auto"])
def test_under_cycle_verify_a_script_without_a_fixed_schedule_checkpoints_at_verifys_steps(
        tmp_path: Path, every_steps: object) -> None:
    # "auto" chooses its steps from the clock: two runs of one script would commit at other
    # steps (and a short run once, 30 s in), and verify compares checkpoints at equal steps.
    clock = FakeClock()
    control = StepControl(control_file=tmp_path / "control.json", poll_interval=0.0,
                          ignore_requests_before=STARTED, clock=clock, every_steps=every_steps,
                          environ={"CYCLER_VERIFY": "1"})  # type: ignore[arg-type]
    decisions = []
    for _ in range(20):
        clock.now += 10.0  # 200 s in all: "auto" alone would have chosen its own steps
        decisions.append(control.step())
    assert checkpoint_steps(decisions) == [2, 4, 8, 16]
    assert all(d.reason == "cycle verify's schedule" for d in decisions if d.checkpoint)


def test_outside_cycle_verify_auto_keeps_its_own_schedule(tmp_path: Path) -> None:
    clock = FakeClock()
    control = StepControl(control_file=tmp_path / "control.json", poll_interval=0.0,
                          ignore_requests_before=STARTED, clock=clock, every_steps="auto",
                          environ={})
    decisions = []
    for _ in range(20):
        clock.now += 10.0
        decisions.append(control.step())
    assert checkpoint_steps(decisions) not in ([], [2, 4, 8, 16])
    assert all("(auto)" in d.reason for d in decisions if d.checkpoint)
