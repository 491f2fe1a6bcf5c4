"""Jobs submitted with the repo's own ``scripts/slurm/*.sbatch``, as a user would, and
what the tests read of them: Slurm's record, the job's output file, cycle's events, the final
weights and any process of the job still alive after it.

Each job runs in its own directory, which is its submit directory: the template puts the output
file (``cycler-<id>.out``) and the checkpoints there. Only ``$CYCLER_VENV`` is set for it, to an
"environment" whose ``activate`` puts this interpreter and this checkout first.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
from local_slurm import LocalSlurm

from cycler.protocol.events import read_events

REPO = Path(__file__).resolve().parents[2]
SINGLE_NODE = REPO / "scripts" / "slurm" / "single_node.sbatch"
MULTI_NODE = REPO / "scripts" / "slurm" / "multi_node.sbatch"
EXAMPLE = REPO / "examples" / "train.py"
# examples/train.py small and deterministic: 256 steps, a checkpoint every 40, one DataLoader
# worker (a process that a stray signal could kill). --step-delay only sleeps, so it sets how long
# a run lasts without changing the weights: one uninterrupted run is the reference for all.
TRAIN_ARGS = ["--epochs", "2", "--samples", "2048", "--batch-size", "16", "--hidden", "64",
              "--checkpoint-every", "40", "--workers", "1"]
# A script that commits through the savers only (cycling_utils idioms, no StepControl): its stop
# checkpoint is its next commit after the request. --batch-delay only sleeps, as above.
SAVER_ONLY = REPO / "tests" / "compat" / "scripts" / "ddp_classifier.py"
SAVER_ONLY_ARGS = ["--epochs", "3", "--samples", "1536", "--save-every", "10"]
FINISHED = frozenset({"COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED",
                      "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"})
WAIT_TIMEOUT = 240.0  # a job may wait for a CPU behind the others, and starts slowly on 2 cores


def write_environment(directory: Path) -> Path:
    """A stand-in for the user's virtual environment: ``bin/activate`` only sets the paths."""
    bin_directory = directory / "bin"
    bin_directory.mkdir(parents=True, exist_ok=True)
    scripts = {str(Path(sys.executable).parent)}
    if (cycle := shutil.which("cycle")) is not None:
        scripts.add(str(Path(cycle).parent))
    (bin_directory / "activate").write_text(
        f'export PATH="{":".join(sorted(scripts))}:$PATH"\n'
        f'export PYTHONPATH="{REPO}${{PYTHONPATH:+:$PYTHONPATH}}"\n')
    return directory


@dataclass
class Run:
    """One start of a job, from cycle's events: its stop and how long each part took."""

    code: int | None
    signal_at: float | None = None
    commit_after_signal: float | None = None
    exit_after_signal: float | None = None
    started_at: float | None = None
    ended_at: float | None = None


@dataclass
class Outcome:
    """What a scenario left behind, for the tests to judge."""

    job_id: str
    directory: Path
    fields: dict[str, str] = field(repr=False)
    log: str = field(repr=False)
    events: list[dict[str, Any]] = field(repr=False)
    survivors: list[str]
    seconds: float
    notes: dict[str, Any] = field(default_factory=dict)

    @property
    def final_weights(self) -> Path:
        return self.directory / "final.pt"

    def runs(self) -> list[Run]:
        return runs_of(self.events)

    def event_lines(self, name: str) -> list[dict[str, Any]]:
        return [event for event in self.events if event["event"] == name]

    def every_node_events(self) -> list[list[dict[str, Any]]]:
        """Each node's cycle events, node 0's first (they are :attr:`events`)."""
        nodes = int(self.fields.get("NumNodes", "1"))
        return [_events_of(self.directory, node) for node in range(nodes)]


def _events_of(directory: Path, node: int) -> list[dict[str, Any]]:
    path = directory / "checkpoints" / ".cycler" / f"events-node{node}.jsonl"
    return read_events(path) if path.exists() else []


def runs_of(events: list[dict[str, Any]]) -> list[Run]:
    """Split the events at each ``start``: one :class:`Run` per start of ``cycle run``."""
    runs: list[Run] = []
    for event in events:
        name, at = event["event"], event["time"]
        if name == "start":
            runs.append(Run(code=None, started_at=at))
        elif not runs:
            continue
        elif name == "signal" and runs[-1].signal_at is None:
            runs[-1].signal_at = at
        elif name == "checkpoint_committed" and runs[-1].signal_at is not None \
                and runs[-1].commit_after_signal is None:
            runs[-1].commit_after_signal = at - runs[-1].signal_at
        elif name == "exit":
            runs[-1].code, runs[-1].ended_at = event.get("code"), at
            if runs[-1].signal_at is not None:
                runs[-1].exit_after_signal = at - runs[-1].signal_at
    return runs


class SubmittedJob:
    """A job submitted from ``directory`` with the template; waits on it and reads it."""

    def __init__(self, cluster: LocalSlurm, directory: Path, job_id: str) -> None:
        self.cluster = cluster
        self.directory = directory
        self.id = job_id
        self.submitted_at = time.monotonic()

    @property
    def output(self) -> Path:
        return self.directory / f"cycler-{self.id}.out"

    def log(self) -> str:
        with contextlib.suppress(FileNotFoundError):
            return self.output.read_text(errors="replace")
        return ""

    def events(self) -> list[dict[str, Any]]:
        return _events_of(self.directory, 0)

    def fields(self) -> dict[str, str]:
        return self.cluster.job(self.id)

    def wait_for_log(self, text: str, timeout: float = WAIT_TIMEOUT) -> None:
        self._wait(lambda: text in self.log(), f"{text!r} in the job's output", timeout)

    def wait_for_restarts(self, restarts: int, timeout: float = WAIT_TIMEOUT) -> dict[str, str]:
        """Until Slurm has requeued the job ``restarts`` times and it is waiting to rerun."""
        def requeued() -> bool:
            fields = self.fields()
            if fields.get("Restarts") == str(restarts):
                return fields.get("JobState") in ("PENDING", "RUNNING", *FINISHED)
            if fields.get("JobState") in FINISHED:
                raise AssertionError(f"job {self.id} ended without being requeued: {fields}\n"
                                     f"output:\n{self.log()[-3000:]}")
            return False
        self._wait(requeued, f"Restarts={restarts}", timeout)
        return self.fields()

    def wait_until_finished(self, timeout: float = WAIT_TIMEOUT) -> dict[str, str]:
        self._wait(lambda: self.fields().get("JobState") in FINISHED, "the job's end", timeout)
        return self.fields()

    def _wait(self, condition: Any, what: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"job {self.id}: no {what} after {timeout:g} s; scontrol: {self.fields()}\n"
                    f"output:\n{self.log()[-3000:]}")
            time.sleep(0.3)

    def outcome(self, survivors: list[str], **notes: Any) -> Outcome:
        return Outcome(self.id, self.directory, self.fields(), self.log(), self.events(),
                       survivors, time.monotonic() - self.submitted_at, dict(notes))


def submit(cluster: LocalSlurm, directory: Path, environment: Path, *sbatch_args: str,
           step_delay: float, template: Path = SINGLE_NODE,
           saver_only: bool = False) -> SubmittedJob:
    """``sbatch [ARGS] TEMPLATE examples/train.py ...`` from ``directory`` (with
    ``saver_only``, the compat suite's saver-only script instead)."""
    directory.mkdir(parents=True, exist_ok=True)
    env = {key: value for key, value in cluster.env.items()
           if not key.startswith(("SLURM_", "CYCLER_")) or key == "SLURM_CONF"}
    env.update(CYCLER_VENV=str(environment), OMP_NUM_THREADS="1")
    script = [str(SAVER_ONLY), *SAVER_ONLY_ARGS, "--batch-delay", str(step_delay)] \
        if saver_only else [str(EXAMPLE), *TRAIN_ARGS, "--step-delay", str(step_delay)]
    command = ["sbatch", "--parsable", "--cpus-per-task=1", *sbatch_args, str(template),
               *script, "--final-weights", str(directory / "final.pt")]
    job_id = cluster.run(command, check=True, env=env, cwd=directory).strip().split(";")[0]
    return SubmittedJob(cluster, directory, job_id)


def survivors(directory: Path, settle: float = 3.0) -> list[str]:
    """Processes of the jobs run from ``directory`` (their environment names it: the submit
    and checkpoint directories) still alive ``settle`` seconds after the job left the node.
    They are killed once recorded, so that one failure does not leak into the next test."""
    deadline = time.monotonic() + settle
    while (found := _processes_of(directory)) and time.monotonic() < deadline:
        time.sleep(0.2)
    described = [_describe(process) for process in found]
    for process in found:
        with contextlib.suppress(psutil.Error):
            process.kill()
    return described


def _processes_of(directory: Path) -> list[psutil.Process]:
    mark = str(directory)
    found = []
    for process in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if process.pid == os.getpid() or process.status() == psutil.STATUS_ZOMBIE:
                continue
            if any(mark in value for value in process.environ().values()) or \
                    any(mark in word for word in process.cmdline()):
                found.append(process)
    return found


def _describe(process: psutil.Process) -> str:
    with contextlib.suppress(psutil.Error):
        return f"{process.pid} {' '.join(process.cmdline())[:160]}"
    return f"{process.pid} (gone)"
