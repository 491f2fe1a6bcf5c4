"""Issue 25 items 7 and 8, with real ``cycle run``, torchrun and signals: a script with its own
SIGTERM handler gets the signal at once whatever savers it builds (finding 9); cycle's own
SIGTERM after a save-only script's stop checkpoint ends its DataLoader workers too, with no
SIGKILL (finding 18); and a start that fails the same way twice is not tried a third time
(issue 26 item 5)."""

from __future__ import annotations

import contextlib
import signal
import time
from pathlib import Path

import psutil
from cycle_jobs import Job, assert_all_gone, wait_for

from cycler import latest_checkpoint, list_checkpoints
from cycler.protocol.exit_codes import EXIT_FAILURE, EXIT_REQUEUE

OWN_HANDLER = r'''
import argparse, os, sys, time, signal
from pathlib import Path
from cycler import AtomicDirectory, atomic_torch_save

parser = argparse.ArgumentParser()
parser.add_argument("--dir", required=True)
parser.add_argument("--mode", default="after")
args, _ = parser.parse_known_args()
out = Path(args.dir)


def save(number, frame):
    (out / "got").write_text(repr(time.time()))
    directory = saver.prepare_checkpoint_directory()
    time.sleep(3)  # a save that takes longer than cycle's 2 s between TERM and KILL
    atomic_torch_save({}, directory + "/t.pt")
    saver.symlink_latest(directory)
    sys.exit(0)


if args.mode == "before":
    signal.signal(signal.SIGTERM, save)
saver = AtomicDirectory(os.environ["CYCLER_CHECKPOINT_DIR"])
if args.mode == "after":
    signal.signal(signal.SIGTERM, save)
(out / "ready-0-0").write_text("")
while True:
    time.sleep(0.1)  # training; its periodic save is not due yet
'''

LOADER = r'''
import argparse, os, time
from pathlib import Path
import torch
from torch.utils.data import DataLoader
from cycler import AtomicDirectory, atomic_torch_save

parser = argparse.ArgumentParser()
parser.add_argument("--dir", required=True)
args, _ = parser.parse_known_args()
out = Path(args.dir)
saver = AtomicDirectory(os.environ["CYCLER_CHECKPOINT_DIR"])
loader = DataLoader(range(100000), batch_size=4, num_workers=3, persistent_workers=True)
(out / "ready-0-0").write_text("")
while True:
    for index, batch in enumerate(loader):
        time.sleep(0.01)
        if index % 50 == 49:  # a checkpoint every 50 batches, as an isc-demos script does
            directory = saver.prepare_checkpoint_directory()
            atomic_torch_save({"batch": batch}, os.path.join(directory, "t.pt"))
            saver.symlink_latest(directory)
'''

FAILS_AT_START = r'''
import os, time
import cycler
time.sleep(0.2)
raise RuntimeError(f"this node has no CUDA device (pid {os.getpid()})")
'''


def test_a_script_whose_own_handler_was_set_after_its_saver_gets_sigterm_at_once(
        tmp_path: Path) -> None:
    job = Job(tmp_path, "--grace", "10", mode="after", worker=OWN_HANDLER)
    job.wait_ready()
    time.sleep(1.0)  # past the worker's look at its handlers
    sent = time.time()
    job.send(signal.SIGTERM)
    assert job.wait(60) == EXIT_REQUEUE, job.output()[-3000:]
    assert float((tmp_path / "got").read_text()) - sent < 1.0, "the handler got it late"
    assert [c for c in list_checkpoints(job.root) if c.valid], "the handler's save was lost"
    stop = next(e for e in job.events() if e["event"] == "stop_requested")
    assert stop["path"] == "signal", stop
    assert "grace_expired" not in job.event_names()


def test_a_script_whose_own_handler_was_set_before_its_saver_gets_sigterm_at_once(
        tmp_path: Path) -> None:
    job = Job(tmp_path, "--grace", "10", mode="before", worker=OWN_HANDLER)
    job.wait_ready()
    sent = time.time()
    job.send(signal.SIGTERM)
    assert job.wait(60) == EXIT_REQUEUE, job.output()[-3000:]
    assert float((tmp_path / "got").read_text()) - sent < 1.0, "the handler got it late"
    assert [c for c in list_checkpoints(job.root) if c.valid]


def test_cycles_sigterm_after_the_stop_checkpoint_ends_the_loader_workers_too(
        tmp_path: Path) -> None:
    job = Job(tmp_path, "--grace", "30", worker=LOADER)
    job.wait_ready()
    wait_for(lambda: any(c.valid for c in list_checkpoints(job.root)), "a commit", job)
    tree = job.tree()
    job.send(signal.SIGTERM)
    assert job.wait(60) == EXIT_REQUEUE, job.output()[-3000:]
    events = job.events()
    names = [event["event"] for event in events]
    assert "stop_after_commit" in names and "kill" not in names, job.output()[-3000:]
    assert "ignored: cycle run decides" not in job.output()
    committed = next(e["time"] for e in events if e["event"] == "stop_after_commit")
    exited = next(e["time"] for e in events if e["event"] == "workers_exited")
    assert exited - committed < 1.5, f"{exited - committed:.2f} s from commit to exit"
    (tmp_path / "commit-to-exit.txt").write_text(f"{exited - committed:.3f}\n")
    assert_all_gone(tree)


def test_a_stray_term_to_every_process_still_waits_for_the_stop_checkpoint(
        tmp_path: Path) -> None:
    # Slurm's linuxproc: the TERM reaches the loader workers too, before any commit; they
    # must live until the stop's commit, and then end with cycle's own TERM.
    job = Job(tmp_path, "--grace", "30", worker=LOADER)
    job.wait_ready()
    wait_for(lambda: any(c.valid for c in list_checkpoints(job.root)), "a commit", job)
    tree = job.tree()
    # A commit is the link's move: a checkpoint whose manifest was written just before the TERM
    # and linked just after it is the stop's (its manifest's time is before the TERM's).
    linked = latest_checkpoint(job.root)
    job.send(signal.SIGTERM)
    for member in tree:
        with contextlib.suppress(psutil.Error):
            member.send_signal(signal.SIGTERM)
    assert job.wait(60) == EXIT_REQUEUE, job.output()[-3000:]
    assert latest_checkpoint(job.root) != linked, \
        "the stray TERM killed a process before the commit"
    names = job.event_names()
    assert "stop_after_commit" in names and "kill" not in names, job.output()[-3000:]
    assert "Traceback" not in job.output()
    assert_all_gone(tree)


def test_a_start_that_fails_twice_the_same_way_is_not_tried_a_third_time(
        tmp_path: Path) -> None:
    job = Job(tmp_path, "--restart-delay", "0.5", worker=FAILS_AT_START)
    assert job.wait(120) == EXIT_FAILURE
    assert job.event_names().count("workers_started") == 2
    output = job.output()
    report = output[output.rindex("cycle: error:"):]
    assert "failed twice before their first step with the same error" in report, report
    assert report.count("RuntimeError: this node has no CUDA device") == 1, report
