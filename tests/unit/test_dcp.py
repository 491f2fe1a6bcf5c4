"""DcpSaves: a saver's save(), load() and wait() written by torch.distributed.checkpoint (real
DCP, one process) for a fake saver, with a fake coordinator saying which rank this is."""

from __future__ import annotations

import errno
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
import torch
from saver_fakes import FakeCoordinator

from cycler.checkpoint import dcp
from cycler.checkpoint.dcp import DcpSaves, disk_full_or
from cycler.checkpoint.in_flight import InFlight
from cycler.checkpoint.layout import MANIFEST_NAME
from cycler.checkpoint.manifest import sealed
from cycler.errors import DiskFull

try:
    from torch.distributed.checkpoint.staging import DefaultStager  # noqa: F401
    HAS_STAGER = True
except ImportError:  # torch before 2.9: tests/unit/test_torch_versions.py checks the error
    HAS_STAGER = False
NEEDS_STAGER = pytest.mark.skipif(not HAS_STAGER, reason=f"torch {torch.__version__} has no "
                                  "DCP DefaultStager: asynchronous saves need torch 2.9")

pytestmark = [pytest.mark.filterwarnings("ignore::UserWarning")]


class FakeSaver:
    """The saver's private steps DcpSaves calls (:class:`cycler.checkpoint.dcp.Saver`): numbered
    directories in ``root``, a commit that writes the manifest, the memory tier a flag."""

    def __init__(self, root: Path, in_memory: bool = False) -> None:
        self.root, self.in_memory = root, in_memory
        self.prepared: list[Path] = []
        self.committed: list[tuple[Path, Mapping[str, Any] | None]] = []
        self.left: list[str] = []
        self.fail_prepare: OSError | None = None

    def _prepare(self, force_save: bool) -> str:
        if self.fail_prepare is not None:
            raise self.fail_prepare
        path = self.root / f"checkpoint_{len(self.prepared)}"
        path.mkdir()
        self.prepared.append(path)
        return str(path)

    def _commit(self, checkpoint_directory: str | Path, metadata: Mapping[str, Any] | None,
                committed: Callable[[], None] = lambda: None) -> None:
        path = Path(checkpoint_directory)
        manifest = sealed(path, index=len(self.committed), metadata=dict(metadata or {}))
        (path / MANIFEST_NAME).write_text(manifest.to_json())
        self.committed.append((path, metadata))
        committed()

    def _agreed(self, requested: str | None, strict: bool) -> Path | None:
        return self.committed[-1][0] if self.committed else None

    def _ensure_node_group(self) -> None:
        pass

    def _in_memory_tier(self) -> bool:
        return self.in_memory

    def _leave_memory_tier(self, why: str) -> None:
        self.left.append(why)
        self.in_memory = False


class Failing:
    """A ``Stateful`` whose ``state_dict()`` raises ``error`` its first ``times`` calls: a
    failure inside DCP's write, after the directory was prepared."""

    def __init__(self, error: BaseException, times: int = 1) -> None:
        self.error, self.times = error, times

    def state_dict(self) -> dict[str, Any]:
        if self.times > 0:
            self.times -= 1
            raise self.error
        return {"weights": torch.ones(4)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


def test_a_save_writes_dcp_into_the_prepared_directory_commits_it_and_loads_back(
        tmp_path: Path) -> None:
    saves, saver = DcpSaves(FakeCoordinator(), "sync_any"), FakeSaver(tmp_path)
    handle = saves.save(saver, {"weights": torch.arange(6.0)}, {"step": 3})
    assert handle.done() and handle.directory == str(saver.prepared[0])
    assert saver.committed == [(saver.prepared[0], {"step": 3})]
    assert (saver.prepared[0] / ".metadata").is_file()
    loaded = {"weights": torch.zeros(6)}
    assert saves.load(saver, loaded) == {"step": 3}
    assert torch.equal(loaded["weights"], torch.arange(6.0))


@pytest.mark.parametrize(("rank", "removed"), [(0, True), (1, False)])
def test_a_dcp_save_that_fails_is_not_committed_and_rank_0_removes_its_directory(
        tmp_path: Path, rank: int, removed: bool) -> None:
    saves = DcpSaves(FakeCoordinator(rank, 2), "sync_any")
    saver = FakeSaver(tmp_path)
    with pytest.raises(ValueError, match="a bad tensor"):
        saves.save(saver, {"model": Failing(ValueError("a bad tensor"))})
    assert saver.committed == []
    assert saver.prepared[0].exists() is not removed
    assert not any(p.name.startswith(".checkpoint_0") for p in tmp_path.iterdir())


def test_a_full_disk_in_the_checkpoint_root_is_disk_full(tmp_path: Path) -> None:
    saves, saver = DcpSaves(FakeCoordinator(), "sync_any"), FakeSaver(tmp_path)
    full = OSError(errno.ENOSPC, "No space left on device")
    with pytest.raises(DiskFull) as raised:
        saves.save(saver, {"model": Failing(full)})
    assert raised.value.errno == errno.ENOSPC and saver.left == []
    assert saver.committed == [] and not saver.prepared[0].exists()


def test_a_save_that_does_not_fit_in_memory_goes_to_the_checkpoint_root_instead(
        tmp_path: Path) -> None:
    saves, saver = DcpSaves(FakeCoordinator(), "sync_any"), FakeSaver(tmp_path, in_memory=True)
    full = OSError(errno.ENOSPC, "No space left on device")
    handle = saves.save(saver, {"model": Failing(full)}, {"step": 1})
    assert saver.left == ["a save did not fit"]
    assert handle.directory == str(saver.prepared[1]) and not saver.prepared[0].exists()
    assert saver.committed == [(saver.prepared[1], {"step": 1})]


@NEEDS_STAGER
def test_an_asynchronous_save_commits_in_the_background_from_its_snapshot(
        tmp_path: Path) -> None:
    saves, saver = DcpSaves(FakeCoordinator(), "sync_any"), FakeSaver(tmp_path)
    weights = torch.ones(8)
    handle = saves.save(saver, {"weights": weights}, {"step": 1}, asynchronous=True)
    weights.fill_(2.0)  # the training goes on: the snapshot was taken
    handle.wait()
    saves.wait()
    loaded = {"weights": torch.zeros(8)}
    assert saves.load(saver, loaded) == {"step": 1}
    assert torch.equal(loaded["weights"], torch.ones(8))


@NEEDS_STAGER
def test_a_background_failure_the_handle_raised_does_not_fail_the_next_save(
        tmp_path: Path) -> None:
    saves, saver = DcpSaves(FakeCoordinator(), "sync_any"), FakeSaver(tmp_path)
    saver.fail_prepare = OSError(errno.EIO, "Input/output error")
    handle = saves.save(saver, {"weights": torch.ones(2)}, asynchronous=True)
    with pytest.raises(OSError, match="Input/output error"):
        handle.wait()
    saver.fail_prepare = None
    saves.save(saver, {"weights": torch.ones(2)}, {"step": 2})  # settles without raising
    assert [metadata for _, metadata in saver.committed] == [{"step": 2}]


@NEEDS_STAGER
def test_a_background_failure_nobody_was_told_of_fails_the_next_save_once(
        tmp_path: Path) -> None:
    saves, saver = DcpSaves(FakeCoordinator(), "sync_any"), FakeSaver(tmp_path)
    saver.fail_prepare = OSError(errno.EIO, "Input/output error")
    saves.save(saver, {"weights": torch.ones(2)}, asynchronous=True)
    saver.fail_prepare = None
    with pytest.raises(OSError, match="Input/output error"):
        saves.save(saver, {"weights": torch.ones(2)})
    saves.save(saver, {"weights": torch.ones(2)}, {"step": 3})
    assert [metadata for _, metadata in saver.committed] == [{"step": 3}]


HELD = 30.0
"""The longest a held save waits to be let go: never reached by a test that passes."""


class HeldSaver(FakeSaver):
    """A :class:`FakeSaver` whose saves in the background wait, before they prepare, until the
    script's thread waits for a save in flight (or prepares one itself); its prepares and
    commits logged in order."""

    def __init__(self, root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        super().__init__(root)
        self.log: list[str] = []
        self.waited = threading.Event()
        self._script = threading.current_thread()
        real, waited = InFlight.wait, self.waited

        def wait(in_flight: InFlight, reported_too: bool = True) -> None:
            waited.set()
            real(in_flight, reported_too)

        monkeypatch.setattr(InFlight, "wait", wait)

    def _prepare(self, force_save: bool) -> str:
        if threading.current_thread() is self._script:
            self.waited.set()  # nothing else could let the save in flight go on now
        else:
            assert self.waited.wait(HELD)
        path = super()._prepare(force_save)
        self.log.append(f"prepare {Path(path).name}")
        return path

    def _commit(self, checkpoint_directory: str | Path, metadata: Mapping[str, Any] | None,
                committed: Callable[[], None] = lambda: None) -> None:
        super()._commit(checkpoint_directory, metadata, committed)
        self.log.append(f"commit {Path(checkpoint_directory).name}")


@NEEDS_STAGER
def test_the_next_save_waits_for_the_save_in_flight_before_it_prepares(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    saves, saver = DcpSaves(FakeCoordinator(), "sync_any"), HeldSaver(tmp_path, monkeypatch)
    saves.save(saver, {"weights": torch.ones(2)}, {"step": 1}, asynchronous=True)
    saves.save(saver, {"weights": torch.ones(2)}, {"step": 2})
    assert saver.log == ["prepare checkpoint_0", "commit checkpoint_0",
                         "prepare checkpoint_1", "commit checkpoint_1"]


@NEEDS_STAGER
def test_a_load_waits_for_the_save_in_flight_and_reads_what_it_committed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    saves, saver = DcpSaves(FakeCoordinator(), "sync_any"), HeldSaver(tmp_path, monkeypatch)
    saves.save(saver, {"weights": torch.arange(3.0)}, {"step": 1}, asynchronous=True)
    loaded = {"weights": torch.zeros(3)}
    try:
        assert saves.load(saver, loaded) == {"step": 1}
    finally:
        saver.waited.set()
        saves.wait()
    assert torch.equal(loaded["weights"], torch.arange(3.0))


@NEEDS_STAGER
def test_the_stop_s_own_asynchronous_save_is_committed_before_save_returns(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dcp, "stopping", lambda: True)
    saves, saver = DcpSaves(FakeCoordinator(), "sync_any"), HeldSaver(tmp_path, monkeypatch)
    try:
        handle = saves.save(saver, {"weights": torch.ones(2)}, {"step": 9}, asynchronous=True)
        assert handle.done() and [metadata for _, metadata in saver.committed] == [{"step": 9}]
    finally:
        saver.waited.set()
        saves.wait()


def test_a_full_disk_on_any_rank_of_a_dcp_save_is_disk_full_in_one_line(tmp_path: Path) -> None:
    from torch.distributed.checkpoint.api import CheckpointException

    full = OSError(errno.ENOSPC, "No space left on device")
    failed = CheckpointException("save failed", {0: (ValueError("x"), None), 3: (full, None)})
    raised = disk_full_or(failed, str(tmp_path / "checkpoint_4"))
    assert isinstance(raised, DiskFull) and raised.errno == errno.ENOSPC
    assert "\n" not in str(raised) and "writing checkpoint_4" in str(raised)
    other = CheckpointException("save failed", {1: (ValueError("a bad tensor"), None)})
    assert disk_full_or(other, str(tmp_path)) is other
