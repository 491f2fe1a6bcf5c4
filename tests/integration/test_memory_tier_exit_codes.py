"""Issue 25, finding 3: with the memory tier, an end or a stop whose newest checkpoint did not
reach the checkpoint root exits EXIT_NOT_PERSISTED with one line naming where it is, and keeps
the memory tier. Reproduced as the finding did: a real `cycle run` whose checkpoint root is a
real 8 MB tmpfs that fills up during the job (exit 0 and exit 75 before the fix)."""

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

from cycler import EXIT_REQUEUE, EXIT_SUCCESS, list_checkpoints
from cycler.checkpoint.memory_roots import memory_base, memory_root
from cycler.protocol.events import read_events
from cycler.protocol.exit_codes import EXIT_NOT_PERSISTED

JOB = """
import os, time, torch
from cycler import AtomicDirectory, StepControl, atomic_torch_save, default_checkpoint_root
s = AtomicDirectory(default_checkpoint_root(), keep_last=3)
w, start = torch.zeros(125000, dtype=torch.float64), 0
if (p := s.latest_checkpoint()):
    st = torch.load(os.path.join(p, "train.pt"), weights_only=True); w, start = st["w"], st["step"]
c = StepControl(every_steps=5, start_step=start)
for step in range(start, int(os.environ["STEPS"])):
    w += 1; time.sleep(0.2)
    d = c.step()
    if d.checkpoint:
        dd = s.prepare_checkpoint_directory()
        atomic_torch_save({"w": w, "step": step + 1}, os.path.join(dd, "train.pt"))
        s.symlink_latest(dd, metadata={"step": step + 1})
    if d.stop: break
c.close()
"""


@pytest.fixture
def root_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A real 8 MB tmpfs for the checkpoint root (skipped where mounting needs root)."""
    with mounted_tmpfs(tmp_path / "small", "8m") as mount:
        yield mount


def start(tmp_path: Path, root: Path, steps: int) -> subprocess.Popen[str]:
    script = tmp_path / "job.py"
    script.write_text(JOB)
    command = [sys.executable, "-m", "cycler_cli", "run", "--memory-dir", str(tmp_path / "shm"),
               "--checkpoint-dir", str(root), "--no-requeue", str(script)]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "STEPS": str(steps), "OMP_NUM_THREADS": "1"})


def valid(root: Path) -> list[int]:
    return [c.index for c in list_checkpoints(root) if c.valid] if root.is_dir() else []


def wait_for(condition: object, process: subprocess.Popen[str], what: str) -> None:
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        assert process.poll() is None, process.communicate()[0]
        if condition():  # type: ignore[operator]
            return
        time.sleep(0.02)
    raise AssertionError(f"{what} within 90 s")


def fill(mount: Path) -> None:
    """Fill the tmpfs but 64 KB (room for the supervisor's record, none for a checkpoint)."""
    stats = os.statvfs(mount)
    with open(mount / "fill", "wb") as filler:
        filler.write(b"\0" * max(0, stats.f_bavail * stats.f_frsize - (64 << 10)))


def assert_newest_only_in_memory(output: str, code: int, root: Path, memory: Path) -> None:
    assert code == EXIT_NOT_PERSISTED, output
    assert memory.is_dir(), "the memory tier holds the newest state: it is kept"
    assert valid(memory)[-1] > max(valid(root), default=-1)
    said = [line for line in output.splitlines() if str(memory) in line and "only" in line]
    assert said, output
    assert "persist_failed error=" not in output, "events are sentences, not raw names"
    assert "exit 0:" not in output and "exit 75:" not in output, \
        "the exit said is the one that happens (hostile review: 'exit 0' came before 74)"
    events = read_events(root / ".cycler" / "events-node0.jsonl")
    assert any(e.get("event") == "persist_failed" for e in events)


def test_an_end_whose_newest_checkpoint_is_only_in_memory_is_not_exit_0(
        tmp_path: Path, root_tmpfs: Path) -> None:
    root = root_tmpfs / "ck"
    memory = memory_root(memory_base(tmp_path / "shm"), root)
    process = start(tmp_path, root, steps=40)
    wait_for(lambda: valid(root), process, "a first persisted checkpoint")
    fill(root_tmpfs)
    output, _ = process.communicate(timeout=120)
    assert process.returncode != EXIT_SUCCESS, output
    assert_newest_only_in_memory(output, process.returncode, root, memory)


def test_a_stop_whose_checkpoint_did_not_reach_the_root_is_not_exit_75(
        tmp_path: Path, root_tmpfs: Path) -> None:
    root = root_tmpfs / "ck"
    memory = memory_root(memory_base(tmp_path / "shm"), root)
    process = start(tmp_path, root, steps=1000)
    wait_for(lambda: valid(root), process, "a first persisted checkpoint")
    fill(root_tmpfs)
    wait_for(lambda: valid(memory) and valid(memory)[-1] >= 2, process,
             "a checkpoint in memory only")
    process.send_signal(signal.SIGTERM)
    output, _ = process.communicate(timeout=120)
    assert process.returncode != EXIT_REQUEUE, output
    assert_newest_only_in_memory(output, process.returncode, root, memory)
