"""Where to interrupt the second run: a pure function of what the reference run committed.

Every interruption lands after the reference's first checkpoint (before it there is nothing to
resume from). By default one lands inside the first epoch and one between the last checkpoint
of an epoch and the first of the next, so that the resumed run crosses the epoch boundary
before it commits again; the others land anywhere after the first checkpoint. A script whose
checkpoints carry no step (``metadata={"step": ...}``) is interrupted by checkpoint count
instead: after the k-th commit, half an interval later.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass

STOP = "stop"
KILL = "kill"


@dataclass(frozen=True)
class Interruption:
    """One planned interruption of the second run."""

    kind: str
    """:data:`STOP` (the stop signal, as a preemption sends it) or :data:`KILL` (kill -9 of a
    worker)."""
    step: int | None
    """The step at which it is sent (the run stops at the first step its ranks agree on)."""
    after_checkpoints: int | None = None
    """For scripts without steps: sent half an interval after this many commits."""
    why: str = "random"

    def as_dict(self) -> dict[str, object]:
        return {"kind": self.kind, "step": self.step,
                "after_checkpoints": self.after_checkpoints, "why": self.why}


@dataclass(frozen=True)
class ReferenceShape:
    """What the plan needs of the reference run."""

    steps: list[int | None]
    """The steps of its committed checkpoints, in commit order."""
    epochs: list[int | None]
    last_step: int
    """The last step it reached (its workers' beacons), or -1 when unknown."""


def plan_interruptions(shape: ReferenceShape, *, stops: int, kills: int,
                       seed: int) -> list[Interruption]:
    """``stops`` stops and ``kills`` kills, in the order they happen."""
    chooser = random.Random(seed)
    kinds = [STOP] * stops + [KILL] * kills
    chooser.shuffle(kinds)
    if not kinds:
        return []
    known = [s for s in shape.steps if s is not None]
    if len(known) != len(shape.steps) or not known:
        return _by_count(kinds, len(shape.steps))
    first, last = min(known), max(shape.last_step, max(known))
    if last <= first:
        return _by_count(kinds, len(shape.steps))
    targets = _targeted(shape, first, last, chooser)[:len(kinds)]
    while len(targets) < len(kinds):
        targets.append((chooser.randint(first + 1, last), "random"))
    chosen = sorted(targets)
    return [Interruption(kind, step, why=why)
            for kind, (step, why) in zip(kinds, chosen, strict=True)]


def _targeted(shape: ReferenceShape, first: int, last: int,
              chooser: random.Random) -> list[tuple[int, str]]:
    """The step inside the first epoch and the step before an epoch boundary, where they exist."""
    pairs = [(s, e) for s, e in zip(shape.steps, shape.epochs, strict=True) if s is not None]
    targets = []
    first_epoch = pairs[0][1]
    in_first = [s for s, e in pairs if e == first_epoch and s > first]
    end_of_first = max(in_first) if in_first else _next_step(pairs, first, last)
    targets.append((chooser.randint(first + 1, end_of_first), "in the first epoch"))
    for (step, epoch), (next_step, next_epoch) in itertools.pairwise(pairs):
        if epoch is not None and next_epoch is not None and next_epoch != epoch \
                and next_step > step + 1:
            targets.append((chooser.randint(step + 1, next_step - 1), "across an epoch boundary"))
            break
    return targets


def _next_step(pairs: list[tuple[int, int | None]], after: int, last: int) -> int:
    later = [s for s, _ in pairs if s > after]
    return min(later) if later else last


def _by_count(kinds: list[str], checkpoints: int) -> list[Interruption]:
    """Spread over the commits after the first, when steps are unknown."""
    usable = max(checkpoints - 1, 1)
    return [Interruption(kind, None, after_checkpoints=1 + (i * usable) // len(kinds),
                         why="by checkpoint count (the manifests carry no step)")
            for i, kind in enumerate(kinds)]
