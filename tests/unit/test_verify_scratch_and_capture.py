"""cycle verify's private scratch directory, and the capture that keeps every commit of a run
before the script's own retention removes it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from cycler import AtomicDirectory, atomic_torch_save
from cycler.errors import UnsafePath
from cycler.verify.capture import Capture
from cycler.verify.scratch import check_private, make_scratch


def test_the_scratch_directory_is_private_to_the_user(tmp_path: Path) -> None:
    base = tmp_path / "base"
    base.mkdir(mode=0o700)
    scratch = make_scratch(base)
    assert scratch.parent == base
    assert scratch.stat().st_mode & 0o777 == 0o700


@pytest.mark.parametrize("mode", [0o755, 0o770, 0o707])
def test_a_base_open_to_other_users_is_refused(tmp_path: Path, mode: int) -> None:
    base = tmp_path / "open"
    base.mkdir()
    base.chmod(mode)
    with pytest.raises(UnsafePath, match="open to other users"):
        make_scratch(base)


def test_a_symlink_planted_where_the_base_goes_is_refused_not_followed(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(target)
    with pytest.raises(UnsafePath, match="not a directory"):
        check_private(tmp_path / "link")
    assert not any(target.iterdir())


def test_the_default_base_lives_in_the_system_tmp_per_user(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", None)
    scratch = make_scratch()
    assert scratch.parent == tmp_path / f"cycler-verify-{os.geteuid()}"


def commit(saver: AtomicDirectory, step: int) -> None:
    directory = Path(saver.prepare_checkpoint_directory())
    atomic_torch_save({"w": torch.full((2,), float(step))}, directory / "model.pt")
    saver.symlink_latest(directory, metadata={"step": step, "epoch": 0})


def test_capture_keeps_checkpoints_that_retention_removes_afterwards(tmp_path: Path) -> None:
    root, capture = tmp_path / "root", Capture(tmp_path / "root", tmp_path / "kept")
    saver = AtomicDirectory(root, keep_last=1)
    for step in (4, 8, 12):
        commit(saver, step)
        capture.poll()
    assert [c.step for c in capture.kept] == [4, 8, 12]
    assert len(list(root.glob("AtomicDirectory_checkpoint_*"))) == 1
    first = torch.load(capture.kept[0].path / "model.pt", weights_only=True)
    assert first["w"].tolist() == [4.0, 4.0]


def test_capture_skips_a_torn_directory_and_keeps_it_once_committed(tmp_path: Path) -> None:
    root, capture = tmp_path / "root", Capture(tmp_path / "root", tmp_path / "kept")
    saver = AtomicDirectory(root)
    directory = Path(saver.prepare_checkpoint_directory())
    atomic_torch_save({"w": torch.zeros(1)}, directory / "model.pt")
    assert capture.poll() == []
    saver.symlink_latest(directory, metadata={"step": 1})
    assert [c.step for c in capture.poll()] == [1]
    assert capture.poll() == []


def test_capture_keeps_the_memory_tiers_checkpoints_once_and_misses_none_it_removed(
        tmp_path: Path) -> None:
    # Under --memory-dir the root held only the checkpoints the tier persisted (3 of 8 in a
    # verify run): the others were never compared, and a kill's resume point was misreported.
    root, memory = tmp_path / "root", tmp_path / "memory"
    capture = Capture(root, tmp_path / "kept", memory)
    in_memory, persisted = AtomicDirectory(memory, keep_last=1), AtomicDirectory(root)
    for step in (4, 8, 12):
        commit(in_memory, step)
        capture.poll()
    commit(persisted, 4)  # the root's copies carry the memory tier's names
    commit(persisted, 8)
    capture.poll()
    assert [c.step for c in capture.kept] == [4, 8, 12] and capture.missed == []


def test_the_newest_kept_checkpoint_is_the_latest_step_not_the_last_kept(tmp_path: Path) -> None:
    # A root copy the memory tier persisted is kept after a newer one in memory: taken for the
    # newest, it misreported a kill's resume point and could end a run "early".
    root, memory = tmp_path / "root", tmp_path / "memory"
    capture = Capture(root, tmp_path / "kept", memory)
    in_memory, persisted = AtomicDirectory(memory, keep_last=1), AtomicDirectory(root)
    commit(persisted, 4)
    capture.poll()
    commit(in_memory, 4)
    commit(in_memory, 8)
    capture.poll()
    assert [c.step for c in capture.kept] == [4, 8]
    in_memory_only = Capture(root, tmp_path / "kept2", memory)
    commit(in_memory, 12)
    in_memory_only.poll()  # memory: 12 (retention removed 8); root: 4, kept after it
    assert [c.step for c in in_memory_only.kept] == [12, 4]
    newest = in_memory_only.newest()
    assert newest is not None and newest.step == 12


def test_a_checkpoint_kept_after_a_resume_belongs_to_the_start_that_committed_it(
        tmp_path: Path) -> None:
    # Kept late (the root's copy of one the memory tier removed before it was seen), it was
    # taken for the resumed start's, a step behind the resume: a start that went back.
    root = tmp_path / "root"
    capture, saver = Capture(root, tmp_path / "kept"), AtomicDirectory(root)
    commit(saver, 4)
    capture.next_segment()  # the stop's start ended after that commit; it is seen only now
    commit(saver, 8)
    assert [(c.step, c.segment) for c in capture.poll()] == [(4, 0), (8, 1)]
