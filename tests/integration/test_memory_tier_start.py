"""What `cycle run --memory-tier` settles at start, with real processes and real tmpfs mounts:
a tier too small for the first checkpoint sends the job to the checkpoint root after one failure
(whatever wrote the files), a tier whose checkpoint root was removed is never resumed and does
not outlive the user's next start, and a full memory directory is refused with one line.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from test_memory_tier_two_users import JOB

from cycler import EXIT_SUCCESS, list_checkpoints
from cycler.checkpoint.memory_roots import memory_base, memory_root
from cycler.protocol.exit_codes import EXIT_USAGE


def cycle_run(memory_dir: Path, root: Path, script: Path, **env: str,
              ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cycler_cli", "run", "--memory-dir",
                           str(memory_dir), "--checkpoint-dir", str(root), "--grace", "30",
                           "--restart-delay", "0.1", str(script)],
                          env={**os.environ, "OMP_NUM_THREADS": "1", **env}, text=True,
                          capture_output=True, timeout=300, cwd=script.parent)


def job(tmp_path: Path) -> Path:
    script = tmp_path / "job.py"
    script.write_text(JOB)
    return script


def earlier_job_left_a_tier(script: Path, memory_dir: Path, root: Path) -> Path:
    """A job of ``root`` whose workers were killed: its memory tier, with checkpoints newer than
    the checkpoint root's, stays (no `cycle run` was left to remove it)."""
    memory = memory_root(memory_base(memory_dir), root)
    memory_dir.mkdir(mode=0o700, exist_ok=True)
    done = subprocess.run([sys.executable, "-c", JOB.replace("control.close()", "os._exit(9)")],
                          env={**os.environ, "CYCLER_MEMORY_TIER": str(memory),
                               "CYCLER_CHECKPOINT_DIR": str(root), "CYCLER_PERSIST_EVERY": "100",
                               "STEPS": "16"}, capture_output=True, text=True)
    assert done.returncode == 9, done.stderr
    assert [c.index for c in list_checkpoints(memory) if c.valid] == [1, 2]
    return memory


def test_a_checkpoint_too_big_for_the_memory_tier_fails_once_then_goes_to_the_root(
        tmp_path: Path, small_tmpfs: Path) -> None:
    root = tmp_path / "ck"
    # 8 MB per checkpoint into a 4 MB tmpfs: cycler's atomic_torch_save removes
    # its temporary when the write fails, so nothing in memory shows how big it was.
    done = cycle_run(small_tmpfs, root, job(tmp_path), SIZE="2000000", STEPS="12")
    assert done.returncode == EXIT_SUCCESS, done.stderr
    assert done.stderr.count("workers exited with code 1") == 1, done.stderr
    assert "checkpoints go to" in done.stderr and "too small" in done.stderr, done.stderr
    assert [c.index for c in list_checkpoints(root) if c.valid][-1] >= 1
    again = cycle_run(small_tmpfs, root, job(tmp_path), SIZE="2000000", STEPS="17")
    assert again.returncode == EXIT_SUCCESS and "code 1" not in again.stderr, again.stderr
    assert "the memory tier was too small for this job" in again.stderr


def test_a_tier_whose_root_was_removed_is_never_resumed_and_goes_at_the_next_start(
        tmp_path: Path) -> None:
    script, shm = job(tmp_path), tmp_path / "shm"
    root, other = tmp_path / "ck", tmp_path / "other"
    stale = [earlier_job_left_a_tier(script, shm, path) for path in (root, other)]
    shutil.rmtree(root)
    shutil.rmtree(other)
    done = cycle_run(shm, root, script, STEPS="6")
    assert done.returncode == EXIT_SUCCESS, done.stderr
    assert "resumed from" not in done.stdout, done.stdout
    assert f"removed the memory tier {stale[0]}: it belonged to another job" in done.stderr
    assert f"removed the memory tier {stale[1]}: its checkpoint root {other} is gone" \
        in done.stderr, done.stderr
    assert not stale[1].exists()
    assert [c.index for c in list_checkpoints(root) if c.valid] == [0]


def test_a_full_memory_directory_is_refused_at_start_with_one_line(
        tmp_path: Path, small_tmpfs: Path) -> None:
    subprocess.run(["dd", "if=/dev/zero", f"of={small_tmpfs / 'fill'}", "bs=1M", "count=8"],
                   capture_output=True)
    done = cycle_run(small_tmpfs, tmp_path / "ck", job(tmp_path))
    assert done.returncode == EXIT_USAGE, done.stderr
    assert "Traceback" not in done.stderr
    assert "no room left" in done.stderr and len(done.stderr.splitlines()) == 1, done.stderr
