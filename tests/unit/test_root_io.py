"""The supervisor's calls on the root while the workers train run in one thread
(cycler.supervisor.nodes.root_io), so a frozen root never holds up its loop: the heartbeat still
reaches the store while the file write is stuck, and a stuck call is not piled on."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from cycler.protocol.record import RunRecord
from cycler.supervisor.nodes.peers import Heartbeat
from cycler.supervisor.nodes.root_io import RootIO


class Frozen:
    """A root call that blocks until the test thaws it, counting its calls."""

    def __init__(self) -> None:
        self.thawed, self.entered, self.calls = threading.Event(), threading.Event(), 0

    def __call__(self) -> None:
        self.calls += 1
        self.entered.set()
        assert self.thawed.wait(30)


def test_a_call_stuck_on_the_root_holds_up_nobody_and_is_replaced_not_piled_on() -> None:
    io, frozen = RootIO(), Frozen()
    done: list[str] = []
    try:
        io.submit("links", frozen)
        assert frozen.entered.wait(30)
        assert io.busy("links") and not io.busy("heartbeat")
        io.submit("heartbeat", lambda: done.append("first"))
        io.submit("heartbeat", lambda: done.append("second"))  # replaces the one not begun
        frozen.thawed.set()
        finished = threading.Event()
        io.submit("end", finished.set)
        assert finished.wait(30)
        assert done == ["second"] and frozen.calls == 1 and not io.busy("links")
    finally:
        frozen.thawed.set()
        io.close()


class Link:
    connected = True

    def __init__(self) -> None:
        self.published: list[dict[str, Any]] = []

    def publish(self, record: dict[str, Any]) -> None:
        self.published.append(record)


def test_beats_reach_the_store_while_the_heartbeat_file_cannot_be_written(
        tmp_path: Path) -> None:
    run_record = RunRecord(tmp_path)
    run_record.directory.mkdir()
    io, frozen, link = RootIO(), Frozen(), Link()
    try:
        io.submit("heartbeat", frozen)  # the root froze during a file beat
        assert frozen.entered.wait(30)
        heartbeat = Heartbeat(run_record, 1, "run", link, file_every=0.0,  # type: ignore[arg-type]
                              root_io=io)
        for second in range(5):  # every beat is due a file write: none can be
            heartbeat.beat(float(second))
        assert [record["beat"] for record in link.published] == [1, 2, 3, 4, 5]
        assert not run_record.heartbeat_path(1).exists()
    finally:
        frozen.thawed.set()
        io.close()


def test_calls_made_in_order_run_in_their_order_before_named_ones_and_close_waits_for_them(
        ) -> None:
    io, frozen = RootIO(), Frozen()
    done: list[str] = []
    try:
        io.submit("links", frozen)
        assert frozen.entered.wait(30)
        io.submit("heartbeat", lambda: done.append("beat"))
        for event in ("signal", "control", "exit"):
            io.in_order(lambda event=event: done.append(event))  # type: ignore[misc]
        frozen.thawed.set()
        assert io.close(wait=30) == 0
        assert done[:3] == ["signal", "control", "exit"]
    finally:
        frozen.thawed.set()
        io.close()


def test_a_frozen_root_bounds_a_wait_for_an_answer_and_the_close_says_what_was_left_undone(
        ) -> None:
    io, frozen = RootIO(), Frozen()
    try:
        assert io.run("links", lambda: 7, timeout=30) == (True, 7)
        io.in_order(frozen)  # an event append the frozen root holds
        assert frozen.entered.wait(30)
        assert io.run("links", lambda: 8, timeout=0.05) == (False, None)
        io.in_order(lambda: None)
        io.in_order(lambda: None)
        assert io.close(wait=0.05) == 3  # the one under way and the two behind it
    finally:
        frozen.thawed.set()


def test_a_call_waited_for_that_fails_raises_its_error_in_the_caller() -> None:
    io = RootIO()
    try:
        def broken() -> None:
            raise OSError("no such file")

        try:
            io.run("links", broken, timeout=30)
        except OSError as error:
            assert str(error) == "no such file"
        else:
            raise AssertionError("the call's error was swallowed")
    finally:
        io.close()


def test_the_stop_guard_ends_the_process_with_its_verdict_once_the_armed_deadline_passed(
        ) -> None:
    from cycler.supervisor.run_end.stop_guard import StopGuard

    ended: list[int] = []
    fired = threading.Event()

    def end(code: int) -> None:
        ended.append(code)
        fired.set()

    guard = StopGuard(lambda: (74, "exit 74: the newest state is in memory"), end=end)
    guard.arm(3600.0)
    guard.arm(0.05)  # the deadline moved earlier (a scheduler's hard deadline)
    assert fired.wait(30) and ended == [74]


def test_a_stop_guard_disarmed_before_its_deadline_never_fires() -> None:
    from cycler.supervisor.run_end.stop_guard import StopGuard

    ended: list[int] = []
    guard = StopGuard(lambda: (75, "exit 75"), end=ended.append)
    guard.arm(0.2)
    guard.disarm()
    guard.arm(0.0)  # after the end: nothing more
    for thread in threading.enumerate():
        if thread.name == "cycle-stop-guard":
            thread.join(30)
    assert ended == []


def test_an_event_written_later_keeps_the_time_it_happened_and_fields_of_any_name(
        tmp_path: Path) -> None:
    """The supervisor's records reach the root from its thread, after the fact: the time is
    the moment it happened, and a field named ``at`` (the first step's) is a field."""
    from cycler.protocol.events import EventLog, read_events

    EventLog(tmp_path / "events.jsonl", clock=lambda: 99.0).append_at(
        12.5, "first_step", {"at": 12.25, "when": "then"})
    (event,) = read_events(tmp_path / "events.jsonl")
    assert (event["time"], event["event"], event["at"], event["when"]) == (
        12.5, "first_step", 12.25, "then")
