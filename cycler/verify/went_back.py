"""A resumed start that went back: it committed a moment from before the checkpoint it resumed
from (it loaded no checkpoint, or not its step counter). Pairing by moment takes the later of
two commits of one moment, so a script that never loads its checkpoint, training each start
from step 0 deterministically to the same end, would compare equal everywhere."""

from __future__ import annotations

from dataclasses import replace

from cycler.verify.capture import Captured
from cycler.verify.causes import CAUSES, Cause
from cycler.verify.compare import CheckpointDiff, Difference, compare_checkpoints
from cycler.verify.matching import data_position
from cycler.verify.plan import KILL
from cycler.verify.result import DIFFERENT, FirstDifference, VerifyResult
from cycler.verify.runner import Resume, RunRecord


def went_back(interrupted: RunRecord) -> tuple[Captured, Resume] | None:
    """The first checkpoint a resumed start committed at a step before the one it resumed from,
    and that resume: the start went back (it loaded no checkpoint, or not its step counter).
    After a kill, the checkpoint before the newest: one committed as the kill landed may not
    be the one its latest link names yet, and the restart resumes from the link's."""
    kept = interrupted.capture.kept
    for index, checkpoint in enumerate(kept):
        if checkpoint.segment == 0 or checkpoint.segment > len(interrupted.resumes):
            continue
        resume = interrupted.resumes[checkpoint.segment - 1]
        if checkpoint.step is None:
            if _position_seen_before(kept, index, resume):
                return checkpoint, resume
            continue
        bound = resume.from_step
        if bound is not None and resume.interruption.kind == KILL:
            bound = max((c.step for c in kept if c.segment < checkpoint.segment
                         and c.step is not None and c.step < bound), default=None)
        if bound is not None and checkpoint.step < bound:
            return checkpoint, resume
    return None


def _position_seen_before(kept: list[Captured], index: int, resume: Resume) -> bool:
    """Whether the data position of ``kept[index]`` (a checkpoint without a step) was committed
    before the checkpoint ``resume`` went on from (after a kill, before the one before it)."""
    names = [c.name for c in kept[:index]]
    if resume.from_name not in names:
        return False
    start = names.index(resume.from_name) - (resume.interruption.kind == KILL)
    position = data_position(kept[index])
    return bool(position) and any(data_position(c) == position for c in kept[:max(start, 0)])


def judge_went_back(reference: RunRecord, interrupted: RunRecord, result: VerifyResult,
               ignored: set[tuple[str, tuple[str, ...]]]) -> None:
    """DIFFERENT when a resumed start went back (:func:`went_back`). Pairing by moment would
    take its later commits for the reference's and find them equal: a script that never loads
    its checkpoint trains each start from step 0, deterministically, to the same end. Its
    commit equal to the reference's at that moment means nothing was loaded; else the step
    counter (or the data position) was lost."""
    found = went_back(interrupted)
    if found is None:
        return
    checkpoint, resume = found
    same = [c for c in reference.capture.kept if _same_moment(c, checkpoint)]
    diff = CheckpointDiff([]) if not same else compare_checkpoints(
        same[-1].path, checkpoint.path,
        sorted({*same[-1].manifest.files, *checkpoint.manifest.files}),
        trusted=True).without(ignored)
    name = "not_loaded" if same and diff.identical else "counters"
    moment = (f"step {checkpoint.step}" if checkpoint.step is not None
              else f"the data position of {checkpoint.name}")
    since = (f"step {resume.from_step}" if resume.from_step is not None
             else str(resume.from_name))
    shown = Difference("the commit's place in training", ("went back",), "values", scalar=True)
    part, fix = CAUSES[name]
    why = (f"after resuming from the checkpoint of {since}, the run committed {moment} again, "
           + ("equal to the uninterrupted run's: it started over without loading the "
              "checkpoint" if name == "not_loaded" else "where it had been before the "
              "checkpoint it resumed from: its counters went back"))
    result.verdict = DIFFERENT
    result.compared.append((moment, checkpoint.segment, False))
    result.first = FirstDifference(None, moment, checkpoint.name,
                                   replace(diff, differences=[shown, *diff.differences]),
                                   Cause(name, part, why, fix, shown), resume,
                                   checkpoint.segment)


def _same_moment(mine: Captured, theirs: Captured) -> bool:
    if theirs.step is not None:
        return (mine.step, mine.manifest.epoch) == (theirs.step, theirs.manifest.epoch)
    return mine.step is None and data_position(mine) == data_position(theirs)
