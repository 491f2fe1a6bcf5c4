"""Whether a restart replayed the steps an earlier run computed, bit for bit (pure).

A restart resumes at the step of its checkpoint, ``N``, and computes again the steps an earlier
run computed after ``N`` before it crashed, was killed or hung. Each rank's fingerprints of
those steps (:mod:`cycler.protocol.fingerprints`) are compared with the earlier run's, exact
bits against exact bits:

- a *segment* is what one worker process of one rank recorded: the step it resumed at, the
  world size, and a value per step;
- the reference of a segment is the most recent earlier segment of the same rank that passed
  through its resume step (resumed at or before ``N``, recorded a step after it): a checkpoint
  made by that run, or one it passed through;
- a world size that differs from the reference's is said, not compared (each rank's share of
  the data differs);
- the first difference is the verdict: at the first replayed step, the state restored from the
  checkpoint is not the state the earlier run had (something is not saved or not restored);
  later, the replay drifted after identical steps (nondeterminism, an RNG stream that drifts).

Nothing here reads a file or a clock: records in, verdicts out.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from cycler.protocol.fingerprints import START, VALUE, Record, shown

VERIFIED, DIVERGED, UNCHECKED = "verified", "diverged", "unchecked"

FIRST_STEP_CAUSE = ("the first replayed step differs: the state restored from the checkpoint "
                    "differs from the one the earlier run had (an RNG state, the data order or "
                    "position, the optimizer, scheduler or model state not saved or not "
                    "restored)")
LATER_STEP_CAUSE = ("{same} replayed steps were identical before it: nondeterminism or RNG "
                    "drift (non-deterministic kernels, data loader workers, a random stream "
                    "not restored that is drawn from only now and then), not a state missing "
                    "from the checkpoint")
REPEATED_CAUSE = ("the first replayed step computed exactly what step {step} computed before: "
                  "the run repeats earlier steps (the checkpoint's model or data position, or "
                  "the step count, was not restored)")


@dataclass
class Segment:
    """What one worker process of one rank recorded."""

    rank: int
    start: int
    resumed: int
    """The step it resumed at (its first step is ``resumed + 1``)."""
    world_size: int
    values: dict[int, tuple[int, int]] = field(default_factory=dict)
    """Value type and bits, by step."""
    earlier: dict[tuple[int, int], int] = field(default_factory=dict)
    """In a reference: values of steps at or before the resume, and the first step that
    computed each (a restart that computes one of them repeats earlier steps)."""

    @property
    def last(self) -> int:
        """Its newest step (``resumed`` before any)."""
        return max(self.values, default=self.resumed)


FIRST_STEPS = 64
"""Steps after each resume kept from before a restart's own resume step: what a restart
that starts over computes again."""


def segments(records: Iterable[Record], after: int | None = None) -> list[Segment]:
    """The segments in ``records``, in the order they began (a record seen twice counts once;
    values before their start's header, whose header was torn, are dropped); with ``after``,
    only the values of later steps are kept (what a restart that resumed there can replay),
    and the first :data:`FIRST_STEPS` after each resume."""
    found: dict[tuple[int, int], Segment] = {}
    for record in records:
        key = (record.rank, record.start)
        if record.kind == START and key not in found:
            found[key] = Segment(record.rank, record.start, record.step, record.bits)
        elif record.kind == VALUE and key in found and (
                after is None or record.step > after
                or record.step <= found[key].resumed + FIRST_STEPS):
            found[key].values.setdefault(record.step, (record.type, record.bits))
    return list(found.values())


@dataclass(frozen=True)
class RankReplay:
    """One rank's replay against its reference."""

    rank: int
    resumed: int
    verdict: str
    compared: int = 0
    """Replayed steps compared (identical ones, and the differing one)."""
    replayable: int = 0
    """Steps the reference has after ``resumed``: what a complete replay compares."""
    step: int | None = None
    """The differing step (:data:`DIVERGED`)."""
    now: str = ""
    before: str = ""
    cause: str = ""

    @property
    def complete(self) -> bool:
        """Whether every replayable step was compared, or a difference ended it."""
        return self.verdict != VERIFIED or self.compared >= self.replayable


def reference(earlier: list[Segment], current: Segment) -> Segment | None:
    """What ``current`` replays: for each step after its resume, the value of the most recent
    of ``earlier`` (oldest first) that passed through that resume step on its rank (two
    restarts in a row: the second compares the steps the first replayed with the first, and
    those beyond with the run before); ``None`` when none did (nothing is replayed). It has the
    world size of the most recent one."""
    passed = [segment for segment in earlier if segment.rank == current.rank
              and segment.resumed <= current.resumed < segment.last]
    if not passed:
        return None
    newest = passed[-1]
    merged = Segment(current.rank, newest.start, current.resumed, newest.world_size)
    for segment in reversed(passed):
        if segment.world_size == newest.world_size:
            for step, value in segment.values.items():
                if step > current.resumed:
                    merged.values.setdefault(step, value)
                elif merged.earlier.get(value, step + 1) > step:
                    merged.earlier[value] = step
    return merged


def compare(before: Segment, current: Segment) -> RankReplay:
    """``current``'s steps after its resume against ``before``'s, in step order."""
    resumed = current.resumed
    replayable = sorted(step for step in before.values if step > resumed)
    if before.world_size != current.world_size:
        return RankReplay(current.rank, resumed, UNCHECKED, replayable=len(replayable),
                          cause=f"the world size changed from {before.world_size} to "
                                f"{current.world_size}")
    compared = 0
    for step in replayable:
        if step not in current.values:
            break
        compared += 1
        if current.values[step] != before.values[step]:
            return RankReplay(current.rank, resumed, DIVERGED, compared, len(replayable), step,
                              shown(*current.values[step]), shown(*before.values[step]),
                              _cause(before, current, step, compared))
    return RankReplay(current.rank, resumed, VERIFIED, compared, len(replayable))


def _cause(before: Segment, current: Segment, step: int, compared: int) -> str:
    if compared > 1:
        return LATER_STEP_CAUSE.format(same=compared - 1)
    repeated = before.earlier.get(current.values[step])
    return FIRST_STEP_CAUSE if repeated is None else REPEATED_CAUSE.format(step=repeated)


@dataclass(frozen=True)
class Verdict:
    """The job's verdict on one restart, over its ranks: what ``cycle status`` says."""

    verdict: str
    resumed: int
    steps: int
    """Replayed steps found identical on every rank compared."""
    ranks: int
    complete: bool
    """Whether every replayable step was compared (a run that ended early compared fewer)."""
    step: int | None = None
    rank: int | None = None
    now: str = ""
    before: str = ""
    cause: str = ""

    def fields(self) -> dict[str, object]:
        """The event's fields (:data:`VERDICT_EVENTS`), its sentence as ``said``."""
        found = {key: value for key, value in self.__dict__.items()
                 if value is not None and value != ""}
        return {**found, "said": self.sentence()}

    def sentence(self) -> str:
        """What ``cycle status`` says about this restart."""
        ranks = f"{self.ranks} rank{'s' if self.ranks != 1 else ''}"
        if self.verdict == DIVERGED:
            return (f"resume at step {self.resumed} diverged at step {self.step} on rank "
                    f"{self.rank} (loss {self.now} vs {self.before} before): {self.cause}")
        if self.verdict == UNCHECKED:
            return f"resume at step {self.resumed} not verified: {self.cause}"
        steps = f"{self.steps} replayed step{'s' if self.steps != 1 else ''}"
        cut = "" if self.complete else "; the run ended before it replayed the rest"
        return f"resume at step {self.resumed} verified: {steps} identical ({ranks}){cut}"


def verdict(found: list[RankReplay]) -> Verdict | None:
    """The restart's verdict: the earliest difference on any rank, else a world size that
    changed, else the steps identical everywhere; ``None`` when no rank replayed a step."""
    if not found:
        return None
    resumed, ranks = min(r.resumed for r in found), len(found)
    complete = all(r.complete for r in found)
    diverged = [r for r in found if r.verdict == DIVERGED]
    if diverged:
        first = min(diverged, key=lambda r: (r.step, r.rank))
        return Verdict(DIVERGED, first.resumed, first.compared - 1, ranks, True, first.step,
                       first.rank, first.now, first.before, first.cause)
    unchecked = [r for r in found if r.verdict == UNCHECKED]
    if unchecked:
        return Verdict(UNCHECKED, resumed, 0, ranks, True, cause=unchecked[0].cause)
    return Verdict(VERIFIED, resumed, min(r.compared for r in found), ranks, complete)


VERDICT_EVENTS = {VERIFIED: "replay_verified", DIVERGED: "replay_diverged",
                  UNCHECKED: "replay_unchecked"}
"""The events log's name for each verdict."""
