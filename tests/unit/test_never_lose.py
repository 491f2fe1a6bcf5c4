"""Issue 16: the paths users walk every day never lose a checkpoint.

Each test builds the on-disk state a user really meets (a root written by cycling_utils, a bit
flipped on disk, a directory the job cannot read, a newer cycler's checkpoint) and checks what
resume, retention, ``cycle status`` and ``cycle prune`` do with it: real files, real processes
where permissions matter.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cycler import AtomicDirectory, CheckpointWarning, CorruptCheckpoint, latest_checkpoint
from cycler.checkpoint.layout import MANIFEST_NAME
from cycler.checkpoint.listing import list_checkpoints
from cycler_cli.main import app

PREFIX = "AtomicDirectory"
LINK = f"{PREFIX}.latest_checkpoint"
runner = CliRunner()


def ckpt(index: int) -> str:
    return f"{PREFIX}_checkpoint_{index}"


def cycling_utils_root(root: Path, count: int) -> Path:
    """What cycling_utils' AtomicDirectory leaves: numbered directories with the user's files,
    no manifest, and the latest link holding an absolute target."""
    root.mkdir(parents=True, exist_ok=True)
    for index in range(count):
        (root / ckpt(index)).mkdir()
        (root / ckpt(index) / "checkpoint.pt").write_bytes(bytes([index]) * 100)
    os.symlink(root / ckpt(count - 1), root / LINK)
    return root


def commit(root: Path, step: int, keep_last: int = -1) -> Path:
    saver = AtomicDirectory(root, keep_last=keep_last)
    path = Path(saver.prepare_checkpoint_directory())
    (path / "model.pt").write_bytes(bytes([step % 256]) * 1000)
    saver.symlink_latest(path, metadata={"step": step})
    return path


def flip_a_bit(checkpoint: Path) -> None:
    model = checkpoint / "model.pt"
    data = bytearray(model.read_bytes())
    data[10] ^= 0x01
    model.write_bytes(bytes(data))  # same size: only a checksum can tell


def states(root: Path) -> dict[int, str]:
    return {c.index: c.state.value for c in list_checkpoints(root)}


def resume(root: Path) -> tuple[Path | None, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        found = latest_checkpoint(root)
    return found, [str(w.message) for w in caught if issubclass(w.category, CheckpointWarning)]


# 1. Moving a cycling_utils job to cycler.

def test_the_first_prepare_in_a_cycling_utils_root_keeps_every_old_checkpoint(
        tmp_path: Path) -> None:
    root = cycling_utils_root(tmp_path / "root", 3)
    saver = AtomicDirectory(root)
    new = Path(saver.prepare_checkpoint_directory())
    assert new.name == ckpt(3)
    for index in range(3):
        assert (root / ckpt(index) / "checkpoint.pt").read_bytes() == bytes([index]) * 100
    assert Path(os.readlink(root / LINK)) == root / ckpt(2)  # what the script loads


def test_a_stop_before_cyclers_first_commit_leaves_the_old_latest_loadable(
        tmp_path: Path) -> None:
    root = cycling_utils_root(tmp_path / "root", 2)
    AtomicDirectory(root).prepare_checkpoint_directory()  # the job is stopped before its commit
    AtomicDirectory(root).prepare_checkpoint_directory()  # the rerun prepares again
    target = Path(os.readlink(root / LINK))
    assert (target / "checkpoint.pt").read_bytes() == bytes([1]) * 100
    assert latest_checkpoint(root) == root / ckpt(1)


def test_old_checkpoints_are_listed_as_legacy_and_the_linked_one_is_the_latest(
        tmp_path: Path) -> None:
    root = cycling_utils_root(tmp_path / "root", 3)
    assert states(root) == {0: "legacy", 1: "legacy", 2: "latest"}
    rows = json.loads(runner.invoke(app, ["status", str(root), "--json"]).stdout)["checkpoints"]
    assert [r["state"] for r in rows] == ["legacy", "legacy", "latest"]


def test_retention_removes_old_checkpoints_in_index_order_only_after_cyclers_commit(
        tmp_path: Path) -> None:
    root = cycling_utils_root(tmp_path / "root", 3)
    commit(root, step=30, keep_last=2)
    assert sorted(p.name for p in root.iterdir() if p.name.startswith(ckpt(0)[:-1])) == [
        ckpt(2), ckpt(3)]
    commit(root, step=40, keep_last=2)
    assert not (root / ckpt(2)).exists() and (root / ckpt(3)).exists()


def test_a_torn_directory_cycler_prepared_in_an_adopted_root_is_still_reclaimed(
        tmp_path: Path) -> None:
    root = cycling_utils_root(tmp_path / "root", 2)
    AtomicDirectory(root).prepare_checkpoint_directory()  # killed before its commit: torn
    assert states(root)[2] == "incomplete"
    commit(root, step=5)
    assert not (root / ckpt(2)).exists()
    assert (root / ckpt(0)).exists() and (root / ckpt(1)).exists()


# 3. Cannot read is never "not committed".

UNREADABLE_SCRIPT = textwrap.dedent("""
    import os, sys, warnings
    from pathlib import Path
    from cycler import AtomicDirectory
    from cycler.checkpoint.listing import list_checkpoints
    root = Path(sys.argv[1])
    print({c.index: c.state.value for c in list_checkpoints(root)})
    for keep_last in (-1, 1):
        saver = AtomicDirectory(root, keep_last=keep_last)
        path = Path(saver.prepare_checkpoint_directory())
        (path / "model.pt").write_bytes(b"x" * 10)
        saver.symlink_latest(path)
        del saver
""")


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                    reason="needs root and setpriv to run the job without CAP_DAC_OVERRIDE")
def test_a_checkpoint_the_job_cannot_read_is_unreadable_and_never_removed(
        tmp_path: Path) -> None:
    root = tmp_path / "root"
    for step in range(3):
        commit(root, step)
    os.chown(root / ckpt(1), 65534, 65534)
    os.chmod(root / ckpt(1), 0o700)  # EACCES for the job, as on NFS with root squashed
    job = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", sys.executable, "-c",
           UNREADABLE_SCRIPT, str(root)]
    result = subprocess.run(job, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "1: 'unreadable'" in result.stdout
    assert (root / ckpt(1) / "model.pt").exists()
    assert (root / ckpt(1) / MANIFEST_NAME).exists()
    assert states(root)[1] == "valid"  # readable again with the capability: nothing was lost


def test_an_unreadable_manifest_is_unreadable_not_never_committed(tmp_path: Path) -> None:
    root = tmp_path / "root"
    commit(root, 0)
    commit(root, 1)
    manifest = root / ckpt(0) / MANIFEST_NAME
    manifest.unlink()
    manifest.mkdir()  # reading it fails with EISDIR, not ENOENT
    assert states(root)[0] == "unreadable"
    commit(root, 2, keep_last=1)
    assert (root / ckpt(0)).exists()


# 4. Every checkpoint invalid: said loudly, never a silent start from step 0.

def test_a_root_where_every_checkpoint_is_corrupt_warns_naming_each_and_why(
        tmp_path: Path) -> None:
    root = tmp_path / "root"
    for step in range(2):
        flip_a_bit(commit(root, step))
    found, said = resume(root)
    assert found is None
    assert len(said) == 1 and ckpt(0) in said[0] and ckpt(1) in said[0]
    assert "checksum" in said[0] and "no valid checkpoint" in said[0]


def test_a_script_can_ask_for_an_error_when_no_checkpoint_is_valid(tmp_path: Path) -> None:
    root = tmp_path / "root"
    flip_a_bit(commit(root, 0))
    with pytest.raises(CorruptCheckpoint, match=ckpt(0)):
        latest_checkpoint(root, strict=True)
    with pytest.raises(CorruptCheckpoint, match=ckpt(0)):
        AtomicDirectory(root).latest_checkpoint(strict=True)
    assert latest_checkpoint(tmp_path / "empty", strict=True) is None  # nothing to lose


def test_retention_never_removes_corrupt_checkpoints_after_a_fresh_start(
        tmp_path: Path) -> None:
    root = tmp_path / "root"
    for step in range(2):
        flip_a_bit(commit(root, step))
    resume(root)
    commit(root, 0, keep_last=1)
    assert (root / ckpt(0)).exists() and (root / ckpt(1)).exists()


@pytest.mark.parametrize("damage", ["truncated", "missing"])
def test_retention_never_removes_a_checkpoint_a_resume_found_damaged_by_size(
        tmp_path: Path, damage: str) -> None:
    # Finding 12: only checksum failures were recorded; a truncated file went as "beyond
    # keep-last" at the next commits, while `cycle prune` kept it for inspection.
    root = tmp_path / "root"
    for step in range(3):
        commit(root, step)
    (damaged,) = [path for path in (root / ckpt(2)).iterdir() if path.name != MANIFEST_NAME]
    if damage == "truncated":
        os.truncate(damaged, 10)
    else:
        damaged.unlink()
    assert resume(root)[0] == root / ckpt(1)
    commit(root, 3, keep_last=1)
    assert (root / ckpt(2)).exists(), "retention removed the damaged checkpoint"
    assert states(root)[2] == "corrupt"


# 5. Prune and retention choose the latest as resume does, and keep one that verifies.

def test_prune_after_a_fallback_keeps_the_checkpoint_resume_uses(tmp_path: Path) -> None:
    root = tmp_path / "root"
    for step in range(3):
        commit(root, step)
    flip_a_bit(root / ckpt(2))
    assert resume(root)[0] == root / ckpt(1)
    result = runner.invoke(app, ["prune", str(root), "--keep-last", "1"])
    assert result.exit_code == 0, result.output
    assert (root / ckpt(1)).exists()
    assert latest_checkpoint(root) == root / ckpt(1)


def test_prune_verifies_the_latest_before_removing_the_older_ones(tmp_path: Path) -> None:
    root = tmp_path / "root"
    for step in range(3):
        commit(root, step)
    flip_a_bit(root / ckpt(2))  # no resume has looked yet
    result = runner.invoke(app, ["prune", str(root), "--keep-last", "1"])
    assert result.exit_code == 0, result.output
    assert latest_checkpoint(root) == root / ckpt(1)


def test_the_first_save_after_a_fallback_keeps_the_checkpoint_it_resumed_from(
        tmp_path: Path) -> None:
    root = tmp_path / "root"
    for step in range(3):
        commit(root, step, keep_last=2)
    flip_a_bit(root / ckpt(2))
    assert resume(root)[0] == root / ckpt(1)
    commit(root, 2, keep_last=2)  # the job's first save after resuming from checkpoint 1
    assert (root / ckpt(1)).exists()
    flip_a_bit(root / ckpt(3))  # a second flip still leaves a checkpoint to resume from
    assert resume(root)[0] == root / ckpt(1)


def newer_cyclers_checkpoint(root: Path) -> None:
    path = commit(root, 7)
    manifest = json.loads((path / MANIFEST_NAME).read_text())
    manifest.update(version=3, checksum="blake9")
    (path / MANIFEST_NAME).write_text(json.dumps(manifest))


def test_prune_and_retention_never_remove_a_newer_cyclers_checkpoint(tmp_path: Path) -> None:
    root = tmp_path / "root"
    commit(root, 0)
    newer_cyclers_checkpoint(root)
    commit(root, 8)
    assert states(root)[1] == "unsupported"
    result = runner.invoke(app, ["prune", str(root), "--keep-last", "1"])
    assert result.exit_code == 0, result.output
    assert (root / ckpt(1)).exists() and not (root / ckpt(0)).exists()


def test_status_after_a_failed_resume_shows_no_damaged_latest(tmp_path: Path) -> None:
    root = tmp_path / "root"
    flip_a_bit(commit(root, 0, keep_last=1))
    assert resume(root)[0] is None
    rows = json.loads(runner.invoke(app, ["status", str(root), "--json"]).stdout)["checkpoints"]
    assert [r["state"] for r in rows] == ["corrupt"]


# 13. Malformed manifests count as corrupt; they crash nothing.

@pytest.mark.parametrize("mangle", [
    lambda m: {**m, "files": list(m["files"])},
    lambda m: "a JSON string",
    lambda m: {**m, "created_at": "yesterday"},
    lambda m: {**m, "files": {"model.pt": "big"}},
    lambda m: {**m, "metadata": [1, 2]},
    lambda m: {**m, "index": "1"},
], ids=["files-a-list", "a-string", "created-at-a-string", "record-a-string",
        "metadata-a-list", "index-a-string"])
def test_a_malformed_manifest_is_corrupt_for_resume_status_and_prune(
        tmp_path: Path, mangle) -> None:
    root = tmp_path / "root"
    commit(root, 0)
    path = commit(root, 1)
    manifest = json.loads((path / MANIFEST_NAME).read_text())
    (path / MANIFEST_NAME).write_text(json.dumps(mangle(manifest)))
    assert states(root)[1] == "corrupt"
    assert resume(root)[0] == root / ckpt(0)
    assert runner.invoke(app, ["status", str(root)]).exit_code == 0
    assert runner.invoke(app, ["prune", str(root), "--dry-run"]).exit_code == 0


def test_a_deeply_nested_manifest_is_corrupt_not_a_recursion_error(tmp_path: Path) -> None:
    root = tmp_path / "root"
    commit(root, 0)
    path = commit(root, 1)
    (path / MANIFEST_NAME).write_text("[" * 100_000 + "]" * 100_000)
    assert states(root)[1] == "corrupt"
    assert runner.invoke(app, ["status", str(root)]).exit_code == 0


# 11. A second writer is refused for as long as the first saver lives, and told who it is.

FIRST_WRITER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from cycler import AtomicDirectory
    saver = AtomicDirectory(sys.argv[1])
    path = Path(saver.prepare_checkpoint_directory())
    (path / "model.pt").write_bytes(b"first")
    saver.symlink_latest(path)
    print("committed", flush=True)
    time.sleep(60)
""")


def test_a_second_writer_is_refused_between_the_first_ones_commits_and_told_who_holds_it(
        tmp_path: Path) -> None:
    from cycler.errors import DirectoryInUse

    root = tmp_path / "root"
    first = subprocess.Popen([sys.executable, "-c", FIRST_WRITER, str(root), "--job-a"],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert first.stdout is not None and first.stdout.readline().strip() == "committed"
        with pytest.raises(DirectoryInUse, match=rf"another process writes .*pid {first.pid} "
                                                 r"on .*--job-a"):
            AtomicDirectory(root).prepare_checkpoint_directory()
    finally:
        first.kill()
        first.wait()
    assert AtomicDirectory(root).prepare_checkpoint_directory().endswith(ckpt(1))


def test_load_of_a_checkpoint_written_file_by_file_says_how_to_read_it(tmp_path: Path) -> None:
    from cycler import StateMismatch

    root = tmp_path / "root"
    commit(root, 0)
    with pytest.raises(StateMismatch, match="not written by save.*torch.load"):
        AtomicDirectory(root).load({"w": __import__("torch").zeros(1)})
