"""atomic_torch_save and the durable file primitives under it: whole or not at all."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import pytest
import torch

from cycler._fs import (
    TEMP_MARKER,
    atomic_symlink,
    atomic_write_bytes,
    discard_directory,
    is_temporary,
    temporary_sibling,
)
from cycler.checkpoint.saving import atomic_torch_save


class Explodes:
    """Pickling it records its directory's entries and sizes (to see the temporary being
    written), then raises."""

    def __init__(self, directory: Path, error: type[BaseException]) -> None:
        self.directory = directory
        self.error = error
        self.sizes: dict[str, int] = {}

    @property
    def seen(self) -> list[str]:
        return sorted(self.sizes)

    def __reduce__(self) -> Any:
        self.sizes = {name: (self.directory / name).stat().st_size
                      for name in os.listdir(self.directory)}
        raise self.error("pickling failed half-way")


def _state(seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return {"weight": torch.randn(256, 256, generator=generator), "step": torch.tensor(seed)}


def test_a_saved_state_loads_back_equal(tmp_path: Path) -> None:
    path = tmp_path / "model.pt"
    atomic_torch_save(_state(1), path)
    loaded = torch.load(path, weights_only=True)
    assert loaded.keys() == {"weight", "step"}
    assert torch.equal(loaded["weight"], _state(1)["weight"])
    assert sorted(os.listdir(tmp_path)) == ["model.pt"]


def test_saving_over_an_existing_file_replaces_it_whole(tmp_path: Path) -> None:
    path = str(tmp_path / "model.pt")
    atomic_torch_save(_state(1), path)
    atomic_torch_save(_state(2), path)
    assert torch.equal(torch.load(path, weights_only=True)["weight"], _state(2)["weight"])
    assert os.listdir(tmp_path) == ["model.pt"]


@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
@pytest.mark.parametrize("zip_format", [True, False])
def test_a_save_that_fails_half_way_leaves_the_previous_file_intact_and_no_temporary(
        tmp_path: Path, error: type[BaseException], zip_format: bool) -> None:
    path = tmp_path / "model.pt"
    atomic_torch_save(_state(1), path)
    before = path.read_bytes()
    bomb = Explodes(tmp_path, error)
    # The legacy format pickles straight into the file, so a megabyte is on disk before the
    # bomb goes off; the zip format pickles to memory first.
    half = {"weight": _state(2)["weight"], "blob": bytes(1 << 20), "bomb": bomb}
    with pytest.raises(error, match="half-way"):
        atomic_torch_save(half, path, _use_new_zipfile_serialization=zip_format)
    assert len(bomb.seen) == 2 and "model.pt" in bomb.seen  # the temporary existed meanwhile
    temporary = next(name for name in bomb.seen if name != "model.pt")
    assert temporary.startswith(".model.pt" + TEMP_MARKER)
    if not zip_format:
        assert bomb.sizes[temporary] >= 1 << 20
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["model.pt"]


def test_a_first_save_that_fails_leaves_no_file_at_all(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError):
        atomic_torch_save({"bomb": Explodes(tmp_path, RuntimeError)}, tmp_path / "model.pt")
    assert os.listdir(tmp_path) == []


def test_every_save_writes_through_its_own_temporary(tmp_path: Path) -> None:
    names = set()
    for _ in range(3):
        bomb = Explodes(tmp_path, RuntimeError)
        with pytest.raises(RuntimeError):
            atomic_torch_save({"bomb": bomb}, tmp_path / "model.pt")
        names.update(bomb.seen)
    assert len(names) == 3
    assert len({temporary_sibling(tmp_path / "model.pt") for _ in range(1000)}) == 1000


def test_concurrent_saves_to_one_path_never_mix_and_leave_one_whole_file(tmp_path: Path) -> None:
    path = tmp_path / "model.pt"
    errors: list[BaseException] = []

    def save(seed: int) -> None:
        try:
            for _ in range(5):
                atomic_torch_save(_state(seed), path)
        except BaseException as error:  # surfaced by the assert below
            errors.append(error)

    threads = [threading.Thread(target=save, args=(seed,)) for seed in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    loaded = torch.load(path, weights_only=True)
    assert torch.equal(loaded["weight"], _state(int(loaded["step"]))["weight"])
    assert os.listdir(tmp_path) == ["model.pt"]


def test_torch_save_keyword_arguments_pass_through(tmp_path: Path) -> None:
    path = tmp_path / "legacy.pt"
    atomic_torch_save(_state(3), path, _use_new_zipfile_serialization=False)
    assert not path.read_bytes().startswith(b"PK")  # the legacy format is not a zip archive
    assert torch.equal(torch.load(path, weights_only=True)["step"], torch.tensor(3))


def test_a_file_object_is_refused_with_a_pointer_to_torch_save(tmp_path: Path) -> None:
    with open(tmp_path / "x.pt", "wb") as handle, pytest.raises(TypeError, match="torch.save"):
        atomic_torch_save(_state(1), handle)  # type: ignore[arg-type]


def test_saving_into_a_missing_directory_fails_and_creates_nothing(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        atomic_torch_save(_state(1), tmp_path / "missing" / "model.pt")
    assert os.listdir(tmp_path) == []


def test_atomic_write_bytes_replaces_content_and_marks_nothing_left_behind(tmp_path: Path) -> None:
    path = tmp_path / "record.json"
    atomic_write_bytes(path, b"one")
    atomic_write_bytes(path, b"two")
    assert path.read_bytes() == b"two"
    assert os.listdir(tmp_path) == ["record.json"]


def test_atomic_symlink_replaces_a_link_and_ignores_stale_temporaries(tmp_path: Path) -> None:
    link = tmp_path / "AtomicDirectory.latest_checkpoint"
    stale = tmp_path / f".{link.name}{TEMP_MARKER}0123456789ab"
    os.symlink("/somewhere/old", stale)
    atomic_symlink(tmp_path / "a", link)
    atomic_symlink(tmp_path / "b", link)
    assert os.readlink(link) == str(tmp_path / "b")
    assert sorted(os.listdir(tmp_path)) == sorted([link.name, stale.name])
    assert is_temporary(stale.name) and not is_temporary(link.name)


def test_discard_directory_removes_a_tree_without_following_symlinks_out_of_it(
        tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious.pt").write_bytes(b"keep me")
    doomed = tmp_path / "root" / "AtomicDirectory_checkpoint_1"
    (doomed / "nested").mkdir(parents=True)
    (doomed / "nested" / "data.pt").write_bytes(b"x")
    os.symlink(outside, doomed / "escape")
    os.symlink(outside / "precious.pt", doomed / "nested" / "file-link")
    discard_directory(doomed)
    assert os.listdir(tmp_path / "root") == []
    assert (outside / "precious.pt").read_bytes() == b"keep me"


def test_a_retention_failure_after_a_commit_is_logged_and_retried_never_raised(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    import subprocess

    from cycler import AtomicDirectory, list_checkpoints

    saver = AtomicDirectory(tmp_path, keep_last=1)
    first = Path(saver.prepare_checkpoint_directory())
    (first / "stuck.bin").write_bytes(b"x")
    saver.symlink_latest(first)
    # As root only an immutable file resists deletion (an NFS .nfs* file behaves alike).
    if subprocess.run(["chattr", "+i", str(first / "stuck.bin")],
                      capture_output=True).returncode != 0:
        pytest.skip("chattr +i is not available here to make a file undeletable for root")
    try:
        for _ in range(2):
            saver.symlink_latest(saver.prepare_checkpoint_directory())  # must not raise
        assert "retention retries at the next commit" in caplog.text
    finally:
        for stuck in tmp_path.rglob("stuck.bin"):
            subprocess.run(["chattr", "-i", str(stuck)], check=True)
    saver.symlink_latest(saver.prepare_checkpoint_directory())
    assert [c.index for c in list_checkpoints(tmp_path)] == [3]
    assert list(tmp_path.rglob("stuck.bin")) == [], "the retry removed what was left"
