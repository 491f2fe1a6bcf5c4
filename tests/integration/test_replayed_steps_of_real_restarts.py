"""Issue 35, in production: a restart after a kill -9 between checkpoints replays the steps the
killed run computed, and ``cycle run`` compares them with what it recorded, bit for bit. A
resume that restores everything is verified; one that forgets the RNG state diverges at the
first replayed step, and ``--on-divergence stop`` ends the job with exit 65. Real ``cycle
run``, torchrun, gloo ranks, SIGKILL and ``cycle status --json``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cycler.protocol.exit_codes import EXIT_DIVERGED
from cycler.protocol.fingerprints import read_records
from tests.integration.cycle_jobs import Job, wait_for

WORKER = Path(__file__).with_name("replay_worker.py").read_text()
pytestmark = pytest.mark.e2e


def killed_at_step_13(tmp_path: Path, *flags: str, mode: str, nproc: int,
                      steps: int = 20) -> tuple[int, dict[str, Any]]:
    """Run the worker under ``cycle run``, SIGKILL every worker at step 13 of the first start
    (checkpoints at 10 and 15), let the restart finish; its exit code and ``cycle status
    --json``."""
    job = Job(tmp_path, "--restart-delay", "0", *flags, mode=mode, steps=steps, nproc=nproc,
              worker=WORKER)
    try:
        markers = [tmp_path / f"at-13-{rank}" for rank in range(nproc)]
        wait_for(lambda: all(m.exists() and m.read_text() for m in markers), "step 13", job)
        for marker in markers:
            os.kill(int(marker.read_text()), signal.SIGKILL)
        code = job.wait(timeout=240)
    finally:
        if job.process.poll() is None:
            job.process.kill()
            job.wait()
    status = subprocess.run([sys.executable, "-m", "cycler_cli", "status", "--json",
                             str(job.root)], capture_output=True, text=True, check=True)
    return code, json.loads(status.stdout)


def test_a_job_killed_between_checkpoints_resumes_and_its_replayed_steps_are_verified(
        tmp_path: Path) -> None:
    code, status = killed_at_step_13(tmp_path, mode="exact", nproc=2)
    assert code == 0, (tmp_path / "stderr.txt").read_text()[-3000:]
    (replay,) = status["replays"]
    assert replay["verdict"] == "verified", replay
    assert (replay["resumed"], replay["steps"], replay["ranks"]) == (10, 3, 2)
    assert replay["said"] == "resume at step 10 verified: 3 replayed steps identical (2 ranks)"
    copied = read_records(tmp_path / "ck" / ".cycler" / "fingerprints-node0.fp")[0]
    assert {record.rank for record in copied} == {0, 1}  # at the workers' end, in the root


def test_a_resume_that_forgets_the_rng_state_diverges_at_the_first_replayed_step(
        tmp_path: Path) -> None:
    code, status = killed_at_step_13(tmp_path, mode="forget", nproc=1)
    assert code == 0, "--on-divergence warn (the default) lets the job go on"
    (replay,) = status["replays"]
    assert replay["verdict"] == "diverged" and replay["step"] == 11, replay
    assert replay["said"].startswith(
        f"resume at step 10 diverged at step 11 on rank 0 (loss {replay['now']} vs "
        f"{replay['before']} before): the first replayed step differs")
    assert replay["now"] != replay["before"]


def test_on_divergence_stop_ends_the_job_with_exit_65_before_it_trains_on(
        tmp_path: Path) -> None:
    code, status = killed_at_step_13(tmp_path, "--on-divergence", "stop", mode="forget",
                                     nproc=1, steps=400)
    assert code == EXIT_DIVERGED == 65, (tmp_path / "stderr.txt").read_text()[-3000:]
    assert status["replays"][-1]["verdict"] == "diverged"
    steps = [c["step"] for c in status["checkpoints"] if c["step"] is not None]
    assert max(steps) < 400, "the job was ended before its last step"
