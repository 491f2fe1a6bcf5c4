"""The load ``cycle run`` puts on the shared checkpoint root while it only trains, counted with
strace over every process of a real job (issue 36).

On a parallel filesystem every ``stat``, ``open`` and ``readlink`` goes to a metadata server
that all the cluster's nodes share. Between checkpoints a rank must touch no path in the root
(its control file, announcements and beacons are on the node), and the supervisor at most about
one a second (it reads the root's link when the workers note a commit, and now and then).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from cycle_jobs import training_workers, wait_for

from cycler.protocol.events import read_events
from cycler.protocol.progress import read_beacons
from cycler.protocol.record import RunRecord

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train.py"
WINDOW_SECONDS = 12.0
MOST_PER_SECOND = 1.0

pytestmark = pytest.mark.skipif(shutil.which("strace") is None,
                                reason="strace is not installed (apt-get install strace)")


def test_a_node_that_only_trains_touches_the_checkpoint_root_at_most_once_a_second(
        tmp_path: Path) -> None:
    root = tmp_path / "ck"
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "CYCLER_"))}
    command = [sys.executable, "-m", "cycler_cli", "run", "--nproc-per-node", "2",
               "--checkpoint-dir", str(root), str(EXAMPLE), "--checkpoint-every", "0",
               "--epochs", "1000", "--step-delay", "0.01"]
    with open(tmp_path / "stderr.txt", "wb") as stderr:
        job = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr,
                               env=environment, cwd=tmp_path)
    try:
        events = RunRecord(root).events_path(0)
        wait_for(lambda: "first_step" in [e["event"] for e in read_events(events)],
                 "the first step")
        workers = training_workers(job)
        assert len(workers) == 2
        progress = Path(_launcher(job).environ()["CYCLER_PROGRESS_DIR"])
        steps_before = _steps(progress)
        calls = _traced(tmp_path / "trace", [job.pid, *(p.pid for p in job_tree(job))], root)
        steps = _steps(progress) - steps_before
        worker_threads = {t.id for w in workers for t in _threads(w)}
    finally:
        with contextlib.suppress(ProcessLookupError):
            job.send_signal(signal.SIGINT)
            job.send_signal(signal.SIGINT)
        job.wait(60)
    by_workers = [call for tid, call in calls if tid in worker_threads]
    print(f"calls on the root in {WINDOW_SECONDS:g} s: {len(calls)} "  # the figure, with -s
          f"({len(by_workers)} by the ranks, in {steps} steps)")
    assert steps > 10, f"the ranks made only {steps} steps while traced"
    assert by_workers == [], (f"the ranks touched the checkpoint root {len(by_workers)} times "
                              f"in {steps} steps: {sorted(set(by_workers))[:10]}")
    assert len(calls) <= MOST_PER_SECOND * WINDOW_SECONDS, (
        f"{len(calls)} calls on the checkpoint root in {WINDOW_SECONDS:g} s: "
        f"{sorted(set(call for _, call in calls))[:10]}")


def job_tree(job: subprocess.Popen[bytes]) -> list[psutil.Process]:
    return psutil.Process(job.pid).children(recursive=True)


def _launcher(job: subprocess.Popen[bytes]) -> psutil.Process:
    return next(p for p in job_tree(job)
                if "cycler.supervisor.launch.launcher" in " ".join(p.cmdline()))


def _threads(process: psutil.Process) -> list[psutil._common.pthread]:
    with contextlib.suppress(psutil.Error):
        return process.threads()
    return []


def _steps(progress: Path) -> int:
    return sum(reading.step for reading in read_beacons(progress))


def _traced(output: Path, pids: list[int], root: Path) -> list[tuple[int, str]]:
    """Every system call naming a path in ``root`` (or a descriptor of one) that ``pids``
    (every thread of each) make in :data:`WINDOW_SECONDS`: (thread id, call and path)."""
    command = ["strace", "-f", "-y", "-e", "trace=file,desc", "-o", str(output)]
    for pid in pids:
        command += ["-p", str(pid)]
    tracer = subprocess.Popen(command, stderr=subprocess.PIPE)
    time.sleep(WINDOW_SECONDS)
    tracer.send_signal(signal.SIGINT)  # strace detaches and ends
    _, said = tracer.communicate(timeout=30)
    if b"Operation not permitted" in said:
        pytest.skip(f"strace cannot attach here: {said.decode(errors='replace')[:200]}")
    found = []
    inside = re.compile(re.escape(str(root)) + r"(/[^\"\s>,)]*)?(?=[\">,)\s])")
    for line in output.read_text(errors="replace").splitlines():
        match = inside.search(line)
        tid, _, rest = line.partition(" ")
        if match and tid.isdigit():
            found.append((int(tid), f"{rest.split('(')[0]} {match.group(0)}"))
    return found
