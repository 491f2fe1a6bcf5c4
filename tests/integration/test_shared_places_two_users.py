"""What sits beside the memory tier, against a second real local user (the accounts, the
stand-in for a shared sticky directory and the helpers of :mod:`test_memory_tier_two_users`;
skipped without root): the checkpoint root and ``<root>-lossy`` are the user's alone or
refused in one line naming their owner; a root shared on purpose with a group is used with
``--shared-root-group``, and its latest link never leads outside it; a compile directory of
another user, or a ``$USER`` naming another account, never stops a job.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.test_memory_tier_hostile_users import as_user, with_script
from tests.integration.test_memory_tier_two_users import (
    PLANT_TRAIN_PT,
    User,
    one_line_refusal,
    plant,
    shared,
    users,
)

__all__ = ["shared", "users"]  # fixtures, used by name

SHOW_LOSSY = "import os; print('lossy', os.environ.get('LOSSY_ARTIFACT_PATH'), flush=True)\n"


def run(user: User, root: Path, *more: str, script: str = "job.py",
        env: dict[str, str] | None = None, groups: tuple[int, ...] = (), umask: str = "022",
        ) -> subprocess.CompletedProcess[str]:
    """``cycle run`` of ``user``'s ``script`` on ``root``, its temporary files in the shared
    stand-in (``TMPDIR``: where torch and the compile cache look)."""
    done = as_user(user, sys.executable, "-m", "cycler_cli", "run", "--checkpoint-dir",
                   str(root), "--grace", "30", *more, str(user.home / script),
                   env={"TMPDIR": str(_shared_of(root)), **(env or {})}, groups=groups, umask=umask)
    assert isinstance(done, subprocess.CompletedProcess)
    return done


def _shared_of(root: Path) -> Path:
    return next(p for p in root.parents if p.name.startswith("cycler-shared-"))


def contents(top: Path) -> dict[str, tuple[int, int]]:
    """Every path under ``top`` with its size and owner: what a test asserts was not touched."""
    return {str(p.relative_to(top)): (p.lstat().st_size, p.lstat().st_uid)
            for p in top.rglob("*")}


def test_a_root_another_user_made_first_is_refused_naming_its_owner(
        users: tuple[User, User], shared: Path) -> None:
    vic, mal = users
    root = shared / "vicjob"
    plant(mal, [root], PLANT_TRAIN_PT)  # mal's, 0777, holding a valid checkpoint of mal's
    before = contents(root)
    said = one_line_refusal(run(vic, root))
    assert f"the checkpoint root {root} belongs to uid {mal.uid} ({mal.name})" in said, said
    assert "--shared-root-group" in said and "--checkpoint-dir" in said, said
    assert contents(root) == before  # nothing of vic's written into mal's directory


def test_a_root_of_vics_own_under_another_users_directory_is_refused(
        users: tuple[User, User], shared: Path) -> None:
    vic, mal = users
    malsdir = shared / "mals-dir"
    assert mal.run("mkdir", "-m", "777", str(malsdir)).returncode == 0
    said = one_line_refusal(run(vic, malsdir / "ck"))
    assert f"belongs to uid {mal.uid} ({mal.name}), who could replace" in said, said
    assert not (malsdir / "ck").exists()  # nothing made where mal could swap it


@pytest.fixture
def team(users: tuple[User, User]) -> Iterator[int]:
    """A throwaway group holding vic and mal (given to their processes by setpriv)."""
    name = f"cyteam{uuid.uuid4().hex[:6]}"
    subprocess.run(["groupadd", name], check=True, capture_output=True)
    import grp

    try:
        yield grp.getgrnam(name).gr_gid
    finally:
        subprocess.run(["groupdel", name], check=False, capture_output=True)


def test_a_root_shared_on_purpose_is_used_with_its_group_and_its_link_never_leads_outside(
        users: tuple[User, User], shared: Path, team: int) -> None:
    vic, mal = users
    teamdir, outside = shared / "team", shared / "elsewhere"
    made = as_user(mal, "sh", "-c", f"mkdir -m 2770 {teamdir} && chgrp {team} {teamdir}",
                   groups=(team,))  # the team's directory, of mal's
    assert made.returncode == 0, made.stderr
    root = teamdir / "vicjob"
    said = one_line_refusal(run(vic, root, groups=(team,), umask="002"))
    assert f"{teamdir} belongs to uid {mal.uid} ({mal.name})" in said, said
    first = run(vic, root, "--shared-root-group", str(team), groups=(team,), umask="002",
                env={"STEPS": "6"})
    assert first.returncode == 0, first.stderr
    assert os.stat(root).st_mode & 0o020  # open to the team, as vic's umask asks
    # mal, a member of the team, links the root's latest to a checkpoint outside it.
    plant(mal, [outside], PLANT_TRAIN_PT)
    link = root / "AtomicDirectory.latest_checkpoint"
    linked = as_user(mal, "ln", "-sfn", str(outside / "AtomicDirectory_checkpoint_0"),
                     str(link), groups=(team,))
    assert linked.returncode == 0, linked.stderr
    done = run(vic, root, "--shared-root-group", str(team), groups=(team,), umask="002")
    assert done.returncode == 0, done.stderr
    assert "resumed from AtomicDirectory_checkpoint_0 at step 5" in done.stdout, done.stdout
    assert "6666" not in done.stdout


def test_a_lossy_link_planted_beside_the_root_is_never_handed_to_the_workers(
        users: tuple[User, User], shared: Path) -> None:
    vic, mal = users
    with_script(vic, "lossy.py", SHOW_LOSSY)
    sink = shared / "malsink"
    for name in ("vicjob", "iscjob"):
        planted = mal.run("sh", "-c", f"mkdir -p -m 777 {sink} && ln -s {sink} "
                          f"{shared / name}-lossy")
        assert planted.returncode == 0, planted.stderr
    done = run(vic, shared / "vicjob", script="lossy.py")  # off ISC: nothing beside the root
    assert done.returncode == 0 and "lossy None" in done.stdout, done.stdout + done.stderr
    root = shared / "iscjob"  # on ISC: its contract asks for <root>-lossy, refused here
    said = one_line_refusal(run(vic, root, script="lossy.py",
                                env={"CHECKPOINT_ARTIFACT_PATH": str(root)}))
    assert f"LOSSY_ARTIFACT_PATH's directory {root}-lossy is unsafe: {root}-lossy is a symlink " \
        f"of uid {mal.uid}" in said and "set LOSSY_ARTIFACT_PATH to a directory of" in said, said
    assert os.listdir(sink) == [] and (shared / "vicjob-lossy").is_symlink()


def test_compile_directories_another_user_made_first_never_stop_a_job(
        users: tuple[User, User], shared: Path) -> None:
    vic, mal = users
    torch_dir, base = shared / f"torchinductor_{vic.name}", shared / f"cycler-{vic.uid}"
    for path in (torch_dir, base):
        assert mal.run("mkdir", "-m", "777", str(path)).returncode == 0
    done = run(vic, shared / "vicjob")
    assert done.returncode == 0, done.stderr
    assert done.stderr.count(f"torch's compile directory {torch_dir} belongs to uid "
                             f"{mal.uid} ({mal.name})") == 1, done.stderr
    assert done.stderr.count("this run compiles into") == 1, done.stderr
    assert os.listdir(torch_dir) == [] and os.listdir(base) == []


def test_a_user_variable_naming_another_account_never_stops_a_job(
        users: tuple[User, User], shared: Path) -> None:
    vic, _ = users
    (shared / "torchinductor_root").mkdir(mode=0o700)  # root's own, as on any machine
    done = run(vic, shared / "vicjob", env={"USER": "root", "LOGNAME": "root"})
    assert done.returncode == 0, done.stderr
    warned = [line for line in done.stderr.splitlines() if "precompiled headers" in line]
    assert len(warned) == 1 and f"not your account {vic.name}" in warned[0], done.stderr
    assert "remove" not in warned[0]
