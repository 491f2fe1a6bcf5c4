"""Fixtures shared by the real-process tests."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from cycle_jobs import Job


@pytest.fixture
def jobs() -> Iterator[list[Job]]:
    """Jobs started by a test; any still running at the end are killed with their trees."""
    started: list[Job] = []
    yield started
    for job in started:
        if job.process.poll() is None:
            for process in [*job.tree(), psutil.Process(job.process.pid)]:
                with contextlib.suppress(psutil.Error):
                    process.kill()
            job.wait()


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A real 4 MB tmpfs mounted for the test (skipped where mounting needs root)."""
    mount = tmp_path / "tmpfs"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here ({done.stderr.strip()}): needs root")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)
