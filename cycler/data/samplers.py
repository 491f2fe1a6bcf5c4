"""Samplers that resume mid-epoch exactly where the training loop stopped.

Drop-in replacements for cycling_utils' samplers: the same names, constructor arguments and
``advance`` / ``state_dict`` / ``load_state_dict`` / ``in_epoch`` API, so a user changes only the
import line.

How an epoch's order is made, and why resuming costs nothing extra:

- The epoch's *base order* is, with ``order="torch"`` (the default), ``torch.randperm(n)`` drawn
  from a ``torch.Generator`` seeded with ``seed + epoch`` (``range(n)`` without shuffle), exactly
  as ``DistributedSampler`` draws it. With ``order="scalable"`` it is a keyed bijection of
  ``[0, n)`` (:mod:`cycler.data.permutation`) that is never built: memory, the first index and a
  resume cost O(1) in ``n``. See :mod:`cycler.data.epoch_order`.
- The *global order* is the base order padded cyclically (or, with ``drop_last``, truncated) to a
  multiple of the world size ``W``; rank ``r`` takes entries ``r, r + W, r + 2W, ...``. Without an
  interruption every rank yields what ``torch.utils.data.DistributedSampler`` yields.
- ``progress`` is how many samples *this rank's training loop* consumed in this epoch, as told by
  ``advance(n)``. Iterating the sampler never changes it, so DataLoader prefetching and workers
  cannot shift it. After every rank consumed ``p`` samples the job consumed the first ``p * W``
  entries of the global order.
- Resuming skips what was consumed by arithmetic on positions: no sample is replayed or loaded.
  The torch order recomputes the permutation first (what torch pays to start any epoch).

Changing the world size mid-epoch: the job consumed the first ``G`` entries of the base order
(``G = p * W``, or all of it once the epoch's share was used up). The new ranks split the rest,
``base_order[G:]``, with the same rule as above (padded or truncated to a multiple of the new world
size, rank ``r`` taking every ``W'``-th entry from ``r``): positions ``G..`` of the same order,
so the scalable order re-splits without building anything either. Over all ranks no sample of
the epoch is lost or repeated, except for the padding (fewer than ``W`` + ``W'`` repeats) or,
with ``drop_last``, the truncation (fewer than ``W`` + ``W'`` samples skipped) that each split
adds, as torch's own sampler does. The saved state carries no rank: every rank saves the same
state in synchronous data-parallel training, and any rank's state (typically rank 0's) loads on
all ranks.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sized
from contextlib import contextmanager
from typing import Any

import torch.distributed as dist
from torch.utils.data import Dataset, DistributedSampler, Sampler

from cycler._distributed import in_process_group
from cycler.data.epoch_order import (
    check_order,
    checked_epoch,
    epoch_order,
    iterate_share,
    per_rank_length,
    share_positions,
)
from cycler.errors import CyclerError, StateMismatch

__all__ = [
    "SAMPLER_STATE_VERSION",
    "AdvancedTooFarError",
    "InterruptableDistributedSampler",
    "InterruptableSampler",
    "InterruptibleDistributedSampler",
    "InterruptibleSampler",
]

SAMPLER_STATE_VERSION = 2
"""Version of the dict ``state_dict()`` returns. ``load_state_dict`` also reads version 1 (before
``order`` was recorded: every such state is of the torch order) and refuses any other."""

_MUST_MATCH = {
    "order": "build the sampler with the saved order",
    "dataset_length": "build the sampler over the same dataset",
    "seed": "build the sampler with the saved seed",
    "shuffle": "build the sampler with the saved shuffle",
    "drop_last": "build the sampler with the saved drop_last",
}
_POSITION_FIELDS = ("num_replicas", "epoch", "progress", "resplit_at", "consumed")
_LEGACY_FIELDS = frozenset({"epoch", "progress"})


class AdvancedTooFarError(CyclerError, ValueError):
    """``advance(n)`` was told about more samples than remain in this rank's epoch, or fewer
    than none. Same name as cycling_utils' error, so ``except AdvancedTooFarError`` keeps working.
    """


def _consumed_count(
    length: int, resplit_at: int, progress: int, world_size: int, drop_last: bool
) -> int:
    """How many entries of the epoch's base order the whole job has consumed."""
    share = per_rank_length(length - resplit_at, world_size, drop_last)
    if progress and progress == share:
        # The epoch's share is used up: its padding was consumed, its truncated tail dropped.
        return length
    return resplit_at + progress * world_size


class _ResumableSampler:
    """Epoch, progress and saved state, shared by both samplers.

    A subclass sets ``num_replicas``, ``rank``, ``shuffle``, ``seed``, ``drop_last``, ``epoch``,
    ``order`` and ``_dataset_length``, then calls ``reset_progress()``.
    """

    num_replicas: int
    rank: int
    shuffle: bool
    seed: int
    drop_last: bool
    epoch: int
    order: str
    """How each epoch's order is made: ``"torch"`` or ``"scalable"`` (module docstring)."""
    _dataset_length: int
    progress: int
    """Samples of this epoch the training loop consumed on this rank, as told by ``advance``."""
    _resplit_at: int

    @property
    def epoch_length(self) -> int:
        """Samples this rank yields in a whole epoch at the current world size: torch's
        ``num_samples``, and what ``len()`` returns, whatever the progress."""
        return per_rank_length(self._dataset_length, self.num_replicas, self.drop_last)

    @property
    def remaining(self) -> int:
        """How many indices ``iter(self)`` yields if started now: the rest of this epoch. It
        shrinks with ``advance``; after a mid-epoch resume it is less than ``len()``."""
        return self._share - self.progress

    @property
    def _share(self) -> int:
        remaining = self._dataset_length - self._resplit_at
        return per_rank_length(remaining, self.num_replicas, self.drop_last)

    def __len__(self) -> int:
        """The whole per-rank epoch share at any progress, as in torch and cycling_utils:
        scripts size schedulers with ``epochs * len(loader)`` and detect the last batch with
        ``progress // batch_size + 1 == len(loader)``. ``remaining`` is what is left of it."""
        return self.epoch_length

    def __iter__(self) -> Iterator[int]:
        # Fixed by the epoch and progress at iter() time, as torch's: later calls to advance or
        # set_epoch do not change an iterator already made.
        length = self._dataset_length
        order = epoch_order(self.order, length, self.seed, self.epoch, self.shuffle)
        positions = share_positions(
            length, self._resplit_at, self.num_replicas, self.rank, self.drop_last, self.progress
        )
        return iterate_share(order, positions, length, self._resplit_at)

    def advance(self, n: int) -> None:
        """Record that the training loop consumed ``n`` more samples of this rank's epoch."""
        if not 0 <= n <= self.remaining:
            raise AdvancedTooFarError(
                f"advance({n}) does not fit: {self.remaining} samples remain in this rank's epoch "
                f"(progress {self.progress}); call advance with the size of each batch the "
                "training loop consumed, and reset_progress() or in_epoch() between epochs."
            )
        self.progress += n

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose order to yield; moving to another epoch restarts progress at
        0, setting the same epoch again (as after a resume) keeps it. A negative epoch is
        refused here: a checkpoint holding it could not be resumed."""
        epoch = checked_epoch(epoch)
        if epoch != self.epoch:
            self.reset_progress()
        self.epoch = epoch

    def reset_progress(self) -> None:
        """Start the current epoch over from its first sample."""
        self.progress = 0
        self._resplit_at = 0

    @contextmanager
    def in_epoch(self, epoch: int) -> Iterator[None]:
        """Run the body in ``epoch``; on normal exit reset progress so the next epoch starts at
        0. An exception leaves progress as it was, so a checkpoint taken then resumes mid-epoch.
        """
        self.set_epoch(epoch)
        yield
        self.reset_progress()

    def state_dict(self) -> dict[str, Any]:
        """A small dict of ints and bools (torch.save- and JSON-safe), the same on every rank."""
        return {
            "version": SAMPLER_STATE_VERSION,
            "order": self.order,
            "dataset_length": self._dataset_length,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "drop_last": self.drop_last,
            "num_replicas": self.num_replicas,
            "epoch": self.epoch,
            "progress": self.progress,
            "resplit_at": self._resplit_at,
            "consumed": self._consumed(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state``: the next iteration yields what the saved run would have.

        Raises StateMismatch if the state is of another version or was saved with another
        order, dataset length, seed, shuffle or drop_last. A different ``num_replicas`` is
        allowed: the rest of the epoch is split over the new ranks (see the module docstring). A
        cycling_utils state (``{"epoch", "progress"}`` only) is taken as saved by this sampler's
        configuration; a version-1 state as one of the torch order.
        """
        state = checked_mapping(state, "sampler")
        if "version" not in state and set(state) == _LEGACY_FIELDS:
            state = self._from_cycling_utils(state)
        if state.get("version") == 1:
            state = {**state, "version": SAMPLER_STATE_VERSION, "order": "torch"}
        _check_version(state)
        for field, fix in _MUST_MATCH.items():
            self._check_matches(state, field, fix)
        missing = [field for field in _POSITION_FIELDS if field not in state]
        if missing:
            raise StateMismatch(
                f"Saved sampler state lacks {', '.join(missing)}: it is damaged or was not made "
                "by state_dict(); resume from another checkpoint or do not load the state."
            )
        self._load_position(state)

    def _consumed(self) -> int:
        return _consumed_count(
            self._dataset_length, self._resplit_at, self.progress, self.num_replicas,
            self.drop_last,
        )

    def _from_cycling_utils(self, state: Mapping[str, Any]) -> dict[str, Any]:
        saved = self.state_dict()
        saved.update(epoch=_int_field(state, "epoch", 0, None),
                     progress=_int_field(state, "progress", 0, None), resplit_at=0)
        saved["consumed"] = _consumed_count(
            self._dataset_length, 0, saved["progress"], self.num_replicas, self.drop_last
        )
        return saved

    def _check_matches(self, state: Mapping[str, Any], field: str, fix: str) -> None:
        current = self.state_dict()[field]
        if field not in state or state[field] != current:
            raise StateMismatch(
                f"Saved sampler state has {field}={state.get(field)!r} but this sampler has "
                f"{field}={current!r}: {fix} to resume that run, or do not load the state to "
                "start afresh."
            )

    def _load_position(self, state: Mapping[str, Any]) -> None:
        length = self._dataset_length
        _int_field(state, "num_replicas", 1, None)
        consumed = _int_field(state, "consumed", 0, length)
        if state["num_replicas"] == self.num_replicas:
            resplit_at = _int_field(state, "resplit_at", 0, length)
            share = per_rank_length(length - resplit_at, self.num_replicas, self.drop_last)
            progress = _int_field(state, "progress", 0, share)
            saved_consumed = _consumed_count(
                length, resplit_at, progress, self.num_replicas, self.drop_last
            )
            if consumed != saved_consumed:
                raise StateMismatch(
                    f"Saved sampler state has consumed={consumed} but its progress implies "
                    f"{saved_consumed}: the state is damaged; resume from another checkpoint."
                )
        else:
            # Another world size: the new ranks split what the whole job has not consumed yet.
            resplit_at, progress = consumed, 0
        self.epoch = _int_field(state, "epoch", 0, None)
        self._resplit_at, self.progress = resplit_at, progress


def _check_version(state: Mapping[str, Any]) -> None:
    version = state.get("version")
    if version != SAMPLER_STATE_VERSION:
        raise StateMismatch(
            f"Saved sampler state has version={version!r} but this cycler reads version "
            f"{SAMPLER_STATE_VERSION}: resume with the cycler version that saved it, or do not "
            "load the state to start afresh."
        )


def checked_mapping(state: object, what: str) -> Mapping[str, Any]:
    """``state`` if it is the dict a ``state_dict()`` returns, else :class:`StateMismatch`."""
    if not isinstance(state, Mapping):
        raise StateMismatch(
            f"Saved {what} state is {type(state).__name__} {state!r:.40}, not the dict "
            "state_dict() returns: the state is damaged or belongs to something else; resume "
            "from another checkpoint or do not load the state.")
    return state


def _int_field(state: Mapping[str, Any], field: str, low: int, high: int | None) -> int:
    value = state[field]
    in_range = (isinstance(value, int) and not isinstance(value, bool) and value >= low
                and (high is None or value <= high))
    if not in_range:
        bound = "" if high is None else f" and at most {high}"
        raise StateMismatch(
            f"Saved sampler state has {field}={value!r} but it must be an integer of at least "
            f"{low}{bound} for this sampler: the state is damaged or belongs to another run; "
            "resume from another checkpoint."
        )
    return value


def _default_world(num_replicas: int | None, rank: int | None) -> tuple[int, int]:
    """The process group's world size and rank where one is initialized, else one process."""
    grouped = in_process_group()
    if num_replicas is None:
        num_replicas = dist.get_world_size() if grouped else 1
    if rank is None:
        rank = dist.get_rank() if grouped else 0
    return num_replicas, rank


class InterruptableDistributedSampler(_ResumableSampler, DistributedSampler[int]):
    """``torch.utils.data.DistributedSampler`` that can be stopped and resumed mid-epoch.

    Without an interruption it yields exactly what ``DistributedSampler`` yields for the same
    arguments, epoch after epoch. ``num_replicas`` and ``rank`` default to the process group's,
    or to one process (1 and 0) when no process group is initialized, where torch would raise.

    Call ``advance(batch_size)`` after each batch the training loop consumed and save
    ``state_dict()`` in the checkpoint; after ``load_state_dict(state)`` the sampler yields the
    indices the uninterrupted run would have yielded next, on every rank, even with a different
    world size (see the module docstring).

    Lengths, as in torch and cycling_utils: ``len(sampler)`` (= ``sampler.epoch_length`` =
    torch's ``num_samples``) is the full per-rank epoch share at any progress, so
    ``len(DataLoader)`` is the whole epoch's batch count even after a resume.
    ``sampler.remaining`` is what ``iter(sampler)`` yields if started now (the rest of the
    epoch, for progress bars of a resumed partial epoch); ``sampler.progress`` is the samples
    consumed so far in this epoch.

    Use ``with sampler.in_epoch(epoch):`` around each epoch (or ``set_epoch`` plus
    ``reset_progress``). ``num_samples`` and ``total_size`` keep torch's meaning (a whole epoch
    at this world size).

    ``order="scalable"`` shuffles with a keyed bijection instead of ``randperm``: the same
    guarantees (each sample once per epoch across ranks, a new order each epoch, exact resume,
    world-size changes), at O(1) memory and time to the first index for any dataset length, even
    a dataset that only reports its ``len()``. It is not torch's order: a state saved with one
    order does not load into a sampler of the other.
    """

    def __init__(
        self,
        dataset: Dataset[Any],
        num_replicas: int | None = None,
        rank: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        *,
        order: str = "torch",
    ) -> None:
        check_order(order)
        num_replicas, rank = _default_world(num_replicas, rank)
        DistributedSampler.__init__(self, dataset, num_replicas, rank, shuffle, seed, drop_last)
        self.order = order
        self._dataset_length = len(dataset)  # type: ignore[arg-type]
        self.reset_progress()


class InterruptableSampler(_ResumableSampler, Sampler[int]):
    """A one-process sampler (one machine, or one rank reading its own shard, as with
    :class:`cycler.DistributedShardedDataset`) that can be stopped and resumed mid-epoch.

    Each epoch yields ``torch.randperm(len(dataset))`` drawn from a generator seeded with
    ``seed + epoch``, or ``range(len(dataset))`` without shuffle; ``order="scalable"`` as in
    :class:`InterruptableDistributedSampler`. Progress, ``advance``,
    ``in_epoch``, ``state_dict``, ``load_state_dict``, ``len()``, ``epoch_length``,
    ``remaining`` and ``progress`` behave as in :class:`InterruptableDistributedSampler` with
    one replica. The signature is cycling_utils': ``num_replicas``, ``rank`` and ``drop_last``
    are accepted and, as there, unused (every index of ``dataset`` is this process's).
    """

    def __init__(self, dataset: Sized, num_replicas: int | None = None, rank: int | None = None,
                 shuffle: bool = True, seed: int = 0, drop_last: bool = False, *,
                 order: str = "torch") -> None:
        check_order(order)
        self.order = order
        self.data_source = dataset
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.num_replicas, self.rank, self.drop_last = 1, 0, False
        self.epoch = 0
        self._dataset_length = len(dataset)
        self.reset_progress()


InterruptibleSampler = InterruptableSampler
InterruptibleDistributedSampler = InterruptableDistributedSampler
