"""The coordinator's barrier (``Coordinator.wait_for_all``): every rank waits until all have
arrived, at a cost per rank that does not grow with the job, and a timeout names the ranks that
never came."""

from __future__ import annotations

import datetime
import threading

import pytest
from saver_fakes import FakeCoordinator, FakeStore, on_every_rank

from cycler.checkpoint.coordination import NAMED_BY_EVERY_RANK, missing_ranks
from cycler.errors import CoordinationTimeout

SHORT = datetime.timedelta(seconds=0.05)


def barrier(coordinator: FakeCoordinator) -> None:
    round_key = coordinator.new_round("commit")
    coordinator.arrive(round_key, "done")
    coordinator.wait_for_all(round_key)


def barrier_lookups(world_size: int) -> list[int]:
    """Per rank, the store keys its ``new_round``, ``arrive`` and ``wait_for_all`` named."""
    stores: list[FakeStore] = []

    def one_barrier(coordinator: FakeCoordinator) -> None:
        stores.append(coordinator._store)
        barrier(coordinator)

    assert [error for _, error in on_every_rank(world_size, one_barrier)] == \
        [None] * world_size
    return [stores[0].lookups[f"rank-{rank}"] for rank in range(world_size)]


def test_a_rank_s_store_lookups_at_the_barrier_do_not_grow_with_the_number_of_ranks() -> None:
    small, large = barrier_lookups(4), barrier_lookups(64)
    assert max(large) <= 5, large  # a round, its key, the count, the done key (last: its set)
    assert max(large) == max(small), (small, large)
    assert sum(large) <= 5 * 64, sum(large)


def test_every_rank_passes_the_barrier_only_after_the_last_rank_arrived() -> None:
    arrived: list[int] = []
    passed_after: list[int] = []
    others_in = threading.Condition()

    def last_comes_late(coordinator: FakeCoordinator) -> None:
        round_key = coordinator.new_round("commit")
        with others_in:
            if coordinator.rank == 2:  # only once the others are on their way in
                others_in.wait_for(lambda: len(arrived) == 2, 30)
            arrived.append(coordinator.rank)
            others_in.notify_all()
        coordinator.arrive(round_key, "done")
        coordinator.wait_for_all(round_key)
        passed_after.append(len(arrived))

    assert [error for _, error in on_every_rank(3, last_comes_late)] == [None] * 3
    assert passed_after == [3, 3, 3]


def test_a_barrier_a_rank_never_reaches_times_out_on_the_others_naming_that_rank() -> None:
    def rank_2_absent(coordinator: FakeCoordinator) -> None:
        coordinator.timeout = SHORT
        round_key = coordinator.new_round("commit")
        if coordinator.rank != 2:
            coordinator.arrive(round_key, "done")
            coordinator.wait_for_all(round_key)

    outcomes = on_every_rank(3, rank_2_absent)
    for rank in (0, 1):
        error = outcomes[rank][1]
        assert isinstance(error, CoordinationTimeout), outcomes
        assert f"rank {rank} waited 0.05 s for every rank to reach it at " \
               "cycler/saver/commit/1 (1 of 3 ranks missing: 2)" in str(error)
    assert outcomes[2] == (None, None)


def test_a_timed_out_barrier_whose_store_is_gone_says_so() -> None:
    class GoneStore(FakeStore):
        def check(self, keys: list[str]) -> bool:
            raise RuntimeError("Connection reset by peer")

    store = GoneStore()
    coordinator = FakeCoordinator(0, 2, store, timeout=SHORT)
    with pytest.raises(CoordinationTimeout, match=r"\(the store does not answer: Connection "
                                                  r"reset by peer\)"):
        barrier(coordinator)


def keys_left_after(barriers: int) -> list[str]:
    stores: list[FakeStore] = []

    def in_turn(coordinator: FakeCoordinator) -> None:
        stores.append(coordinator._store)
        for _ in range(barriers):
            barrier(coordinator)

    assert [error for _, error in on_every_rank(3, in_turn)] == [None] * 3
    return stores[0].keys()


def test_consecutive_barriers_leave_only_the_last_rounds_keys_in_the_store() -> None:
    """The store lives as long as the job: a round's keys (its count and done key too) go once
    every rank is past the next round."""
    assert len(keys_left_after(6)) == len(keys_left_after(2)), keys_left_after(6)


def test_the_missing_ranks_are_found_in_order_with_few_store_calls_and_at_most_the_limit() -> None:
    asked: list[list[int]] = []
    missing = {3, 700, 4095}

    def arrived(ranks: list[int]) -> bool:
        asked.append(ranks)
        return not missing.intersection(ranks)

    assert missing_ranks(arrived, 4096) == [3, 700, 4095]
    assert len(asked) <= 3 * 2 * 13, len(asked)  # O(m log W), not W = 4,096
    assert missing_ranks(lambda ranks: False, 4096, limit=17) == list(range(17))
    assert missing_ranks(lambda ranks: True, 4096) == []


def test_in_a_large_job_a_rank_other_than_0_leaves_naming_the_missing_ranks_to_rank_0() -> None:
    store = FakeStore()
    world = NAMED_BY_EVERY_RANK + 1
    round_key = "cycler/saver/commit/1"
    store.set(f"{round_key}/rank/0", "done")
    follower = FakeCoordinator(5, world, store, timeout=SHORT)
    follower.arrive(round_key, "done")
    with pytest.raises(CoordinationTimeout, match="rank 0's error names the ranks missing"):
        follower.wait_for_all(round_key)
    creator = FakeCoordinator(0, world, store, timeout=SHORT)
    with pytest.raises(CoordinationTimeout,
                       match=rf"more than 16 of {world} ranks missing: 1, 2, 3, 4, 6, 7, "):
        creator.wait_for_all(round_key)
