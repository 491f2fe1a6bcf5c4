"""Which dataset index sits at each position of an epoch, and which positions are a rank's.

The samplers see an epoch as a *base order*: a sequence of the ``n`` dataset indices, read by
position. Two orders exist (the samplers' ``order=`` argument):

- ``"torch"``: ``torch.randperm(n)`` drawn from a generator seeded with ``seed + epoch``, or
  ``range(n)`` without shuffle, exactly as ``DistributedSampler`` draws it. It is built whole:
  O(n) time and memory per epoch and per resume.
- ``"scalable"``: a :class:`cycler.data.permutation.FeistelPermutation` keyed by ``(seed, epoch)``,
  or the identity without shuffle. Nothing is built: each position is computed when iterated,
  in blocks, so memory and the first index cost O(1) in ``n``.

A rank's share is a set of *positions* (arithmetic on ints, whatever the order), mapped to
indices block by block when iterated: see :func:`share_positions`.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Iterator
from typing import Any, Protocol

import torch

from cycler.data.permutation import FeistelPermutation
from cycler.errors import ConfigError

__all__ = ["ORDERS", "EpochOrder", "checked_epoch", "epoch_order", "iterate_share",
           "share_positions"]

ORDERS = ("torch", "scalable")
"""The values of the samplers' ``order=`` argument."""

_FIRST_BLOCKS = (16, 1024, 8192)
_BLOCK = 65536  # large enough that per-operation overhead is small, small enough to stay in cache
_SCALAR_LIMIT = 16  # up to this many positions, Python integers beat setting up tensor operations


class EpochOrder(Protocol):
    """The base order of one epoch, read by position."""

    def indices_at(self, positions: torch.Tensor) -> torch.Tensor:
        """The dataset index at each of ``positions`` (an int64 tensor, values in ``[0, n)``)."""
        ...


class _Materialised:
    """An order held as one tensor of all ``n`` indices (the ``"torch"`` order)."""

    def __init__(self, indices: torch.Tensor) -> None:
        self._indices = indices

    def indices_at(self, positions: torch.Tensor) -> torch.Tensor:
        return self._indices[positions]


class _Identity:
    """Position ``i`` holds index ``i`` (the ``"scalable"`` order without shuffle)."""

    def indices_at(self, positions: torch.Tensor) -> torch.Tensor:
        return positions


class _Keyed:
    """Position ``i`` holds ``permutation(i)`` (the ``"scalable"`` order with shuffle)."""

    def __init__(self, permutation: FeistelPermutation) -> None:
        self._permutation = permutation

    def indices_at(self, positions: torch.Tensor) -> torch.Tensor:
        if positions.numel() <= _SCALAR_LIMIT:
            at = self._permutation.index_at
            return torch.tensor([at(p) for p in positions.tolist()], dtype=torch.int64)
        return self._permutation(positions)


def check_order(order: str) -> None:
    """Raise ConfigError unless ``order`` names one of :data:`ORDERS`."""
    if order not in ORDERS:
        raise ConfigError(
            f"order={order!r} is not an order the samplers know: pass order='torch' (the "
            "default, as DistributedSampler) or order='scalable' (O(1) memory at any size)."
        )


def epoch_order(order: str, length: int, seed: int, epoch: int, shuffle: bool) -> EpochOrder:
    """The base order of ``epoch`` (module docstring); ``order`` is one of :data:`ORDERS`."""
    check_order(order)
    if order == "scalable":
        return _Keyed(FeistelPermutation(length, seed, epoch)) if shuffle else _Identity()
    if not shuffle:
        return _Materialised(torch.arange(length))
    generator = torch.Generator()
    # torch takes seeds in [-2**63, 2**64) and wraps them to 64 bits: the same, for every sum.
    generator.manual_seed((seed + epoch) % 2**64)
    return _Materialised(torch.randperm(length, generator=generator))


def checked_epoch(epoch: Any) -> int:
    """``epoch`` as an ``int`` (numpy's and torch's integers too); a negative one, which no
    checkpoint could resume, is refused."""
    try:
        number = operator.index(epoch)
    except TypeError:
        number = -1
    if number < 0:
        raise ValueError(f"set_epoch({epoch!r}): the epoch must be an integer of at least 0")
    return number


def per_rank_length(remaining: int, world_size: int, drop_last: bool) -> int:
    """How many of ``remaining`` samples each of ``world_size`` ranks yields, by torch's rule."""
    if drop_last:
        return remaining // world_size
    return -(-remaining // world_size)


def share_positions(
    length: int, resplit_at: int, world_size: int, rank: int, drop_last: bool, skip: int
) -> range:
    """Positions of rank ``rank``'s entries when the base order's positions ``resplit_at..``
    are split over ``world_size`` ranks, minus the rank's first ``skip``.

    Torch's rule over that rest: padded cyclically (or, with ``drop_last``, truncated) to a
    multiple of the world size, rank ``r`` taking entries ``r, r + W, ...``. A returned position
    at or past ``length`` is padding: it stands for :func:`wrapped` of it.
    """
    total = per_rank_length(length - resplit_at, world_size, drop_last) * world_size
    return range(resplit_at + rank + skip * world_size, resplit_at + total, world_size)


def iterate_share(
    order: EpochOrder, positions: range, length: int, resplit_at: int
) -> Iterator[int]:
    """The indices at ``positions`` (from :func:`share_positions`), computed a block at a time:
    small blocks first, so the first index comes at once, then blocks of a fixed size."""
    blocks = (_tensor_block(positions[start:stop], length, resplit_at)
              for start, stop in _block_bounds(len(positions)))
    return itertools.chain.from_iterable(order.indices_at(block).tolist() for block in blocks)


def rank_share(
    order: EpochOrder, length: int, world_size: int, rank: int, drop_last: bool
) -> list[int]:
    """Rank ``rank``'s whole share of a fresh epoch, as a list."""
    positions = share_positions(length, 0, world_size, rank, drop_last, 0)
    return list(iterate_share(order, positions, length, 0))


def wrapped(positions: torch.Tensor, length: int, resplit_at: int) -> torch.Tensor:
    """Padding positions mapped back into ``[resplit_at, length)``: torch pads by repeating the
    order (here, its rest from ``resplit_at``) from its start, as often as needed."""
    return resplit_at + (positions - resplit_at) % (length - resplit_at)


def _tensor_block(positions: range, length: int, resplit_at: int) -> torch.Tensor:
    block = torch.arange(positions.start, positions.stop, positions.step, dtype=torch.int64)
    if positions[-1] >= length:
        # Only the last block of a share holds padding: at most a few positions.
        block = torch.where(block >= length, wrapped(block, length, resplit_at), block)
    return block


def _block_bounds(count: int) -> Iterator[tuple[int, int]]:
    sizes = itertools.chain(_FIRST_BLOCKS, itertools.repeat(_BLOCK))
    start = 0
    for size in sizes:
        if start >= count:
            return
        yield start, min(start + size, count)
        start += size
