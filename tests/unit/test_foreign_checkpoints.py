"""Checkpoints a plain script keeps in its own layout (cycler.supervisor.run_end.foreign): which
count as resumable, and how an end for want of cycler's checkpoint becomes a requeue."""

from __future__ import annotations

import os
import time
from pathlib import Path
from types import SimpleNamespace

import torch

from cycler.protocol.events import EventLog
from cycler.protocol.exit_codes import EXIT_FAILURE, EXIT_REQUEUE, EXIT_SUCCESS
from cycler.supervisor.decisions.vocabulary import NO_CHECKPOINT_TO_RESUME, Exit, Log, Requeue
from cycler.supervisor.run_end.foreign import (
    ACCELERATE,
    HUGGING_FACE,
    LIGHTNING,
    RESUMABLE_IF,
    TORCH_SAVE,
    ForeignCheckpoint,
    ForeignSearch,
    find_foreign_checkpoint,
    job_start,
    requeue_on_foreign_checkpoint,
    search_foreign_checkpoints,
)


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
    actions = requeue_on_foreign_checkpoint(NO_CHECKPOINT, CONFIG, lambda: ForeignSearch(FOUND))
    end = actions[-1]
    assert isinstance(end, Exit) and end.code == EXIT_REQUEUE
    assert "/job/out/checkpoint-50 (Hugging Face checkpoint-N)" in end.reason
    assert any(isinstance(a, Requeue) for a in actions)
    assert [a.fields["code"] for a in actions if isinstance(a, Log) and a.event == "exit"] == [
        EXIT_REQUEUE]


def test_without_a_foreign_checkpoint_the_end_stays_as_it_was() -> None:
    assert requeue_on_foreign_checkpoint(NO_CHECKPOINT, CONFIG,
                                         lambda: ForeignSearch(None)) == NO_CHECKPOINT


def test_the_requeue_policy_is_the_cores() -> None:
    used_up = SimpleNamespace(requeue=True, requeue_count=100, max_requeues=100)
    for config in (used_up, SimpleNamespace(requeue=False, requeue_count=0, max_requeues=1)):
        actions = requeue_on_foreign_checkpoint(NO_CHECKPOINT, config, lambda: ForeignSearch(FOUND))
        assert not any(isinstance(a, Requeue) for a in actions)
        assert actions[-1].code == EXIT_REQUEUE


def test_failed_workers_a_finished_job_and_other_actions_are_left_alone() -> None:
    def never() -> ForeignSearch:
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


JOB_START = 1_800_000_000.0


def written(path: Path, mtime: float = JOB_START + 60, state: object = None) -> Path:
    """A whole torch.save file at ``path``, modified at ``mtime``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"step": 7} if state is None else state, path)
    os.utime(path, (mtime, mtime))
    return path


def test_a_pretrained_file_from_before_the_job_never_counts_and_is_named(tmp_path: Path) -> None:
    written(tmp_path / "sd-v1-5.ckpt", mtime=1_704_067_200.0)  # 2024-01-01
    search = search_foreign_checkpoints([tmp_path], since=JOB_START)
    assert search.found is None
    assert search.candidates == ("sd-v1-5.ckpt (from before the job)",)
    assert find_foreign_checkpoint([tmp_path]) is not None, "without since, any time counts"


def test_a_nanogpt_ckpt_pt_written_during_the_job_counts_and_a_truncated_one_does_not(
        tmp_path: Path) -> None:
    checkpoint = written(tmp_path / "out" / "ckpt.pt")
    found = find_foreign_checkpoint([tmp_path], since=JOB_START)
    assert found == ForeignCheckpoint(checkpoint, TORCH_SAVE, JOB_START + 60)
    whole = checkpoint.read_bytes()
    checkpoint.write_bytes(whole[:len(whole) // 2])  # a kill -9 during torch.save
    os.utime(checkpoint, (JOB_START + 60, JOB_START + 60))
    search = search_foreign_checkpoints([tmp_path], since=JOB_START)
    assert search.found is None and search.candidates == ("out/ckpt.pt (incomplete)",)


def test_accelerate_save_state_folders_count_once_their_rng_file_is_whole(tmp_path: Path) -> None:
    for folder in ("step_40", "out/epoch_1", "project/checkpoints/checkpoint_3"):
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / "model.safetensors").write_bytes(b"w" * 100)
        assert find_foreign_checkpoint([tmp_path], since=JOB_START) is None, folder
        written(tmp_path / folder / "random_states_0.pkl")
        found = find_foreign_checkpoint([tmp_path], since=JOB_START)
        assert found == ForeignCheckpoint(tmp_path / folder, ACCELERATE, JOB_START + 60), folder
        (tmp_path / folder / "random_states_0.pkl").unlink()


def test_files_inside_checkpoints_of_cyclers_are_never_the_scripts(tmp_path: Path) -> None:
    written(tmp_path / "AtomicDirectory_checkpoint_3" / "rank-0.pt")
    written(tmp_path / "AtomicDirectory_checkpoint_4.cycler-tmp-x" / "rank-0.pt")
    search = search_foreign_checkpoints([tmp_path], since=JOB_START)
    assert search == ForeignSearch(None, ())
    within = tmp_path / "AtomicDirectory_checkpoint_3"  # a working directory of that name
    assert find_foreign_checkpoint([within], since=JOB_START) is not None


def test_files_of_no_known_layout_written_during_the_job_are_named_as_candidates(
        tmp_path: Path) -> None:
    for name in ("weights/model.safetensors", "notes.txt", "run.log"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"x")
    started = time.time() - 60
    old = tmp_path / "old.safetensors"
    old.write_bytes(b"x")
    os.utime(old, (started - 3600, started - 3600))
    search = search_foreign_checkpoints([tmp_path], since=started)
    assert search.candidates == (
        "weights/model.safetensors (written during the job, of no layout cycle knows)",)


STOPPED = [Log("exit", {"code": EXIT_FAILURE}), Exit(EXIT_FAILURE, NO_CHECKPOINT_TO_RESUME)]


def test_a_stop_with_nothing_recognisable_names_resumable_if_and_what_it_saw_in_one_line() -> None:
    seen = tuple(f"f{n}.pt (from before the job)" for n in range(7))
    actions = requeue_on_foreign_checkpoint(STOPPED, CONFIG, lambda: ForeignSearch(None, seen))
    end = actions[-1]
    assert isinstance(end, Exit) and end.code == EXIT_FAILURE and "\n" not in end.reason
    assert end.reason == (f"{NO_CHECKPOINT_TO_RESUME}: if the script keeps checkpoints of its "
                          "own, name them with --resumable-if GLOB; saw f0.pt (from before the "
                          "job), f1.pt (from before the job), f2.pt (from before the job), f3.pt "
                          "(from before the job), f4.pt (from before the job), and 2 more")
    assert [a.fields["reason"] for a in actions if isinstance(a, Log)] == [end.reason]
    nothing = requeue_on_foreign_checkpoint(STOPPED, CONFIG, lambda: ForeignSearch(None))
    assert nothing[-1].reason.endswith("--resumable-if GLOB; no file written during the job "
                                       "looked like a checkpoint")


def test_the_job_began_at_the_first_start_its_events_log_holds(tmp_path: Path) -> None:
    events = tmp_path / "events.jsonl"
    assert job_start(events, 5.0) == 5.0
    clock = iter([100.0, 200.0, 300.0])
    log = EventLog(events, clock=lambda: next(clock))
    log.append("start", process_started=99.5)
    log.append("exit", code=75)
    log.append("start", process_started=299.0)
    assert job_start(events, 5.0) == 99.5
