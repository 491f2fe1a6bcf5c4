"""AtomicDirectory with 2 real gloo processes: one path, one commit, one agreement on pins, and
a rank that never shows up makes the others fail within the timeout instead of hanging."""

from __future__ import annotations

import datetime
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from gloo_ranks import run_on_every_rank

from cycler.checkpoint.atomic_directory import AtomicDirectory
from cycler.checkpoint.listing import latest_checkpoint
from cycler.checkpoint.manifest import read_manifest
from cycler.checkpoint.saving import atomic_torch_save
from cycler.errors import CoordinationTimeout

WORLD_SIZE = 2
SHORT = datetime.timedelta(seconds=1.5)


def every_rank(value: object) -> list[object]:
    gathered: list[object] = [None] * WORLD_SIZE
    dist.all_gather_object(gathered, value)
    return gathered


def check_ranks_save_into_one_directory_and_the_commit_covers_every_rank(root: Path) -> None:
    rank = dist.get_rank()
    saver = AtomicDirectory(root, keep_last=2, timeout=datetime.timedelta(seconds=30))
    for step in range(4):
        path = saver.prepare_checkpoint_directory()
        assert every_rank(path) == [path, path]
        if rank == 1:
            time.sleep(0.3)  # a slow rank: the commit must still wait for its file
        atomic_torch_save({"rank": rank, "step": step, "weights": torch.full((1000,), rank)},
                          Path(path) / f"rank-{rank}.pt")
        saver.symlink_latest(path, metadata={"step": step})
        manifest = read_manifest(Path(path))  # read on both ranks once commit returned
        assert set(manifest.files) == {"rank-0.pt", "rank-1.pt"}
        assert (manifest.step, manifest.world_size, manifest.index) == (step, 2, step)
        assert saver.latest_checkpoint() == path
        for other in range(WORLD_SIZE):
            saved = torch.load(Path(path) / f"rank-{other}.pt", weights_only=True)
            assert (saved["rank"], saved["step"]) == (other, step)
    dist.barrier()  # retention runs on rank 0 after the others have already returned
    names = sorted(os.listdir(root))
    assert names == [".cycler", "AtomicDirectory.latest_checkpoint",
                     "AtomicDirectory_checkpoint_2", "AtomicDirectory_checkpoint_3"]
    assert latest_checkpoint(root, verify=True) == root / "AtomicDirectory_checkpoint_3"


def check_force_save_pins_if_any_rank_asks_under_sync_any_and_only_if_all_ask_under_sync_all(
        root: Path) -> None:
    rank = dist.get_rank()
    outcomes = {}
    for strategy in ("sync_any", "sync_all"):
        saver = AtomicDirectory(root, name=strategy, strategy=strategy)
        for asked in ((False, False), (False, True), (True, True)):
            path = saver.prepare_checkpoint_directory(force_save=asked[rank])
            assert every_rank(path) == [path, path]
            saver.symlink_latest(path)
            outcomes[strategy, asked] = path.endswith("_force")
    assert outcomes == {
        ("sync_any", (False, False)): False,
        ("sync_any", (False, True)): True,
        ("sync_any", (True, True)): True,
        ("sync_all", (False, False)): False,
        ("sync_all", (False, True)): False,
        ("sync_all", (True, True)): True,
    }


def check_rank_0_fails_within_the_timeout_when_rank_1_never_commits(root: Path) -> None:
    # Every check uses its own saver name: a rank that skipped a call leaves that name's
    # rounds out of step for the rest of the job, as the coordination contract says.
    saver = AtomicDirectory(root, name="rank_1_skips", timeout=SHORT)
    path = saver.prepare_checkpoint_directory()
    if dist.get_rank() == 0:
        started = time.monotonic()
        try:
            saver.symlink_latest(path)
        except CoordinationTimeout as error:
            waited = time.monotonic() - started
            assert SHORT.total_seconds() - 0.1 <= waited <= SHORT.total_seconds() + 3, waited
            assert "rank 0 waited 1.5 s for every rank" in str(error)
        else:
            raise AssertionError("rank 0 committed without rank 1")
        assert latest_checkpoint(root, name="rank_1_skips") is None  # nothing was committed
        assert not (Path(path) / "cycler_manifest.json").exists()


def check_rank_1_fails_within_the_timeout_when_rank_0_never_commits(root: Path) -> None:
    saver = AtomicDirectory(root, name="rank_0_skips", timeout=SHORT)
    path = saver.prepare_checkpoint_directory()
    if dist.get_rank() == 1:
        started = time.monotonic()
        try:
            saver.symlink_latest(path)
        except CoordinationTimeout as error:
            assert time.monotonic() - started <= SHORT.total_seconds() + 3
            assert "rank 1 waited 1.5 s for every rank to reach it" in str(error)
        else:
            raise AssertionError("rank 1 returned from a commit rank 0 never made")


def check_a_failed_commit_on_rank_0_is_reported_to_rank_1_instead_of_hanging(
        root: Path) -> None:
    saver = AtomicDirectory(root, timeout=datetime.timedelta(seconds=30))
    path = Path(saver.prepare_checkpoint_directory())
    if dist.get_rank() == 1:
        os.symlink("/etc/hostname", path / "not-a-plain-file")  # seal refuses symlinks
    dist.barrier()
    try:
        saver.symlink_latest(path)
    except Exception as error:  # rank 0 raises the cause, rank 1 learns it through the store
        assert "symlink" in str(error), error
        if dist.get_rank() == 1:
            assert "rank 0 failed" in str(error)
    else:
        raise AssertionError("a checkpoint holding a symlink was committed")
    assert latest_checkpoint(root) is None


def test_two_gloo_ranks_share_one_directory_per_save_and_agree_on_pins(tmp_path: Path) -> None:
    run_on_every_rank(
        __name__,
        "check_ranks_save_into_one_directory_and_the_commit_covers_every_rank",
        "check_force_save_pins_if_any_rank_asks_under_sync_any_and_only_if_all_ask_under_sync_all",
        root=tmp_path,
    )


def test_a_rank_that_never_commits_or_fails_makes_the_other_fail_instead_of_hanging(
        tmp_path: Path) -> None:
    run_on_every_rank(
        __name__,
        "check_rank_0_fails_within_the_timeout_when_rank_1_never_commits",
        "check_rank_1_fails_within_the_timeout_when_rank_0_never_commits",
        "check_a_failed_commit_on_rank_0_is_reported_to_rank_1_instead_of_hanging",
        root=tmp_path,
    )


def _built_before_the_group(rank: int, port: int, root: str) -> None:
    saver = AtomicDirectory(root, timeout=datetime.timedelta(seconds=30))  # no group yet
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=WORLD_SIZE)
    try:
        path = saver.prepare_checkpoint_directory()
        assert every_rank(path) == [path, path]
        atomic_torch_save({"rank": rank}, Path(path) / f"rank-{rank}.pt")
        saver.symlink_latest(path)
    finally:
        dist.destroy_process_group()


def test_a_saver_built_before_init_process_group_still_makes_one_shared_checkpoint(
        tmp_path: Path) -> None:
    import torch.multiprocessing as mp
    from gloo_ranks import free_port

    mp.spawn(_built_before_the_group, args=(free_port(), str(tmp_path)), nprocs=WORLD_SIZE,
             join=True)
    latest = latest_checkpoint(tmp_path)
    assert latest is not None
    assert set(read_manifest(latest).files) == {"rank-0.pt", "rank-1.pt"}
    assert read_manifest(latest).world_size == 2
