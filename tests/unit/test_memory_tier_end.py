"""job_end.finish_job, the memory tier's end of a job's run: what it persists, when it keeps the
tier, and the exit code that says where the newest state is (issue 25, finding 3)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cycler import AtomicDirectory, atomic_torch_save
from cycler.checkpoint.job_end import finish_job
from cycler.checkpoint.layout import CheckpointLayout
from cycler.checkpoint.tiers import persist
from cycler.protocol.exit_codes import (
    EXIT_FAILURE,
    EXIT_NOT_PERSISTED,
    EXIT_REQUEUE,
    EXIT_SUCCESS,
)


def memory_with_checkpoints(root: Path, count: int) -> CheckpointLayout:
    saver = AtomicDirectory(str(root))
    for index in range(count):
        directory = saver.prepare_checkpoint_directory()
        atomic_torch_save({"index": index}, f"{directory}/train.pt")
        saver.symlink_latest(directory)
    return CheckpointLayout(root, "AtomicDirectory")


@pytest.mark.parametrize(("code", "kept"), [(EXIT_SUCCESS, False), (EXIT_FAILURE, False),
                                            (EXIT_REQUEUE, True)])
def test_the_newest_memory_checkpoint_is_persisted_and_the_tier_kept_only_for_a_rerun(
        tmp_path: Path, code: int, kept: bool) -> None:
    memory = memory_with_checkpoints(tmp_path / "memory", 2)
    durable = CheckpointLayout(tmp_path / "root", "AtomicDirectory")
    durable.root.mkdir()
    end = finish_job(memory, durable, several_nodes=False, exit_code=code)
    assert end.persisted is not None and end.persisted.index == 1 and end.failure is None
    assert durable.link_target_name() == end.persisted
    assert memory.root.exists() is kept and end.removed is not kept
    assert end.exit_code(code) == code


@pytest.mark.parametrize(("planned", "code"), [(EXIT_SUCCESS, EXIT_NOT_PERSISTED),
                                               (EXIT_REQUEUE, EXIT_NOT_PERSISTED),
                                               (EXIT_FAILURE, EXIT_FAILURE)])
def test_a_failed_persist_keeps_the_tier_names_the_newest_and_changes_a_safe_exit_code(
        tmp_path: Path, planned: int, code: int) -> None:
    memory = memory_with_checkpoints(tmp_path / "memory", 2)
    (tmp_path / "root").write_text("a file where the checkpoint root should be")
    durable = CheckpointLayout(tmp_path / "root", "AtomicDirectory")
    end = finish_job(memory, durable, several_nodes=False, exit_code=planned)
    assert end.failure and end.persisted is None and not end.removed
    assert memory.root.is_dir()
    assert end.newest == memory.path_of(memory.parse("AtomicDirectory_checkpoint_1"))
    assert end.exit_code(planned) == code


def test_nothing_newer_in_memory_persists_nothing_and_fails_nothing(tmp_path: Path) -> None:
    memory = CheckpointLayout(tmp_path / "memory", "AtomicDirectory")
    durable = CheckpointLayout(tmp_path / "root", "AtomicDirectory")
    end = finish_job(memory, durable, several_nodes=False, exit_code=EXIT_SUCCESS)
    assert (end.persisted, end.failure, end.exit_code(EXIT_SUCCESS)) == (None, None, 0)


def test_after_a_stop_nothing_is_copied_and_a_checkpoint_that_did_not_land_is_the_failure(
        tmp_path: Path) -> None:
    memory = memory_with_checkpoints(tmp_path / "memory", 2)
    durable = CheckpointLayout(tmp_path / "root", "AtomicDirectory")
    durable.root.mkdir()
    end = finish_job(memory, durable, several_nodes=False, exit_code=EXIT_REQUEUE, stopped=True)
    assert end.failure is not None and "checkpoint 1" in end.failure
    assert end.persisted is None and not list(durable.root.iterdir()), "nothing was copied"
    assert end.newest == memory.path_of(memory.parse("AtomicDirectory_checkpoint_1"))
    assert end.exit_code(EXIT_REQUEUE) == EXIT_NOT_PERSISTED and memory.root.is_dir()


def test_after_a_stop_whose_checkpoint_landed_the_end_is_clean(tmp_path: Path) -> None:
    memory = memory_with_checkpoints(tmp_path / "memory", 2)
    durable = CheckpointLayout(tmp_path / "root", "AtomicDirectory")
    durable.root.mkdir()
    persist(memory, durable, memory.parse("AtomicDirectory_checkpoint_1"))
    end = finish_job(memory, durable, several_nodes=False, exit_code=EXIT_REQUEUE, stopped=True)
    assert (end.failure, end.persisted, end.exit_code(EXIT_REQUEUE)) == (None, None, EXIT_REQUEUE)
