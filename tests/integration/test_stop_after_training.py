"""A stop that lands after the training loop ended does not undo a finished job.

bench_goodput found it: SIGTERM to ``cycle run`` between a script's last step and its exit
ended the job with 75 and, under Slurm, requeued a job that had finished (the rerun resumed
from the last checkpoint and trained its last steps again). Real ``cycle run``, torchrun, two
gloo ranks, a real SIGTERM, a fake ``scontrol`` that records the requeue.
"""

from __future__ import annotations

import signal
from pathlib import Path

from cycle_jobs import Job, fake_scontrol, wait_for

from cycler import list_checkpoints
from cycler.protocol.exit_codes import EXIT_REQUEUE, EXIT_SUCCESS

WORKER = r'''
import argparse, os, time
from pathlib import Path

import torch.distributed as dist

from cycler import AtomicDirectory, StepControl

parser = argparse.ArgumentParser()
parser.add_argument("--mode", default="ends")
parser.add_argument("--dir", required=True)
parser.add_argument("--steps", type=int, default=20)
args = parser.parse_args()
out = Path(args.dir)
dist.init_process_group("gloo")
rank = dist.get_rank()
saver = AtomicDirectory(os.environ["CHECKPOINT_ARTIFACT_PATH"], is_master=rank == 0)
control = StepControl(sync_every=1)


def commit(step):
    directory = saver.prepare_checkpoint_directory()
    Path(directory, f"rank-{rank}.txt").write_text(str(step))
    saver.symlink_latest(directory, metadata={"step": step})


commit(0)
(out / f"ready-{rank}-{os.environ['CYCLER_RESTART_COUNT']}").write_text("")
for step in range(1, args.steps + 1):
    control.step()
    if control.should_checkpoint():
        commit(step)
    if control.should_stop():
        break
    time.sleep(0.05)
control.close()
(out / f"after-loop-{rank}").write_text(str(step))
if args.mode == "ends":
    while not (out / "go").exists():  # the stop arrives between the loop's end and the exit
        time.sleep(0.02)
dist.destroy_process_group()
'''


def _stop_requested(job: Job) -> bool:
    return "stop_requested" in job.event_names()


def test_a_stop_after_the_last_step_ends_the_finished_job_0_without_a_requeue(
        tmp_path: Path, jobs: list[Job]) -> None:
    path_env, record = fake_scontrol(tmp_path)
    job = Job(tmp_path, nproc=2, mode="ends", worker=WORKER,
              env={**path_env, "SLURM_JOB_ID": "9876"})
    jobs.append(job)
    wait_for(lambda: all((tmp_path / f"after-loop-{rank}").exists() for rank in range(2)),
             "the training loops' end", job)
    job.send(signal.SIGTERM)
    wait_for(lambda: _stop_requested(job), "the stop's request", job)
    (tmp_path / "go").write_text("")
    assert job.wait(120) == EXIT_SUCCESS, job.output()[-3000:]
    assert not record.exists(), f"requeued a finished job: {record.read_text()}"
    assert [e["event"] for e in job.events()][-3:-1] == ["stop_after_training", "exit"], \
        job.event_names()
    assert "finished" in job.output()


def test_a_stop_while_the_job_trains_still_exits_75_and_requeues(
        tmp_path: Path, jobs: list[Job]) -> None:
    path_env, record = fake_scontrol(tmp_path)
    job = Job(tmp_path, nproc=2, mode="trains", steps=100000, worker=WORKER,
              env={**path_env, "SLURM_JOB_ID": "9876"})
    jobs.append(job)
    job.wait_ready(nproc=2)
    job.send(signal.SIGTERM)
    assert job.wait(120) == EXIT_REQUEUE, job.output()[-3000:]
    assert record.read_text().splitlines() == ["requeue 9876"]
    assert len(list_checkpoints(job.root)) >= 2  # the one before the loop and the stop's
    assert all((tmp_path / f"after-loop-{rank}").exists() for rank in range(2))
