"""``cycle run`` jobs for the real-process tests: start one, wait for files, check the tree.

A job runs a worker script written into the test's directory with ``--mode MODE --dir DIR``
(and ``--steps N``) after it; the tests read what the workers write there.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from cycler.checkpoint.layout import CheckpointLayout
from cycler.protocol.events import read_events

STARTUP_TIMEOUT = 90.0  # torch imports are slow on a loaded 2-core machine


class Job:
    """One ``cycle run`` process with its directories and output files."""

    def __init__(self, tmp_path: Path, *flags: str, mode: str = "stop", steps: int | None = None,
                 nproc: int = 1, env: dict[str, str] | None = None, worker: str) -> None:
        self.dir = tmp_path
        self.root = tmp_path / "ck"
        self.layout = CheckpointLayout(self.root)
        script = tmp_path / "worker.py"
        script.write_text(worker)
        script_args = ["--mode", mode, "--dir", str(tmp_path)]
        script_args += [] if steps is None else ["--steps", str(steps)]
        command = [sys.executable, "-m", "cycler_cli", "run", "--nproc-per-node", str(nproc),
                   "--checkpoint-dir", str(self.root), *flags, str(script), *script_args]
        self.stdout = (tmp_path / "stdout.txt").open("wb")
        self.stderr = (tmp_path / "stderr.txt").open("wb")
        environment = {key: value for key, value in os.environ.items()
                       if not key.startswith(("SLURM_", "CYCLER_"))}
        self.process = subprocess.Popen(command, stdout=self.stdout, stderr=self.stderr,
                                        env={**environment, **(env or {})}, cwd=tmp_path)

    def wait_ready(self, nproc: int = 1, start: int = 0) -> None:
        wait_for(lambda: all((self.dir / f"ready-{rank}-{start}").exists()
                             for rank in range(nproc)), "workers ready", self)

    def wait(self, timeout: float = 60.0) -> int:
        try:
            return self.process.wait(timeout)
        finally:
            self.stdout.close()
            self.stderr.close()

    def send(self, number: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.process.send_signal(number)

    def tree(self) -> list[psutil.Process]:
        """Every process below the supervisor: torchrun, workers, their children, the watchdog."""
        return psutil.Process(self.process.pid).children(recursive=True)

    def events(self) -> list[dict]:
        return read_events(self.layout.record.events_path(0))

    def event_names(self) -> list[str]:
        return [event["event"] for event in self.events()]

    def output(self) -> str:
        return (self.dir / "stderr.txt").read_text(errors="replace")


def wait_for(condition: Callable[[], bool], what: str, job: Job | None = None,
             timeout: float = STARTUP_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if job is not None and job.process.poll() is not None:
            raise AssertionError(f"cycle run exited {job.process.returncode} while waiting for "
                                 f"{what}:\n{job.output()[-3000:]}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def assert_all_gone(processes: list[psutil.Process], within: float = 5.0) -> None:
    deadline = time.monotonic() + within
    alive = processes
    while alive and time.monotonic() < deadline:
        alive = [p for p in alive if _running(p)]
        time.sleep(0.05)
    assert not alive, f"survivors: {[(p.pid, _cmdline(p)) for p in alive]}"


def _running(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _cmdline(process: psutil.Process) -> str:
    with contextlib.suppress(psutil.Error):
        return " ".join(process.cmdline())[:120]
    return "?"


def fake_scontrol(tmp_path: Path, job_state: str = "RUNNING",
                  kill_wait: int = 30) -> tuple[dict[str, str], Path]:
    """A ``scontrol`` on PATH: answers ``show job`` with ``job_state`` (no time limit) and
    ``show config`` with ``kill_wait``, records other calls."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    record = tmp_path / "scontrol-calls.txt"
    fake = bin_dir / "scontrol"
    fake.write_text('#!/bin/sh\n'
                    'if [ "$1 $2" = "show config" ]; then '
                    f'echo "KillWait                = {kill_wait} sec"; exit 0; fi\n'
                    f'if [ "$1" = show ]; then echo "JobId=$4 JobState={job_state}"; exit 0; fi\n'
                    f'echo "$@" >> {record}\n')
    fake.chmod(0o755)
    return {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}, record


def training_workers(process: subprocess.Popen[str]) -> list[psutil.Process]:
    """torchrun's workers: the processes its agent (cycle's launcher) started. Not found by
    ``LOCAL_RANK`` in their environment: a worker forked from the agent (the default) has it
    in ``os.environ``, not in the kernel's copy of the environment it started with."""
    found = []
    for child in psutil.Process(process.pid).children(recursive=True):
        try:
            if "cycler.supervisor.launch.launcher" in " ".join(child.cmdline()):
                found += child.children()
        except psutil.Error:
            continue
    return found
