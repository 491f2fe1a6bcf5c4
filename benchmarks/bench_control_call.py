"""Per-step cost of ``StepControl.step()``, one rank and two gloo ranks, against a blocking reduce.

Goals: <= 5 us per step on one rank, <= 20 us per step (amortized) on two ranks.

    python benchmarks/bench_control_call.py [--steps 2000] [--repeats 3] [--size 256]

Each variant runs the same loop of one ``size`` x ``size`` matmul per step (about half a
millisecond at 256 on one core: a tiny model's step, long enough for an exchange to overlap),
then, with two ranks, a blocking all_reduce of a 4 KiB "gradient" as DDP does (it keeps the ranks
in step as in real training; without it the ranks drift apart and the first wait of any
collective absorbs the drift), then the per-step call. Two figures per variant, best of
``--repeats`` interleaved runs:

- ``in call``: time the training thread spent inside the call, per step (waits included). This
  is the cost the call adds to a step, and it is stable on a busy machine.
- ``loop``: the whole loop's time per step minus the compute-only loop's. It also shows work the
  collective's background threads take from the compute; on a shared 2-core machine it is noisy
  (tens of microseconds either way): a loop faster than compute alone prints "within noise".
"""

from __future__ import annotations

import argparse
import os
import socket
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from cycler.training.step_control import StepControl

SYNC_EVERY_CHOICES: tuple[int | None, ...] = (None, 1, 8, 32)
"""``None`` is the default: the period adapts to the step time."""

COMPUTE_ONLY = "compute only"
BLOCKING = "blocking all_reduce per step"


@dataclass(frozen=True)
class Timing:
    loop: float
    """Seconds per step of the whole loop."""
    in_call: float
    """Seconds per step spent inside the per-step call."""


def time_loop(steps: int, weights: torch.Tensor, per_step: Callable[[], object] | None) -> Timing:
    clock = time.perf_counter
    gradient = torch.zeros(1024) if dist.is_initialized() else None
    in_call = 0.0
    start = clock()
    for _ in range(steps):
        torch.mm(weights, weights)
        if gradient is not None:
            dist.all_reduce(gradient)
        if per_step is not None:
            before = clock()
            per_step()
            in_call += clock() - before
    return Timing(loop=(clock() - start) / steps, in_call=in_call / steps)


def blocking_all_reduce() -> None:
    dist.all_reduce(torch.zeros(4, dtype=torch.int32), op=dist.ReduceOp.MAX)


def build_control(control_file: str, sync_every: int | None) -> StepControl:
    return StepControl(
        control_file=control_file, every_steps=10**9, every_seconds=1e9, sync_every=sync_every
    )


def run_variant(name: str, steps: int, weights: torch.Tensor, control_file: str) -> Timing:
    if name == COMPUTE_ONLY:
        return time_loop(steps, weights, None)
    if name == BLOCKING:
        return time_loop(steps, weights, blocking_all_reduce)
    sync_every = None if name.endswith("adaptive (default)") else int(name.rsplit("=", 1)[1])
    with build_control(control_file, sync_every) as control:
        return time_loop(steps, weights, control.step)


def variant_names() -> list[str]:
    names = [COMPUTE_ONLY]
    for sync_every in SYNC_EVERY_CHOICES:
        names.append(
            f"step() sync_every={'adaptive (default)' if sync_every is None else sync_every}"
        )
    if dist.is_initialized():
        names.append(BLOCKING)
    return names


def measure(steps: int, repeats: int, size: int, control_file: str) -> dict[str, Timing]:
    """Best timing of every variant, interleaved so that noise hits them alike."""
    torch.set_num_threads(1)
    weights = torch.randn(size, size)
    best: dict[str, Timing] = {}
    for _ in range(repeats):
        for name in variant_names():
            if dist.is_initialized():
                dist.barrier()
            timing = run_variant(name, steps, weights, control_file)
            previous = best.get(name, timing)
            best[name] = Timing(
                min(previous.loop, timing.loop), min(previous.in_call, timing.in_call)
            )
    return best


def report(title: str, best: dict[str, Timing]) -> None:
    base = best[COMPUTE_ONLY].loop
    print(f"\n{title}: compute alone {base * 1e6:.1f} us/step")
    blocking = best.get(BLOCKING)
    for name, timing in best.items():
        if name == COMPUTE_ONLY:
            continue
        extra = timing.loop - base
        # A loop faster than compute alone is the machine's noise, never a negative cost.
        loop = f"{extra * 1e6:+9.2f} us/step" if extra >= 0 else "   within noise"
        line = f"  {name:<38} in call {timing.in_call * 1e6:8.2f} us/step   loop {loop}"
        if blocking is not None and name != BLOCKING:
            line += f"   {blocking.in_call / max(timing.in_call, 1e-9):6.0f}x less than blocking"
        print(line)


def bare_call_cost(calls: int, control_file: str) -> float:
    """Seconds per bare ``step()`` call with no compute, one rank."""
    control = build_control(control_file, None)
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
            report("two gloo ranks (rank 0)", best)
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
        bare = min(bare_call_cost(100_000, control_file) for _ in range(args.repeats))
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
