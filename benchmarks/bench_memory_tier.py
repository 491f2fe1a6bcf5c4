"""What the memory tier buys: commit cost, training stall and work lost per crash.

    python benchmarks/bench_memory_tier.py [--sizes-mb 100,1000] [--crashes 12]

1. Commit: ``AtomicDirectory`` with the memory tier (prepare, ``torch.save`` of the state into
   the memory root, commit: checksums, manifest, link) against a plain ``torch.save`` of the same
   tensors into the same tmpfs. Goal (issue 18): <= 1.2x.
2. Stall: how long training waits for one save: a synchronous DCP save into the memory tier,
   and an asynchronous one, against the disk tier's asynchronous DCP save (staging only), all
   of the same state. Goal: the memory tier's <= 1.0x the disk tier's asynchronous one.
3. Work lost per crash at the same durable write volume: a worker (1 MB of state, 20 ms steps)
   killed with SIGKILL at a random moment, then the step it would resume from. Disk only saves
   every N x K steps; the memory tier saves every N steps and persists every K-th, so both
   write the same bytes to the checkpoint root. Goal: at least 5x less lost work (K = 5).
   This is a process crash (node memory survives); a lost node falls back to the durable
   checkpoints, the disk-only figure.
4. The partner copy's cost per save, on two nodes (two processes, one gloo rank each, each with
   its own memory root, ``--replica``): each node writes half of the state and commits; the
   partner copy (sending its half to the other node and receiving, writing and verifying the
   other's) runs on the saver's background thread after the commit. Its time per save against
   two baselines between the same two processes: a bare gloo exchange of the same bytes between
   buffers used before (the link's floor), and a plain copy (the same exchange into a new
   buffer, written to a file in tmpfs: what any copy into the other node's memory does). On one
   machine the "network" is loopback: a real link adds its own time to all three.

Each figure is the median of several repetitions in the same run; the ratios are the result.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from _checks import require

from cycler.checkpoint.memory_roots import memory_root
from cycler.protocol.environment import ENV_MEMORY_TIER, ENV_PERSIST_EVERY

SHM = Path("/dev/shm")


def state_of(size_mb: int) -> dict[str, torch.Tensor]:
    parts = 8
    each = size_mb * (1 << 20) // 4 // parts
    return {f"layer{i}": torch.randn(each) for i in range(parts)}


def with_memory_tier(base: Path, durable: Path, every: int = 1000) -> None:
    """The memory tier as ``cycle run`` hands it to workers: the job's memory root."""
    os.environ[ENV_MEMORY_TIER] = str(memory_root(base, durable))
    os.environ[ENV_PERSIST_EVERY] = str(every)


def without_memory_tier() -> None:
    os.environ.pop(ENV_MEMORY_TIER, None)
    os.environ.pop(ENV_PERSIST_EVERY, None)


def commit_figures(size_mb: int, repeats: int) -> tuple[float, float]:
    from cycler import AtomicDirectory

    state = state_of(size_mb)
    plain, tiered = [], []
    with tempfile.TemporaryDirectory(dir=SHM, ignore_cleanup_errors=True) as shm, \
            tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as disk:
        with_memory_tier(Path(shm), Path(disk) / "root")
        saver = AtomicDirectory(Path(disk) / "root", keep_last=2)
        for repeat in range(repeats + 1):
            started = time.perf_counter()
            torch.save(state, Path(shm) / f"plain-{repeat}.pt")
            plain.append(time.perf_counter() - started)
            os.unlink(Path(shm) / f"plain-{repeat}.pt")
            started = time.perf_counter()
            directory = Path(saver.prepare_checkpoint_directory())
            torch.save(state, directory / "model.pt")
            saver.symlink_latest(directory, metadata={"step": repeat})
            tiered.append(time.perf_counter() - started)
        del saver
        without_memory_tier()
    return statistics.median(plain[1:]), statistics.median(tiered[1:])


def stall_figures(size_mb: int, repeats: int) -> dict[str, float]:
    from cycler import AtomicDirectory

    state = state_of(size_mb)
    stalls: dict[str, list[float]] = {"disk async": [], "memory sync": [], "memory async": []}
    with tempfile.TemporaryDirectory(dir=SHM, ignore_cleanup_errors=True) as shm, \
            tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as disk:
        for label in stalls:
            root = Path(disk) / label.replace(" ", "-")
            if label.startswith("memory"):
                with_memory_tier(Path(shm), root)
            else:
                without_memory_tier()
            saver = AtomicDirectory(root, keep_last=2)
            for _ in range(repeats + 1):
                started = time.perf_counter()
                saver.save(state, asynchronous=label.endswith("async"))
                stalls[label].append(time.perf_counter() - started)
                saver.wait()
            del saver
        without_memory_tier()
    return {label: statistics.median(times[1:]) for label, times in stalls.items()}


WORKER = """
import os, sys, time, torch
from pathlib import Path
from cycler import AtomicDirectory
every, root = int(sys.argv[1]), sys.argv[2]
saver = AtomicDirectory(root, keep_last=2)
latest = saver.latest_checkpoint()
step = 0 if latest is None else torch.load(Path(latest) / "state.pt")["step"]
state = {"w": torch.randn(1 << 18)}
print("ready", flush=True)
while True:
    time.sleep(0.02)
    step += 1
    print(step, flush=True)
    if step % every == 0:
        directory = Path(saver.prepare_checkpoint_directory())
        torch.save({"step": step, **state}, directory / "state.pt")
        saver.symlink_latest(directory, metadata={"step": step})
"""

RESUME_STEP = """
import sys, torch
from pathlib import Path
from cycler import AtomicDirectory
latest = AtomicDirectory(sys.argv[1]).latest_checkpoint()
print(0 if latest is None else torch.load(Path(latest) / "state.pt")["step"])
"""


def lost_work(every: int, crashes: int, tier: Path | None, persist_every: int,
              rng: random.Random) -> float:
    """Median steps lost per SIGKILL at a random moment (one fresh root per crash)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CYCLER_")}
    lost = []
    for crash in range(crashes):
        with tempfile.TemporaryDirectory() as disk:
            root = Path(disk) / "root"
            if tier is not None:
                env.update({ENV_MEMORY_TIER: str(memory_root(tier, root)),
                            ENV_PERSIST_EVERY: str(persist_every)})
            worker = subprocess.Popen([sys.executable, "-c", WORKER, str(every), str(root)],
                                      stdout=subprocess.PIPE, text=True, env=env)
            assert worker.stdout is not None and worker.stdout.readline() == "ready\n"
            time.sleep(rng.uniform(3.0, 6.0))
            worker.send_signal(signal.SIGKILL)
            worker.wait()
            done = max(int(line) for line in worker.stdout.read().split() or ["0"])
            resumed = int(subprocess.run([sys.executable, "-c", RESUME_STEP, str(root)],
                                         capture_output=True, text=True, env=env,
                                         check=True).stdout)
            run = f"crash {crash + 1} " + ("with the memory tier" if tier else "disk only")
            require(done > 0, run, "made no step before the kill")
            require(0 <= resumed <= done, run, f"resumes at step {resumed} after {done} steps")
            lost.append(done - resumed)
            if tier is not None:
                shutil.rmtree(memory_root(tier, root), ignore_errors=True)
        print(f"    crash {crash + 1}: lost {lost[-1]} steps", flush=True)
    return statistics.median(lost)


def _replica_rank(rank: int, size_mb: int, repeats: int, port: int, base: str,
                  results: Any) -> None:
    import torch.distributed as dist

    from cycler import AtomicDirectory

    os.environ.update(WORLD_SIZE="2", RANK=str(rank), LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
                      GROUP_RANK=str(rank))
    with_memory_tier(Path(base) / f"node{rank}", Path(base) / "root")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2)
    half = state_of(size_mb // 2 or 1)
    saver = AtomicDirectory(Path(base) / "root", keep_last=2)
    bare, plain, commits, copies = [], [], [], []
    data = torch.frombuffer(bytearray(os.urandom(1 << 20)) * (size_mb // 2 or 1),
                            dtype=torch.uint8)
    received = torch.empty_like(data)
    for repeat in range(repeats + 1):
        dist.barrier()
        started = time.perf_counter()
        works = [dist.isend(data, 1 - rank), dist.irecv(received, 1 - rank)]
        for work in works:
            assert work is not None
            work.wait()
        bare.append(time.perf_counter() - started)
        dist.barrier()
        started = time.perf_counter()
        fresh = torch.empty_like(data)
        works = [dist.isend(data, 1 - rank), dist.irecv(fresh, 1 - rank)]
        for work in works:
            assert work is not None
            work.wait()
        with open(Path(base) / f"plain-{rank}", "wb") as written:
            written.write(memoryview(fresh.numpy()))
        del fresh
        plain.append(time.perf_counter() - started)
        os.unlink(Path(base) / f"plain-{rank}")
        dist.barrier()
        started = time.perf_counter()
        directory = Path(saver.prepare_checkpoint_directory())
        torch.save(half, directory / f"rank-{rank}.pt")
        saver.symlink_latest(directory, metadata={"step": repeat})
        committed = time.perf_counter()
        saver.wait_for_persisting()
        commits.append(committed - started)
        copies.append(time.perf_counter() - committed)
    if rank == 0:
        results.put((statistics.median(bare[1:]), statistics.median(plain[1:]),
                     statistics.median(commits[1:]), statistics.median(copies[1:])))
    saver.wait_for_persisting()
    dist.destroy_process_group()


def replica_figures(size_mb: int, repeats: int) -> tuple[float, float, float, float]:
    """(bare exchange, plain copy, commit, partner copy) in seconds, medians, two nodes on
    loopback."""
    import torch.multiprocessing as mp

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "integration"))
    from gloo_ranks import free_port

    context = mp.get_context("spawn")
    results = context.Queue()
    with tempfile.TemporaryDirectory(dir=SHM) as base:
        mp.start_processes(_replica_rank, args=(size_mb, repeats, free_port(), base, results),
                           nprocs=2, join=True, start_method="spawn")
        figures: tuple[float, float, float, float] = results.get()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes-mb", default="100,1000")
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--crashes", type=int, default=12)
    parser.add_argument("--every", type=int, default=10, help="N: steps between memory saves")
    parser.add_argument("--persist-every", type=int, default=5, help="K")
    parser.add_argument("--replica", action="store_true",
                        help="only the partner copy's cost per save (two nodes on loopback)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.replica:
        for size in (int(s) for s in args.sizes_mb.split(",")):
            bare, plain, commit, copy = replica_figures(size, args.repeats)
            print(f"{size} MB on two nodes (half each): commit {commit * 1000:.0f} ms; partner "
                  f"copy in the background {copy * 1000:.0f} ms ({size / 2 / copy:.0f} MB/s "
                  f"each way): {copy / plain:.2f}x a plain copy ({plain * 1000:.0f} ms), "
                  f"{copy / bare:.2f}x a bare exchange ({bare * 1000:.0f} ms)", flush=True)
        return
    for size in (int(s) for s in args.sizes_mb.split(",")):
        plain, tiered = commit_figures(size, args.repeats)
        print(f"{size} MB commit: plain torch.save into tmpfs {plain * 1000:.0f} ms, memory "
              f"tier {tiered * 1000:.0f} ms: {tiered / plain:.2f}x (goal <= 1.2)", flush=True)
        stalls = stall_figures(size, args.repeats)
        base = stalls["disk async"]
        print(f"{size} MB stall: " + ", ".join(
            f"{label} {value * 1000:.0f} ms ({value / base:.2f}x)"
            for label, value in stalls.items()) + " (goal: memory <= 1.0x disk async)",
            flush=True)
    rng = random.Random(18)
    n, k = args.every, args.persist_every
    print(f"lost work, disk only, a save every {n * k} steps:")
    disk = lost_work(n * k, args.crashes, None, k, rng)
    print(f"lost work, memory tier, a save every {n} steps, persisted every {k}th:")
    with tempfile.TemporaryDirectory(dir=SHM) as shm:
        memory = lost_work(n, args.crashes, Path(shm), k, rng)
    print(f"median steps lost per crash: disk only {disk:.0f}, memory tier {memory:.0f}: "
          f"{disk / max(memory, 0.5):.1f}x less (goal >= 5x); the same durable bytes written")


if __name__ == "__main__":
    main()
