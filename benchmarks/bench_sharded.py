"""Sharded and asynchronous saves: training stall, time to commit, and the commit on rank 0.

Goals (issue 9): an asynchronous save stalls training no more than DCP's own ``async_save``
with the same ``DefaultStager`` options (ratio <= 1.0), and is committed within 1.15x the time
of a synchronous DCP save of the same state; the commit's time on rank 0 stays flat from 1 to
4 ranks of 256 MB each.

    python benchmarks/bench_sharded.py [--sizes-mb 100 1000] [--repeats 5] [--rank-mb 256]

Stall: one process, a state dict of one float32 tensor of the given size; after one warm-up
save (DCP's stager allocates its staging buffers then and reuses them), each repetition times
the call until it returns (the stall) and until the save is durable: for DCP until its future
completes, for cycler until ``handle.wait()`` returns, i.e. written, fsynced, checksummed and
committed. The synchronous baseline is ``dcp.save`` of the same state. The three run in turn,
each going first in one repetition of three, after an ``os.sync()``: the disk here varies 2x
from one write to the next, and a write right after another pays for its dirty pages.

Both stalls are mostly the same ``DefaultStager`` copy, whose time varies 9-16 ms per 100 MB
from one call to the next here; each stager's ``stage`` is timed too, and ``*_above_copy_ms``
is what each call adds to its own copy; ``stall_ratio_same_copy`` puts both on the same
(median) copy. Likewise ``cycler_commit_above_write_ms`` is cycler's committed time less its
own ``dcp.save``: what the checksums and the commit add to DCP's write, free of the write's own
variation.

Commit: 1, 2 and 4 gloo ranks each write ``--rank-mb`` MB with ``atomic_torch_save`` into one
prepared directory; the figure is ``symlink_latest`` on rank 0 (median of the repetitions), once
with nothing to remove (``keep_last=-1``, the old checkpoints removed outside the timing) and
once with ``keep_last=1``, where rank 0 also removes the previous checkpoint (retention runs
after the commit is announced: the other ranks have returned by then).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
from _checks import require

from cycler import AtomicDirectory, atomic_torch_save
from cycler.checkpoint.dcp import default_stager


def timing_copies(stager: Any, copies: list[float]) -> None:
    """Make ``stager`` append the time of each of its copies to ``copies``."""
    stage = stager.stage

    def timed(state_dict: Any) -> Any:
        started = time.perf_counter()
        staged = stage(state_dict)
        copies.append(time.perf_counter() - started)
        return staged

    stager.stage = timed


def stall(size_mb: int, repeats: int, root: Path) -> dict[str, float]:
    state = {"weights": torch.randn(size_mb * 1024 * 1024 // 4)}
    stager = default_stager()
    saver = AtomicDirectory(root / "cycler", keep_last=2)
    target = root / "dcp"
    copies: dict[str, list[float]] = {"dcp": [], "cycler": []}
    timing_copies(stager, copies["dcp"])
    writes: list[float] = []  # cycler's own dcp.save, in its background thread
    save = dcp.save

    def timed_save(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        result = save(*args, **kwargs)
        if threading.current_thread().name.startswith("cycler-async-save"):
            writes.append(time.perf_counter() - started)
        return result

    dcp.save = timed_save

    def dcp_async() -> tuple[float, float]:
        started = time.perf_counter()
        future = dcp.async_save(state, checkpoint_id=str(target), async_stager=stager,
                                no_dist=True)
        returned = time.perf_counter()
        future.result()
        return returned - started, time.perf_counter() - started

    def cycler_async() -> tuple[float, float]:
        started = time.perf_counter()
        handle = saver.save(state, asynchronous=True)
        returned = time.perf_counter()
        handle.wait()
        committed = time.perf_counter() - started
        saver.wait()  # retention (its removal of an old checkpoint) is not part of the figure
        require(saver.latest_checkpoint() is not None, "cycler async save",
                "committed no checkpoint")
        runs["cycler_commit_above_write_ms"].append(1000 * (committed - writes[-1]))
        return returned - started, committed

    def dcp_sync() -> tuple[float, float]:
        started = time.perf_counter()
        dcp.save(state, checkpoint_id=str(target), no_dist=True)
        return 0.0, time.perf_counter() - started

    runs: dict[str, list[float]] = {key: [] for key in (
        "dcp_stall_s", "dcp_durable_s", "cycler_stall_s", "cycler_committed_s", "dcp_sync_s",
        "dcp_above_copy_ms", "cycler_above_copy_ms", "cycler_commit_above_write_ms")}
    variants = {"dcp": dcp_async, "cycler": cycler_async, "sync": dcp_sync}
    names = list(variants)
    for repeat in range(repeats + 1):  # the first is a warm-up (staging buffers allocated)
        if repeat == 1:  # the saver's stager exists from the warm-up on
            timing_copies(saver._dcp.stager, copies["cycler"])
        for name in names[repeat % 3:] + names[:repeat % 3]:  # each goes first in turn
            os.sync()  # no variant pays for another's dirty pages
            blocked, durable = variants[name]()
            shutil.rmtree(target, ignore_errors=True)
            if not repeat:
                continue
            if name == "sync":
                runs["dcp_sync_s"].append(durable)
            else:  # what the call adds to its own staging copy, a figure free of the copy's
                # own variation from one call to the next (10-16 ms for the same 100 MB here)
                runs[f"{name}_above_copy_ms"].append(1000 * (blocked - copies[name][-1]))
                runs[f"{name}_stall_s"].append(blocked)
                runs["dcp_durable_s" if name == "dcp" else "cycler_committed_s"].append(durable)
    dcp.save = save
    del runs["cycler_commit_above_write_ms"][0]  # the warm-up's
    figures = {key: round(statistics.median(values), 4) for key, values in runs.items()}
    # The same copy for both (the median of all of both stagers' copies) plus what each call
    # adds to it: the stall ratio without the copy's own noise.
    copy = statistics.median(copies["dcp"][1:] + copies["cycler"])
    ours, theirs = figures["cycler_above_copy_ms"] / 1000, figures["dcp_above_copy_ms"] / 1000
    figures["stall_ratio_same_copy"] = round((copy + ours) / (copy + theirs), 3)
    figures["stall_ratio"] = round(figures["cycler_stall_s"] / figures["dcp_stall_s"], 2)
    figures["committed_vs_sync_ratio"] = round(
        figures["cycler_committed_s"] / figures["dcp_sync_s"], 2)
    return figures


def _commit_rank(rank: int, world: int, port: int, root: str, rank_mb: int, repeats: int,
                 out: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                           world_size=world)
    weights = torch.randn(rank_mb * 1024 * 1024 // 4)
    times: dict[str, list[float]] = {"commit": [], "with_retention": []}
    for kind, keep_last in (("commit", -1), ("with_retention", 1)):
        saver = AtomicDirectory(os.path.join(root, kind), keep_last=keep_last)
        for _ in range(repeats + 1):  # the first is a warm-up (the saver's first scan)
            directory = saver.prepare_checkpoint_directory()
            atomic_torch_save({"weights": weights}, os.path.join(directory, f"rank-{rank}.pt"))
            dist.barrier()
            started = time.perf_counter()
            saver.symlink_latest(directory)
            times[kind].append(time.perf_counter() - started)
            dist.barrier()
            if rank == 0 and keep_last == -1:  # keep the disk from filling, outside the figure
                for old in Path(saver.output_directory).glob(f"{saver.name}_checkpoint_*"):
                    if old.name != Path(directory).name:
                        shutil.rmtree(old)
            dist.barrier()
        del times[kind][0]
    if rank == 0:
        Path(out).write_text(json.dumps(times))
    dist.destroy_process_group()


def commit_by_world_size(rank_mb: int, repeats: int, root: Path) -> list[dict[str, float]]:
    rows = []
    for world in (1, 2, 4):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        out = root / f"commit-{world}.json"
        mp.spawn(_commit_rank, args=(world, port, str(root / f"w{world}"), rank_mb, repeats,
                                     str(out)), nprocs=world, join=True)
        times = json.loads(out.read_text())
        rows.append({"ranks": world, "data_mb": world * rank_mb,
                     "rank0_commit_s": round(statistics.median(times["commit"]), 4),
                     "rank0_commit_and_retention_s": round(
                         statistics.median(times["with_retention"]), 4)})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes-mb", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rank-mb", type=int, default=256)
    args = parser.parse_args()
    print(f"cpus={os.cpu_count()} load={os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory(dir=".") as directory:
        for size in args.sizes_mb:
            root = Path(directory) / f"stall-{size}"
            root.mkdir()
            # Small saves are quick and noisier: as many repetitions as 1 GB's time allows.
            repeats = min(max(args.repeats, args.repeats * 1000 // size), 6 * args.repeats)
            figures = stall(size, repeats, root)
            print("stall", json.dumps({"size_mb": size, "repeats": repeats, **figures}))
            shutil.rmtree(root)
        for row in commit_by_world_size(args.rank_mb, args.repeats, Path(directory)):
            print("commit", json.dumps(row))


if __name__ == "__main__":
    main()
