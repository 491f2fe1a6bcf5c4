"""The checkpoint interval: work lost plus save stall per hour, ``every_steps="auto"`` against fixed
intervals, under kills at a given rate.

The sweep runs the real ``StepControl`` (the auto interval's own code: its stall measurement, its
events log read at every restart) on a simulated clock: steps of ``--step-seconds``, a save that
blocks the loop ``C`` seconds, kills (kill -9 of the whole job: the work since the last committed
checkpoint is lost) at exponential times at ``--kills-per-hour`` per hour of wall time, and a
restart of ``--restart`` seconds after each, logged in an events log as ``cycle run`` logs it.
Each policy sees the same kill times (the same seed). Per hour of wall time: the save stall,
the work lost, their sum, and Young's prediction for that interval ``3600 (C/T + T/2M)``.

    python benchmarks/bench_checkpoint_interval.py                    # the sweep, about a minute
    python benchmarks/bench_checkpoint_interval.py --real             # plus the real run

``--real`` checks the model on real processes: ``cycle run`` of a small worker (steps of 10 ms,
a real ``AtomicDirectory`` save blocking about ``--real-stall`` s), killed with SIGKILL (the
whole job) at exponential times of mean ``--real-mtbf`` s and run again until ``--real-seconds``
of wall time passed, with the auto interval and with fixed ones. The work lost comes from
``cycle status``'s figures (``redone``), the stall from the workers' own stopwatch; the model
predicts half an interval lost per kill (less where kills hit a restart, which loses nothing).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import math
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from cycler import AutoInterval, StepControl
from cycler.protocol.events import EventLog, read_events
from cycler.protocol.goodput import goodput
from cycler.training.auto_interval import daly_interval

FIXED_MINUTES = (1, 5, 15, 30, 60)
EPOCH = 1.8e9
"""The simulated events' wall-clock origin."""


class SimulatedClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Outcome:
    wall: float = 0.0
    stall: float = 0.0
    lost: float = 0.0
    saves: int = 0
    kills: int = 0

    def per_hour(self, seconds: float) -> float:
        return 3600.0 * seconds / self.wall if self.wall else 0.0


@dataclass(frozen=True)
class Job:
    stall: float
    kills_per_hour: float
    hours: float
    step_seconds: float
    restart: float
    seed: int


class Simulation:
    """One policy on one job: runs (a StepControl each) cut by kills until ``hours`` of wall."""

    def __init__(self, job: Job, policy: Any, directory: Path) -> None:
        self.job, self.policy = job, policy
        self.clock = SimulatedClock()
        self.rng = random.Random(job.seed)
        self.control_file = directory / ".cycler" / "control-node0.json"
        self.log = EventLog(directory / ".cycler" / "events-node0.jsonl",
                            clock=lambda: EPOCH + self.clock.now)
        self.outcome = Outcome()
        self.committed = 0

    def next_kill(self) -> float:
        rate = self.job.kills_per_hour / 3600.0
        return self.clock.now + (self.rng.expovariate(rate) if rate > 0 else math.inf)

    def run(self) -> Outcome:
        end, killed = self.job.hours * 3600.0, None
        while self.clock.now < end:
            newest = self.one_run(end, killed, self.next_kill())
            if self.clock.now >= end:
                break
            self.outcome.kills += 1
            self.outcome.lost += (newest - self.committed) * self.job.step_seconds
            killed = (self.clock.now, newest)
            self.clock.now += self.job.restart
        self.outcome.wall = self.clock.now
        return self.outcome

    def one_run(self, end: float, killed: tuple[float, int] | None, kill_at: float) -> int:
        """Steps until the kill or the end; the newest step done."""
        self.log.append("start")
        if killed is not None:
            self.log.append("last_progress", at=EPOCH + killed[0], step=killed[1])
        self.log.append("workers_started")
        control = StepControl(every_steps=self.policy, control_file=self.control_file,
                              clock=self.clock)
        control.load_state_dict({"version": 1, "global_step": self.committed})
        newest, first = self.committed, True
        while self.clock.now < end:
            self.clock.now += self.job.step_seconds
            decision = control.step()
            if first:
                self.log.append("first_step", at=EPOCH + self.clock.now, step=decision.step,
                                resumed=self.committed)
                first = False
            if self.clock.now >= kill_at:
                return newest
            newest = decision.step
            if decision.checkpoint:
                self.clock.now += self.job.stall
                self.outcome.stall += self.job.stall
                if self.clock.now >= kill_at:
                    return newest  # killed during the save: it never committed
                self.committed = decision.step
                self.outcome.saves += 1
        return newest


def simulate(job: Job, policy: Any) -> Outcome:
    with tempfile.TemporaryDirectory() as directory, \
            contextlib.redirect_stderr(io.StringIO()):  # the interval's own log lines
        (Path(directory) / ".cycler").mkdir()
        return Simulation(job, policy, Path(directory)).run()


def young_cost_per_hour(stall: float, interval: float, mtbf: float) -> float:
    """Young's first-order model: the stall once per interval, half an interval per failure."""
    return 3600.0 * (stall / interval + interval / (2.0 * mtbf))


def sweep(args: argparse.Namespace) -> None:
    print(f"simulated: {args.hours:g} h of wall per policy, steps of {args.step_seconds:g} s, "
          f"restart {args.restart:g} s, seeds {args.seeds}")
    print("| save stall C | kills per hour | policy | saves | kills | stall s/h | lost s/h "
          "| lost + stall s/h | Young's model s/h |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for stall in args.stalls:
        for rate in args.rates:
            one_configuration(args, stall, rate)


def one_configuration(args: argparse.Namespace, stall: float, rate: float) -> None:
    mtbf = 3600.0 / rate
    best = daly_interval(stall, mtbf) + stall
    policies: list[tuple[str, Any, float]] = [
        (f"every {m} min", round(m * 60 / args.step_seconds), m * 60.0 + stall)
        for m in FIXED_MINUTES]
    policies.append(("auto", AutoInterval(), best))
    for name, policy, interval in policies:
        outcomes = [simulate(Job(stall, rate, args.hours, args.step_seconds, args.restart, seed),
                             policy) for seed in range(args.seeds)]
        total = Outcome(wall=sum(o.wall for o in outcomes), stall=sum(o.stall for o in outcomes),
                        lost=sum(o.lost for o in outcomes), saves=sum(o.saves for o in outcomes),
                        kills=sum(o.kills for o in outcomes))
        shown = f"auto (optimum {best:.0f} s)" if name == "auto" else name
        print(f"| {stall:g} s | {rate:g} | {shown} | {total.saves} | {total.kills} "
              f"| {total.per_hour(total.stall):.0f} | {total.per_hour(total.lost):.0f} "
              f"| **{total.per_hour(total.stall + total.lost):.0f}** "
              f"| {young_cost_per_hour(stall, interval, mtbf):.0f} |", flush=True)


REAL_WORKER = r'''
import os, sys, time
from pathlib import Path
import torch
from cycler import AtomicDirectory, AutoInterval, StepControl

every = sys.argv[1]
stall = float(sys.argv[2])
out = Path(sys.argv[3])
policy = AutoInterval(min_seconds=0.2, mtbf_prior=float(sys.argv[4])) if every == "auto" \
    else int(every)
saver = AtomicDirectory(os.environ["CYCLER_CHECKPOINT_DIR"])
control = StepControl(every_steps=policy)
latest = saver.latest_checkpoint()
if latest is not None:
    control.load_state_dict(torch.load(Path(latest, "state.pt"))["control"])
state = {"weights": torch.zeros(256 * 1024)}
with open(out, "a") as stalls:
    while True:
        time.sleep(0.01)
        decision = control.step()
        if decision.checkpoint:
            began = time.monotonic()
            path = saver.prepare_checkpoint_directory()
            torch.save({**state, "control": control.state_dict()}, Path(path, "state.pt"))
            time.sleep(stall)
            saver.symlink_latest(path, {"step": decision.step})
            stalls.write(f"{time.monotonic() - began}\n")
            stalls.flush()
        if decision.stop:
            break
'''


def real_run(args: argparse.Namespace, every: str, directory: Path) -> dict[str, float]:
    """``cycle run`` of the worker, killed at exponential times, until the wall time is over."""
    root, stalls, script = directory / "ck", directory / "stalls", directory / "worker.py"
    script.write_text(REAL_WORKER)
    rng, began = random.Random(args.real_seed), time.monotonic()
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "CYCLER_"))}
    while time.monotonic() - began < args.real_seconds:
        job = subprocess.Popen(
            [sys.executable, "-m", "cycler_cli", "run", "--no-requeue", "--checkpoint-dir",
             str(root), str(script), every, str(args.real_stall), str(stalls),
             str(args.real_prior)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            env={**environment, "OMP_NUM_THREADS": "1"})
        time.sleep(min(rng.expovariate(1 / args.real_mtbf),
                       max(args.real_seconds - (time.monotonic() - began), 0.1)))
        for process in [*psutil.Process(job.pid).children(recursive=True), job]:
            with contextlib.suppress(ProcessLookupError, psutil.Error):
                os.kill(process.pid, signal.SIGKILL)
        job.wait()
    figures = goodput(read_events(root / ".cycler" / "events-node0.jsonl"))
    measured = [float(line) for line in stalls.read_text().split()] if stalls.exists() else []
    intervals = [e for e in read_events(root / ".cycler" / "events-node0.jsonl")
                 if e.get("event") == "checkpoint_interval" and "stall" in e]
    return {"wall": figures.wall, "kills": figures.count("kill"), "redone": figures.redone,
            "stall": sum(measured), "saves": len(measured),
            "median_stall": statistics.median(measured) if measured else 0.0,
            "training": figures.training,
            "auto_seconds": intervals[-1]["seconds"] if intervals else float("nan")}


def real(args: argparse.Namespace) -> None:
    print(f"\nreal: cycle run killed every {args.real_mtbf:g} s on average, "
          f"{args.real_seconds:g} s of wall each, save blocking {args.real_stall:g} s + the write, "
          f"auto's prior {args.real_prior:g} s")
    print("| policy | kills | saves | median stall | interval T | lost per kill | T/2 "
          "| stall s/h | lost s/h | lost + stall s/h |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for every in ("auto", *map(str, args.real_fixed)):
        with tempfile.TemporaryDirectory() as directory:
            found = real_run(args, every, Path(directory))
        hours = found["wall"] / 3600.0
        interval = found["training"] / max(found["saves"], 1)
        print(f"| {every} | {found['kills']:.0f} | {found['saves']:.0f} "
              f"| {found['median_stall']:.3f} s | {interval:.2f} s "
              f"| {found['redone'] / max(found['kills'], 1):.2f} s | {interval / 2:.2f} s "
              f"| {found['stall'] / hours:.0f} | {found['redone'] / hours:.0f} "
              f"| **{(found['stall'] + found['redone']) / hours:.0f}** |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stalls", type=float, nargs="+", default=[5.0, 60.0])
    parser.add_argument("--rates", type=float, nargs="+", default=[0.25, 1.0, 4.0],
                        help="kills per hour of wall time")
    parser.add_argument("--hours", type=float, default=100.0)
    parser.add_argument("--step-seconds", type=float, default=2.0)
    parser.add_argument("--restart", type=float, default=60.0)
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--real", action="store_true", help="the real run too")
    parser.add_argument("--real-only", action="store_true", help="the real run alone")
    parser.add_argument("--real-seconds", type=float, default=150.0)
    parser.add_argument("--real-mtbf", type=float, default=20.0)
    parser.add_argument("--real-stall", type=float, default=0.2)
    parser.add_argument("--real-fixed", type=int, nargs="+", default=[50, 1000],
                        help="fixed intervals, in steps (10 ms each)")
    parser.add_argument("--real-prior", type=float, default=60.0,
                        help="the auto interval's mtbf_prior (s)")
    parser.add_argument("--real-seed", type=int, default=0)
    args = parser.parse_args()
    if not args.real_only:
        sweep(args)
    if args.real or args.real_only:
        real(args)


if __name__ == "__main__":
    main()
