"""A plain script that keeps its own checkpoints, under real ``cycle run``, killed by the
forwarded SIGTERM: with a complete checkpoint of a known layout on disk the job exits 75 and
names it; with none, or only a torn one, it still ends 1."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from cycle_jobs import Job

from cycler.protocol.exit_codes import EXIT_FAILURE, EXIT_REQUEUE

OWN_CHECKPOINTS = r'''
import argparse, os, time
from pathlib import Path

parser = argparse.ArgumentParser()
parser.add_argument("--mode", required=True)
parser.add_argument("--dir", required=True)
args = parser.parse_args()
out = Path(args.dir)
if os.environ["RANK"] == "0":
    if args.mode in ("hf", "hf-torn"):
        folder = out / "out" / "checkpoint-30"
        folder.mkdir(parents=True)
        (folder / "optimizer.pt").write_bytes(b"x")
        if args.mode == "hf":
            (folder / "trainer_state.json").write_text("{}")
    elif args.mode == "lightning":
        folder = out / "lightning_logs" / "version_0" / "checkpoints"
        folder.mkdir(parents=True)
        (folder / "epoch=1-step=30.ckpt").write_bytes(b"weights")
    elif args.mode == "glob":
        (out / "runs").mkdir()
        (out / "runs" / "ckpt.pt").write_bytes(b"weights")
(out / f"ready-{os.environ['RANK']}-0").touch()
time.sleep(120)  # no handler: the forwarded SIGTERM kills it
'''


@pytest.mark.parametrize(("mode", "named"), [
    ("hf", "out/checkpoint-30 (Hugging Face checkpoint-N)"),
    ("lightning", "epoch=1-step=30.ckpt (Lightning .ckpt)"),
    ("glob", "runs/ckpt.pt (--resumable-if)"),
])
def test_a_stopped_plain_script_with_its_own_checkpoint_is_requeued_naming_it(
        tmp_path: Path, jobs: list[Job], mode: str, named: str) -> None:
    job = Job(tmp_path, "--resumable-if", "runs/*.pt", mode=mode, worker=OWN_CHECKPOINTS,
              nproc=2)
    jobs.append(job)
    job.wait_ready(nproc=2)
    job.send(signal.SIGTERM)
    assert job.wait(60) == EXIT_REQUEUE, job.output()
    assert named in job.output()
    assert "foreign_checkpoint" in job.event_names()
    assert [e["code"] for e in job.events() if e["event"] == "exit"] == [EXIT_REQUEUE]


@pytest.mark.parametrize("mode", ["none", "hf-torn"])
def test_a_stopped_plain_script_without_a_complete_checkpoint_still_ends_1(
        tmp_path: Path, jobs: list[Job], mode: str) -> None:
    job = Job(tmp_path, mode=mode, worker=OWN_CHECKPOINTS)
    jobs.append(job)
    job.wait_ready()
    job.send(signal.SIGTERM)
    assert job.wait(60) == EXIT_FAILURE, job.output()
    assert "no checkpoint exists to resume from" in job.output()
