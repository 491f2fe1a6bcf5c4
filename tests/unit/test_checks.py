"""``cycle run``'s pre-start checks of the memory tier (:mod:`cycler.supervisor.checks`) on a
``--memory-dir`` the user gave: a given directory is used as it is (issue 37), and checked as
the default one is (0700 directories, 0600 files, the user's own, never through a symlink)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from cycler.errors import CheckpointDirectoryError
from cycler.protocol.record import RunRecord
from cycler.supervisor.checks import prepare_memory_tier
from cycler.supervisor.configuration.options import RunOptions, resolve_run_options


def given(tmp_path: Path, memory_dir: Path) -> RunOptions:
    return resolve_run_options(script="train.py", environ={}, flags={
        "memory_dir": str(memory_dir), "checkpoint_dir": tmp_path / "ck"})


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.mark.parametrize("umask", [0o000, 0o277])
def test_a_given_memory_dir_made_under_any_umask_is_private_all_the_way(
        tmp_path: Path, umask: int) -> None:
    options = given(tmp_path, tmp_path / "ram" / "deeper")
    old = os.umask(umask)
    try:
        prepare_memory_tier(options)
    finally:
        os.umask(old)
    memory = options.memory_layout.root if options.memory_layout else Path()
    assert memory.parent == tmp_path / "ram" / "deeper" / f"cycler-{os.geteuid()}"
    for directory in (tmp_path / "ram", memory.parent.parent, memory.parent, memory):
        assert mode(directory) == 0o700, directory
    assert mode(RunRecord(memory).memory_owner_path) == 0o600


def test_a_given_memory_dir_whose_base_is_open_to_others_is_refused_in_one_line(
        tmp_path: Path) -> None:
    options = given(tmp_path, tmp_path / "ram")
    base = tmp_path / "ram" / f"cycler-{os.geteuid()}"
    base.mkdir(parents=True)
    base.chmod(0o755)
    with pytest.raises(CheckpointDirectoryError, match="open to other users") as refused:
        prepare_memory_tier(options)
    assert "\n" not in str(refused.value) and "--memory-dir" in str(refused.value)
    assert list(base.iterdir()) == []


def test_a_given_memory_dir_whose_base_is_a_symlink_is_refused_and_not_followed(
        tmp_path: Path) -> None:
    options = given(tmp_path, tmp_path / "ram")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    (tmp_path / "ram").mkdir(mode=0o700)
    (tmp_path / "ram" / f"cycler-{os.geteuid()}").symlink_to(elsewhere)
    with pytest.raises(CheckpointDirectoryError, match="is a symlink"):
        prepare_memory_tier(options)
    assert list(elsewhere.iterdir()) == []


def test_a_given_memory_dir_others_may_write_without_the_sticky_bit_is_refused(
        tmp_path: Path) -> None:
    shared = tmp_path / "ram"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(CheckpointDirectoryError, match="unsafe") as refused:
        prepare_memory_tier(given(tmp_path, shared))
    assert "--memory-dir" in str(refused.value)
    assert list(shared.iterdir()) == []
