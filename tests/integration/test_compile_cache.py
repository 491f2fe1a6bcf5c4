"""torch.compile's caches under real ``cycle run`` processes: kept on the node, carried with the
root to a fresh node (a ``TMPDIR`` and ``HOME`` of its own), passed over (one warning, a
private directory of the run's own) where another user could have planted them, ignored when
carried under another key or corrupt.

The runs that compile are marked ``e2e`` (inductor builds C++ here: seconds each); the others
start no compile and check what ``cycle run`` does before and after the workers.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from cycler.supervisor.compile_cache.archive import CACHE, HEADERS, pack
from cycler.supervisor.compile_cache.place import cache_key

COMPILING = """
import json, os, sys
import torch
from torch._dynamo.utils import counters

step = torch.compile(lambda x: (x.sin() * 2 + 1).sum())
step(torch.randn(16))
with open(sys.argv[1], "w") as out:
    json.dump({"inductor": dict(counters["inductor"]),
               "cache": os.environ.get("TORCHINDUCTOR_CACHE_DIR")}, out)
"""

HOLDING = COMPILING + """
if sys.argv[2:] == ["hold"]:  # commit a checkpoint, then train on until killed
    import time
    from pathlib import Path
    from cycler import AtomicDirectory, default_checkpoint_root
    saver = AtomicDirectory(default_checkpoint_root())
    directory = Path(saver.prepare_checkpoint_directory())
    (directory / "state").write_bytes(b"compiled")
    saver.symlink_latest(directory)
    time.sleep(600)
"""

PLAIN = """
import json, os, sys
with open(sys.argv[1], "w") as out:
    json.dump({"cache": os.environ.get("TORCHINDUCTOR_CACHE_DIR"),
               "triton": os.environ.get("TRITON_CACHE_DIR")}, out)
"""


def cycle_run(tmp_path: Path, node: str, worker: str,
              env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess[str], dict]:
    """``cycle run`` of ``worker`` on the node named ``node`` (its own TMPDIR and HOME), with
    the checkpoint root ``tmp_path/ck``; the process and what the worker reported."""
    command, environment, report = cycle_command(tmp_path, node, worker, env)
    done = subprocess.run(command, env=environment, cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)
    return done, json.loads(report.read_text()) if report.exists() else {}


def cycle_command(tmp_path: Path, node: str, worker: str, env: dict[str, str] | None = None,
                  ) -> tuple[list[str], dict[str, str], Path]:
    """The command and environment of :func:`cycle_run`, and the worker's report file."""
    script, report = tmp_path / "worker.py", tmp_path / f"report-{node}.json"
    script.write_text(worker)
    report.unlink(missing_ok=True)
    for name in ("tmp", "home"):
        (tmp_path / node / name).mkdir(parents=True, exist_ok=True, mode=0o700)
    environment = {key: value for key, value in os.environ.items()
                   if not key.startswith(("SLURM_", "CYCLER_", "TORCHINDUCTOR_", "TRITON_"))}
    environment.update(TMPDIR=str(tmp_path / node / "tmp"), HOME=str(tmp_path / node / "home"),
                       **(env or {}))
    return [sys.executable, "-m", "cycler_cli", "run", "--checkpoint-dir", str(tmp_path / "ck"),
            str(script), str(report)], environment, report


def carried(tmp_path: Path) -> Path:
    return tmp_path / "ck" / ".cycler" / "compile-cache.tar"


def user_base(tmp_path: Path, node: str) -> Path:
    return tmp_path / node / "tmp" / f"cycler-{os.geteuid()}"


@pytest.mark.e2e
def test_a_restart_on_the_same_node_and_on_a_fresh_node_reuses_the_compiled_code(
        tmp_path: Path) -> None:
    first, compiled = cycle_run(tmp_path, "node-a", COMPILING)
    assert first.returncode == 0, first.stderr
    assert compiled["inductor"].get("fxgraph_cache_miss", 0) >= 1
    assert compiled["cache"].startswith(str(user_base(tmp_path, "node-a")))
    assert "carried the compile cache" in first.stderr and carried(tmp_path).exists()

    again, warm = cycle_run(tmp_path, "node-a", COMPILING)
    assert again.returncode == 0, again.stderr
    assert warm["inductor"].get("fxgraph_cache_hit", 0) >= 1
    assert warm["inductor"].get("fxgraph_cache_miss", 0) == 0
    assert "carried the compile cache" not in again.stderr  # nothing new to carry

    moved, fresh = cycle_run(tmp_path, "node-b", COMPILING)
    assert moved.returncode == 0, moved.stderr
    assert "loaded the carried compile cache" in moved.stderr
    assert fresh["inductor"].get("fxgraph_cache_hit", 0) >= 1
    assert fresh["inductor"].get("fxgraph_cache_miss", 0) == 0
    assert fresh["cache"].startswith(str(user_base(tmp_path, "node-b")))


@pytest.mark.e2e
def test_a_job_killed_after_its_first_checkpoint_has_carried_what_it_compiled(
        tmp_path: Path) -> None:
    """A node failure, or Slurm's SIGKILL after the grace, ends the job without the carry at
    the end of ``cycle run``: the carry after the first checkpoint is what the requeue gets."""
    command, environment, report = cycle_command(tmp_path, "node-a", HOLDING)
    with (tmp_path / "stderr-node-a.txt").open("wb") as stderr:
        job = subprocess.Popen([*command, "hold"], env=environment, cwd=tmp_path,
                               stdout=subprocess.DEVNULL, stderr=stderr)
    try:
        wait_until(lambda: report.exists(), "the compile", job, timeout=300)
        wait_until(lambda: carried(tmp_path).exists(), "the carried file", job, timeout=90)
    finally:
        kill_the_whole_job(job)
    with tarfile.open(carried(tmp_path)) as archive:
        names = archive.getnames()
    assert any(name.startswith(f"{CACHE}/") and name.endswith(".so") for name in names), names
    assert any(f"{CACHE}/inductor/fxgraph/" in name for name in names), names

    moved, fresh = cycle_run(tmp_path, "node-b", HOLDING)
    assert moved.returncode == 0, moved.stderr
    assert "loaded the carried compile cache" in moved.stderr
    assert fresh["inductor"].get("fxgraph_cache_hit", 0) >= 1
    assert fresh["inductor"].get("fxgraph_cache_miss", 0) == 0


def wait_until(condition: Callable[[], bool], what: str, job: subprocess.Popen[bytes],
               timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert job.poll() is None, f"cycle run exited {job.returncode} before {what}"
        assert time.monotonic() < deadline, f"{what}: not within {timeout:g} s"
        time.sleep(0.1)


def kill_the_whole_job(job: subprocess.Popen[bytes]) -> None:
    """SIGKILL to the supervisor and every process below it at once, as a node failure."""
    if job.poll() is not None:
        return
    everyone = [psutil.Process(job.pid), *psutil.Process(job.pid).children(recursive=True)]
    for process in everyone:
        with contextlib.suppress(psutil.Error):
            process.send_signal(signal.SIGKILL)
    job.wait(30)


@pytest.mark.e2e
def test_a_stop_calls_off_the_carry_in_flight_and_the_end_of_the_run_carries_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import tempfile

    from cycler.supervisor.compile_cache.place import node_cache_dir
    from cycler.supervisor.configuration.options import RunOptions

    command, environment, report = cycle_command(tmp_path, "node-a", HOLDING)
    monkeypatch.setattr(tempfile, "tempdir", environment["TMPDIR"])
    cache = node_cache_dir(RunOptions(script=command[-2], checkpoint_dir=tmp_path / "ck"))
    os.makedirs(cache)
    for level in (cache, *list(cache.parents)[:3]):
        os.chmod(level, 0o700)
    with (cache / "huge.so").open("wb") as huge:  # compiled long ago: the carry takes seconds
        huge.truncate(768 << 20)
    os.utime(cache / "huge.so", (1e9, 1e9))
    supervisor_dir = carried(tmp_path).parent
    with (tmp_path / "stderr-node-a.txt").open("wb") as stderr:
        job = subprocess.Popen([*command[:4], "--grace", "2", *command[4:], "hold"],
                               env=environment, cwd=tmp_path, stdout=subprocess.DEVNULL,
                               stderr=stderr)
    try:
        wait_until(lambda: report.exists(), "the compile", job, timeout=300)
        wait_until(lambda: any(".cycler-tmp-" in name for name in os.listdir(supervisor_dir)),
                   "a carry in flight", job, timeout=60)
        job.send_signal(signal.SIGTERM)
        job.wait(120)
    finally:
        kill_the_whole_job(job)
    events = [json.loads(line)["event"] for line in
              (supervisor_dir / "events-node0.jsonl").read_text().splitlines()]
    assert events.count("compile_cache_carried") == 1, events
    assert "compile_cache_not_carried" not in events
    assert events.index("compile_cache_carried") > events.index("workers_exited")
    with tarfile.open(carried(tmp_path)) as archive:
        assert f"{CACHE}/huge.so" in archive.getnames()
    assert not [name for name in os.listdir(supervisor_dir) if ".cycler-tmp-" in name]


def test_workers_get_a_private_cache_of_the_job_unless_the_user_chose_one(
        tmp_path: Path) -> None:
    done, seen = cycle_run(tmp_path, "node-a", PLAIN)
    assert done.returncode == 0, done.stderr
    cache = Path(seen["cache"])
    assert cache.is_relative_to(user_base(tmp_path, "node-a") / "compile")
    assert seen["triton"] == str(cache.parent / "triton")
    for level in (cache.parent, *list(cache.parents)[:3]):
        status = os.lstat(level)
        assert status.st_mode & 0o777 == 0o700 and status.st_uid == os.geteuid()
    mine = tmp_path / "my-cache"
    done, seen = cycle_run(tmp_path, "node-a", PLAIN, env={"TORCHINDUCTOR_CACHE_DIR": str(mine)})
    assert done.returncode == 0 and seen == {"cache": str(mine), "triton": None}


def run_base_of(done: subprocess.CompletedProcess[str], seen: dict, node_tmp: Path) -> Path:
    """The private base the run compiled in, said in its one warning, removed at its end."""
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("this run compiles into") == 1, done.stderr
    cache = Path(seen["cache"])
    base = cache.parents[3]  # <base>/compile/<job>/<key>/inductor
    assert base.parent == node_tmp and base.name.startswith(f"cycler-{os.geteuid()}-run-")
    assert not base.exists()  # removed when cycle run ended
    return base


def test_a_cache_directory_open_to_other_users_is_passed_over_with_one_warning(
        tmp_path: Path) -> None:
    base = user_base(tmp_path, "node-a")
    base.mkdir(parents=True)
    os.chmod(base, 0o777)
    done, seen = cycle_run(tmp_path, "node-a", PLAIN)
    run_base_of(done, seen, base.parent)
    assert f"{base} has mode 777: it is open to other users" in done.stderr


def test_torch_default_directory_writable_by_others_is_passed_over_with_one_warning(
        tmp_path: Path) -> None:
    import getpass

    default = tmp_path / "node-a" / "tmp" / f"torchinductor_{getpass.getuser()}"
    default.mkdir(parents=True)
    os.chmod(default, 0o777)
    done, seen = cycle_run(tmp_path, "node-a", PLAIN)
    assert done.returncode == 0 and seen["cache"], done.stderr
    assert f"torch's compile directory {default} has mode 777" in done.stderr
    assert done.stderr.count("without carrying torch's precompiled headers") == 1


@pytest.mark.skipif(os.geteuid() != 0, reason="planting as another user needs root (chown)")
def test_a_cache_directory_planted_by_another_user_is_passed_over(tmp_path: Path) -> None:
    planted = user_base(tmp_path, "node-a") / "compile"
    planted.mkdir(parents=True, mode=0o700)
    os.chmod(planted.parent, 0o700)
    os.chown(planted, 65534, 65534)
    done, seen = cycle_run(tmp_path, "node-a", PLAIN)
    run_base_of(done, seen, planted.parent.parent)
    assert f"{planted} belongs to uid 65534, not to you" in done.stderr


def plant_carried(tmp_path: Path, torch_version: str | None = None) -> None:
    script = tmp_path / "worker.py"
    script.write_text(PLAIN)
    cache = tmp_path / "elsewhere" / "cache"
    cache.mkdir(parents=True)
    (cache / "entry").write_bytes(b"compiled")
    carried(tmp_path).parent.mkdir(parents=True)
    pack({CACHE: cache, HEADERS: tmp_path / "elsewhere" / "headers"}, carried(tmp_path),
         cache_key(script, torch_version=torch_version))


def test_a_carried_cache_of_another_torch_version_is_not_loaded(tmp_path: Path) -> None:
    plant_carried(tmp_path, torch_version="0.0.1+fake")
    done, seen = cycle_run(tmp_path, "node-b", PLAIN)
    assert done.returncode == 0, done.stderr
    assert "is not loaded: it was made for torch 0.0.1+fake, this run has" in done.stderr
    assert list(Path(seen["cache"]).parent.iterdir()) == []


def test_a_corrupt_carried_cache_is_ignored_and_the_job_runs(tmp_path: Path) -> None:
    plant_carried(tmp_path)
    whole = carried(tmp_path).read_bytes()
    carried(tmp_path).write_bytes(whole[:700])
    done, seen = cycle_run(tmp_path, "node-b", PLAIN)
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if "compile cache" in line]
    assert len(lines) == 1 and "is not loaded" in lines[0]
    assert list(Path(seen["cache"]).parent.iterdir()) == []


PACKER = """
import sys
from pathlib import Path
from cycler.supervisor.compile_cache.archive import CACHE, HEADERS, pack
from cycler.supervisor.compile_cache.place import cache_key
work = Path(sys.argv[1])
print(pack({CACHE: work / "cache", HEADERS: work / "headers"}, work / "compile-cache.tar",
           cache_key(work / "worker.py")))
"""


def big_cache(work: Path, size: int) -> None:
    (work / "cache").mkdir(parents=True, exist_ok=True)
    (work / "worker.py").write_text(PLAIN)
    (work / "cache" / "kernel.so").write_bytes(b"compiled")
    with (work / "cache" / "huge.so").open("wb") as huge:
        huge.truncate(size)  # sparse: read fast, written whole into the tar


def test_a_carry_killed_while_it_writes_leaves_the_previous_file_whole(tmp_path: Path) -> None:
    big_cache(tmp_path, 1 << 20)
    packer = [sys.executable, "-c", PACKER, str(tmp_path)]
    subprocess.run(packer, check=True, capture_output=True)
    carried_file = tmp_path / "compile-cache.tar"
    before = carried_file.read_bytes()
    big_cache(tmp_path, 1 << 30)
    writer = subprocess.Popen(packer, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    temporaries = []
    try:
        while writer.poll() is None and not any(os.path.getsize(t) > (1 << 20)
                                                for t in temporaries):
            temporaries = [t for t in tmp_path.iterdir() if ".cycler-tmp-" in t.name]
            time.sleep(0.005)
    finally:
        writer.kill()
        writer.wait()
    assert temporaries, "the writer ended before it was killed: make the cache larger"
    assert carried_file.read_bytes() == before
    cache, headers = tmp_path / "fresh" / "cache", tmp_path / "fresh" / "headers"
    cache.mkdir(parents=True, mode=0o700)
    from cycler.supervisor.compile_cache.archive import unpack

    said = unpack(carried_file, cache, headers, cache_key(tmp_path / "worker.py"))
    assert said is not None and said.startswith("loaded the carried compile cache (2 files)")
    (tmp_path / "cache" / "huge.so").write_bytes(b"smaller")
    done = subprocess.run(packer, check=True, capture_output=True, text=True)
    assert done.stdout.startswith("carried the compile cache (2 files")
    assert not [t for t in tmp_path.iterdir() if ".cycler-tmp-" in t.name]


def test_a_carry_into_a_full_root_is_a_warning_event_and_the_run_goes_on(
        tmp_path: Path, small_tmpfs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import tempfile

    from cycler.supervisor.compile_cache.carrier import CompileCacheCarrier
    from cycler.supervisor.compile_cache.place import node_cache_dir
    from cycler.supervisor.configuration.options import RunOptions

    script = tmp_path / "worker.py"
    script.write_text(PLAIN)
    options = RunOptions(script=str(script), checkpoint_dir=small_tmpfs / "root")
    options.record.directory.mkdir(parents=True)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "node"))
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    node_cache_dir(options).mkdir(parents=True)
    (node_cache_dir(options) / "kernel.so").write_bytes(os.urandom(8 << 20))  # > the 4 MB
    said: list[tuple[str, bool]] = []
    carrier = CompileCacheCarrier(
        options, lambda event, warning=False, **fields: said.append((event, warning)),
        settle=0.0)
    carrier.checkpoint_committed()
    assert carrier.wait(60)
    carrier.finish()
    assert said == [("compile_cache_not_carried", True)] * 2
    assert os.listdir(options.record.directory) == []
