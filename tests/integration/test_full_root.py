"""A checkpoint root that is full (hostile review of issue 25): `cycle run` says so in one line
at its start (exit 2), and a stop whose control file's copy in the root cannot be written
still reaches the workers (through the node's file), is reported as such, and ends in 75
from the last checkpoint with the workers' full disk said in one line, no traceback. Real
`cycle run` processes on a real 1 MB tmpfs root, filled with `dd` as a user's other files
would fill it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tmpfs import mounted_tmpfs

JOB = """
import os, time, torch
from cycler import AtomicDirectory, StepControl, atomic_torch_save, default_checkpoint_root
s = AtomicDirectory(default_checkpoint_root(), keep_last=2)
c = StepControl(every_steps=400)
for step in range(100000):
    time.sleep(0.05)
    d = c.step()
    if d.checkpoint or step == 4:  # one commit early, the next ones 20 s apart
        dd = s.prepare_checkpoint_directory()
        atomic_torch_save({"step": step + 1}, os.path.join(dd, "train.pt"))
        s.symlink_latest(dd, metadata={"step": step + 1})
        print("committed", step + 1, flush=True)
    if d.stop: break
c.close()
"""


@pytest.fixture
def small_root(tmp_path: Path) -> Iterator[Path]:
    with mounted_tmpfs(tmp_path / "small", "1m") as mount:
        yield mount


def fill(mount: Path) -> None:
    subprocess.run(["dd", "if=/dev/zero", f"of={mount / 'fill'}", "bs=64k"],
                   capture_output=True, check=False)


def cycle_run(tmp_path: Path, root: Path, *extra: str) -> subprocess.Popen[str]:
    script = tmp_path / "job.py"
    script.write_text(JOB)
    return subprocess.Popen(
        [sys.executable, "-m", "cycler_cli", "run", "--grace", "4", *extra,
         "--checkpoint-dir", str(root), str(script)],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_a_root_full_before_the_start_is_one_line_and_exit_2(
        tmp_path: Path, small_root: Path) -> None:
    (small_root / "ck").mkdir()
    fill(small_root)
    process = cycle_run(tmp_path, small_root / "ck")
    output, _ = process.communicate(timeout=120)
    assert process.returncode == 2, output
    assert "Traceback" not in output
    assert "free space" in output or "no space" in output.lower(), output


def test_a_stop_on_a_full_root_reaches_the_workers_and_is_reported_truthfully(
        tmp_path: Path, small_root: Path) -> None:
    process = cycle_run(tmp_path, small_root / "ck")
    assert process.stdout is not None
    lines = []
    for line in process.stdout:  # the first commit, then the disk fills
        lines.append(line)
        if line.startswith("committed"):
            break
    fill(small_root)
    time.sleep(0.5)
    os.kill(process.pid, signal.SIGTERM)
    rest, _ = process.communicate(timeout=120)
    output = "".join(lines) + rest
    assert "Traceback" not in output, output
    assert "cannot write the control file's copy in the checkpoint root" in output, output
    assert "workers were told on the node" in output, output
    assert "SIGTERM instead" not in output, output
    assert "cycler: rank 0: no space left" in output, output  # the stop's save, in one line
    assert "resumes from checkpoint 0" in output, output
    assert process.returncode == 75, output
