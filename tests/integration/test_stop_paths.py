"""A stop is fast for every kind of script, with real ``cycle run``, torchrun and signals.

- a script that knows nothing of cycler gets the signal at once, as under torchrun, and its own
  handler runs;
- a script that commits through AtomicDirectory but never reads the control file is ended right
  after its first commit that completes after the request;
- no stop prints a traceback.
(Scripts that read the control file are covered by test_cycle_run.py and the example's test.)
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
from cycle_jobs import Job, assert_all_gone, wait_for

from cycler import list_checkpoints
from cycler.protocol.exit_codes import EXIT_FAILURE, EXIT_REQUEUE

PLAIN = r'''
import argparse, os, signal, sys, time
from pathlib import Path

parser = argparse.ArgumentParser()
parser.add_argument("--mode", default="handler")
parser.add_argument("--dir", required=True)
args, _ = parser.parse_known_args()
out, rank = Path(args.dir), int(os.environ["RANK"])
step = 0


def save_and_exit(number, frame):
    (out / f"got-{rank}").write_text(repr(time.time()))
    (out / f"saved-{rank}").write_text(str(step))  # the script's own checkpoint
    sys.exit(0)


if args.mode == "handler":
    signal.signal(signal.SIGTERM, save_and_exit)
(out / f"ready-{rank}-{os.environ['CYCLER_RESTART_COUNT']}").write_text("")
while True:
    step += 1
    time.sleep(0.01)
'''

SAVER_ONLY = r'''
import argparse, os, time
from pathlib import Path

import torch.distributed as dist

from cycler import AtomicDirectory

parser = argparse.ArgumentParser()
parser.add_argument("--dir", required=True)
args, _ = parser.parse_known_args()
out = Path(args.dir)
dist.init_process_group("gloo")
rank = dist.get_rank()
saver = AtomicDirectory(os.environ["CHECKPOINT_ARTIFACT_PATH"], is_master=rank == 0)
(out / f"ready-{rank}-{os.environ['CYCLER_RESTART_COUNT']}").write_text("")
for step in range(1000):
    time.sleep(0.6)  # "training" between two checkpoints
    directory = saver.prepare_checkpoint_directory()
    Path(directory, f"rank-{rank}.txt").write_text(str(step))
    saver.symlink_latest(directory, metadata={"step": step})
    with (out / f"commits-{rank}").open("a") as record:
        record.write(f"{time.time()!r}\n")
'''


def no_traceback(job: Job) -> None:
    output = job.output()
    assert "Traceback" not in output and "ChildFailedError" not in output, output[-3000:]


def test_a_plain_script_gets_sigterm_at_once_saves_in_its_handler_and_the_job_exits_75(
        tmp_path: Path, jobs: list[Job]) -> None:
    job = Job(tmp_path, "--grace", "30", nproc=2, mode="handler", worker=PLAIN)
    jobs.append(job)
    job.wait_ready(nproc=2)
    tree = job.tree()
    sent = time.time()
    job.send(signal.SIGTERM)
    assert job.wait(30) == EXIT_REQUEUE
    delays = [float((tmp_path / f"got-{rank}").read_text()) - sent for rank in range(2)]
    assert max(delays) < 0.1, f"the workers got SIGTERM {delays} s after the supervisor"
    assert all((tmp_path / f"saved-{rank}").exists() for rank in range(2))
    stop = next(e for e in job.events() if e["event"] == "stop_requested")
    assert stop["path"] == "signal"
    assert "stop_handled_by_script" in job.event_names()
    no_traceback(job)
    assert_all_gone(tree)


def test_a_plain_script_without_a_handler_ends_at_once_without_a_traceback(
        tmp_path: Path, jobs: list[Job]) -> None:
    job = Job(tmp_path, "--grace", "30", nproc=2, mode="no-handler", worker=PLAIN)
    jobs.append(job)
    job.wait_ready(nproc=2)
    sent = time.monotonic()
    job.send(signal.SIGTERM)
    code = job.wait(30)
    assert time.monotonic() - sent < 5.0
    assert code == EXIT_FAILURE, "no handler, no checkpoint: nothing to resume from"
    assert "during the stop cycle run asked for" in job.output()
    no_traceback(job)


def saver_only_job_after_two_commits(tmp_path: Path, jobs: list[Job]) -> Job:
    job = Job(tmp_path, "--grace", "60", nproc=2, worker=SAVER_ONLY)
    jobs.append(job)
    job.wait_ready(nproc=2)
    commits = tmp_path / "commits-0"
    wait_for(lambda: commits.exists() and len(commits.read_text().split()) >= 2,
             "two commits", job)
    return job


def test_a_saver_only_script_is_ended_right_after_its_next_commit(
        tmp_path: Path, jobs: list[Job]) -> None:
    job = saver_only_job_after_two_commits(tmp_path, jobs)
    tree = job.tree()
    sent = time.time()
    job.send(signal.SIGTERM)
    assert job.wait(60) == EXIT_REQUEUE
    ended = time.time()
    # Read from the manifest: the script's own record after the commit races with the TERM.
    after = sorted((c.manifest.created_at, c.index) for c in list_checkpoints(job.root)
                   if c.manifest is not None and c.manifest.created_at > sent)
    assert after, "the stop came before any commit that completed after the request"
    (created_at, index), timeline = after[0], [
        (round(e["time"] - sent, 3), e["event"], e.get("index")) for e in job.events()
        if e["time"] >= sent]
    # Ended by cycle for that very commit, not by the grace (a minute): the time is a sanity
    # bound with room for a busy disk's fsyncs after the manifest's time stamp.
    assert ("stop_after_commit", index) in [(e[1], e[2]) for e in timeline], timeline
    assert ended - created_at < 5.0, f"ended {ended - created_at:.2f} s after: {timeline}"
    assert "stop_without_new_checkpoint" not in job.event_names()
    stop = next(e for e in job.events() if e["event"] == "stop_requested")
    assert stop["path"] == "next_commit"
    no_traceback(job)
    assert_all_gone(tree)


EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train.py"


def test_sigterm_to_every_process_of_the_job_still_stops_at_the_agreed_step(
        tmp_path: Path) -> None:
    # What Slurm's proctrack/pgid or linuxproc do: every process of the job, torchrun and the
    # DataLoader workers included, gets the TERM the supervisor gets.
    root = tmp_path / "ck"
    command = [sys.executable, "-m", "cycler_cli", "run", "--nproc-per-node", "2",
               "--checkpoint-dir", str(root), "--no-requeue", str(EXAMPLE), "--epochs", "50",
               "--workers", "2", "--checkpoint-every", "100000", "--step-delay", "0.01"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, cwd=tmp_path)
    assert process.stdout is not None
    for line in process.stdout:
        if line.startswith("[train] training from step"):
            break
    time.sleep(1.0)
    job = [psutil.Process(process.pid), *psutil.Process(process.pid).children(recursive=True)]
    (torchrun,) = [p for p in job if "cycler.supervisor.launch.launcher" in " ".join(p.cmdline())]
    ranks = torchrun.children()
    loader_workers = [child for rank in ranks for child in rank.children()]
    assert (len(ranks), len(loader_workers)) == (2, 4), "2 ranks, 2 DataLoader workers each"
    sent = time.time()
    for member in job:
        member.send_signal(signal.SIGTERM)
    output, _ = process.communicate(timeout=120)
    assert process.returncode == EXIT_REQUEUE, output
    committed = [c for c in list_checkpoints(root) if c.valid and c.manifest is not None
                 and c.manifest.created_at > sent]
    assert committed, f"no checkpoint at the agreed step:\n{output}"
    assert "stopping at step" in output and "Traceback" not in output, output


def test_a_saver_only_script_survives_sigterm_to_every_process_and_stops_after_its_commit(
        tmp_path: Path, jobs: list[Job]) -> None:
    # Slurm's proctrack/linuxproc: the TERM reaches the supervisor, torchrun and every worker.
    job = saver_only_job_after_two_commits(tmp_path, jobs)
    tree = job.tree()
    sent = time.time()
    job.send(signal.SIGTERM)
    for member in tree:
        with contextlib.suppress(psutil.Error):
            member.send_signal(signal.SIGTERM)
    assert job.wait(60) == EXIT_REQUEUE, job.output()[-3000:]
    committed = [c for c in list_checkpoints(job.root) if c.valid and c.manifest is not None
                 and c.manifest.created_at > sent]
    assert committed, "no commit after the stop request: the TERM killed the workers first"
    names = job.event_names()
    assert "stop_after_commit" in names and "stop_without_new_checkpoint" not in names
    no_traceback(job)
    assert_all_gone(tree)
