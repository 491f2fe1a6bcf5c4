"""What ``cycle verify`` found: the verdict, the first difference and its likely cause, the runs.

Exit codes (the CLI exits with :attr:`VerifyResult.exit_code`):

| code | meaning |
| --- | --- |
| 0 | identical: every checkpoint both runs committed at the same step is bit-identical |
| 1 | different: a checkpoint after a resume differs (the report names where and why) |
| 2 | bad usage, or a script verify cannot check (no cycler checkpoints) |
| 3 | the script is not deterministic: two runs differ before any interruption |
| 4 | a run of the script failed |
| 130 | interrupted (Ctrl-C) |
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cycler.verify.causes import Cause, part_of_difference
from cycler.verify.compare import CheckpointDiff, Difference
from cycler.verify.records import Skipped
from cycler.verify.runner import Resume, RunRecord

IDENTICAL, DIFFERENT, NONDETERMINISTIC = "identical", "different", "nondeterministic"
EXIT_CODES = {IDENTICAL: 0, DIFFERENT: 1, NONDETERMINISTIC: 3}
_SHOWN = 5


@dataclass(frozen=True)
class FirstDifference:
    """The first checkpoint both runs committed at one step that differs."""

    step: int | None
    moment: str
    """The step in words (``step 24``), or the data position where checkpoints carry none."""
    checkpoint: str
    """The interrupted run's checkpoint (its name in its root)."""
    diff: CheckpointDiff
    cause: Cause
    resume: Resume | None
    """The interruption whose resume preceded it (``None``: before any)."""
    interruption: int = 0
    """Its number, from 1 (0: before any)."""

    @property
    def headline(self) -> Difference:
        """The difference to show first: the one that named the cause, else one in the part
        named, else the first in the model, else any but the metrics (which follow from
        everything)."""
        if self.cause.evidence is not None:
            return self.cause.evidence
        return sorted(self.diff.differences, key=self._rank)[0]

    def _rank(self, difference: Difference) -> int:
        part = part_of_difference(difference)
        order = [self.cause.name, "model", "optimizer"]
        return order.index(part) if part in order else 3 + (part == "metrics")

    @property
    def steps_after_resume(self) -> int | None:
        if self.resume is None or self.step is None or self.resume.from_step is None:
            return None
        return self.step - self.resume.from_step

    def as_dict(self) -> dict[str, Any]:
        first = self.headline
        return {
            "step": self.step, "moment": self.moment, "checkpoint": self.checkpoint,
            "where": first.where(),
            "file": first.file, "key": ".".join(first.key),
            "tensors_differing": self.diff.tensors_differing, "tensors": self.diff.tensors,
            "largest_difference": self.diff.largest,
            "differences": [d.where() for d in self.diff.differences[:_SHOWN]],
            "after_interruption": self.interruption or None,
            "resume": self.resume.as_dict() if self.resume else None,
            "steps_after_resume": self.steps_after_resume, "cause": self.cause.as_dict(),
        }


@dataclass
class VerifyResult:
    verdict: str
    runs: list[RunRecord]
    seed: int
    scratch: Path | None
    """Where the runs are kept (``None``: removed, they were identical)."""
    compared: list[tuple[str, int, bool]] = field(default_factory=list)
    """Every moment compared: (``step 24``, the interrupted run's segment, identical)."""
    paired: set[tuple[Path, Path]] = field(default_factory=set)
    """The checkpoints compared so far (the reference's, the interrupted run's)."""
    first: FirstDifference | None = None
    notes: list[str] = field(default_factory=list)
    determinism_checked: int = 0
    """Checkpoints compared before the first interruption (the determinism check)."""
    determinism_check: bool = True
    """Whether a difference before the first interruption is judged nondeterminism."""
    skipped: dict[str, list[str]] = field(default_factory=dict)
    """Why -> where: the files and values left out as records of the runs (logs, times, paths),
    a few places each."""
    last_step_compared: int | None = None
    """The latest step at which the runs' states were compared (a checkpoint, or the end of
    training where the runs left files in their working directories)."""

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.verdict]

    def note_skipped(self, skipped: list[Skipped]) -> None:
        for item in skipped:
            places = self.skipped.setdefault(item.why, [])
            if item.where not in places and len(places) < _SHOWN:
                places.append(item.where)

    @property
    def steps_after_last_resume(self) -> int | None:
        """How many steps after the last resume were compared (``None``: unknown)."""
        interrupted = self.runs[1] if len(self.runs) > 1 else None
        if interrupted is None or not interrupted.resumes or self.last_step_compared is None:
            return None
        start = interrupted.resumes[-1].from_step
        return None if start is None else self.last_step_compared - start

    def workdirs(self) -> dict[str, str]:
        """Where each run's working directory (its relative outputs) is."""
        return {run.name: str(run.workdir) for run in self.runs}

    def as_dict(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict, "exit_code": self.exit_code, "seed": self.seed,
            "scratch": str(self.scratch) if self.scratch else None,
            "determinism_check": self.determinism_check,
            "determinism_checked_on": self.determinism_checked,
            "compared": [{"moment": moment, "segment": g, "identical": same}
                         for moment, g, same in self.compared],
            "first_difference": self.first.as_dict() if self.first else None,
            "runs": [_run_dict(run) for run in self.runs], "notes": self.notes,
            "skipped": self.skipped, "last_step_compared": self.last_step_compared,
            "steps_after_last_resume": self.steps_after_last_resume,
        }


def _run_dict(run: RunRecord) -> dict[str, Any]:
    return {"name": run.name, "seconds": round(run.seconds, 2), "starts": run.starts,
            "startup_seconds": round(run.startup_seconds, 2),
            "stopping_seconds": round(run.stopping_seconds, 2),
            "checkpoints": len(run.capture.kept), "missed": run.capture.missed,
            "last_step": run.last_step, "finished": run.finished,
            "workdir": str(run.workdir),
            "interruptions": [r.as_dict() for r in run.resumes]}
