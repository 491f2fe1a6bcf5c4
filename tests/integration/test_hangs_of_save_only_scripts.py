"""Issue 25 item 6: a healthy job is never killed as hung. A script that only commits
(cycling_utils' idiom) is judged by its own commit interval, learned, or not at all; the same
hang at the same step twice widens the allowance, and a crash loop made of hangs says so.
Real ``cycle run``, torchrun, one worker."""

from __future__ import annotations

from pathlib import Path

from cycle_jobs import Job

from cycler.protocol.exit_codes import EXIT_FAILURE, EXIT_SUCCESS

SAVE_ONLY = r'''
import argparse, os, time
from pathlib import Path
from cycler import AtomicDirectory, atomic_torch_save

parser = argparse.ArgumentParser()
parser.add_argument("--dir", required=True)
parser.add_argument("--mode", default="")
parser.add_argument("--steps", type=int, default=3)
args, _ = parser.parse_known_args()
every = float(os.environ["EVERY"])
saver = AtomicDirectory(os.environ["CYCLER_CHECKPOINT_DIR"])
first = os.environ["CYCLER_RESTART_COUNT"] == "0"
for commit in range(args.steps):
    started = time.time()
    while time.time() - started < every:
        time.sleep(0.05)  # a training step that tells nobody
    directory = saver.prepare_checkpoint_directory()
    atomic_torch_save({"commit": commit}, os.path.join(directory, "t.pt"))
    saver.symlink_latest(directory)
    if first and args.mode == "hang" and commit == 2:
        time.sleep(3600)  # hung after its third commit
'''

STEPPER = r'''
import argparse, os, time
from cycler import AtomicDirectory, StepControl, atomic_torch_save
import torch

parser = argparse.ArgumentParser()
parser.add_argument("--dir", required=True)
parser.add_argument("--mode", default="")
parser.add_argument("--steps", type=int, default=40)
args, _ = parser.parse_known_args()
saver = AtomicDirectory(os.environ["CYCLER_CHECKPOINT_DIR"])
start = 0
if (latest := saver.latest_checkpoint()) is not None:
    start = torch.load(os.path.join(latest, "t.pt"))["step"]
control = StepControl(every_steps=5, start_step=start)
for step in range(start, args.steps):
    time.sleep(0.05)
    if step == 17:
        time.sleep(float(os.environ["PAUSE"]))  # an unmarked slow phase at a fixed step
    decision = control.step()
    if decision.checkpoint:
        directory = saver.prepare_checkpoint_directory()
        atomic_torch_save({"step": step + 1}, os.path.join(directory, "t.pt"))
        saver.symlink_latest(directory)
    if decision.stop:
        break
control.close()
'''


def hangs(job: Job) -> list[dict]:
    return [event for event in job.events() if event["event"] == "hang"]


def test_a_script_that_only_commits_is_not_killed_before_its_first_commit(
        tmp_path: Path) -> None:
    # Its first commit comes three times the first-step allowance after the start: a
    # cycling_utils script that saves every epoch.
    job = Job(tmp_path, "--hang-first-step", "2", "--hang-timeout-min", "2", steps=2,
              env={"EVERY": "6"}, worker=SAVE_ONLY)
    assert job.wait(120) == EXIT_SUCCESS, job.output()[-3000:]
    assert not hangs(job), job.output()[-3000:]


def test_a_script_that_only_commits_is_judged_by_its_learned_commit_interval(
        tmp_path: Path) -> None:
    # Commits 1.5 s apart, then a hang after the third: found once the allowance learned from
    # its own commits (max(2 s, 5 x 1.5 s)) is over, and the restart finishes the job.
    job = Job(tmp_path, "--hang-first-step", "60", "--hang-timeout-min", "2",
              "--restart-delay", "0", mode="hang", steps=4, env={"EVERY": "1.5"},
              worker=SAVE_ONLY)
    assert job.wait(180) == EXIT_SUCCESS, job.output()[-3000:]
    (hang,) = hangs(job)
    assert hang["why"] == "step timeout", hang
    assert 5.0 < hang["allowance"] < 15.0, hang


def test_the_same_hang_at_the_same_step_twice_widens_the_allowance(tmp_path: Path) -> None:
    # A 5 s pause at step 17 against a 3 s step timeout: a hang at the first two starts, then
    # the allowance doubles there and the third start goes through.
    job = Job(tmp_path, "--hang-timeout-min", "3", "--restart-delay", "0", steps=40,
              env={"PAUSE": "5"}, worker=STEPPER)
    assert job.wait(240) == EXIT_SUCCESS, job.output()[-3000:]
    found = hangs(job)
    assert len(found) == 2, found
    assert {tuple(hang["steps"]) for hang in found} == {(17,)}, found
    assert "the same hang at step 17 twice" in job.output()


def test_a_crash_loop_made_of_hangs_says_so(tmp_path: Path) -> None:
    job = Job(tmp_path, "--hang-timeout-min", "3", "--restart-delay", "0", "--max-restarts",
              "1", steps=40, env={"PAUSE": "3600"}, worker=STEPPER)
    assert job.wait(240) == EXIT_FAILURE, job.output()[-3000:]
    assert len(hangs(job)) == 2
    last = job.output().strip().splitlines()
    said = "\n".join(last[-15:])
    assert ("the same hang at step 17 twice: mark it with control.paused() or raise "
            "--hang-timeout-min") in said, said
