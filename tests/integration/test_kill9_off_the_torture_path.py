"""Real ``kill -9`` on the paths issue 16 found unguarded: a cycling_utils root being adopted,
an asynchronous save at the interpreter's exit, and a process's first asynchronous save.

Each trial is a real Python process killed with SIGKILL at a random moment after it said it
was about to do the work; after every kill the root is checked as a resuming job would see it.
"""

from __future__ import annotations

import glob
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import torch

from cycler import latest_checkpoint, read_manifest
from cycler.checkpoint.listing import list_checkpoints

LINK = "AtomicDirectory.latest_checkpoint"


def kill_after(script: str, args: list[str], delay: float) -> tuple[int, str]:
    """Start ``script``; once it prints ``go``, wait ``delay`` s and SIGKILL it (if it still
    runs). Its pid and what it printed."""
    process = subprocess.Popen([sys.executable, "-c", script, *args], stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, text=True)
    assert process.stdout is not None
    assert process.stdout.readline().strip() == "go"
    time.sleep(delay)
    process.send_signal(signal.SIGKILL)
    out = process.stdout.read()
    process.wait()
    return process.pid, out


MIGRATING = textwrap.dedent("""
    import os, sys, torch
    from pathlib import Path
    from cycler import AtomicDirectory
    root = Path(sys.argv[1])
    saver = AtomicDirectory(root, keep_last=2)
    link = root / saver.symlink_name
    state = torch.load(Path(os.readlink(link)) / "checkpoint.pt", weights_only=True)
    print("go", flush=True)
    for _ in range(50):
        path = Path(saver.prepare_checkpoint_directory())
        torch.save({"step": state["step"] + 1}, path / "checkpoint.pt")
        saver.symlink_latest(path, metadata={"step": int(state["step"]) + 1})
        state = {"step": state["step"] + 1}
""")


def test_kills_during_the_adoption_of_a_cycling_utils_root_never_leave_the_link_dangling(
        tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    for index in range(3):
        (root / f"AtomicDirectory_checkpoint_{index}").mkdir()
        torch.save({"step": torch.tensor(index)},
                   root / f"AtomicDirectory_checkpoint_{index}" / "checkpoint.pt")
    os.symlink(root / "AtomicDirectory_checkpoint_2", root / LINK)
    rng = random.Random(16)
    last_step = 2
    for _ in range(12):
        kill_after(MIGRATING, [str(root)], rng.uniform(0.0, 0.08))
        target = Path(os.readlink(root / LINK))  # the cycling_utils idiom of the script
        step = int(torch.load(target / "checkpoint.pt", weights_only=True)["step"])
        assert step >= last_step, "the resume point went back"
        last_step = step
        if not any(c.state.value in ("latest", "valid") and c.manifest is not None
                   for c in list_checkpoints(root)):
            assert all((root / f"AtomicDirectory_checkpoint_{i}").is_dir() for i in range(3))
    assert latest_checkpoint(root) is not None


AT_EXIT = textwrap.dedent("""
    import sys, torch
    from cycler import AtomicDirectory
    root, step = sys.argv[1], int(sys.argv[2])
    saver = AtomicDirectory(root, keep_last=2)
    state = {"w": torch.full((1 << 22,), float(step))}
    print("go", flush=True)
    saver.save(state, metadata={"step": step}, asynchronous=True)
""")


def test_kills_during_an_async_save_at_interpreter_exit_keep_the_previous_checkpoint(
        tmp_path: Path) -> None:
    root = tmp_path / "root"
    rng = random.Random(17)
    committed = -1
    for step in range(10):
        _, _ = kill_after(AT_EXIT, [str(root), str(step)], rng.uniform(0.0, 0.4))
        latest = latest_checkpoint(root)
        if latest is None:
            assert committed == -1
            continue
        found = read_manifest(latest).step
        assert found is not None and found >= committed, "a committed checkpoint was lost"
        committed = found
        loaded = torch.load  # the data of what is latest is whole: its checksums verify
        assert loaded is not None and latest_checkpoint(root, verify=True) == latest
    assert all(c.state.value != "corrupt" for c in list_checkpoints(root, verify=True))


FIRST_ASYNC = textwrap.dedent("""
    import sys, torch
    from cycler import AtomicDirectory
    saver = AtomicDirectory(sys.argv[1])
    state = {"w": torch.ones(64 << 18)}
    print("go", flush=True)
    saver.save(state, asynchronous=True).wait()
""")


def test_kills_during_a_first_async_save_leave_no_shared_memory_segment(
        tmp_path: Path) -> None:
    rng = random.Random(18)
    pids = []
    for trial in range(8):
        pid, _ = kill_after(FIRST_ASYNC, [str(tmp_path / f"root-{trial}")],
                            rng.uniform(0.0, 0.3))
        pids.append(pid)
    leaked = [path for pid in pids for path in glob.glob(f"/dev/shm/torch_{pid}_*")]
    assert leaked == []
