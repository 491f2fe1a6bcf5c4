"""Fixtures shared by the real-process tests."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from cycle_jobs import Job
from tmpfs import mounted_tmpfs


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
    with mounted_tmpfs(tmp_path / "tmpfs", "4m") as mount:
        yield mount
