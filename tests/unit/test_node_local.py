"""The job's private runtime directory on each node (issue 36): where it is, that it is the
user's alone before anything in it is used, and the commit note the supervisor watches."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from cycler.checkpoint.memory_roots import prepare_runtime_dir, runtime_dir
from cycler.errors import CheckpointDirectoryError
from cycler.protocol import node_local
from cycler.protocol.environment import ENV_CHECKPOINT_DIR, ENV_NODE_DIR
from cycler.training.auto_interval import events_beside


def test_each_node_of_each_job_has_its_own_directory_beside_the_memory_tiers_base(
        tmp_path: Path) -> None:
    first = runtime_dir(tmp_path / "a" / "ck", 0, tmp_path / "shm")
    assert first.parent == tmp_path / "shm" / f"cycler-{os.geteuid()}-run"
    assert first == runtime_dir(tmp_path / "a" / "ck", 0, tmp_path / "shm"), "every restart"
    assert first != runtime_dir(tmp_path / "a" / "ck", 1, tmp_path / "shm")
    assert first != runtime_dir(tmp_path / "b" / "ck", 0, tmp_path / "shm")


def test_cycle_run_makes_it_private_whatever_the_umask(tmp_path: Path) -> None:
    directory = runtime_dir(tmp_path / "ck", 0, tmp_path / "shm")
    old = os.umask(0o022)
    try:
        prepare_runtime_dir(directory)
    finally:
        os.umask(old)
    for made in (directory, directory.parent):
        assert stat.S_IMODE(os.lstat(made).st_mode) == 0o700


def test_a_symlink_in_its_place_is_refused_and_left_alone(tmp_path: Path) -> None:
    directory = runtime_dir(tmp_path / "ck", 0, tmp_path / "shm")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    directory.parent.mkdir(parents=True, mode=0o700)
    directory.symlink_to(elsewhere)
    with pytest.raises(CheckpointDirectoryError, match="symlink"):
        prepare_runtime_dir(directory)
    assert directory.is_symlink() and not list(elsewhere.iterdir())


def test_a_worker_uses_no_file_of_a_directory_open_to_others(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o755)
    environ = {ENV_NODE_DIR: str(open_dir)}
    assert node_local.node_dir(environ) is None
    assert node_local.refused_node_dir(environ)
    assert "mode 755" in capsys.readouterr().err
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    assert node_local.node_dir({ENV_NODE_DIR: str(private)}) == private
    assert not node_local.refused_node_dir({})


def test_a_commit_changes_the_note_the_supervisor_watches(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    directory = tmp_path / "node"
    directory.mkdir(mode=0o700)
    monkeypatch.setenv(ENV_NODE_DIR, str(directory))
    files = node_local.NodeFiles.in_directory(directory, 0)
    assert node_local.commit_note(files) is None
    node_local.note_commit()
    first = node_local.commit_note(files)
    os.utime(files.commits_path, ns=(1, 1))  # as if long ago
    node_local.note_commit()
    assert first is not None and node_local.commit_note(files) != (first[0], 1)


def test_the_events_log_of_a_control_file_on_the_node_is_in_the_checkpoint_root(
        tmp_path: Path) -> None:
    node = tmp_path / "node"
    environ = {ENV_NODE_DIR: str(node), ENV_CHECKPOINT_DIR: str(tmp_path / "ck")}
    assert events_beside(node / "control-node2.json", environ) == (
        tmp_path / "ck" / ".cycler" / "events-node2.jsonl")
    assert events_beside(tmp_path / "control-node2.json", environ) == (
        tmp_path / "events-node2.jsonl"), "a control file elsewhere keeps its log beside it"
