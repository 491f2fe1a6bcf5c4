"""Whether workers ever hang at their exit: many starts of a DDP script that never imports cycler.

An unadopted DDP script (gloo, 2 ranks, a few steps; every other start calls
``destroy_process_group`` at its end, the others leave the group to the exit) runs under
``cycle run`` ``--starts`` times, forked workers (the default) or ``--cycle-args
--no-fork-workers``. A start that has not ended ``--timeout`` seconds after it began is a hang:
its workers' stacks are dumped (py-spy, where installed) into the work directory, its tree is
killed, and it is counted where it stopped: before both ranks' first step (a start that hung),
in training, or past both ranks' last line (an exit that hung). Each start's wall time is
printed at the end (median, worst).

    python benchmarks/bench_worker_exit.py [--starts 200] [--timeout 90] [--cycle-args ...]
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

DDP_SCRIPT = """\
import os, sys
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

dist.init_process_group("gloo")
model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(),
                                                    torch.nn.Linear(64, 1)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(20):
    optimizer.zero_grad()
    model(torch.randn(32, 64)).sum().backward()
    optimizer.step()
    if step == 0:
        print(f"rank {os.environ['RANK']} stepped", flush=True)
if sys.argv[1] == "destroy":
    dist.destroy_process_group()
print(f"rank {os.environ['RANK']} done", flush=True)
"""


def start_once(work: Path, number: int, args: argparse.Namespace) -> tuple[float, int | None]:
    """One ``cycle run`` of the script: its wall time and exit code (``None``: it hung)."""
    ending = "destroy" if number % 2 else "leave"
    command = [sys.executable, "-m", "cycler_cli", "run", "--nproc-per-node", "2",
               "--max-restarts", "0", "--checkpoint-dir", str(work / "ck"),
               *args.cycle_args.split(), str(work / "ddp.py"), ending]
    started = time.monotonic()
    with open(work / "last.log", "wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=work)
        try:
            code: int | None = process.wait(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            code = None
            dump_and_kill(process, work / f"hang-{number}")
    return time.monotonic() - started, code


def dump_and_kill(process: subprocess.Popen[bytes], prefix: Path) -> None:
    """The stacks of every process under ``process`` (py-spy), then SIGKILL to them all."""
    tree = [psutil.Process(process.pid), *psutil.Process(process.pid).children(recursive=True)]
    spy = shutil.which("py-spy")
    for member in tree:
        if spy is not None:
            with open(f"{prefix}-{member.pid}.txt", "wb") as out:
                subprocess.run([spy, "dump", "--native", "--pid", str(member.pid)], stdout=out,
                               stderr=subprocess.STDOUT, timeout=60, check=False)
    for member in tree:
        try:
            member.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass
    process.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=200)
    parser.add_argument("--timeout", type=float, default=180.0)
    parser.add_argument("--cycle-args", default="", help="more options (--no-fork-workers)")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="cycler-exit-"))
    (work / "ddp.py").write_text(DDP_SCRIPT)
    walls, hangs, slow, unstarted, failures = [], [], [], [], []
    for number in range(args.starts):
        wall, code = start_once(work, number, args)
        walls.append(wall)
        if code is None:
            said = (work / "last.log").read_text(errors="replace")
            finished = all(f"rank {rank} done" in said for rank in (0, 1))
            stepped = all(f"rank {rank} stepped" in said for rank in (0, 1))
            (hangs if finished else slow if stepped else unstarted).append(number)
            os.replace(work / "last.log", work / f"hung-{number}.log")
        elif code != 0:
            failures.append((number, code))
            os.replace(work / "last.log", work / f"failed-{number}.log")
        shutil.rmtree(work / "ck", ignore_errors=True)
        print(f"start {number}: {'hung' if code is None else code} after {wall:.1f} s",
              flush=True)
    import torch

    print(f"torch {torch.__version__}, {args.starts} starts ({args.cycle_args or 'forked'}): "
          f"{len(unstarted)} hung before their first step {unstarted}, {len(slow)} in training "
          f"{slow}, {len(hangs)} at their exit {hangs}, {len(failures)} failed {failures}; "
          f"wall median "
          f"{statistics.median(walls):.1f} s, worst {max(walls):.1f} s; load "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; work {work}")
    if not args.keep and not hangs and not slow and not unstarted and not failures:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
