"""What `cycle run` refuses before anything starts, as a user meets it: one line naming the
problem and the fix, exit 2, no torchrun started (issue 33). Real `cycle` processes, a real
socket held by another process."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from cycler.protocol.events import read_events
from cycler.protocol.exit_codes import EXIT_USAGE
from cycler.protocol.record import RunRecord


def cycle_run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    environment = {key: value for key, value in os.environ.items()
                   if not key.startswith(("SLURM_", "CYCLER_", "MASTER_"))}
    return subprocess.run([sys.executable, "-m", "cycler_cli", "run", "--checkpoint-dir",
                           str(tmp_path / "ck"), *args], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path, env=environment)


def one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cycle: error: "), result.stderr
    return lines[0]


def no_start(tmp_path: Path) -> bool:
    events = read_events(RunRecord(tmp_path / "ck").events_path(0))
    return not any(event["event"] == "workers_started" for event in events)


def test_a_master_port_another_process_listens_on_is_named_before_any_start(
        tmp_path: Path) -> None:
    (tmp_path / "t.py").write_text("import torch\n")
    holder = subprocess.Popen([sys.executable, "-c", "import socket, sys, time\n"
                               "s = socket.socket(); s.bind(('0.0.0.0', 0)); s.listen()\n"
                               "print(s.getsockname()[1], flush=True); time.sleep(120)\n"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None
        port = holder.stdout.readline().strip()
        result = cycle_run(tmp_path, "--master-addr", "127.0.0.1", "--master-port", port,
                           "t.py")
    finally:
        holder.kill()
        holder.wait()
    assert result.returncode == EXIT_USAGE, result.stderr
    line = one_error_line(result)
    assert f"--master-port {port} is in use by another process" in line, line
    assert no_start(tmp_path)


def test_the_master_port_a_finished_run_used_is_free_for_the_next_run(tmp_path: Path) -> None:
    """A requeued job reuses its port at once: what the last run's store left (connections
    in TIME_WAIT) is no reason to refuse it."""
    (tmp_path / "t.py").write_text("import torch.distributed as dist\n"
                                   "dist.init_process_group('gloo'); dist.barrier()\n"
                                   "dist.destroy_process_group(); print('ran', flush=True)\n")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = str(probe.getsockname()[1])
    for run in range(2):
        result = cycle_run(tmp_path, "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
                           "--master-port", port, "t.py")
        assert result.returncode == 0, (run, result.stderr[-3000:])
        assert result.stdout.count("ran") == 2


@pytest.mark.parametrize("make, said", [
    (lambda d: (d / "adir").mkdir() or "adir", "script adir is a directory without a "
     "__main__.py"),
    (lambda d: "missing.py", "script missing.py does not exist"),
    (lambda d: (d / "train.sh").write_text("#!/bin/bash\npython t.py\n") and "train.sh",
     "script train.sh is a script for bash (its #! line)"),
    (lambda d: (d / "tool").write_bytes(Path(sys.executable).read_bytes()[:65536]) and "tool",
     "script tool is a binary file, not Python source"),
], ids=["a directory", "a missing script", "a shell script", "a binary"])
def test_a_script_python_cannot_run_gets_its_own_line(tmp_path: Path, make, said: str) -> None:
    result = cycle_run(tmp_path, make(tmp_path))
    assert result.returncode == EXIT_USAGE, result.stderr
    assert said in one_error_line(result)
    assert no_start(tmp_path)


def test_a_directory_with_a_main_runs_as_python_runs_it(tmp_path: Path) -> None:
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "__main__.py").write_text("print('main of app ran')\n")
    result = cycle_run(tmp_path, "app")
    assert result.returncode == 0, result.stderr
    assert "main of app ran" in result.stdout
