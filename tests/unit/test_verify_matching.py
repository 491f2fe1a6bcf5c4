"""cycle verify pairs the two runs' checkpoints by step, else by the data position they hold."""

from __future__ import annotations

import time
from pathlib import Path

import torch

from cycler.checkpoint.manifest import FileRecord, Manifest
from cycler.verify.capture import Captured
from cycler.verify.matching import pair_checkpoints


def captured(tmp_path: Path, name: str, step: int | None, progress: int,
             segment: int = 0) -> Captured:
    directory = tmp_path / name
    directory.mkdir()
    torch.save({"sampler": {"epoch": 0, "progress": progress}, "model": torch.zeros(1)},
               directory / "checkpoint.pt")
    manifest = Manifest(index=0, files={"checkpoint.pt": FileRecord(1, "0")},
                        created_at=time.time(), step=step)
    return Captured(directory, name, manifest, segment)


def test_checkpoints_with_steps_are_paired_by_step(tmp_path: Path) -> None:
    reference = [captured(tmp_path, f"r{s}", s, s) for s in (8, 16, 24)]
    interrupted = [captured(tmp_path, "i8", 8, 8), captured(tmp_path, "i13", 13, 13),
                   captured(tmp_path, "i16", 16, 16, 1), captured(tmp_path, "i24", 24, 24, 1)]
    pairs = pair_checkpoints(reference, interrupted)
    assert [(p.reference.name, p.interrupted.name, p.moment) for p in pairs] == [
        ("r8", "i8", "step 8"), ("r16", "i16", "step 16"), ("r24", "i24", "step 24")]


def test_checkpoints_without_steps_are_paired_by_their_data_position(tmp_path: Path) -> None:
    # A cycling_utils-style script saves every N batches of enumerate(loader): after a resume
    # its checkpoints fall elsewhere, so commit order would pair the wrong ones.
    reference = [captured(tmp_path, f"r{p}", None, p) for p in (16, 816, 1616)]
    interrupted = [captured(tmp_path, f"i{p}", None, p) for p in (16, 48, 816, 1616)]
    pairs = pair_checkpoints(reference, interrupted)
    assert [(p.reference.name, p.interrupted.name) for p in pairs] == [
        ("r16", "i16"), ("r816", "i816"), ("r1616", "i1616")]
    assert pairs[1].moment == "sampler.epoch 0, sampler.progress 816"
