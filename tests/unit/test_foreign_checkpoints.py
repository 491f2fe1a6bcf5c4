"""Checkpoints a plain script keeps in its own layout (cycler.supervisor.foreign): which count as
resumable, and how an end for want of cycler's checkpoint becomes a requeue."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

from cycler.protocol.exit_codes import EXIT_FAILURE, EXIT_REQUEUE, EXIT_SUCCESS
from cycler.supervisor.foreign import (
    HUGGING_FACE,
    LIGHTNING,
    RESUMABLE_IF,
    ForeignCheckpoint,
    find_foreign_checkpoint,
    requeue_on_foreign_checkpoint,
)
from cycler.supervisor.vocabulary import Exit, Log, Requeue


def hf_checkpoint(root: Path, step: int, complete: bool = True, mtime: float = 1000.0) -> Path:
    folder = root / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    (folder / "optimizer.pt").write_bytes(b"x" * 10)
    if complete:
        (folder / "trainer_state.json").write_text("{}")
        os.utime(folder / "trainer_state.json", (mtime, mtime))
    return folder


def test_a_hugging_face_checkpoint_with_its_trainer_state_is_found(tmp_path: Path) -> None:
    folder = hf_checkpoint(tmp_path / "out", 50)
    assert find_foreign_checkpoint([tmp_path]) == ForeignCheckpoint(folder, HUGGING_FACE, 1000.0)


def test_a_torn_hugging_face_checkpoint_without_trainer_state_is_not(tmp_path: Path) -> None:
    hf_checkpoint(tmp_path, 50, complete=False)
    assert find_foreign_checkpoint([tmp_path]) is None


def test_a_hugging_face_checkpoint_whose_trainer_state_does_not_parse_is_torn(
        tmp_path: Path) -> None:
    folder = hf_checkpoint(tmp_path / "runs" / "exp", 10)
    assert find_foreign_checkpoint([tmp_path]) is not None  # two folders deep is found
    (folder / "trainer_state.json").write_text("{garbage")
    assert find_foreign_checkpoint([tmp_path]) is None


def test_the_newest_of_several_checkpoints_is_named(tmp_path: Path) -> None:
    hf_checkpoint(tmp_path / "out", 50, mtime=2000.0)
    newer = hf_checkpoint(tmp_path / "out", 25, mtime=3000.0)
    found = find_foreign_checkpoint([tmp_path])
    assert found is not None and found.path == newer


def test_lightning_checkpoints_in_lightning_logs_count_and_empty_ones_do_not(
        tmp_path: Path) -> None:
    checkpoints = tmp_path / "lightning_logs" / "version_0" / "checkpoints"
    checkpoints.mkdir(parents=True)
    (checkpoints / "epoch=0-step=50.ckpt").write_bytes(b"")
    assert find_foreign_checkpoint([tmp_path]) is None
    (checkpoints / "epoch=0-step=50.ckpt").write_bytes(b"weights")
    found = find_foreign_checkpoint([tmp_path])
    assert found is not None and found.kind == LIGHTNING


def test_resumable_if_names_any_other_layout_relative_to_the_first_directory(
        tmp_path: Path) -> None:
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "ckpt.pt").write_bytes(b"state")
    assert find_foreign_checkpoint([tmp_path]) is None
    found = find_foreign_checkpoint([tmp_path], "runs/*.pt")
    assert found is not None and (found.path, found.kind) == (tmp_path / "runs" / "ckpt.pt",
                                                               RESUMABLE_IF)
    assert find_foreign_checkpoint([tmp_path], str(tmp_path / "runs" / "*.pt")) is not None


def test_a_missing_directory_holds_nothing_and_raises_nothing(tmp_path: Path) -> None:
    assert find_foreign_checkpoint([tmp_path / "gone"], "[") is None


CONFIG = SimpleNamespace(requeue=True, requeue_count=0, max_requeues=100)
FOUND = ForeignCheckpoint(Path("/job/out/checkpoint-50"), HUGGING_FACE, 1.0)
NO_CHECKPOINT = [Log("exit", {"code": EXIT_FAILURE}), Exit(EXIT_FAILURE, "no checkpoint")]


def test_an_end_for_want_of_a_checkpoint_becomes_a_requeue_naming_the_foreign_one() -> None:
    actions = requeue_on_foreign_checkpoint(NO_CHECKPOINT, CONFIG, lambda: FOUND)
    end = actions[-1]
    assert isinstance(end, Exit) and end.code == EXIT_REQUEUE
    assert "/job/out/checkpoint-50 (Hugging Face checkpoint-N)" in end.reason
    assert any(isinstance(a, Requeue) for a in actions)
    assert [a.fields["code"] for a in actions if isinstance(a, Log) and a.event == "exit"] == [
        EXIT_REQUEUE]


def test_without_a_foreign_checkpoint_the_end_stays_as_it_was() -> None:
    assert requeue_on_foreign_checkpoint(NO_CHECKPOINT, CONFIG, lambda: None) == NO_CHECKPOINT


def test_the_requeue_policy_is_the_cores() -> None:
    used_up = SimpleNamespace(requeue=True, requeue_count=100, max_requeues=100)
    for config in (used_up, SimpleNamespace(requeue=False, requeue_count=0, max_requeues=1)):
        actions = requeue_on_foreign_checkpoint(NO_CHECKPOINT, config, lambda: FOUND)
        assert not any(isinstance(a, Requeue) for a in actions)
        assert actions[-1].code == EXIT_REQUEUE


def test_failed_workers_a_finished_job_and_other_actions_are_left_alone() -> None:
    def never() -> ForeignCheckpoint:
        raise AssertionError("looked for a foreign checkpoint")

    for actions in ([Exit(EXIT_FAILURE, "crash loop", workers_failed=True)],
                    [Exit(EXIT_SUCCESS, "finished")], [Log("signal", {})], []):
        assert requeue_on_foreign_checkpoint(actions, CONFIG, never) == actions


def test_resumable_if_takes_wildcards_in_any_directory_of_an_absolute_glob(
        tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "model_10.pt").write_bytes(b"state")
    found = find_foreign_checkpoint([tmp_path / "elsewhere"], str(tmp_path / "o*" / "*.pt"))
    assert found is not None and found.path == tmp_path / "out" / "model_10.pt"


def test_resumable_if_never_takes_cycles_own_record_folder_for_a_checkpoint(
        tmp_path: Path) -> None:
    (tmp_path / "ck" / ".cycler").mkdir(parents=True)
    (tmp_path / "ck" / ".cycler" / "events.jsonl").write_text("{}")
    # cycle run searches its working directory and the checkpoint root (finder_for)
    assert find_foreign_checkpoint([tmp_path, tmp_path / "ck"], "**") is None
