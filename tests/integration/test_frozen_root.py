"""A checkpoint root that freezes does not stall training (issue 36). The root is a FUSE mount
(Debian's `bindfs` over a scratch directory) whose daemon is stopped with SIGSTOP for 60 s, as
a parallel filesystem's stall stops every call on it, then continued; a real 2-node job
(two `cycle run` processes of one gloo rank each on 127.0.0.1) trains through the freeze: its
steps go on, no node is taken for gone, no hang is declared, and both nodes end 0. And a job
with the memory tier stopped during a freeze longer than its grace: its checkpoints go on in
memory during the freeze, the stop reaches the workers, and `cycle run` ends by the deadline
with exit 74 naming the memory checkpoint, leaving nothing torn in the root.

Needs root, /dev/fuse and bindfs (`apt-get install bindfs`, which .ci/run installs); skipped
with that reason elsewhere. Marker ``fuse``: .ci/run runs it in the two-host lane, after the
packages are installed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from frozen_mounts import freezable_mount, frozen, fuse_missing
from gloo_ranks import free_port

from cycler.checkpoint.listing import list_checkpoints

FREEZE_SECONDS = 60.0
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train.py"

JOB = """
import os, sys, time, torch, torch.distributed as dist
from cycler import AtomicDirectory, StepControl, atomic_torch_save
dist.init_process_group("gloo")
steps, done, save_now = sys.argv[1], sys.argv[2], sys.argv[3]
control = StepControl(every_steps=10**9)
saver = AtomicDirectory(os.environ["CYCLER_CHECKPOINT_DIR"])
step, saved = 0, False
while True:
    time.sleep(0.05)
    decision = control.step()
    flags = torch.tensor([1 if os.path.exists(done) else 0, 1 if os.path.exists(save_now) else 0])
    dist.all_reduce(flags)
    step += 1
    if flags[1].item() and not saved:  # a checkpoint due while the root is frozen
        directory = saver.prepare_checkpoint_directory()
        atomic_torch_save({"step": step}, f"{directory}/rank-{dist.get_rank()}.pt")
        saver.symlink_latest(directory)
        saved = True
    if dist.get_rank() == 0:
        with open(steps, "a") as log:
            log.write(f"{step}\\n")
    if flags[0].item() or decision.stop:
        break
control.close()
dist.destroy_process_group()
"""


pytestmark = [pytest.mark.fuse,
              pytest.mark.skipif(fuse_missing() is not None, reason=str(fuse_missing()))]


@pytest.fixture
def frozen_mount(tmp_path: Path) -> Iterator[tuple[Path, subprocess.Popen[bytes]]]:
    """A bindfs mount of a scratch directory, its daemon in the foreground (ours to stop)."""
    with freezable_mount(tmp_path) as made:
        yield made


def steps_done(path: Path) -> int:
    return len(path.read_text().split()) if path.exists() else 0


def wait_for_steps(path: Path, count: int, nodes: list[subprocess.Popen[str]]) -> None:
    deadline = time.monotonic() + 300
    while steps_done(path) < count:
        assert all(node.poll() is None for node in nodes), "a node ended before training"
        assert time.monotonic() < deadline, f"fewer than {count} steps in 300 s"
        time.sleep(0.2)


def test_a_two_node_job_trains_through_a_minute_long_freeze_of_its_checkpoint_root(
        tmp_path: Path, frozen_mount: tuple[Path, subprocess.Popen[bytes]]) -> None:
    mount, daemon = frozen_mount
    script, steps, done = tmp_path / "job.py", tmp_path / "steps.txt", tmp_path / "done"
    save_now = tmp_path / "save-now"
    script.write_text(JOB)
    port = str(free_port())
    nodes = [subprocess.Popen(
        [sys.executable, "-m", "cycler_cli", "run", "--nnodes", "2", "--node-rank", str(rank),
         "--nproc-per-node", "1", "--master-addr", "127.0.0.1", "--master-port", port,
         "--checkpoint-dir", str(mount / "ck"), "--node-timeout", "30", "--no-requeue",
         str(script), str(steps), str(done), str(save_now)],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"}) for rank in (0, 1)]
    try:
        wait_for_steps(steps, 20, nodes)
        time.sleep(5)  # the first step's events are written, the links are up
        daemon.send_signal(signal.SIGSTOP)
        frozen_at, before = time.monotonic(), steps_done(steps)
        assert frozen(mount / "ck"), "the root did not freeze"
        # Training goes on; 5 s before the thaw a checkpoint falls due: its save waits for
        # the root (no memory tier here) and commits after the thaw.
        time.sleep(max(0.0, FREEZE_SECONDS - 5 - (time.monotonic() - frozen_at)))
        during = steps_done(steps) - before
        save_now.touch()
        time.sleep(max(0.0, FREEZE_SECONDS - (time.monotonic() - frozen_at)))
        assert not list_checkpoints(tmp_path / "source" / "ck"), "committed while frozen"
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
    committed = list_checkpoints(mount / "ck")
    assert [c.index for c in committed] == [0] and committed[0].valid \
        and committed[0].is_latest, f"the checkpoint due in the freeze: {committed}\n{joined}"


def memory_checkpoints(memory: Path) -> list[int]:
    return sorted(c.index for root in memory.glob("cycler-*/ck-*")
                  for c in list_checkpoints(root) if c.valid)


def test_a_stop_during_a_freeze_longer_than_the_grace_ends_74_by_its_deadline_nothing_torn(
        tmp_path: Path, frozen_mount: tuple[Path, subprocess.Popen[bytes]]) -> None:
    """On the code before, `cycle run`'s loop read the root's link when the signal came: the
    stop reached the workers only when the root thawed, and the job trained on past its grace."""
    mount, daemon = frozen_mount
    root, memory, grace = mount / "ck", tmp_path / "memory", 8
    job = subprocess.Popen(
        [sys.executable, "-m", "cycler_cli", "run", "--nproc-per-node", "1",
         "--checkpoint-dir", str(root), "--memory-dir", str(memory), "--grace", str(grace),
         "--no-requeue", str(EXAMPLE), "--epochs", "100", "--samples", "4096",
         "--step-delay", "0.05", "--checkpoint-every", "20"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        deadline = time.monotonic() + 300
        while not any(c.index >= 1 and c.valid for c in list_checkpoints(root)):
            assert job.poll() is None and time.monotonic() < deadline, "no checkpoint persisted"
            time.sleep(0.5)
        daemon.send_signal(signal.SIGSTOP)
        assert frozen(root), "the root did not freeze"
        before = memory_checkpoints(memory)
        deadline = time.monotonic() + 120
        while memory_checkpoints(memory)[-1:] == before[-1:]:  # nothing waits for the root
            assert job.poll() is None and time.monotonic() < deadline, \
                "no checkpoint in memory while the root was frozen"
            time.sleep(0.5)
        job.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        output = job.communicate(timeout=FREEZE_SECONDS)[0]  # the root stays frozen past it
        took = time.monotonic() - signalled
        still_frozen = frozen(root)
    finally:
        daemon.send_signal(signal.SIGCONT)
        if job.poll() is None:
            job.kill()
    assert still_frozen, "the root thawed before the job ended: the test proves nothing"
    assert job.returncode == 74, output
    newest = memory_checkpoints(memory)[-1]
    assert f"the newest state is checkpoint {newest} in this node's memory tier" in output, output
    assert took < grace + 30, f"the stop ended {took:.1f} s after its signal (grace {grace} s)"
    on_root = list_checkpoints(root, verify=True)
    assert on_root and all(c.valid for c in on_root), on_root  # nothing torn, once thawed
    assert max(c.index for c in on_root) < newest
