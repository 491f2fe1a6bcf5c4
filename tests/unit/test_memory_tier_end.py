"""job_end.finish_job, the memory tier's end of a job's run: what it persists, when it keeps the
tier, and the exit code that says where the newest state is (issue 25, finding 3)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cycler import AtomicDirectory, atomic_torch_save, list_checkpoints
from cycler.checkpoint.durable_copy import persist
from cycler.checkpoint.job_end import finish_job
from cycler.checkpoint.layout import CheckpointLayout
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


class Clock:
    """Returns the given times one per call, then the last one for ever."""

    def __init__(self, *times: float) -> None:
        self._times = list(times)

    def __call__(self) -> float:
        return self._times.pop(0) if len(self._times) > 1 else self._times[0]


def test_after_a_stop_a_checkpoint_that_did_not_land_is_copied_in_the_time_left(
        tmp_path: Path) -> None:
    memory = memory_with_checkpoints(tmp_path / "memory", 2)
    durable = CheckpointLayout(tmp_path / "root", "AtomicDirectory")
    durable.root.mkdir()
    said: list[tuple[int, float]] = []
    end = finish_job(memory, durable, several_nodes=False, exit_code=EXIT_REQUEUE, stopped=True,
                     copy_until=110.0, clock=Clock(100.0, 100.5, 102.5),
                     copying=lambda name, left: said.append((name.index, left)))
    assert end.failure is None and end.exit_code(EXIT_REQUEUE) == EXIT_REQUEUE
    assert said == [(1, 10.0)], "the copy is said before it starts, with the time left"
    assert end.stop_copy is not None and end.stop_copy.index == 1
    assert (end.stop_copy.seconds, end.stop_copy.spare) == (2.5, 7.5)
    assert durable.link_target_name() == memory.parse("AtomicDirectory_checkpoint_1")
    assert memory.root.is_dir(), "kept for a rerun here"


def test_after_a_stop_a_copy_that_reaches_the_deadline_is_removed_and_is_the_failure(
        tmp_path: Path) -> None:
    memory = memory_with_checkpoints(tmp_path / "memory", 1)
    durable = CheckpointLayout(tmp_path / "root", "AtomicDirectory")
    durable.root.mkdir()
    saver = AtomicDirectory(str(memory.root))  # a stop's checkpoint of two files
    directory = saver.prepare_checkpoint_directory()
    for part in ("a.pt", "b.pt"):
        atomic_torch_save({"part": part}, f"{directory}/{part}")
    saver.symlink_latest(directory)
    persist(memory, durable, memory.parse("AtomicDirectory_checkpoint_0"))
    # The start, the first file's chunk; past the deadline at the second file's.
    end = finish_job(memory, durable, several_nodes=False, exit_code=EXIT_REQUEUE, stopped=True,
                     copy_until=105.0, clock=Clock(100.0, 100.2, 200.0))
    assert end.failure is not None and "reached the stop's deadline" in end.failure
    assert end.exit_code(EXIT_REQUEUE) == EXIT_NOT_PERSISTED and end.stop_copy is None
    assert sorted(p.name for p in durable.root.iterdir() if p.name.startswith("Atomic")) == [
        "AtomicDirectory.latest_checkpoint", "AtomicDirectory_checkpoint_0"], "nothing partial"
    (left,) = durable.own_temporaries()  # set aside at once; the next persist reclaims it
    assert (left / "a.pt").is_file(), "the copy cut, under a name no reader takes"
    assert durable.link_target_name() == memory.parse("AtomicDirectory_checkpoint_0")


@pytest.mark.parametrize("until", [None, 99.0])
def test_after_a_stop_with_no_time_left_nothing_is_copied_and_a_cut_copy_is_set_aside(
        tmp_path: Path, until: float | None) -> None:
    memory = memory_with_checkpoints(tmp_path / "memory", 2)
    durable = CheckpointLayout(tmp_path / "root", "AtomicDirectory")
    name = memory.parse("AtomicDirectory_checkpoint_1")
    durable.root.mkdir()
    durable.record_index(name.index)  # the workers' copy, cut by a kill, as persist makes it
    cut = durable.path_of(name)
    cut.mkdir()
    (cut / "train.pt").write_bytes(b"half")
    end = finish_job(memory, durable, several_nodes=False, exit_code=EXIT_REQUEUE, stopped=True,
                     copy_until=until, clock=lambda: 100.0)
    assert end.failure is not None and "no time was left" in end.failure
    assert end.exit_code(EXIT_REQUEUE) == EXIT_NOT_PERSISTED
    assert not list_checkpoints(durable.root), "no checkpoint, whole or partial, in the root"
    (left,) = durable.own_temporaries()  # the next persist reclaims it once cycle run is gone
    assert (left / "train.pt").read_bytes() == b"half"


def test_after_a_stop_a_copy_given_up_on_request_is_removed_and_is_the_failure(
        tmp_path: Path) -> None:
    memory = memory_with_checkpoints(tmp_path / "memory", 2)
    durable = CheckpointLayout(tmp_path / "root", "AtomicDirectory")
    durable.root.mkdir()
    end = finish_job(memory, durable, several_nodes=False, exit_code=EXIT_REQUEUE, stopped=True,
                     copy_until=110.0, clock=lambda: 100.0, give_up=lambda: True)
    assert end.failure is not None and "was given up on request" in end.failure
    assert not list_checkpoints(durable.root) and end.exit_code(EXIT_REQUEUE) == EXIT_NOT_PERSISTED
