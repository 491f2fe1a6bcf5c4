"""The auto checkpoint interval on real processes: a real save made slower mid-run lengthens it,
two ranks under ``cycle run`` checkpoint at the same steps, and a job killed again and again
(kill -9 of the whole job) checkpoints more often after each rerun reads its failures, resuming
bit-identically from checkpoints taken at the steps the interval chose."""

from __future__ import annotations

import json
import os
import signal
import statistics
import time
from pathlib import Path

import pytest
import torch
from cycle_jobs import Job, wait_for

from cycler import AutoInterval, StepControl, atomic_torch_save
from cycler.protocol.events import read_events
from cycler.protocol.exit_codes import EXIT_SUCCESS

WORKER = r'''
import argparse, os, sys, time
from pathlib import Path

import torch
import torch.distributed as dist

from cycler import AtomicDirectory, AutoInterval, StepControl

parser = argparse.ArgumentParser()
parser.add_argument("--mode")
parser.add_argument("--dir", required=True)
parser.add_argument("--steps", type=int, default=10**9)
args = parser.parse_args()
dist.init_process_group("gloo")
rank = dist.get_rank()
limits = AutoInterval(min_seconds=0.3, mtbf_prior=float(os.environ.get("PRIOR", "30")),
                      max_seconds=float(os.environ.get("MAX_SECONDS", "3600")))
saver = AtomicDirectory(os.environ["CYCLER_CHECKPOINT_DIR"])
control = StepControl(every_steps=limits)
weights, generator = torch.zeros(4, dtype=torch.float64), torch.Generator().manual_seed(0)
latest = saver.latest_checkpoint()
if latest is not None:
    state = torch.load(Path(latest, "state.pt"), weights_only=False)
    control.load_state_dict(state["control"])
    weights, _ = state["weights"], generator.set_state(state["rng"])
decisions = open(Path(args.dir) / f"decisions-{rank}", "a")
while control.global_step < args.steps:
    time.sleep(0.01)
    weights += torch.randn(4, generator=generator, dtype=torch.float64)
    decision = control.step()
    if decision.checkpoint:
        decisions.write(f"{decision.step}\n")
        decisions.flush()
        path = saver.prepare_checkpoint_directory()
        if rank == 0:
            torch.save({"weights": weights, "rng": generator.get_state(),
                        "control": control.state_dict()}, Path(path, "state.pt"))
        time.sleep(0.05 * (1 + rank))  # rank 1's saves block it longer: rank 0 decides anyway
        saver.symlink_latest(path, {"step": decision.step})
    if decision.stop:
        break
control.close()
if rank == 0 and control.global_step >= args.steps:
    torch.save(weights, Path(args.dir) / "final.pt")
dist.destroy_process_group()
'''


def interval_events(job: Job) -> list[dict]:
    return [e for e in job.events() if e["event"] == "checkpoint_interval"]


def test_a_real_save_made_slower_mid_run_lengthens_the_interval(tmp_path: Path) -> None:
    # A history of 1000 kills in 1900 s fixes M near 1.9 s, whatever this test's own wall time.
    supervisor = tmp_path / ".cycler"
    supervisor.mkdir()
    log = supervisor / "events-node0.jsonl"
    log.write_text("".join(
        json.dumps({"event": "start", "time": 2.0 * run}) + "\n"
        + json.dumps({"event": "first_step", "time": 2.0 * run + 1.9}) + "\n"
        for run in range(1001)))
    control = StepControl(every_steps=AutoInterval(min_seconds=0.05),
                          control_file=supervisor / "control-node0.json")
    saved: list[int] = []
    state = {"weights": torch.zeros(1000)}

    def train_until(checkpoints: int, save_delay: float) -> None:
        while len(saved) < checkpoints:
            time.sleep(0.004)
            decision = control.step()
            if decision.checkpoint:
                saved.append(decision.step)
                atomic_torch_save(state, tmp_path / "state.pt")
                time.sleep(save_delay)

    train_until(6, save_delay=0.002)
    train_until(12, save_delay=0.12)
    gaps = [b - a for a, b in zip(saved, saved[1:], strict=False)]
    fast, slow = statistics.median(gaps[1:5]), statistics.median(gaps[-3:])
    assert slow > 2 * fast, saved
    logged = [e for e in read_events(log) if e["event"] == "checkpoint_interval"]
    assert logged[-1]["stall"] > 0.1 and logged[-1]["failures"] == 1000


def test_two_ranks_checkpoint_at_the_same_auto_chosen_steps(tmp_path: Path,
                                                            jobs: list[Job]) -> None:
    # The interval is chosen from the measured stall (fsyncs included): on a slow disk it may
    # exceed the whole run, so it is capped at 0.8 s; 400 steps of >= 10 ms then hold >= 4.
    job = Job(tmp_path, "--no-requeue", nproc=2, steps=400, worker=WORKER,
              env={"PRIOR": "5", "MAX_SECONDS": "0.8"})
    jobs.append(job)
    assert job.wait(timeout=180) == EXIT_SUCCESS, job.output()[-3000:]
    ranks = [(tmp_path / f"decisions-{rank}").read_text().split() for rank in (0, 1)]
    assert ranks[0] == ranks[1] and len(ranks[0]) >= 3, ranks
    logged = interval_events(job)
    assert logged and all(e["pid"] == logged[0]["pid"] for e in logged), "rank 0 says it"
    assert "checkpoint interval: every" in job.output()


def kill_the_whole_job(job: Job) -> None:
    for process in [*job.tree(), job.process]:
        try:
            os.kill(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    job.wait()


@pytest.mark.e2e
def test_a_job_killed_often_checkpoints_more_often_and_resumes_bit_identically(
        tmp_path: Path, jobs: list[Job]) -> None:
    # A prior far above any run's length here (each lasts 5-25 s, with its start, by the load):
    # three kills then bring the estimate of M well below it however long the runs took.
    steps, measured, prior = 1500, [], {"PRIOR": "300"}
    for _ in range(4):
        job = Job(tmp_path, "--no-requeue", nproc=1, steps=steps, worker=WORKER, env=prior)
        jobs.append(job)
        seen = len([e for e in interval_events(job) if "stall" in e])
        wait_for(lambda: len([e for e in interval_events(job) if "stall" in e]) > seen,  # noqa: B023
                 "a measured interval", job)
        time.sleep(1.0)
        kill_the_whole_job(job)
        measured.append([e for e in interval_events(job) if "stall" in e][seen])
    job = Job(tmp_path, "--no-requeue", nproc=1, steps=steps, worker=WORKER, env=prior)
    jobs.append(job)
    assert job.wait(timeout=300) == EXIT_SUCCESS, job.output()[-3000:]
    print([(e["failures"], e["mtbf_hours"] * 3600, e["stall"], e["seconds"]) for e in measured])
    assert [e["failures"] for e in measured] == [0, 1, 2, 3]
    assert measured[-1]["mtbf_hours"] < 0.6 * measured[0]["mtbf_hours"]
    assert measured[-1]["seconds"] < 0.85 * measured[0]["seconds"]
    generator, expected = torch.Generator().manual_seed(0), torch.zeros(4, dtype=torch.float64)
    for _ in range(steps):
        expected += torch.randn(4, generator=generator, dtype=torch.float64)
    assert torch.equal(torch.load(tmp_path / "final.pt"), expected)
