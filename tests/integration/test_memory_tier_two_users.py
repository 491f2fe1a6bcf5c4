"""The memory tier on a node shared by two real local users (throwaway accounts made with
useradd, processes run as them with setpriv): ``vic`` runs jobs, ``mal`` is any other local
user. Every attack of the hostile review (read, plant, DCP pickle code execution, the symlink
that makes retention delete another root) fails with one clear line, and nothing of vic's is
read, loaded or deleted.

The shared tmpfs is stood in for by a root-owned sticky directory made for the test (as
/dev/shm is), passed as ``--memory-dir``: the real /dev/shm is never touched.
"""

from __future__ import annotations

import functools
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from cycler.checkpoint.memory_roots import memory_base, memory_root
from cycler.protocol.exit_codes import EXIT_USAGE

REPOSITORY = Path(__file__).resolve().parents[2]

JOB = """
import os, sys, time, torch
from cycler import AtomicDirectory, StepControl, atomic_torch_save, default_checkpoint_root
saver = AtomicDirectory(default_checkpoint_root(), keep_last=3)
start = 0
if os.environ.get("LOAD_DCP"):
    state = {"w": torch.zeros(4)}
    print("loaded" if saver.load(state) else "nothing to load", flush=True)
elif (found := saver.latest_checkpoint()):
    start = torch.load(os.path.join(found, "train.pt"), weights_only=True)["step"]
    print("resumed from", os.path.basename(found), "at step", start, flush=True)
control = StepControl(every_steps=5, start_step=start)
for step in range(start, int(os.environ.get("STEPS", "12"))):
    time.sleep(0.01)
    decision = control.step()
    if decision.checkpoint:
        directory = saver.prepare_checkpoint_directory()
        atomic_torch_save({"w": torch.full((int(os.environ.get("SIZE", "100")),), float(step)),
                           "step": step + 1},
                          os.path.join(directory, "train.pt"))
        saver.symlink_latest(directory, metadata={"step": step + 1})
    if decision.stop:
        break
control.close()
"""


@dataclass(frozen=True)
class User:
    name: str
    uid: int
    gid: int
    home: Path

    def run(self, *command: str, env: dict[str, str] | None = None,
            ) -> subprocess.CompletedProcess[str]:
        """``command`` as this user (umask 022, as a login shell gives), in its home."""
        environment = {"PATH": os.environ["PATH"], "HOME": str(self.home),
                       "PYTHONPATH": str(REPOSITORY), "OMP_NUM_THREADS": "1", **(env or {})}
        as_user = ["setpriv", f"--reuid={self.uid}", f"--regid={self.gid}", "--clear-groups",
                   "--", "sh", "-c", 'umask 022; exec "$@"', "sh", *command]
        return subprocess.run([*_python_reachable(), *as_user], env=environment, cwd=self.home,
                              text=True, capture_output=True, timeout=240)

    def python(self, code: str, *args: str, env: dict[str, str] | None = None,
               ) -> subprocess.CompletedProcess[str]:
        return self.run(sys.executable, "-c", code, *args, env=env)

    def cycle_run(self, memory_dir: Path, root: Path, *args: str,
                  env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return self.run(sys.executable, "-m", "cycler_cli", "run", "--memory-dir",
                        str(memory_dir), "--checkpoint-dir", str(root), "--grace", "30",
                        *args, str(self.home / "job.py"), env=env)


@functools.cache
def _python_reachable() -> list[str]:
    """A prefix for a command line that lets other users run this interpreter: where it lies
    under a directory closed to them (root's pyenv under /root, 0700), the command runs in a
    mount namespace of its own where that directory is an open tmpfs holding only the
    interpreter's tree (nothing outside the namespace changes)."""
    prefix = Path(sys.base_prefix).resolve()
    closed = next((p for p in reversed(prefix.parents) if not os.stat(p).st_mode & 0o001),
                  None)
    if closed is None:
        return []
    keep = closed / prefix.relative_to(closed).parts[0]
    stash = tempfile.mkdtemp(prefix="cycler-python-")
    setup = (f"mount --bind {keep} {stash} && mount -t tmpfs -o mode=0755,size=1m tmpfs "
             f"{closed} && mkdir -p {keep} && mount --bind {stash} {keep} && exec \"$@\"")
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", setup, "sh"]


def _make_user(prefix: str) -> User:
    name = f"{prefix}{uuid.uuid4().hex[:6]}"
    home = Path(tempfile.mkdtemp(prefix=f"{name}-"))
    subprocess.run(["useradd", "--no-create-home", "--home-dir", str(home), "--shell",
                    "/usr/sbin/nologin", "--user-group", name], check=True, capture_output=True)
    entry = pwd.getpwnam(name)
    os.chown(home, entry.pw_uid, entry.pw_gid)
    os.chmod(home, 0o700)
    (home / "job.py").write_text(JOB)
    os.chown(home / "job.py", entry.pw_uid, entry.pw_gid)
    return User(name, entry.pw_uid, entry.pw_gid, home)


@pytest.fixture(scope="module")
def users() -> Iterator[tuple[User, User]]:
    """(vic, mal): two throwaway local accounts, removed afterwards."""
    if os.geteuid() != 0 or shutil.which("useradd") is None or shutil.which("setpriv") is None:
        pytest.skip("two real local users need root, useradd and setpriv")
    made = [_make_user("cyvic"), _make_user("cymal")]
    try:
        yield made[0], made[1]
    finally:
        for user in made:
            subprocess.run(["userdel", user.name], check=False, capture_output=True)
            shutil.rmtree(user.home, ignore_errors=True)


@pytest.fixture
def shared() -> Iterator[Path]:
    """A stand-in for /dev/shm: root's, mode 1777."""
    path = Path(tempfile.mkdtemp(prefix="cycler-shared-"))
    os.chmod(path, 0o1777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def vic_memory_root(vic: User, shared: Path, root: Path) -> Path:
    """Where vic's job keeps its memory root (computable by anyone: the attacks start here)."""
    base = memory_base(shared)
    return memory_root(base.with_name(f"cycler-{vic.uid}"), root)


def old_memory_root(shared: Path, root: Path) -> Path:
    """Where cycler put it before: the root's name and hash, straight in the shared tmpfs."""
    return memory_root(shared, root)


def one_line_refusal(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == EXIT_USAGE, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert "resumed from" not in done.stdout and "loaded" not in done.stdout
    return done.stderr


def plant(mal: User, where: list[Path], checkpoint_code: str, *args: str) -> None:
    """As mal: make each of ``where`` (and the directories above it) and commit a checkpoint
    there as ``checkpoint_code`` does."""
    for path in where:
        done = mal.python(checkpoint_code, str(path), *args)
        assert done.returncode == 0, done.stderr


PLANT_TRAIN_PT = """
import os, sys, torch
from pathlib import Path
from cycler.checkpoint.layout import CheckpointLayout
root = Path(sys.argv[1])
os.makedirs(root, exist_ok=True)
for parent in (root.parent, root):
    if parent.stat().st_uid == os.getuid():
        os.chmod(parent, 0o777)
from cycler import AtomicDirectory, atomic_torch_save
os.environ.pop("CYCLER_MEMORY_TIER", None)
saver = AtomicDirectory(root)
directory = saver.prepare_checkpoint_directory()
atomic_torch_save({"w": torch.full((100,), 666.0), "step": 6666},
                  os.path.join(directory, "train.pt"))
saver.symlink_latest(directory, metadata={"step": 6666})
"""

PLANT_EVIL_DCP = """
import os, pickle, sys
from pathlib import Path
root, marker = Path(sys.argv[1]), sys.argv[2]
os.makedirs(root, exist_ok=True)
for parent in (root.parent, root):
    if parent.stat().st_uid == os.getuid():
        os.chmod(parent, 0o777)
class Evil:
    def __reduce__(self):
        return (os.system, (f"touch {marker}",))
from cycler import AtomicDirectory
saver = AtomicDirectory(root)
directory = Path(saver.prepare_checkpoint_directory())
(directory / ".metadata").write_bytes(pickle.dumps(Evil()))
(directory / "__0_0.distcp").write_bytes(b"0" * 64)
saver.symlink_latest(directory, metadata={"step": 6666})
"""


def test_another_user_can_read_nothing_of_a_memory_checkpoint(
        users: tuple[User, User], shared: Path) -> None:
    vic, mal = users
    root = vic.home / "ck"
    memory = vic_memory_root(vic, shared, root)
    # A job stopped by a kill (no cycle run left to remove the tier): its checkpoints stay.
    done = vic.python(JOB.replace("control.close()", "os._exit(9)"),
                      env={"CYCLER_MEMORY_TIER": str(memory), "CYCLER_PERSIST_EVERY": "100",
                           "CYCLER_CHECKPOINT_DIR": str(root)})
    assert done.returncode == 9, done.stderr
    written = [p for p in memory.parent.rglob("*") if p.is_file() and not p.is_symlink()]
    assert any(p.name == "train.pt" for p in written), written
    assert all(p.stat().st_mode & 0o077 == 0 for p in written), [
        (str(p), oct(p.stat().st_mode)) for p in written if p.stat().st_mode & 0o077]
    for directory in [memory.parent, *(p for p in memory.parent.rglob("*") if p.is_dir())]:
        assert directory.stat().st_mode & 0o777 == 0o700, directory
    steal = mal.python("import sys, glob, torch\n"
                       "paths = glob.glob(sys.argv[1] + '/**/train.pt', recursive=True)\n"
                       "print(paths)\n"
                       "torch.load(paths[0]) if paths else open(sys.argv[2] + '/train.pt')",
                       str(shared), str(next(p.parent for p in written if p.name == "train.pt")))
    assert steal.returncode != 0 and "Permission denied" in steal.stderr, steal.stdout


@pytest.mark.parametrize("how", ["directory", "symlink"])
def test_a_checkpoint_another_user_planted_is_refused_at_start_and_never_loaded(
        users: tuple[User, User], shared: Path, how: str) -> None:
    vic, mal = users
    root = vic.home / f"ck-{how}"
    memory = vic_memory_root(vic, shared, root)
    if how == "directory":
        plant(mal, [memory, old_memory_root(shared, root)], PLANT_TRAIN_PT)
    else:  # vic's base is mal's symlink to mal's directory of planted checkpoints
        elsewhere = shared / "mal-own"
        plant(mal, [elsewhere / memory.name, old_memory_root(shared, root)], PLANT_TRAIN_PT)
        assert mal.run("ln", "-s", str(elsewhere), str(memory.parent)).returncode == 0
    done = vic.cycle_run(shared, root, "--persist-every", "1")
    said = one_line_refusal(done)
    assert str(memory.parent) in said and ("belongs to uid" in said or "symlink" in said), said
    assert not root.exists() or not any(root.glob("AtomicDirectory_checkpoint_*"))


def test_a_pickled_dcp_metadata_another_user_planted_never_runs(
        users: tuple[User, User], shared: Path) -> None:
    vic, mal = users
    root = vic.home / "ck-dcp"
    marker = Path(tempfile.mkdtemp()) / "ran-as-vic"
    os.chmod(marker.parent, 0o777)
    memory = vic_memory_root(vic, shared, root)
    plant(mal, [memory, old_memory_root(shared, root)], PLANT_EVIL_DCP, str(marker))
    said = one_line_refusal(vic.cycle_run(shared, root, env={"LOAD_DCP": "1"}))
    assert "refusing" in said, said
    assert not marker.exists(), "mal's pickle ran as vic"
    shutil.rmtree(marker.parent)


def test_a_symlink_of_another_user_never_makes_retention_delete_another_root(
        users: tuple[User, User], shared: Path) -> None:
    vic, mal = users
    other, root = vic.home / "ck_a", vic.home / "ck_b"
    done = vic.python(JOB, env={"CYCLER_CHECKPOINT_DIR": str(other), "STEPS": "31"})
    assert done.returncode == 0, done.stderr
    before = sorted(os.listdir(other))
    memory = vic_memory_root(vic, shared, root)
    for base in (memory.parent, shared):  # today's base, and where the job's root used to be
        made = mal.run("sh", "-c", f"mkdir -p -m 777 {base} && ln -sfn {other} "
                       f"{memory_root(base, root)}")
        assert made.returncode == 0 or base == shared, made.stderr
    said = one_line_refusal(vic.cycle_run(shared, root))
    assert "refusing" in said, said
    assert sorted(os.listdir(other)) == before


def test_a_memory_root_of_vics_own_that_others_may_write_is_refused(
        users: tuple[User, User], shared: Path) -> None:
    vic, _ = users
    root = vic.home / "ck-mode"
    memory = vic_memory_root(vic, shared, root)
    assert vic.run("mkdir", "-m", "700", str(memory.parent)).returncode == 0
    assert vic.run("mkdir", "-m", "777", str(memory)).returncode == 0
    said = one_line_refusal(vic.cycle_run(shared, root))
    assert "has mode 777" in said, said


def test_an_unwritable_memory_directory_is_refused_at_start(
        users: tuple[User, User], shared: Path) -> None:
    vic, _ = users
    unwritable = vic.home / "ro"
    assert vic.run("mkdir", "-m", "500", str(unwritable)).returncode == 0
    said = one_line_refusal(vic.cycle_run(unwritable, vic.home / "ck-ro"))
    assert "cannot create the memory tier's base" in said, said


def test_a_file_another_user_put_in_place_of_the_base_is_refused_at_start(
        users: tuple[User, User], shared: Path) -> None:
    vic, mal = users
    root = vic.home / "ck-touched"
    assert mal.run("touch", str(vic_memory_root(vic, shared, root).parent)).returncode == 0
    said = one_line_refusal(vic.cycle_run(shared, root))
    assert "refusing" in said, said


def test_a_file_as_the_memory_directory_is_refused_at_start(
        users: tuple[User, User], shared: Path) -> None:
    vic, _ = users
    assert vic.run("touch", str(vic.home / "a-file")).returncode == 0
    said = one_line_refusal(vic.cycle_run(vic.home / "a-file", vic.home / "ck-file"))
    assert "is not a directory" in said, said
