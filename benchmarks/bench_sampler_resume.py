"""What resuming a sampler mid-epoch costs, next to torch's DistributedSampler starting an epoch.

Run: ``python benchmarks/bench_sampler_resume.py``

For each dataset size and world size it times, on rank 0, the best of a few repeats (taken in
turn, so a noisy neighbour slows both alike) of:

- torch: ``DistributedSampler.set_epoch`` + ``iter()`` + the first index (or, through a
  ``DataLoader``, the first batch): what every epoch of a plain torch job pays;
- cycler: ``load_state_dict`` of a state taken at the middle of the epoch + ``iter()`` + the first
  index (or first batch): what a resume pays.

A ratio near or below 1 means the resume costs no more than starting an epoch: no replay.
It also prints the size of the saved state (pickled, torch.save'd, JSON).
"""

from __future__ import annotations

import argparse
import io
import json
import pickle
import time
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Sampler

from cycler.data.samplers import InterruptableDistributedSampler

SIZES = (1_000_000, 10_000_000)
WORLD_SIZES = (1, 8)
EPOCH = 3
REPEATS = 7
BATCH_SIZE = 256


class Indices(Dataset[int]):
    """A dataset of ``length`` items whose item ``i`` is ``i``: loading costs nothing."""

    def __init__(self, length: int) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> int:
        return index


def best_seconds(first: Callable[[], object], second: Callable[[], object]) -> tuple[float, float]:
    """The fastest of REPEATS runs of each, the two taking turns."""
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(REPEATS):
        for run, spent in zip((first, second), times, strict=True):
            start = time.perf_counter()
            run()
            spent.append(time.perf_counter() - start)
    return min(times[0]), min(times[1])


def first_item(sampler: Sampler[int], batched: bool, dataset: Indices) -> object:
    if batched:
        return next(iter(DataLoader(dataset, BATCH_SIZE, sampler=sampler)))
    return next(iter(sampler))


def torch_epoch_start(dataset: Indices, world: int, batched: bool) -> Callable[[], object]:
    sampler: DistributedSampler[int] = DistributedSampler(dataset, num_replicas=world, rank=0)

    def run() -> object:
        sampler.set_epoch(EPOCH)
        return first_item(sampler, batched, dataset)

    return run


def mid_epoch_state(dataset: Indices, world: int) -> dict[str, Any]:
    sampler = InterruptableDistributedSampler(dataset, num_replicas=world, rank=0)
    sampler.set_epoch(EPOCH)
    sampler.advance(sampler.epoch_length // 2)
    return sampler.state_dict()


def cycler_resume(
    dataset: Indices, world: int, batched: bool, state: dict[str, Any]
) -> Callable[[], object]:
    def run() -> object:
        sampler = InterruptableDistributedSampler(dataset, num_replicas=world, rank=0)
        sampler.load_state_dict(state)
        return first_item(sampler, batched, dataset)

    return run


def state_sizes(state: dict[str, Any]) -> str:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return (
        f"pickle {len(pickle.dumps(state))} B, torch.save {buffer.tell()} B, "
        f"json {len(json.dumps(state))} B"
    )


def main() -> None:
    global SIZES, WORLD_SIZES
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="the smallest size: checks it runs")
    if parser.parse_args().smoke:
        SIZES, WORLD_SIZES = (10_000,), (2,)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, best of {REPEATS}")
    print(f"{'size':>11} {'world':>5} {'first':>6} {'torch epoch start':>18} "
          f"{'cycler resume':>14} {'ratio':>6}")
    for size in SIZES:
        dataset = Indices(size)
        for world in WORLD_SIZES:
            state = mid_epoch_state(dataset, world)
            for batched in (False, True):
                theirs, ours = best_seconds(
                    torch_epoch_start(dataset, world, batched),
                    cycler_resume(dataset, world, batched, state),
                )
                label = "batch" if batched else "index"
                print(f"{size:>11,} {world:>5} {label:>6} {theirs * 1e3:>15.1f} ms "
                      f"{ours * 1e3:>11.1f} ms {ours / theirs:>6.2f}")
    print(f"state_dict: {state_sizes(state)}")


if __name__ == "__main__":
    main()
