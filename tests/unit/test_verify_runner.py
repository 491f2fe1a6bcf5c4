"""``cycle verify``'s runner: where it reads the beacons of the ``cycle run`` it started."""

from __future__ import annotations

from pathlib import Path

import pytest

from cycler.checkpoint.memory_roots import runtime_dir
from cycler.protocol.node_local import NodeFiles
from cycler.verify.capture import Capture
from cycler.verify.runner import Runner, RunRecord


def beacons_of(tmp_path: Path, *run_args: str) -> tuple[Path, RunRecord]:
    """Where a runner given ``run_args`` reads node 0's beacons, and its run's record."""
    runner = Runner(["cycle", "run"], [*run_args, "train.py"], tmp_path, environ={})
    record = RunRecord("reference", Capture(tmp_path / "checkpoints", tmp_path / "kept"),
                       tmp_path / "cycle-run.log", tmp_path / "work")
    return runner._beacons(record), record


def progress_dir(root: Path, memory_dir: Path) -> Path:
    return NodeFiles.in_directory(runtime_dir(root, 0, memory_dir, {}), 0).progress_dir


@pytest.mark.parametrize("form", [("--memory-dir", "{}"), ("--memory-dir={}",)])
def test_the_beacons_are_read_where_cycle_run_keeps_them_with_a_memory_dir_given(
        tmp_path: Path, form: tuple[str, ...]) -> None:
    given = tmp_path / "ram"
    beacons, record = beacons_of(tmp_path, *(part.format(given) for part in form))
    assert beacons == progress_dir(record.capture.root, given)


def test_a_relative_memory_dir_is_the_one_in_the_run_s_working_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # cycle verify's own directory is not cycle run's
    beacons, record = beacons_of(tmp_path, "--memory-dir", "ram")
    assert beacons == progress_dir(record.capture.root, record.workdir / "ram")
