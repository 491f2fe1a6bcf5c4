"""Asking Slurm to requeue the job after a clean stop (``scontrol requeue $SLURM_JOB_ID``).

This is what ``sbatch --requeue --signal=B:TERM@N`` scripts expect: the job goes back to the
queue and its next start resumes from the checkpoint the stop left. The command name is a
parameter so tests can put a recording fake ``scontrol`` on ``PATH``.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass

REQUEUE_TIMEOUT_SECONDS = 60.0


@dataclass(frozen=True)
class RequeueResult:
    """Whether the scheduler accepted the requeue, and what it said."""

    accepted: bool
    detail: str


def requeue_job(job_id: str, scontrol: str = "scontrol",
                timeout: float = REQUEUE_TIMEOUT_SECONDS) -> RequeueResult:
    """Run ``scontrol requeue JOB_ID``; never raises, the outcome is logged by the caller."""
    command = [scontrol, "requeue", job_id]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                              check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        return RequeueResult(False, f"{' '.join(command)} could not run: {error}")
    output = " ".join((done.stdout + done.stderr).split())
    if done.returncode != 0:
        return RequeueResult(False, f"{' '.join(command)} exited {done.returncode}: {output}")
    return RequeueResult(True, output or "requeued")
