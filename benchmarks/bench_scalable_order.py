"""What an epoch's order costs at 1e6, 1e8 and 1e10 samples: order="scalable" against "torch".

Run: ``python benchmarks/bench_scalable_order.py``

Rank 3 of 8 replicas, over a dataset that only reports its length. Each figure comes from its
own subprocess (so the peak RSS is that phase's alone, above what the process held before it):

- start: build the sampler, ``set_epoch``, ``iter()`` and the first index;
- resume: ``load_state_dict`` of a state taken in the middle of the epoch, ``iter()`` and the
  first index, in a fresh sampler;
- iterate: indices per second over (up to) 2 million indices of a resumed epoch, one thread,
  read one by one as a DataLoader reads them.

Goals (issue 11): resume under 1 ms and under 1 MB of extra memory at every size; iteration at
least 5 million indices per second per rank. The torch order cannot build 1e10 (80 GB): n/a.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from itertools import islice

import torch

from cycler.data.samplers import InterruptableDistributedSampler

SIZES = (10**6, 10**8, 10**10)
ORDERS = ("torch", "scalable")
PHASES = ("start", "resume", "iterate")
REPLICAS, RANK, EPOCH, SEED = 8, 3, 5, 0
ITERATED = 2_000_000


class OnlyLength:
    """A dataset that only reports its length."""

    def __init__(self, length: int) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length


def sampler(length: int, order: str) -> InterruptableDistributedSampler:
    made = InterruptableDistributedSampler(OnlyLength(length), REPLICAS, RANK,  # type: ignore[arg-type]
                                           seed=SEED, order=order)
    made.set_epoch(EPOCH)
    return made


def mid_epoch_state(length: int, order: str) -> dict[str, object]:
    running = sampler(length, order)
    running.advance(running.epoch_length // 2)
    return running.state_dict()


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def measure(length: int, order: str, phase: str) -> dict[str, float]:
    """One phase in this process: seconds (or indices per second) and extra peak RSS."""
    torch.set_num_threads(1)
    _warm_up(order)
    state = mid_epoch_state(length, order) if phase != "start" else None
    before = peak_rss_mb()
    began = time.perf_counter()
    made = sampler(length, order) if phase == "start" else None
    if state is not None:
        made = InterruptableDistributedSampler(OnlyLength(length), REPLICAS, RANK,  # type: ignore[arg-type]
                                               seed=SEED, order=order)
        made.load_state_dict(state)
    assert made is not None
    indices = iter(made)
    next(indices)
    seconds = time.perf_counter() - began
    if phase == "iterate":
        began = time.perf_counter()
        count = sum(1 for _ in islice(indices, ITERATED))
        seconds = count / (time.perf_counter() - began)
    return {"value": seconds, "extra_mb": peak_rss_mb() - before}


def _warm_up(order: str) -> None:
    """A small resume first: what is measured is a resume in a process that already ran torch
    and this code once (first calls load kernels and fill caches, about 2 MB and 1 ms)."""
    warm = sampler(1000, order)
    warm.load_state_dict(mid_epoch_state(1000, order))
    list(warm)


def in_subprocess(length: int, order: str, phase: str) -> dict[str, float] | None:
    if order == "torch" and length > 10**9:
        return None
    command = [sys.executable, __file__, "--one", str(length), order, phase]
    output = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    return json.loads(output.splitlines()[-1])


def row(length: int, order: str) -> str:
    figures = {phase: in_subprocess(length, order, phase) for phase in PHASES}
    if figures["start"] is None:
        return f"| {length:.0e} | {order} | n/a | n/a | n/a | n/a |"
    start, resume, iterate = (figures[phase] or {} for phase in PHASES)
    return (f"| {length:.0e} | {order} | {start['value'] * 1e3:.2f} ms | "
            f"{resume['value'] * 1e3:.2f} ms | {resume['extra_mb']:.2f} MB | "
            f"{iterate['value'] / 1e6:.1f} M/s ({iterate['extra_mb']:.1f} MB) |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--one", nargs=3, metavar=("LENGTH", "ORDER", "PHASE"))
    parser.add_argument("--smoke", action="store_true", help="the smallest size: checks it runs")
    args = parser.parse_args()
    if args.one:
        length, order, phase = args.one
        print(json.dumps(measure(int(length), order, phase)))
        return
    print("| n | order | start (first index) | resume (first index) | resume extra RSS | "
          "iteration (extra RSS) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for length in (10**4,) if args.smoke else SIZES:
        for order in ORDERS:
            print(row(length, order), flush=True)


if __name__ == "__main__":
    main()
