"""The seal on every value of the job's liveness store (issue 36): a value holds only under the
key it was sealed for, with the secret it was sealed with; anything else reads as absent."""

from __future__ import annotations

import json
import os
from pathlib import Path

from cycler.supervisor.nodes.store_link import _read_private, _write_private, seal, unseal

SECRET = bytes(range(32))


def test_a_sealed_value_opens_under_its_key_with_its_secret() -> None:
    assert unseal(SECRET, "cycler/t/lost", seal(SECRET, "cycler/t/lost", '{"node": 1}')) \
        == '{"node": 1}'


def test_a_value_moved_to_another_key_or_sealed_with_another_secret_does_not_hold() -> None:
    sealed = seal(SECRET, "cycler/t/1", '{"beat": 3}')
    assert unseal(SECRET, "cycler/t/2", sealed) is None  # node 1's record as node 2's
    assert unseal(SECRET, "cycler/u/1", sealed) is None  # from another start of node 0
    assert unseal(bytes(32), "cycler/t/1", sealed) is None


def test_a_forged_garbled_or_empty_value_reads_as_absent() -> None:
    forged = json.dumps({"value": '{"node": 1}', "mac": "0" * 64})
    for stored in (forged, '{"node": 1}', b"\xff not json", "", "[]", '{"value": 1, "mac": 2}'):
        assert unseal(SECRET, "cycler/t/lost", stored) is None, stored


def test_the_address_file_is_written_private_and_read_only_when_it_is(tmp_path: Path) -> None:
    address = tmp_path / "liveness-store.json"
    _write_private(address, b'{"port": 1}')
    assert address.stat().st_mode & 0o777 == 0o600
    assert _read_private(address) == {"port": 1}
    os.chmod(address, 0o644)  # readable by others: its secret is no secret
    assert _read_private(address) == {}
    link = tmp_path / "link.json"
    link.symlink_to(address)
    os.chmod(address, 0o600)
    assert _read_private(link) == {}
    assert _read_private(tmp_path / "missing.json") == {}
