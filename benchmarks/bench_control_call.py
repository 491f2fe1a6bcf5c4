"""Per-step cost of ``StepControl.step()``, one rank and two gloo ranks, against a blocking reduce.

Goals: <= 5 us per step on one rank, <= 20 us per step (amortized) on two ranks.

    python benchmarks/bench_control_call.py [--steps 2000] [--repeats 3] [--size 256]

Each variant runs the same loop of one ``size`` x ``size`` matmul per step (about half a
millisecond at 256 on one core: a tiny model's step, long enough for the exchange to overlap).
A variant's cost is its time minus the compute-only loop's, per step, taking the best of
``--repeats`` interleaved runs to shed noise.
"""

from __future__ import annotations

import argparse
import os
import socket
import tempfile
import time
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from cycler.step_control import StepControl

SYNC_EVERY_CHOICES = (1, 4, 8, 16)


def tiny_compute(weights: torch.Tensor) -> None:
    torch.mm(weights, weights)


def time_loop(steps: int, weights: torch.Tensor, per_step: Callable[[], object] | None) -> float:
    start = time.perf_counter()
    for _ in range(steps):
        tiny_compute(weights)
        if per_step is not None:
            per_step()
    return time.perf_counter() - start


def blocking_all_reduce() -> None:
    dist.all_reduce(torch.zeros(3, dtype=torch.int32), op=dist.ReduceOp.MAX)


def variants(control_file: str) -> dict[str, Callable[[], Callable[[], object] | None]]:
    """Name -> factory of the per-step call (built fresh for every run)."""
    found: dict[str, Callable[[], Callable[[], object] | None]] = {"compute only": lambda: None}
    for sync_every in SYNC_EVERY_CHOICES:
        found[f"step() sync_every={sync_every}"] = _control_factory(control_file, sync_every)
    if dist.is_initialized():
        found["blocking all_reduce"] = lambda: blocking_all_reduce
    return found


def _control_factory(control_file: str, sync_every: int) -> Callable[[], Callable[[], object]]:
    def build() -> Callable[[], object]:
        control = StepControl(
            control_file=control_file, every_steps=10**9, every_seconds=1e9, sync_every=sync_every
        )
        return control.step

    return build


def measure(steps: int, repeats: int, size: int, control_file: str) -> dict[str, float]:
    """Best seconds per step of every variant, interleaved so that noise hits them alike."""
    torch.set_num_threads(1)
    weights = torch.randn(size, size)
    best: dict[str, float] = {}
    for _ in range(repeats):
        for name, factory in variants(control_file).items():
            if dist.is_initialized():
                dist.barrier()
            seconds = time_loop(steps, weights, factory()) / steps
            best[name] = min(best.get(name, seconds), seconds)
    return best


def report(title: str, best: dict[str, float]) -> None:
    base = best["compute only"]
    print(f"\n{title}: compute alone {base * 1e6:.1f} us/step")
    blocking = best.get("blocking all_reduce")
    for name, seconds in best.items():
        if name == "compute only":
            continue
        overhead = (seconds - base) * 1e6
        line = f"  {name:<26} {overhead:8.2f} us/step over compute"
        if blocking is not None and name != "blocking all_reduce":
            ratio = (blocking - base) / max(seconds - base, 1e-9)
            line += f"   ({ratio:.0f}x cheaper than blocking)"
        print(line)


def single_call_cost(calls: int, control_file: str) -> float:
    """Seconds per bare ``step()`` call with no compute, one rank."""
    control = StepControl(control_file=control_file, every_steps=10**9, every_seconds=1e9)
    start = time.perf_counter()
    for _ in range(calls):
        control.step()
    return (time.perf_counter() - start) / calls


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def two_rank_worker(
    rank: int, port: int, steps: int, repeats: int, size: int, directory: str
) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        best = measure(steps, repeats, size, os.path.join(directory, f"control-{rank}.json"))
        if rank == 0:
            report("two gloo ranks", best)
    finally:
        dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--size", type=int, default=256, help="matmul size of the fake step")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        control_file = os.path.join(directory, "control.json")
        bare = min(single_call_cost(100_000, control_file) for _ in range(args.repeats))
        print(f"one rank: bare step() call {bare * 1e6:.2f} us (no compute, no process group)")
        report("one rank", measure(args.steps, args.repeats, args.size, control_file))
        mp.spawn(
            two_rank_worker,
            args=(free_port(), args.steps, args.repeats, args.size, directory),
            nprocs=2,
            join=True,
        )


if __name__ == "__main__":
    main()
