"""The auto checkpoint interval: Young's and Daly's formulas, the limits, the failure history read
from the events log, and a StepControl whose interval follows a save that becomes slower."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from cycler import AutoInterval, ConfigError, StepControl
from cycler.training.auto_interval import (
    DEFAULT_MTBF,
    FailureHistory,
    daly_interval,
    events_beside,
    mean_time_between_failures,
    prior_mtbf,
    young_interval,
)


def event(name: str, time: float, **fields: object) -> dict[str, object]:
    return {"event": name, "time": time, **fields}


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_young_interval_is_the_square_root_of_twice_cost_times_mtbf() -> None:
    assert young_interval(1.0, 7200.0) == pytest.approx(120.0)
    assert young_interval(10.0, 4 * 3600.0) == pytest.approx(math.sqrt(2 * 10 * 14400))


def test_daly_interval_equals_young_less_the_save_when_the_save_is_small() -> None:
    cost, mtbf = 0.5, 4 * 3600.0
    assert daly_interval(cost, mtbf) == pytest.approx(young_interval(cost, mtbf) - cost, rel=0.01)


def test_daly_interval_corrects_young_when_the_save_is_large_against_the_mtbf() -> None:
    # C = 600 s, M = 3600 s: sqrt(2CM) = 2078.46, C/2M = 1/12:
    # 2078.46 * (1 + sqrt(1/12)/3 + 1/108) - 600 = 1697.7
    assert daly_interval(600.0, 3600.0) == pytest.approx(1697.7, abs=0.5)


def test_daly_interval_is_the_mtbf_once_a_save_costs_twice_the_mtbf() -> None:
    assert daly_interval(100.0, 50.0) == 50.0
    assert daly_interval(0.0, 3600.0) == 0.0


def test_the_interval_in_seconds_stays_within_the_users_limits() -> None:
    limits = AutoInterval(min_seconds=60.0, max_seconds=600.0)
    assert limits.seconds(0.001, 3600.0) == 60.0
    assert limits.seconds(1000.0, 10 * 3600.0) == 600.0
    assert limits.seconds(1.0, 7200.0) == pytest.approx(daly_interval(1.0, 7200.0) + 1.0)


def test_the_interval_in_steps_stays_within_the_step_limits() -> None:
    limits = AutoInterval(min_steps=10, max_steps=500)
    assert limits.steps(120.0, 0.5) == 240
    assert limits.steps(1.0, 0.5) == 10
    assert limits.steps(1e6, 0.5) == 500
    assert AutoInterval().steps(1e12, 1e-6) == 2**31 - 1


@pytest.mark.parametrize("fields", [
    {"min_seconds": 10.0, "max_seconds": 5.0}, {"min_seconds": -1.0}, {"min_steps": 0},
    {"min_steps": 10, "max_steps": 5}, {"mtbf_prior": 0.0}, {"max_steps": 2.5},
])
def test_limits_that_contradict_themselves_are_refused_naming_the_field(fields: dict) -> None:
    with pytest.raises(ConfigError, match="AutoInterval"):
        AutoInterval(**fields)


def test_step_control_takes_auto_and_refuses_other_words() -> None:
    assert StepControl(every_steps="auto", control_file=None).every_steps == "auto"
    with pytest.raises(ConfigError, match='"auto"'):
        StepControl(every_steps="often", control_file=None)  # type: ignore[arg-type]


def test_the_mtbf_is_the_prior_before_any_failure_and_the_observed_rate_later() -> None:
    assert mean_time_between_failures(0, 0.0, DEFAULT_MTBF) == DEFAULT_MTBF
    assert mean_time_between_failures(0, 3600.0, 3600.0) == 7200.0
    assert mean_time_between_failures(99, 100 * 3600.0, 4 * 3600.0) == pytest.approx(
        1.04 * 3600.0)


def test_the_prior_is_the_schedulers_time_limit_when_it_is_shorter() -> None:
    assert prior_mtbf({}) == DEFAULT_MTBF
    slurm = {"SLURM_JOB_START_TIME": "1000", "SLURM_JOB_END_TIME": "4600"}
    assert prior_mtbf(slurm) == 3600.0
    assert prior_mtbf({**slurm, "SLURM_JOB_END_TIME": "10" + "0" * 9}) == DEFAULT_MTBF
    assert prior_mtbf({**slurm, "SLURM_JOB_END_TIME": "Unknown"}) == DEFAULT_MTBF


def test_crashes_hangs_and_kills_count_as_failures_and_an_agreed_stop_does_not() -> None:
    # A crash at 90 and a kill -9 of the whole job at ~200 (the next run finds its progress),
    # then an agreed stop at 290 whose checkpoint is where the next run resumes.
    events = [
        event("start", 0.0), event("first_step", 10.0, at=10.0, step=1),
        event("checkpoint_committed", 40.0), event("workers_exited", 90.0, code=1),
        event("restart_scheduled", 90.0), event("first_step", 96.0, at=96.0, step=31),
        event("start", 210.0), event("last_progress", 210.5, at=200.0, step=130),
        event("workers_started", 211.0), event("first_step", 220.0, at=220.0, step=101,
                                                resumed=100),
        event("stop_requested", 290.0), event("checkpoint_committed", 292.0),
        event("exit", 295.0, code=75),
        event("start", 300.0), event("last_progress", 300.5, at=292.0, step=170),
        event("first_step", 310.0, at=310.0, step=171, resumed=170),
        event("exit", 320.0, code=0),
    ]
    history = FailureHistory.from_events(events)
    assert history.failures == 2
    assert history.wall == pytest.approx(200.0 + 85.0 + 20.0)


def test_a_stop_that_had_to_redo_work_counts_as_a_failure() -> None:
    # The stop's grace ran out before its checkpoint: the next run resumed 40 steps back.
    events = [
        event("start", 0.0), event("first_step", 10.0, at=10.0, step=1),
        event("stop_requested", 100.0), event("kill", 130.0), event("exit", 131.0, code=75),
        event("start", 140.0), event("last_progress", 140.5, at=125.0, step=116),
        event("first_step", 150.0, at=150.0, step=77, resumed=76),
    ]
    assert FailureHistory.from_events(events).failures == 1


def test_a_previous_runs_measured_stall_is_remembered() -> None:
    events = [event("start", 0.0), event("checkpoint_interval", 5.0, steps=10, stall=0.25),
              event("checkpoint_interval", 6.0, steps=5, path="first"),
              event("checkpoint_interval", 7.0, steps=5, stall=True)]
    assert FailureHistory.from_events(events).stall == 0.25
    assert FailureHistory.from_events([]).stall is None


def test_the_events_log_is_the_one_beside_the_nodes_control_file(tmp_path: Path) -> None:
    assert events_beside(tmp_path / "control-node3.json") == tmp_path / "events-node3.jsonl"
    assert events_beside(tmp_path / "somewhere.json") is None
    assert events_beside(None) is None


def run_steps(control: StepControl, clock: FakeClock, steps: int, step_seconds: float,
              stall: float) -> list[int]:
    """Steps of ``step_seconds``; a checkpoint blocks the loop for ``stall``. The checkpoints'
    steps."""
    saved = []
    for _ in range(steps):
        clock.now += step_seconds
        decision = control.step()
        if decision.checkpoint:
            saved.append(decision.step)
            clock.now += stall
    return saved


def test_the_interval_grows_when_saves_become_slower(capsys: pytest.CaptureFixture) -> None:
    clock = FakeClock()
    limits = AutoInterval(min_seconds=5.0, max_seconds=10_000.0, mtbf_prior=3600.0)
    control = StepControl(every_steps=limits, control_file=None, clock=clock)
    fast = run_steps(control, clock, 3000, step_seconds=0.1, stall=0.5)
    # The first checkpoint after min_seconds measures the stall; then Daly's interval for
    # C = 0.5 s, M = 1 h (+ the few minutes run): about 60 s, 600 steps.
    assert fast[0] == 50
    gaps = [b - a for a, b in zip(fast[1:], fast[2:], strict=False)]
    expected = (daly_interval(0.5, 3600.0) + 0.5) / 0.1
    assert all(abs(gap - expected) < 0.1 * expected for gap in gaps), gaps
    slow = run_steps(control, clock, 30_000, step_seconds=0.1, stall=8.0)
    later = [b - a for a, b in zip(slow[3:], slow[4:], strict=False)]
    assert later and min(later) > 3.5 * expected  # sqrt(16) = 4 times longer
    lines = [line for line in capsys.readouterr().err.splitlines() if "checkpoint interval" in line]
    assert 3 <= len(lines) <= 6, lines  # said once per change, not once per checkpoint


def test_one_slow_save_or_one_long_pause_does_not_swing_the_interval() -> None:
    clock = FakeClock()
    control = StepControl(every_steps=AutoInterval(min_seconds=5.0, mtbf_prior=3600.0),
                          control_file=None, clock=clock)
    run_steps(control, clock, 3000, step_seconds=0.1, stall=0.5)
    before = control._interval
    while not control.step().checkpoint:
        clock.now += 0.1
    clock.now += 30.0  # one save 60 times slower than the others
    run_steps(control, clock, 3000, step_seconds=0.1, stall=0.5)
    clock.now += 300.0  # an evaluation between two steps
    run_steps(control, clock, 3000, step_seconds=0.1, stall=0.5)
    assert control._interval == before


def test_an_interval_resumes_from_the_loaded_step(tmp_path: Path) -> None:
    clock = FakeClock()
    control = StepControl(every_steps=AutoInterval(min_seconds=1.0), control_file=None,
                          clock=clock)
    control.load_state_dict({"version": 1, "global_step": 1000})
    assert run_steps(control, clock, 12, step_seconds=0.1, stall=0.0)[0] == 1010


def test_each_change_is_an_event_in_the_jobs_log(tmp_path: Path) -> None:
    supervisor = tmp_path / ".cycler"
    supervisor.mkdir()
    control_file = supervisor / "control-node0.json"
    (supervisor / "events-node0.jsonl").touch()  # cycle run's start made it
    clock = FakeClock()
    control = StepControl(every_steps=AutoInterval(min_seconds=5.0, mtbf_prior=3600.0),
                          control_file=control_file, clock=clock)
    run_steps(control, clock, 2000, step_seconds=0.1, stall=0.5)
    lines = (supervisor / "events-node0.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert [r["event"] for r in records] == ["checkpoint_interval"] * 2
    assert records[0]["path"] == "first" and records[0]["steps"] == 50
    assert records[1]["stall"] == pytest.approx(0.5, abs=0.01)
    assert records[1]["steps"] == control._interval


def test_without_cycle_runs_events_log_no_event_is_written(tmp_path: Path) -> None:
    clock = FakeClock()
    control = StepControl(every_steps=AutoInterval(min_seconds=5.0),
                          control_file=tmp_path / "control-node0.json", clock=clock)
    run_steps(control, clock, 200, step_seconds=0.1, stall=0.5)
    assert control._interval is not None and not (tmp_path / "events-node0.jsonl").exists()


def test_an_unreadable_events_log_leaves_the_prior_alone(tmp_path: Path) -> None:
    (tmp_path / "events-node0.jsonl").mkdir()  # not a file: reading it fails
    clock = FakeClock()
    control = StepControl(every_steps=AutoInterval(min_seconds=5.0, mtbf_prior=3600.0),
                          control_file=tmp_path / "control-node0.json", clock=clock)
    saved = run_steps(control, clock, 3000, step_seconds=0.1, stall=0.5)
    assert saved[0] == 50 and control._interval == pytest.approx(
        (daly_interval(0.5, 3600.0) + 0.5) / 0.1, rel=0.1)


def test_a_clock_that_stood_still_for_a_step_does_not_freeze_the_step_time() -> None:
    clock = FakeClock()
    control = StepControl(every_steps=AutoInterval(min_seconds=5.0, mtbf_prior=3600.0),
                          control_file=None, clock=clock)
    control.step()
    control.step()  # no time passed: a step of 0 s
    saved = run_steps(control, clock, 3000, step_seconds=0.1, stall=0.5)
    assert 40 <= saved[0] <= 60, saved[:3]
