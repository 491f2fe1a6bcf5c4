"""The job's runtime directory on the node removed, or its tmpfs filled, while the job runs
(logind removes $XDG_RUNTIME_DIR, and RemoveIPC=yes clears the user's /dev/shm files, when the
user's last session ends: a job started over ssh with nohup sees it). A SIGTERM then still ends
in a stop checkpoint and exit 75 (issue 36): the control file's directory is made again (or the
space kept in it freed), instead of the workers being sent a signal their shields ignore until
the grace ends without a checkpoint."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from tmpfs import mounted_tmpfs

from cycler import EXIT_REQUEUE, latest_checkpoint
from cycler.checkpoint.memory_roots import runtime_dir

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train.py"


def stop_after(harm: Callable[[Path], None], root: Path, environ: dict[str, str]) -> str:
    """Start a one-worker job, ``harm`` its runtime directory once it trains, SIGTERM it;
    its output (asserted: exit 75, no grace expired, a checkpoint made by the stop)."""
    node = subprocess.Popen(
        [sys.executable, "-m", "cycler_cli", "run", "--nproc-per-node", "1", "--grace", "60",
         "--checkpoint-dir", str(root), "--no-requeue", str(EXAMPLE), "--epochs", "100",
         "--samples", "2048", "--hidden", "16", "--checkpoint-every", "0", "--step-delay",
         "0.02"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**environ, "OMP_NUM_THREADS": "1"})
    try:
        assert node.stdout is not None
        for line in node.stdout:
            if line.startswith("[train] training from step"):
                break
        time.sleep(1.0)
        directory = runtime_dir(root, 0, environ=environ)
        assert directory.is_dir(), directory
        harm(directory)
        node.send_signal(signal.SIGTERM)
        output = node.communicate(timeout=180)[0]
    finally:
        if node.poll() is None:
            node.kill()
    assert node.returncode == EXIT_REQUEUE, output
    assert "grace is over" not in output, output
    assert latest_checkpoint(root) is not None, f"the stop made no checkpoint:\n{output}"
    return output


def test_a_stop_after_the_runtime_directory_was_removed_still_checkpoints_and_ends_75(
        tmp_path: Path) -> None:
    stop_after(shutil.rmtree, tmp_path / "ck", dict(os.environ))


def test_a_stop_when_the_runtime_directory_s_tmpfs_is_full_still_checkpoints_and_ends_75(
        tmp_path: Path) -> None:
    with mounted_tmpfs(tmp_path / "runtime", "1m") as runtime:
        runtime.chmod(0o700)

        def fill(directory: Path) -> None:
            with open(runtime / "filler", "wb") as filler:
                try:
                    while True:
                        filler.write(bytes(65536))
                        filler.flush()
                except OSError:
                    pass

        output = stop_after(fill, tmp_path / "ck", {**os.environ, "XDG_RUNTIME_DIR": str(runtime)})
    assert "is full" in output, output
