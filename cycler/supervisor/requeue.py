"""Asking Slurm to requeue the job after a clean stop (``scontrol requeue $SLURM_JOB_ID``).

This is what ``sbatch --requeue --signal=B:TERM@N`` scripts expect: the job goes back to the
queue and its next start resumes from the checkpoint the stop left. The command name is a
parameter so tests can put a recording fake ``scontrol`` on ``PATH``.

Only a job that Slurm still reports as RUNNING is requeued. Measured on Slurm 22.05 (see
slurm-local's README): at the ``--signal=B:TERM@N`` notice the job is RUNNING, but when the TERM
comes from ``scancel``, a preemption or an outside ``scontrol requeue`` it is already COMPLETING.
Requeueing then would make the job impossible to cancel (every ``scancel`` becoming another
requeue) and would duplicate the requeue that preemption does by itself.
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
    """Run ``scontrol requeue JOB_ID`` if the job is still RUNNING; never raises.

    When the state cannot be read the requeue is attempted anyway: losing a requeue loses the
    job's remaining time, which is worse than an extra one. The caller logs the outcome.
    """
    state = job_state(job_id, scontrol, timeout)
    if state is not None and state != "RUNNING":
        return RequeueResult(False, f"Slurm is already ending job {job_id} (JobState={state}: "
                                    "scancel, preemption or an outside requeue); not requeueing")
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


def job_state(job_id: str, scontrol: str = "scontrol",
              timeout: float = REQUEUE_TIMEOUT_SECONDS) -> str | None:
    """The job's ``JobState`` from ``scontrol show job -o``, or ``None`` if unreadable."""
    try:
        done = subprocess.run([scontrol, "show", "job", "-o", job_id], capture_output=True,
                              text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    for word in done.stdout.split():
        if word.startswith("JobState="):
            return word.split("=", 1)[1]
    return None
