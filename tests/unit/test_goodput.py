"""Goodput from an events log: a scripted job with known stops, restarts, a hang and a requeue,
every figure checked against the truth to the millisecond (the goal: within 0.5 s)."""

from __future__ import annotations

import pytest

from cycler.protocol.goodput import goodput


def event(name: str, time: float, **fields: object) -> dict[str, object]:
    return {"event": name, "time": time, **fields}


# Run 1 (t=0..200): start, first step at 10; checkpoints at 40 and 70; a worker crashes at 90
# (20 s since the checkpoint redone); restarted, first step at 96 (6 s restart); checkpoint at
# 130; a hang: no progress from 150, found at 160 (10 s hang, 20 s since 130 redone); restarted,
# first step at 165; checkpoint at 180; SIGTERM at 190, exit 75 at 200 (10 s stop).
# Run 2 (t=1000..1050, after the requeue): start, first step at 1008 (8 s), exit 0 at 1050.
JOB = [
    event("start", 0.0), event("workers_started", 0.5), event("first_step", 10.2, at=10.0),
    event("checkpoint_committed", 40.0, index=0), event("checkpoint_committed", 70.0, index=1),
    event("workers_exited", 90.0, code=1), event("restart_scheduled", 90.0),
    event("workers_started", 91.0), event("first_step", 96.3, at=96.0),
    event("checkpoint_committed", 130.0, index=2),
    event("hang", 160.0, silent_for=10.0), event("workers_exited", 160.5, code=-9),
    event("restart_scheduled", 160.5), event("first_step", 165.4, at=165.0),
    event("checkpoint_committed", 180.0, index=3),
    event("signal", 190.0, signal="SIGTERM", effect="checkpoint_and_exit"),
    event("stop_requested", 190.0), event("checkpoint_committed", 195.0, index=4),
    event("workers_exited", 199.0, code=0), event("exit", 200.0, code=75),
    event("start", 1000.0), event("first_step", 1008.5, at=1008.0),
    event("checkpoint_committed", 1030.0, index=5), event("exit", 1050.0, code=0),
]


def test_every_figure_of_a_scripted_job_matches_the_truth() -> None:
    figures = goodput(JOB)
    assert figures.runs == 2 and not figures.running
    assert figures.wall == pytest.approx(200.0 + 50.0)
    # The first start; a later run's start belongs to the interruption that made it needed.
    assert figures.starting == pytest.approx(10.0)
    failure, hang, stop = figures.interruptions
    assert (failure.kind, failure.at) == ("failure", 90.0)
    assert failure.parts == pytest.approx({"backoff": 1.0, "first_step": 5.0, "redone": 20.0})
    assert (hang.kind, hang.at) == ("hang", 150.0)
    assert hang.parts == pytest.approx({"hang": 10.0, "kill": 0.5, "backoff": 4.5,
                                        "redone": 20.0})
    assert (stop.kind, stop.at) == ("stop", 190.0)
    assert stop.parts == pytest.approx({"stop": 9.0, "exit": 1.0, "cycle_start": 8.0})
    assert figures.restarts == pytest.approx(6.0) and figures.hangs == pytest.approx(15.0)
    assert figures.stops == pytest.approx(18.0)
    assert figures.redone == pytest.approx((90.0 - 70.0) + (150.0 - 130.0))
    training = 250.0 - 10.0 - 6.0 - 15.0 - 18.0
    assert figures.training == pytest.approx(training)
    assert figures.useful == pytest.approx(training - 40.0)
    assert figures.goodput == pytest.approx((training - 40.0) / 250.0)


def test_a_run_still_going_counts_to_its_latest_event() -> None:
    figures = goodput(JOB[:5])
    assert figures.running and figures.wall == pytest.approx(70.0)
    assert figures.starting == pytest.approx(10.0) and figures.redone == 0.0


def test_a_run_killed_without_its_exit_ends_at_its_last_event() -> None:
    killed = [event("start", 0.0), event("first_step", 5.0, at=5.0),
              event("checkpoint_committed", 20.0), event("start", 100.0),
              event("exit", 110.0, code=0)]
    figures = goodput(killed)
    assert figures.wall == pytest.approx(20.0 + 10.0) and figures.runs == 2


def test_an_empty_log_has_no_goodput() -> None:
    assert goodput([]).goodput is None


def test_cycle_status_says_what_preemption_cost_and_json_carries_the_figures(tmp_path) -> None:
    import json

    from typer.testing import CliRunner

    from cycler_cli.main import app

    log = tmp_path / ".cycler" / "events-node0.jsonl"
    log.parent.mkdir()
    log.write_text("".join(json.dumps(record) + "\n" for record in JOB))
    runner = CliRunner()
    text = runner.invoke(app, ["status", str(tmp_path)]).output
    assert "Goodput 64.4%" in text and "in 2 runs" in text and "redone 40s" in text, text
    figures = json.loads(runner.invoke(app, ["status", str(tmp_path), "--json"]).stdout)
    assert figures["goodput"]["redone"] == 40.0 and figures["goodput"]["wall"] == 250.0
    assert "1 preemption (a stop asked for), 1 failure, 1 hang" in text, text
    assert "stop: 18.0 s, most stop 9.0 s" in text, text
    assert figures["goodput"]["preemptions"] == 1 and figures["goodput"]["failures"] == 1
    assert figures["goodput"]["interruptions"][2]["parts"]["cycle_start"] == 8.0


def test_a_stop_that_came_after_the_training_ended_is_no_interruption() -> None:
    finished = [event("start", 0.0), event("first_step", 5.0, at=5.0),
                event("checkpoint_committed", 20.0, index=0),
                event("signal", 30.0, signal="SIGTERM", effect="checkpoint_and_exit"),
                event("stop_requested", 30.0), event("workers_exited", 31.0, code=0),
                event("stop_after_training", 31.0), event("exit", 31.0, code=0)]
    figures = goodput(finished)
    assert figures.interruptions == [] and figures.stops == 0.0
    assert figures.wall == pytest.approx(31.0)
