"""The nodes' liveness through node 0's store (issue 36): node 0 watches every node's record
there and names the first one gone; the others watch node 0 and take its verdict; the heartbeat
files count only where a record is not in the store (before a node reached it, after node 0's
store went away)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cycler.protocol.control import Action, ControlRequest, write_control
from cycler.protocol.record import RunRecord
from cycler.supervisor.nodes.peers import VERDICT_NODE, Heartbeat, Loss, PeerWatch
from cycler.supervisor.shell import stops_elsewhere


class FakeLink:
    """What a StoreLink read last, set by the test; what was published and said."""

    def __init__(self, records: dict[int, dict[str, Any]] | None = None) -> None:
        self.read: dict[int, dict[str, Any]] | None = records
        self.published: list[dict[str, Any]] = []
        self.verdicts: list[dict[str, Any]] = []

    def records(self) -> dict[int, dict[str, Any]] | None:
        return self.read

    @property
    def connected(self) -> bool:
        return self.read is not None

    def publish(self, record: dict[str, Any]) -> None:
        self.published.append(record)

    def send_now(self, record: dict[str, Any]) -> None:
        self.published.append(record)

    def say_lost(self, verdict: dict[str, Any]) -> None:
        self.verdicts.append(verdict)


def beat(number: int, pid: int = 7, exit_code: int | None = None) -> dict[str, Any]:
    return {"beat": number, "host": "h", "pid": pid, "exit_code": exit_code, "run": None}


def watch(tmp_path: Path, node: int, link: FakeLink, nnodes: int = 3) -> PeerWatch:
    run_record = RunRecord(tmp_path)
    run_record.directory.mkdir(exist_ok=True)
    return PeerWatch(run_record, node, nnodes, timeout=5.0, link=link)  # type: ignore[arg-type]


def test_node_0_finds_a_silent_node_in_the_store_and_tells_every_node(tmp_path: Path) -> None:
    link = FakeLink()
    peers = watch(tmp_path, 0, link)
    assert peers.lost(0.0) is None  # the first look reads the files (none here)
    link.read = {1: beat(1), 2: beat(1)}
    assert peers.lost(1.0) is None
    link.read = {1: beat(2), 2: beat(2)}
    assert peers.lost(2.0) is None
    link.read = {1: beat(3), 2: beat(2)}  # node 2 stopped beating
    assert peers.lost(3.0) is None
    found = peers.lost(7.5)
    assert found is not None and found.node == 2 and not found.failed
    assert link.verdicts == [{"node": 2, "why": found.why, "failed": False}]


def test_another_node_takes_node_0s_verdict_on_a_node_it_does_not_watch(tmp_path: Path) -> None:
    link = FakeLink()
    peers = watch(tmp_path, 1, link)
    peers.lost(0.0)
    link.read = {0: beat(4), VERDICT_NODE: {"node": 2, "why": "failed (its supervisor exited 1)",
                                            "failed": True}}
    assert peers.lost(1.0) == Loss(2, "failed (its supervisor exited 1)", failed=True)


def test_a_node_not_in_the_store_yet_is_watched_through_its_file(tmp_path: Path) -> None:
    link = FakeLink()
    peers = watch(tmp_path, 0, link, nnodes=2)
    file = RunRecord(tmp_path).heartbeat_path(1)
    file.parent.mkdir(parents=True, exist_ok=True)
    for second in range(8):  # node 1 beats in its file; its store record is still empty
        file.write_text(json.dumps(beat(second + 1)))
        link.read = {1: {}}
        assert peers.lost(float(second)) is None, f"node 1 beats at {second} s"


def test_node_0s_store_gone_its_start_file_is_no_sign_of_life(tmp_path: Path) -> None:
    run_record = RunRecord(tmp_path)
    link = FakeLink()
    peers = watch(tmp_path, 1, link, nnodes=2)
    run_record.heartbeat_path(0).write_text(json.dumps(beat(1)))  # written before its store
    peers.lost(0.0)
    for second in range(1, 4):
        link.read = {0: beat(second + 1), VERDICT_NODE: {}}
        assert peers.lost(float(second)) is None
    link.read = None  # node 0 killed: its store refuses; its file still says beat 1
    assert peers.lost(4.0) is None
    found = peers.lost(8.5)
    assert found is not None and found.node == 0 and "is gone" in found.why


def test_a_restarted_supervisor_counting_from_1_again_is_alive(tmp_path: Path) -> None:
    run_record = RunRecord(tmp_path)
    peers = watch(tmp_path, 0, FakeLink(), nnodes=2)
    run_record.heartbeat_path(1).write_text(json.dumps(beat(80, pid=5, exit_code=75)))
    peers.lost(0.0)  # the earlier run's last record
    for second in range(1, 9):
        run_record.heartbeat_path(1).write_text(json.dumps(beat(second, pid=6)))
        peers.lost(float(second))
    assert peers.waiting(9.0) == [], "node 1 of this run was heard"


def test_a_node_beats_in_its_file_until_it_reaches_the_store_then_there_and_seldom_in_it(
        tmp_path: Path) -> None:
    run_record = RunRecord(tmp_path)
    run_record.directory.mkdir()
    link = FakeLink()
    heartbeat = Heartbeat(run_record, 1, None, link, file_every=10.0)  # type: ignore[arg-type]
    heartbeat.beat(0.0)
    heartbeat.beat(1.0)
    assert json.loads(run_record.heartbeat_path(1).read_text())["beat"] == 2
    link.read = {}
    heartbeat.beat(2.0)
    heartbeat.beat(3.0)
    assert json.loads(run_record.heartbeat_path(1).read_text())["beat"] == 2, "no file each second"
    assert [record["beat"] for record in link.published] == [3, 4]
    heartbeat.beat(11.5)
    assert json.loads(run_record.heartbeat_path(1).read_text())["beat"] == 5, "now and then"
    heartbeat.finish(75)
    assert json.loads(run_record.heartbeat_path(1).read_text())["exit_code"] == 75
    assert link.published[-1]["exit_code"] == 75


class StopsLink(FakeLink):
    """A link whose fresh read of the stops key gives ``found`` (``None``: no answer)."""

    def __init__(self, found: list[dict[str, Any]] | None) -> None:
        super().__init__()
        self.found = found

    def stops_now(self) -> list[dict[str, Any]] | None:
        return self.found


def stop(at: float, action: Action = Action.CHECKPOINT_AND_EXIT) -> str:
    return ControlRequest(sequence=1, action=action, reason="SIGTERM", requested_at=at,
                          deadline=at + 30).to_json()


def test_a_stop_of_another_node_is_read_from_the_store_without_the_nodes_files(
        tmp_path: Path) -> None:
    run_record = RunRecord(tmp_path)
    run_record.directory.mkdir()
    write_control(run_record.control_path(2), ControlRequest.from_json(stop(50.0)))  # the files'
    link = StopsLink([{"node": 1, "request": stop(100.0)}, {"node": 0, "request": stop(100.0)},
                      {"node": 2, "request": stop(10.0)}, {"node": 2, "request": "torn"},
                      {"node": 2, "request": stop(100.0, Action.RUN)}])
    found = stops_elsewhere(run_record, 0, since=20.0, link=link)  # type: ignore[arg-type]
    assert [(r.requested_at, r.deadline) for r in found] == [(100.0, 130.0)], \
        "node 1's only: not its own, not an older one, nor a torn entry, nor a run request"
    link.found = []
    assert stops_elsewhere(run_record, 0, since=20.0, link=link) == [], \
        "the store answered: no file is read"  # type: ignore[arg-type]


def test_where_the_store_does_not_answer_the_other_nodes_files_are_read(tmp_path: Path) -> None:
    run_record = RunRecord(tmp_path)
    run_record.directory.mkdir()
    write_control(run_record.control_path(2), ControlRequest.from_json(stop(50.0)))
    found = stops_elsewhere(run_record, 0, since=20.0, link=StopsLink(None))  # type: ignore[arg-type]
    assert [r.requested_at for r in found] == [50.0]


def test_links_started_without_their_thread_beat_only_when_stepped(tmp_path: Path) -> None:
    from cycler.supervisor.nodes.store_link import StoreLink

    address = tmp_path / "store.json"
    node0 = StoreLink(address, 0, 2, "127.0.0.1", 3600.0, start=False)
    node1 = StoreLink(address, 1, 2, "127.0.0.1", 3600.0, start=False)
    try:
        assert not node0._thread.is_alive() and not node1._thread.is_alive()
        assert node0.records() is None and not address.exists()  # nothing ran yet
        node0.publish(beat(1))
        node0.step()  # hosts the store, writes the address, reads node 1 (nothing yet)
        node1.publish(beat(4))
        node1.say_stop("stop")
        node1.step()  # connects through the address, sends, reads node 0's record
        node0.step()
        assert node0.records() == {1: beat(4)}
        assert node1.records() == {0: beat(1), VERDICT_NODE: {}}
        assert node0.stops() == [{"node": 1, "request": "stop"}]
    finally:
        node1.close()
        node0.close()
