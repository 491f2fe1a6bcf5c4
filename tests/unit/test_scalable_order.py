"""order="scalable": the keyed bijection tested like a random permutation, and the samplers on
top of it keeping every guarantee of the torch order (shares, padding, resume, re-split)."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from cycler.data.epoch_order import ORDERS
from cycler.data.permutation import MAX_PERMUTATION_LENGTH, FeistelPermutation
from cycler.data.samplers import InterruptableDistributedSampler, InterruptableSampler
from cycler.errors import ConfigError, StateMismatch

SETTINGS = settings(max_examples=60, deadline=None)
seeds = st.integers(0, 2**40)
# 1, 2, primes, powers of two and their neighbours (cycle-walking is longest just past a power).
EDGE_LENGTHS = [0, 1, 2, 3, 4, 5, 7, 8, 9, 31, 32, 33, 97, 127, 128, 129, 7919, 8192, 8193]
Z_REJECT = 4.0  # reject uniformity beyond 4 standard deviations: a true one passes ~1 in 30000


class OnlyLength:
    """A dataset that only reports its length, as an index over a huge corpus does."""

    def __init__(self, length: int) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length


def order_of(length: int, seed: int = 0, epoch: int = 0) -> list[int]:
    return FeistelPermutation(length, seed, epoch)(torch.arange(length)).tolist()


def ranks(n: int, world: int, **kwargs: Any) -> list[InterruptableDistributedSampler]:
    return [InterruptableDistributedSampler(OnlyLength(n), num_replicas=world, rank=rank,  # type: ignore[arg-type]
                                            order="scalable", **kwargs)
            for rank in range(world)]


def global_order(samplers: list[InterruptableDistributedSampler]) -> list[int]:
    """The ranks' shares interleaved back into the job's order: entry j*W + r is rank r's j-th."""
    shares = [list(sampler) for sampler in samplers]
    assert len({len(share) for share in shares}) <= 1
    return [index for row in zip(*shares, strict=True) for index in row]


def chi_square_limit(degrees: int) -> float:
    """The chi-square statistic Z_REJECT deviations above its mean (Wilson and Hilferty)."""
    spread = 2 / (9 * degrees)
    return degrees * (1 - spread + Z_REJECT * math.sqrt(spread)) ** 3


def pearson(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double() - a.double().mean(), b.double() - b.double().mean()
    return float((a * b).sum() / (a.norm() * b.norm()))


@pytest.mark.parametrize("length", EDGE_LENGTHS)
def test_the_permutation_is_a_bijection_for_edge_lengths(length: int) -> None:
    for seed in range(5):
        assert sorted(order_of(length, seed, epoch=seed)) == list(range(length))


@SETTINGS
@given(length=st.integers(0, 3000), seed=seeds, epoch=st.integers(0, 10**6))
def test_the_permutation_is_a_bijection_for_any_length_seed_and_epoch(
    length: int, seed: int, epoch: int
) -> None:
    assert sorted(order_of(length, seed, epoch)) == list(range(length))


@SETTINGS
@given(length=st.integers(1, 10**15), seed=seeds, data=st.data())
def test_one_position_alone_gives_what_the_block_gives(
    length: int, seed: int, data: st.DataObject
) -> None:
    permutation = FeistelPermutation(length, seed, 3)
    positions = data.draw(st.lists(st.integers(0, length - 1), min_size=1, max_size=40))
    block = permutation(torch.tensor(positions)).tolist()
    assert [permutation.index_at(position) for position in positions] == block
    assert all(0 <= index < length for index in block)


@pytest.mark.parametrize("length", [10**10, 10**10 + 7, 2**40 + 1, MAX_PERMUTATION_LENGTH])
def test_positions_of_a_huge_permutation_land_in_range_and_never_collide(length: int) -> None:
    positions = torch.cat([torch.arange(50_000), torch.randint(0, length, (50_000,),
                                                              generator=torch.Generator())])
    positions = positions.unique()
    indices = FeistelPermutation(length, 11, 2)(positions)
    assert int(indices.min()) >= 0 and int(indices.max()) < length
    assert indices.unique().numel() == positions.numel()


def test_lengths_beyond_the_supported_range_are_refused() -> None:
    with pytest.raises(ConfigError, match="between 0 and"):
        FeistelPermutation(MAX_PERMUTATION_LENGTH + 1, 0, 0)


@pytest.mark.parametrize(
    ("length", "bins", "draws", "varying"),
    [(5, 5, 8000, "seed"), (10, 10, 3000, "seed"), (33, 33, 2000, "epoch"),
     (1000, 8, 300, "seed")],
)
def test_every_sample_is_equally_likely_at_every_position(
    length: int, bins: int, draws: int, varying: str
) -> None:
    # Chi-square over the (sample, position bin) table of many keys; the keys are fixed, so the
    # test is deterministic. Four rounds at n = 5 and 10 fail it by far; 1000 is past the small
    # domains that get more rounds.
    counts = torch.zeros(length, bins)
    for key in range(draws):
        seed, epoch = (key, 0) if varying == "seed" else (0, key)
        permutation = FeistelPermutation(length, seed, epoch)
        # One at a time: for short orders, Python integers beat setting up tensor operations.
        order = torch.tensor([permutation.index_at(i) for i in range(length)])
        counts[order, torch.arange(length) * bins // length] += 1
    expected = draws / bins
    statistic = float(((counts - expected) ** 2 / expected).sum())
    assert statistic < chi_square_limit((length - 1) * (bins - 1))


@pytest.mark.parametrize("length", [10_000, 2**14 + 1])
def test_consecutive_epochs_orders_are_uncorrelated(length: int) -> None:
    limit = Z_REJECT / math.sqrt(length)  # a correlation's spread under independence
    orders = [torch.tensor(order_of(length, seed=5, epoch=epoch)) for epoch in range(8)]
    for before, after in zip(orders, orders[1:], strict=False):
        # Position of each sample in one epoch against its position in the next.
        assert abs(pearson(before.argsort(), after.argsort())) < limit
        assert abs(pearson(before, after)) < limit
        assert int((before == after).sum()) < 10  # a random pair of orders shares ~1 position


def test_neighbours_within_an_epoch_are_uncorrelated() -> None:
    order = torch.tensor(order_of(50_000, seed=1))
    assert abs(pearson(order[:-1], order[1:])) < Z_REJECT / math.sqrt(50_000)
    assert abs(pearson(order, torch.arange(50_000))) < Z_REJECT / math.sqrt(50_000)


@SETTINGS
@given(n=st.integers(0, 300), world=st.integers(1, 6), drop_last=st.booleans(), seed=seeds)
def test_rank_shares_follow_torchs_padding_and_drop_last_rules(
    n: int, world: int, drop_last: bool, seed: int
) -> None:
    job = global_order(ranks(n, world, drop_last=drop_last, seed=seed))
    if drop_last:
        assert len(job) == n // world * world
        assert len(set(job)) == len(job) and set(job) <= set(range(n))
    else:
        assert len(job) == -(-n // world) * world
        assert sorted(job[:n]) == list(range(n))
        # Torch pads by repeating the order from its start, as many times as needed.
        assert job[n:] == [job[i % n] for i in range(len(job) - n)] if n else job == []


def test_ranks_take_every_world_size_th_entry_of_the_permutation() -> None:
    samplers = ranks(1001, 4, seed=9)
    for sampler in samplers:
        sampler.set_epoch(2)
    assert global_order(samplers)[:1001] == order_of(1001, seed=9, epoch=2)


def test_without_shuffle_the_scalable_order_is_the_dataset_order() -> None:
    for rank, sampler in enumerate(ranks(23, 3, shuffle=False)):
        torch_order = InterruptableDistributedSampler(OnlyLength(23), 3, rank, shuffle=False)  # type: ignore[arg-type]
        assert list(sampler) == list(torch_order)


def test_each_epoch_has_its_own_scalable_order() -> None:
    sampler = ranks(50, 1)[0]
    orders = []
    for epoch in range(3):
        with sampler.in_epoch(epoch):
            orders.append(list(sampler))
    assert orders[0] != orders[1] != orders[2] != orders[0]


@SETTINGS
@given(n=st.integers(0, 300), world=st.integers(1, 5), drop_last=st.booleans(), seed=seeds,
       epoch=st.integers(0, 5), fraction=st.floats(0, 1))
def test_a_scalable_resume_after_k_items_yields_the_same_next_items_on_every_rank(
    n: int, world: int, drop_last: bool, seed: int, epoch: int, fraction: float
) -> None:
    running = ranks(n, world, drop_last=drop_last, seed=seed)
    for sampler in running:
        sampler.set_epoch(epoch)
    whole = [list(sampler) for sampler in running]
    k = math.floor(running[0].epoch_length * fraction)
    for sampler in running:
        sampler.advance(k)
    state = json.loads(json.dumps(running[0].state_dict()))
    resumed = ranks(n, world, drop_last=drop_last, seed=seed)
    for sampler in resumed:
        sampler.load_state_dict(state)
    assert [list(sampler) for sampler in resumed] == [share[k:] for share in whole]


@SETTINGS
@given(n=st.integers(0, 300), worlds=st.sampled_from([(2, 1), (1, 2), (3, 2), (2, 5)]),
       drop_last=st.booleans(), seed=seeds, fraction=st.floats(0, 1))
def test_a_scalable_world_size_change_splits_the_rest_of_the_same_order(
    n: int, worlds: tuple[int, int], drop_last: bool, seed: int, fraction: float
) -> None:
    old_world, new_world = worlds
    running = ranks(n, old_world, drop_last=drop_last, seed=seed)
    k = math.floor(running[0].epoch_length * fraction)
    before = [index for sampler in running for index in list(sampler)[:k]]
    for sampler in running:
        sampler.advance(k)
    state = running[0].state_dict()
    resumed = ranks(n, new_world, drop_last=drop_last, seed=seed)
    for sampler in resumed:
        sampler.load_state_dict(state)
    order = order_of(n, seed)
    if k < running[0].epoch_length:
        assert sorted(before) == sorted(order[: state["consumed"]])
    rest = order[state["consumed"]:]
    # The new job's order is the permutation's rest, split by torch's rule over the new ranks.
    assert global_order(resumed)[: len(rest)] == rest[: len(global_order(resumed))]
    assert len(global_order(resumed)) >= len(rest) - (new_world - 1)


def test_a_resplit_of_ten_billion_items_starts_at_the_consumed_position() -> None:
    length, consumed_per_rank = 10**10, 1_234_567_891
    running = ranks(length, 8, seed=3)[0]
    running.set_epoch(4)
    running.advance(consumed_per_rank)
    permutation = FeistelPermutation(length, 3, 4)
    for rank, sampler in enumerate(ranks(length, 3, seed=3)):
        sampler.load_state_dict(running.state_dict())
        first = [next(iter(sampler))]
        expected = 8 * consumed_per_rank + rank
        assert first == [permutation.index_at(expected)]
        assert sampler.remaining == -(-(length - 8 * consumed_per_rank) // 3)


def test_the_one_process_sampler_takes_the_scalable_order_and_resumes() -> None:
    running = InterruptableSampler(range(77), seed=2, order="scalable")
    running.set_epoch(1)
    whole = list(running)
    assert whole == order_of(77, seed=2, epoch=1)
    running.advance(30)
    resumed = InterruptableSampler(range(77), seed=2, order="scalable")
    resumed.load_state_dict(running.state_dict())
    assert list(resumed) == whole[30:]


@pytest.mark.parametrize(("saved", "built"), [("torch", "scalable"), ("scalable", "torch")])
def test_a_state_saved_with_another_order_is_refused_naming_both(saved: str, built: str) -> None:
    state = InterruptableSampler(range(20), order=saved).state_dict()
    with pytest.raises(StateMismatch, match=f"order='{saved}'.*order='{built}'"):
        InterruptableSampler(range(20), order=built).load_state_dict(state)


@pytest.mark.parametrize(("field", "other"), [("seed", {"seed": 1}), ("dataset_length", {})])
def test_a_scalable_state_of_another_seed_or_length_is_refused(
    field: str, other: dict[str, Any]
) -> None:
    state = ranks(20, 2)[0].state_dict()
    length = 20 if other else 21
    with pytest.raises(StateMismatch, match=f"{field}="):
        ranks(length, 2, **other)[0].load_state_dict(state)


def test_a_version_1_state_resumes_as_the_torch_order_and_is_refused_by_the_scalable_one() -> None:
    running = InterruptableSampler(range(40), seed=6)
    running.advance(11)
    old = {key: value for key, value in running.state_dict().items() if key != "order"}
    old["version"] = 1
    resumed = InterruptableSampler(range(40), seed=6)
    resumed.load_state_dict(old)
    assert list(resumed) == list(running)
    with pytest.raises(StateMismatch, match="order='torch'.*order='scalable'"):
        InterruptableSampler(range(40), seed=6, order="scalable").load_state_dict(old)


def test_an_unknown_order_is_refused_naming_the_known_ones() -> None:
    assert ORDERS == ("torch", "scalable")
    with pytest.raises(ConfigError, match="order='fast'.*'scalable'"):
        InterruptableDistributedSampler(OnlyLength(5), 1, 0, order="fast")  # type: ignore[arg-type]
