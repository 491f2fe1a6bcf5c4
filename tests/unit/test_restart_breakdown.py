"""What each interruption cost, part by part, from hand-built events logs: a stop, a kill -9 of
the whole job, a Slurm requeue's wait, a failure; and the workers' marks the parts come from."""

from __future__ import annotations

import time

import pytest

from cycler.protocol.goodput import goodput
from cycler.protocol.progress import Beacon, last_progress, read_beacons, start_up


def event(name: str, time: float, **fields: object) -> dict[str, object]:
    return {"event": name, "time": time, **fields}


def first_run(stop_at: float = 100.0) -> list[dict[str, object]]:
    """Process started at 0, its first step at 10 (step 1); a SIGTERM at ``stop_at``."""
    return [event("start", 1.5, process_started=0.0), event("workers_started", 2.0),
            event("first_step", 10.5, at=10.0, step=1, marks={}),
            event("checkpoint_committed", 50.0, index=0),
            event("signal", stop_at, signal="SIGTERM", effect="checkpoint_and_exit"),
            event("stop_requested", stop_at + 0.1),
            event("workers_exited", stop_at + 3.0, code=0),
            event("exit", stop_at + 3.2, code=75), event("ended", stop_at + 3.4, code=75)]


MARKS = {"spawned": 106.5, "imported": 109.0, "ready": 110.0, "loaded": 111.0}


def second_run(begin: float = 104.0, last: object = None) -> list[dict[str, object]]:
    """A rerun whose process started at ``begin``, resuming at step 500."""
    shift = begin - 104.0
    return [event("start", begin + 1.6, process_started=begin),
            *([] if last is None else [event("last_progress", begin + 1.8, **last)]),  # type: ignore[arg-type]
            event("workers_started", begin + 2.0),
            event("first_step", 113.2 + shift, at=113.0 + shift, step=501, compile=0.5,
                  marks={name: value + shift for name, value in MARKS.items()}),
            event("exit", 200.0 + shift, code=0), event("ended", 200.1 + shift, code=0)]


def test_a_stop_is_split_into_parts_from_the_signal_to_the_first_step_after_the_rerun() -> None:
    figures = goodput(first_run() + second_run(last={"at": 102.5, "step": 500}))
    (stop,) = figures.interruptions
    assert (stop.kind, stop.at, stop.complete) == ("stop", 100.0, True)
    assert stop.parts == pytest.approx({
        "decision": 0.1, "stop": 2.9, "exit": 0.4, "cycle_start": 2.0, "spawn": 0.5,
        "imports": 2.5, "process_group": 1.0, "load": 1.0, "compile": 0.5, "first_step": 1.5})
    assert stop.biggest == ("stop", pytest.approx(2.9))
    assert stop.lost == pytest.approx(12.4)  # the 0.6 s between the runs is nobody's
    assert figures.wall == pytest.approx(103.4 + (200.1 - 104.0))
    assert figures.starting == pytest.approx(10.0) and figures.redone == 0.0
    assert figures.training == pytest.approx(figures.wall - 10.0 - 12.4)


def test_a_kill_of_the_whole_job_costs_until_the_newest_step_and_the_steps_trained_again() -> None:
    killed = [event("start", 1.0, process_started=0.0), event("workers_started", 1.5),
              event("first_step", 5.5, at=5.0, step=1, marks={}),
              event("checkpoint_committed", 80.0, index=0)]  # step 800; no exit: kill -9
    rerun = [event("start", 120.0, process_started=119.0),
             event("last_progress", 120.5, at=100.0, step=951),
             event("workers_started", 121.0),
             event("first_step", 126.5, at=126.0, step=803, resumed=800),
             event("ended", 150.0, code=0)]
    figures = goodput(killed + rerun)
    (kill,) = figures.interruptions
    assert (kill.kind, kill.at) == ("kill", 100.0)
    # 0.1 s a step (950 steps from 5 s to 100 s), 151 steps past the resumed step 800.
    assert kill.parts == pytest.approx({"cycle_start": 2.0, "first_step": 5.0, "redone": 15.1})
    assert figures.wall == pytest.approx(100.0 + 31.0)  # the killed run ends at its last step
    assert figures.redone == pytest.approx(15.1) and figures.kills == pytest.approx(7.0)
    assert figures.useful == pytest.approx(131.0 - 5.0 - 7.0 - 15.1)


def test_a_requeue_wait_between_runs_is_counted_as_queue() -> None:
    requeued = first_run() + [event("requeue", 103.3, accepted=True, job_id="7")]
    figures = goodput(requeued + second_run(begin=130.0))
    (stop,) = figures.interruptions
    assert stop.parts["queue"] == pytest.approx(130.0 - 103.4)
    assert figures.queue == pytest.approx(26.6)
    assert figures.wall == pytest.approx(103.4 + 26.6 + (226.1 - 130.0))


def test_a_gap_after_a_refused_requeue_or_no_requeue_is_not_counted() -> None:
    refused = first_run() + [event("requeue", 103.3, accepted=False, job_id="7")]
    for log in (refused, first_run()):
        figures = goodput(log + second_run(begin=130.0))
        assert figures.queue == 0.0 and "queue" not in figures.interruptions[0].parts
        assert figures.wall == pytest.approx(103.4 + (226.1 - 130.0))


def test_a_failure_counts_from_the_newest_progress_and_redoes_the_steps_since_the_checkpoint(
        ) -> None:
    log = [event("start", 1.0, process_started=0.0), event("workers_started", 1.5),
           event("first_step", 5.5, at=5.0, step=1, marks={}),
           event("checkpoint_committed", 50.0, index=0),  # step 500
           event("workers_exited", 60.0, code=1), event("restart_scheduled", 60.0),
           event("last_progress", 61.0, at=58.0, step=531),
           event("workers_started", 61.0), event("first_step", 65.2, at=65.0, step=501),
           event("exit", 70.0, code=0), event("ended", 70.1, code=0)]
    figures = goodput(log)
    (failure,) = figures.interruptions
    assert (failure.kind, failure.at) == ("failure", 58.0)
    rate = (58.0 - 5.0) / 530
    assert failure.parts == pytest.approx({"detection": 2.0, "backoff": 1.0, "first_step": 4.0,
                                           "redone": 31 * rate})
    assert figures.restarts == pytest.approx(7.0)


def test_a_stop_with_no_first_step_after_it_yet_is_shown_unfinished() -> None:
    figures = goodput(first_run())
    (stop,) = figures.interruptions
    assert not stop.complete and stop.lost == pytest.approx(3.4)


def test_a_workers_beacon_carries_its_start_up_marks_and_its_newest_step(tmp_path) -> None:
    beacon = Beacon(tmp_path / "rank-0.beacon")
    beacon.note("imported")  # what cycler's API does once torch is in (if not before)
    beacon.note("ready")
    beacon.note("loaded", 40)
    with beacon.phase(2, "compile"):
        time.sleep(0.05)
    stepped = time.time()
    beacon.progress(41)
    beacon.progress(42)
    before = time.time()
    beacon.note("ready")  # a second time changes nothing
    (reading,) = read_beacons(tmp_path)
    fields = start_up([reading])
    marks = fields["marks"]
    assert isinstance(marks, dict) and list(marks) == ["spawned", "imported", "ready", "loaded"]
    assert marks["spawned"] <= marks["imported"] <= marks["ready"] <= marks["loaded"] <= before
    assert fields["step"] == 41 and fields["resumed"] == 40, "the first step, not the newest"
    assert abs(float(fields["at"]) - stepped) < 0.05  # type: ignore[arg-type]
    assert 0.05 <= float(fields["compile"]) < 1.0  # type: ignore[arg-type]
    newest = last_progress([reading])
    assert newest is not None and newest["step"] == 42
    assert abs(float(newest["at"]) - time.time()) < 1.0  # type: ignore[arg-type]


def test_malformed_fields_are_ignored_not_a_crash_nor_a_wrong_wall() -> None:
    garbage: list[object] = ["soon", None, True, float("nan"), [1], {"a": 1}, -1e12]
    for value in garbage:
        log = [event("start", 1.5, process_started=value), event("workers_started", 2.0),
               event("first_step", 10.5, at=value, step=value, compile=value,
                     marks={"spawned": value, "imported": value}, resumed=value),
               event("hang", 20.0, silent_for=value), event("workers_exited", 20.5, code=-9),
               event("last_progress", 21.0, at=value, step=value),
               event("workers_started", 21.0), event("first_step", 25.0, at=value, step=value),
               event("ended", 30.0, code=0)]
        figures = goodput(log)
        assert 28.5 <= figures.wall <= 30.0, value  # a start long before the event is not believed
        assert 0.0 <= figures.useful <= figures.wall and figures.goodput is not None


def test_a_stop_before_the_first_step_is_an_interruption_and_the_start_so_far_is_starting(
        ) -> None:
    log = [event("start", 1.0, process_started=0.0), event("workers_started", 2.0),
           event("signal", 6.0, signal="SIGTERM", effect="checkpoint_and_exit"),
           event("stop_requested", 6.0), event("workers_exited", 7.0, code=0),
           event("ended", 7.5, code=75), *second_run(begin=10.0)]
    figures = goodput(log)
    assert figures.starting == pytest.approx(6.0)
    (stop,) = figures.interruptions
    assert stop.kind == "stop" and stop.complete
    assert stop.parts["stop"] == pytest.approx(1.0) and stop.parts["exit"] == pytest.approx(0.5)
    assert stop.parts["cycle_start"] == pytest.approx(2.0)
