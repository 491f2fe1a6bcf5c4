"""The `cycle` command as a real process: entry points, exit codes, the matplotlib name clash."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from cycler import AtomicDirectory


def cycle(*args: str, env: dict[str, str] | None = None,
          cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cycler_cli", *args], capture_output=True,
                          text=True, timeout=120, env=env, cwd=cwd)


def test_status_and_prune_run_as_real_commands(tmp_path: Path) -> None:
    saver = AtomicDirectory(tmp_path, keep_last=-1)
    for step in range(3):
        directory = Path(saver.prepare_checkpoint_directory())
        (directory / "weights.bin").write_bytes(b"x" * 100)
        saver.symlink_latest(directory, metadata={"step": step})
    status = cycle("status", str(tmp_path), "--json")
    assert status.returncode == 0, status.stderr
    assert [c["step"] for c in json.loads(status.stdout)["checkpoints"]] == [0, 1, 2]
    pruned = cycle("prune", str(tmp_path), "--keep-last", "1")
    assert pruned.returncode == 0, pruned.stderr
    assert sorted(p.name for p in tmp_path.glob("AtomicDirectory_checkpoint_*")) == [
        "AtomicDirectory_checkpoint_2"
    ]


def test_cycle_refuses_matplotlibs_cycler_in_one_line(tmp_path: Path) -> None:
    impostor = tmp_path / "site" / "cycler"
    impostor.mkdir(parents=True)
    (impostor / "__init__.py").write_text("class Cycler: pass\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site")}
    result = cycle("status", env=env, cwd=tmp_path)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "matplotlib" in lines[0] and "Traceback" not in result.stderr


def test_a_preset_artifact_path_that_is_not_the_checkpoint_root_is_refused_in_one_line(
        tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("print('never started')\n")
    env = {**os.environ, "CHECKPOINT_ARTIFACT_PATH": str(tmp_path / "isc-artifacts")}
    env.pop("CYCLER_CHECKPOINT_DIR", None)
    for extra in ((), ("--dry-run",)):
        result = cycle("run", "--checkpoint-dir", str(tmp_path / "elsewhere"), *extra,
                       str(script), env=env)
        assert result.returncode == 2, result.stderr
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and "CHECKPOINT_ARTIFACT_PATH" in lines[0], result.stderr
        assert "never started" not in result.stdout
    same = cycle("run", "--checkpoint-dir", str(tmp_path / "isc-artifacts"), "--dry-run",
                 str(script), env=env)
    assert same.returncode == 0, same.stderr
    assert "CYCLER_CHECKPOINT_NAME=AtomicDirectory" in same.stdout, same.stdout


def test_the_checkpoint_name_reaches_the_workers_savers(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(
        "from pathlib import Path\n"
        "from cycler import AtomicDirectory\n"
        "saver = AtomicDirectory(__import__('os').environ['CYCLER_CHECKPOINT_DIR'])\n"
        "path = Path(saver.prepare_checkpoint_directory())\n"
        "(path / 'w.pt').write_bytes(b'w')\n"
        "saver.symlink_latest(path)\n")
    env = {k: v for k, v in os.environ.items()
           if k not in ("CHECKPOINT_ARTIFACT_PATH", "CYCLER_CHECKPOINT_DIR")}
    result = cycle("run", "--checkpoint-dir", str(tmp_path / "root"), "--checkpoint-name",
                   "Mine", str(script), env=env)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "root" / "Mine.latest_checkpoint").is_symlink()


def test_status_watch_redraws_until_ctrl_c_then_exits_0(tmp_path: Path) -> None:
    import signal
    import time

    saver = AtomicDirectory(tmp_path)
    directory = Path(saver.prepare_checkpoint_directory())
    (directory / "weights.bin").write_bytes(b"x")
    saver.symlink_latest(directory, metadata={"step": 1})
    watching = subprocess.Popen([sys.executable, "-m", "cycler_cli", "status", "--watch",
                                 "--interval", "0.2", str(tmp_path)], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True,
                                env={**os.environ, "COLUMNS": "100"})
    time.sleep(4)  # the import, then several redraws
    directory = Path(saver.prepare_checkpoint_directory())
    (directory / "weights.bin").write_bytes(b"y")
    saver.symlink_latest(directory, metadata={"step": 2})
    time.sleep(1.5)
    watching.send_signal(signal.SIGINT)
    output, errors = watching.communicate(timeout=30)
    assert watching.returncode == 0, errors
    assert output.count("AtomicDirectory checkpoints in") >= 3, output
    assert "Traceback" not in errors
    last = output.rsplit("AtomicDirectory checkpoints in", 1)[1]
    assert " 1 " in last and "latest" in last, "the newest checkpoint shows up while watching"
