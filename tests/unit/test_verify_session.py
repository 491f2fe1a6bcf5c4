"""The parts of a verify session that judge the runs without starting any: a resumed start
that went back; the end of training's records."""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from cycler.checkpoint.manifest import FileRecord, Manifest
from cycler.verify.capture import Capture, Captured
from cycler.verify.plan import KILL, STOP, Interruption
from cycler.verify.result import DIFFERENT, IDENTICAL, VerifyResult
from cycler.verify.runner import Resume, RunRecord
from cycler.verify.session import compare_ends, compare_pairs, why_unpaired
from cycler.verify.went_back import went_back


def run_with(tmp_path: Path, commits: list[tuple[int, int]], resumed_from: list[int],
             kind: str = STOP) -> RunRecord:
    """A run whose (step, segment) commits and whose resumes' steps are given."""
    capture = Capture(tmp_path / "root", tmp_path / "kept")
    for index, (step, segment) in enumerate(commits):
        manifest = Manifest(index=index, files={}, created_at=time.time(), step=step)
        capture.kept.append(Captured(tmp_path / str(index), f"c{index}", manifest, segment))
    record = RunRecord("interrupted", capture, tmp_path / "log", tmp_path / "work")
    record.resumes = [Resume(Interruption(kind, step), step, step, f"c{step}")
                      for step in resumed_from]
    return record


def test_a_start_that_commits_a_step_before_the_one_it_resumed_from_went_back(
        tmp_path: Path) -> None:
    # A script that never loads its checkpoint: the second start commits 10 and 20 again.
    record = run_with(tmp_path, [(10, 0), (20, 0), (25, 0), (10, 1), (20, 1), (30, 1)], [25])
    found = went_back(record)
    assert found is not None
    checkpoint, resume = found
    assert (checkpoint.name, checkpoint.step, resume.from_step) == ("c3", 10, 25)


def test_starts_that_go_on_from_their_resume_did_not_go_back(tmp_path: Path) -> None:
    # Going on from the resumed step, a stop's checkpoint at a periodic step included.
    record = run_with(tmp_path, [(10, 0), (20, 0), (20, 0), (30, 1), (34, 1), (40, 2)], [20, 34])
    assert went_back(record) is None


def test_a_kill_as_a_commit_landed_may_resume_from_the_checkpoint_before_it(
        tmp_path: Path) -> None:
    # Killed between the commit of step 30 and its latest link: the restart resumed from 20
    # (and a stop's checkpoint of its own came at 25).
    assert went_back(run_with(tmp_path, [(10, 0), (20, 0), (30, 0), (25, 1)], [30],
                              kind=KILL)) is None
    found = went_back(run_with(tmp_path, [(10, 0), (20, 0), (30, 0), (10, 1)], [30], kind=KILL))
    assert found is not None and found[0].step == 10


def test_a_start_without_steps_that_commits_a_data_position_from_before_its_resume_went_back(
        tmp_path: Path) -> None:
    # Checkpoints without a step are paired by data position, the later commit of a position
    # winning: a script that never loads its checkpoint was IDENTICAL there too.
    def run(*commits: tuple[int, int]) -> RunRecord:
        record = run_with(tmp_path / str(commits), [], [])
        for index, (progress, segment) in enumerate(commits):
            directory = tmp_path / str(commits) / f"p{index}"
            directory.mkdir(parents=True)
            torch.save({"sampler": {"epoch": 0, "progress": progress}}, directory / "train.pt")
            manifest = Manifest(index=index, files={"train.pt": FileRecord(1, "0")},
                                created_at=time.time(), step=None)
            record.capture.kept.append(Captured(directory, f"p{index}", manifest, segment))
        record.resumes = [Resume(Interruption(STOP, None, after_checkpoints=2), -1, None, "p2")]
        return record

    found = went_back(run((16, 0), (32, 0), (40, 0), (16, 1), (32, 1)))
    assert found is not None and found[0].name == "p3"
    assert went_back(run((16, 0), (32, 0), (40, 0), (48, 1), (64, 1))) is None


def ends(tmp_path: Path, final: tuple[float, float], metrics: tuple[dict, dict],
         compared_to: int | None = None) -> VerifyResult:
    """The end comparison of two runs that wrote final.pt (unless ``final`` is empty) and
    metrics.json in their working directories, the last checkpoint compared at ``compared_to``
    of their 60 steps."""
    runs = []
    for name, weight, values in zip(("reference", "interrupted"), final, metrics, strict=True):
        work = tmp_path / name / "work"
        work.mkdir(parents=True)
        torch.save({"w": torch.full((2,), weight)}, work / "final.pt")
        (work / "metrics.json").write_text(json.dumps(values))
        run = RunRecord(name, Capture(tmp_path / name / "root", tmp_path / name / "kept"),
                        tmp_path / name / "log", work)
        run.last_step = 60
        runs.append(run)
    result = VerifyResult(IDENTICAL, runs, 0, tmp_path, last_step_compared=compared_to)
    compare_ends(runs[0], runs[1], result, None, set())
    return result


def test_a_throughput_or_run_id_at_the_end_is_a_record_when_every_tensor_there_is_equal(
        tmp_path: Path) -> None:
    # metrics.json's throughput (a name of the script's own) and a random run id made an
    # exact resume DIFFERENT.
    result = ends(tmp_path, (1.0, 1.0), ({"loss": 0.5, "speed": 812.4, "id": "a1"},
                                         {"loss": 0.5, "speed": 790.1, "id": "b2"}))
    assert result.verdict == IDENTICAL
    assert sorted(next(iter(result.skipped.values()))) == ["metrics.json: id",
                                                            "metrics.json: speed"]


def test_numbers_at_the_end_still_differ_where_a_tensor_there_differs(tmp_path: Path) -> None:
    result = ends(tmp_path, (1.0, 2.0), ({"loss": 0.5}, {"loss": 0.7}))
    assert result.verdict == DIFFERENT


def test_numbers_at_the_end_differ_without_a_tensor_or_a_last_step_checkpoint_to_show_state(
        tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    result = ends(tmp_path / "a", (1.0, 1.0), ({"lr": 0.1}, {"lr": 0.001}))
    assert result.verdict == IDENTICAL  # final.pt equal: the lr did not act
    for name in ("reference", "interrupted"):
        (tmp_path / "a" / name / "work" / "final.pt").unlink()
    result = VerifyResult(IDENTICAL, result.runs, 0, tmp_path, last_step_compared=50)
    compare_ends(result.runs[0], result.runs[1], result, None, set())
    assert result.verdict == DIFFERENT
    result = VerifyResult(IDENTICAL, result.runs, 0, tmp_path, last_step_compared=60)
    compare_ends(result.runs[0], result.runs[1], result, None, set())
    assert result.verdict == IDENTICAL


def test_runs_that_commit_at_no_common_step_after_a_resume_are_told_why_not_to_run_longer(
        tmp_path: Path) -> None:
    # A clock-driven schedule (or a StepControl not restored) was told "commit more often".
    reference = run_with(tmp_path / "r", [(10, 0), (20, 0), (30, 0), (40, 0)], [])
    interrupted = run_with(tmp_path / "i", [(10, 0), (25, 0), (35, 1), (45, 1)], [25])
    why = why_unpaired(reference, interrupted)
    assert "[35, 45]" in why and "[30, 40]" in why and "no step in common" in why
    assert why_unpaired(reference, run_with(tmp_path / "j", [(10, 0)], [])).startswith("commit")


def test_a_checkpoint_kept_after_the_determinism_check_is_still_compared(
        tmp_path: Path) -> None:
    # The determinism check compared 6 and 18; the memory tier's 12, seen only later, pairs
    # between them: skipping the first two pairs compared 18 twice and 12 never.
    def checkpoint(run: str, step: int, weight: float) -> Captured:
        directory = tmp_path / run / str(step)
        directory.mkdir(parents=True)
        torch.save({"model": torch.full((2,), weight)}, directory / "model.pt")
        manifest = Manifest(index=step, files={"model.pt": FileRecord(1, "0")},
                            created_at=time.time(), step=step)
        return Captured(directory, f"{run}{step}", manifest, 0)

    reference = run_with(tmp_path / "r", [], [])
    reference.capture.kept = [checkpoint("r", step, 1.0) for step in (6, 12, 18)]
    interrupted = run_with(tmp_path / "i", [], [])
    interrupted.capture.kept = [checkpoint("i", 6, 1.0), checkpoint("i", 18, 1.0)]
    result = VerifyResult(IDENTICAL, [reference, interrupted], 0, tmp_path)
    compare_pairs(reference, interrupted, result, lambda done, total: None, set(), segments=1)
    interrupted.capture.kept.insert(1, checkpoint("i", 12, 2.0))
    compare_pairs(reference, interrupted, result, lambda done, total: None, set())
    assert [moment for moment, _, _ in result.compared] == ["step 6", "step 18", "step 12"]
    assert result.verdict == "nondeterministic"
