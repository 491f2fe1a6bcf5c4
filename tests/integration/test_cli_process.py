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
