"""A plain script that keeps its own checkpoints, under real ``cycle run``, killed by the
forwarded SIGTERM: with a complete checkpoint of a known layout written during the job the job
exits 75 and names it; with none, only a torn one, or only a pretrained file from before the
job, it still ends 1, in one line that names ``--resumable-if`` and the files it saw."""

from __future__ import annotations

import os
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
    elif args.mode == "nanogpt":
        import torch
        (out / "out").mkdir()
        torch.save({"model": {"w": torch.ones(3)}, "iter_num": 250}, out / "out" / "ckpt.pt")
    elif args.mode == "accelerate":
        import torch
        (out / "step_12").mkdir()
        (out / "step_12" / "model.safetensors").write_bytes(b"weights")
        torch.save({"step": 0}, out / "step_12" / "random_states_0.pkl")
    elif args.mode == "safetensors":
        (out / "weights").mkdir()
        (out / "weights" / "model.safetensors").write_bytes(b"weights")
(out / f"ready-{os.environ['RANK']}-0").touch()
time.sleep(120)  # no handler: the forwarded SIGTERM kills it
'''


@pytest.mark.parametrize(("mode", "named"), [
    ("hf", "out/checkpoint-30 (Hugging Face checkpoint-N)"),
    ("lightning", "epoch=1-step=30.ckpt (Lightning .ckpt)"),
    ("glob", "runs/ckpt.pt (--resumable-if)"),
    ("nanogpt", "out/ckpt.pt (torch.save file)"),
    ("accelerate", "step_12 (Accelerate save_state folder)"),
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


@pytest.mark.parametrize("mode", ["none", "hf-torn", "pretrained", "safetensors"])
def test_a_stopped_plain_script_without_a_complete_checkpoint_still_ends_1(
        tmp_path: Path, jobs: list[Job], mode: str) -> None:
    if mode == "pretrained":  # the repro of review-turn5/foreign-stale-pretrained-ckpt-requeues
        (tmp_path / "sd-v1-5.ckpt").write_bytes(os.urandom(1000))
        os.utime(tmp_path / "sd-v1-5.ckpt", (1_704_067_200, 1_704_067_200))  # 2024-01-01
    job = Job(tmp_path, mode=mode, worker=OWN_CHECKPOINTS)
    jobs.append(job)
    job.wait_ready()
    job.send(signal.SIGTERM)
    assert job.wait(60) == EXIT_FAILURE, job.output()
    [line] = [line for line in job.output().splitlines() if line.startswith("cycle: exit 1")]
    assert "no checkpoint exists to resume from" in line
    assert "name them with --resumable-if GLOB" in line
    assert SEEN[mode] in line, line


SEEN = {"none": "no file written during the job looked like a checkpoint",
        "hf-torn": "saw out/checkpoint-30/optimizer.pt (written during the job",
        "pretrained": "saw sd-v1-5.ckpt (from before the job)",
        "safetensors": "saw weights/model.safetensors (written during the job, of no layout"}
