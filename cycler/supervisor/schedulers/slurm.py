"""What ``cycle run`` asks of Slurm: the job's hard deadline, and its requeue after a stop.

Deadline: Slurm SIGKILLs a job KillWait seconds after it starts ending it (scancel, preemption,
an outside requeue: the job is COMPLETING when its TERM arrives), and a job that reaches its time
limit is ended and never requeued. So a stop must be over, and ``scontrol requeue`` issued,
before the earlier of those, whatever ``--grace`` says. The job's state, end time and the
cluster's KillWait are read with ``scontrol`` when a stop begins, off the supervisor's loop.

Requeue: ``scontrol requeue $SLURM_JOB_ID`` after a clean stop is what ``sbatch --requeue
--signal=B:TERM@N`` scripts expect: the job goes back to the queue and its next start resumes
from the checkpoint the stop left. The command name is a parameter so tests can put a recording
fake ``scontrol`` on ``PATH``.

Only a job that Slurm still reports as RUNNING is requeued. Measured on Slurm 22.05 (see
slurm-local's README): at the ``--signal=B:TERM@N`` notice the job is RUNNING, but when the TERM
comes from ``scancel``, a preemption or an outside ``scontrol requeue`` it is already COMPLETING.
Requeueing then would make the job impossible to cancel (every ``scancel`` becoming another
requeue) and would duplicate the requeue that preemption does by itself.
"""

from __future__ import annotations

import datetime
import re
import subprocess
from dataclasses import dataclass

from cycler.errors import ConfigError

REQUEUE_TIMEOUT_SECONDS = 60.0
QUERY_TIMEOUT_SECONDS = 10.0
DEADLINE_MARGIN_SECONDS = 3.0
"""Kept before a hard deadline beyond the supervisor's own SIGTERM -> SIGKILL interval: time to
reap the workers and run ``scontrol requeue``. A memory tier's stop checkpoint is copied to the
checkpoint root inside the deadline this margin leaves (by the workers, or by the supervisor
where theirs did not land), never in the margin."""


@dataclass(frozen=True)
class SlurmJob:
    """What ``scontrol`` says of a job; ``None`` where it could not be read."""

    state: str | None
    end_time: float | None
    """Wall-clock time (epoch seconds) of the time limit; ``None`` for an unlimited job."""
    kill_wait: float | None
    """The cluster's KillWait: seconds between Slurm's TERM and its SIGKILL."""


def read_job(job_id: str, scontrol: str = "scontrol",
             timeout: float = QUERY_TIMEOUT_SECONDS) -> SlurmJob:
    """The job's state and end time (``show job``) and KillWait (``show config``)."""
    fields = _key_values(_run([scontrol, "show", "job", "-o", job_id], timeout))
    config = _run([scontrol, "show", "config"], timeout)
    return SlurmJob(fields.get("JobState"), _epoch(fields.get("EndTime")), _kill_wait(config))


def hard_deadline(job: SlurmJob, signalled_at: float, kill_after: float,
                  margin: float = DEADLINE_MARGIN_SECONDS) -> tuple[float, str] | None:
    """When a stop that began at ``signalled_at`` must be over, and the arithmetic as a
    sentence; ``None`` when Slurm sets no earlier bound than the grace."""
    keep = kill_after + margin
    if job.state not in (None, "RUNNING") and job.kill_wait is not None:
        return (signalled_at + job.kill_wait - keep,
                f"Slurm is ending the job (JobState={job.state}) and kills it KillWait "
                f"{job.kill_wait:g} s after its signal; minus {keep:g} s to stop and requeue")
    if job.end_time is not None:
        limit = datetime.datetime.fromtimestamp(job.end_time).isoformat(timespec="seconds")
        return (job.end_time - keep,
                f"the time limit is at {limit} and a job past it is not requeued; minus "
                f"{keep:g} s to stop and requeue")
    return None


def _run(command: list[str], timeout: float) -> str:
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                              check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""


def _key_values(text: str) -> dict[str, str]:
    pairs = (word.split("=", 1) for word in text.split() if "=" in word)
    return {key: value for key, value in pairs}


def _epoch(stamp: str | None) -> float | None:
    """Slurm's local ``2026-11-23T08:00:00`` as epoch seconds (``Unknown`` and the like: None)."""
    try:
        return datetime.datetime.fromisoformat(stamp or "").timestamp()
    except ValueError:
        return None


def _kill_wait(config: str) -> float | None:
    for line in config.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "KillWait":
            words = value.split()
            try:
                return float(words[0]) if words else None
            except ValueError:
                return None
    return None


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
    return _key_values(_run([scontrol, "show", "job", "-o", job_id], timeout)).get("JobState")


# --- the job's host list ----------------------------------------------------------------------

_RANGES = r"\[\d+(?:-\d+)?(?:,\d+(?:-\d+)?)*\]"
_HOST = rf"(?:[^,\[\]]+|{_RANGES})+"
_NODELIST = re.compile(rf"{_HOST}(?:,{_HOST})*")
"""Slurm's host list: names with bracketed numeric ranges, separated by commas."""


def expand_nodelist(nodelist: str) -> list[str]:
    """Slurm's compressed host list (``node[01-03,07],gpu1``) as host names, in order;
    :class:`ConfigError` naming the variable if it is not one."""
    hosts: list[str] = []
    if _NODELIST.fullmatch(nodelist):
        for part in re.findall(r"(?:[^,\[]+|\[[^\]]*\])+", nodelist):
            hosts.extend(_expand_host(part))
    if not hosts:
        raise ConfigError(f"SLURM_JOB_NODELIST={nodelist!r} is not a Slurm host list (such as "
                          "node[01-03],gpu1); fix it, or give --master-addr")
    return hosts


def _expand_host(pattern: str) -> list[str]:
    match = re.search(r"\[([^\]]*)\]", pattern)
    if match is None:
        return [pattern]
    head, tail = pattern[: match.start()], pattern[match.end():]
    return [head + item + rest for item in _expand_ranges(match.group(1))
            for rest in _expand_host(tail)]


def _expand_ranges(ranges: str) -> list[str]:
    items = []
    for piece in ranges.split(","):
        low, _, high = piece.partition("-")
        if not high:
            items.append(low)
            continue
        width = len(low)  # node[01-03] keeps its leading zeros
        items.extend(str(number).zfill(width) for number in range(int(low), int(high) + 1))
    return items
