"""The memory tier in one process: commits in memory, persists every K-th and the stop's
checkpoint to the checkpoint root after verifying the copy, resumes from the newest of either
tier, falls back past a corrupt memory copy, degrades to disk when its tmpfs share is full, and
a kill -9 during a persist leaves the checkpoint root at its previous checkpoint.

Real files, real tmpfs mounts, real kill -9 (no mocks); the `cycle run` paths are in
test_memory_tier_cycle_run.py.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch

from cycler import AtomicDirectory, CheckpointWarning, _fs, list_checkpoints, read_manifest
from cycler.checkpoint.durable_copy import persist, persist_newest
from cycler.checkpoint.layout import CheckpointLayout, CheckpointName
from cycler.checkpoint.memory_roots import memory_base, memory_root
from cycler.errors import CorruptCheckpoint
from cycler.protocol.environment import ENV_MEMORY_TIER, ENV_PERSIST_EVERY, ENV_RESUME_FROM


@pytest.fixture
def tier(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """(durable root, this job's memory root), the memory tier on with K = 3."""
    import threading

    from cycler.checkpoint import in_flight

    # A stop decided by an earlier test of this process (StepControl sets it for good) would
    # make every commit here a stop's, persisted.
    monkeypatch.setattr(in_flight, "_stopping", threading.Event())
    durable, base = tmp_path / "durable", tmp_path / "shm"
    monkeypatch.setenv(ENV_MEMORY_TIER, str(memory_root(base, durable)))
    monkeypatch.setenv(ENV_PERSIST_EVERY, "3")
    return durable, memory_root(base, durable)


def save_files(saver: AtomicDirectory, step: int, size: int = 1000) -> Path:
    directory = Path(saver.prepare_checkpoint_directory())
    torch.save({"w": torch.full((size,), float(step))}, directory / "model.pt")
    saver.symlink_latest(directory, metadata={"step": step})
    return directory


def saved(durable: Path, count: int) -> AtomicDirectory:
    """A saver that committed checkpoints 0 .. count - 1, its copies to disk done."""
    saver = AtomicDirectory(durable)
    for step in range(count):
        save_files(saver, step)
    saver.wait_for_persisting()
    return saver


def indices(root: Path) -> list[int]:
    return [c.index for c in list_checkpoints(root) if c.valid]


def test_every_checkpoint_lands_in_memory_and_every_kth_is_persisted(
        tier: tuple[Path, Path]) -> None:
    durable, memory = tier
    saver = AtomicDirectory(durable, keep_last=2)
    for step in range(8):
        assert save_files(saver, step).parent == memory
    saver.wait_for_persisting()
    assert indices(memory) == [6, 7]  # the newest two stay in memory
    assert indices(durable) == [3, 6]  # 0, 3, 6 persisted; keep_last=2 on disk
    assert os.readlink(durable / "AtomicDirectory.latest_checkpoint") == str(
        durable / "AtomicDirectory_checkpoint_6")
    assert read_manifest(durable / "AtomicDirectory_checkpoint_6") == read_manifest(
        memory / "AtomicDirectory_checkpoint_6")
    # A script that asks the saver gets the memory copy, the newest.
    assert AtomicDirectory(durable).latest_checkpoint() == str(
        memory / "AtomicDirectory_checkpoint_7")


def test_indices_go_on_above_the_durable_ones_when_memory_was_wiped(
        tier: tuple[Path, Path]) -> None:
    durable, memory = tier
    saved(durable, 4)
    subprocess.run(["rm", "-rf", str(memory)], check=True)  # the node's memory is gone
    saver = AtomicDirectory(durable)
    assert saver.latest_checkpoint() == str(durable / "AtomicDirectory_checkpoint_3")
    assert save_files(saver, 4).name == "AtomicDirectory_checkpoint_4"


def test_a_corrupt_memory_copy_falls_back_to_the_durable_one_with_a_warning(
        tier: tuple[Path, Path]) -> None:
    durable, memory = tier
    saved(durable, 5)
    for index in (3, 4):  # both memory copies flipped: 3 is on disk too, 4 only in memory
        path = memory / f"AtomicDirectory_checkpoint_{index}" / "model.pt"
        data = bytearray(path.read_bytes())
        data[-10] ^= 0xFF
        path.write_bytes(bytes(data))
    with pytest.warns(CheckpointWarning, match="checksum"):
        chosen = AtomicDirectory(durable).latest_checkpoint()
    assert chosen == str(durable / "AtomicDirectory_checkpoint_3")


def test_dcp_saves_and_loads_through_the_memory_tier(tier: tuple[Path, Path]) -> None:
    durable, memory = tier
    saver = AtomicDirectory(durable)
    for step in range(5):
        handle = saver.save({"w": torch.full((100,), float(step))}, metadata={"step": step},
                            asynchronous=step % 2 == 1)
        handle.wait()
    saver.wait()
    saver.wait_for_persisting()
    assert indices(durable) == [0, 3] and indices(memory) == [3, 4]
    state = {"w": torch.zeros(100)}
    assert AtomicDirectory(durable).load(state) == {"step": 4}  # from memory
    assert torch.equal(state["w"], torch.full((100,), 4.0))
    assert AtomicDirectory(durable).load(state, checkpoint=0) == {"step": 0}  # disk only


def test_a_stop_checkpoint_is_persisted_before_the_commit_returns(
        tier: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    from cycler.checkpoint import in_flight

    durable, _ = tier
    saver = AtomicDirectory(durable)
    save_files(saver, 0)
    save_files(saver, 1)
    monkeypatch.setattr(in_flight, "_stopping", _Set())  # what StepControl sets at a stop
    save_files(saver, 2)
    assert saver._persister.queued is None and not saver._persister.busy  # waited for
    assert indices(durable) == [0, 2]


class _Set:
    def is_set(self) -> bool:
        return True


@pytest.fixture
def memory_on_small_tmpfs(small_tmpfs: Path, tmp_path: Path,
                          monkeypatch: pytest.MonkeyPatch) -> Path:
    """The memory root, on a 4 MB tmpfs, of the tests' checkpoint root ``tmp_path/durable``."""
    memory = memory_root(memory_base(small_tmpfs), tmp_path / "durable")
    monkeypatch.setenv(ENV_MEMORY_TIER, str(memory))
    monkeypatch.setenv(ENV_PERSIST_EVERY, "100")
    return memory


def test_a_full_tmpfs_share_sends_checkpoints_to_disk_with_one_warning(
        tmp_path: Path, memory_on_small_tmpfs: Path, caplog: pytest.LogCaptureFixture) -> None:
    durable = tmp_path / "durable"
    saver = AtomicDirectory(durable)
    paths = [save_files(saver, step, size=300_000) for step in range(4)]  # 1.2 MB each
    in_memory = memory_on_small_tmpfs
    assert [p.parent for p in paths] == [in_memory] + [durable] * 3
    assert sum("memory tier" in r.message and "full" in r.message for r in caplog.records) == 1
    assert AtomicDirectory(durable).latest_checkpoint() == str(paths[-1])
    assert [p.name for p in paths] == [f"AtomicDirectory_checkpoint_{i}" for i in range(4)]


@pytest.mark.parametrize("asynchronous", [False, True])
def test_a_first_dcp_save_larger_than_the_tmpfs_goes_to_disk_with_one_warning(
        tmp_path: Path, memory_on_small_tmpfs: Path, caplog: pytest.LogCaptureFixture,
        asynchronous: bool) -> None:
    durable = tmp_path / "durable"
    saver = AtomicDirectory(durable)
    big = {"w": torch.arange(1_500_000, dtype=torch.float32)}  # 6 MB: the tmpfs has 4
    first = saver.save(big, metadata={"step": 1}, asynchronous=asynchronous)
    first.wait()
    second = saver.save({"w": torch.ones(10)}, metadata={"step": 2}, asynchronous=asynchronous)
    second.wait()
    saver.wait()
    assert [Path(first.directory).parent, Path(second.directory).parent] == [durable] * 2
    full = [r.message for r in caplog.records if "memory tier" in r.message and "full" in r.message]
    assert len(full) == 1 and "a save did not fit" in full[0], full
    loaded = {"w": torch.zeros(1_500_000)}
    assert AtomicDirectory(durable).load(loaded, checkpoint=first.directory.rsplit("_", 1)[1])
    assert torch.equal(loaded["w"], big["w"])
    in_memory = memory_on_small_tmpfs
    assert not list(in_memory.glob("AtomicDirectory_checkpoint_*")), "the failed save is gone"


FILLS_THE_TMPFS = """
import os, sys
from pathlib import Path
import torch
from cycler import AtomicDirectory
saver = AtomicDirectory(sys.argv[1])
directory = Path(saver.prepare_checkpoint_directory())
torch.save({"w": torch.zeros(1_500_000)}, directory / "model.pt")  # 6 MB into 4: ENOSPC
"""


def test_a_plain_script_whose_first_checkpoint_filled_the_tmpfs_saves_to_disk_after_its_crash(
        tmp_path: Path, memory_on_small_tmpfs: Path, caplog: pytest.LogCaptureFixture) -> None:
    durable = tmp_path / "durable"
    environment = {**os.environ, ENV_MEMORY_TIER: str(memory_on_small_tmpfs)}
    crashed = subprocess.run([sys.executable, "-c", FILLS_THE_TMPFS, str(durable)],
                             capture_output=True, text=True, env=environment)
    # torch.save says "unexpected pos" where the disk is full (DiskFull knows it too).
    assert crashed.returncode != 0 and "unexpected pos" in crashed.stderr, crashed.stderr
    in_memory = memory_on_small_tmpfs
    assert list(in_memory.glob("AtomicDirectory_checkpoint_*")), "the crash left a torn one"
    # The rerun (cycle run's restart) saves the same checkpoint: on disk this time, committed.
    saver = AtomicDirectory(durable)
    directory = Path(saver.prepare_checkpoint_directory())
    assert directory.parent == durable
    torch.save({"w": torch.zeros(1_500_000)}, directory / "model.pt")
    saver.symlink_latest(directory, metadata={"step": 1})
    assert saver.latest_checkpoint() == str(directory)
    assert sum("memory tier" in r.message and "full" in r.message for r in caplog.records) == 1
    assert not list(in_memory.glob("AtomicDirectory_checkpoint_*")), "the torn one is gone"


def test_persist_newest_copies_what_the_durable_root_lacks(tier: tuple[Path, Path]) -> None:
    durable, memory = tier
    saved(durable, 3)
    layouts = CheckpointLayout(memory), CheckpointLayout(durable)
    assert persist_newest(*layouts) == CheckpointName("AtomicDirectory", 2, False)
    assert persist_newest(*layouts) is None
    assert indices(durable) == [0, 2]


def test_a_persist_killed_between_its_manifest_and_the_link_moves_the_link_when_repeated(
        tier: tuple[Path, Path]) -> None:
    durable, memory = tier
    saved(durable, 3)
    layouts = CheckpointLayout(memory), CheckpointLayout(durable)
    assert persist_newest(*layouts) == CheckpointName("AtomicDirectory", 2, False)
    # As a kill after the manifest's rename and before the link's would leave it:
    _fs.atomic_symlink(durable / "AtomicDirectory_checkpoint_0", layouts[1].link_path)
    persist(*layouts, CheckpointName("AtomicDirectory", 2, False))
    assert layouts[1].link_target_name() == CheckpointName("AtomicDirectory", 2, False)


PERSISTER = """
import sys
from cycler.checkpoint.layout import CheckpointLayout, CheckpointName
from cycler.checkpoint.durable_copy import persist
memory, durable, index = sys.argv[1], sys.argv[2], int(sys.argv[3])
print("copying", flush=True)
name = CheckpointName("AtomicDirectory", index, False)
persist(CheckpointLayout(memory), CheckpointLayout(durable), name)
"""


def _persist_seconds(memory: Path, durable: Path) -> float:
    """Seconds from the persister's "copying" to its exit, for checkpoint 2 into ``durable``."""
    process = subprocess.Popen([sys.executable, "-c", PERSISTER, str(memory), str(durable), "2"],
                               stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None and process.stdout.readline() == "copying\n"
    started = time.monotonic()
    assert process.wait() == 0
    return time.monotonic() - started


def test_kill_9_during_a_persist_leaves_the_durable_root_at_its_previous_checkpoint(
        tier: tuple[Path, Path]) -> None:
    durable, memory = tier
    saver = AtomicDirectory(durable, keep_last=-1)
    directory = Path(saver.prepare_checkpoint_directory())
    torch.save({"w": torch.zeros(10)}, directory / "model.pt")
    saver.symlink_latest(directory, metadata={"step": 0})  # index 0: persisted
    saver.wait_for_persisting()
    for step in (1, 2):  # two memory-only checkpoints of 64 MB in 8 files
        directory = Path(saver.prepare_checkpoint_directory())
        for part in range(8):
            torch.save({"w": torch.randn(2 << 20)}, directory / f"part-{part}.pt")
        saver.symlink_latest(directory, metadata={"step": step})
    del saver
    # The kills land within the time a whole copy takes on this machine now (measured into a
    # scratch root): a fixed delay let a fast disk finish the copy before the first kill.
    scratch = durable.parent / "scratch"
    shutil.copytree(durable, scratch, symlinks=True)
    whole = _persist_seconds(memory, scratch)
    rng = random.Random(7)
    kills = 0
    for _ in range(10):
        process = subprocess.Popen([sys.executable, "-c", PERSISTER, str(memory), str(durable),
                                    "2"], stdout=subprocess.PIPE, text=True)
        assert process.stdout is not None and process.stdout.readline() == "copying\n"
        time.sleep(rng.uniform(0.05, 0.8) * whole)
        process.send_signal(signal.SIGKILL)
        killed = process.wait() == -signal.SIGKILL
        kills += killed
        target = (durable / "AtomicDirectory.latest_checkpoint").resolve().name
        if killed:
            assert target in ("AtomicDirectory_checkpoint_0", "AtomicDirectory_checkpoint_2")
        checkpoints = {c.index: c for c in list_checkpoints(durable)}
        assert checkpoints[0].valid
        assert all(c.valid or not c.committed for c in checkpoints.values()), checkpoints
        if target == "AtomicDirectory_checkpoint_2":
            assert checkpoints[2].valid
            break
    print("kills during the copy:", kills)
    assert kills >= 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        persist(CheckpointLayout(memory), CheckpointLayout(durable),
                CheckpointName("AtomicDirectory", 2, False))
    assert indices(durable)[-1] == 2
    manifest = json.loads((durable / "AtomicDirectory_checkpoint_2" / "cycler_manifest.json")
                          .read_text())
    assert manifest["step"] == 2


def test_a_memory_manifest_naming_a_file_outside_is_never_copied(
        tier: tuple[Path, Path], tmp_path: Path) -> None:
    durable, memory = tier
    saved(durable, 2)
    source = memory / "AtomicDirectory_checkpoint_1"
    manifest = json.loads((source / "cycler_manifest.json").read_text())
    record = manifest["files"].pop("model.pt")
    manifest["files"]["../../escaped.pt"] = record
    (source / "cycler_manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(CorruptCheckpoint, match="outside the checkpoint"):
        persist(CheckpointLayout(memory), CheckpointLayout(durable),
                CheckpointName("AtomicDirectory", 1, False))
    assert not list(tmp_path.rglob("escaped.pt"))
    assert not (durable / "AtomicDirectory_checkpoint_1").exists()


def test_resume_from_finds_its_checkpoint_in_either_tier_for_latest_checkpoint(
        tier: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    durable, memory = tier
    saved(durable, 5)  # K = 3: 0 and 3 persisted; memory keeps 3 and 4
    assert indices(durable) == [0, 3] and indices(memory) == [3, 4]
    for requested, where in (("0", durable), ("AtomicDirectory_checkpoint_0", durable),
                             ("4", memory), ("3", memory)):
        monkeypatch.setenv(ENV_RESUME_FROM, requested)
        found = AtomicDirectory(durable).latest_checkpoint()
        assert found == str(where / f"AtomicDirectory_checkpoint_{requested[-1]}"), requested


TOO_BIG_FOR_MEMORY = """
import sys, torch
from pathlib import Path
from cycler import AtomicDirectory, atomic_torch_save
saver = AtomicDirectory(sys.argv[1])
directory = Path(saver.prepare_checkpoint_directory())
atomic_torch_save({"w": torch.zeros(1_500_000)}, directory / "model.pt")  # 6 MB into 4
saver.symlink_latest(directory)
print(directory.parent)
"""


def test_a_first_checkpoint_too_big_for_memory_fails_once_whatever_removed_its_files(
        tmp_path: Path, memory_on_small_tmpfs: Path) -> None:
    """cycler's atomic_torch_save removes its temporary when the tmpfs is full, so nothing in
    memory shows how big the checkpoint was: the overflow is remembered in the checkpoint root
    and the next process saves there."""
    durable = tmp_path / "durable"
    runs = [subprocess.run([sys.executable, "-c", TOO_BIG_FOR_MEMORY, str(durable)],
                           capture_output=True, text=True) for _ in range(2)]
    assert runs[0].returncode != 0 and "no space left" in runs[0].stderr, runs[0].stderr
    assert runs[1].returncode == 0, runs[1].stderr
    assert runs[1].stdout.strip() == str(durable)
    assert indices(durable) == [1]


SAVES_FOREVER = """
import sys, torch
from pathlib import Path
from cycler import AtomicDirectory
saver = AtomicDirectory(sys.argv[1], keep_last=2)
found = saver.latest_checkpoint()
step = 0 if found is None else torch.load(Path(found) / "step.pt")["step"] + 1
print("saving", flush=True)
for _ in range(int(sys.argv[2])):
    directory = Path(saver.prepare_checkpoint_directory())
    for part in range(8):
        torch.save({"w": torch.full((65536,), float(step))}, directory / f"part-{part}.pt")
    torch.save({"step": step}, directory / "step.pt")
    saver.symlink_latest(directory, metadata={"step": step})
    step += 1
"""


SETS_ASIDE_AND_DIES = """
import os, signal, sys
from pathlib import Path
from cycler import _fs
newest = max(Path(sys.argv[1]).glob("AtomicDirectory_checkpoint_*"))
_fs.set_aside(newest)  # a removal's first step; killed before it deleted anything
os.kill(os.getpid(), signal.SIGKILL)
"""


def hidden_leftovers(root: Path) -> list[str]:
    """Temporaries in ``root`` and its ``.cycler/``: what no reader lists, holding RAM in a
    memory root."""
    return [str(p.relative_to(root)) for top in (root, root / ".cycler") if top.is_dir()
            for p in top.iterdir() if _fs.TEMP_MARKER in p.name]


def test_kill_9_during_background_persists_leaves_nothing_partial_in_either_root(
        tier: tuple[Path, Path]) -> None:
    """Persists (every 3rd checkpoint, 2 MB each) and both roots' retention run in the
    background of a process killed with SIGKILL at random moments, again and again: every
    restart goes on from the newest commit, what each kill leaves hidden in the memory root
    is reclaimed by the next start (RAM lost to kills: at most one checkpoint's at any time),
    and after the last start neither root holds a torn directory older than its newest commit
    or a leftover of a cut removal."""
    durable, memory = tier
    rng = random.Random(3)
    for _ in range(12):
        process = subprocess.Popen([sys.executable, "-c", SAVES_FOREVER, str(durable), "1000"],
                                   stdout=subprocess.PIPE, text=True)
        assert process.stdout is not None and process.stdout.readline() == "saving\n"
        time.sleep(rng.uniform(0.05, 0.8))
        process.send_signal(signal.SIGKILL)
        process.wait()
        # What the kill left hidden (the previous one's was reclaimed at this start): at most
        # one checkpoint's files (8 parts of 256 KiB and a step).
        hidden = sum(_fs.tree_size(memory / name) for name in hidden_leftovers(memory))
        assert hidden <= 9 * 65536 * 4 + 4096, hidden_leftovers(memory)
    # A removal killed right after its rename: a whole checkpoint, hidden, in RAM.
    killed = subprocess.run([sys.executable, "-c", SETS_ASIDE_AND_DIES, str(memory)])
    assert killed.returncode == -signal.SIGKILL and hidden_leftovers(memory) != []
    subprocess.run([sys.executable, "-c", SAVES_FOREVER, str(durable), "4"], check=True,
                   stdout=subprocess.DEVNULL)
    for root in (durable, memory):
        checkpoints = list_checkpoints(root, commit_state_only=True)
        newest = max(c.index for c in checkpoints if c.valid)
        assert [c.path.name for c in checkpoints if not c.valid and c.index < newest] == []
        assert hidden_leftovers(root) == [], root
