"""The parts of a verify session that judge the runs without starting any: a resumed start
that went back."""

from __future__ import annotations

import time
from pathlib import Path

import torch

from cycler.checkpoint.manifest import FileRecord, Manifest
from cycler.verify.capture import Capture, Captured
from cycler.verify.plan import KILL, STOP, Interruption
from cycler.verify.runner import Resume, RunRecord
from cycler.verify.session import went_back


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
