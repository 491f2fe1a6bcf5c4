"""Torn on-disk states built by hand: what a crash, a copy or a careless hand can leave behind.

For each state: ``latest_checkpoint`` returns the right directory (warning when it had to look
past the link), ``list_checkpoints`` reports each entry's state, and the retention of a new commit
(``AtomicDirectory(keep_last=1)``) removes only what it should: never a valid checkpoint it must
keep, never anything outside the root, never anything through a symlink.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from cycler._fs import TEMP_MARKER
from cycler.checkpoint.atomic_directory import AtomicDirectory
from cycler.checkpoint.layout import MANIFEST_NAME, CheckpointLayout
from cycler.checkpoint.listing import CheckpointWarning, latest_checkpoint, list_checkpoints
from cycler.checkpoint.manifest import read_manifest
from cycler.errors import CheckpointDirectoryError

PREFIX = "AtomicDirectory"
LINK = f"{PREFIX}.latest_checkpoint"


def ckpt(index: int, pinned: bool = False) -> str:
    return f"{PREFIX}_checkpoint_{index}" + ("_force" if pinned else "")


def commit(root: Path, step: int, *, keep_last: int = -1, force: bool = False) -> Path:
    """Commit one checkpoint through AtomicDirectory, as training would."""
    saver = AtomicDirectory(root, keep_last=keep_last)
    path = Path(saver.prepare_checkpoint_directory(force_save=force))
    (path / "model.pt").write_bytes(bytes([step % 256]) * (1000 + step))
    (path / "nested").mkdir()
    (path / "nested" / "optimizer.pt").write_bytes(b"o" * 300)
    saver.symlink_latest(path, metadata={"step": step})
    return path


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """Checkpoints 0, 1, 2 committed (steps 0, 1, 2); the link names 2."""
    root = tmp_path / "root"
    for step in range(3):
        commit(root, step)
    return root


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A valid-looking checkpoint root elsewhere, which nothing may follow into or delete."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    CheckpointLayout(elsewhere).record_index(0)
    commit(elsewhere, 101)
    CheckpointLayout(elsewhere).record_index(5)
    for step in (106, 107):
        commit(elsewhere, step)
    assert entries(elsewhere) == [LINK, ckpt(1), ckpt(6), ckpt(7)]
    return elsewhere


def tree_digest(path: Path) -> dict[str, str]:
    """Every entry under ``path`` (not following symlinks) with its content or target."""
    found = {}
    for parent, dirs, files in os.walk(path):
        for name in dirs + files:
            full = Path(parent) / name
            if full.is_symlink():
                found[str(full)] = "-> " + os.readlink(full)
            elif full.is_file():
                found[str(full)] = hashlib.sha256(full.read_bytes()).hexdigest()
            else:
                found[str(full)] = "dir"
    return found


def entries(root: Path) -> list[str]:
    return sorted(entry for entry in os.listdir(root) if entry != ".cycler")


def states(root: Path, verify: bool = False) -> dict[str, str]:
    return {c.path.name: c.state.value for c in list_checkpoints(root, verify=verify)}


@contextlib.contextmanager
def no_warning() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yield


def latest_with_warning(root: Path, match: str, verify: bool = False) -> Path | None:
    with pytest.warns(CheckpointWarning, match=match):
        return latest_checkpoint(root, verify=verify)


def latest_without_warning(root: Path, verify: bool = False) -> Path | None:
    with no_warning():
        return latest_checkpoint(root, verify=verify)


def test_an_untouched_root_resolves_to_the_link_target_without_warning(root: Path) -> None:
    assert latest_without_warning(root) == root / ckpt(2)
    assert states(root, verify=True) == {ckpt(0): "valid", ckpt(1): "valid", ckpt(2): "latest"}
    assert os.readlink(root / LINK) == str(root / ckpt(2))
    assert os.path.isabs(os.readlink(root / LINK))
    assert read_manifest(root / ckpt(2)).step == 2
    commit(root, 3, keep_last=2)
    assert entries(root) == [LINK, ckpt(2), ckpt(3)]


def test_a_latest_without_manifest_is_incomplete_and_the_previous_one_is_used(root: Path) -> None:
    (root / ckpt(2) / MANIFEST_NAME).unlink()
    assert latest_with_warning(root, f"points at {ckpt(2)}, which is incomplete") == root / ckpt(1)
    assert states(root) == {ckpt(0): "valid", ckpt(1): "latest", ckpt(2): "incomplete"}
    commit(root, 3, keep_last=2)
    assert entries(root) == [LINK, ckpt(1), ckpt(3)]


def test_a_newer_directory_without_manifest_is_ignored_and_removed_by_the_next_commit(
        root: Path) -> None:
    (root / ckpt(3)).mkdir()
    (root / ckpt(3) / "model.pt").write_bytes(b"half")
    assert latest_without_warning(root) == root / ckpt(2)
    assert states(root)[ckpt(3)] == "incomplete"
    assert commit(root, 3, keep_last=2).name == ckpt(4)
    assert entries(root) == [LINK, ckpt(2), ckpt(4)]


def test_a_malformed_manifest_makes_a_corrupt_checkpoint(root: Path) -> None:
    (root / ckpt(2) / MANIFEST_NAME).write_text('{"format": "cycler.checkpoint", "vers')
    assert latest_with_warning(root, "which is corrupt: .*malformed") == root / ckpt(1)
    assert states(root)[ckpt(2)] == "corrupt"


def test_a_truncated_file_is_caught_by_its_size_without_verify(root: Path) -> None:
    with open(root / ckpt(2) / "nested" / "optimizer.pt", "r+b") as handle:
        handle.truncate(100)
    assert latest_with_warning(root, "optimizer.pt has 100 bytes, the manifest says 300") \
        == root / ckpt(1)
    assert states(root) == {ckpt(0): "valid", ckpt(1): "latest", ckpt(2): "corrupt"}
    commit(root, 3, keep_last=1)
    # Kept for inspection, as prune keeps it (issue 25, finding 12: this removed it before).
    assert entries(root) == [LINK, ckpt(2), ckpt(3)]


def test_a_missing_file_makes_the_checkpoint_corrupt(root: Path) -> None:
    (root / ckpt(2) / "model.pt").unlink()
    assert latest_with_warning(root, "model.pt is missing") == root / ckpt(1)
    assert states(root)[ckpt(2)] == "corrupt"


def test_a_flipped_byte_is_caught_only_when_verifying_checksums(root: Path) -> None:
    target = root / ckpt(2) / "model.pt"
    data = bytearray(target.read_bytes())
    data[500] ^= 0x01
    target.write_bytes(bytes(data))
    assert latest_without_warning(root) == root / ckpt(2)
    assert states(root)[ckpt(2)] == "latest"
    assert latest_with_warning(root, "model.pt does not match its checksum", verify=True) \
        == root / ckpt(1)
    assert states(root, verify=True) == {ckpt(0): "valid", ckpt(1): "latest", ckpt(2): "corrupt"}
    # The verification recorded 2 as corrupt: retention keeps it for inspection, and keeps 1,
    # the checkpoint a resume would use, within keep-last.
    commit(root, 3, keep_last=2)
    assert entries(root) == [LINK, ckpt(1), ckpt(2), ckpt(3)]


def test_a_dangling_link_falls_back_to_the_newest_valid_checkpoint(root: Path) -> None:
    (root / LINK).unlink()
    os.symlink(root / ckpt(9), root / LINK)
    assert latest_with_warning(root, f"points at {ckpt(9)}, which does not exist") \
        == root / ckpt(2)
    assert states(root) == {ckpt(0): "valid", ckpt(1): "valid", ckpt(2): "latest"}
    assert commit(root, 3, keep_last=2).name == ckpt(3)
    assert entries(root) == [LINK, ckpt(2), ckpt(3)]
    assert os.readlink(root / LINK) == str(root / ckpt(3))


def test_a_link_whose_target_was_deleted_by_hand_falls_back_to_the_previous_one(
        root: Path) -> None:
    shutil.rmtree(root / ckpt(2))
    assert latest_with_warning(root, "does not exist") == root / ckpt(1)
    assert commit(root, 2, keep_last=2).name == ckpt(3)
    assert entries(root) == [LINK, ckpt(1), ckpt(3)]


def test_a_stale_temporary_link_is_not_a_checkpoint_and_does_not_stop_the_next_commit(
        root: Path) -> None:
    stale = root / f".{LINK}{TEMP_MARKER}0123456789ab"
    os.symlink(root / ckpt(0), stale)
    assert latest_without_warning(root) == root / ckpt(2)
    assert states(root) == {ckpt(0): "valid", ckpt(1): "valid", ckpt(2): "latest"}
    commit(root, 3, keep_last=1)
    assert os.readlink(root / LINK) == str(root / ckpt(3))
    assert latest_without_warning(root) == root / ckpt(3)
    assert entries(root) == [LINK, ckpt(3)]
    assert (root / ckpt(0)).exists() is False


def test_leftovers_of_a_writer_killed_mid_removal_are_cleared_by_the_next_commit_only_its_own(
        root: Path, outside: Path) -> None:
    before = tree_digest(outside)
    half_deleted = root / f".{ckpt(1)}{TEMP_MARKER}0123456789ab"
    os.rename(root / ckpt(1), half_deleted)
    (half_deleted / "model.pt").unlink()
    os.symlink(outside, half_deleted / "escape")
    record_temporary = root / ".cycler" / f".{PREFIX}.last_index{TEMP_MARKER}0123456789ab"
    record_temporary.write_text("7")
    linked_out = root / f".{ckpt(0, pinned=True)}{TEMP_MARKER}0123456789ab"
    os.symlink(outside / ckpt(7), linked_out)
    others = [root / f".Other_checkpoint_1{TEMP_MARKER}0123456789ab",
              root / f".model.pt{TEMP_MARKER}0123456789ab",
              root / f".{PREFIX}_checkpoint_01{TEMP_MARKER}0123456789ab",
              root / ".cycler" / f".Other.last_index{TEMP_MARKER}0123456789ab"]
    for other in others:
        other.write_text("not this saver's")
    assert latest_without_warning(root) == root / ckpt(2)
    assert states(root) == {ckpt(0): "valid", ckpt(2): "latest"}
    commit(root, 3, keep_last=2)
    assert sorted(p.name for p in root.iterdir() if p.name != ".cycler") == sorted(
        [LINK, ckpt(2), ckpt(3)] + [o.name for o in others if o.parent == root])
    assert not record_temporary.exists()
    assert all(other.read_text() == "not this saver's" for other in others)
    assert tree_digest(outside) == before


def test_a_missing_link_beside_valid_directories_uses_the_newest_and_deletes_nothing_early(
        root: Path) -> None:
    (root / LINK).unlink()
    assert latest_with_warning(root, f"{LINK} is missing") == root / ckpt(2)
    assert states(root) == {ckpt(0): "valid", ckpt(1): "valid", ckpt(2): "latest"}
    assert entries(root) == [ckpt(0), ckpt(1), ckpt(2)]
    commit(root, 3, keep_last=2)
    assert entries(root) == [LINK, ckpt(2), ckpt(3)]


def test_a_link_pointing_outside_the_root_is_never_followed(root: Path, outside: Path) -> None:
    before = tree_digest(outside)
    (root / LINK).unlink()
    os.symlink(outside / ckpt(7), root / LINK)
    latest = latest_with_warning(root, f"points at {ckpt(7)}, which does not exist")
    assert latest == root / ckpt(2)
    assert states(root) == {ckpt(0): "valid", ckpt(1): "valid", ckpt(2): "latest"}
    assert commit(root, 3, keep_last=1).name == ckpt(3)
    assert entries(root) == [LINK, ckpt(3)]
    assert tree_digest(outside) == before


def test_a_link_outside_the_root_resolves_to_the_same_named_checkpoint_inside_it_and_says_so(
        root: Path, outside: Path) -> None:
    before = tree_digest(outside)
    (root / LINK).unlink()
    os.symlink(outside / ckpt(1), root / LINK)
    # Not this root's newest (2): a link meant for another tree is said aloud, not followed.
    assert latest_with_warning(root, "points outside the root") == root / ckpt(1)
    assert states(root) == {ckpt(0): "valid", ckpt(1): "latest", ckpt(2): "valid"}
    (root / ckpt(1) / MANIFEST_NAME).unlink()  # outside's valid 1 must not stand in for it
    assert latest_with_warning(root, "incomplete") == root / ckpt(2)
    commit(root, 3, keep_last=1)
    assert entries(root) == [LINK, ckpt(3)]
    assert tree_digest(outside) == before


def test_a_link_to_something_that_is_not_a_checkpoint_name_falls_back(root: Path) -> None:
    (root / LINK).unlink()
    os.symlink("/", root / LINK)
    assert latest_with_warning(root, "does not name a checkpoint of this root") == root / ckpt(2)


@pytest.mark.parametrize("kind", ["file", "directory"])
def test_a_link_turned_into_a_plain_copy_is_a_broken_link_not_a_crash(
        root: Path, kind: str) -> None:
    (root / LINK).unlink()
    if kind == "file":
        (root / LINK).write_text(str(root / ckpt(0)))
    else:
        shutil.copytree(root / ckpt(0), root / LINK)
    assert latest_with_warning(root, f"{LINK} is not a symlink") == root / ckpt(2)
    assert states(root) == {ckpt(0): "valid", ckpt(1): "valid", ckpt(2): "latest"}
    if kind == "file":
        commit(root, 3, keep_last=1)
        assert entries(root) == [LINK, ckpt(3)]
        assert os.readlink(root / LINK) == str(root / ckpt(3))
    else:
        with pytest.raises(CheckpointDirectoryError, match="is a directory, not the latest link"):
            commit(root, 3, keep_last=1)
        assert {ckpt(0), ckpt(1), ckpt(2)} <= set(entries(root))


def test_a_file_named_like_a_checkpoint_is_reported_and_never_removed(root: Path) -> None:
    (root / ckpt(3)).write_bytes(b"not a directory")
    assert latest_without_warning(root) == root / ckpt(2)
    assert states(root)[ckpt(3)] == "corrupt"
    (root / LINK).unlink()
    os.symlink(root / ckpt(3), root / LINK)
    assert latest_with_warning(root, f"{ckpt(3)}, which is corrupt: is a file") == root / ckpt(2)
    assert commit(root, 4, keep_last=1).name == ckpt(4)
    assert entries(root) == [LINK, ckpt(3), ckpt(4)]
    assert (root / ckpt(3)).read_bytes() == b"not a directory"


def test_a_symlink_named_like_a_checkpoint_is_never_followed_nor_removed(
        root: Path, outside: Path) -> None:
    before = tree_digest(outside)
    os.symlink(outside / ckpt(7), root / ckpt(3))  # a valid checkpoint, but elsewhere
    os.symlink(outside / ckpt(6), root / ckpt(4, pinned=True))
    assert latest_without_warning(root) == root / ckpt(2)
    assert states(root)[ckpt(3)] == "corrupt"
    (root / LINK).unlink()
    os.symlink(root / ckpt(3), root / LINK)
    assert latest_with_warning(root, "is a symlink; cycler never follows it") == root / ckpt(2)
    assert commit(root, 5, keep_last=1).name == ckpt(5)
    assert entries(root) == [LINK, ckpt(3), ckpt(4, pinned=True), ckpt(5)]
    assert os.readlink(root / ckpt(3)) == str(outside / ckpt(7))
    assert tree_digest(outside) == before


def test_a_torn_checkpoint_holding_a_symlink_out_is_removed_without_following_it(
        root: Path, outside: Path) -> None:
    before = tree_digest(outside)
    (root / ckpt(3)).mkdir()
    os.symlink(outside, root / ckpt(3) / "escape")
    os.symlink(outside / ckpt(7) / "model.pt", root / ckpt(3) / "model.pt")
    assert latest_without_warning(root) == root / ckpt(2)
    commit(root, 3, keep_last=1)
    assert entries(root) == [LINK, ckpt(4)]
    assert tree_digest(outside) == before


def test_a_moved_tree_resolves_its_old_absolute_link_by_name_inside_the_new_root(
        root: Path, tmp_path: Path) -> None:
    moved = tmp_path / "moved" / "here"
    moved.parent.mkdir()
    os.rename(root, moved)
    assert os.readlink(moved / LINK) == str(root / ckpt(2))  # dangling: the old location
    assert latest_without_warning(moved) == moved / ckpt(2)
    assert states(moved) == {ckpt(0): "valid", ckpt(1): "valid", ckpt(2): "latest"}
    assert commit(moved, 3, keep_last=1).name == ckpt(3)
    assert entries(moved) == [LINK, ckpt(3)]
    assert os.readlink(moved / LINK) == str(moved / ckpt(3))


def test_a_copied_tree_resolves_inside_itself_and_its_retention_never_touches_the_original(
        root: Path, tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(root, copy, symlinks=True)
    before = tree_digest(root)
    assert latest_without_warning(copy) == copy / ckpt(2)
    (copy / ckpt(2) / MANIFEST_NAME).unlink()
    assert latest_with_warning(copy, "incomplete") == copy / ckpt(1)
    commit(copy, 3, keep_last=1)
    assert entries(copy) == [LINK, ckpt(3)]
    assert tree_digest(root) == before


def test_pinned_checkpoints_survive_retention_even_when_torn(root: Path) -> None:
    commit(root, 3, force=True)
    (root / ckpt(4, pinned=True)).mkdir()
    assert latest_without_warning(root) == root / ckpt(3, pinned=True)
    assert states(root)[ckpt(3, pinned=True)] == "latest"
    assert states(root)[ckpt(4, pinned=True)] == "incomplete"
    commit(root, 5, keep_last=1)
    assert entries(root) == [LINK, ckpt(3, pinned=True), ckpt(4, pinned=True), ckpt(5)]
    assert states(root)[ckpt(3, pinned=True)] == "pinned"


def test_names_that_only_look_like_checkpoints_are_ignored_and_left_alone(root: Path) -> None:
    for name in (f"{PREFIX}_checkpoint_02", f"{PREFIX}_checkpoint_2.bak", "Other_checkpoint_9"):
        shutil.copytree(root / ckpt(2), root / name)
    (root / ckpt(2) / MANIFEST_NAME).unlink()
    assert latest_with_warning(root, "incomplete") == root / ckpt(1)
    assert list(states(root)) == [ckpt(0), ckpt(1), ckpt(2)]
    commit(root, 3, keep_last=1)
    assert entries(root) == [LINK, f"{PREFIX}_checkpoint_02", f"{PREFIX}_checkpoint_2.bak",
                             ckpt(3), "Other_checkpoint_9"]


def test_a_root_with_only_torn_checkpoints_has_no_latest_and_no_warning(tmp_path: Path) -> None:
    root = tmp_path / "root"
    AtomicDirectory(root).prepare_checkpoint_directory()  # a writer killed before its commit
    (root / ckpt(1)).mkdir()  # another, made after cycler's first prepare here
    assert latest_without_warning(root) is None
    assert states(root) == {ckpt(0): "incomplete", ckpt(1): "incomplete"}
    assert commit(root, 0, keep_last=1).name == ckpt(2)
    assert entries(root) == [LINK, ckpt(2)]


def test_a_missing_root_has_no_latest_checkpoint(tmp_path: Path) -> None:
    assert latest_without_warning(tmp_path / "nothing-here") is None
    assert list_checkpoints(tmp_path / "nothing-here") == []


def test_an_index_whose_torn_directory_was_removed_by_hand_is_never_reused(root: Path) -> None:
    layout = CheckpointLayout(root)
    assert layout.index_record_path.read_text() == "2\n"  # durable once the commit returned
    saver = AtomicDirectory(root)
    torn = Path(saver.prepare_checkpoint_directory())
    assert torn.name == ckpt(3)
    del saver  # the writer dies before committing; its record survives it
    shutil.rmtree(torn)
    assert commit(root, 3, keep_last=-1).name == ckpt(4)
    assert layout.index_record_path.read_text() == "4\n"


def test_a_subdirectory_inside_a_checkpoint_that_is_a_symlink_to_outside_is_refused(
        root: Path, outside: Path) -> None:
    from cycler import AtomicDirectory

    saver = AtomicDirectory(root)
    directory = Path(saver.prepare_checkpoint_directory())
    (directory / "shards").mkdir()
    (directory / "shards" / "part.bin").write_bytes(b"data")
    saver.symlink_latest(directory)
    # After the commit, the subdirectory is swapped for a link to an outside copy.
    (outside / "shards").mkdir()
    (outside / "shards" / "part.bin").write_bytes(b"data")
    shutil.rmtree(directory / "shards")
    os.symlink(outside / "shards", directory / "shards")
    assert states(root)[directory.name] == "corrupt"
    assert latest_with_warning(root, "shards is a symlink") != directory


def test_a_cycler_directory_that_is_a_symlink_is_refused(root: Path, outside: Path) -> None:
    from cycler import AtomicDirectory
    from cycler.errors import CheckpointDirectoryError

    shutil.rmtree(root / ".cycler", ignore_errors=True)
    os.symlink(outside, root / ".cycler")
    with pytest.raises(CheckpointDirectoryError, match=".cycler is a symlink"):
        AtomicDirectory(root)
