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
from cycler.supervisor.shell import stops_elsewhere
from cycler.supervisor.store_link import StoreLink

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


def test_a_stop_from_any_node_reaches_every_node_through_the_store(
        links: tuple[RunRecord, list[StoreLink]]) -> None:
    run_record, made = links
    request = ControlRequest(sequence=1, action=Action.CHECKPOINT_AND_EXIT, reason="SIGTERM",
                             requested_at=time.time(), deadline=None)
    made[2].say_stop(request.to_json())
    for node in (0, 1):
        found = stops_elsewhere(run_record, node, since=0.0, link=made[node])
        assert [r.reason for r in found] == ["SIGTERM"], f"node {node}"
    assert stops_elsewhere(run_record, 2, since=0.0, link=made[2]) == [], "its own stop"
    assert not any(run_record.control_path(node).exists() for node in range(NODES))
    for link in made:  # and every beat reads it, without being asked
        assert [json.loads(e["request"])["reason"] for e in link.stops() or []] == ["SIGTERM"]
