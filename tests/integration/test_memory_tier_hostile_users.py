"""The memory tier against a second local user, round 2 (a hostile review of the first round's
fixes): paths through places another user controls, special files where a directory or a record
is expected, the victim's umask, a full tmpfs and a race for the base. Real users made with
useradd, run with setpriv (the accounts and the stand-in for /dev/shm of
:mod:`test_memory_tier_two_users`); skipped without root. The victim's own tools and legitimate
cases: :mod:`test_memory_tier_hostile_tools`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from cycler.checkpoint.memory_roots import memory_base
from cycler.protocol.exit_codes import EXIT_USAGE
from tests.integration.test_memory_tier_two_users import (
    PLANT_TRAIN_PT,
    REPOSITORY,
    User,
    _python_reachable,
    one_line_refusal,
    plant,
    shared,
    users,
    vic_memory_root,
)
from tests.integration.tmpfs import mounted_tmpfs

__all__ = ["shared", "users"]  # fixtures, used by name

SHOW_TIER = "import os; print('tier', os.environ.get('CYCLER_MEMORY_TIER'), flush=True)\n"


def as_user(user: User, *command: str, umask: str = "022", groups: tuple[int, ...] = (),
            env: dict[str, str] | None = None, wait: bool = True, timeout: float = 240,
            ) -> subprocess.CompletedProcess[str] | subprocess.Popen[str]:
    """``command`` as ``user`` with ``umask`` and the supplementary ``groups``."""
    environment = {"PATH": os.environ["PATH"], "HOME": str(user.home),
                   "PYTHONPATH": str(REPOSITORY), "OMP_NUM_THREADS": "1", **(env or {})}
    group_option = (f"--groups={','.join(map(str, groups))}" if groups else "--clear-groups")
    line = [*_python_reachable(), "setpriv", f"--reuid={user.uid}", f"--regid={user.gid}",
            group_option, "--", "sh", "-c", f'umask {umask}; exec "$@"', "sh", *command]
    if not wait:
        return subprocess.Popen(line, env=environment, cwd=user.home, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True)
    return subprocess.run(line, env=environment, cwd=user.home, text=True, capture_output=True,
                          timeout=timeout)


def cycle(user: User, *args: str, umask: str = "022", env: dict[str, str] | None = None,
          timeout: float = 240) -> subprocess.CompletedProcess[str]:
    done = as_user(user, sys.executable, "-m", "cycler_cli", *args, umask=umask, env=env,
                   timeout=timeout)
    assert isinstance(done, subprocess.CompletedProcess)
    return done


def run_job(user: User, memory_dir: Path | None, root: Path, *more: str, umask: str = "022",
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    where = ["--memory-tier"] if memory_dir is None else ["--memory-dir", str(memory_dir)]
    if umask == "002":  # a root the user shares with the own group on purpose: said so
        where += ["--shared-root-group", user.name]
    return cycle(user, "run", *where, "--checkpoint-dir", str(root), "--grace", "30", *more,
                 str(user.home / "job.py"), umask=umask, env=env)


def with_script(user: User, name: str, text: str) -> Path:
    path = user.home / name
    path.write_text(text)
    os.chown(path, user.uid, user.gid)
    return path


def killed_after_checkpoints(user: User, memory_dir: Path, root: Path, umask: str = "022",
                             env: dict[str, str] | None = None) -> None:
    """``cycle run`` of the job, every process of ``user`` killed with SIGKILL once the job's
    checkpoints are committed (in memory only: nothing is persisted before the end)."""
    marker = user.home / "done-saving"
    waiting = with_script(user, "waits.py", (user.home / "job.py").read_text().replace(
        "control.close()", f"open({str(marker)!r}, 'w').close(); time.sleep(600)"))
    process = as_user(user, sys.executable, "-m", "cycler_cli", "run", "--memory-dir",
                      str(memory_dir), "--checkpoint-dir", str(root), "--persist-every", "100",
                      str(waiting), umask=umask, env=env, wait=False)
    assert isinstance(process, subprocess.Popen)
    deadline = time.monotonic() + 120
    while not marker.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert marker.exists(), process.communicate()
    marker.unlink()
    for _ in range(3):  # every process of the throwaway user, by id
        listed = subprocess.run(["pgrep", "-U", str(user.uid)], capture_output=True, text=True)
        for pid in map(int, listed.stdout.split()):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    process.communicate()


def files_open_to_others(top: Path) -> list[str]:
    found = []
    for path in [top, *top.rglob("*")]:
        mode = path.lstat().st_mode
        if not path.is_symlink() and mode & 0o077:
            found.append(f"{path} {oct(mode)}")
    return found


# ---------------------------------------------------------------------------------------------
# Paths through places another user controls


def test_a_memory_directory_through_another_users_symlink_is_refused(
        users: tuple[User, User], shared: Path) -> None:
    vic, mal = users
    elsewhere = Path(tempfile.mkdtemp(prefix="cycler-shm-"))
    os.chmod(elsewhere, 0o1777)  # as safe as /dev/shm: only the link is mal's
    link = shared / "shm"
    assert as_user(mal, "ln", "-s", str(elsewhere), str(link)).returncode == 0
    try:
        said = one_line_refusal(run_job(vic, link, vic.home / "ck-link"))
        assert "symlink" in said and str(mal.uid) in said, said
        assert not any(elsewhere.iterdir())
    finally:
        shutil.rmtree(elsewhere, ignore_errors=True)


def test_a_memory_directory_inside_a_directory_others_may_rename_it_out_of_is_refused(
        users: tuple[User, User], shared: Path) -> None:
    vic, _ = users
    open_dir = shared / "vic-open"
    assert as_user(vic, "mkdir", "-m", "777", str(open_dir)).returncode == 0
    assert as_user(vic, "mkdir", "-m", "700", str(open_dir / "shm")).returncode == 0
    said = one_line_refusal(run_job(vic, open_dir / "shm", vic.home / "ck-open"))
    assert str(open_dir) in said and "sticky" in said, said


def test_a_memory_directory_made_under_umask_000_is_made_private_all_the_way(
        users: tuple[User, User], shared: Path) -> None:
    vic, _ = users
    made = shared / "vic-new" / "deeper" / "shm"
    done = run_job(vic, made, vic.home / "ck-umask-made", umask="000")
    assert done.returncode == 0, done.stderr
    for directory in (shared / "vic-new", shared / "vic-new" / "deeper", made):
        assert directory.stat().st_mode & 0o777 == 0o700, directory


def test_an_xdg_runtime_dir_that_others_may_rename_is_not_used(
        users: tuple[User, User], shared: Path) -> None:
    vic, _ = users
    open_dir = shared / "vic-run-parent"
    assert as_user(vic, "mkdir", "-m", "777", str(open_dir)).returncode == 0
    assert as_user(vic, "mkdir", "-m", "700", str(open_dir / "run")).returncode == 0
    with_script(vic, "show.py", SHOW_TIER)
    default_base = Path("/dev/shm") / f"cycler-{vic.uid}"
    try:
        done = cycle(vic, "run", "--memory-tier", "--checkpoint-dir", str(vic.home / "ck-xdg"),
                     str(vic.home / "show.py"), env={"XDG_RUNTIME_DIR": str(open_dir / "run")})
        assert done.returncode == 0, done.stderr
        assert f"tier {default_base}/" in done.stdout, done.stdout
    finally:
        shutil.rmtree(default_base, ignore_errors=True)


@pytest.mark.parametrize("how", ["directory", "symlink"])
def test_an_xdg_runtime_dir_of_another_user_is_not_used(
        users: tuple[User, User], shared: Path, how: str) -> None:
    vic, mal = users
    theirs = shared / f"mal-run-{how}"
    assert as_user(mal, "mkdir", "-m", "777", str(theirs)).returncode == 0
    if how == "symlink":
        mine = shared / "vic-run"
        assert as_user(vic, "mkdir", "-m", "700", str(mine)).returncode == 0
        theirs = shared / "mal-link-to-vic-run"
        assert as_user(mal, "ln", "-s", str(mine), str(theirs)).returncode == 0
    with_script(vic, "show.py", SHOW_TIER)
    default_base = Path("/dev/shm") / f"cycler-{vic.uid}"
    try:
        done = cycle(vic, "run", "--memory-tier", "--checkpoint-dir",
                     str(vic.home / f"ck-xdg-{how}"), str(vic.home / "show.py"),
                     env={"XDG_RUNTIME_DIR": str(theirs)})
        assert done.returncode == 0, done.stderr
        assert f"tier {default_base}/" in done.stdout, done.stdout
    finally:
        shutil.rmtree(default_base, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# What another user may put where a directory or a file is expected


@pytest.mark.parametrize("what", ["fifo", "hardlink", "socket"])
def test_a_special_file_in_place_of_the_base_is_refused_without_blocking(
        users: tuple[User, User], shared: Path, what: str) -> None:
    vic, mal = users
    root = vic.home / f"ck-{what}"
    base = vic_memory_root(vic, shared, root).parent
    make = {"fifo": f"mkfifo {base}",
            "hardlink": f"touch {shared}/mal-file && ln {shared}/mal-file {base}",
            "socket": f"{sys.executable} -c \"import socket; "
                      f"socket.socket(socket.AF_UNIX).bind('{base}')\""}[what]
    assert as_user(mal, "sh", "-c", make).returncode == 0
    said = one_line_refusal(run_job(vic, shared, root))
    assert "is not a directory" in said, said


@pytest.mark.parametrize("what", ["fifo", "symlink"])
def test_a_job_id_a_group_member_replaced_is_refused_without_blocking(
        users: tuple[User, User], shared: Path, what: str) -> None:
    vic, mal = users
    root = shared / f"team-ck-{what}"  # a checkpoint root vic shares with mal's group
    assert as_user(vic, "mkdir", "-m", "2770", str(root)).returncode == 0
    assert run_job(vic, shared, root, umask="002").returncode == 0
    job_id = root / ".cycler" / "job-id"
    forged = shared / "mal-id"
    forged.write_text("0" * 32)
    replace = (f"rm -f {job_id} && mkfifo {job_id}" if what == "fifo" else
               f"rm -f {job_id} && ln -s {forged} {job_id}")
    done = as_user(mal, "sh", "-c", replace, groups=(vic.gid,))
    assert done.returncode == 0, done.stderr
    started = time.monotonic()
    said = one_line_refusal(run_job(vic, shared, root, umask="002"))
    assert "job-id" in said or "job id" in said, said
    assert time.monotonic() - started < 60


# ---------------------------------------------------------------------------------------------
# The victim's umask and a full tmpfs


@pytest.mark.parametrize("umask", ["000", "077"])
def test_every_file_of_the_tier_is_private_whatever_the_umask(
        users: tuple[User, User], shared: Path, umask: str) -> None:
    vic, _ = users
    root = vic.home / f"ck-umask-{umask}"
    killed_after_checkpoints(vic, shared, root, umask=umask)
    base = memory_base(shared).with_name(f"cycler-{vic.uid}")
    assert any(base.rglob("train.pt"))
    assert files_open_to_others(base) == []


def test_a_tmpfs_another_user_filled_is_refused_at_start_or_the_job_saves_on_disk(
        users: tuple[User, User], shared: Path) -> None:
    vic, mal = users
    with mounted_tmpfs(shared / "shm", "4m") as shm:
        os.chmod(shm, 0o1777)
        assert as_user(mal, "sh", "-c", f"dd if=/dev/zero of={shm}/fill bs=64k "
                       "2>/dev/null; true").returncode == 0
        full = run_job(vic, shm, vic.home / "ck-full")
        assert full.returncode == EXIT_USAGE and "no room" in full.stderr, full.stderr
        assert as_user(mal, "sh", "-c", f"truncate -s -256k {shm}/fill").returncode == 0
        root = vic.home / "ck-nearly-full"
        done = run_job(vic, shm, root, env={"SIZE": "200000"})
        assert done.returncode == 0, done.stderr
        assert "6666" not in done.stdout


def test_a_huge_sparse_file_of_another_user_changes_nothing(
        users: tuple[User, User], shared: Path) -> None:
    vic, mal = users
    with mounted_tmpfs(shared / "shm", "16m") as shm:
        os.chmod(shm, 0o1777)
        assert as_user(mal, "truncate", "-s", "1T", f"{shm}/sparse").returncode == 0
        root = vic.home / "ck-sparse"
        done = run_job(vic, shm, root)
        assert done.returncode == 0, done.stderr
        assert any(root.glob("AtomicDirectory_checkpoint_*"))


# ---------------------------------------------------------------------------------------------
# Races


def test_a_base_another_user_keeps_replacing_is_never_used(
        users: tuple[User, User], shared: Path) -> None:
    vic, mal = users
    root = vic.home / "ck-race"
    base = vic_memory_root(vic, shared, root).parent
    planted = shared / "mal-planted"
    plant(mal, [planted / vic_memory_root(vic, shared, root).name], PLANT_TRAIN_PT)
    loop = (f"while true; do ln -sfn {planted} {base} 2>/dev/null; rm -f {base}; "
            f"mkdir -m 777 {base} 2>/dev/null; rmdir {base} 2>/dev/null; done")
    racer = as_user(mal, "sh", "-c", loop, wait=False)
    assert isinstance(racer, subprocess.Popen)
    try:
        outcomes = []
        for _ in range(6):
            done = run_job(vic, shared, root)
            assert "6666" not in done.stdout, done.stdout
            if done.returncode == 0:
                assert base.lstat().st_uid == vic.uid and not base.is_symlink()
                outcomes.append("ran")
                shutil.rmtree(base)  # race again for the base's making
            else:
                one_line_refusal(done)
                outcomes.append("refused")
    finally:
        os.killpg(racer.pid, signal.SIGKILL)
        racer.wait()
    assert set(outcomes) <= {"ran", "refused"}


@pytest.mark.parametrize(("owner", "mode", "used"), [("mal", "1777", False),
                                                     ("vic", "777", False),
                                                     ("vic", "1777", True)])
def test_a_world_writable_memory_directory_is_used_only_when_sticky_and_not_anothers(
        users: tuple[User, User], shared: Path, owner: str, mode: str, used: bool) -> None:
    vic, mal = users
    directory = shared / f"{owner}-{mode}"
    maker = vic if owner == "vic" else mal
    assert as_user(maker, "mkdir", "-m", mode, str(directory)).returncode == 0
    done = run_job(vic, directory, vic.home / f"ck-{owner}-{mode}")
    if used:
        assert done.returncode == 0, done.stderr
    else:
        said = one_line_refusal(done)
        assert str(directory) in said, said
