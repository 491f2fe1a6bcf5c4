"""The retainer: the one executor of retention, and the one module that removes a checkpoint
directory (the saver's, the memory tier's roots, the partner copies, ``cycle prune``)."""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path

import pytest
from saver_fakes import checkpoint, indices
from typer.testing import CliRunner

import cycler
import cycler_cli
from cycler.checkpoint.layout import CheckpointLayout
from cycler.checkpoint.listing import list_checkpoints
from cycler.checkpoint.persisting import Persister
from cycler.checkpoint.retainer import (
    Retainer,
    carry_out,
    retain_durable,
    retain_memory,
    retain_replicas,
)
from cycler.checkpoint.retention import retention_decisions
from cycler.checkpoint.tiers import MemoryTier
from cycler.errors import ConfigError
from cycler_cli.main import app

PACKAGE = Path(cycler.__file__).parent
CLI = Path(cycler_cli.__file__).parent

REMOVALS = {"discard_directory", "remove_leftover", "set_aside"}
"""What deletes a directory tree (or renames it aside to be deleted), anywhere in cycler/ or
cycler_cli/ (the command only parses and renders: ``cycle prune`` removes through the retainer)."""

IN_CHECKPOINT = REMOVALS | {"rmtree"}
"""In cycler/checkpoint/ a bare ``shutil.rmtree`` would be a checkpoint's removal too (other
parts delete their own records and scratch with it)."""

EXECUTOR = {"_fs.py", "checkpoint/retainer.py"}
"""Where those removals are defined, and the retainer, which removes every checkpoint
directory (retention's decisions, and :func:`cycler.checkpoint.retainer.discard`)."""

NOT_A_CHECKPOINT = {
    # The compile cache's own entries and staging: no checkpoint.
    ("supervisor/compile_cache/archive.py", "remove_leftover"),
    # One file's temporary of a copy or fetch in progress, never a checkpoint directory.
    ("checkpoint/nodes/transport.py", "remove_leftover"),
    ("checkpoint/nodes/contribution.py", "remove_leftover"),
    ("checkpoint/nodes/assembly.py", "remove_leftover"),
    # A persisted copy cut by the stop's deadline is only renamed aside (deleting its files
    # takes time the stop has not); its files go as a dead writer's leftover, by the retainer.
    ("checkpoint/job_end.py", "set_aside"),
}
"""The removals outside the retainer that are no checkpoint directory's."""


def removals_in(path: Path, removals: set[str] = IN_CHECKPOINT) -> set[str]:
    """The ``removals`` that ``path`` names (called or passed on, as to ``remove_logged``)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and node.attr in removals:
            names.add(node.attr)
        elif isinstance(node, ast.Name) and node.id in removals:
            names.add(node.id)
        elif isinstance(node, ast.ImportFrom):
            names.update(alias.name for alias in node.names if alias.name in removals)
    return names


def test_no_module_but_the_retainer_removes_a_checkpoint_directory() -> None:
    found = set()
    for path in [*PACKAGE.rglob("*.py"), *CLI.rglob("*.py")]:
        module = path.relative_to(PACKAGE).as_posix() if path.is_relative_to(PACKAGE) \
            else path.relative_to(CLI.parent).as_posix()
        if module not in EXECUTOR:
            removals = IN_CHECKPOINT if module.startswith("checkpoint/") else REMOVALS
            found |= {(module, name) for name in removals_in(path, removals)}
    assert found - NOT_A_CHECKPOINT == set(), "remove checkpoints with cycler.checkpoint.retainer"
    assert NOT_A_CHECKPOINT - found == set(), "the allow-list names a removal that is gone"


def test_the_scan_sees_a_removal_called_passed_on_or_imported(tmp_path: Path) -> None:
    source = tmp_path / "module.py"
    source.write_text("from cycler._fs import set_aside\nimport shutil\n"
                      "remove_logged(_fs.discard_directory, p, 'x')\nshutil.rmtree(p)\n")
    assert removals_in(source) == {"set_aside", "discard_directory", "rmtree"}


def test_a_memory_root_keeps_its_newest_two_and_those_being_persisted(tmp_path: Path) -> None:
    memory = CheckpointLayout(tmp_path)
    for index in range(6):
        checkpoint(memory, index, pinned=index == 1, committed=index != 2)
    checkpoint(memory, 6, committed=False)  # being written now
    retain_memory(memory, busy={0})
    assert indices(tmp_path) == ["0", "4", "5", "6T"]


def test_the_checkpoint_root_after_a_persist_keeps_keep_last_and_a_torn_newer_one(
        tmp_path: Path) -> None:
    durable = CheckpointLayout(tmp_path)
    for index in range(4):
        checkpoint(durable, index, pinned=index == 0, committed=index != 1)
    checkpoint(durable, 4, committed=False)  # another node's contribution in progress
    retain_durable(durable, keep_last=2)
    assert indices(tmp_path) == ["0P", "2", "3", "4T"]


def test_partner_copies_go_once_the_node_no_longer_keeps_their_checkpoint(
        tmp_path: Path) -> None:
    memory = CheckpointLayout(tmp_path)
    checkpoint(memory, 3)
    replicas = tmp_path / ".replicas"
    for name in ("AtomicDirectory_checkpoint_2", "AtomicDirectory_checkpoint_3",
                 ".AtomicDirectory_checkpoint_1.cycler-tmp-host-1-x"):
        (replicas / name).mkdir(parents=True)
    retain_replicas(memory, replicas)
    assert sorted(p.name for p in replicas.iterdir()) == [
        ".AtomicDirectory_checkpoint_1.cycler-tmp-host-1-x", "AtomicDirectory_checkpoint_3"]


def test_prune_s_removals_raise_the_first_failure_and_keep_what_was_kept(
        tmp_path: Path) -> None:
    layout = CheckpointLayout(tmp_path)
    paths = [checkpoint(layout, index) for index in range(3)]
    decisions = retention_decisions(list_checkpoints(tmp_path), keep_last=1)
    paths[0].rename(tmp_path / "moved")  # gone under its name since the listing
    with pytest.raises(FileNotFoundError):
        carry_out(decisions, [])
    assert paths[2].exists()
    assert carry_out(decisions[1:], []) == [paths[1]]
    assert indices(tmp_path) == ["2"]


@pytest.mark.parametrize("keep_last", [0, -2])
def test_a_running_saver_refuses_a_keep_last_that_keeps_nothing_and_keeps_its_own(
        tmp_path: Path, keep_last: int) -> None:
    saver = cycler.AtomicDirectory(str(tmp_path), keep_last=2)
    for _ in range(3):
        saver.symlink_latest(saver.prepare_checkpoint_directory())
    with pytest.raises(ConfigError, match=f"keep_last={keep_last} would keep no checkpoint"):
        saver.keep_last = keep_last
    saver.symlink_latest(saver.prepare_checkpoint_directory())
    assert saver.keep_last == 2 and indices(tmp_path) == ["2", "3"]
    saver.keep_last = 1  # a value that means something applies from the next commit
    saver.symlink_latest(saver.prepare_checkpoint_directory())
    assert indices(tmp_path) == ["4"]


@pytest.mark.parametrize("keep_last", [0, -2])
def test_the_retainer_and_the_memory_tier_s_persisting_refuse_it_alike(
        tmp_path: Path, keep_last: int) -> None:
    refusal = f"keep_last={keep_last} would keep no checkpoint"
    with pytest.raises(ConfigError, match=refusal):
        Retainer(keep_last)
    memory, durable = CheckpointLayout(tmp_path / "memory"), CheckpointLayout(tmp_path / "disk")
    with pytest.raises(ConfigError, match=refusal):
        Persister(MemoryTier(memory.root), memory, durable, None, keep_last)
    with pytest.raises(ConfigError, match=refusal):
        retain_durable(durable, keep_last)


def _commit(saver: cycler.AtomicDirectory) -> None:
    path = saver.prepare_checkpoint_directory()
    (Path(path) / "model.pt").write_bytes(b"weights")
    saver.symlink_latest(path)


def _by_one_saver(root: Path, keep_last: int) -> None:
    saver = cycler.AtomicDirectory(str(root), keep_last=keep_last)
    for _ in range(5):
        _commit(saver)


def _set_on_a_running_saver(root: Path, keep_last: int) -> None:
    saver = cycler.AtomicDirectory(str(root), keep_last=-1)
    _commit(saver)
    saver.keep_last = keep_last
    for _ in range(4):
        _commit(saver)


def _by_a_new_saver_per_commit(root: Path, keep_last: int) -> None:
    for _ in range(5):
        _commit(cycler.AtomicDirectory(str(root), keep_last=keep_last))


def _by_cycle_prune(root: Path, keep_last: int) -> None:
    _by_one_saver(root, -1)
    result = CliRunner().invoke(app, ["prune", str(root), "--keep-last", str(keep_last)])
    if result.exit_code == 2:
        raise ConfigError(result.output.strip().removeprefix("cycle: error: "))
    assert result.exit_code == 0, result.output


def _outcome(root: Path, way: Callable[[Path, int], None], keep_last: int) -> str:
    try:
        way(root, keep_last)
    except ConfigError as error:
        return f"refused: {error}"
    return " ".join(indices(root))


@pytest.mark.parametrize("keep_last", [0, 1, 2, -1])
def test_keep_last_keeps_the_same_in_a_running_saver_a_new_saver_and_cycle_prune(
        tmp_path: Path, keep_last: int) -> None:
    """Five commits, then what is kept: at ``keep_last=0`` a running saver had kept all five
    and a new saver's first commit all but the latest (issue 37); now every way refuses it in
    the same line, and every other value keeps the same checkpoints every way."""
    ways = [_by_one_saver, _set_on_a_running_saver, _by_a_new_saver_per_commit, _by_cycle_prune]
    outcomes = {way.__name__: _outcome(tmp_path / way.__name__, way, keep_last) for way in ways}
    expected = {0: "refused: keep_last=0 would keep no checkpoint: give 1 or more to keep the "
                   "newest N (the latest counts), or -1 to keep them all",
                1: "4", 2: "3 4", -1: "0 1 2 3 4"}[keep_last]
    assert outcomes == dict.fromkeys(outcomes, expected)
