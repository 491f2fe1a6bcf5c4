"""The victim's own tools against another local user's plants, round 2 of the hostile review of
the memory tier: ``cycle status``, ``cycle prune`` and ``cycle verify`` against planted or forged
directories and records, and the victim's legitimate cases (two jobs, a restart after kill -9, a
tier left by a removed root). Real users, as in :mod:`test_memory_tier_hostile_users`; skipped
without root.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from cycler.checkpoint.memory_roots import memory_root
from cycler.protocol.exit_codes import EXIT_USAGE
from tests.integration.test_memory_tier_hostile_users import (
    as_user,
    cycle,
    killed_after_checkpoints,
    run_job,
)
from tests.integration.test_memory_tier_two_users import (
    PLANT_TRAIN_PT,
    User,
    one_line_refusal,
    plant,
    shared,
    users,
    vic_memory_root,
)

__all__ = ["shared", "users"]  # fixtures, used by name


# ---------------------------------------------------------------------------------------------
# The victim's tools against a planted tier


@contextlib.contextmanager
def planted_default_tier(vic: User, mal: User, root: Path) -> Iterator[Path]:
    """mal's directory where vic's default base on this host would be, holding a checkpoint
    of ``root``'s memory root; removed afterwards."""
    base = Path("/dev/shm") / f"cycler-{vic.uid}"
    plant(mal, [memory_root(base, root)], PLANT_TRAIN_PT)
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_status_and_prune_by_the_victim_never_read_or_touch_a_planted_tier(
        users: tuple[User, User], shared: Path) -> None:
    vic, mal = users
    root = vic.home / "ck-status"
    assert run_job(vic, shared, root).returncode == 0
    record = root / ".cycler" / "memory-tier.json"
    with planted_default_tier(vic, mal, root) as base:
        planted = memory_root(base, root)
        record.write_text(f'{{"root": "{planted}", "host": "{os.uname().nodename}"}}')
        os.chown(record, vic.uid, vic.gid)
        before = sorted(str(p) for p in base.rglob("*"))
        status = cycle(vic, "status", str(root))
        assert status.returncode == 0, status.stderr
        assert str(planted) not in status.stdout and "Traceback" not in status.stderr
        shutil.rmtree(root)  # a root that is gone: the note about a tier left must not come
        gone = cycle(vic, "status", str(root))
        assert str(planted) not in gone.stdout + gone.stderr
        assert as_user(vic, "mkdir", str(root)).returncode == 0
        pruned = cycle(vic, "prune", str(root), "--keep-last", "0", "--force")
        assert "Traceback" not in pruned.stderr, pruned.stderr
        assert sorted(str(p) for p in base.rglob("*")) == before


@pytest.mark.parametrize("how", ["directory", "symlink"])
def test_verify_refuses_a_scratch_base_another_user_planted(
        users: tuple[User, User], shared: Path, how: str) -> None:
    vic, mal = users
    scratch = shared / f"cycler-verify-{vic.uid}"
    mals = shared / "mal-scratch"
    make = (f"mkdir -m 777 {scratch}" if how == "directory" else
            f"mkdir -m 777 {mals} && ln -s {mals} {scratch}")
    assert as_user(mal, "sh", "-c", make).returncode == 0
    done = cycle(vic, "verify", "--stops", "1", str(vic.home / "job.py"),
                 env={"TMPDIR": str(shared)})
    said = one_line_refusal(done)
    assert str(scratch) in said, said
    assert not any(mals.iterdir()) if mals.exists() else True


# ---------------------------------------------------------------------------------------------
# The victim's own legitimate cases


def test_two_jobs_of_one_user_share_the_base_and_keep_their_own_tiers(
        users: tuple[User, User], shared: Path) -> None:
    vic, _ = users
    first, second = vic.home / "ck-one", vic.home / "ck-two"
    done = [as_user(vic, sys.executable, "-m", "cycler_cli", "run", "--memory-dir", str(shared),
                    "--checkpoint-dir", str(root), str(vic.home / "job.py"), wait=False)
            for root in (first, second)]
    for process in done:
        assert isinstance(process, subprocess.Popen)
        _, err = process.communicate(timeout=240)
        assert process.returncode == 0, err
    for root in (first, second):
        assert any(root.glob("AtomicDirectory_checkpoint_*"))


def test_a_restart_after_kill_9_of_everything_resumes_from_memory(
        users: tuple[User, User], shared: Path) -> None:
    vic, _ = users
    root = vic.home / "ck-kill9"
    killed_after_checkpoints(vic, shared, root, env={"STEPS": "11"})
    again = run_job(vic, shared, root, env={"STEPS": "13"})
    assert again.returncode == 0, again.stderr
    assert "at step 10" in again.stdout, again.stdout


def test_a_tier_left_by_a_job_whose_root_was_removed_is_never_resumed_from(
        users: tuple[User, User], shared: Path) -> None:
    vic, _ = users
    root = vic.home / "ck-removed"
    killed_after_checkpoints(vic, shared, root)
    shutil.rmtree(root)
    again = run_job(vic, shared, root)
    assert again.returncode == 0, again.stderr
    assert "resumed from" not in again.stdout, again.stdout


@pytest.mark.parametrize("record", ["memory-tier-overflow.json", "memory-tier.json"])
def test_a_fifo_a_group_member_put_as_a_record_never_blocks_run_or_status(
        users: tuple[User, User], shared: Path, record: str) -> None:
    vic, mal = users
    root = shared / f"team-ck-{record}"
    assert as_user(vic, "mkdir", "-m", "2770", str(root)).returncode == 0
    assert run_job(vic, shared, root, umask="002").returncode == 0
    path = root / ".cycler" / record
    done = as_user(mal, "sh", "-c", f"rm -f {path} && mkfifo {path}", groups=(vic.gid,))
    assert done.returncode == 0, done.stderr
    for args in (("status", str(root)), ("run", "--memory-dir", str(shared), "--checkpoint-dir",
                                          str(root), str(vic.home / "job.py"))):
        finished = cycle(vic, *args, umask="002", timeout=60)
        assert finished.returncode in (0, EXIT_USAGE), finished.stderr
        assert "Traceback" not in finished.stderr, finished.stderr


def test_verify_refuses_a_tmpdir_another_user_could_swap_its_scratch_out_of(
        users: tuple[User, User], shared: Path) -> None:
    vic, mal = users
    theirs = shared / "mal-tmp"
    assert as_user(mal, "mkdir", "-m", "1777", str(theirs)).returncode == 0
    said = one_line_refusal(cycle(vic, "verify", "--stops", "1", str(vic.home / "job.py"),
                                  env={"TMPDIR": str(theirs)}))
    assert f"belongs to uid {mal.uid}" in said, said
    assert list(theirs.iterdir()) == []


def test_a_record_a_group_member_forged_never_makes_status_or_prune_touch_another_jobs_tier(
        users: tuple[User, User], shared: Path) -> None:
    vic, mal = users
    private_root, team_root = vic.home / "ck-private", shared / "team-ck-forged"
    killed_after_checkpoints(vic, shared, private_root, env={"STEPS": "16"})
    other_tier = vic_memory_root(vic, shared, private_root)
    kept = sorted(p.name for p in other_tier.glob("AtomicDirectory_checkpoint_*"))
    assert len(kept) >= 2, kept
    assert as_user(vic, "mkdir", "-m", "2770", str(team_root)).returncode == 0
    assert run_job(vic, shared, team_root, umask="002").returncode == 0
    record = team_root / ".cycler" / "memory-tier.json"
    forged = f'{{"root": "{other_tier}", "host": "{os.uname().nodename}"}}'
    done = as_user(mal, "sh", "-c", f"rm -f {record} && echo '{forged}' > {record}",
                   groups=(vic.gid,))
    assert done.returncode == 0, done.stderr
    status = cycle(vic, "status", str(team_root))
    assert status.returncode == 0 and str(other_tier) not in status.stdout, status.stdout
    pruned = cycle(vic, "prune", str(team_root), "--keep-last", "1")
    assert pruned.returncode == 0, pruned.stderr
    assert sorted(p.name for p in other_tier.glob("AtomicDirectory_checkpoint_*")) == kept
