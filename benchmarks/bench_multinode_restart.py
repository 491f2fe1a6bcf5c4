"""Coordinated restart: a worker's SIGKILL to training again on every node, two simulated hosts
against one node.

Goal (issue 10): the two-node figure within 2x the one-node figure, and far under any collective
or rendezvous timeout (NCCL 10 min, torchrun's join 10 min).

    python benchmarks/bench_multinode_restart.py [--repeats 3]

Both jobs have two ranks running the same small DDP script (gloo, CPU) that commits a
checkpoint every 20 steps and writes ``time pid step`` per step to a file per rank:
- one node: ``cycle run --nproc-per-node 2``; the supervisor restarts torchrun (after its
  default 1 s ``--restart-delay``);
- two nodes: ``cycle run --nnodes 2`` in two network namespaces joined by a veth pair (one rank
  each); torchrun's agents restart both nodes' workers through the c10d rendezvous.
Rank 1's worker is killed with SIGKILL once training is steady; the figure is the time from the
kill until *every* rank has finished a step in a new process. Needs root and iproute2 for the
two-node half (tests/netns/hosts.py makes the hosts).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "netns"))
from _checks import skip  # noqa: E402
from hosts import Host, two_hosts, unavailable  # noqa: E402

WORKER = """\
import os, sys, time
import torch, torch.distributed as dist
from cycler import AtomicDirectory
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(256, 256))
saver = AtomicDirectory(os.environ["CYCLER_CHECKPOINT_DIR"], keep_last=2)
step = 0
latest = saver.latest_checkpoint()
if latest is not None:
    state = torch.load(os.path.join(latest, "model.pt"), weights_only=True)
    model.module.load_state_dict(state["model"]); step = state["step"]
log = open(os.path.join(sys.argv[1], f"steps-{rank}"), "a", buffering=1)
while step < 100000:
    model(torch.randn(32, 256)).sum().backward()
    time.sleep(0.02)
    step += 1
    log.write(f"{time.time()} {os.getpid()} {step}\\n")
    if step % 20 == 0:
        path = saver.prepare_checkpoint_directory()
        if rank == 0:
            torch.save({"model": model.module.state_dict(), "step": step},
                       os.path.join(path, "model.pt"))
        saver.symlink_latest(path)
"""


def steps(out: Path, rank: int) -> list[tuple[float, int]]:
    path = out / f"steps-{rank}"
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(ValueError):
            stamp, pid, _ = line.split()
            rows.append((float(stamp), int(pid)))
    return rows


def wait_steady(out: Path, ranks: int, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not all(len(steps(out, rank)) >= 40 for rank in range(ranks)):
        if time.monotonic() > deadline:
            raise SystemExit("training never became steady")
        time.sleep(0.2)


def back_in_training(out: Path, ranks: int, killed_at: float, timeout: float = 120.0) -> float:
    """Seconds from the kill until every rank finished a step in a process started after it."""
    old = {rank: {pid for _, pid in steps(out, rank)} for rank in range(ranks)}
    deadline = time.monotonic() + timeout
    while True:
        firsts = []
        for rank in range(ranks):
            new = [stamp for stamp, pid in steps(out, rank) if pid not in old[rank]]
            firsts.append(min(new) if new else None)
        if all(first is not None for first in firsts):
            return max(first for first in firsts if first is not None) - killed_at
        if time.monotonic() > deadline:
            tails = [path.read_text(errors="replace")[-3000:]
                     for path in sorted(out.glob("output-node*"))]
            raise SystemExit("not training again after the kill:\n" + "\n".join(tails))
        time.sleep(0.1)


def kill_worker(pid: int) -> float:
    os.kill(pid, signal.SIGKILL)
    return time.time()


def latest_pid(out: Path, rank: int) -> int:
    return steps(out, rank)[-1][1]


def cycle_command(work: Path, *flags: str) -> list[str]:
    return [sys.executable, "-m", "cycler_cli", "run", "--checkpoint-dir", str(work / "ck"),
            "--no-requeue", *flags, str(work / "worker.py"), str(work)]


def end(processes: list[subprocess.Popen[bytes]]) -> None:
    for process in processes:
        with contextlib.suppress(psutil.Error):
            for child in psutil.Process(process.pid).children(recursive=True):
                child.kill()
        process.kill()
        process.wait()


def one_node(work: Path) -> float:
    environment = {**os.environ, "OMP_NUM_THREADS": "1"}
    with (work / "output-node0").open("wb") as output:
        process = subprocess.Popen(cycle_command(work, "--nproc-per-node", "2"),
                                   env=environment, stdout=output, stderr=subprocess.STDOUT)
    try:
        wait_steady(work, 2)
        killed_at = kill_worker(latest_pid(work, 1))
        return back_in_training(work, 2, killed_at)
    finally:
        end([process])


def two_nodes(work: Path, hosts: tuple[Host, Host], port: int) -> float:
    processes = []
    for rank, host in enumerate(hosts):
        environment = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": host.interface}
        command = host.command(*cycle_command(
            work, "--nnodes", "2", "--node-rank", str(rank), "--master-addr", hosts[0].address,
            "--master-port", str(port), "--local-addr", host.address))
        with (work / f"output-node{rank}").open("wb") as output:
            processes.append(subprocess.Popen(command, env=environment, stdout=output,
                                              stderr=subprocess.STDOUT, cwd=REPO))
    try:
        wait_steady(work, 2)
        killed_at = kill_worker(latest_pid(work, 1))
        return back_in_training(work, 2, killed_at)
    finally:
        end(processes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    arguments = parser.parse_args()
    reason = unavailable()
    if reason is not None:
        skip(f"two simulated hosts unavailable: {reason}")
    single, double = [], []
    with two_hosts() as hosts, tempfile.TemporaryDirectory() as scratch:
        for repeat in range(arguments.repeats):
            for name, figures in (("one", single), ("two", double)):
                work = Path(scratch) / f"{name}-{repeat}"
                work.mkdir()
                (work / "worker.py").write_text(WORKER)
                if name == "one":
                    figures.append(one_node(work))
                else:
                    figures.append(two_nodes(work, hosts, 29300 + repeat))
                print(f"{name} node(s), run {repeat}: {figures[-1]:.2f} s", flush=True)
    best_one, best_two = min(single), min(double)
    print(f"one node:  median {statistics.median(single):.2f} s, best {best_one:.2f} s")
    print(f"two nodes: median {statistics.median(double):.2f} s, best {best_two:.2f} s")
    print(f"ratio (median): {statistics.median(double) / statistics.median(single):.2f}x "
          "(goal <= 2x)")


if __name__ == "__main__":
    main()
