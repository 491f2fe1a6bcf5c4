"""The training loader of a Lightning fit, made resumable at the position of the last batch
trained (the ``CyclerCallback`` of :mod:`cycler.integrations.lightning` uses it).

- A map-style loader (a batch sampler Lightning or the script gave it) is rebuilt as a
  :class:`ResumableLoader` around the same dataset, batch sampler and workers: a resumed epoch
  skips the batches already trained as index lists, and Lightning saves and restores that
  position itself.
- An iterable-style loader resumes through the ``state_dict``/``load_state_dict`` it or its
  dataset has (torchdata's ``StatefulDataLoader``; an ``IterableDataset`` read in this process):
  each rank's state after the last batch trained is saved beside the checkpoint, because
  Lightning's own save of a loader's state keeps rank 0's only, and one batch too far (its
  fetcher reads a batch ahead). An iterable-style loader without such a state is refused before
  the first step (:func:`refusal`): it could only restart its stream from the beginning.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset

from cycler.checkpoint.saving import atomic_torch_save

LOADER_STATE_VERSION = 1


def loader_file(rank: int) -> str:
    return f"loader-{rank}.pt"


def has_state(thing: object) -> bool:
    return callable(getattr(thing, "state_dict", None)) and \
        callable(getattr(thing, "load_state_dict", None))


def refusal(loader: object) -> str | None:
    """Why the training loader ``loader`` cannot resume exactly, in one line naming what to
    change; None when it can."""
    if not isinstance(loader, DataLoader):
        return (f"cycler resumes the training data of a DataLoader; this fit trains on a "
                f"{type(loader).__name__}: wrap it in a torch DataLoader")
    dataset = loader.dataset
    if not isinstance(dataset, IterableDataset):
        if loader.batch_sampler is None:
            return ("cycler resumes a training DataLoader by its batches; this one has "
                    "batch_size=None: give it a batch_size or a batch_sampler")
        return None
    if has_state(loader):
        return None
    name = type(dataset).__name__
    if not has_state(dataset):
        return (f"the training DataLoader reads {name}, an IterableDataset without a position "
                f"to resume from: give {name} state_dict()/load_state_dict() methods, or load it "
                f"with torchdata's StatefulDataLoader")
    if loader.num_workers > 0:
        return (f"{name}.state_dict() is kept in the DataLoader's {loader.num_workers} worker "
                f"processes, not in the training process: load it with torchdata's "
                f"StatefulDataLoader, or set num_workers=0")
    return None


def resumable(loader: DataLoader, seed: int, rank: int, resumed_from: Path | None) -> DataLoader:
    """``loader`` made resumable (:func:`refusal` said it can be); the state of a resumed
    iterable-style loader is loaded from ``resumed_from`` at once."""
    if isinstance(loader, ResumableLoader) or _position(loader) is not None:
        return loader
    if not isinstance(loader.dataset, IterableDataset):
        return ResumableLoader.around(loader, seed)
    _track(loader)
    position = _position(loader)
    assert position is not None
    if resumed_from is not None and (resumed_from / loader_file(rank)).exists():
        position.load(resumed_from / loader_file(rank))
    return loader


def epoch_begins(loader: DataLoader | None, epoch: int) -> None:
    """Lightning begins epoch ``epoch`` (``on_train_epoch_start``, before it makes the epoch's
    iterator; not called for an epoch resumed in its middle). Lightning's own ``set_epoch``
    reaches only a loader's sampler and its batch sampler's sampler, never the rebuilt loader's
    batch sampler: without this call a ``DistributedSampler`` shuffled every epoch as the first,
    and a resume reseeded for the epoch of the checkpoint, which always said 0."""
    if isinstance(loader, ResumableLoader):
        skipping = loader.batch_sampler
        assert isinstance(skipping, _SkippingBatchSampler)
        skipping.set_epoch(epoch)


def save_position(loader: DataLoader | None, directory: Path, rank: int) -> None:
    """Every rank: its iterable-style loader's state after the last batch trained, beside the
    checkpoint (nothing for a map-style loader: Lightning's own save holds its position)."""
    position = _position(loader)
    if position is not None:
        atomic_torch_save(position.saved(), directory / loader_file(rank))


def note_trained(loader: DataLoader | None, batches_in_epoch: int) -> None:
    """After each training batch: ``batches_in_epoch`` batches of this epoch are trained."""
    if isinstance(loader, ResumableLoader):
        loader.batches_done = batches_in_epoch
    elif (position := _position(loader)) is not None:
        position.note_trained()


class _Position:
    """The state of an iterable-style loader's ``source`` (the loader itself or its dataset)
    after each batch the loader yields, so that the state after the last batch *trained* can
    be saved while Lightning's fetcher already holds the next batch."""

    def __init__(self, source: Any) -> None:
        self.source = source
        self.states: dict[int, Any] = {}
        self.trained = 0
        self.end: tuple[int, Any] | None = None

    def track(self, batches: Iterator[Any]) -> Iterator[Any]:
        self.states, self.trained, self.end = {}, 0, None
        yielded = 0
        for batch in batches:
            self.states[yielded] = copy.deepcopy(self.source.state_dict())
            yielded += 1
            yield batch
        self.end = (yielded, copy.deepcopy(self.source.state_dict()))

    def note_trained(self) -> None:
        self.trained += 1
        self.states.pop(self.trained - 2, None)

    def saved(self) -> dict[str, Any]:
        """The source's state after the last batch trained (at the end of the stream: its
        state once the stream ended, where an uninterrupted run starts its next pass from)."""
        if self.end is not None and self.end[0] == self.trained:
            state = self.end[1]
        elif self.trained == 0:
            state = copy.deepcopy(self.source.state_dict())
        else:
            state = self.states[self.trained - 1]
        return {"version": LOADER_STATE_VERSION, "state": state}

    def load(self, path: Path) -> None:
        self.source.load_state_dict(torch.load(path, weights_only=True)["state"])


def _position(loader: object) -> _Position | None:
    return getattr(loader, "_cycler_position", None)


def _track(loader: DataLoader) -> None:
    """Give ``loader`` a :class:`_Position`: its class becomes a subclass of its own whose
    iteration feeds the position, and whose ``state_dict`` is what Lightning saves for it."""
    own_class = type(loader)
    source = _OwnState(own_class, loader) if has_state(loader) else loader.dataset
    loader._cycler_position = _Position(source)
    loader.__class__ = _tracking_class(own_class)


class _OwnState:
    """A stateful loader's own ``state_dict``/``load_state_dict``, past the tracking class's."""

    def __init__(self, own_class: Any, loader: DataLoader) -> None:
        self.own_class, self.loader = own_class, loader

    def state_dict(self) -> Any:
        return self.own_class.state_dict(self.loader)

    def load_state_dict(self, state: Any) -> None:
        self.own_class.load_state_dict(self.loader, state)


_TRACKING_CLASSES: dict[type, type] = {}


def _tracking_class(loader_class: Any) -> type:
    """A subclass of ``loader_class`` (one per class) that adds nothing to the instance's
    layout, so that a loader's class can be swapped for it: every other method stays its own."""
    if loader_class in _TRACKING_CLASSES:
        return _TRACKING_CLASSES[loader_class]

    def iterate(loader: DataLoader) -> Iterator[Any]:
        position = _position(loader)
        assert position is not None
        return position.track(loader_class.__iter__(loader))

    def state_dict(loader: DataLoader) -> dict[str, Any]:
        """What Lightning saves for this loader: a mark (each rank's position is saved beside
        the checkpoint); a state at all tells Lightning the loader is resumable."""
        return {"version": LOADER_STATE_VERSION, "per_rank": True}

    def load_state_dict(loader: DataLoader, state: dict[str, Any]) -> None:
        """Lightning's restore: the position comes from this rank's own file instead."""

    _TRACKING_CLASSES[loader_class] = type(
        f"PositionTracked{loader_class.__name__}", (loader_class,),
        {"__slots__": (), "__iter__": iterate, "state_dict": state_dict,
         "load_state_dict": load_state_dict, "__module__": __name__})
    return _TRACKING_CLASSES[loader_class]


class _SkippingBatchSampler:
    """A batch sampler that leaves out the first batches of the epoch a resume continues, and
    reseeds its loader's generator with the epoch (the seed of the loader's iterator)."""

    def __init__(self, batches: Any, generator: torch.Generator, seed: int) -> None:
        self.batches, self.generator, self.seed = batches, generator, seed
        self.order = torch.Generator()
        """The shuffling sampler's generator, reseeded with the epoch: not the loader's, from
        which each iterator draws its workers' base seed when it is made. Lightning makes the
        iterator of a later epoch after ``set_epoch``, but a resumed epoch's before it (in
        ``setup_data``), so one shared generator gave a resume in a later epoch another order."""
        sampler: Any = getattr(batches, "sampler", None)
        if sampler is not None and isinstance(getattr(sampler, "generator", 0),
                                              torch.Generator | None):
            # A shuffling sampler draws every epoch's order from a generator of its own
            # (DataLoader(shuffle=True, generator=g)), which no checkpoint holds, or from a
            # seed drawn from torch's global generator when its iterator starts, which a
            # resume in the middle of the epoch has moved on: either way a resume in a later
            # epoch would not continue that epoch's order.
            sampler.generator = self.order
        self.epoch = 0
        self.resume_at: tuple[int, int] | None = None
        """(epoch, batches done in it) of a resume, until that epoch's iteration starts."""
        self.seed_epoch(0)

    def set_epoch(self, epoch: int) -> None:
        """Epoch ``epoch`` begins (the callback's ``on_train_epoch_start``): reseed, unless it
        is the epoch the generators are seeded for already (the first, or a resumed one, whose
        iterator Lightning made before this call and may not have drawn its order from yet)."""
        if epoch != self.epoch:
            self.seed_epoch(epoch)

    def seed_epoch(self, epoch: int) -> None:
        """Seed the generators for ``epoch`` and tell the inner samplers (a
        ``DistributedSampler`` shuffles by its epoch)."""
        self.epoch = epoch
        self.generator.manual_seed(self.seed * 1_000_003 + epoch)
        self.order.manual_seed((self.seed * 1_000_003 + epoch) ^ 0x5EED_0DE5)
        for inner in (self.batches, getattr(self.batches, "sampler", None)):
            set_epoch = getattr(inner, "set_epoch", None)
            if callable(set_epoch):
                set_epoch(epoch)

    def __iter__(self) -> Iterator[Any]:
        skip = self.resume_at[1] if self.resume_at and self.resume_at[0] == self.epoch else 0
        self.resume_at = None
        for index, batch in enumerate(self.batches):
            if index >= skip:
                yield batch

    def __len__(self) -> int:
        return len(self.batches)


class ResumableLoader(DataLoader):
    """The training loader, rebuilt around the same dataset, batches and workers, with a
    position Lightning saves and restores (``state_dict``/``load_state_dict``)."""

    batches_done = 0
    """Batches of the current epoch trained on (set by the callback after each batch)."""

    @classmethod
    def around(cls, loader: DataLoader, seed: int) -> ResumableLoader:
        generator = torch.Generator()
        skipping = _SkippingBatchSampler(loader.batch_sampler, generator, seed)
        rebuilt = cls(loader.dataset, batch_sampler=skipping, num_workers=loader.num_workers,
                      collate_fn=loader.collate_fn, pin_memory=loader.pin_memory,
                      timeout=loader.timeout, worker_init_fn=loader.worker_init_fn,
                      multiprocessing_context=loader.multiprocessing_context,
                      generator=generator, prefetch_factor=loader.prefetch_factor,
                      persistent_workers=loader.persistent_workers,
                      pin_memory_device=loader.pin_memory_device)
        return rebuilt

    def state_dict(self) -> dict[str, int]:
        skipping = self.batch_sampler
        assert isinstance(skipping, _SkippingBatchSampler)
        return {"version": LOADER_STATE_VERSION, "epoch": skipping.epoch,
                "batches_done": self.batches_done}

    def load_state_dict(self, state: dict[str, int]) -> None:
        skipping = self.batch_sampler
        assert isinstance(skipping, _SkippingBatchSampler)
        skipping.seed_epoch(state["epoch"])
        skipping.resume_at = (state["epoch"], state["batches_done"])
