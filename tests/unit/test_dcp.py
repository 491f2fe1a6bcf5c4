"""DcpSaves: a saver's save(), load() and wait() written by torch.distributed.checkpoint (real
DCP, one process) for a fake saver, with a fake coordinator saying which rank this is."""

from __future__ import annotations

import errno
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
import torch
from saver_fakes import FakeCoordinator

from cycler.checkpoint.dcp import DcpSaves
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
