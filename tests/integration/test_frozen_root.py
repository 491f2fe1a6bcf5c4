"""A checkpoint root that freezes does not stall training (issue 36). The root is a FUSE mount
(Debian's `bindfs` over a scratch directory) whose daemon is stopped with SIGSTOP for 60 s, as
a parallel filesystem's stall stops every call on it, then continued; a real 2-node job
(two `cycle run` processes of one gloo rank each on 127.0.0.1) trains through the freeze: its
steps go on, no node is taken for gone, no hang is declared, and both nodes end 0.

Needs root, /dev/fuse and bindfs (`apt-get install bindfs`, which .ci/run installs); skipped
with that reason elsewhere. Marker ``fuse``: .ci/run runs it in the two-host lane, after the
packages are installed."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from gloo_ranks import free_port

FREEZE_SECONDS = 60.0

JOB = """
import os, sys, time, torch, torch.distributed as dist
from cycler import StepControl
dist.init_process_group("gloo")
steps, done = sys.argv[1], sys.argv[2]
control = StepControl(every_steps=10**9)
step = 0
while True:
    time.sleep(0.05)
    decision = control.step()
    finished = torch.tensor([1 if os.path.exists(done) else 0])
    dist.all_reduce(finished)
    step += 1
    if dist.get_rank() == 0:
        with open(steps, "a") as log:
            log.write(f"{step}\\n")
    if finished.item() or decision.stop:
        break
control.close()
dist.destroy_process_group()
"""


def fuse_missing() -> str | None:
    if os.geteuid() != 0:
        return "mounting a FUSE filesystem needs root"
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse: FUSE is missing on this machine"
    if shutil.which("bindfs") is None:
        return "bindfs is not installed (apt-get install bindfs)"
    return None


pytestmark = [pytest.mark.fuse,
              pytest.mark.skipif(fuse_missing() is not None, reason=str(fuse_missing()))]


@pytest.fixture
def frozen_mount(tmp_path: Path) -> Iterator[tuple[Path, subprocess.Popen[bytes]]]:
    """A bindfs mount of a scratch directory, its daemon in the foreground (ours to stop)."""
    source, mount = tmp_path / "source", tmp_path / "mount"
    source.mkdir()
    mount.mkdir()
    daemon = subprocess.Popen(["bindfs", "-f", str(source), str(mount)])
    try:
        deadline = time.monotonic() + 30
        while not os.path.ismount(mount):
            assert daemon.poll() is None and time.monotonic() < deadline, "bindfs did not mount"
            time.sleep(0.1)
        yield mount, daemon
    finally:
        daemon.send_signal(signal.SIGCONT)
        subprocess.run(["umount", "-l", str(mount)], check=False, capture_output=True)
        daemon.terminate()
        daemon.wait(30)


def steps_done(path: Path) -> int:
    return len(path.read_text().split()) if path.exists() else 0


def wait_for_steps(path: Path, count: int, nodes: list[subprocess.Popen[str]]) -> None:
    deadline = time.monotonic() + 300
    while steps_done(path) < count:
        assert all(node.poll() is None for node in nodes), "a node ended before training"
        assert time.monotonic() < deadline, f"fewer than {count} steps in 300 s"
        time.sleep(0.2)


def frozen(path: Path) -> bool:
    """Whether a stat of ``path`` hangs (the FUSE daemon answers nothing)."""
    try:
        subprocess.run(["stat", str(path)], capture_output=True, timeout=3)
    except subprocess.TimeoutExpired:
        return True
    return False


def test_a_two_node_job_trains_through_a_minute_long_freeze_of_its_checkpoint_root(
        tmp_path: Path, frozen_mount: tuple[Path, subprocess.Popen[bytes]]) -> None:
    mount, daemon = frozen_mount
    script, steps, done = tmp_path / "job.py", tmp_path / "steps.txt", tmp_path / "done"
    script.write_text(JOB)
    port = str(free_port())
    nodes = [subprocess.Popen(
        [sys.executable, "-m", "cycler_cli", "run", "--nnodes", "2", "--node-rank", str(rank),
         "--nproc-per-node", "1", "--master-addr", "127.0.0.1", "--master-port", port,
         "--checkpoint-dir", str(mount / "ck"), "--node-timeout", "30", "--no-requeue",
         str(script), str(steps), str(done)],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"}) for rank in (0, 1)]
    try:
        wait_for_steps(steps, 20, nodes)
        time.sleep(5)  # the first step's events are written, the links are up
        daemon.send_signal(signal.SIGSTOP)
        frozen_at, before = time.monotonic(), steps_done(steps)
        assert frozen(mount / "ck"), "the root did not freeze"
        time.sleep(max(0.0, FREEZE_SECONDS - (time.monotonic() - frozen_at)))
        during = steps_done(steps) - before
        daemon.send_signal(signal.SIGCONT)
        assert all(node.poll() is None for node in nodes), "a node ended during the freeze"
        wait_for_steps(steps, before + during + 20, nodes)  # and after it
        done.touch()
        outputs = [node.communicate(timeout=180)[0] for node in nodes]
    finally:
        daemon.send_signal(signal.SIGCONT)
        for node in nodes:
            if node.poll() is None:
                node.kill()
    joined = "\n".join(outputs)
    assert [node.returncode for node in nodes] == [0, 0], joined
    assert "is gone" not in joined and "hang" not in joined.lower(), joined
    assert during >= 100, f"{during} steps in the {FREEZE_SECONDS:g} s freeze: training stalled"
