"""Runs of the stacks' scripts under ``cycle run``: stopped by a real SIGTERM once a given step
is printed, killed with -9 in the middle of a save, resumed, and their final weights compared.

Every script prints ``step S`` after each step and writes ``<out>/final.pt`` at the end of
training; it runs under ``stack_scripts/slow_saves.py``, which makes a save slow on request.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import torch

from cycler import EXIT_REQUEUE, EXIT_SUCCESS, list_checkpoints

SCRIPTS = Path(__file__).resolve().parent / "stack_scripts"
STEP_LINE = re.compile(r"^step (\d+)$")


class StackRun:
    """One ``cycle run`` of a stack script on ``nproc`` gloo workers (2 unless told), its
    output read as it comes."""

    def __init__(self, out: Path, script: Path, *script_args: str,
                 env: dict[str, str] | None = None, nproc: int = 2) -> None:
        self.out, self.lines = out, []
        out.mkdir(parents=True, exist_ok=True)
        command = [sys.executable, "-m", "cycler_cli", "run", "--nproc-per-node", str(nproc),
                   "--checkpoint-dir", str(out / "ck"), "--grace", "120", "--no-requeue",
                   str(SCRIPTS / "slow_saves.py"), str(script), *script_args]
        environment = {key: value for key, value in os.environ.items()
                       if not key.startswith(("SLURM_", "CYCLER_"))}
        self.process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=out,
            env={**environment, "OMP_NUM_THREADS": "1", **(env or {})})
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line.rstrip("\n"))

    def first_step_seen(self) -> int:
        return min((int(m.group(1)) for line in list(self.lines)
                    if (m := STEP_LINE.match(line))), default=-1)

    def steps_seen(self) -> int:
        return max((int(m.group(1)) for line in list(self.lines)
                    if (m := STEP_LINE.match(line))), default=-1)

    def wait_until(self, condition, what: str, timeout: float = 240.0) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            assert self.process.poll() is None, f"exited {self.process.returncode} before " \
                                                f"{what}:\n{self.output()}"
            assert time.monotonic() < deadline, f"timed out waiting for {what}:\n{self.output()}"
            time.sleep(0.02)

    def stop_after_step(self, step: int) -> int:
        """SIGTERM to ``cycle run`` once a worker printed ``step`` (a step no save falls on);
        the exit code."""
        self.wait_until(lambda: self.steps_seen() >= step, f"step {step}")
        self.process.send_signal(signal.SIGTERM)
        return self.finish(timeout=180)

    def stop_every_process_after_step(self, step: int) -> int:
        """SIGTERM to every process of the job at once (as Slurm signals a job) once a worker
        printed ``step``; the exit code."""
        self.wait_until(lambda: self.steps_seen() >= step, f"step {step}")
        for process in [psutil.Process(self.process.pid),
                        *psutil.Process(self.process.pid).children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                process.send_signal(signal.SIGTERM)
        return self.finish(timeout=180)

    def kill_during_save(self, marker: Path) -> None:
        """kill -9 of every process of the job once a save is half written (``marker``)."""
        self.wait_until(marker.exists, "a save in progress")
        tree = [psutil.Process(self.process.pid), *psutil.Process(self.process.pid).children(
            recursive=True)]
        for process in tree:
            with contextlib.suppress(psutil.Error):
                process.kill()
        self.finish(timeout=30)

    def finish(self, timeout: float = 300.0) -> int:
        code = self.process.wait(timeout)
        self._reader.join(10)
        return code

    def output(self) -> str:
        return "\n".join(self.lines[-80:])


def committed_steps(root: Path) -> list[int]:
    return sorted(c.manifest.step for c in list_checkpoints(root)
                  if c.valid and c.manifest is not None and c.manifest.step is not None)


def run_to_the_end(out: Path, script: Path, *script_args: str,
                   nproc: int = 2) -> dict[str, torch.Tensor]:
    run = StackRun(out, script, *script_args, nproc=nproc)
    code = run.finish()
    assert code == EXIT_SUCCESS, run.output()
    return torch.load(out / "final.pt", weights_only=True)


def stop_kill_and_finish(out: Path, script: Path, stop_steps: list[int], save_steps: int,
                         *script_args: str, kill: bool = True, nproc: int = 2) -> list[int]:
    """SIGTERM after each of ``stop_steps``, then (with ``kill``) kill -9 in the middle of the
    next periodic save, then a run to the end; the exit codes, after checking what each stop
    committed."""
    codes = []
    for step in stop_steps:
        before = committed_steps(out / "ck")
        run = StackRun(out, script, *script_args, nproc=nproc)
        codes.append(run.stop_after_step(step))
        assert codes[-1] == EXIT_REQUEUE, run.output()
        assert_resumed(run, before)
        stop = committed_steps(out / "ck")[-1]
        assert stop not in before and stop >= step and stop % save_steps, (stop, run.output())
    if kill:
        kill_during_a_save(out, script, *script_args, nproc=nproc)
    before = committed_steps(out / "ck")
    run = StackRun(out, script, *script_args, nproc=nproc)
    codes.append(run.finish())
    assert codes[-1] == EXIT_SUCCESS, run.output()
    assert_resumed(run, before)
    return codes


def assert_resumed(run: StackRun, committed: list[int]) -> None:
    """The run trained on from the newest of ``committed`` (a run that started over would end
    equal to an uninterrupted one too, and prove nothing)."""
    if committed:
        assert run.first_step_seen() >= committed[-1], (committed, run.output())


def kill_during_a_save(out: Path, script: Path, *script_args: str, nproc: int = 2) -> None:
    """kill -9 of the whole job in the middle of its next save; nothing of it is committed."""
    marker = out / "saving"
    committed = committed_steps(out / "ck")
    StackRun(out, script, *script_args,
             env={"SLOW_SAVE_MARKER": str(marker)}, nproc=nproc).kill_during_save(marker)
    assert committed_steps(out / "ck") == committed, "a save killed midway was committed"
    torn = len(list((out / "ck").glob("*_checkpoint_*"))) - len(committed)
    assert torn == 1, "the kill came outside a save"


def assert_replay_verified(root: Path, ranks: int = 2) -> None:
    """``cycle status --json`` of ``root`` says the last restart's replayed steps (after the
    kill -9) were identical: the stack's callback recorded each step's loss."""
    status = subprocess.run([sys.executable, "-m", "cycler_cli", "status", "--json", str(root)],
                            capture_output=True, text=True, check=True)
    replays = json.loads(status.stdout)["replays"]
    assert replays and replays[-1]["verdict"] == "verified", replays
    assert replays[-1]["steps"] >= 1 and replays[-1]["ranks"] == ranks, replays


def assert_same_weights(expected: dict[str, torch.Tensor], actual: dict[str, torch.Tensor],
                        what: str) -> None:
    assert expected.keys() == actual.keys()
    for name in expected:
        assert torch.equal(expected[name], actual[name]), f"{name} differs {what}"
