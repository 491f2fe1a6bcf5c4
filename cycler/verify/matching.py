"""Which checkpoints of the two runs stand for the same moment of training.

By the step their commit records (``metadata={"step": ...}``) where every checkpoint has one.
Otherwise by the data position they hold: the integer counters of the sampler, the loader or
the epoch (a cycling_utils-style script saves every N batches of ``enumerate(loader)``, which
starts again at 0 after a resume, so its checkpoints do not fall where the reference's do and
their order means nothing). Where a checkpoint holds neither, by commit order.
"""

from __future__ import annotations

from dataclasses import dataclass

from cycler.verify.capture import Captured
from cycler.verify.causes import part_of
from cycler.verify.compare import leaves, load_unit, units

Position = tuple[tuple[str, str, int], ...]


@dataclass(frozen=True)
class Pair:
    """A checkpoint of each run at the same moment, and that moment in words."""

    reference: Captured
    interrupted: Captured
    moment: str
    """``step 24``; ``sampler.epoch 1, sampler.progress 800``; ``checkpoint 3``."""


def pair_checkpoints(reference: list[Captured], interrupted: list[Captured]) -> list[Pair]:
    """The pairs, in the reference's commit order (see the module's docstring)."""
    if all(c.step is not None for c in [*reference, *interrupted]):
        # By step and epoch: a step committed at an epoch's end and again after the last epoch
        # (Lightning's epoch counter moves between them) is two moments. A moment committed
        # twice (a stop's checkpoint after a periodic one): the later one.
        by_moment = {(c.step, c.manifest.epoch): c for c in interrupted}
        return [Pair(c, by_moment[(c.step, c.manifest.epoch)], f"step {c.step}")
                for c in reference if (c.step, c.manifest.epoch) in by_moment]
    positions = [data_position(c) for c in reference]
    if all(positions):
        by_position = {data_position(c): c for c in interrupted}
        return [Pair(c, by_position[p], _words(p)) for c, p in zip(reference, positions,
                                                                    strict=True)
                if p in by_position]
    return [Pair(a, b, f"checkpoint {n}") for n, (a, b) in
            enumerate(zip(reference, interrupted, strict=False), start=1)]


def data_position(checkpoint: Captured) -> Position:
    """The integer leaves of the data position and the counters (empty: none)."""
    found = []
    for unit in units(list(checkpoint.manifest.files)):
        value = load_unit(checkpoint.path, unit, trusted=True)
        for key, leaf in leaves(value):
            if isinstance(leaf, int) and not isinstance(leaf, bool) \
                    and part_of(unit, key) in ("data", "counters"):
                found.append((unit, ".".join(key), leaf))
    return tuple(found)


def _words(position: Position) -> str:
    return ", ".join(f"{key} {value}" for _, key, value in position if "version" not in key)
