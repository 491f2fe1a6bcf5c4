"""A stop travels through node 0's liveness store (issue 36): real StoreLinks of three nodes
over a real TCPStore on this host; a stop said on any node is read on every node at its next
beat, and a node's fresh read at its workers' exit sees it without any control file."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cycler.protocol.control import Action, ControlRequest
from cycler.protocol.names import LIVENESS_STORE_FILENAME
from cycler.protocol.record import RunRecord
from cycler.supervisor.nodes.store_link import StoreLink
from cycler.supervisor.shell import stops_elsewhere

NODES = 3


@pytest.fixture
def links(tmp_path: Path) -> Iterator[tuple[RunRecord, list[StoreLink]]]:
    run_record = RunRecord(tmp_path / "root")
    run_record.directory.mkdir(parents=True)
    address = run_record.directory / LIVENESS_STORE_FILENAME
    made = [StoreLink(address, node, NODES, "127.0.0.1", 0.5) for node in range(NODES)]
    try:
        deadline = time.monotonic() + 60
        while not all(link.connected for link in made):
            assert time.monotonic() < deadline, "the links never reached node 0's store"
            time.sleep(0.1)
        yield run_record, made
    finally:
        for link in made:
            link.close()


def say_sigterm(link: StoreLink) -> None:
    """What the supervisor that gets SIGTERM says to every node; returns once its own link's
    beat has put it in the store (say_stop sends it from the link's thread: a fresh read on
    another node begun before that append would rightly see none)."""
    request = ControlRequest(sequence=1, action=Action.CHECKPOINT_AND_EXIT, reason="SIGTERM",
                             requested_at=time.time(), deadline=None)
    link.say_stop(request.to_json())
    deadline = time.monotonic() + 10
    while not link.stops():
        assert time.monotonic() < deadline, "the stop never reached the store"
        time.sleep(0.05)


def test_a_stop_from_any_node_reaches_every_node_through_the_store(
        links: tuple[RunRecord, list[StoreLink]]) -> None:
    run_record, made = links
    say_sigterm(made[2])
    for node in (0, 1):
        found = stops_elsewhere(run_record, node, since=0.0, link=made[node])
        assert [r.reason for r in found] == ["SIGTERM"], f"node {node}"
    assert stops_elsewhere(run_record, 2, since=0.0, link=made[2]) == [], "its own stop"
    assert not any(run_record.control_path(node).exists() for node in range(NODES))
    for link in made:  # and every beat reads it, without being asked
        assert [json.loads(e["request"])["reason"] for e in link.stops() or []] == ["SIGTERM"]


def stranger(run_record: RunRecord) -> tuple[object, str]:
    """Another process on the host: it reaches node 0's store port (TCP checks no owner) and
    finds the job's prefix with list_keys, but cannot read the user's address file's secret."""
    import datetime

    import torch.distributed as dist

    address = json.loads((run_record.directory / LIVENESS_STORE_FILENAME).read_text())
    store = dist.TCPStore("127.0.0.1", address["port"], is_master=False, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=5))
    prefix = next(k for k in store.list_keys() if k.startswith("cycler/")).rsplit("/", 1)[0]
    return store, prefix + "/"


def test_the_address_holds_a_secret_that_only_the_user_can_read(
        links: tuple[RunRecord, list[StoreLink]]) -> None:
    run_record, _ = links
    address = run_record.directory / LIVENESS_STORE_FILENAME
    assert address.stat().st_mode & 0o777 == 0o600
    assert len(json.loads(address.read_text())["secret"]) == 64


def test_a_verdict_a_record_and_a_stop_written_by_a_stranger_are_ignored(
        links: tuple[RunRecord, list[StoreLink]], capfd: pytest.CaptureFixture[str]) -> None:
    run_record, made = links
    store, prefix = stranger(run_record)
    store.set(prefix + "lost", json.dumps({"node": 1, "why": "a stranger said so"}))
    store.set(prefix + "2", json.dumps({"beat": 10**6, "exit_code": 1, "host": "x", "pid": 1}))
    request = ControlRequest(sequence=9, action=Action.CHECKPOINT_AND_EXIT, reason="stranger",
                             requested_at=time.time(), deadline=None)
    store.append(prefix + "stops", json.dumps({"node": 1, "request": request.to_json()}) + "\n")
    found: list = []
    deadline = time.monotonic() + 3  # six beats: every link has read the forged values
    while time.monotonic() < deadline:
        verdict = (made[1].records() or {}).get(-1)
        record_of_2 = (made[0].records() or {}).get(2)
        found = [verdict, record_of_2, made[1].stops()]
        time.sleep(0.2)
    verdict, record_of_2, stops = found
    assert verdict == {}, "the stranger's verdict is read as none"
    assert record_of_2 is not None and record_of_2.get("exit_code") is None
    assert stops == [], "the stranger's stop request is not the job's"
    assert stops_elsewhere(run_record, 0, since=0.0, link=made[0]) == []
    said = capfd.readouterr().err
    assert said.count("that this job did not write") <= 3 * NODES, said  # once per key per node
    assert "'lost'" in said and "'stops'" in said


def test_a_stop_request_a_stranger_erased_is_appended_again(
        links: tuple[RunRecord, list[StoreLink]]) -> None:
    run_record, made = links
    say_sigterm(made[2])
    assert [r.reason for r in stops_elsewhere(run_record, 0, 0.0, made[0])] == ["SIGTERM"]
    store, prefix = stranger(run_record)
    store.set(prefix + "stops", "")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if [r.reason for r in stops_elsewhere(run_record, 0, 0.0, made[0])] == ["SIGTERM"]:
            break
        time.sleep(0.1)
    else:
        raise AssertionError("the erased stop was never appended again")
