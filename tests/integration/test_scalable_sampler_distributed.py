"""order="scalable" with 2 real gloo processes behind a DataLoader with worker processes: a
mid-epoch resume yields the uninterrupted run's next batches, and a resume at another world size
(2 -> 1, 1 -> 2) splits exactly the rest of the same order."""

from __future__ import annotations

import torch
import torch.distributed as dist
from gloo_ranks import no_thread_ending, run_on_every_rank
from torch.utils.data import DataLoader, TensorDataset

from cycler.data.permutation import FeistelPermutation
from cycler.data.samplers import InterruptableDistributedSampler

LENGTH, SEED, EPOCH, BATCH_SIZE = 203, 11, 2, 4
DATASET = TensorDataset(torch.arange(LENGTH))
ORDER = FeistelPermutation(LENGTH, SEED, EPOCH)(torch.arange(LENGTH)).tolist()


def sampler(world: int | None = None, rank: int | None = None) -> InterruptableDistributedSampler:
    made = InterruptableDistributedSampler(DATASET, world, rank, seed=SEED, order="scalable")
    made.set_epoch(EPOCH)
    return made


def loader(of: InterruptableDistributedSampler) -> DataLoader:
    # Fork, as under torchrun: spawning workers costs seconds each.
    no_thread_ending()
    return DataLoader(DATASET, BATCH_SIZE, sampler=of, num_workers=2,
                      multiprocessing_context="fork")


def consume(running: InterruptableDistributedSampler, batches: int) -> list[int]:
    taken: list[int] = []
    for step, (batch,) in enumerate(loader(running)):
        if step == batches:
            break  # the workers prefetched past here: progress must not count it
        taken += batch.tolist()
        running.advance(len(batch))
    return taken


def rest_of_epoch(resumed: InterruptableDistributedSampler) -> list[int]:
    return [index for (batch,) in loader(resumed) for index in batch.tolist()]


def gathered(items: list[int]) -> list[list[int]]:
    every: list[list[int] | None] = [None] * dist.get_world_size()
    dist.all_gather_object(every, items)
    return [list(share or []) for share in every]


def interleaved(shares: list[list[int]]) -> list[int]:
    return [index for row in zip(*shares, strict=True) for index in row]


def broadcast_state(running: InterruptableDistributedSampler | None) -> dict[str, object]:
    states = [running.state_dict() if running is not None else None]
    dist.broadcast_object_list(states, src=0)
    assert states[0] is not None
    return states[0]


def check_scalable_resume_mid_epoch() -> None:
    uninterrupted = rest_of_epoch(sampler())
    running = sampler()
    taken = consume(running, 5)
    resumed = sampler()
    resumed.load_state_dict(broadcast_state(running))
    assert taken + rest_of_epoch(resumed) == uninterrupted
    shares = gathered(uninterrupted)
    assert interleaved(shares)[:LENGTH] == ORDER


def check_scalable_resplit_from_two_ranks_to_one() -> None:
    running = sampler()
    taken = gathered(consume(running, 7))
    state = broadcast_state(running)
    consumed = 2 * 7 * BATCH_SIZE
    assert sorted(taken[0] + taken[1]) == sorted(ORDER[:consumed])
    if dist.get_rank() == 0:  # the one rank of the smaller job
        alone = sampler(1, 0)
        alone.load_state_dict(state)
        assert rest_of_epoch(alone) == ORDER[consumed:]


def check_scalable_resplit_from_one_rank_to_two() -> None:
    consumed = 9 * BATCH_SIZE
    running = None
    if dist.get_rank() == 0:  # the one rank of the smaller job
        running = sampler(1, 0)
        assert consume(running, 9) == ORDER[:consumed]
    resumed = sampler()
    resumed.load_state_dict(broadcast_state(running))
    shares = gathered(rest_of_epoch(resumed))
    rest = ORDER[consumed:]
    # 167 left over 2 ranks: torch's rule pads with the first of the rest.
    assert interleaved(shares) == rest + rest[:1]


def test_a_scalable_order_resumes_mid_epoch_exactly_on_two_gloo_ranks_with_workers() -> None:
    run_on_every_rank(__name__, "check_scalable_resume_mid_epoch")


def test_a_scalable_order_resplits_exactly_from_two_ranks_to_one_and_one_to_two() -> None:
    run_on_every_rank(__name__, "check_scalable_resplit_from_two_ranks_to_one",
                      "check_scalable_resplit_from_one_rank_to_two")
