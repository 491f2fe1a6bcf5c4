"""The canonical resume test with 2 real gloo processes: consume k, snapshot, rebuild, load, and
compare the next items on every rank, bare and behind a DataLoader with worker processes."""

from __future__ import annotations

import torch
import torch.distributed as dist
from gloo_ranks import no_thread_ending, run_on_every_rank
from torch.utils.data import DataLoader, TensorDataset

from cycler.data.samplers import InterruptableDistributedSampler

WORLD_SIZE = 2
BATCH_SIZE = 4


def check_resume_after_k_items() -> None:
    dataset = TensorDataset(torch.arange(101))
    running = InterruptableDistributedSampler(dataset, seed=7)
    running.set_epoch(3)
    running.advance(17)
    # Every rank loads rank 0's state, as a job that saves one state file does.
    states = [running.state_dict()]
    dist.broadcast_object_list(states, src=0)
    resumed = InterruptableDistributedSampler(dataset, seed=7)
    resumed.load_state_dict(states[0])
    assert resumed.rank == dist.get_rank()
    assert list(resumed) == list(running)
    assert (len(resumed), resumed.remaining) == (51, 51 - 17)
    _assert_all_ranks_differ(list(resumed))


def check_resume_behind_a_dataloader_with_workers() -> None:
    dataset = TensorDataset(torch.arange(90))
    uninterrupted = _batches_of_epoch(dataset, None)
    running = InterruptableDistributedSampler(dataset, seed=3)
    loader = _loader(dataset, running)
    running.set_epoch(1)
    batches = iter(loader)
    for step in range(3):
        (batch,) = next(batches)
        assert batch.tolist() == uninterrupted[step]
        running.advance(len(batch))
    # The workers have prefetched batches past the third: progress must not count them.
    assert running.progress == 3 * BATCH_SIZE
    state = running.state_dict()
    del batches
    assert _batches_of_epoch(dataset, state) == uninterrupted[3:]


def _batches_of_epoch(dataset: TensorDataset, state: dict[str, object] | None) -> list[list[int]]:
    sampler = InterruptableDistributedSampler(dataset, seed=3)
    sampler.set_epoch(1)
    if state is not None:
        sampler.load_state_dict(state)
    return [batch.tolist() for (batch,) in _loader(dataset, sampler)]


def _loader(dataset: TensorDataset, sampler: InterruptableDistributedSampler) -> DataLoader:
    # Fork, as under torchrun: these ranks were spawned, so spawn would be the default here, and
    # spawning workers costs seconds each.
    no_thread_ending()
    return DataLoader(
        dataset, BATCH_SIZE, sampler=sampler, num_workers=2, multiprocessing_context="fork"
    )


def _assert_all_ranks_differ(items: list[int]) -> None:
    gathered: list[list[int] | None] = [None] * WORLD_SIZE
    dist.all_gather_object(gathered, items)
    assert gathered[0] != gathered[1]


def test_resume_after_k_items_yields_the_same_next_items_on_every_gloo_rank() -> None:
    run_on_every_rank(__name__, "check_resume_after_k_items")


def test_resume_behind_a_dataloader_with_workers_yields_the_same_next_batches() -> None:
    run_on_every_rank(__name__, "check_resume_behind_a_dataloader_with_workers")
