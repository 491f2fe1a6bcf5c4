"""What a worker crash costs, forked workers against fresh ones: kill -9 to the next first step.

``examples/train.py`` on 2 gloo ranks under ``cycle run`` (``--restart-delay 0``: the restart's
own cost, no backoff), once with forked workers (the default) and once with
``--no-fork-workers``, in rounds whose order alternates (forked first, then fresh first: a load
that drifts weighs on both). In each run, ``--kills`` times: once the workers made their first
step and committed a checkpoint, rank 1's worker is killed with SIGKILL (its pid from its
beacon), and the restart's cost is the time from the kill to the restarted workers' first step
(the ``first_step`` event's ``at``: the last rank's first step, every collective waits for it).
It covers torchrun's noticing the death and ending the other rank, the new workers' start
(fork, or a fresh interpreter importing torch), the process group, the checkpoint's load.

    python benchmarks/bench_restart_cost.py [--rounds 2] [--kills 3] [--checkpoint-every 20]

Prints each restart, then per variant the median and the gain a fork makes per restart
(fresh median - forked median, and their ratio), all from the same invocation.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
from _checks import duration, events_since, fail, require

from cycler.protocol.progress import read_beacons

REPOSITORY = Path(__file__).resolve().parents[1]
SCRIPT = REPOSITORY / "examples" / "train.py"
VARIANTS = {"forked": [], "fresh": ["--no-fork-workers"]}


def run_with_kills(scratch: Path, variant: str, args: argparse.Namespace) -> list[float]:
    """One ``cycle run`` of the example, its rank 1 killed ``--kills`` times: each restart's
    seconds from the kill to the restarted workers' first step."""
    root = scratch / f"ck-{variant}-{time.monotonic_ns()}"
    command = [sys.executable, "-m", "cycler_cli", "run", "--nproc-per-node", "2",
               "--checkpoint-dir", str(root), "--restart-delay", "0",
               "--max-restarts", str(args.kills + 2), *VARIANTS[variant], str(SCRIPT),
               "--epochs", "1000", "--samples", "4096",
               "--checkpoint-every", str(args.checkpoint_every), "--step-delay", "0.02"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "CYCLER_"))}
    costs = []
    with open(scratch / f"{variant}.log", "ab") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env,
                                   cwd=REPOSITORY, start_new_session=True)
        try:
            since = time.time()
            for _ in range(args.kills):
                wait_for(root, since, "first_step", process, variant, args.timeout)
                wait_for(root, since, "checkpoint_committed", process, variant, args.timeout)
                killed_at = kill_rank_1(process, variant)
                restarted = wait_for(root, killed_at, "first_step", process, variant,
                                     args.timeout)
                costs.append(duration(killed_at, float(restarted["at"]), variant,
                                      "kill to first step"))
                print(f"{variant}: restart {len(costs)}: {costs[-1]:.2f} s", flush=True)
                since = killed_at
        finally:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    return costs


def wait_for(root: Path, since: float, kind: str, process: subprocess.Popen[bytes],
             variant: str, timeout: float) -> dict[str, Any]:
    """The first ``kind`` event recorded at or after ``since`` (wall clock)."""
    deadline = time.monotonic() + timeout
    while True:
        found = events_since(root, since, kind)
        if found:
            return found[0]
        require(process.poll() is None, variant, f"cycle run exited {process.returncode} "
                f"before its {kind} event")
        require(time.monotonic() < deadline, variant, f"no {kind} event in {timeout:g} s")
        time.sleep(0.02)


def kill_rank_1(process: subprocess.Popen[bytes], variant: str) -> float:
    """SIGKILL to rank 1's worker (its pid from the beacons, in the job's runtime directory on
    the node: ``$CYCLER_PROGRESS_DIR`` of torchrun's agent); the wall time of the kill."""
    beacons = {r.rank: r.pid for r in read_beacons(progress_dir(process, variant))}
    require(1 in beacons, variant, "rank 1 has no beacon to find its pid")
    killed_at = time.time()
    os.kill(beacons[1], signal.SIGKILL)
    return killed_at


def progress_dir(process: subprocess.Popen[bytes], variant: str) -> Path:
    """The beacons' directory the job's torchrun agent hands its workers."""
    for child in psutil.Process(process.pid).children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if "cycler.supervisor.launch.launcher" in " ".join(child.cmdline()):
                return Path(child.environ()["CYCLER_PROGRESS_DIR"])
    fail(variant, "no torchrun agent with a beacons' directory under cycle run")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--kills", type=int, default=3, help="restarts timed per run")
    parser.add_argument("--checkpoint-every", type=int, default=20,
                        help="steps between checkpoints (1: the surviving rank is in a save, "
                             "shielded from SIGTERM, when the other is killed)")
    parser.add_argument("--timeout", type=float, default=300.0,
                        help="seconds any one wait may take before the run counts as bad")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args()
    costs: dict[str, list[float]] = {name: [] for name in VARIANTS}
    with tempfile.TemporaryDirectory(prefix="bench-restart-cost-") as scratch:
        for number in range(args.rounds):
            order = list(VARIANTS) if number % 2 == 0 else list(reversed(VARIANTS))
            for variant in order:
                costs[variant] += run_with_kills(Path(scratch), variant, args)
    forked, fresh = (statistics.median(costs[name]) for name in VARIANTS)
    figures = {"restarts": costs, "forked_median_s": round(forked, 2),
               "fresh_median_s": round(fresh, 2), "gain_per_restart_s": round(fresh - forked, 2),
               "fresh_over_forked": round(fresh / forked, 2),
               "load_1min": round(os.getloadavg()[0], 1)}
    print(f"kill -9 to first step, median of {len(costs['forked'])}: forked {forked:.2f} s, "
          f"fresh {fresh:.2f} s; a fork saves {fresh - forked:.2f} s a restart "
          f"({fresh / forked:.2f}x); load {figures['load_1min']}")
    print(json.dumps(figures))
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
