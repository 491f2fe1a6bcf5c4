"""The supervisor and writer locks where the filesystem has no flock (Lustre noflock: ENOSYS)."""

from __future__ import annotations

import errno
import json
import logging
import socket
from pathlib import Path

import pytest

from cycler.checkpoint.lock import SupervisorLock, lock_holder
from cycler.errors import DirectoryInUse


def no_flock(fd: int, operation: int) -> None:
    raise OSError(errno.ENOSYS, "Function not implemented")


def test_without_flock_a_lock_file_excludes_a_second_holder_and_is_gone_on_release(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / ".cycler" / "supervisor-node0.lock"
    first = SupervisorLock(path, flock=no_flock)
    with caplog.at_level(logging.WARNING):
        first.acquire(role="supervisor")
    assert "flock is not supported" in caplog.text
    assert lock_holder(path, flock=no_flock)["role"] == "supervisor"
    with pytest.raises(DirectoryInUse, match="in use by a live cycle run"):
        SupervisorLock(path, flock=no_flock).acquire()
    first.release()
    assert lock_holder(path, flock=no_flock) is None
    second = SupervisorLock(path, flock=no_flock)
    second.acquire()
    second.release()


def test_a_lock_file_left_by_a_dead_process_on_this_host_is_taken_over(tmp_path: Path) -> None:
    path = tmp_path / "writer.lock"
    held = tmp_path / "writer.lock.held"
    held.write_text(json.dumps({"pid": 2**22 + 7, "host": socket.gethostname(),
                                "started": "1"}))
    lock = SupervisorLock(path, flock=no_flock)
    lock.acquire()
    assert json.loads(held.read_text())["pid"] != 2**22 + 7
    lock.release()


def test_a_lock_file_of_another_host_is_respected(tmp_path: Path) -> None:
    path = tmp_path / "writer.lock"
    (tmp_path / "writer.lock.held").write_text(json.dumps({"pid": 1, "host": "node-b"}))
    with pytest.raises(DirectoryInUse, match="pid 1 on node-b"):
        SupervisorLock(path, flock=no_flock).acquire()
