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
    if isinstance(loader, ResumableLoader) or isinstance(loader, _TracksPosition):
        return loader
    if not isinstance(loader.dataset, IterableDataset):
        return ResumableLoader.around(loader, seed)
    tracked = _TracksPosition.around(loader)
    if resumed_from is not None and (resumed_from / loader_file(rank)).exists():
        tracked.load_position(resumed_from / loader_file(rank))
    return loader


def save_position(loader: DataLoader | None, directory: Path, rank: int) -> None:
    """Every rank: its iterable-style loader's state after the last batch trained, beside the
    checkpoint (nothing for a map-style loader: Lightning's own save holds its position)."""
    if isinstance(loader, _TracksPosition):
        atomic_torch_save(loader.position(), directory / loader_file(rank))


def note_trained(loader: DataLoader | None, batches_in_epoch: int) -> None:
    """After each training batch: ``batches_in_epoch`` batches of this epoch are trained."""
    if isinstance(loader, ResumableLoader):
        loader.batches_done = batches_in_epoch
    elif isinstance(loader, _TracksPosition):
        loader.note_trained()


class _TracksPosition:
    """Mixed into the class of an iterable-style training loader: keeps the state of its
    ``source`` (the loader or its dataset) after each batch it yields, so that the state after
    the last batch *trained* can be saved while Lightning's fetcher holds the next one."""

    _cycler_source: Any
    """What holds the position: the loader (its own class's methods) or its dataset."""
    _cycler_states: dict[int, Any]
    _cycler_trained: int
    _cycler_end: Any

    @classmethod
    def around(cls, loader: DataLoader) -> _TracksPosition:
        stateful = has_state(loader)
        loader.__class__ = _tracking_class(type(loader))
        assert isinstance(loader, _TracksPosition)
        loader._cycler_source = super(_TracksPosition, loader) if stateful else loader.dataset
        loader._cycler_states, loader._cycler_trained, loader._cycler_end = {}, 0, None
        return loader

    def __iter__(self) -> Iterator[Any]:
        self._cycler_states, self._cycler_trained, self._cycler_end = {}, 0, None
        yielded = 0
        for batch in super().__iter__():  # type: ignore[misc]
            self._cycler_states[yielded] = copy.deepcopy(self._cycler_source.state_dict())
            yielded += 1
            yield batch
        self._cycler_end = (yielded, copy.deepcopy(self._cycler_source.state_dict()))

    def note_trained(self) -> None:
        self._cycler_trained += 1
        self._cycler_states.pop(self._cycler_trained - 2, None)

    def position(self) -> dict[str, Any]:
        """The source's state after the last batch trained (at the end of the stream: its
        state once the stream ended, which is where an uninterrupted run starts its next
        epoch from)."""
        end = self._cycler_end
        if end is not None and end[0] == self._cycler_trained:
            state = end[1]
        elif self._cycler_trained == 0:
            state = copy.deepcopy(self._cycler_source.state_dict())
        else:
            state = self._cycler_states[self._cycler_trained - 1]
        return {"version": LOADER_STATE_VERSION, "state": state}

    def load_position(self, path: Path) -> None:
        saved = torch.load(path, weights_only=True)
        self._cycler_source.load_state_dict(saved["state"])

    def state_dict(self) -> dict[str, Any]:
        """What Lightning saves for this loader: nothing (each rank's own position is saved
        beside the checkpoint); being stateful tells Lightning the loader is resumable."""
        return {"version": LOADER_STATE_VERSION, "per_rank": True}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Lightning's restore: the position is loaded from this rank's own file instead."""


_TRACKING_CLASSES: dict[type, type] = {}


def _tracking_class(loader_class: type) -> type:
    """The loader's class with :class:`_TracksPosition` first: every other method, and the
    loader's ``isinstance``, stay its own (one class per loader class)."""
    if loader_class not in _TRACKING_CLASSES:
        _TRACKING_CLASSES[loader_class] = type(f"PositionTracked{loader_class.__name__}",
                                               (_TracksPosition, loader_class), {})
    return _TRACKING_CLASSES[loader_class]


class _SkippingBatchSampler:
    """A batch sampler that leaves out the first batches of the epoch a resume continues, and
    reseeds its loader's generator with the epoch (the seed of the loader's iterator)."""

    def __init__(self, batches: Any, generator: torch.Generator, seed: int) -> None:
        self.batches, self.generator, self.seed = batches, generator, seed
        self.epoch = 0
        self.resume_at: tuple[int, int] | None = None
        """(epoch, batches done in it) of a resume, until that epoch's iteration starts."""
        self.set_epoch(0)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        self.generator.manual_seed(self.seed * 1_000_003 + epoch)
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
        skipping.set_epoch(state["epoch"])
        skipping.resume_at = (state["epoch"], state["batches_done"])
