"""A resumable distributed batch sampler whose batches hold samples of one group each.

cycling_utils' ``InterruptableDistributedGroupedBatchSampler``, for the torchvision detection
recipe's habit of batching images of similar aspect ratio: ``group_ids[i]`` is sample ``i``'s
group. Each rank takes its share of the epoch's order exactly as
:class:`cycler.InterruptableDistributedSampler` does, then walks it, filling one buffer per
group and emitting a buffer as a batch when it holds ``batch_size`` samples. The epoch has
``ceil(share / batch_size)`` batches; when the walk ends short of that, the fullest leftover
buffers are topped up with earlier samples of their own group (cycled) until the count is
reached. Progress counts batches, as in cycling_utils: ``advance()`` records one.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from torch.utils.data import Dataset, DistributedSampler

from cycler.data.epoch_order import checked_epoch, epoch_order, per_rank_length, rank_share
from cycler.data.samplers import AdvancedTooFarError, _default_world, checked_mapping
from cycler.errors import StateMismatch

GROUPED_STATE_VERSION = 1


def grouped_batches(indices: Sequence[int], group_ids: Sequence[int],
                    batch_size: int) -> list[list[int]]:
    """``indices`` cut into ``ceil(len / batch_size)`` batches of one group each (module doc)."""
    buffers: dict[int, list[int]] = {}
    seen: dict[int, list[int]] = {}
    batches: list[list[int]] = []
    for index in indices:
        group = group_ids[index]
        buffers.setdefault(group, []).append(index)
        seen.setdefault(group, []).append(index)
        if len(buffers[group]) == batch_size:
            batches.append(buffers.pop(group))
    wanted = math.ceil(len(indices) / batch_size)
    leftovers = sorted(buffers.items(), key=lambda item: len(item[1]), reverse=True)
    for group, buffer in leftovers[: wanted - len(batches)]:
        missing = batch_size - len(buffer)
        batches.append(buffer + list(itertools.islice(itertools.cycle(seen[group]), missing)))
    return batches


class InterruptableDistributedGroupedBatchSampler(DistributedSampler[list[int]]):
    """Yields this rank's batches (lists of indices) of one group each; resumable mid-epoch.

    Same arguments and API as cycling_utils: ``len()`` is the epoch's batch count
    (``num_batches``), ``progress`` counts consumed batches, ``advance()`` adds one (or
    ``advance(n)`` adds n), ``state_dict``/``load_state_dict``, ``in_epoch(epoch)``.
    ``set_epoch`` works too (cycling_utils raised ``NotImplementedError`` there).
    The state carries the seed, batch size, world size and dataset length; resuming with any
    of them changed is a :class:`cycler.StateMismatch` (batches are not re-split).
    """

    def __init__(self, dataset: Dataset[Any], group_ids: Sequence[int], batch_size: int,
                 num_replicas: int | None = None, rank: int | None = None,
                 shuffle: bool = True, seed: int = 0, drop_last: bool = False) -> None:
        num_replicas, rank = _default_world(num_replicas, rank)
        DistributedSampler.__init__(self, dataset, num_replicas, rank, shuffle, seed, drop_last)
        self._dataset_length = len(dataset)  # type: ignore[arg-type]
        if len(group_ids) != self._dataset_length:
            raise ValueError(f"group_ids has {len(group_ids)} entries but the dataset has "
                             f"{self._dataset_length} samples: give one group id per sample")
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, not {batch_size}")
        self.group_ids = list(group_ids)
        self.batch_size = batch_size
        self.progress = 0
        self._batches: list[list[int]] | None = None

    @property
    def num_batches(self) -> int:
        """Batches this rank yields in a whole epoch."""
        share = per_rank_length(self._dataset_length, self.num_replicas, self.drop_last)
        return math.ceil(share / self.batch_size)

    @property
    def batches(self) -> list[list[int]]:
        """The epoch's batches on this rank, made on first use after the epoch was set."""
        if self._batches is None:
            length = self._dataset_length
            order = epoch_order("torch", length, self.seed, self.epoch, self.shuffle)
            share = rank_share(order, length, self.num_replicas, self.rank, self.drop_last)
            self._batches = grouped_batches(share, self.group_ids, self.batch_size)
        return self._batches

    @property
    def remaining(self) -> int:
        """Batches ``iter(self)`` yields if started now."""
        return self.num_batches - self.progress

    def __len__(self) -> int:
        return self.num_batches

    def __iter__(self) -> Iterator[list[int]]:
        return iter(self.batches[self.progress :])

    def advance(self, n: int = 1) -> None:
        """Record that the training loop consumed ``n`` more batches (default one)."""
        if not 0 <= n <= self.remaining:
            raise AdvancedTooFarError(
                f"advance({n}) does not fit: {self.remaining} batches remain in this rank's "
                "epoch; call advance() once per batch, and reset_progress() or in_epoch() "
                "between epochs."
            )
        self.progress += n

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch; another epoch restarts progress at 0, the same one keeps it. A
        negative epoch is refused: a checkpoint holding it could not be resumed."""
        epoch = checked_epoch(epoch)
        if epoch != self.epoch:
            self.reset_progress()
            self._batches = None
        self.epoch = epoch

    def reset_progress(self) -> None:
        self.progress = 0

    @contextmanager
    def in_epoch(self, epoch: int) -> Iterator[None]:
        """Run the body in ``epoch``; a normal exit resets progress for the next epoch."""
        self.set_epoch(epoch)
        yield
        self.reset_progress()

    def state_dict(self) -> dict[str, Any]:
        return {"version": GROUPED_STATE_VERSION, "epoch": self.epoch, "progress": self.progress,
                **self._identity()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state`` (also a cycling_utils ``{"epoch", "progress"}`` state)."""
        state = checked_mapping(state, "grouped batch sampler")
        if "version" not in state and set(state) == {"epoch", "progress"}:
            state = {**state, "version": GROUPED_STATE_VERSION, **self._identity()}
        for field, value in {"version": GROUPED_STATE_VERSION, **self._identity()}.items():
            if state.get(field) != value:
                raise StateMismatch(
                    f"Saved grouped batch sampler state has {field}={state.get(field)!r} but "
                    f"this sampler has {field}={value!r}: build it as the saved run did to "
                    "resume that run, or do not load the state to start afresh."
                )
        epoch, progress = state.get("epoch"), state.get("progress")
        if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 0:
            raise StateMismatch(f"Saved grouped batch sampler state has epoch={epoch!r}, not an "
                                "epoch number: the state is damaged.")
        self.set_epoch(epoch)
        if (not isinstance(progress, int) or isinstance(progress, bool)
                or not 0 <= progress <= self.num_batches):
            raise StateMismatch(f"Saved grouped batch sampler state has progress={progress!r}, "
                                f"outside 0..{self.num_batches}: the state is damaged.")
        self.progress = progress

    def _identity(self) -> dict[str, Any]:
        return {"dataset_length": self._dataset_length, "seed": self.seed,
                "shuffle": self.shuffle, "drop_last": self.drop_last,
                "num_replicas": self.num_replicas, "batch_size": self.batch_size}
