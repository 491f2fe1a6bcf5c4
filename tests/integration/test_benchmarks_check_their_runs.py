"""Benchmarks refuse to time a run that did not do its work (issue 39): real ``cycle run``
processes, a real events log."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import _checks  # noqa: E402
import bench_compile_cache  # noqa: E402

pytestmark = pytest.mark.benchmarks
SMALL = ("--samples", "256", "--checkpoint-every", "4", "--hidden", "16", "--step-delay", "0.1")


def test_a_restart_of_a_finished_job_is_never_timed_as_a_first_step(tmp_path: Path) -> None:
    """The job trained to its end; its restart makes no step. The old benchmark read the
    previous run's ``first_step`` from the copied events log and printed a negative time."""
    root, node = tmp_path / "root", tmp_path / "node"
    finished = subprocess.run(
        [sys.executable, "-m", "cycler_cli", "run", "--checkpoint-dir", str(root),
         str(bench_compile_cache.SCRIPT), *SMALL, "--epochs", "1"],
        capture_output=True, text=True, timeout=300)
    assert finished.returncode == 0, finished.stderr
    assert _checks.events_since(root, 0.0, "first_step")
    with pytest.raises(_checks.BadRun) as raised:
        bench_compile_cache.cycle_run(root, node, 1, "fresh_carried", epochs=1, train=SMALL)
    assert "fresh_carried" in str(raised.value)


def test_a_restart_mid_training_is_timed_from_its_own_first_step(tmp_path: Path) -> None:
    root, node = tmp_path / "root", tmp_path / "node"
    bench_compile_cache.cycle_run(root, node, 1, "prepare", train=SMALL,
                                  stop_after="checkpoint_committed")
    seconds, _ = bench_compile_cache.cycle_run(root, node, 1, "warm", train=SMALL)
    assert 0 < seconds < 300
