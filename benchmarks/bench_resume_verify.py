"""Resuming with checksum verification (the default) against an unverified resume.

Goal (issue 9): ``latest_checkpoint()`` (which now verifies the checkpoint it returns) plus
``torch.load`` within 1.3x of ``latest_checkpoint(verify=False)`` plus ``torch.load``.

    python benchmarks/bench_resume_verify.py [--size-mb 1000] [--repeats 15]
    python benchmarks/bench_resume_verify.py --world-sizes 1,2,4 [--size-mb 256]

With ``--world-sizes``: bytes each rank reads to choose and verify the checkpoint it resumes
from (a DCP checkpoint of ``--size-mb`` saved by that many gloo ranks), with the agreed resume
of ``AtomicDirectory.load`` (each rank its share) against every rank verifying alone (before).

One checkpoint of one float32 tensor, committed with AtomicDirectory; the two resumes are
interleaved and both read a warm page cache (the realistic case right after a restart on the
same node is colder, which makes the extra read cost more). ``torch.load`` of 1 GB varies
0.57-0.94 s from one call to the next here, so the verification's own time is printed too.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from _checks import require

from cycler import AtomicDirectory, atomic_torch_save, latest_checkpoint


def resume(root: Path, verify: bool) -> tuple[float, float]:
    """The whole resume's time, and that of ``latest_checkpoint`` alone."""
    started = time.perf_counter()
    path = latest_checkpoint(root, verify=verify)
    run = "verified resume" if verify else "resume"
    require(path is not None, run, f"found no checkpoint in {root}")
    assert path is not None
    chosen = time.perf_counter()
    state = torch.load(path / "model.pt", weights_only=True)
    seconds = time.perf_counter() - started, chosen - started
    require(state["w"].numel() > 0, run, "loaded an empty state")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--world-sizes", default="")
    args = parser.parse_args()
    if args.world_sizes:
        bytes_read_per_rank(args.size_mb, [int(n) for n in args.world_sizes.split(",")])
        return
    with tempfile.TemporaryDirectory(dir=".") as directory:
        root = Path(directory)
        saver = AtomicDirectory(root)
        path = Path(saver.prepare_checkpoint_directory())
        atomic_torch_save({"w": torch.randn(args.size_mb * 1024 * 1024 // 4)}, path / "model.pt")
        saver.symlink_latest(path)
        times: dict[bool, list[float]] = {False: [], True: []}
        checks: list[float] = []
        resume(root, False)  # warm the cache
        for repeat in range(args.repeats):
            for verify in (False, True) if repeat % 2 else (True, False):  # each first in turn
                whole, choosing = resume(root, verify)
                times[verify].append(whole)
                if verify:
                    checks.append(choosing)
        plain, verified = statistics.median(times[False]), statistics.median(times[True])
        print(json.dumps({"size_mb": args.size_mb, "unverified_s": round(plain, 3),
                          "verified_s": round(verified, 3), "ratio": round(verified / plain, 2),
                          "verification_alone_s": round(statistics.median(checks), 3)}))



def _read_bytes() -> int:
    """Bytes this process has read through system calls (page cache included)."""
    with open("/proc/self/io") as io:
        return next(int(line.split()[1]) for line in io if line.startswith("rchar:"))


def _rank_main(rank: int, world_size: int, port: int, root: str, size_mb: int,
               queue: Any) -> None:
    import torch.distributed as dist

    from cycler.checkpoint.resume import agreed_checkpoint

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world_size)
    saver = AtomicDirectory(root)
    floats = size_mb * (1 << 20) // 4 // world_size
    saver.save({f"shard{rank}": torch.randn(floats)})  # each rank its share of the state
    dist.barrier()
    before = _read_bytes()
    agreed_checkpoint(saver.layout, saver._coordinator)
    agreed = _read_bytes() - before
    dist.barrier()
    before = _read_bytes()
    latest_checkpoint(root)  # what every rank did before: verify the whole checkpoint alone
    alone = _read_bytes() - before
    queue.put((rank, agreed, alone))
    dist.barrier()
    dist.destroy_process_group()


def bytes_read_per_rank(size_mb: int, world_sizes: list[int]) -> None:
    """Resume's bytes read per rank, agreed verification against each rank verifying alone."""
    import socket

    import torch.multiprocessing as mp

    for world_size in world_sizes:
        with tempfile.TemporaryDirectory(dir=".") as directory, socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
            probe.close()
            queue = mp.get_context("spawn").SimpleQueue()
            mp.spawn(_rank_main, args=(world_size, port, directory, size_mb, queue),
                     nprocs=world_size, join=True)
            rows = sorted(queue.get() for _ in range(world_size))
            print(json.dumps({
                "world_size": world_size, "checkpoint_mb": size_mb,
                "agreed_mb_read_per_rank": [round(agreed / 2**20, 1) for _, agreed, _ in rows],
                "alone_mb_read_per_rank": [round(alone / 2**20, 1) for _, _, alone in rows]}))


if __name__ == "__main__":
    main()
