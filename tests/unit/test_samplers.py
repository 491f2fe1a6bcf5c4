"""Resumable samplers: torch equivalence, exact resume, world-size change, state checks."""

from __future__ import annotations

import io
import json
import math
from collections import Counter
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from cycler.data.samplers import (
    SAMPLER_STATE_VERSION,
    AdvancedTooFarError,
    InterruptableDistributedSampler,
    InterruptableSampler,
    InterruptibleDistributedSampler,
    InterruptibleSampler,
)
from cycler.errors import StateMismatch

SETTINGS = settings(max_examples=60, deadline=None)
sizes = st.integers(0, 200)
world_sizes = st.integers(1, 5)
seeds = st.integers(0, 2**32)


def dataset(n: int) -> TensorDataset:
    return TensorDataset(torch.arange(n))


def ranks(
    n: int, world: int, *, shuffle: bool = True, drop_last: bool = False, seed: int = 0
) -> list[InterruptableDistributedSampler]:
    """One sampler per rank of a job of ``world`` ranks over a dataset of ``n`` items."""
    return [
        InterruptableDistributedSampler(
            dataset(n), num_replicas=world, rank=rank, shuffle=shuffle, seed=seed,
            drop_last=drop_last,
        )
        for rank in range(world)
    ]


def consume(samplers: list[InterruptableDistributedSampler], k: int) -> list[int]:
    """Let every rank's training loop consume its next ``k`` items; return them all."""
    taken = []
    for sampler in samplers:
        taken += list(sampler)[:k]
        sampler.advance(k)
    return taken


def reloaded(state: dict[str, Any], world: int, **kwargs: Any) -> list[list[int]]:
    """What every rank of a fresh job of ``world`` ranks yields after loading ``state``."""
    fresh = ranks(state["dataset_length"], world, **kwargs)
    for sampler in fresh:
        sampler.load_state_dict(state)
    return [list(sampler) for sampler in fresh]


@SETTINGS
@given(n=sizes, world=world_sizes, shuffle=st.booleans(), drop_last=st.booleans(), seed=seeds)
def test_uninterrupted_epochs_yield_what_torch_distributed_sampler_yields(
    n: int, world: int, shuffle: bool, drop_last: bool, seed: int
) -> None:
    for rank, ours in enumerate(ranks(n, world, shuffle=shuffle, drop_last=drop_last, seed=seed)):
        theirs: DistributedSampler[int] = DistributedSampler(
            dataset(n), num_replicas=world, rank=rank, shuffle=shuffle, seed=seed,
            drop_last=drop_last,
        )
        for epoch in range(3):
            theirs.set_epoch(epoch)
            with ours.in_epoch(epoch):
                assert list(ours) == list(theirs)
                assert len(ours) == len(theirs) == ours.epoch_length
                ours.advance(len(ours))


def test_each_epoch_has_its_own_order() -> None:
    sampler = InterruptableDistributedSampler(dataset(50))
    orders = []
    for epoch in range(3):
        with sampler.in_epoch(epoch):
            orders.append(list(sampler))
    assert orders[0] != orders[1] != orders[2]


@SETTINGS
@given(
    n=sizes, world=world_sizes, shuffle=st.booleans(), drop_last=st.booleans(), seed=seeds,
    epoch=st.integers(0, 5), fraction=st.floats(0, 1),
)
def test_resume_after_k_items_yields_the_same_next_items_on_every_rank(
    n: int, world: int, shuffle: bool, drop_last: bool, seed: int, epoch: int, fraction: float
) -> None:
    config: dict[str, Any] = {"shuffle": shuffle, "drop_last": drop_last, "seed": seed}
    running = ranks(n, world, **config)
    for sampler in running:
        sampler.set_epoch(epoch)
    k = math.floor(running[0].epoch_length * fraction)
    consume(running, k)
    states = [sampler.state_dict() for sampler in running]
    assert all(state == states[0] for state in states)
    assert reloaded(states[0], world, **config) == [list(sampler) for sampler in running]


def test_resumed_run_goes_on_into_later_epochs_like_the_uninterrupted_one() -> None:
    running = ranks(37, 3, seed=5)
    consume(running, 4)
    state = running[0].state_dict()
    resumed = ranks(37, 3, seed=5)
    for old, new in zip(running, resumed, strict=True):
        new.load_state_dict(state)
        for epoch in range(0, 3):
            with old.in_epoch(epoch), new.in_epoch(epoch):
                assert list(new) == list(old)
                old.advance(old.remaining)
                new.advance(new.remaining)


def assert_epoch_covered_once(
    covered: list[int], n: int, old_world: int, new_world: int, drop_last: bool
) -> None:
    """Every item once, give or take the padding or truncation each split adds."""
    slack = (old_world - 1) + (new_world - 1)
    counts = Counter(covered)
    if drop_last:
        assert max(counts.values(), default=1) == 1
        assert set(counts) <= set(range(n))
        assert n - len(covered) <= slack
    else:
        assert set(counts) == set(range(n))
        assert len(covered) - n <= slack


@SETTINGS
@given(
    n=sizes, worlds=st.sampled_from([(2, 1), (1, 2), (3, 2), (2, 5), (5, 3)]),
    drop_last=st.booleans(), seed=seeds, fraction=st.floats(0, 1),
)
def test_changing_the_world_size_mid_epoch_covers_the_epoch_once(
    n: int, worlds: tuple[int, int], drop_last: bool, seed: int, fraction: float
) -> None:
    old_world, new_world = worlds
    running = ranks(n, old_world, drop_last=drop_last, seed=seed)
    before = consume(running, math.floor(running[0].epoch_length * fraction))
    after = reloaded(running[0].state_dict(), new_world, drop_last=drop_last, seed=seed)
    covered = before + [index for share in after for index in share]
    assert_epoch_covered_once(covered, n, old_world, new_world, drop_last)


def test_resuming_again_after_a_world_size_change_continues_the_new_split() -> None:
    first = ranks(40, 3, seed=1)
    consume(first, 5)
    second = ranks(40, 2, seed=1)
    for sampler in second:
        sampler.load_state_dict(first[0].state_dict())
    consume(second, 3)
    assert reloaded(second[0].state_dict(), 2, seed=1) == [list(sampler) for sampler in second]


def test_two_world_size_changes_in_one_epoch_still_cover_it_once() -> None:
    first = ranks(41, 3, seed=2)
    covered = consume(first, 4)
    second = ranks(41, 2, seed=2)
    for sampler in second:
        sampler.load_state_dict(first[0].state_dict())
    covered += consume(second, 5)
    covered += reloaded(second[0].state_dict(), 1, seed=2)[0]
    assert sorted(covered) == list(range(41))


@pytest.mark.parametrize(("n", "drop_last"), [(11, True), (10, False)])
def test_a_finished_epoch_yields_nothing_more_at_another_world_size(
    n: int, drop_last: bool
) -> None:
    running = ranks(n, 3, drop_last=drop_last)
    consume(running, running[0].epoch_length)
    assert running[0].state_dict()["consumed"] == n
    assert reloaded(running[0].state_dict(), 2, drop_last=drop_last) == [[], []]


def test_an_epoch_with_no_share_for_the_old_ranks_is_whole_for_the_new_ones() -> None:
    # 2 items over 3 ranks with drop_last: every old rank gets none, yet nothing was consumed.
    running = ranks(2, 3, drop_last=True, shuffle=False)
    assert running[0].state_dict()["consumed"] == 0
    assert reloaded(running[0].state_dict(), 1, drop_last=True, shuffle=False) == [[0, 1]]


@pytest.mark.parametrize(
    ("field", "saved", "built"),
    [
        ("seed", {"seed": 1}, {"seed": 2}),
        ("shuffle", {"shuffle": True}, {"shuffle": False}),
        ("drop_last", {"drop_last": False}, {"drop_last": True}),
    ],
)
def test_a_state_saved_with_other_settings_is_refused_naming_the_setting(
    field: str, saved: dict[str, Any], built: dict[str, Any]
) -> None:
    state = ranks(20, 2, **saved)[0].state_dict()
    with pytest.raises(StateMismatch, match=f"{field}={saved[field]!r}.*{field}={built[field]!r}"):
        ranks(20, 2, **built)[0].load_state_dict(state)


def test_a_state_saved_over_a_dataset_of_another_length_is_refused() -> None:
    state = ranks(20, 2)[0].state_dict()
    with pytest.raises(StateMismatch, match="dataset_length=20.*dataset_length=21"):
        ranks(21, 2)[0].load_state_dict(state)


@pytest.mark.parametrize("version", [0, SAMPLER_STATE_VERSION + 1, None])
def test_a_state_of_an_unknown_version_is_refused(version: int | None) -> None:
    state = ranks(20, 2)[0].state_dict()
    state["version"] = version
    with pytest.raises(StateMismatch, match=f"version={version!r}"):
        ranks(20, 2)[0].load_state_dict(state)


@pytest.mark.parametrize(
    ("field", "value"), [("progress", 11), ("progress", -1), ("epoch", "3"), ("consumed", 7)]
)
def test_a_damaged_position_is_refused_naming_the_field(field: str, value: Any) -> None:
    state = ranks(20, 2)[0].state_dict()
    state[field] = value
    with pytest.raises(StateMismatch, match=f"{field}="):
        ranks(20, 2)[0].load_state_dict(state)


def test_a_state_without_its_position_is_refused_naming_what_is_missing() -> None:
    state = ranks(20, 2)[0].state_dict()
    del state["resplit_at"]
    with pytest.raises(StateMismatch, match="lacks resplit_at"):
        ranks(20, 2)[0].load_state_dict(state)


def test_a_cycling_utils_state_resumes_with_this_samplers_settings() -> None:
    running = ranks(30, 2, seed=4)
    for sampler in running:
        sampler.set_epoch(2)
    consume(running, 6)
    fresh = ranks(30, 2, seed=4)
    for sampler in fresh:
        sampler.load_state_dict({"epoch": 2, "progress": 6})
    assert [list(sampler) for sampler in fresh] == [list(sampler) for sampler in running]


def test_len_is_the_whole_epoch_share_at_any_progress_and_remaining_what_is_left() -> None:
    sampler = ranks(100, 3)[1]
    assert len(sampler) == sampler.epoch_length == sampler.remaining == 34
    sampler.advance(10)
    assert (len(sampler), sampler.remaining, sampler.progress) == (34, 24, 10)
    resumed = ranks(100, 3)[1]
    resumed.load_state_dict(sampler.state_dict())
    assert (len(resumed), resumed.remaining, len(list(resumed))) == (34, 24, 24)
    assert len(DataLoader(dataset(100), batch_size=5, sampler=resumed)) == 7


def test_the_cycling_utils_last_batch_test_fires_once_on_the_last_batch_after_a_resume() -> None:
    batch_size = 5
    running = ranks(100, 3)[1]
    running.advance(2 * batch_size)
    resumed = ranks(100, 3)[1]
    resumed.load_state_dict(running.state_dict())
    loader = DataLoader(dataset(100), batch_size=batch_size, sampler=resumed)
    last = []
    for step, (batch,) in enumerate(loader):
        if resumed.progress // batch_size + 1 == len(loader):
            last.append(step)
        resumed.advance(len(batch))
    assert last == [len(loader) - 3]
    assert resumed.remaining == 0


def test_remaining_after_a_world_size_change_counts_this_ranks_part_of_the_rest() -> None:
    running = ranks(100, 2)
    consume(running, 20)
    resumed = ranks(100, 3)
    for sampler in resumed:
        sampler.load_state_dict(running[0].state_dict())
    assert [sampler.remaining for sampler in resumed] == [20, 20, 20]
    assert [len(list(sampler)) for sampler in resumed] == [20, 20, 20]
    assert [len(sampler) for sampler in resumed] == [34, 34, 34]


def test_iterating_does_not_change_progress() -> None:
    sampler = ranks(50, 2)[0]
    sampler.advance(3)
    list(sampler)
    list(DataLoader(dataset(50), batch_size=4, sampler=sampler))
    assert sampler.progress == 3


def test_in_epoch_resets_progress_on_normal_exit() -> None:
    sampler = ranks(50, 2)[0]
    with sampler.in_epoch(4):
        sampler.advance(7)
    assert (sampler.epoch, sampler.progress, len(sampler)) == (4, 0, 25)


def test_in_epoch_keeps_progress_when_the_body_raises() -> None:
    sampler = ranks(50, 2)[0]
    with pytest.raises(KeyboardInterrupt), sampler.in_epoch(4):
        sampler.advance(7)
        raise KeyboardInterrupt
    assert sampler.state_dict()["epoch"] == 4
    assert sampler.state_dict()["progress"] == 7


def test_setting_the_same_epoch_keeps_progress_and_another_epoch_restarts_it() -> None:
    sampler = ranks(50, 2)[0]
    sampler.set_epoch(3)
    sampler.advance(7)
    sampler.set_epoch(3)
    assert sampler.progress == 7
    sampler.set_epoch(4)
    assert sampler.progress == 0


@pytest.mark.parametrize("n", [-1, 26])
def test_advancing_outside_the_rest_of_the_epoch_raises(n: int) -> None:
    sampler = ranks(50, 2)[0]
    with pytest.raises(AdvancedTooFarError, match="25 samples remain"):
        sampler.advance(n)
    assert sampler.progress == 0


def test_state_round_trips_through_torch_save_and_json() -> None:
    running = ranks(50, 2, seed=9)
    consume(running, 8)
    state = running[0].state_dict()
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    for loaded in (torch.load(buffer), json.loads(json.dumps(state))):
        assert loaded == state
        assert reloaded(loaded, 2, seed=9) == [list(sampler) for sampler in running]


def test_without_a_process_group_the_distributed_sampler_is_one_process() -> None:
    sampler = InterruptableDistributedSampler(dataset(10), shuffle=False)
    assert (sampler.num_replicas, sampler.rank) == (1, 0)
    assert list(sampler) == list(range(10))


@SETTINGS
@given(n=sizes, shuffle=st.booleans(), seed=seeds, epoch=st.integers(0, 5))
def test_one_process_sampler_yields_the_seeded_permutation_of_each_epoch(
    n: int, shuffle: bool, seed: int, epoch: int
) -> None:
    sampler = InterruptableSampler(range(n), shuffle=shuffle, seed=seed)
    sampler.set_epoch(epoch)
    if shuffle:
        expected = torch.randperm(n, generator=torch.Generator().manual_seed(seed + epoch))
        assert list(sampler) == expected.tolist()
    else:
        assert list(sampler) == list(range(n))
    assert len(sampler) == sampler.epoch_length == n


@SETTINGS
@given(n=sizes, seed=seeds, epoch=st.integers(0, 5), fraction=st.floats(0, 1))
def test_one_process_sampler_resumes_with_the_same_next_items(
    n: int, seed: int, epoch: int, fraction: float
) -> None:
    running = InterruptableSampler(range(n), seed=seed)
    running.set_epoch(epoch)
    whole_epoch = list(running)
    k = math.floor(n * fraction)
    running.advance(k)
    fresh = InterruptableSampler(range(n), seed=seed)
    fresh.load_state_dict(json.loads(json.dumps(running.state_dict())))
    assert list(fresh) == whole_epoch[k:]


def test_one_process_sampler_refuses_a_state_with_another_seed() -> None:
    state = InterruptableSampler(range(10), seed=1).state_dict()
    with pytest.raises(StateMismatch, match="seed=1.*seed=2"):
        InterruptableSampler(range(10), seed=2).load_state_dict(state)


def test_the_interruptible_spellings_name_the_same_classes() -> None:
    assert InterruptibleSampler is InterruptableSampler
    assert InterruptibleDistributedSampler is InterruptableDistributedSampler
    assert issubclass(InterruptableDistributedSampler, DistributedSampler)


@pytest.mark.parametrize(("seed", "epoch"), [(0, 2**64), (2**64 - 3, 5), (0, 2**70 + 1),
                                             (-(2**63), 2**64)])
def test_an_epoch_past_the_generators_64_bit_seed_still_yields_and_resumes(
        seed: int, epoch: int) -> None:
    # torch's generator takes seeds in [-2**63, 2**64): seed + epoch outside it raised in iter().
    samplers = ranks(20, 2, seed=seed)
    for sampler in samplers:
        sampler.set_epoch(epoch)
    taken = consume(samplers, 3)
    state = samplers[0].state_dict()
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    again = reloaded(torch.load(buffer, weights_only=True), 2, seed=seed)
    remaining = [list(sampler) for sampler in samplers]
    assert again == remaining and sorted(taken + sum(again, [])) == list(range(20))


@SETTINGS
@given(seed=st.integers(-(2**63), 2**64 - 1 - 10), epoch=st.integers(0, 10))
def test_within_torchs_seed_range_the_order_is_torchs_own(seed: int, epoch: int) -> None:
    ours = InterruptableDistributedSampler(dataset(30), num_replicas=1, rank=0, seed=seed)
    theirs = DistributedSampler(dataset(30), num_replicas=1, rank=0, seed=seed)
    ours.set_epoch(epoch)
    theirs.set_epoch(epoch)
    assert list(ours) == list(theirs)


@pytest.mark.parametrize("epoch", [-1, 1.5, "3"])
def test_an_epoch_no_checkpoint_could_resume_is_refused_at_set_epoch(epoch: Any) -> None:
    (sampler,) = ranks(10, 1)
    with pytest.raises(ValueError, match="the epoch must be an integer of at least 0"):
        sampler.set_epoch(epoch)


def test_numpy_and_torch_integers_are_epochs_as_under_torch() -> None:
    (sampler,) = ranks(10, 1)
    sampler.set_epoch(torch.tensor(3))
    assert sampler.epoch == 3 and type(sampler.epoch) is int
