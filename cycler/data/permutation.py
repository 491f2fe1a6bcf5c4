"""A keyed pseudorandom permutation of ``[0, n)`` that costs O(1) memory, for any ``n``.

``FeistelPermutation(n, seed, epoch)`` maps each position of an epoch's order to the dataset
index found there. It never builds the order: any position is computed on its own, so the first
index of an epoch, or of a resumed epoch, costs the same at ``n = 10`` as at ``n = 10**10``.

How: a Feistel network over the ``k``-bit integers, ``2**(k-1) < n <= 2**k``, is a bijection
of ``[0, 2**k)`` whatever its round function. Cycle-walking (apply the network again until the
value falls inside ``[0, n)``) restricts it to a bijection of ``[0, n)``; since ``2**k < 2n``,
it takes fewer than two applications per position on average. The halves of the ``k`` bits
are as even as ``k`` allows (they swap sides every round), so ``k`` needs no rounding up and
the walk stays short. The round keys come from a cryptographic hash of ``(seed, epoch)``: two
epochs, or two seeds, give unrelated orders.

Everything runs on int64 tensors of positions, a whole block per operation. The round function
keeps every product below ``2**63`` (32-bit operands, multipliers below ``2**31``): int64
overflow would be undefined behaviour in torch's kernels, and the order must be the same on
every machine.
"""

from __future__ import annotations

import hashlib

import torch

from cycler.errors import ConfigError

__all__ = ["MAX_PERMUTATION_LENGTH", "FeistelPermutation"]

MAX_PERMUTATION_LENGTH = 2**62
"""Largest ``n``: each half of the network then fits 31 bits, and its products int64."""

ROUNDS = 6
"""Rounds of the network over more than ``SMALL_DOMAIN_BITS`` bits. Luby and Rackoff's four
left a bias in where samples land that a chi-square over many seeds shows at small n (far
beyond chance at n = 5 and 10, 3 deviations at n = 40); six is the margin kept for large n."""

SMALL_DOMAIN_ROUNDS = 12
"""Rounds over at most ``SMALL_DOMAIN_BITS`` bits: with halves of a few bits each round can only
pick among few functions, and six rounds still favoured some positions at n = 5 and n = 10.
Twelve rounds cost nothing there (the whole epoch is at most 256 samples)."""

SMALL_DOMAIN_BITS = 8

_MULTIPLIERS = (0x7FEB352D, 0x6C8E9CF5)  # odd, below 2**31: a 32-bit value times one fits int64
_SHIFTS = (16, 15)
_WORD = 0xFFFFFFFF
_KEY_DOMAIN = b"cycler-order"  # another use of blake2b on the same (seed, epoch) differs


def round_keys(seed: int, epoch: int, rounds: int) -> tuple[int, ...]:
    """The 32-bit key of each of ``rounds`` (at most 16) rounds, from ``(seed, epoch)`` alone."""
    digest = hashlib.blake2b(
        f"{seed}/{epoch}".encode(), digest_size=4 * rounds, person=_KEY_DOMAIN
    ).digest()
    return tuple(int.from_bytes(digest[4 * i : 4 * i + 4], "little") for i in range(rounds))


class FeistelPermutation:
    """A bijection of ``[0, length)`` keyed by ``(seed, epoch)``; see the module docstring.

    ``permutation(positions)`` gives the index at each position (an int64 tensor of positions
    in ``[0, length)``, of any shape); ``permutation.index_at(position)`` gives one.
    """

    def __init__(self, length: int, seed: int, epoch: int) -> None:
        if not 0 <= length <= MAX_PERMUTATION_LENGTH:
            raise ConfigError(
                f"A permutation of {length} items is not supported: length must be between 0 "
                f"and {MAX_PERMUTATION_LENGTH}."
            )
        self.length = length
        self._bits = max(1, (length - 1).bit_length())
        rounds = SMALL_DOMAIN_ROUNDS if self._bits <= SMALL_DOMAIN_BITS else ROUNDS
        self._keys = round_keys(seed, epoch, rounds)

    def __call__(self, positions: torch.Tensor) -> torch.Tensor:
        indices = self._network(positions)
        # Cycle-walking, on the still-outside subset only: it halves (at least) every pass.
        walking = (indices >= self.length).nonzero().squeeze(1)
        while walking.numel():
            stepped = self._network(indices[walking])
            indices[walking] = stepped
            walking = walking[stepped >= self.length]
        return indices

    def index_at(self, position: int) -> int:
        """The index at one position, with Python integers: no tensor set-up for one value."""
        if not 0 <= position < self.length:
            raise IndexError(f"position {position} is outside [0, {self.length})")
        index = self._scalar_network(position)
        while index >= self.length:
            index = self._scalar_network(index)
        return index

    def _network(self, values: torch.Tensor) -> torch.Tensor:
        state = values.to(torch.int64, copy=True)
        right, mixed, scratch = (torch.empty_like(state) for _ in range(3))
        left_bits, right_bits = self._bits // 2, self._bits - self._bits // 2
        for key in self._keys:
            torch.bitwise_and(state, (1 << right_bits) - 1, out=right)
            state >>= right_bits  # the left half
            _round_function(right, key, left_bits, mixed, scratch)
            state ^= mixed
            right <<= left_bits  # the right half becomes the left: (R, L ^ F(R))
            state |= right
            left_bits, right_bits = right_bits, left_bits
        return state

    def _scalar_network(self, value: int) -> int:
        left_bits, right_bits = self._bits // 2, self._bits - self._bits // 2
        for key in self._keys:
            right, left = value & ((1 << right_bits) - 1), value >> right_bits
            value = (right << left_bits) | (left ^ _scalar_round_function(right, key, left_bits))
            left_bits, right_bits = right_bits, left_bits
        return value


def _round_function(
    right: torch.Tensor, key: int, bits: int, out: torch.Tensor, scratch: torch.Tensor
) -> None:
    """``out = F(right)``: a 32-bit integer hash of ``right ^ key``, cut to ``bits`` bits."""
    torch.bitwise_xor(right, key, out=out)
    for multiplier, shift in zip(_MULTIPLIERS, _SHIFTS, strict=True):
        out.mul_(multiplier).bitwise_and_(_WORD)
        torch.bitwise_right_shift(out, shift, out=scratch)
        out ^= scratch
    out &= (1 << bits) - 1


def _scalar_round_function(right: int, key: int, bits: int) -> int:
    """:func:`_round_function` on one Python integer, bit for bit."""
    mixed = right ^ key
    for multiplier, shift in zip(_MULTIPLIERS, _SHIFTS, strict=True):
        mixed = (mixed * multiplier) & _WORD
        mixed ^= mixed >> shift
    return mixed & ((1 << bits) - 1)
