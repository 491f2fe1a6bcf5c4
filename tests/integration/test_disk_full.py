"""A full disk: one line saying so, the previous checkpoint intact, space reclaimed by the next
run, and a later save succeeding. On a real 4 MB tmpfs (skipped where it cannot be mounted)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from cycler import (
    AtomicDirectory,
    atomic_torch_save,
    latest_checkpoint,
    list_checkpoints,
    read_manifest,
)
from cycler.errors import DiskFull


@pytest.fixture
def small_disk(small_tmpfs: Path) -> Path:
    return small_tmpfs


def a_run_that_fills_the_disk(root: Path) -> str:
    saver = AtomicDirectory(root)
    directory = Path(saver.prepare_checkpoint_directory())
    try:
        atomic_torch_save({"weights": torch.randn(1 << 20)}, directory / "model.pt")  # 4 MB
    except DiskFull as error:
        message = str(error)
    else:
        raise AssertionError("a 4 MB save fit on a 4 MB disk")
    del saver  # the run dies here: its writer lock goes with it
    return message


def test_a_full_disk_is_one_line_keeps_the_last_checkpoint_and_is_reclaimed(
        small_disk: Path) -> None:
    saver = AtomicDirectory(small_disk)
    first = Path(saver.prepare_checkpoint_directory())
    atomic_torch_save({"step": 0}, first / "model.pt")
    saver.symlink_latest(first, metadata={"step": 0})
    del saver
    for _ in range(3):  # a crash loop: each run dies on the full disk
        message = a_run_that_fills_the_disk(small_disk)
        assert "\n" not in message and message.startswith("no space left on")
        assert "MB free" in message and "committed before are intact" in message
        assert latest_checkpoint(small_disk) == first
        torn = [c for c in list_checkpoints(small_disk) if not c.valid]
        assert len(torn) <= 1, "every run must reclaim what the one before left"
    assert not any(name.startswith(".") and "cycler-tmp" in name
                   for name in os.listdir(first)), "the failed temporary was removed"
    later = AtomicDirectory(small_disk)
    directory = Path(later.prepare_checkpoint_directory())
    atomic_torch_save({"step": 1}, directory / "model.pt")
    later.symlink_latest(directory, metadata={"step": 1})
    assert latest_checkpoint(small_disk) == directory
    assert [c.valid for c in list_checkpoints(small_disk)] == [True, True]


def test_a_dcp_save_on_a_full_disk_is_disk_full_and_the_next_smaller_save_succeeds(
        small_disk: Path) -> None:
    saver = AtomicDirectory(small_disk)
    saver.save({"w": torch.zeros(1000)}, metadata={"step": 0})
    for asynchronous in (False, True):
        with pytest.raises(DiskFull, match="no space left on"):
            handle = saver.save({"w": torch.randn(1 << 20)}, metadata={"step": 1},
                                asynchronous=asynchronous)  # 4 MB on a 4 MB disk
            handle.wait()
        saver = AtomicDirectory(small_disk)  # whatever raised, a new saver goes on
        assert [c.index for c in list_checkpoints(small_disk) if not c.valid] == []
    saver.save({"w": torch.ones(1000)}, metadata={"step": 2})  # the partial shard is gone
    state = {"w": torch.zeros(1000)}
    assert AtomicDirectory(small_disk).load(state) == {"step": 2}
    assert torch.equal(state["w"], torch.ones(1000))


@pytest.fixture
def read_only_root(small_disk: Path) -> Iterator[Path]:
    """A root holding two committed DCP checkpoints (steps 2, 3), then remounted read-only."""
    saver = AtomicDirectory(small_disk)
    for step in (2, 3):
        saver.save({"w": torch.full((100,), float(step))}, metadata={"step": step})
    del saver
    done = subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], capture_output=True,
                          text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot remount read-only here ({done.stderr.strip()})")
    yield small_disk


def test_a_read_only_root_can_be_resumed_from_but_not_saved_to(read_only_root: Path) -> None:
    from cycler.errors import CheckpointDirectoryError

    saver = AtomicDirectory(read_only_root)
    state = {"w": torch.zeros(100)}
    assert saver.load(state) == {"step": 3}
    assert torch.equal(state["w"], torch.full((100,), 3.0))
    with pytest.raises(CheckpointDirectoryError, match="not writable"):
        saver.save(state)


def test_prune_of_a_read_only_root_is_one_line_with_exit_two(read_only_root: Path) -> None:
    import sys

    result = subprocess.run([sys.executable, "-m", "cycler_cli", "prune", str(read_only_root),
                             "--keep-last", "1"], capture_output=True, text=True)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot prune" in lines[0] and "Read-only" in lines[0], lines
    assert [c.index for c in list_checkpoints(read_only_root)] == [0, 1]


def test_a_failed_async_save_the_script_was_told_of_is_not_raised_again(small_disk: Path) -> None:
    """The handle's wait() raised it: destroy_process_group's wait, a stop's and the exit's
    must not raise it again (the script handled it), and the saver goes on."""
    from cycler.checkpoint.in_flight import wait_for_saves

    saver = AtomicDirectory(small_disk)
    handle = saver.save({"w": torch.randn(1 << 20)}, asynchronous=True)  # 4 MB on a 4 MB disk
    with pytest.raises(DiskFull):
        handle.wait()
    wait_for_saves()
    saver.wait()
    saver.save({"w": torch.ones(1000)}, metadata={"step": 2})
    assert read_manifest(Path(str(saver.latest_checkpoint()))).step == 2


def test_a_failed_async_save_nobody_waited_for_is_raised_by_the_savers_next_call(
        small_disk: Path) -> None:
    saver = AtomicDirectory(small_disk)
    saver.save({"w": torch.randn(1 << 20)}, asynchronous=True)
    with pytest.raises(DiskFull):
        saver.wait()
