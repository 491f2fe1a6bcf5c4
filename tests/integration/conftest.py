"""Fixtures shared by the real-process tests, and their marker: every test here that names
no lane of its own (e2e, integrations, verify, benchmarks, slow, ...) is marked ``processes``,
which README's test command leaves out (they start real ``cycle run`` and torchrun processes,
send signals and wait through graces: minutes in all) and ``.ci/run`` runs in a lane of its
own."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from cycle_jobs import Job
from tmpfs import mounted_tmpfs

LANES = ("slow", "slurm", "netns", "e2e", "gpu", "integrations", "verify", "benchmarks",
         "fuse")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in item.path.parents and not any(item.get_closest_marker(m) for m in LANES):
            item.add_marker(pytest.mark.processes)


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
