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
